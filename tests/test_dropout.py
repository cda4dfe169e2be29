"""mural.models.dropout: the mask against a NumPy reading of the same draws, its rate, its
independence between the two halves of a draw, its gradient, its edge cases; and BERT's attention
dropout, one mask per example and head."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from mural.models import dropout


def _apply(rate, x, key, **kw):
  """The layer in training mode, as one jitted program (op by op, each op compiles alone)."""
  return _jitted_apply(rate, tuple(kw.items()), x, key)


@functools.partial(jax.jit, static_argnums=(0, 1))
def _jitted_apply(rate, kw, x, key):
  return dropout.Dropout(rate, **dict(kw)).apply({}, x, deterministic=False, rngs={"dropout": key})


def test_output_is_the_input_scaled_where_the_draws_fall_below_the_threshold():
  x = np.random.default_rng(0).normal(size=(3, 5, 8)).astype(np.float32)
  key = jax.random.PRNGKey(7)
  rng = dropout.Dropout(0.3).apply({}, method=lambda m: m.make_rng("dropout"),
                                   rngs={"dropout": key})
  words = np.asarray(jax.random.bits(rng, (3, 5, 4), jnp.uint32)).astype(np.int64)
  halves = np.stack([words % 65536, words // 65536], axis=-1).reshape(3, 5, 8)
  t = round(0.7 * 65536)
  want = np.where(halves < t, x.astype(np.float64) * 65536 / t, 0.0)
  got = np.asarray(_apply(0.3, jnp.asarray(x), key))
  np.testing.assert_allclose(got, want, rtol=1e-6, atol=0)
  assert 0 < (got == 0).sum() < x.size


@pytest.mark.parametrize("rate", [0.1, 0.5, 0.9])
@pytest.mark.parametrize("last", [256, 7])  # Two elements a draw; one (an odd last axis).
def test_keep_rate_is_one_minus_rate_and_draw_halves_are_independent(rate, last):
  keep, scale = dropout.keep_mask(jax.random.PRNGKey(1), 1 - rate, (4096, last))
  keep = np.asarray(keep)
  p = round((1 - rate) * 65536) / 65536
  assert abs(p - (1 - rate)) <= 2 ** -17 and scale == pytest.approx(1 / p)
  sigma = np.sqrt(p * (1 - p) / keep.size)
  assert abs(keep.mean() - p) < 5 * sigma
  if last % 2 == 0:  # The two halves of one word, and neighbouring words, uncorrelated.
    lo, hi = keep[:, 0::2].ravel().astype(float), keep[:, 1::2].ravel().astype(float)
    assert abs(np.corrcoef(lo, hi)[0, 1]) < 5 / np.sqrt(lo.size)
    assert abs(np.corrcoef(lo[:-1], lo[1:])[0, 1]) < 5 / np.sqrt(lo.size)


def test_expectation_is_the_input():
  x = jnp.full((512, 64), 3.0)
  outs = jax.vmap(lambda k: _apply(0.25, x, k))(jax.random.split(jax.random.PRNGKey(3), 64))
  mean = float(jnp.mean(outs))
  std_err = float(jnp.std(outs)) / np.sqrt(outs.size)
  assert abs(mean - 3.0) < 5 * std_err


def test_gradient_is_the_mask_times_the_scale():
  x = jnp.asarray(np.random.default_rng(2).normal(size=(6, 10)), jnp.float32)
  key = jax.random.PRNGKey(5)
  y, vjp = jax.vjp(lambda v: _apply(0.4, v, key), x)
  (g,) = vjp(jnp.ones_like(y))
  t = round(0.6 * 65536)
  kept = np.asarray(y) != 0
  np.testing.assert_allclose(np.asarray(g), np.where(kept, 65536 / t, 0.0), rtol=1e-6)


def test_broadcast_dims_share_one_mask():
  y = np.asarray(_apply(0.5, jnp.ones((4, 3, 6)), jax.random.PRNGKey(0), broadcast_dims=(1,)))
  assert (y == y[:, :1]).all() and 0 < (y == 0).mean() < 1


def test_edge_cases():
  x = jnp.arange(1.0, 9.0).reshape(2, 4)
  key = jax.random.PRNGKey(0)
  np.testing.assert_array_equal(_apply(0.0, x, key), x)
  np.testing.assert_array_equal(_apply(1.0, x, key), jnp.zeros_like(x))
  np.testing.assert_array_equal(  # A rate below half a step of 2**-16: nothing dropped.
      _apply(1e-6, x, key), x)
  np.testing.assert_array_equal(
      dropout.Dropout(0.5).apply({}, x, deterministic=True), x)
  with pytest.raises(ValueError, match="dropout rate 1.5 is not in"):
    _apply(1.5, x, key)


def test_bert_attention_drops_each_probability_of_each_example_and_head():
  from mural.models import bert
  rng = np.random.default_rng(4)
  q, k, v = (np.repeat(rng.normal(size=(1, 5, 3, 4)), 2, axis=0) for _ in range(3))  # 2 equal rows.
  key = jax.random.PRNGKey(9)
  got = np.asarray(bert.attention(*map(jnp.asarray, (q, k, v)), dropout_rng=key, dropout_rate=0.5,
                                  deterministic=False))
  scores = np.einsum("bqhd,bkhd->bhqk", q, k) / 2.0
  probs = np.exp(scores - scores.max(-1, keepdims=True))
  probs /= probs.sum(-1, keepdims=True)
  keep, scale = dropout.keep_mask(key, 0.5, (2, 3, 5, 5))
  keep = np.asarray(keep)
  want = np.einsum("bhqk,bkhd->bqhd", probs * keep * scale, v)
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
  assert (keep[0] != keep[1]).any() and (keep[:, 0] != keep[:, 1]).any()  # Examples, heads: own masks.
  assert not np.allclose(got[0], got[1])
  plain = bert.attention(*map(jnp.asarray, (q, k, v)), dropout_rng=key, dropout_rate=0.5)
  np.testing.assert_allclose(plain, np.einsum("bhqk,bkhd->bqhd", probs, v), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("shape", [(), (7,), (3, 5, 4), (128, 4, 32, 16)])
def test_threefry_bits_are_jax_random_bits_bit_for_bit(shape):
  for key in (jax.random.PRNGKey(11), jax.random.key(2 ** 31 + 5), jax.random.fold_in(jax.random.key(3), 9)):
    want = jax.random.bits(key, shape, jnp.uint32)
    np.testing.assert_array_equal(np.asarray(dropout.threefry_bits(key, shape)), np.asarray(want))
    np.testing.assert_array_equal(np.asarray(jax.jit(dropout.threefry_bits, static_argnums=1)(key, shape)),
                                  np.asarray(want))
  rbg = jax.random.key(4, impl="rbg")  # Another implementation: jax's own draws.
  np.testing.assert_array_equal(np.asarray(dropout.threefry_bits(rbg, shape)),
                                np.asarray(jax.random.bits(rbg, shape, jnp.uint32)))
