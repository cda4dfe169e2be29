"""The config schema: every field with its default and a one-line meaning.

Config files in `configs/` start from `mural.systems.base_config(name)` (this
file's `base_config()` plus the system's `tasks` sections) and change what
their paper says. `validate()` turns a bad value into a one-line
`ConfigError` that names the field, before anything reaches JAX; a task
checks its own extra fields when the system builds it. This file is the
ground floor: it imports nothing of mural's.
"""

import copy
import importlib.util
import json
import re
from typing import Optional

import ml_collections
from etils import epath


class ConfigError(ValueError):
  """A config field holds a value mural cannot use."""


def base_config() -> ml_collections.ConfigDict:
  """The fields every system shares (MURAL-BASE-shaped model); systems add `tasks`."""
  c = ml_collections.ConfigDict()
  c.seed = 0
  # Key of mural.systems.SYSTEMS; the system's own file adds its `tasks`
  # section (systems.base_config(name) = this + the system's defaults).
  c.system = ""

  # ---- Model -------------------------------------------------------------
  c.model = ml_collections.ConfigDict()
  c.model.dtype = "float32"  # Compute dtype of the towers: float32 | bfloat16.
  c.model.param_dtype = "float32"  # Parameters stay float32 (bf16 compute only).

  c.model.image = ml_collections.ConfigDict()
  c.model.image.name = "efficientnet"  # Key of mural.models.IMAGE_TOWERS.
  c.model.image.variant = "b5"  # b0..b7 | l2 (compound-scaling table).
  c.model.image.width_coefficient = ml_collections.FieldReference(None, float)  # Overrides the variant.
  c.model.image.depth_coefficient = ml_collections.FieldReference(None, float)  # Overrides the variant.
  c.model.image.dropout_rate = ml_collections.FieldReference(None, float)  # None: the variant's.
  c.model.image.stochastic_depth_rate = 0.2  # Drop-connect; block i of N uses rate * i / N.
  c.model.image.include_head = False  # 1x1 head conv (1280 * width) before pooling.
  c.model.image.num_classes = 0  # >0 adds the classifier (param-count checks only).
  c.model.image.bn_momentum = 0.99  # Running-stat decay (TF reference; epsilon fixed at 1e-3).
  # Convolution maths: 'auto' (shifted adds + matmuls on CPU, where XLA's
  # convs are slow; XLA's conv elsewhere) | 'xla' | 'fast'. Same parameters.
  c.model.image.conv_impl = "auto"
  # Batch norm (+ swish) maths: 'auto' (one op with its own gradient on CPU, which
  # keeps less for the backward; nn.BatchNorm elsewhere) | 'flax' | 'fused'. Same variables.
  c.model.image.norm_impl = "auto"
  c.model.image.remat = "none"  # Per MBConv block: none | full | dots (mural/models/remat.py).
  # The first N of B0's 7 stages (None: all, as every paper tower): a shallower net for
  # small inputs and smoke runs (the tests' training config keeps 3: every block kind).
  c.model.image.num_stages = ml_collections.FieldReference(None, int)
  # Per-channel input normalisation, (R, G, B) in [0, 255] units, that an imported ImageNet
  # tower was trained with (mural.pretrained sets them); None: the pipeline's [-1, 1] as it is.
  c.model.image.pixel_mean = ml_collections.FieldReference(None, tuple)
  c.model.image.pixel_std = ml_collections.FieldReference(None, tuple)

  c.model.text = ml_collections.ConfigDict()
  # Tuning a tower, or not (LiT, Zhai et al. 2022): locked, a tower runs in inference mode and
  # passes no gradient, so it neither trains nor holds optimizer state (mural/models/locked.py);
  # learning_rate_scale multiplies every task's rate for its parameters (0.1: tune it gently).
  for kind in ("image", "text"):
    c.model[kind].locked = False
    c.model[kind].learning_rate_scale = 1.0
  c.model.text.name = "bert"  # Key of mural.models.TEXT_TOWERS.
  c.model.text.vocab_size = 250_000  # Rows of the token table (>= tokenizer vocab).
  c.model.text.token_embed_dim = 768  # < hidden_dim: factorised, projected up.
  c.model.text.hidden_dim = 768
  c.model.text.num_layers = 12
  c.model.text.num_heads = 12
  c.model.text.mlp_dim = 3072
  c.model.text.max_len = 64  # Position table size and the tokenizer's length.
  # Public BERT checkpoints (mural.import_weights) have token-type rows (2): row 0, the one
  # segment of every input, is added to every position; 0: no table (mural's own towers).
  c.model.text.type_vocab_size = 0
  # BERT's pooler (Dense + tanh on [CLS]) as the embedding, as LaBSE embeds; False: [CLS] itself.
  c.model.text.pooler = False
  c.model.text.gelu_approximate = False  # GELU's tanh form (Google's BERT checkpoints); False: exact.
  c.model.text.dropout_rate = 0.1
  c.model.text.remat = "none"  # Per encoder layer: none | full | dots (mural/models/remat.py).

  # Projection heads: which heads exist is up to the tasks (each task names
  # the heads it reads); these fields shape every head.
  c.model.heads = ml_collections.ConfigDict()
  c.model.heads.embed_dim = 512  # Shared space; must equal the image embedding size.
  c.model.heads.kind = "dense"  # dense (single FC, the paper's choice) | mlp.
  c.model.heads.mlp_hidden_dim = 1024  # Hidden width of the mlp head.
  c.model.init_temperature = 1.0  # The model's learned softmax temperature (ALIGN/MURAL: 1.0).
  c.model.learn_temperature = True

  # ---- Tasks -------------------------------------------------------------
  # One section per task of the system (filled by mural/systems/<system>.py):
  # weight, learning_rate, batch_size (global), sources (list of dicts
  # {name, weight, ...source fields}; see mural/data/sources.py), plus the
  # task's own loss fields. A task with weight 0 or no sources does not run.
  c.tasks = ml_collections.ConfigDict()

  # ---- Optimisation ------------------------------------------------------
  # LAMB settings shared by every task's optimizer (each task has its own
  # state and its own peak rate, tasks.<name>.learning_rate; see optim.py).
  c.optim = ml_collections.ConfigDict()
  c.optim.layer_adaptation = True  # LAMB's trust ratio (the papers); False: AdamW.
  c.optim.weight_decay = 1e-5  # Masked off biases, norms and the temperature.
  c.optim.warmup_steps = 10_000  # Linear warm-up from 0.
  c.optim.decay = True  # Linear decay to 0 at total_steps after the warm-up; False: constant.
  c.optim.b1 = 0.9
  c.optim.b2 = 0.999
  c.optim.eps = 1e-6
  c.optim.grad_clip_norm = ml_collections.FieldReference(None, float)  # None: no clipping.
  # Micro-batches per update (a scan inside the step), accumulated as
  # grad_accum_mode says (GRAD_ACCUM_MODES; mural/step.py): 'cached' (GradCache:
  # every loss over the whole batch, so a contrastive loss keeps all
  # batch_size negatives; one extra forward) or 'independent' (each micro-batch
  # its own loss with batch_size / grad_accum_steps negatives).
  c.optim.grad_accum_steps = 1
  c.optim.grad_accum_mode = "cached"

  c.total_steps = 600_000  # Linear decay to 0 at this step.

  # ---- Data --------------------------------------------------------------
  c.data = ml_collections.ConfigDict()
  c.data.image_size = 289  # Training crop (ALIGN: 289 from 346).
  c.data.eval_resize = 346  # Eval: resize the short side, then centre-crop.
  c.data.vocab_path = ""  # Existing wordpiece vocab; empty: learned from the tasks' training text.
  # How text is normalised before wordpieces (mural/data/tokenizer.py): casefold (mural's own
  # vocabularies) | bert_cased | bert_uncased (a public BERT checkpoint's vocabulary, as its
  # tokenizer does; mural.import_weights records which).
  c.data.text_normalization = "casefold"
  # Index space of batch['lang'] and of the eval sets; records in any other
  # language (or none) are skipped and counted as 'unknown_language'.
  c.data.languages = ("en", "de", "fr", "cs", "ru", "ja", "hi", "sw", "am", "zh", "ar")
  # Within each source, language l is drawn with p_l ∝ n_l^(1/T) (n_l: its
  # records on this process; t2t: per language pair). 1: natural mix; >1 flattens.
  c.data.language_sampling_temperature = 1.0
  c.data.shuffle_buffer = 10_000  # Raw records per source; 0 or 1: file order.
  c.data.crop_area_range = (0.5, 1.0)  # Train crop area / image area (Inception uses 0.08).
  c.data.crop_aspect_range = (3 / 4, 4 / 3)  # Train crop width / height.
  c.data.random_flip = True  # Horizontal flip in training.
  # Longer texts are skipped ('long_text'); shorter ones that exceed
  # model.text.max_len tokens are truncated by the tokenizer.
  c.data.max_text_chars = 1000
  c.data.num_parallel_calls = -1  # Threads per tf.data map; -1: AUTOTUNE.
  c.data.prefetch_batches = 2  # Batches tf.data prepares ahead of the step.
  # tf.data's autotuning (parallelism and buffers set while it runs). Off, an
  # AUTOTUNE map runs min(16, CPU count) calls, and closing a pipeline is
  # immediate: TF 2.21's autotune thread holds an iterator's deletion until its
  # next optimisation tick, up to 60 s (seen at the CPU demo's exit).
  c.data.autotune = True
  # TensorFlow's threads inside one op (mural.main sets it; 0: TensorFlow's default, one per
  # core). TensorFlow runs only the input, whose parallelism is tf.data's parallel calls; an
  # op split over threads leaves them polling for work, CPU the step needs on a small host.
  c.data.tf_intra_op_threads = 1
  # Held-out retrieval data (mural/data/eval_data.py): {name: 'synthetic'}, or
  # {name: 'flickr8k', split: 'dev', path: None, caption_sources: None, max_images: 0 (all)}.
  c.data.eval_source = dict(name="synthetic")
  # Held-out translation pairs besides the eval source's own (mural/data/eval_data.py): {name: ''}
  # (none), or {name: 'multi30k', split: 'test_2016_flickr', path: None, max_pairs: 0 (all)}.
  c.data.eval_translations = dict(name="")
  # More eval data, each evaluated beside the above in its own table, under its own name
  # (evaluate.evaluators_for): {name: {source: <an eval_source dict>, translations: <an
  # eval_translations dict>}}, either key optional. Its results are '<name>.<set>/<metric>'
  # (e.g. 'heldout.mean/mR': early_stopping.metric can name one).
  c.data.eval_sets = ml_collections.ConfigDict()
  # Built-in rendered-scene data (mural/data/synthetic.py; its docstring has
  # the recipe that shows MURAL's claim).
  c.data.synthetic = ml_collections.ConfigDict()
  c.data.synthetic.seed = 0  # Dataset seed; apart from `seed`, so model seeds share the data.
  # Any of mural.data.synthetic.LANGUAGES: en de fr cs ru ja hi sw am.
  c.data.synthetic.languages = ("en", "de", "fr", "cs", "ru", "ja", "hi", "sw")
  # Image-caption pairs per language (training); a language missing here gets
  # `default_pairs`. Scarce languages are how MURAL's claim is tested.
  c.data.synthetic.pairs_per_language = ml_collections.ConfigDict()
  c.data.synthetic.default_pairs = 20_000
  c.data.synthetic.translation_pairs = 20_000  # Per language pair, independent of the above.
  # Translation pairs are (pivot, x) for every other language x; a non-empty
  # translation_pair_list ("en-de", ...) replaces them; "" and (): none.
  c.data.synthetic.translation_pivot = "en"
  c.data.synthetic.translation_pair_list = ()
  # Per-pair override of translation_pairs, e.g. {"en-sw": 0} for a control run.
  c.data.synthetic.translation_pairs_per_pair = ml_collections.ConfigDict()
  # True: no parallel text in training (Globetrotter): opening the translation pairs for training
  # is an error; the image-text stream never shows one image with captions in two languages.
  c.data.synthetic.withhold_parallel_text = False
  # "translations": both captions of a training pair describe the whole scene (Multi30K's
  # translation portion); "comparable": each side independently describes the whole scene or
  # a part of it that keeps its anchor object (synthetic_scenes.views), as independently written
  # captions of one image differ (Multi30K's comparable portion; Kádár et al. 2018, 5.2).
  c.data.synthetic.caption_pairs = "translations"
  c.data.synthetic.heldout_fraction = 0.1  # Descriptions (by hash) never used in training.
  c.data.synthetic.eval_scenes = 200  # Held-out scenes (unique descriptions).
  c.data.synthetic.eval_captions_per_scene = 1  # Captions per eval image and language.
  c.data.synthetic.render_size = 64  # Pixels per side; the pipeline resizes to data.image_size.

  # ---- Sharding ----------------------------------------------------------
  c.mesh = ml_collections.ConfigDict()
  c.mesh.data = -1  # -1: every device not used by the other axes.
  c.mesh.fsdp = 1
  c.mesh.model = 1
  # Params with fewer elements stay replicated (gathering a bias each step
  # costs more than the bytes saved).
  c.shard_min_size = 16_384
  # Logical axis -> mesh axis (or None: replicated). First match wins.
  c.sharding_rules = [
      ("batch", ("data", "fsdp")),
      ("vocab", "model"),
      ("mlp", "model"),
      ("heads", "model"),
      ("kv", None),
      ("embed", "fsdp"),
      ("token_embed", "fsdp"),
      ("proj", None),
      ("conv_out", "fsdp"),
      ("conv_in", None),
      ("norm", None),
  ]

  # ---- Loop, checkpoints, logging, evaluation ----------------------------
  c.log_every_steps = 100  # Metrics to metrics.jsonl, TensorBoard and the console.
  c.eval_every_steps = 5_000  # 0: only at the end.
  c.checkpoint_every_steps = 5_000  # Also at the end and on SIGTERM.
  c.keep_checkpoints = 3  # Newest checkpoints kept in workdir/checkpoints.
  c.eval_batch_size = 256  # Examples per embedding call in evaluation.
  # Early stopping, any system: stop after `patience` evaluations in a row without a better
  # `metric` (an evaluation result's name, e.g. 'mean/mR'; '': off). Every evaluation then
  # checkpoints, and the best one is kept beside the newest keep_checkpoints
  # (checkpointing.best_step; export and restore_params read it).
  c.early_stopping = ml_collections.ConfigDict()
  c.early_stopping.metric = ""
  c.early_stopping.patience = 10
  c.early_stopping.mode = "max"  # max | min: which way is better.

  # A jax.profiler trace of training steps start_step .. start_step + num_steps - 1 (0: none),
  # on process 0, into WORKDIR/plugins/profile: TensorBoard's Profile tab (pip install
  # tensorboard-plugin-profile; or its trace.json.gz in Perfetto). Traced steps run slower;
  # a run resumed past start_step traces nothing. On CPU, XLA's per-op events need
  # XLA_FLAGS=--xla_cpu_enable_xprof_traceme=true.
  c.profile = ml_collections.ConfigDict()
  c.profile.start_step = 10  # After the first steps' one-off costs.
  c.profile.num_steps = 0

  # ---- Warm start (mural/warm_start.py) ------------------------------------
  # An export directory or a workdir whose variables start a new run (only
  # when the run's own workdir has no checkpoint): arrays that match by name
  # and shape are loaded, the rest initialised as usual; the log lists both.
  # Taking the text tower, a run with no data.vocab_path uses the source's vocabulary (its token
  # table's); another vocabulary is an error.
  c.init_from = ""
  # towers (image and text towers) | all (also heads, temperature) | top-level groups,
  # comma-separated: e.g. image_tower (mural/warm_start.py).
  c.init_from_parts = "towers"
  return c


