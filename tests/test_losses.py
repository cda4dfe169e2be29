"""Losses against an independent NumPy float64 implementation, values and gradients."""


import jax
import jax.numpy as jnp
import numpy as np
import pytest

from conftest import numeric_grad
from mural import losses


def _np_normalize(x):
  return x / np.linalg.norm(x, axis=-1, keepdims=True)


def _np_xent_rows(logits, valid):
  """-log softmax diagonal, looping row by row over valid columns only."""
  total, count = 0.0, 0
  cols = np.flatnonzero(valid)
  for i in cols:
    row = logits[i, cols]
    m = row.max()
    log_z = m + np.log(np.sum(np.exp(row - m)))
    total += log_z - logits[i, i]
    count += 1
  return total / max(count, 1)


def np_contrastive(x, y, temperature, valid):
  sim = _np_normalize(x) @ _np_normalize(y).T
  logits = sim / temperature
  return _np_xent_rows(logits, valid) + _np_xent_rows(logits.T, valid)


def np_margin(left, right, temperature, margin, valid):
  sim = _np_normalize(left) @ _np_normalize(right).T
  logits = (sim - margin * np.eye(len(sim))) / temperature
  return _np_xent_rows(logits, valid) + _np_xent_rows(logits.T, valid)


@pytest.fixture
def pairs():
  rng = np.random.default_rng(0)
  x = rng.normal(size=(6, 5))
  y = x + 0.5 * rng.normal(size=(6, 5))  # Correlated, so the loss is far from log B.
  valid = np.array([True, True, True, False, True, False])
  return x, y, valid


