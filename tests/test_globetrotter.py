"""Globetrotter (mural/systems/globetrotter.py): losses against NumPy float64, the ResNet tower's
parameter counts, the evaluators' maths, config errors, a few steps end to end and a bit-exact resume."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from mural import losses


# ---- Losses against NumPy float64 ------------------------------------------------------


def _np_rescaled(x, y):
  x = x / np.linalg.norm(x, axis=-1, keepdims=True)
  y = y / np.linalg.norm(y, axis=-1, keepdims=True)
  return (x @ y.T + 1.0) / 2.0


def _np_log_softmax_except(row, skip):
  """log softmax over row's entries other than those in `skip` (-inf there)."""
  row = np.array(row, np.float64)
  row[list(skip)] = -np.inf
  m = row[np.isfinite(row)].max()
  return row - m - np.log(np.sum(np.exp(row[np.isfinite(row)] - m)))


def np_nt_xent(z1, z2, t, valid):
  n = len(z1)
  z = np.concatenate([z1, z2])
  v = np.concatenate([valid, valid])
  s = _np_rescaled(z, z) / t
  total, count = 0.0, 0
  for i in range(2 * n):
    if not v[i]:
      continue
    partner = (i + n) % (2 * n)
    lp = _np_log_softmax_except(s[i], [i] + [k for k in range(2 * n) if not v[k]])
    total -= lp[partner]
    count += 1
  return total / count


def np_info_nce(img, txt, t, valid):
  s = _np_rescaled(img, txt) / t
  out = 0.0
  for mat in (s, s.T):
    rows = [i for i in range(len(s)) if valid[i]]
    out += np.mean([-_np_log_softmax_except(mat[i], [k for k in range(len(s)) if not valid[k]])[i]
                    for i in rows])
  return out


def np_transitive(txt, img, t, m, valid):
  n = len(txt)
  a_x = np.diag(_np_rescaled(img, txt))
  a_v = _np_rescaled(img, img)
  b = _np_rescaled(txt, txt) / t
  total, count = 0.0, 0
  for i in range(n):
    if not valid[i]:
      continue
    lp = _np_log_softmax_except(b[i], [i] + [k for k in range(n) if not valid[k]])
    for j in range(n):
      if j != i and valid[j]:
        alpha = max(0.0, a_x[i] * a_v[i, j] * a_x[j] - m) / (1 - m)
        total -= alpha * lp[j]
    count += 1
  return total / count


def _numeric_grad(f, x, eps=1e-6):
  g = np.zeros_like(x)
  for idx in np.ndindex(*x.shape):
    d = np.zeros_like(x)
    d[idx] = eps
    g[idx] = (f(x + d) - f(x - d)) / (2 * eps)
  return g


def _inputs(seed=0, n=6, d=5):
  rng = np.random.default_rng(seed)
  return rng.normal(size=(n, d)), rng.normal(size=(n, d)), np.array([1, 1, 1, 1, 1, 0], bool)[:n]


def test_nt_xent_matches_numpy_values_and_gradients():
  z1, z2, valid = _inputs(1)
  t = 0.1
  got, _ = losses.nt_xent_loss(jnp.asarray(z1, jnp.float32), jnp.asarray(z2, jnp.float32), t, valid)
  np.testing.assert_allclose(got, np_nt_xent(z1, z2, t, valid), rtol=1e-5)
  g = jax.grad(lambda a: losses.nt_xent_loss(a, jnp.asarray(z2, jnp.float32), t, valid)[0])(
      jnp.asarray(z1, jnp.float32))
  np.testing.assert_allclose(g, _numeric_grad(lambda a: np_nt_xent(a, z2, t, valid), z1), atol=2e-4)
  assert np.all(np.asarray(g)[~valid] == 0)  # Padding rows get no gradient.