_DTYPES = ("float32", "bfloat16")
# data.text_normalization: mural's own vocabularies, and those of public BERT checkpoints.
TEXT_NORMALIZATIONS = ("casefold", "bert_cased", "bert_uncased")
_HEAD_KINDS = ("dense", "mlp")
REMAT_POLICIES = ("none", "full", "dots")  # mural/models/remat.py maps each to a JAX policy.
GRAD_ACCUM_MODES = ("cached", "independent")  # mural/step.py: make_grad_fn.


def require(ok: bool, field: str, message: str):
  """The one-line error every config check raises: `config.<field>: <message>`."""
  if not ok:
    raise ConfigError(f"config.{field}: {message}")


def positive_int(section, name: str, field: str, minimum: int = 1):
  """section[name] is an int >= minimum (field: the section's dotted name)."""
  v = section[name]
  require(isinstance(v, int) and v >= minimum, f"{field}.{name}", f"must be an int >= {minimum}, got {v!r}")


_require = require


def language_codes(values, field: str) -> list:
  """`values` as a list of language codes, each non-empty, lower-case and one code: a flag's
  'en,de' reaches a tuple field as the one entry 'en,de', which would match no record."""
  require(not isinstance(values, str), field, f"must be a tuple of codes, got the string {values!r}")
  langs = list(values)
  for l in langs:
    require(isinstance(l, str) and l and l == l.strip().lower(), field,
            f"must be non-empty lower-case codes, got {langs!r}")
    require(not any(ch in l for ch in ", "), field,
            f"{l!r} is one entry, not a list: a flag gives a tuple, e.g. "
            f"--config.{field}=\"{tuple(l.replace(',', ' ').split())!r}\"")
  require(langs, field, "must not be empty")
  require(len(set(langs)) == len(langs), field, f"has duplicates: {langs!r}")
  return langs


