"""The in-batch softmax losses computed blockwise around a ring of devices.

losses.contrastive_loss and losses.additive_margin_loss build the global
B x B logit matrix; under jit with a batch sharded over n devices each device
holds B/n rows of it, B^2/n floats, which grows with the global batch at a
fixed per-device batch b (b * B). Here each device keeps its b rows of x and
passes its b rows of y around the ring (lax.ppermute inside shard_map): at
every one of the n steps it scores its x against the visiting y block
([b, b] logits), folds them into a streaming log-sum-exp for its rows (x->y),
and folds their columns into the visiting block's own streaming
log-sum-exp (y->x), which travels with the block and is home after n steps.
No device ever holds more than one [b, b] block; the scan body is
rematerialised, so the backward pass keeps only the ring's carries (the
visiting y blocks: b x D each), not the blocks of logits.

The maths is the plain losses' (tests/test_ring_loss.py: values and
gradients on 8 CPU devices, margin and padding rows included):
  logits_ij = (cos(x_i, y_j) - margin [i == j]) / T,
  x2y = mean over valid i of (logsumexp_j logits_ij - logits_ii), y2x likewise
  over columns; padding rows are nobody's negative.
The trainer traces the step under its mesh (jax.sharding.use_abstract_mesh);
without one (or on one device) the plain functions run.
"""

from typing import Optional, Sequence, Tuple

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

from mural import losses

# Start of a running max: exp(_START - anything real) is exactly 0 (no NaN in gradients).
_START = -1e9


def _fold_lse(run_max, run_sum, logits, axis: int):
  """Streaming log-sum-exp: (max, sum of exp(logit - max)) after adding `logits` along `axis`."""
  new_max = jax.lax.stop_gradient(jnp.maximum(run_max, jnp.max(logits, axis=axis)))
  expanded = jnp.expand_dims(new_max, axis)
  return new_max, run_sum * jnp.exp(run_max - new_max) + jnp.sum(jnp.exp(logits - expanded), axis=axis)


def _ring_axes(batch_axes: Sequence[str]) -> Tuple[Optional[jax.sharding.AbstractMesh], int]:
  """The context mesh and how many devices the batch is split over (1: no ring)."""
  mesh = jax.sharding.get_abstract_mesh()
  if mesh is None or mesh.empty or not batch_axes:
    return None, 1
  size = 1
  for a in batch_axes:
    size *= mesh.shape[a]
  return mesh, size


def softmax_xent_both_ways(x: jax.Array, y: jax.Array, temperature, margin: float = 0.0,
                           mask: Optional[jax.Array] = None, batch_axes: Sequence[str] = ()):
  """(x2y, y2x) of the in-batch softmax with an additive margin, blockwise over batch_axes.

  x, y: [B, D] global arrays sharded over `batch_axes` (mesh axis names, as
  sharding.batch_spec gives them); temperature: scalar (may be learned).
  """
  batch_axes = tuple(batch_axes)
  mesh, n = _ring_axes(batch_axes)
  valid = jnp.ones((x.shape[0],), bool) if mask is None else mask.astype(bool)
  if n == 1:
    return _plain(x, y, temperature, margin, valid)
  axis = batch_axes if len(batch_axes) > 1 else batch_axes[0]
  perm = [(i, (i + 1) % n) for i in range(n)]

  def local(x, y, valid, temperature):
    xn, yn = losses.l2_normalize(x), losses.l2_normalize(y)
    inv_t = 1.0 / temperature.astype(jnp.float32)
    positive = (jnp.sum(xn * yn, axis=-1) - margin) * inv_t
    b = x.shape[0]
    own_diagonal = margin * inv_t * jnp.eye(b, dtype=jnp.float32)

    @jax.checkpoint
    def step(carry, k):
      row_max, row_sum, y_block, y_valid, col_max, col_sum = carry
      logits = (xn @ y_block.T) * inv_t - jnp.where(k == 0, own_diagonal, 0.0)
      row_max, row_sum = _fold_lse(row_max, row_sum, jnp.where(y_valid[None, :], logits, _START), 1)
      col_max, col_sum = _fold_lse(col_max, col_sum, jnp.where(valid[:, None], logits, _START), 0)
      visiting = jax.lax.ppermute((y_block, y_valid, col_max, col_sum), axis, perm)
      return (row_max, row_sum, *visiting), None

    start = jnp.full_like(positive, _START), jnp.zeros_like(positive)  # Per device, like x.
    carry, _ = jax.lax.scan(step, (*start, yn, valid, *start), jnp.arange(n))
    row_max, row_sum, _, _, col_max, col_sum = carry
    count = jnp.maximum(jax.lax.psum(jnp.sum(valid), axis), 1)

    def mean(lse):
      return jax.lax.psum(jnp.sum(jnp.where(valid, lse - positive, 0.0)), axis) / count

    return mean(row_max + jnp.log(row_sum)), mean(col_max + jnp.log(col_sum))

  spec = P(axis)
  return jax.shard_map(local, mesh=mesh, in_specs=(spec, spec, spec, P()), out_specs=(P(), P()))(
      x, y, valid, jnp.asarray(temperature, jnp.float32))


def _plain(x, y, temperature, margin, valid):
  """The same losses from the full logit matrix (losses.py)."""
  if margin:
    _, parts = losses.additive_margin_loss(x, y, temperature, margin, valid)
    return parts["l2r"], parts["r2l"]
  _, parts = losses.contrastive_loss(x, y, temperature, valid)
  return parts["x2y"], parts["y2x"]
