"""Export a trained model for retrieval (`export`), and load it back (`load`).

`export(config, workdir)` reads the params of a checkpoint (written by any
mesh and any number of processes: checkpointing.read_params) into a
directory that needs neither the workdir nor the config file:

  manifest.json   system, step, embedding size, languages, heads, preprocessing
                  (image size, resize, mean/std, max text length, tokenizer),
                  signatures, inputs (below)
  config.json     the resolved config
  vocab.txt       the wordpiece vocabulary (words.json: the word vocabularies
                  of MULE, SMALR and Kádár et al.)
  params.msgpack  the model's variables, {'params', 'batch_stats'}
                  (flax.serialization msgpack: no pickle)
  frozen_*/       variables the model reads when it is built, not parameters
                  (a frozen image backbone, SMALR's phase-1 text tower), each
                  in this same format
  saved_model/    a TensorFlow SavedModel (jax2tf) taking raw inputs:
                  embed_text(text: string[B]), embed_image(image_bytes: string[B]),
                  embed_image_pixels(pixels: float32[B, H, W, 3] in [0, 255]);
                  each returns {'embedding': float32[B, D]}, L2-normalised.
                  With per-language word vocabularies (MULE, SMALR)
                  embed_text(text: string[B], lang: string[B]).

manifest['inputs'] maps each config field that names something outside the
workdir (the vocabulary, the runs of frozen_*/) to its copy here, or to ''
for a file that only initialised parameters (FastText): `load` points the
fields there, so an export needs no other path.

`load(dir)` gives a `Model` with `embed_texts(list of str, langs)` and
`embed_images(paths or uint8 [H, W, 3] arrays)`: jitted, fixed-size batches
(padded tail) split over the local devices, L2-normalised float32, the same
numbers the evaluator computes.

Everything embeds through the system's model and the heads its retrieval
evaluator uses (System.retrieval_heads), never through task names: any system
that declares those heads exports the same way.
"""

import json
import os
import shutil
import types
from typing import Any, Dict, Optional, Sequence, Tuple

import jax
import jax.numpy as jnp
import numpy as np
from absl import logging
from etils import epath
from flax import serialization

from mural import config_lib
from mural import disk_space

from mural import saved_variables
from mural.saved_variables import CONFIG, MANIFEST, PARAMS, SAVED_MODEL, VOCAB

# Part of this module's interface too.
read_variables, flat = saved_variables.read_variables, saved_variables.flat
FORMAT = 1  # manifest['format']: bumped when the layout changes.
SIGNATURES = {
    "embed_text": "text: tf.string [B] -> embedding float32 [B, D] (the tokenizer in the graph)",
    "embed_image": "image_bytes: tf.string [B] (JPEG/PNG/GIF/BMP files) -> embedding float32 [B, D]",
    "embed_image_pixels": "pixels: float32 [B, H, W, 3] RGB in [0, 255] -> embedding float32 [B, D]",
}


# ---------------------------------------------------------------------------
# Model, heads and variables.


def model_and_heads(config):
  """(unbound model, {'image': head, 'text': head}, active tasks) of config's system."""
  from mural import system as system_lib  # pylint: disable=g-import-not-at-top
  from mural import systems  # pylint: disable=g-import-not-at-top
  system = systems.get(config)
  if system.retrieval_heads is None:
    raise ValueError(f"system {system.name!r} declares no retrieval_heads (mural/system.py): "
                     "it cannot be exported")
  tasks = system_lib.active_tasks(system, config)
  heads = dict(system.retrieval_heads(config, tasks))
  return system.build_model(config, tasks), {k: heads[k] or "" for k in ("image", "text")}, tasks


def abstract_variables(model, tasks, config) -> Dict[str, Any]:
  """{'params', 'batch_stats'} as ShapeDtypeStructs (nothing computed)."""
  import flax.linen as nn  # pylint: disable=g-import-not-at-top
  from mural import system as system_lib  # pylint: disable=g-import-not-at-top
  v = jax.eval_shape(lambda r: nn.unbox(system_lib.init_variables(model, tasks, config, r)),
                     jax.random.PRNGKey(0))
  return {"params": v["params"], "batch_stats": v.get("batch_stats", {})}