def _validate_data(d: ml_collections.ConfigDict) -> None:
  """The input-pipeline fields (mural/data/pipeline.py, preprocess.py, eval_data.py)."""
  language_codes(d.languages, "data.languages")
  _require(d.language_sampling_temperature > 0, "data.language_sampling_temperature", "must be positive")
  _require(isinstance(d.shuffle_buffer, int) and d.shuffle_buffer >= 0, "data.shuffle_buffer",
           f"must be an int >= 0, got {d.shuffle_buffer!r}")
  lo, hi = d.crop_area_range
  _require(0 < lo <= hi <= 1, "data.crop_area_range", f"needs 0 < low <= high <= 1, got {(lo, hi)}")
  lo, hi = d.crop_aspect_range
  _require(0 < lo <= hi, "data.crop_aspect_range", f"needs 0 < low <= high, got {(lo, hi)}")
  _require(isinstance(d.max_text_chars, int) and d.max_text_chars >= 1, "data.max_text_chars",
           f"must be an int >= 1, got {d.max_text_chars!r}")
  _require(d.num_parallel_calls == -1 or d.num_parallel_calls >= 1, "data.num_parallel_calls",
           f"must be -1 (AUTOTUNE) or >= 1, got {d.num_parallel_calls}")
  _require(d.prefetch_batches >= 0, "data.prefetch_batches", "must be >= 0")
  _require(isinstance(d.autotune, bool), "data.autotune", f"must be True or False, got {d.autotune!r}")
  threads = d.tf_intra_op_threads
  _require(isinstance(threads, int) and not isinstance(threads, bool) and threads >= 0, "data.tf_intra_op_threads",
           f"must be an int >= 0 (0: TensorFlow's default), got {d.tf_intra_op_threads!r}")
  _require("name" in d.eval_source, "data.eval_source", f"needs a 'name', got {dict(d.eval_source)!r}")
  _require("name" in d.eval_translations, "data.eval_translations",
           f"needs a 'name' ('' for none), got {dict(d.eval_translations)!r}")
  for name, entry in d.eval_sets.items():
    field = f"data.eval_sets.{name}"
    _require(re.fullmatch(r"[A-Za-z][\w-]*", name) is not None, field,
             "a name of letters, digits, '_' and '-' (it prefixes its results)")
    _require(hasattr(entry, "keys") and set(entry.keys()) <= {"source", "translations"} and len(entry) > 0,
             field, f"must be a dict with 'source' and/or 'translations', got {entry!r}")
    for key in entry.keys():
      _require(hasattr(entry[key], "keys") and "name" in entry[key], f"{field}.{key}",
               f"needs a 'name', as data.eval_{'source' if key == 'source' else 'translations'}; "
               f"got {entry[key]!r}")