def test_image_caption_loss_is_infonce_on_rescaled_similarities():
  img, txt, valid = _inputs(2)
  t = 0.1
  got, _ = losses.image_caption_loss(jnp.asarray(img, jnp.float32), jnp.asarray(txt, jnp.float32), t, valid)
  np.testing.assert_allclose(got, np_info_nce(img, txt, t, valid), rtol=1e-5)
  g = jax.grad(lambda a: losses.image_caption_loss(jnp.asarray(img, jnp.float32), a, t, valid)[0])(
      jnp.asarray(txt, jnp.float32))
  np.testing.assert_allclose(g, _numeric_grad(lambda a: np_info_nce(img, a, t, valid), txt), atol=2e-4)


def test_masked_lm_loss_counts_masked_positions_only():
  rng = np.random.default_rng(3)
  logits = rng.normal(size=(2, 4, 7))
  labels = rng.integers(0, 7, size=(2, 4))
  weights = np.array([[1, 0, 1, 0], [0, 0, 1, 0]], np.float32)
  lp = logits - np.log(np.sum(np.exp(logits), -1, keepdims=True))
  want = -np.sum([lp[b, l, labels[b, l]] for b, l in zip(*np.nonzero(weights))]) / 3
  got, metrics = losses.masked_lm_loss(jnp.asarray(logits, jnp.float32), labels, weights)
  np.testing.assert_allclose(got, want, rtol=1e-5)
  # An unmasked position's logits get no gradient; changing its label changes nothing.
  g = jax.grad(lambda x: losses.masked_lm_loss(x, labels, weights)[0])(jnp.asarray(logits, jnp.float32))
  assert np.all(np.asarray(g)[weights == 0] == 0) and np.all(np.abs(np.asarray(g)[weights > 0]).sum(-1) > 0)
  want_acc = np.mean([np.argmax(logits[b, l]) == labels[b, l] for b, l in zip(*np.nonzero(weights))])
  np.testing.assert_allclose(metrics["accuracy"], want_acc)


def test_transitive_targets_follow_eq2():
  img = np.array([[1.0, 0.0], [1.0, 0.0], [0.0, 1.0]])
  txt = np.array([[1.0, 0.0], [1.0, 0.0], [-1.0, 0.0]])
  alpha = np.asarray(losses.transitive_targets(jnp.asarray(img), jnp.asarray(txt), 0.4))
  # Images 0, 1 identical, captions matching them exactly: a = 1 -> f(1) = 1.
  np.testing.assert_allclose(alpha[0, 1], 1.0, rtol=1e-6)
  # Image 2 is orthogonal to 0 (a^v = 0.5) and its caption opposite to it (a^x_22 = 0.5):
  # 1 * 0.5 * 0.5 = 0.25 < m -> 0.
  assert alpha[0, 2] == 0 and alpha[2, 1] == 0
  np.testing.assert_allclose(alpha, alpha.T)
  # 0.8 -> (0.8 - 0.4) / 0.6.
  txt2 = np.array([[1.0, 0.0], [1.0, 0.0], [0.0, 1.0]])
  img2 = np.array([[1.0, 0.0], [0.6, 0.8], [0.0, 1.0]])  # cos(img0, img1) = 0.6 -> a^v = 0.8.
  a = np.asarray(losses.transitive_targets(jnp.asarray(img2), jnp.asarray(txt2), 0.4))
  a_x1 = (0.6 + 1) / 2
  np.testing.assert_allclose(a[0, 1], max(0, 1.0 * 0.8 * a_x1 - 0.4) / 0.6, rtol=1e-6)


