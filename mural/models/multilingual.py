"""Pieces for systems with per-language parameters (MULE, SMALR).

  grouped_matmul: row r of x times weight matrix w[group[r]]; one matmul over
      rows sorted by group (jax.lax.ragged_dot), not a Python loop per
      language nor a [rows, in, out] gather of weights.
  gradient_reversal: identity forward, negated gradient backward (Ganin &
      Lempitsky 2015): the layer below a classifier maximises what the
      classifier minimises, in one step of one loss.
  LanguageClassifier: MULE's adversarial language classifier, one Dense over a
      gradient-reversal layer.
  MultilingualDualEncoder: an image tower and a text tower whose towers give
      the final embeddings (no heads), the text tower's aux features reachable
      (`text_features`), and an optional language classifier. It has the
      DualEncoder methods the evaluators and describe read (embed_images,
      embed_texts; params 'image_tower', 'text_tower').
"""

from typing import Any, Optional

import flax.linen as nn
import jax
import jax.numpy as jnp


def grouped_matmul(x: jax.Array, groups: jax.Array, w: jax.Array) -> jax.Array:
  """[N, D] rows, int [N] group of each row in [0, G), [G, D, E] weights -> [N, E]: x[r] @ w[groups[r]]."""
  num_groups = w.shape[0]
  if num_groups == 1:
    return x @ w[0]
  groups = jnp.clip(groups.astype(jnp.int32), 0, num_groups - 1)
  order = jnp.argsort(groups, stable=True)
  sizes = jnp.bincount(groups, length=num_groups).astype(jnp.int32)
  y = jax.lax.ragged_dot(x[order], w.astype(x.dtype), sizes)
  return y[jnp.argsort(order)]


@jax.custom_vjp
def gradient_reversal(x: jax.Array) -> jax.Array:
  """Identity; its gradient is the incoming gradient negated."""
  return x


def _reversal_fwd(x):
  return x, None


def _reversal_bwd(_, g):
  return (jax.tree.map(jnp.negative, g),)


gradient_reversal.defvjp(_reversal_fwd, _reversal_bwd)


class LanguageClassifier(nn.Module):
  """Language logits [B, L] of features [B, D] through a gradient-reversal layer.

  The classifier's own parameters follow the gradient of its cross-entropy
  (it learns to tell the languages apart); everything below it gets that
  gradient negated (it learns to make them indistinguishable): MULE Eq. 4
  with one loss and one update, lambda_2 being the loss weight.
  """
  num_languages: int
  dtype: Any = jnp.float32
  param_dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, features):
    return nn.Dense(self.num_languages, name="dense", dtype=self.dtype, param_dtype=self.param_dtype,
                    kernel_init=nn.with_logical_partitioning(nn.initializers.lecun_normal(), ("embed", "lang")),
                    bias_init=nn.with_logical_partitioning(nn.initializers.zeros, ("lang",)))(
                        gradient_reversal(features))


class MultilingualDualEncoder(nn.Module):
  """Towers that output the shared-space embeddings; `text_features` also returns the tower's aux."""
  image_tower: nn.Module
  text_tower: nn.Module
  language_classifier: Optional[nn.Module] = None

  def embed_images(self, images, head: Optional[str] = None, train: bool = False):
    if head:
      raise KeyError(f"no head {head!r}: this model's towers give the embeddings")
    return self.image_tower(images, train=train)[0].astype(jnp.float32)

  def text_features(self, ids, mask, train: bool = False):
    """(embedding [B, E] float32, the text tower's aux dict)."""
    x, aux = self.text_tower(ids, mask, train=train)
    return x.astype(jnp.float32), aux

  def embed_texts(self, ids, mask, head: Optional[str] = None, train: bool = False):
    if head:
      raise KeyError(f"no head {head!r}: this model's towers give the embeddings")
    return self.text_features(ids, mask, train)[0]

  def classify_language(self, features):
    if self.language_classifier is None:
      raise ValueError("this model has no language classifier")
    return self.language_classifier(features).astype(jnp.float32)