def _validate_task(t: ml_collections.ConfigDict, field: str) -> None:
  """The fields every task section has (mural/system.py); a task checks its own extras."""
  for name in ("weight", "learning_rate", "batch_size", "sources"):
    _require(name in t, field, f"lacks the field {name!r}")
  _require(t.weight >= 0, f"{field}.weight", f"must be >= 0, got {t.weight}")
  _require(t.learning_rate >= 0, f"{field}.learning_rate", f"must be >= 0, got {t.learning_rate}")
  _require(isinstance(t.batch_size, int) and t.batch_size > 0, f"{field}.batch_size",
           f"must be a positive int, got {t.batch_size!r}")
  for i, src in enumerate(t.sources):
    _require(hasattr(src, "get") and isinstance(src.get("name"), str), f"{field}.sources[{i}]",
             f"needs a 'name', got {src!r}")
    _require(src.get("weight", 1.0) > 0, f"{field}.sources[{i}].weight", "must be positive")


def parse_language_pair(name: str) -> tuple:
  """'en-de' (or 'en_de') -> ('en', 'de')."""
  parts = str(name).replace("_", "-").split("-")
  if len(parts) != 2 or not all(parts):
    raise ConfigError(f"language pair {name!r} is not of the form 'en-de'")
  return tuple(parts)