def test_transitive_text_loss_matches_numpy_and_targets_are_stop_gradient():
  rng = np.random.default_rng(4)
  base = rng.normal(size=(3, 5))
  img = np.concatenate([base, base + 0.1 * rng.normal(size=(3, 5))])  # Pairs of look-alike images.
  txt = img + 0.3 * rng.normal(size=(6, 5))
  valid = np.array([1, 1, 1, 1, 0, 1], bool)
  t, m = 0.1, 0.4
  got, _ = losses.transitive_text_loss(jnp.asarray(txt, jnp.float32), jnp.asarray(img, jnp.float32), t, m, valid)
  want = np_transitive(txt, img, t, m, valid)
  assert want > 0  # Some transitive positives exist.
  np.testing.assert_allclose(got, want, rtol=1e-5)
  # Gradient w.r.t. the captions with the targets held fixed (NumPy: alpha from the unmoved txt).
  def np_fixed_alpha(a):
    n = len(a)
    ax = np.diag(_np_rescaled(img, txt))
    av = _np_rescaled(img, img)
    b = _np_rescaled(a, a) / t
    total = 0.0
    for i in range(n):
      if valid[i]:
        lp = _np_log_softmax_except(b[i], [i] + [k for k in range(n) if not valid[k]])
        total -= sum(max(0, ax[i] * av[i, j] * ax[j] - m) / (1 - m) * lp[j]
                     for j in range(n) if j != i and valid[j])
    return total / valid.sum()
  g = jax.grad(lambda a: losses.transitive_text_loss(a, jnp.asarray(img, jnp.float32), t, m, valid)[0])(
      jnp.asarray(txt, jnp.float32))
  np.testing.assert_allclose(g, _numeric_grad(np_fixed_alpha, txt), atol=2e-4)
  g_img = jax.grad(lambda b: losses.transitive_text_loss(jnp.asarray(txt, jnp.float32), b, t, m, valid)[0])(
      jnp.asarray(img, jnp.float32))
  assert np.all(np.asarray(g_img) == 0)


# ---- The ResNet tower ------------------------------------------------------------------


@pytest.mark.parametrize("depth,want", [(18, 11_176_512), (50, 23_508_032)])
def test_resnet_parameter_counts_match_torchvision(depth, want):
  """torchvision's resnet18 / resnet50 without the fc layer (11,689,512 - 513,000; 25,557,032 -
  2,049,000), counted from abstract shapes: nothing allocated at full size."""
  import flax.linen as nn
  from mural.models import resnet
  model = resnet.ResNet(depth=depth)
  variables = jax.eval_shape(lambda: model.init(jax.random.PRNGKey(0), jnp.zeros((1, 224, 224, 3)), train=False))
  params = nn.unbox(variables["params"])
  assert sum(x.size for x in jax.tree.leaves(params)) == want
  assert model.output_dim == {18: 512, 50: 2048}[depth]
  # Every parameter carries logical axis names (the sharding rules place it).
  boxed = jax.tree.leaves(variables["params"], is_leaf=lambda x: isinstance(x, nn.LogicallyPartitioned))
  assert all(isinstance(x, nn.LogicallyPartitioned) for x in boxed)
  assert params["stem_conv"]["kernel"].shape == (7, 7, 3, 64)


def test_resnet_tower_is_in_the_table_and_runs_small():
  from mural import models
  from mural.models import resnet
  import ml_collections
  section = ml_collections.ConfigDict(dict(name="resnet", depth=18, width=4, conv_impl="auto"))
  tower = models.IMAGE_TOWERS["resnet"](section, jnp.float32, jnp.float32)
  assert isinstance(tower, resnet.ResNet) and tower.output_dim == 32
  x = jnp.asarray(np.random.default_rng(0).normal(size=(2, 32, 32, 3)), jnp.float32)
  variables = tower.init(jax.random.PRNGKey(0), x, train=False)
  (pooled, aux), updates = tower.apply(variables, x, train=True, mutable=["batch_stats"])
  assert pooled.shape == (2, 32) and aux["feature_map"].shape == (2, 1, 1, 32)
  # Blocks start as the identity (zero-initialised last BN scale), so the output is finite
  # and nonzero; train mode updates the running statistics.
  assert np.all(np.isfinite(pooled)) and float(jnp.abs(pooled).sum()) > 0
  changed = jax.tree.map(lambda a, b: bool(jnp.any(a != b)), variables["batch_stats"], updates["batch_stats"])
  assert any(jax.tree.leaves(changed))


# ---- Translation by retrieval and word translation ------------------------------------


def _naive_multiway(emb, scene, lang):
  """Per query: sort the other sentences by similarity (stable), count translations in the top M - 1."""
  m = len(set(lang.tolist()))
  scores = []
  for q in range(len(emb)):
    others = [k for k in range(len(emb)) if k != q]
    ranked = sorted(others, key=lambda k: -float(emb[q] @ emb[k]))
    scores.append(sum(scene[k] == scene[q] for k in ranked[:m - 1]) / (m - 1))
  return 100 * np.mean(scores)