def untrained_variables(config, model, tasks, abstract, workdir: str) -> Dict[str, Any]:
  """A run's variables before its first step, of a workdir that has trained none: initialised
  as the trainer initialises them from config.seed (the same key and compiler options), then
  config.init_from's warm start (an import exports as it starts). Copies the source's
  vocabulary into the workdir, as a run would."""
  import flax.linen as nn  # pylint: disable=g-import-not-at-top
  from mural import system as system_lib  # pylint: disable=g-import-not-at-top
  from mural import warm_start  # pylint: disable=g-import-not-at-top
  from mural.data import vocab  # pylint: disable=g-import-not-at-top
  epath.Path(workdir).mkdir(parents=True, exist_ok=True)
  vocab.learn(config, tasks, workdir)
  warm = warm_start.match(types.SimpleNamespace(**abstract), config, vocab.wordpiece_path(config, workdir))

  def init(rng):  # What the warm start fills is left out (WarmStart.leaving_out), as the trainer does.
    v = nn.unbox(system_lib.init_variables(model, tasks, config, rng))
    return {c: warm.leaving_out(c, v.get(c, {}), lambda leaf: jnp.zeros((), leaf.dtype)) for c in abstract}

  initial = jax.jit(init, compiler_options=system_lib.init_compiler_options())(
      system_lib.init_rngs(jax.random.PRNGKey(config.seed))[0])
  return {c: warm.filled(c, tree, like=abstract[c]) for c, tree in initial.items()}


def check_fits(variables, abstract, what: str) -> None:
  """ValueError naming the first array whose name or shape differs from the config's model."""
  have, want = flat(variables), flat(abstract)
  problems = [f"{k}: {what} has shape {tuple(np.shape(have[k]))}, the config {tuple(want[k].shape)}"
              for k in want if k in have and tuple(np.shape(have[k])) != tuple(want[k].shape)]
  problems += [f"{k}: not in {what}" for k in want if k not in have]
  problems += [f"{k}: in {what}, not in the config's model" for k in have if k not in want]
  if problems:
    more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
    raise ValueError(f"{what} does not fit the config's model: {problems[0]}{more}")


def _l2(x):
  x = x.astype(jnp.float32)
  return x / jnp.maximum(jnp.linalg.norm(x, axis=-1, keepdims=True), 1e-12)


def embed_fns(model, heads):
  """(variables, images) -> unit rows and (variables, ids, mask) -> unit rows: pure JAX."""
  image_head, text_head = heads["image"] or None, heads["text"] or None

  def images(variables, x):
    return _l2(model.apply(variables, x, image_head, method="embed_images"))

  def texts(variables, ids, mask):
    return _l2(model.apply(variables, ids, mask, text_head, method="embed_texts"))

  return images, texts


# ---------------------------------------------------------------------------
# Writing.


def default_dir(workdir: str, step: int) -> str:
  return str(epath.Path(workdir) / "export" / f"step_{step}")