def validate(c: ml_collections.ConfigDict) -> None:
  """Checks the fields every run needs; raises ConfigError naming the field."""
  _require(c.model.dtype in _DTYPES, "model.dtype", f"{c.model.dtype!r} not in {_DTYPES}")
  _require(c.model.param_dtype in _DTYPES, "model.param_dtype", f"{c.model.param_dtype!r} not in {_DTYPES}")
  t = c.model.text
  for name in ("vocab_size", "token_embed_dim", "hidden_dim", "num_layers", "num_heads", "mlp_dim", "max_len"):
    _require(isinstance(t[name], int) and t[name] > 0, f"model.text.{name}", f"must be a positive int, got {t[name]!r}")
  _require(t.hidden_dim % t.num_heads == 0, "model.text.num_heads",
           f"hidden_dim {t.hidden_dim} is not divisible by num_heads {t.num_heads}")
  _require(t.token_embed_dim <= t.hidden_dim, "model.text.token_embed_dim",
           f"{t.token_embed_dim} exceeds hidden_dim {t.hidden_dim}")
  _require(0.0 <= t.dropout_rate < 1.0, "model.text.dropout_rate", f"must be in [0, 1), got {t.dropout_rate}")
  for tower in ("image", "text"):
    policy = c.model[tower].get("remat", "none")
    _require(policy in REMAT_POLICIES, f"model.{tower}.remat", f"{policy!r} not in {REMAT_POLICIES}")
    locked, scale = c.model[tower].get("locked", False), c.model[tower].get("learning_rate_scale", 1.0)
    _require(isinstance(locked, bool), f"model.{tower}.locked", f"must be True or False, got {locked!r}")
    _require(isinstance(scale, (int, float)) and not isinstance(scale, bool) and scale >= 0,
             f"model.{tower}.learning_rate_scale", f"must be a number >= 0, got {scale!r}")
    _require(not locked or scale == 1.0, f"model.{tower}.learning_rate_scale",
             f"is {scale}, but model.{tower}.locked is True: a locked tower does not train")
  _require(c.model.heads.kind in _HEAD_KINDS, "model.heads.kind", f"{c.model.heads.kind!r} not in {_HEAD_KINDS}")
  _require(c.model.heads.embed_dim > 0, "model.heads.embed_dim", "must be positive")
  _require(c.model.heads.mlp_hidden_dim > 0, "model.heads.mlp_hidden_dim", "must be positive")
  im = c.model.image
  for name in ("width_coefficient", "depth_coefficient"):
    _require(im[name] is None or im[name] > 0, f"model.image.{name}", f"must be None or > 0, got {im[name]}")
  _require(im.dropout_rate is None or 0.0 <= im.dropout_rate < 1.0, "model.image.dropout_rate",
           f"must be None or in [0, 1), got {im.dropout_rate}")
  _require(0.0 <= im.stochastic_depth_rate < 1.0, "model.image.stochastic_depth_rate",
           f"must be in [0, 1), got {im.stochastic_depth_rate}")
  _require(0.0 < im.bn_momentum < 1.0, "model.image.bn_momentum", f"must be in (0, 1), got {im.bn_momentum}")
  _require(im.num_classes >= 0, "model.image.num_classes", f"must be >= 0, got {im.num_classes}")
  _require(c.model.init_temperature > 0, "model.init_temperature", "must be positive")
  _require(c.optim.warmup_steps >= 0, "optim.warmup_steps", "must be >= 0")
  _require(c.optim.grad_accum_steps >= 1, "optim.grad_accum_steps", "must be >= 1")
  _require(c.optim.grad_accum_mode in GRAD_ACCUM_MODES, "optim.grad_accum_mode",
           f"{c.optim.grad_accum_mode!r} not in {GRAD_ACCUM_MODES}")
  _require(c.total_steps > 0, "total_steps", "must be positive")
  _require(isinstance(c.system, str) and c.system, "system",
           "is empty: start a config from mural.systems.base_config(name)")
  _require(len(c.tasks) > 0, "tasks", f"system {c.system!r} defines no tasks")
  for name, task in c.tasks.items():
    _validate_task(task, f"tasks.{name}")
  _require(c.data.image_size > 0, "data.image_size", "must be positive")
  _require(c.data.get("text_normalization", "casefold") in TEXT_NORMALIZATIONS, "data.text_normalization",
           f"{c.data.get('text_normalization')!r} not in {TEXT_NORMALIZATIONS}")
  _require(c.data.eval_resize >= c.data.image_size, "data.eval_resize",
           f"{c.data.eval_resize} is smaller than data.image_size {c.data.image_size}")
  _validate_data(c.data)
  for axis in MESH_AXES:  # How they fill the devices: sharding.mesh_shape.
    v = c.mesh[axis]
    _require(isinstance(v, int) and (v == -1 or v >= 1), f"mesh.{axis}", f"must be -1 or >= 1, got {v!r}")
  _validate_sharding_rules(c.sharding_rules)
  _require(c.shard_min_size >= 0, "shard_min_size", "must be >= 0")
  o = c.optim
  _require(0.0 <= o.b1 < 1.0, "optim.b1", f"must be in [0, 1), got {o.b1}")
  _require(0.0 <= o.b2 < 1.0, "optim.b2", f"must be in [0, 1), got {o.b2}")
  _require(o.eps > 0, "optim.eps", "must be positive")
  _require(isinstance(o.get("decay", True), bool), "optim.decay", f"must be True or False, got {o.get('decay')!r}")
  _require(isinstance(o.layer_adaptation, bool), "optim.layer_adaptation",
           f"must be True or False, got {o.layer_adaptation!r}")
  _require(o.weight_decay >= 0, "optim.weight_decay", "must be >= 0")
  _require(o.grad_clip_norm is None or o.grad_clip_norm > 0, "optim.grad_clip_norm",
           f"must be None or positive, got {o.grad_clip_norm}")
  _require(o.warmup_steps < c.total_steps, "optim.warmup_steps",
           f"{o.warmup_steps} must be below total_steps {c.total_steps}")
  for name in ("log_every_steps", "checkpoint_every_steps", "keep_checkpoints", "eval_batch_size"):
    _require(isinstance(c[name], int) and c[name] >= 1, name, f"must be an int >= 1, got {c[name]!r}")
  _require(isinstance(c.init_from_parts, str) and all(
      p.strip().isidentifier() for p in c.init_from_parts.split(",")), "init_from_parts",
           f"{c.init_from_parts!r}: 'towers', 'all' or comma-separated parameter groups "
           "(e.g. 'image_tower')")
  _require(isinstance(c.eval_every_steps, int) and c.eval_every_steps >= 0, "eval_every_steps",
           f"must be an int >= 0, got {c.eval_every_steps!r}")
  es = c.early_stopping
  _require(isinstance(es.metric, str), "early_stopping.metric", f"must be a string ('' = off), got {es.metric!r}")
  _require(isinstance(es.patience, int) and es.patience >= 1, "early_stopping.patience",
           f"must be an int >= 1, got {es.patience!r}")
  _require(es.mode in ("max", "min"), "early_stopping.mode", f"{es.mode!r} not in ('max', 'min')")
  _require(not es.metric or c.eval_every_steps > 0, "early_stopping.metric",
           f"{es.metric!r} needs evaluations during training (eval_every_steps > 0)")
  positive_int(c.profile, "start_step", "profile")
  positive_int(c.profile, "num_steps", "profile", minimum=0)


