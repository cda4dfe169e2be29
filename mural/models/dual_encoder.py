"""The two-tower model: image tower, shared text tower, per-task text heads.

Towers and heads are fields, so a new system swaps a tower without touching
this file. The text tower is shared by the image-text (i2t) and text-text
(t2t) tasks; each task has its own head. Without a t2t head (ALIGN) the t2t
task reuses the i2t head, so ALIGN can still be evaluated on translation
retrieval. Embeddings come back float32 and unnormalised (losses normalise).
"""

import math
from typing import Optional

import flax.linen as nn
import jax
import jax.numpy as jnp


class DualEncoder(nn.Module):
  """See the spec: __call__(batch, train) embeds whatever the batch holds."""
  image_tower: nn.Module
  text_tower: nn.Module
  i2t_head: Optional[nn.Module] = None  # None: the text tower output is the embedding.
  t2t_head: Optional[nn.Module] = None  # None: the t2t task uses the i2t head.
  image_head: Optional[nn.Module] = None  # None: the image tower output is the embedding.
  init_temperature: float = 1.0
  learn_temperature: bool = True

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

  def embed_images(self, images, train: bool = False):
    x, _ = self.image_tower(images, train=train)
    if self.image_head is not None:
      x = self.image_head(x)
    return x.astype(jnp.float32)

  def embed_texts(self, ids, mask, task: str = "i2t", train: bool = False):
    if task not in ("i2t", "t2t"):
      raise ValueError(f"task must be 'i2t' or 't2t', got {task!r}")
    x, _ = self.text_tower(ids, mask, train=train)
    head = self.t2t_head if task == "t2t" and self.t2t_head is not None else self.i2t_head
    if head is not None:
      x = head(x)
    return x.astype(jnp.float32)

  def __call__(self, batch: dict, train: bool) -> dict:
    out = {"temperature": self.temperature()}
    if "image" in batch:
      out["image_emb"] = self.embed_images(batch["image"], train)
    if "text_ids" in batch:
      out["text_emb"] = self.embed_texts(batch["text_ids"], batch["text_mask"], "i2t", train)
    for side in ("left", "right"):
      if f"{side}_ids" in batch:
        out[f"{side}_emb"] = self.embed_texts(
            batch[f"{side}_ids"], batch[f"{side}_mask"], "t2t", train)
    return out
