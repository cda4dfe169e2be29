"""Dropout that spends 16 random bits on each element: half the RNG work of flax's.

Why: on the CPU, drawing threefry bits is most of what dropout costs (BERT's
dropouts were about 4% of the CPU train step of benchmarks/bench_step.py), and a keep decision needs far
fewer than 32 bits; and threefry's rounds are written out here (`threefry_bits`),
where jax's CPU lowering runs them as a loop. Each 32-bit draw decides two
neighbours on the last axis (its low and high halves), so the draws keep the
input's shape on every other axis: under a mesh each device draws its own part,
and the mask is the same whatever the sharding (partitionable threefry).

The keep probability is realised as t / 2**16, t = round((1 - rate) * 2**16),
within 2**-17 of 1 - rate (flax's is 2**-23); kept inputs are scaled by
2**16 / t, so the output's expectation is exactly the input.
"""

from typing import Optional, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

_LEVELS = 1 << 16
_ROTATIONS = ((13, 15, 26, 6), (17, 29, 16, 24))


def _threefry_key_data(rng):
  """rng's two uint32 words where jax.random.bits would draw from it with partitionable
  threefry (a typed threefry key, or a raw one under that default); else None."""
  if not jax.config.jax_threefry_partitionable:
    return None
  if jax.dtypes.issubdtype(rng.dtype, jax.dtypes.prng_key):
    return jax.random.key_data(rng) if str(jax.random.key_impl(rng)) == "threefry2x32" else None
  if jax.config.jax_default_prng_impl == "threefry2x32" and rng.shape == (2,) and rng.dtype == jnp.uint32:
    return rng
  return None


def threefry_bits(rng, shape: Sequence[int]):
  """jax.random.bits(rng, shape, uint32), bit for bit, with threefry's 20 rounds written out.

  Why: on the CPU jax lowers threefry as a loop of 5 steps, each of which sends the whole
  array through memory; written out, the rounds fuse into one pass, and into whatever consumes
  the bits (BERT's [128, 32, 128] draws: 4.2-5.3 ms -> 0.8-1.0 ms on a 2-core Xeon), and
  the program has no loops to compile (BERT L4/H256's forward + backward: 7.0 s, not 11.8).
  The counters are jax's partitionable ones (each element's flat index), so the bits do not
  depend on the sharding. Other key implementations, and arrays of 2**32 elements or more,
  go to jax.random.bits.
  """
  shape = tuple(shape)
  size = int(np.prod(shape))
  key = _threefry_key_data(rng)
  if key is None or size >= 2 ** 32:
    return jax.random.bits(rng, shape, jnp.uint32)
  rotl = lambda x, d: (x << np.uint32(d)) | (x >> np.uint32(32 - d))
  k0, k1 = key[0], key[1]
  ks = (k0, k1, k0 ^ k1 ^ np.uint32(0x1BD11BDA))
  # Counter words: the flat index's high half (0 below 2**32) and its low half.
  x = [jnp.broadcast_to(ks[0], shape), jax.lax.iota(np.uint32, size).reshape(shape) + ks[1]]
  for i in range(5):
    for r in _ROTATIONS[i % 2]:
      x[0] = x[0] + x[1]
      x[1] = x[0] ^ rotl(x[1], r)
    x[0] = x[0] + ks[(i + 1) % 3]
    x[1] = x[1] + ks[(i + 2) % 3] + np.uint32(i + 1)
  return x[0] ^ x[1]


def keep_mask(rng, keep_prob: float, shape: Sequence[int]):
  """(bool mask of `shape`, the scale for kept elements): True with probability t / 2**16."""
  threshold = round(keep_prob * _LEVELS)
  shape = tuple(shape)
  if threshold >= _LEVELS:
    return jnp.ones(shape, bool), 1.0
  if threshold <= 0:
    return jnp.zeros(shape, bool), 0.0
  if shape and shape[-1] % 2 == 0:
    words = threefry_bits(rng, shape[:-1] + (shape[-1] // 2,))
    halves = jnp.stack([words & 0xFFFF, words >> 16], axis=-1).reshape(shape)
  else:  # An odd last axis: one draw an element, its high half.
    halves = threefry_bits(rng, shape) >> 16
  return halves < threshold, _LEVELS / threshold


def drop(rng, rate: float, inputs, broadcast_dims: Sequence[int] = ()):
  """inputs with each element (each slice along `broadcast_dims`) zeroed with probability
  about `rate`, the rest scaled to keep the expectation: keep_mask's draws."""
  shape = list(inputs.shape)
  for dim in broadcast_dims:
    shape[dim] = 1
  keep, scale = keep_mask(rng, 1.0 - rate, shape)
  keep = jnp.broadcast_to(keep, inputs.shape)
  return jax.lax.select(keep, inputs * jnp.asarray(scale, inputs.dtype), jnp.zeros_like(inputs))


class Dropout(nn.Module):
  """flax.linen.Dropout's interface and semantics, with `keep_mask`'s draws."""
  rate: float
  broadcast_dims: Sequence[int] = ()
  deterministic: Optional[bool] = None
  rng_collection: str = "dropout"

  @nn.compact
  def __call__(self, inputs, deterministic: Optional[bool] = None, rng=None):
    if not 0.0 <= self.rate <= 1.0:
      raise ValueError(f"dropout rate {self.rate} is not in [0, 1]")
    deterministic = nn.merge_param("deterministic", self.deterministic, deterministic)
    if self.rate == 0.0 or deterministic:
      return inputs
    if rng is None:
      rng = self.make_rng(self.rng_collection)
    return drop(rng, self.rate, inputs, self.broadcast_dims)
