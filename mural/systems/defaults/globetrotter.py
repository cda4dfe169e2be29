"""Globetrotter's config defaults and the paper's text-only baseline as a variant.

Config files import this module: it imports no JAX or TensorFlow, so a
config mistake is reported in under a second. The system itself (tasks,
model, evaluators) is mural/systems/globetrotter.py.
"""

import ml_collections

from mural import config_lib


SYNTHETIC = dict(name="synthetic", weight=1.0)
TASK = "globetrotter"


def get_config() -> ml_collections.ConfigDict:
  c = config_lib.base_config()
  c.system = "globetrotter"
  c.model.image.name = "resnet"
  c.model.image.depth = 18
  c.model.image.width = 64  # Channels of the first stage (torchvision: 64).
  c.model.text.vocab_size = 32_000  # Upper bound of the learned wordpiece vocabulary.
  c.model.text.token_embed_dim = 512  # Unfactorised: the MLM head ties to the token table.
  c.model.text.hidden_dim = 512
  c.model.text.num_layers = 4
  c.model.text.num_heads = 4
  c.model.text.mlp_dim = 2048
  c.model.text.max_len = 64
  c.model.heads.embed_dim = 128  # D.
  c.model.heads.kind = "mlp"
  c.model.heads.mlp_hidden_dim = 512
  c.tasks[TASK] = ml_collections.ConfigDict(dict(
      weight=1.0,
      learning_rate=1e-4,  # Adam (paper B.1).
      batch_size=800,  # Paper B.1.
      sources=[SYNTHETIC],  # Image-text sources.
      temperature=0.1,  # On similarities rescaled to [0, 1].
      margin=0.4,  # m of f in Eq. 2.
      lambda_t=1.0,
      lambda_v=0.2,
      lambda_x=0.2,
      lambda_c=0.2,
      mask_rate=0.15,  # Share of a caption's word pieces the cloze predicts (BERT).
  ))
  c.data.synthetic.withhold_parallel_text = True
  c.data.crop_area_range = (0.08, 1.0)  # SimCLR.
  c.data.views = ml_collections.ConfigDict(dict(
      colour_strength=1.0,  # SimCLR's s: brightness/contrast/saturation 0.8 s, hue 0.2 s.
      colour_prob=0.8, grayscale_prob=0.2, blur_prob=0.5))
  c.optim.layer_adaptation = False  # Adam.
  c.optim.weight_decay = 0.0
  c.optim.eps = 1e-8
  c.optim.warmup_steps = 500
  return c


# Field overrides of the paper's compared models: 'text_only' is its text-only baseline (the same
# text model trained with L_c alone: no image, no image-related loss).
VARIANTS = {
    "full": {},
    "text_only": {"lambda_t": 0.0, "lambda_v": 0.0, "lambda_x": 0.0, "lambda_c": 1.0},
}


def apply_variant(config, name: str):
  """config with VARIANTS[name]'s task fields set."""
  if name not in VARIANTS:
    raise config_lib.ConfigError(f"Globetrotter variant {name!r} not in {sorted(VARIANTS)}")
  for key, value in VARIANTS[name].items():
    config.tasks[TASK][key] = value
  return config
