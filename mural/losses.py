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