# The device mesh's axes (mural/sharding.py): pure data parallel, FSDP, tensor parallel.
MESH_AXES = ("data", "fsdp", "model")


def _validate_sharding_rules(rules) -> None:
  """Each rule is (logical name, None | mesh axis | tuple of mesh axes)."""
  for i, rule in enumerate(rules):
    field = f"sharding_rules[{i}]"
    _require(isinstance(rule, (list, tuple)) and len(rule) == 2 and isinstance(rule[0], str),
             field, f"must be (logical_name, mesh_axes), got {rule!r}")
    axes = rule[1]
    axes = () if axes is None else tuple(axes) if isinstance(axes, (list, tuple)) else (axes,)
    for a in axes:
      _require(a in MESH_AXES, field, f"mesh axis {a!r} not in {MESH_AXES}")


def get_field(config, field: str, default=None):
  """config's value at a dotted field name ('model.text.max_len'); `default` where it has none."""
  node = config
  for key in field.split("."):
    if not hasattr(node, "get") or key not in node:
      return default
    node = node[key]
  return node


def set_field(config, field: str, value) -> None:
  """Sets a dotted field name ('model.text.max_len') of config, as an override would."""
  *parents, leaf = field.split(".")
  node = config
  for key in parents:
    node = node[key]
  node[leaf] = value