def export(config, workdir: str, export_dir: Optional[str] = None, step: Optional[int] = None,
           saved_model: bool = True, platforms: Sequence[str] = ("cpu", "cuda")) -> str:
  """Writes the export of checkpoint `step` (default: read_params's: the best step of an early-stopping
  run, else the newest that reads); returns its directory.

  The directory is written beside its final place and renamed into it (an
  older export there is replaced), so a reader never sees half of one.
  `platforms`: what the SavedModel's XLA code is compiled for (jax2tf native
  serialization; 'tpu' can be added).
  """
  from mural import checkpointing  # pylint: disable=g-import-not-at-top
  from mural import models  # pylint: disable=g-import-not-at-top
  from mural import systems  # pylint: disable=g-import-not-at-top
  from mural.data import vocab  # pylint: disable=g-import-not-at-top
  untrained = config.init_from and step in (None, 0) and not checkpointing.directory(workdir).exists()
  if not untrained:  # Read before the model is traced: a missing checkpoint is a quick error.
    step, variables = checkpointing.read_params(workdir, step)
  model, heads, tasks = model_and_heads(config)
  abstract = abstract_variables(model, tasks, config)
  if untrained:
    step, variables = 0, untrained_variables(config, model, tasks, abstract, workdir)
  variables = {"params": variables["params"], "batch_stats": variables.get("batch_stats", {})}
  if "image_tower" not in abstract["params"]:  # Text-only pre-training: nothing embeds an image.
    raise config_lib.ConfigError(
        f"config.tasks: the active tasks of this {config.system} config "
        f"({', '.join(t.name for t in tasks)}) train no image tower, and an export embeds images "
        "and texts: export a run that trains both (the one that starts from this pre-training)")
  check_fits(variables, abstract, f"checkpoint {step} in {workdir}")
  vocab_field, vocab_path = vocab.vocab_file(config, workdir)
  if not os.path.exists(vocab_path):
    raise FileNotFoundError(f"vocab {vocab_path} does not exist (config.{vocab_field} or the "
                            "workdir's)")
  words = vocab_field != "data.vocab_path"
  vocab_name = os.path.basename(vocab_path) if words else VOCAB

  final = epath.Path(export_dir or default_dir(workdir, step))
  tmp = epath.Path(f"{final}.tmp-{os.getpid()}")
  if tmp.exists():
    shutil.rmtree(tmp)
  # A full disk removes the partial copy (an older export at `final` stays as it was).
  with disk_space.writing(f"the export of step {step}", final, partial=tmp,
                          resume=f"checkpoint {step} is untouched: the same command exports it once "
                                 "there is space"):
    tmp.mkdir(parents=True)
    shutil.copyfile(vocab_path, tmp / vocab_name)
    (tmp / CONFIG).write_text(config.to_json(indent=1, sort_keys=True))
    (tmp / PARAMS).write_bytes(serialization.msgpack_serialize(jax.tree.map(np.asarray, variables)))
    # What the config names outside the workdir, in the export: the loader points each field at
    # its copy ('' clears a field that only initialised parameters).
    inputs = {vocab_field: vocab_name}
    system = systems.get(config)
    frozen = dict(models.frozen_inputs(config, model),
                  **(system.frozen_inputs(config) if system.frozen_inputs else {}))
    for field, tree in frozen.items():
      inputs[field] = _write_frozen(tmp, field, tree, step)
    inputs.update({field: "" for field in system.initialisers if config_lib.get_field(config, field)})
    embed_dim = int(jax.eval_shape(embed_fns(model, heads)[1], abstract,
                                   jax.ShapeDtypeStruct((1, config.model.text.max_len), jnp.int32),
                                   jax.ShapeDtypeStruct((1, config.model.text.max_len), jnp.int32)).shape[-1])
    manifest = {
        "format": FORMAT, "system": config.system, "step": int(step), "embed_dim": embed_dim,
        "heads": heads, "languages": list(config.data.languages),
        "image": {"size": int(config.data.image_size), "resize": int(config.data.eval_resize),
                  "resize_method": "short side to `resize` (bilinear, antialiased), central `size` crop",
                  "mean": [127.5] * 3, "std": [127.5] * 3, "input": "RGB, pixels in [0, 255]"},
        "text": {"max_len": int(config.model.text.max_len), "vocab": vocab_name,
                 "normalization": config.data.get("text_normalization", "casefold"),
                 "tokenizer": "words" if words else "wordpiece",
                 "needs_language": bool(words and not config.data.get("word_vocab_union", False))},
        "files": {"params": PARAMS, "config": CONFIG, "vocab": vocab_name},
        "inputs": inputs,
    }
    if saved_model:
      tokenizer = vocab.tokenizer(config, tasks, workdir, learn_missing=False)
      write_saved_model(model, variables, heads, config, tokenizer, str(tmp / SAVED_MODEL), platforms)
      manifest["files"]["saved_model"] = SAVED_MODEL
      manifest["signatures"] = dict(SIGNATURES)
      if tokenizer.needs_language:
        manifest["signatures"]["embed_text"] = (
            "text: tf.string [B], lang: tf.string [B] (codes of manifest['languages']) -> embedding "
            "float32 [B, D] (the tokenizer in the graph)")
      manifest["platforms"] = list(platforms)
    (tmp / MANIFEST).write_text(json.dumps(manifest, indent=1))
    if final.exists():
      shutil.rmtree(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp.rename(final)
  logging.info("Exported step %d of %s to %s (embedding size %d).", step, workdir, final, embed_dim)
  return str(final)


def _write_frozen(root, field: str, variables, step: int) -> str:
  """Writes a frozen input's variables as an export-format directory (what export.read_variables
  and the tower's own reader take for a run); returns its name in the export."""
  name = "frozen_" + field.replace(".", "_")
  (root / name).mkdir()
  (root / name / PARAMS).write_bytes(serialization.msgpack_serialize(jax.tree.map(np.asarray, variables)))
  (root / name / MANIFEST).write_text(json.dumps(
      {"format": FORMAT, "step": int(step), "of": f"config.{field}: variables the model reads when "
                                                    "it is built, not parameters"}, indent=1))
  return name


def write_saved_model(model, variables, heads, config, tokenizer, path: str,
                      platforms: Sequence[str]) -> None:
  """The TensorFlow SavedModel (see the module docstring): jax2tf, the batch size polymorphic."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from jax.experimental import jax2tf  # pylint: disable=g-import-not-at-top
  from mural.data import preprocess  # pylint: disable=g-import-not-at-top
  size, resize, max_len = config.data.image_size, config.data.eval_resize, config.model.text.max_len
  leaves, treedef = jax.tree.flatten(variables)
  images_fn, texts_fn = embed_fns(model, heads)
  convert = dict(with_gradient=False, native_serialization_platforms=tuple(platforms))
  tf_images = jax2tf.convert(lambda v, x: images_fn(jax.tree.unflatten(treedef, v), x),
                             polymorphic_shapes=[None, f"(b, {size}, {size}, 3)"], **convert)
  tf_texts = jax2tf.convert(lambda v, i, m: texts_fn(jax.tree.unflatten(treedef, v), i, m),
                            polymorphic_shapes=[None, f"(b, {max_len})", f"(b, {max_len})"], **convert)

  module = tf.Module()
  module.weights = [tf.Variable(np.asarray(x), trainable=False) for x in leaves]
  module.tokenizer_parts = tokenizer.trackables
  prepared = tf.TensorSpec([size, size, 3], tf.float32)

  def embed_images(images):
    return {"embedding": tf_images(list(module.weights), images)}

  def embed_tokens(text, langs=None):
    ids, mask = tokenizer.tokenize(text, langs)
    return {"embedding": tf_texts(list(module.weights), ids, mask)}

  text_spec = tf.TensorSpec([None], tf.string, name="text")
  if tokenizer.needs_language:  # Per-language words: each text's language code beside it.
    languages = list(config.data.languages)
    module.language_table = tf.lookup.StaticHashTable(tf.lookup.KeyValueTensorInitializer(
        tf.constant(languages), tf.range(len(languages), dtype=tf.int64)), default_value=-1)

    @tf.function(input_signature=[text_spec, tf.TensorSpec([None], tf.string, name="lang")], autograph=False)
    def embed_text(text, lang):
      index = module.language_table.lookup(lang)
      checks = [tf.debugging.assert_equal(tf.size(lang), tf.size(text), message="lang: one code per text"),
                tf.debugging.assert_non_negative(index, message=f"lang: a code not in {languages}")]
      with tf.control_dependencies(checks):
        return embed_tokens(text, tf.identity(index))
  else:
    @tf.function(input_signature=[text_spec], autograph=False)
    def embed_text(text):
      return embed_tokens(text)

  @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="image_bytes")], autograph=False)
  def embed_image(image_bytes):
    return embed_images(tf.map_fn(lambda b: preprocess.eval_image(preprocess.decode(b), resize, size),
                                  image_bytes, fn_output_signature=prepared))

  @tf.function(input_signature=[tf.TensorSpec([None, None, None, 3], tf.float32, name="pixels")],
               autograph=False)
  def embed_image_pixels(pixels):
    return embed_images(tf.map_fn(lambda p: preprocess.eval_image(p, resize, size), pixels,
                                  fn_output_signature=prepared))

  module.embed_text, module.embed_image, module.embed_image_pixels = (
      embed_text, embed_image, embed_image_pixels)
  # Lowered as it is saved. ragged_dot (the per-language FCs of MULE and SMALR) as plain dots for
  # every platform: its GPU instruction reaches TensorFlow as a StableHLO composite that
  # TensorFlow 2.21 cannot read back.
  # TensorFlow's writer mutes absl around each object it walks and then sets absl's logger to the
  # verbosity it read (WARNING), not back to unset: the process's INFO lines would stop after an
  # export. Its level is put back as it was.
  before = jax.config.jax_ragged_dot_use_ragged_dot_instruction
  absl_level = logging.get_absl_logger().level
  jax.config.update("jax_ragged_dot_use_ragged_dot_instruction", False)
  try:
    tf.saved_model.save(module, path, signatures={
        "embed_text": embed_text, "embed_image": embed_image, "embed_image_pixels": embed_image_pixels})
  finally:
    jax.config.update("jax_ragged_dot_use_ragged_dot_instruction", before)
    logging.get_absl_logger().setLevel(absl_level)


# ---------------------------------------------------------------------------
# Loading.


class Model:
  """An export directory, loaded: embed_texts / embed_images (see the module docstring)."""

  def __init__(self, path: str, batch_size: int = 64):
    from mural import data  # pylint: disable=g-import-not-at-top
    root = epath.Path(path)
    if not (root / MANIFEST).exists():
      raise FileNotFoundError(f"{path} is not an export directory (no {MANIFEST}; write one with "
                              "python -m mural.main --mode=export)")
    data.hide_accelerators_from_tensorflow()  # TensorFlow only preprocesses: the accelerators are JAX's.
    import ml_collections  # pylint: disable=g-import-not-at-top
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P  # pylint: disable=g-import-not-at-top
    from mural.data import vocab  # pylint: disable=g-import-not-at-top
    self.path = str(root)
    self.manifest = json.loads((root / MANIFEST).read_text())
    self.config = ml_collections.ConfigDict(json.loads((root / CONFIG).read_text()))
    inputs = self.manifest.get("inputs", {"data.vocab_path": VOCAB})  # Exports before "inputs".
    for field, name in inputs.items():  # The export's own copies of what the config names.
      config_lib.set_field(self.config, field, str(root / name) if name else "")
    model, heads, tasks = model_and_heads(self.config)
    variables, _ = read_variables(path)
    check_fits(variables, abstract_variables(model, tasks, self.config), f"export {path}")
    self.embed_dim = int(self.manifest["embed_dim"])
    self.image_size = int(self.manifest["image"]["size"])
    self.resize = int(self.manifest["image"]["resize"])
    self.languages = list(self.manifest["languages"])
    self.tokenizer = vocab.tokenizer(self.config, tasks, self.path, learn_missing=False)

    devices = np.array(jax.local_devices())
    self._rows = NamedSharding(Mesh(devices, ("data",)), P("data"))
    self.batch_size = -(-batch_size // devices.size) * devices.size  # Whole rows per device.
    replicated = NamedSharding(self._rows.mesh, P())
    self._variables = jax.device_put(variables, replicated)
    images_fn, texts_fn = embed_fns(model, heads)
    self._images = jax.jit(images_fn, out_shardings=replicated)
    self._texts = jax.jit(texts_fn, out_shardings=replicated)
    self._prepare = None

  def _batched(self, fn, arrays: Sequence[np.ndarray]) -> np.ndarray:
    n, bs, out = len(arrays[0]), self.batch_size, []
    for start in range(0, n, bs):
      chunk = [a[start:start + bs] for a in arrays]
      real = len(chunk[0])
      if real < bs:  # Pad to the compiled shape; padded rows are dropped.
        chunk = [np.concatenate([c, np.zeros((bs - real,) + c.shape[1:], c.dtype)]) for c in chunk]
      out.append(np.asarray(fn(self._variables, *[jax.device_put(c, self._rows) for c in chunk]))[:real])
    return np.concatenate(out) if out else np.zeros((0, self.embed_dim), np.float32)

  def tokenize(self, texts: Sequence[str], langs=None) -> Tuple[np.ndarray, np.ndarray]:
    """(ids, mask) int32 [N, max_len]; `langs` as embed_texts takes them."""
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    if isinstance(texts, (str, bytes)) or not all(isinstance(t, str) for t in texts):
      raise ValueError("embed_texts takes a list of str")
    if not self.tokenizer.needs_language:
      langs = None  # One vocabulary for every language.
    elif langs is None:
      raise ValueError(f"this export's word vocabularies are per language: embed_texts(texts, "
                       f"langs=<one of {self.languages}, or one per text>)")
    if langs is not None:
      try:
        codes = [langs] * len(texts) if isinstance(langs, str) else list(langs)
      except TypeError:
        raise ValueError(f"langs: a language code or a list of them, got {langs!r}") from None
      unknown = sorted(set(codes) - set(self.languages))
      if unknown or len(codes) != len(texts):
        raise ValueError(f"langs: {unknown or len(codes)} (the export's languages: {self.languages}; "
                         f"one code, or one per text)")
      langs = tf.constant([self.languages.index(c) for c in codes] or [0], tf.int64)
    ids, mask = self.tokenizer.tokenize(tf.constant(list(texts) or [""], tf.string), langs)
    return ids.numpy()[:len(texts)], mask.numpy()[:len(texts)]

  def embed_texts(self, texts: Sequence[str], langs=None) -> np.ndarray:
    """float32 [N, D], unit rows; '' embeds as [CLS][SEP], long texts are truncated. `langs`:
    a language code for every text, or one per text; needed by per-language word vocabularies
    (MULE), ignored by one vocabulary for all (manifest['text']['needs_language'])."""
    return self._batched(self._texts, self.tokenize(texts, langs))

  def prepare_image(self, item) -> np.ndarray:
    """A path (or bytes of an image file) or a uint8 [H, W, 3] array -> the model's input,
    float32 [S, S, 3] in [-1, 1]; ValueError (one line) when it cannot be read or decoded."""
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    from mural.data import preprocess  # pylint: disable=g-import-not-at-top
    if self._prepare is None:
      self._prepare = tf.function(lambda im: preprocess.eval_image(im, self.resize, self.image_size),
                                  input_signature=[tf.TensorSpec([None, None, 3], tf.uint8)])
    if isinstance(item, np.ndarray):
      if item.dtype != np.uint8 or item.ndim != 3 or item.shape[-1] != 3 or min(item.shape[:2]) < 1:
        raise ValueError(f"an image array must be uint8 [H, W, 3], got {item.dtype} {item.shape}")
      image = item
    else:
      what = "image bytes" if isinstance(item, bytes) else f"image {os.fspath(item)}"
      try:
        data = item if isinstance(item, bytes) else tf.io.read_file(os.fspath(item))
        image = preprocess.decode(data)
      except (tf.errors.OpError, OSError) as e:
        message = (getattr(e, "message", "") or str(e)).strip().splitlines()
        message = message[0].split("}} ")[-1].split(" [Op:")[0] if message else type(e).__name__
        raise ValueError(f"{what} cannot be read or decoded: {message}") from None
    return self._prepare(tf.convert_to_tensor(image)).numpy()

  def embed_prepared(self, images: np.ndarray) -> np.ndarray:
    """float32 [N, S, S, 3] model inputs in [-1, 1] -> float32 [N, D], unit rows."""
    return self._batched(self._images, [np.asarray(images, np.float32)])

  def embed_images(self, items: Sequence[Any]) -> np.ndarray:
    """Paths, image-file bytes or uint8 [H, W, 3] arrays -> float32 [N, D], unit rows."""
    prepared = [self.prepare_image(x) for x in items]
    if not prepared:
      return np.zeros((0, self.embed_dim), np.float32)
    return self.embed_prepared(np.stack(prepared))


def load(path: str, batch_size: int = 64) -> Model:
  """The export directory `path` as a Model (embed_texts, embed_images)."""
  return Model(path, batch_size)
