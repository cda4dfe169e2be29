"""The two-tower model: an image tower, a text tower, and named projection heads.

Towers and heads are fields, so a system swaps any of them without touching
this file. `heads` maps a name to a head; tasks (mural/system.py) say which
head they read by name: MURAL's image-text task projects texts with head
'i2t' and its text-text task with head 't2t', both on the shared text tower.
A head name of None (or '') means the tower output is the embedding.
Embeddings come back float32 and unnormalised (losses normalise).

Each head keeps the name it was given (`<name>_head` from build_model) in the
parameter tree, so adding a head never renames (or re-initialises) another.
"""

import math
from typing import Mapping, Optional

import flax.linen as nn
import jax
import jax.numpy as jnp


class DualEncoder(nn.Module):
  """embed_images / embed_texts through the towers and a named head; a learned temperature."""
  image_tower: nn.Module
  text_tower: nn.Module
  heads: Mapping[str, nn.Module]
  init_temperature: float = 1.0
  learn_temperature: bool = True
  preserve_adopted_names = True  # Heads keep their given names ('i2t_head', ...).

  def setup(self):
    self.log_temperature = self.param(
        "log_temperature",
        nn.with_logical_partitioning(nn.initializers.constant(math.log(self.init_temperature)), ()),
        (), jnp.float32)

  def temperature(self):
    log_t = self.log_temperature
    if not self.learn_temperature:
      log_t = jax.lax.stop_gradient(log_t)
    return jnp.exp(log_t)

  def _project(self, x, head: Optional[str]):
    if not head:
      return x
    if head not in self.heads:
      raise KeyError(f"no head {head!r}; the model has {sorted(self.heads)}")
    return self.heads[head](x)

  def embed_images(self, images, head: Optional[str] = None, train: bool = False):
    x, _ = self.image_tower(images, train=train)
    return self._project(x, head).astype(jnp.float32)

  def embed_texts(self, ids, mask, head: Optional[str] = None, train: bool = False):
    x, _ = self.text_tower(ids, mask, train=train)
    return self._project(x, head).astype(jnp.float32)