def with_eval_data(config, source, translations) -> ml_collections.ConfigDict:
  """A copy of config evaluating `source` (an eval_source dict) and `translations` (an
  eval_translations dict) alone: one entry of data.eval_sets, as the system's evaluators read it."""
  out = copy.deepcopy(config)
  with out.unlocked():
    out.data.eval_source = dict(source)
    out.data.eval_translations = dict(translations)
    out.data.eval_sets = ml_collections.ConfigDict()
  return out


def from_file(path) -> ml_collections.ConfigDict:
  """`get_config()` of a config file (configs/*.py), for tests and notebooks; 'file.py:arg' passes
  arg to get_config, as --config does."""
  path, arg = str(path), None
  if ".py:" in path:
    path, arg = path.split(".py:", 1)
    path += ".py"
  spec = importlib.util.spec_from_file_location(f"mural_config_{abs(hash(path))}", path)
  if spec is None:
    raise ConfigError(f"config file {path} cannot be loaded")
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.get_config() if arg is None else module.get_config(arg)


# ---------------------------------------------------------------------------
# The config a workdir was trained with: --mode=train writes it, and --mode=eval|export
# (or a resumed train) without --config read it back.

# What a frozen image backbone (model.image.backbone_workdir) takes from the config of the run it
# reads: the tower's shape, which its checkpoint must fit, and how its images were prepared, since
# its features mean most on images like those it was trained on.
BACKBONE_FIELDS = ("model.image.variant", "model.image.width_coefficient", "model.image.depth_coefficient",
                   "data.image_size", "data.eval_resize", "data.random_flip", "data.crop_area_range",
                   "data.crop_aspect_range")


