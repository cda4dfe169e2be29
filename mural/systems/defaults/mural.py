"""MURAL's config defaults: its image-text and translation-pair task sections.

Config files import this module: it imports no JAX or TensorFlow, so a
config mistake is reported in under a second. The system itself (tasks,
model, evaluators) is mural/systems/mural.py.
"""

import ml_collections

from mural import config_lib


SYNTHETIC = dict(name="synthetic", weight=1.0)


def image_text_config(**overrides) -> ml_collections.ConfigDict:
  """config.tasks.i2t: ALIGN's image-text task."""
  return ml_collections.ConfigDict(dict(dict(
      weight=1.0,  # w_i2t.
      learning_rate=1e-3,  # MURAL 3.2: 1e-3 for the image-text task.
      batch_size=4096,  # Global (MURAL 3.2).
      sources=[SYNTHETIC],  # Image-text sources (mural/data/sources.py).
      text_head="i2t",  # Head of the text side ('' : the text tower output).
      image_head="",  # Head of the image side ('' : the pooled image tower, as in ALIGN/MURAL).
      loss_impl="ring",  # See LOSS_IMPLS.
  ), **overrides))


def text_pair_config(**overrides) -> ml_collections.ConfigDict:
  """config.tasks.t2t: MURAL's translation-pair task."""
  return ml_collections.ConfigDict(dict(dict(
      weight=0.1,  # w_t2t (MURAL A.1: 0.1 : 1).
      learning_rate=1e-4,  # MURAL 3.2: 1e-4 for the text-text task.
      batch_size=4096,
      sources=[SYNTHETIC],  # Text-pair sources; empty turns the task off (ALIGN).
      head="t2t",  # Its own text head ('i2t' shares the image-text head).
      temperature=0.01,  # MURAL 3.1: fixed.
      margin=0.3,  # MURAL 3.1: additive margin on the positive cosine.
      loss_impl="ring",  # See LOSS_IMPLS.
  ), **overrides))


def get_config() -> ml_collections.ConfigDict:
  c = config_lib.base_config()
  c.system = "mural"
  c.tasks.i2t = image_text_config()
  c.tasks.t2t = text_pair_config()
  return c


# How a task computes its in-batch softmax over the global batch (the same maths):
#   ring: blockwise around the devices of the batch axes (mural/ring_loss.py): no device
#         holds more than [b, b] logits (b the per-device batch); on one device: full;
#   full: the B x B logit matrix (mural/losses.py), B^2 / n floats per device.
LOSS_IMPLS = ("ring", "full")
