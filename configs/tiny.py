"""Tiny MURAL for tests and smoke runs on CPU: same code paths, toy sizes.

Data fields stay as in base_config (the data code owns them) except the image
size the tiny tower is built for.
"""

from mural import systems


def get_config():
  c = systems.base_config("mural")
  c.model.image.variant = "b0"  # Block table of B0, scaled down by the two overrides.
  c.model.image.width_coefficient = 0.25  # Channels 8..80 (round_filters keeps >= 8).
  c.model.image.depth_coefficient = 0.25  # One block per stage: 7 MBConv blocks.
  # XLA's own convolutions: at 32 px their run time does not matter, and they trace and compile
  # to far fewer ops than the CPU's 'fast' shifted multiply-adds (tiny train step: about 15% less
  # CPU to build). tests/test_efficientnet_impl.py checks every implementation against them.
  c.model.image.conv_impl = "xla"
  c.model.text.vocab_size = 1000
  c.model.text.token_embed_dim = 64  # Not factorised (tests cover the factorised case).
  c.model.text.hidden_dim = 64
  c.model.text.num_layers = 2
  c.model.text.num_heads = 4
  c.model.text.mlp_dim = 128
  c.model.text.max_len = 16
  c.model.heads.embed_dim = 80  # The tiny tower's pooled width: round_filters(320, 0.25).
  c.model.heads.mlp_hidden_dim = 64
  c.data.image_size = 32  # Smallest size the 5 stride-2 stages reduce to 1 x 1.
  c.data.autotune = False  # Closing the pipeline is immediate (config_lib.py says why).
  c.data.eval_resize = 36  # Keeps ALIGN's crop/resize ratio roughly (289/346).
  c.tasks.i2t.batch_size = 8
  c.tasks.t2t.batch_size = 8
  c.eval_batch_size = 8
  c.optim.warmup_steps = 2
  c.total_steps = 10
  c.log_every_steps = 1
  c.eval_every_steps = 5
  c.checkpoint_every_steps = 5
  return c
