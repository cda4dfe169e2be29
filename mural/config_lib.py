"""The config schema: every field with its default and a one-line meaning.

Config files in `configs/` start from `base_config()` and change what their
paper says. `validate()` turns a bad value into a one-line `ConfigError` that
names the field, before anything reaches JAX.
"""

import ml_collections


class ConfigError(ValueError):
  """A config field holds a value mural cannot use."""


def base_config() -> ml_collections.ConfigDict:
  """MURAL-BASE-shaped defaults; every config file edits a copy of this."""
  c = ml_collections.ConfigDict()
  c.seed = 0

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
  c.model.image.stochastic_depth_rate = 0.2  # Drop-connect rate of the last block.
  c.model.image.include_head = False  # 1x1 head conv (1280 * width) before pooling.
  c.model.image.num_classes = 0  # >0 adds the classifier (param-count checks only).
  c.model.image.bn_momentum = 0.99
  # Name of the image tower's feature input when it reads precomputed
  # features instead of pixels (MULE/Kadar et al.); unused by EfficientNet.
  c.model.image.feature_dim = 2048

  c.model.text = ml_collections.ConfigDict()
  c.model.text.name = "bert"  # Key of mural.models.TEXT_TOWERS.
  c.model.text.vocab_size = 250_000  # Rows of the token table (>= tokenizer vocab).
  c.model.text.token_embed_dim = 768  # < hidden_dim: factorised, projected up.
  c.model.text.hidden_dim = 768
  c.model.text.num_layers = 12
  c.model.text.num_heads = 12
  c.model.text.mlp_dim = 3072
  c.model.text.max_len = 64  # Position table size and the tokenizer's length.
  c.model.text.dropout_rate = 0.1

  c.model.heads = ml_collections.ConfigDict()
  c.model.heads.embed_dim = 512  # Shared space; must equal the image embedding size.
  c.model.heads.kind = "dense"  # dense (single FC, the paper's choice) | mlp.
  c.model.heads.mlp_hidden_dim = 1024  # Hidden width of the mlp head.
  c.model.heads.i2t = True  # Text-side head for the image-text task.
  c.model.heads.t2t = True  # Text-side head for the text-text task (MURAL).
  c.model.heads.image = False  # A head on the image side too (off in ALIGN/MURAL).

  # ---- Loss --------------------------------------------------------------
  c.loss = ml_collections.ConfigDict()
  c.loss.i2t_weight = 1.0  # Weight of L_i2t + L_t2i.
  c.loss.t2t_weight = 0.1  # Weight of L_r2l + L_l2r; 0 gives ALIGN.
  c.loss.init_temperature = 1.0  # Learned, shared by i2t and t2i.
  c.loss.learn_temperature = True
  c.loss.t2t_temperature = 0.01  # Fixed.
  c.loss.t2t_margin = 0.3  # Additive margin on the positive cosine.

  # ---- Optimisation ------------------------------------------------------
  c.optim = ml_collections.ConfigDict()
  c.optim.name = "lamb"
  c.optim.i2t_learning_rate = 1e-3
  c.optim.t2t_learning_rate = 1e-4  # Own optimizer state and schedule (see optim.py).
  c.optim.weight_decay = 1e-5  # Masked off biases, norms and the temperature.
  c.optim.warmup_steps = 10_000  # Linear warm-up from 0.
  c.optim.b1 = 0.9
  c.optim.b2 = 0.999
  c.optim.eps = 1e-6
  c.optim.grad_clip_norm = ml_collections.FieldReference(None, float)  # None: no clipping.
  c.optim.grad_accum_steps = 1  # Micro-batches per update.

  c.total_steps = 600_000  # Linear decay to 0 at this step.
  c.batch_size = 4096  # Global image-text batch.
  c.t2t_batch_size = 4096  # Global translation-pair batch.

  # ---- Data --------------------------------------------------------------
  c.data = ml_collections.ConfigDict()
  c.data.image_size = 289  # Training crop (ALIGN: 289 from 346).
  c.data.eval_resize = 346  # Eval: resize the short side, then centre-crop.
  c.data.vocab_path = ""  # Existing wordpiece vocab; empty: build into workdir.
  c.data.vocab_sources = ["i2t", "t2t"]  # Text the vocab is built from.
  c.data.language_sampling_temperature = 1.0  # 1: natural mix; >1 flattens.
  c.data.shuffle_buffer = 10_000
  # Image-text sources: list of dicts {name, weight, ...source fields}.
  c.data.i2t_sources = [dict(name="synthetic", weight=1.0)]
  # Text-text sources (translation pairs); empty disables the t2t task.
  c.data.t2t_sources = [dict(name="synthetic", weight=1.0)]
  c.data.eval_source = dict(name="synthetic")  # Held-out retrieval data.
  c.data.synthetic = ml_collections.ConfigDict()
  c.data.synthetic.languages = ["en", "de", "fr", "cs", "ru", "ja", "hi", "sw"]
  # Image-caption pairs per language (training); a language missing here gets
  # `default_pairs`. Scarce languages are how MURAL's claim is tested.
  c.data.synthetic.pairs_per_language = ml_collections.ConfigDict()
  c.data.synthetic.default_pairs = 20_000
  c.data.synthetic.translation_pairs = 20_000  # Per language pair, independent of the above.
  c.data.synthetic.eval_scenes = 200  # Held-out scenes (unique descriptions).

  # ---- Sharding ----------------------------------------------------------
  c.mesh = ml_collections.ConfigDict()
  c.mesh.data = -1  # -1: every device not used by the other axes.
  c.mesh.fsdp = 1
  c.mesh.model = 1
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
  c.log_every_steps = 100
  c.eval_every_steps = 5_000  # 0: only at the end.
  c.checkpoint_every_steps = 5_000
  c.keep_checkpoints = 3
  c.eval_batch_size = 256
  return c