@pytest.mark.parametrize("temperature", [1.0, 0.05])
@pytest.mark.parametrize("use_mask", [False, True])
def test_contrastive_matches_numpy(pairs, temperature, use_mask):
  x, y, valid = pairs
  valid = valid if use_mask else np.ones(len(x), bool)
  mask = jnp.asarray(valid) if use_mask else None
  got, parts = losses.contrastive_loss(jnp.asarray(x, jnp.float32), jnp.asarray(y, jnp.float32),
                                       temperature, mask)
  want = np_contrastive(x, y, temperature, valid)
  np.testing.assert_allclose(float(got), want, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(float(parts["x2y"] + parts["y2x"]), want, rtol=1e-5, atol=1e-6)


def test_contrastive_gradients_match_numpy(pairs):
  x, y, valid = pairs
  temperature = 0.1
  gx, gy, gt = jax.grad(lambda a, b, t: losses.contrastive_loss(a, b, t, jnp.asarray(valid))[0],
                        argnums=(0, 1, 2))(jnp.asarray(x, jnp.float32), jnp.asarray(y, jnp.float32),
                                           jnp.float32(temperature))
  np.testing.assert_allclose(gx, numeric_grad(lambda a: np_contrastive(a, y, temperature, valid), x),
                             rtol=2e-3, atol=2e-5)
  np.testing.assert_allclose(gy, numeric_grad(lambda b: np_contrastive(x, b, temperature, valid), y),
                             rtol=2e-3, atol=2e-5)
  want_t = numeric_grad(lambda t: np_contrastive(x, y, t[0], valid), np.array([temperature]))[0]
  np.testing.assert_allclose(float(gt), want_t, rtol=2e-3)
  # Padding rows get no gradient at all: they are neither anchors nor negatives.
  np.testing.assert_array_equal(np.asarray(gx)[~valid], 0.0)


def test_margin_loss_matches_numpy_values_and_gradients(pairs):
  left, right, valid = pairs
  got, parts = losses.additive_margin_loss(jnp.asarray(left, jnp.float32), jnp.asarray(right, jnp.float32),
                                           0.01, 0.3, jnp.asarray(valid))
  np.testing.assert_allclose(float(got), np_margin(left, right, 0.01, 0.3, valid), rtol=1e-5)
  assert set(parts) == {"l2r", "r2l"}
  g = jax.grad(lambda a: losses.additive_margin_loss(a, jnp.asarray(right, jnp.float32), 0.01, 0.3,
                                                     jnp.asarray(valid))[0])(jnp.asarray(left, jnp.float32))
  want = numeric_grad(lambda a: np_margin(a, right, 0.01, 0.3, valid), left)
  np.testing.assert_allclose(g, want, rtol=5e-3, atol=1e-3)


def test_margin_changes_the_loss_by_the_hand_computed_amount():
  # Two orthogonal pairs: cos = I. Without margin, each row's logits are (1/T, 0).
  e = jnp.eye(2)
  t, m = 0.5, 0.3
  got, _ = losses.additive_margin_loss(e, e, t, m)
  pos = (1 - m) / t
  per_row = np.log(np.exp(pos) + 1.0) - pos  # -log softmax of the positive.
  np.testing.assert_allclose(float(got), 2 * per_row, rtol=1e-6)


def test_stable_at_low_temperature_and_in_bfloat16():
  rng = np.random.default_rng(1)
  x = rng.normal(size=(16, 8))
  got, _ = losses.additive_margin_loss(jnp.asarray(x, jnp.bfloat16), jnp.asarray(-x, jnp.bfloat16), 0.01, 0.3)
  assert got.dtype == jnp.float32 and np.isfinite(float(got))
  # Anti-aligned pairs at T=0.01: loss is huge but finite and equals the float64 value
  # computed from the same bf16-rounded inputs.
  xb = np.asarray(jnp.asarray(x, jnp.bfloat16), np.float64)
  np.testing.assert_allclose(float(got), np_margin(xb, -xb, 0.01, 0.3, np.ones(16, bool)), rtol=1e-4)


def test_mural_tasks_losses_weights_and_align_special_case(pairs):
  """MURAL's two task values compute L_i2t + L_t2i and L_l2r + L_r2l (margin 0.3, T 0.01)
  with weights 1 : 0.1; ALIGN's system has the image-text task alone."""
  from mural import system, systems  # pylint: disable=g-import-not-at-top
  x, y, valid = pairs
  f32 = lambda a: jnp.asarray(a, jnp.float32)
  config = systems.base_config("mural")
  i2t, t2t = systems.get(config).tasks(config)
  got_i2t, m_i2t = i2t.loss({"image": f32(x), "text": f32(y), "temperature": jnp.float32(0.7)},
                            {"valid": jnp.asarray(valid)})
  got_t2t, m_t2t = t2t.loss({"left": f32(y), "right": f32(x[::-1])}, {"valid": jnp.ones(6, bool)})
  np.testing.assert_allclose(float(got_i2t), np_contrastive(x, y, 0.7, valid), rtol=1e-5)
  np.testing.assert_allclose(float(got_t2t), np_margin(y, x[::-1], 0.01, 0.3, np.ones(6, bool)), rtol=1e-5)
  assert (i2t.weight, t2t.weight, i2t.learning_rate, t2t.learning_rate) == (1.0, 0.1, 1e-3, 1e-4)
  assert {"loss/i2t", "loss/t2i", "temperature"} <= set(m_i2t) and {"loss/l2r", "loss/r2l"} <= set(m_t2t)
  align = systems.base_config("align")
  assert [t.name for t in system.active_tasks(systems.get(align), align)] == ["i2t"]


def test_mean_negative_cosine_matches_a_loop(pairs):
  x, y, valid = pairs
  cosines = [x[i] @ y[j] / np.linalg.norm(x[i]) / np.linalg.norm(y[j])
             for i in np.flatnonzero(valid) for j in np.flatnonzero(valid) if i != j]
  got = losses.mean_negative_cosine(jnp.asarray(x, jnp.float32), jnp.asarray(y, jnp.float32), jnp.asarray(valid))
  np.testing.assert_allclose(got, np.mean(cosines), rtol=1e-5)
  same = np.tile(x[:1], (6, 1))  # Every row one point: a collapsed ranking loss's state.
  np.testing.assert_allclose(losses.mean_negative_cosine(jnp.asarray(same), jnp.asarray(2 * same)), 1.0, rtol=1e-6)
