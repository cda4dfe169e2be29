"""Globetrotter's model (Surís et al. 2022): an image tower, a text tower, a prediction head on
each to the shared space, and a masked-LM head on the text tower's sequence output.

Methods: `embed_images` / `embed_texts` (the evaluators' and export's
interface: head 'image' / 'text', '' or None for the tower output),
`embed_texts(..., MEAN_POOL)` the mean of the token outputs, `text_sequence` (the tower's per-token outputs) and `mlm_logits` (the cloze
head over the vocabulary, its output layer tied to the token table as in
BERT). Embeddings come back float32 and unnormalised (losses normalise).
"""

from typing import Any, Optional

import flax.linen as nn
import jax.numpy as jnp

from mural.models import bert

MEAN_POOL = "mean_pool"  # embed_texts' name for the mean of the token outputs (no head).


class MlmHead(nn.Module):
  """BERT's cloze head: Dense -> GELU -> LayerNorm -> (tied) token table^T + bias."""
  vocab_size: int
  dtype: Any = jnp.float32
  param_dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, sequence, token_table):
    kw = dict(dtype=self.dtype, param_dtype=self.param_dtype)
    x = bert._dense(sequence.shape[-1], "embed", "mlp", "transform", **kw)(sequence)  # pylint: disable=protected-access
    x = bert._layer_norm("transform_norm", **kw)(nn.gelu(x, approximate=False))  # pylint: disable=protected-access
    bias = self.param("output_bias", nn.with_logical_partitioning(nn.initializers.zeros, ("vocab",)),
                      (self.vocab_size,), self.param_dtype)
    logits = jnp.einsum("ble,ve->blv", x, token_table.astype(x.dtype))
    return logits.astype(jnp.float32) + bias


class GlobetrotterModel(nn.Module):
  image_tower: nn.Module
  text_tower: nn.Module  # A bert.Bert (unfactorised token table: the MLM head ties to it).
  image_head: nn.Module
  text_head: nn.Module
  mlm_head: nn.Module

  def _project(self, x, head: Optional[str]):
    if not head:
      return x
    heads = {"image": self.image_head, "text": self.text_head}
    if head not in heads:
      raise KeyError(f"no head {head!r}; the model has {sorted(heads)}")
    return heads[head](x)

  def embed_images(self, images, head: Optional[str] = "image", train: bool = False):
    x, _ = self.image_tower(images, train=train)
    return self._project(x, head).astype(jnp.float32)

  def embed_texts(self, ids, mask, head: Optional[str] = "text", train: bool = False):
    """head 'text': the prediction head; '' / None: the [CLS] output; MEAN_POOL: the mean of the
    tower's outputs over the caption's tokens (the usual sentence vector of a masked LM, which
    trains no [CLS] output: the text-only baseline's)."""
    x, aux = self.text_tower(ids, mask, train=train)
    if head == MEAN_POOL:
      weights = (mask > 0).astype(jnp.float32)[..., None]
      pooled = jnp.sum(aux["sequence"].astype(jnp.float32) * weights, axis=1)
      return pooled / jnp.maximum(jnp.sum(weights, axis=1), 1.0)
    return self._project(x, head).astype(jnp.float32)

  def text_sequence(self, ids, mask, train: bool = False):
    _, aux = self.text_tower(ids, mask, train=train)
    return aux["sequence"]

  def mlm_logits(self, sequence):
    table = self.text_tower.variables["params"]["token_embed"]["embedding"]
    return self.mlm_head(sequence, nn.unbox(table))

  def token_table(self):
    """The word-embedding rows (word translation reads them)."""
    return nn.unbox(self.text_tower.variables["params"]["token_embed"]["embedding"])