_DTYPES = ("float32", "bfloat16")
_HEAD_KINDS = ("dense", "mlp")


def _require(ok: bool, field: str, message: str):
  if not ok:
    raise ConfigError(f"config.{field}: {message}")


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
  _require(c.model.heads.kind in _HEAD_KINDS, "model.heads.kind", f"{c.model.heads.kind!r} not in {_HEAD_KINDS}")
  _require(c.model.heads.embed_dim > 0, "model.heads.embed_dim", "must be positive")
  _require(c.loss.init_temperature > 0, "loss.init_temperature", "must be positive")
  _require(c.loss.t2t_temperature > 0, "loss.t2t_temperature", "must be positive")
  _require(c.loss.i2t_weight >= 0, "loss.i2t_weight", "must be >= 0")
  _require(c.loss.t2t_weight >= 0, "loss.t2t_weight", "must be >= 0")
  _require(c.optim.name == "lamb", "optim.name", f"{c.optim.name!r}: only 'lamb' is implemented")
  _require(c.optim.i2t_learning_rate >= 0, "optim.i2t_learning_rate", "must be >= 0")
  _require(c.optim.t2t_learning_rate >= 0, "optim.t2t_learning_rate", "must be >= 0")
  _require(c.optim.warmup_steps >= 0, "optim.warmup_steps", "must be >= 0")
  _require(c.optim.grad_accum_steps >= 1, "optim.grad_accum_steps", "must be >= 1")
  _require(c.total_steps > 0, "total_steps", "must be positive")
  _require(c.batch_size > 0, "batch_size", "must be positive")
  _require(c.t2t_batch_size > 0, "t2t_batch_size", "must be positive")
  _require(c.batch_size % c.optim.grad_accum_steps == 0, "optim.grad_accum_steps",
           f"does not divide batch_size {c.batch_size}")
  _require(c.data.image_size > 0, "data.image_size", "must be positive")
  _require(c.data.eval_resize >= c.data.image_size, "data.eval_resize",
           f"{c.data.eval_resize} is smaller than data.image_size {c.data.image_size}")
  _require(len(c.data.i2t_sources) > 0, "data.i2t_sources", "needs at least one source")
  for axis in ("data", "fsdp", "model"):
    v = c.mesh[axis]
    _require(isinstance(v, int) and (v == -1 or v >= 1), f"mesh.{axis}", f"must be -1 or >= 1, got {v!r}")