def backbone_from(config, trained) -> None:
  """Sets BACKBONE_FIELDS of `config` (a system with a frozen image tower) to those of `trained`."""
  for field in BACKBONE_FIELDS:
    set_field(config, field, get_field(trained, field))


def towers_from(config, imported: str) -> None:
  """Starts `config` from the towers of `imported` (a directory mural.import_weights wrote):
  its towers' fields (architecture, input normalisation) and data fields (text normalisation)
  replace config's, and config.init_from names it, so the run loads its tensors and its
  vocabulary. A tower it does not hold stays as config has it."""
  record = json.loads((epath.Path(imported) / RECORD).read_text())
  with config.unlocked():
    for kind, fields in record.get("model", {}).items():
      for field, value in fields.items():
        config.model[kind][field] = tuple(value) if isinstance(value, list) else value
    for field, value in record.get("data", {}).items():
      config.data[field] = value
    config.init_from = str(imported)
    config.data.vocab_path = ""  # The import's vocabulary goes with its token table.


def sibling(config_file: str, name: str) -> ml_collections.ConfigDict:
  """The config of file `name` beside `config_file` ('file.py:arg' as --config takes): a config
  file deriving from another."""
  return from_file(str(epath.Path(config_file).parent / name))


RECORD = "config.json"


def record_path(workdir: str):
  return epath.Path(workdir) / RECORD


def write_record(config: ml_collections.ConfigDict, workdir: str) -> None:
  """Writes the resolved config to WORKDIR/config.json (mural.systems.recorded reads it back)."""
  record_path(workdir).write_text(config.to_json(indent=1, sort_keys=True) + "\n")


def read_record(workdir: str) -> dict:
  """The values WORKDIR/config.json records, as JSON gives them."""
  path = record_path(workdir)
  try:
    values = json.loads(path.read_text())
  except FileNotFoundError:
    raise ConfigError(f"{path}: no such file (--mode=train writes it in a workdir, --mode=export in an export)") from None
  except ValueError as e:
    raise ConfigError(f"{path}: not a config record ({e})") from None
  if not isinstance(values, dict) or not isinstance(values.get("system"), str):
    raise ConfigError(f"{path}: not a config record (a JSON object with a system)")
  return values


def flat(config) -> dict:
  """{dotted field name: its JSON value} (sequences as lists) of every leaf field of a config
  (or of the JSON values of one)."""
  out = {}

  def walk(value, prefix):
    if isinstance(value, dict):
      for k, v in value.items():
        walk(v, f"{prefix}{k}.")
    else:
      out[prefix[:-1]] = value
  walk(config if isinstance(config, dict) else json.loads(config.to_json()), "")
  return out


def differences(a, b) -> list:
  """Dotted names of the fields whose values differ between two configs (or the JSON values of
  one; a field in one only differs)."""
  fa, fb = flat(a), flat(b)
  return sorted(k for k in fa.keys() | fb.keys() if fa.get(k) != fb.get(k))


# ---------------------------------------------------------------------------
# Warm starts (mural/warm_start.py): the vocabulary that goes with a source's token table.


def takes_text_tower(config) -> bool:
  """Whether config.init_from's parts include the text tower (and its token table)."""
  parts = config.init_from_parts
  return bool(config.init_from) and (parts in ("towers", "all") or
                                     "text_tower" in {p.strip() for p in parts.split(",")})


def source_vocab(init_from: str) -> Optional[str]:
  """The wordpiece vocabulary the source was trained with: its vocab.txt (an export's, or a
  workdir's that learned one), else the data.vocab_path its config.json records; None if neither."""
  path = epath.Path(init_from) / "vocab.txt"
  if path.exists():
    return str(path)
  if record_path(init_from).exists():
    return read_record(init_from).get("data", {}).get("vocab_path") or None
  return None