def test_multiway_translation_score_by_hand_and_against_a_loop():
  from mural import translation_retrieval as tr
  # 2 scenes x 3 languages. Scene 0's sentences point at (1, 0), scene 1's at (0, 1), except the
  # scene-1 sentence of language 2, which points at scene 0.
  emb = np.array([[1, 0], [1, 0], [1, 0], [0, 1], [0, 1], [0.8, 0.6]])
  scene, lang = np.array([0, 0, 0, 1, 1, 1]), np.array([0, 1, 2, 0, 1, 2])
  got = tr.multiway_translation_score(emb, scene, lang)
  # Queries 0-2 (scene 0): top 2 are the other two scene-0 sentences (cos 1 > 0.8): 1 each.
  # Queries 3, 4: the other of 3/4 (cos 1) and then sentence 5 (0.6) beats scene 0 (0): 2/2.
  # Query 5: scene-0 sentences (0.8) beat 3, 4 (0.6): 0/2.
  np.testing.assert_allclose(got["mean"], 100 * 5 / 6)
  np.testing.assert_allclose([got[0], got[1], got[2]], [100, 100, 50])
  rng = np.random.default_rng(0)
  emb = rng.normal(size=(5 * 4, 3))
  scene, lang = np.repeat(np.arange(5), 4), np.tile(np.arange(4), 5)
  np.testing.assert_allclose(tr.multiway_translation_score(emb, scene, lang)["mean"],
                             _naive_multiway(emb, scene, lang))
  with pytest.raises(ValueError):
    tr.multiway_translation_score(emb[:-1], scene[:-1], lang[:-1])


def _rotation(d, seed, angle=None):
  rng = np.random.default_rng(seed)
  q, _ = np.linalg.qr(rng.normal(size=(d, d)))
  if angle is None:
    return q
  r = np.eye(d)  # A rotation by `angle` in the plane of q's first two columns.
  a, b = q[:, 0], q[:, 1]
  r += (np.cos(angle) - 1) * (np.outer(a, a) + np.outer(b, b)) + np.sin(angle) * (np.outer(b, a) - np.outer(a, b))
  return r.T


def test_procrustes_recovers_a_rotation():
  from mural import translation_retrieval as tr
  x = np.random.default_rng(1).normal(size=(40, 6))
  r = _rotation(6, 2)
  np.testing.assert_allclose(tr.procrustes(x, x @ r), r, atol=1e-10)


def test_mutual_nearest_neighbours_by_hand():
  from mural import translation_retrieval as tr
  x = np.array([[1.0, 0.0], [0.0, 1.0], [0.7, 0.7]])
  y = np.array([[0.0, 1.0], [1.0, 0.1], [-1.0, 0.0]])
  pairs = tr.mutual_nearest_neighbours(x, y, k=1)
  # k = 1: CSLS = 2 cos - best cos of each side. x0 <-> y1, x1 <-> y0 are mutual; x2's best
  # (y1 or y0) prefers x0 / x1.
  assert sorted(map(tuple, pairs.tolist())) == [(0, 1), (1, 0)]


def test_word_translation_recovers_a_rotated_vocabulary():
  """Language B's word vectors are language A's rotated by 1.2 rad (in one plane) and shuffled:
  plain nearest neighbours find 85% of the translations; anchors from mutual nearest neighbours
  + Procrustes (refitted) recover the rotation and every translation."""
  from mural import translation_retrieval as tr
  rng = np.random.default_rng(3)
  x = rng.normal(size=(60, 8))
  r = _rotation(8, 4, angle=1.2)
  order = rng.permutation(60)
  y = (x @ r)[order]
  gold = [(int(order[j]), j) for j in range(60)]  # y_j is x_{order[j]} rotated.
  w = tr.align_words(x, y, k=5)
  np.testing.assert_allclose(w, r, atol=1e-8)
  assert tr.word_translation_accuracy(x, y, gold, k=5) == 100.0
  # Without the alignment (identity map), fewer translations are found.
  identity = 100 * np.mean([np.argmax(tr.csls(x, y, 5)[i]) == j for i, j in gold])
  assert identity < 90
