"""Contrastive losses of ALIGN and MURAL, as pure functions (tasks combine them: mural/systems/).

Every loss is an in-batch softmax over the batch it is given; under `jax.jit`
with globally sharded arrays that batch is the global batch, so every example
on every device is a negative for every other (MURAL section 3.1).

All maths runs in float32 whatever the towers computed in: at the t2t
temperature of 0.01 logits reach +-100, which bfloat16 cannot resolve.
"""

from typing import Optional

import jax
import jax.numpy as jnp

# Logit given to padding columns: finite (no NaN in the gradient) yet far below
# anything exp() can see next to a real logit.
_MASKED_LOGIT = -1e9


def l2_normalize(x: jax.Array, eps: float = 1e-12) -> jax.Array:
  x = x.astype(jnp.float32)
  return x * jax.lax.rsqrt(jnp.maximum(jnp.sum(x * x, axis=-1, keepdims=True), eps))


def _softmax_xent_diagonal(logits: jax.Array, valid: jax.Array) -> jax.Array:
  """Mean over valid rows of -log softmax(row)[row index], padding columns masked."""
  logits = jnp.where(valid[None, :], logits, _MASKED_LOGIT)
  log_probs = jax.nn.log_softmax(logits, axis=-1)
  per_row = -jnp.diagonal(log_probs)
  count = jnp.maximum(jnp.sum(valid), 1)
  return jnp.sum(jnp.where(valid, per_row, 0.0)) / count


def _valid_mask(batch_size: int, mask: Optional[jax.Array]) -> jax.Array:
  if mask is None:
    return jnp.ones((batch_size,), bool)
  return mask.astype(bool)


def contrastive_loss(x: jax.Array, y: jax.Array, temperature: jax.Array,
                     mask: Optional[jax.Array] = None):
  """ALIGN's in-batch softmax, both directions: `L_x2y + L_y2x`.

  Args:
    x, y: [B, D] embeddings of paired items (row i of x matches row i of y);
      cosine similarity, so they are L2-normalised here.
    temperature: scalar dividing the cosines (learned in ALIGN/MURAL).
    mask: optional bool [B]; False rows are padding, excluded from the loss
      and from every row's negatives.
  Returns:
    (loss, {'x2y': ..., 'y2x': ...}) as float32 scalars.
  """
  valid = _valid_mask(x.shape[0], mask)
  sim = l2_normalize(x) @ l2_normalize(y).T
  logits = sim / jnp.asarray(temperature, jnp.float32)
  x2y = _softmax_xent_diagonal(logits, valid)
  y2x = _softmax_xent_diagonal(logits.T, valid)
  return x2y + y2x, {"x2y": x2y, "y2x": y2x}


def additive_margin_loss(left: jax.Array, right: jax.Array, temperature: float = 0.01,
                         margin: float = 0.3, mask: Optional[jax.Array] = None):
  """Bidirectional additive-margin softmax for translation pairs (Yang et al. 2019).

  The margin is subtracted from the positive pair's cosine only, before the
  temperature scaling: `logits_ij = (cos_ij - margin * [i == j]) / T`.
  Returns (L_l2r + L_r2l, {'l2r': ..., 'r2l': ...}).
  """
  valid = _valid_mask(left.shape[0], mask)
  sim = l2_normalize(left) @ l2_normalize(right).T
  sim = sim - margin * jnp.eye(sim.shape[0], dtype=sim.dtype)
  logits = sim / temperature
  l2r = _softmax_xent_diagonal(logits, valid)
  r2l = _softmax_xent_diagonal(logits.T, valid)
  return l2r + r2l, {"l2r": l2r, "r2l": r2l}


# ---- Triplet losses of EmbN (Wang et al. 2019), MULE and SMALR -----------------------


def cosine_distance(x: jax.Array, y: jax.Array) -> jax.Array:
  """[N, D], [M, D] -> [N, M] of 1 - cos(x_i, y_j)."""
  return 1.0 - l2_normalize(x) @ l2_normalize(y).T


def _top_k_hinge(dist: jax.Array, margin: float, k: int, valid: jax.Array) -> jax.Array:
  """Rows are anchors, dist[i, i] the positive: mean over valid anchors of the mean of their
  k largest hinges max(0, m + d_ii - d_ij), j != i valid (missing negatives count as 0)."""
  n = dist.shape[0]
  k = min(k, max(n - 1, 1))
  hinge = jnp.maximum(0.0, margin + jnp.diagonal(dist)[:, None] - dist)
  negative = valid[None, :] & ~jnp.eye(n, dtype=bool)
  hinge = jnp.where(negative, hinge, 0.0)
  per_anchor = jnp.mean(jax.lax.top_k(hinge, k)[0], axis=-1)
  return jnp.sum(jnp.where(valid, per_anchor, 0.0)) / jnp.maximum(jnp.sum(valid), 1)


def top_k_triplet_loss(x: jax.Array, y: jax.Array, margin: float, k: int = 10,
                       mask: Optional[jax.Array] = None):
  """Bidirectional margin triplet loss over the K most violated constraints per anchor.

  Row i of x and row i of y are a positive pair (an image and its sentence, or
  two sentences of one image); every other valid row of the other side is a
  negative. Cosine distance d = 1 - cos. For each anchor x_i the hinges
  max(0, m + d(x_i, y_i) - d(x_i, y_j)) over negatives j, the K largest of
  them averaged (EmbN's `top_k` over violations, K = 10 in MULE and SMALR);
  the same with y as anchors. This is MULE's Eq. 3 (image-sentence) and each
  term of its Eq. 1 (neighbourhood constraints).
  Returns (L_x2y + L_y2x, {'x2y': ..., 'y2x': ...}).
  """
  valid = _valid_mask(x.shape[0], mask)
  dist = cosine_distance(x, y)
  x2y = _top_k_hinge(dist, margin, k, valid)
  y2x = _top_k_hinge(dist.T, margin, k, valid)
  return x2y + y2x, {"x2y": x2y, "y2x": y2x}


def language_classifier_loss(logits: jax.Array, labels: jax.Array, mask: Optional[jax.Array] = None):
  """Cross-entropy of a language classifier (MULE's Eq. 2), mean over valid rows.

  The adversarial sign is not here: the model puts a gradient-reversal layer
  between the features and the classifier (mural/models/multilingual.py).
  Returns (loss, {'accuracy': share of valid rows classified right}).
  """
  valid = _valid_mask(logits.shape[0], mask)
  log_probs = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
  per_row = -jnp.take_along_axis(log_probs, labels[:, None].astype(jnp.int32), axis=-1)[:, 0]
  count = jnp.maximum(jnp.sum(valid), 1)
  loss = jnp.sum(jnp.where(valid, per_row, 0.0)) / count
  right = jnp.argmax(logits, axis=-1) == labels
  return loss, {"accuracy": jnp.sum(jnp.where(valid, right, False)) / count}
