"""Globetrotter (mural/systems/globetrotter.py): losses against NumPy float64, the ResNet tower's
parameter counts, the evaluators' maths, config errors, a few steps end to end and a bit-exact resume."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from conftest import numeric_grad
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


def _inputs(seed=0, n=6, d=5):
  rng = np.random.default_rng(seed)
  return rng.normal(size=(n, d)), rng.normal(size=(n, d)), np.array([1, 1, 1, 1, 1, 0], bool)[:n]


def test_nt_xent_matches_numpy_values_and_gradients():
  z1, z2, valid = _inputs(1)
  t = 0.1
  loss = lambda a: losses.nt_xent_loss(a, jnp.asarray(z2, jnp.float32), t, valid)[0]
  got, g = jax.jit(jax.value_and_grad(loss))(jnp.asarray(z1, jnp.float32))
  np.testing.assert_allclose(got, np_nt_xent(z1, z2, t, valid), rtol=1e-5)
  np.testing.assert_allclose(g, numeric_grad(lambda a: np_nt_xent(a, z2, t, valid), z1), atol=2e-4)
  assert np.all(np.asarray(g)[~valid] == 0)  # Padding rows get no gradient.


def test_image_caption_loss_is_infonce_on_rescaled_similarities():
  img, txt, valid = _inputs(2)
  t = 0.1
  loss = lambda a: losses.image_caption_loss(jnp.asarray(img, jnp.float32), a, t, valid)[0]
  got, g = jax.jit(jax.value_and_grad(loss))(jnp.asarray(txt, jnp.float32))
  np.testing.assert_allclose(got, np_info_nce(img, txt, t, valid), rtol=1e-5)
  np.testing.assert_allclose(g, numeric_grad(lambda a: np_info_nce(img, a, t, valid), txt), atol=2e-4)


def test_masked_lm_loss_counts_masked_positions_only():
  rng = np.random.default_rng(3)
  logits = rng.normal(size=(2, 4, 7))
  labels = rng.integers(0, 7, size=(2, 4))
  weights = np.array([[1, 0, 1, 0], [0, 0, 1, 0]], np.float32)
  lp = logits - np.log(np.sum(np.exp(logits), -1, keepdims=True))
  want = -np.sum([lp[b, l, labels[b, l]] for b, l in zip(*np.nonzero(weights))]) / 3
  got, metrics = jax.jit(losses.masked_lm_loss)(jnp.asarray(logits, jnp.float32), labels, weights)
  np.testing.assert_allclose(got, want, rtol=1e-5)
  # An unmasked position's logits get no gradient; changing its label changes nothing.
  g = jax.jit(jax.grad(lambda x: losses.masked_lm_loss(x, labels, weights)[0]))(jnp.asarray(logits, jnp.float32))
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
  loss = jax.jit(lambda a, b: losses.transitive_text_loss(a, b, t, m, valid)[0])
  got = loss(jnp.asarray(txt, jnp.float32), jnp.asarray(img, jnp.float32))
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
  g, g_img = jax.jit(jax.grad(loss, argnums=(0, 1)))(jnp.asarray(txt, jnp.float32), jnp.asarray(img, jnp.float32))
  np.testing.assert_allclose(g, numeric_grad(np_fixed_alpha, txt), atol=2e-4)
  assert np.all(np.asarray(g_img) == 0)


# ---- The ResNet tower ------------------------------------------------------------------


@pytest.mark.parametrize("depth,want", [(10, 4_905_792), (18, 11_176_512), (50, 23_508_032)])
def test_resnet_parameter_counts_match_torchvision(depth, want):
  """torchvision's resnet18 / resnet50 without the fc layer (11,689,512 - 513,000; 25,557,032 -
  2,049,000), counted from abstract shapes: nothing allocated at full size. ResNet-10 by hand:
  resnet18 less one basic block per stage, 64: 73,984, 128: 295,424, 256: 1,180,672 and 512:
  4,720,640 (two 3x3 convs and two batch norms each)."""
  import flax.linen as nn
  from mural.models import resnet
  model = resnet.ResNet(depth=depth)
  variables = jax.eval_shape(lambda: model.init(jax.random.PRNGKey(0), jnp.zeros((1, 224, 224, 3)), train=False))
  params = nn.unbox(variables["params"])
  assert sum(x.size for x in jax.tree.leaves(params)) == want
  assert model.output_dim == {10: 512, 18: 512, 50: 2048}[depth]
  # Every parameter carries logical axis names (the sharding rules place it).
  boxed = jax.tree.leaves(variables["params"], is_leaf=lambda x: isinstance(x, nn.LogicallyPartitioned))
  assert all(isinstance(x, nn.LogicallyPartitioned) for x in boxed)
  assert params["stem_conv"]["kernel"].shape == (7, 7, 3, 64)


def test_resnet_tower_is_in_the_table_and_runs_small():
  """Shapes from abstract evaluation (no compile); the end-to-end test trains it."""
  from mural import models
  from mural.models import resnet
  import ml_collections
  section = ml_collections.ConfigDict(dict(name="resnet", depth=18, width=4, conv_impl="auto"))
  tower = models.IMAGE_TOWERS["resnet"](section, jnp.float32, jnp.float32)
  assert isinstance(tower, resnet.ResNet) and tower.output_dim == 32
  x = jax.ShapeDtypeStruct((2, 32, 32, 3), jnp.float32)
  variables = jax.eval_shape(lambda x: tower.init(jax.random.PRNGKey(0), x, train=False), x)
  (pooled, aux), updates = jax.eval_shape(lambda v, x: tower.apply(v, x, train=True, mutable=["batch_stats"]),
                                          variables, x)
  assert pooled.shape == (2, 32) and aux["feature_map"].shape == (2, 1, 1, 32)
  assert jax.tree.structure(updates["batch_stats"]) == jax.tree.structure(variables["batch_stats"])


# ---- Translation by retrieval and word translation ------------------------------------


def _naive_multiway(emb, scene, lang):
  """Per query: sort the other sentences by similarity (stable), count translations in the top M - 1."""
  m = len(set(lang.tolist()))
  scores, same = [], []
  for q in range(len(emb)):
    others = [k for k in range(len(emb)) if k != q]
    ranked = sorted(others, key=lambda k: -float(emb[q] @ emb[k]))
    scores.append(sum(scene[k] == scene[q] for k in ranked[:m - 1]) / (m - 1))
    same.append(sum(lang[k] == lang[q] for k in ranked[:m - 1]) / (m - 1))
  return 100 * np.mean(scores), 100 * np.mean(same)


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
  assert got["same_language"] == 0.0  # Every top-2 entry is in another language.
  rng = np.random.default_rng(0)
  emb = rng.normal(size=(5 * 4, 3))
  scene, lang = np.repeat(np.arange(5), 4), np.tile(np.arange(4), 5)
  got = tr.multiway_translation_score(emb, scene, lang)
  np.testing.assert_allclose([got["mean"], got["same_language"]], _naive_multiway(emb, scene, lang))
  # Languages in separate clusters (each language's sentences near each other): no translation found.
  clustered = np.eye(4)[lang] + 0.01 * rng.normal(size=(20, 4))
  got = tr.multiway_translation_score(clustered, scene, lang)
  assert got["mean"] == 0.0 and got["same_language"] == 100.0
  with pytest.raises(ValueError):
    tr.multiway_translation_score(emb[:-1], scene[:-1], lang[:-1])


def test_concept_tokens_find_each_concepts_word():
  from mural import translation_retrieval as tr
  # Captions of 4 scenes: token 10 = 'red', 11 = 'blue', 12 = 'circle', 13 = an article in every
  # caption (F1 2/3 for any concept), 14 in one of the two square scenes (F1 2/3): no word for 'square'.
  concepts = [{"red", "circle"}, {"blue", "circle"}, {"red", "square"}, {"blue", "square"}]
  tokens = [{10, 12, 13}, {11, 12, 13}, {10, 13, 14}, {11, 13}]
  assert tr.concept_tokens(tokens, concepts) == {"red": 10, "blue": 11, "circle": 12}


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


# ---- Config, data, and a few steps end to end ------------------------------------------

import json  # pylint: disable=g-import-not-at-top,wrong-import-position

from conftest import assert_resumes_bit_exactly, load_config, set_fields  # pylint: disable=wrong-import-position
from mural import config_lib  # pylint: disable=wrong-import-position
from mural import system  # pylint: disable=wrong-import-position
from mural import systems  # pylint: disable=wrong-import-position
from mural import train  # pylint: disable=wrong-import-position
from mural.systems import globetrotter  # pylint: disable=wrong-import-position
from mural.systems.defaults import globetrotter as globetrotter_defaults

LANGS = ["en", "de", "sw"]


def tiny_globetrotter_config(vocab_path="", variant="full", **overrides):
  """configs/globetrotter_demo.py at toy sizes: 3 languages, 8 held-out scenes, 4 steps of 8, a
  ResNet-10 of width 4 and one text layer (the tests below do not depend on depth; each level
  costs compile time)."""
  c = load_config("globetrotter_demo")
  c = globetrotter_defaults.apply_variant(c, variant)
  c.data.vocab_path = vocab_path
  c.data.synthetic.languages = list(LANGS)
  c.data.languages = list(LANGS)
  c.data.synthetic.eval_scenes = 8
  c.data.synthetic.render_size = 32
  c.data.shuffle_buffer = 0
  c.model.image.width = 4
  c.model.image.depth = 10
  c.model.text.num_layers = 1
  c.model.text.max_len = 16
  c.model.heads.embed_dim = 16
  c.model.heads.mlp_hidden_dim = 16
  c.tasks.globetrotter.batch_size = 8
  c.optim.warmup_steps = 1
  c.total_steps = 4
  c.log_every_steps = 1
  c.checkpoint_every_steps = 2
  c.eval_batch_size = 8
  return set_fields(c, **overrides)


@pytest.mark.parametrize("field, value", [
    ("tasks.globetrotter.temperature", 0.0),
    ("tasks.globetrotter.margin", 1.0),
    ("tasks.globetrotter.lambda_v", -0.2),
    ("tasks.globetrotter.mask_rate", 0.0),
    ("model.text.name", "word_lstm"),
    ("model.text.token_embed_dim", 32),
    ("data.views.blur_prob", 1.5),
    ("data.views.colour_strength", 2.0),
    ("data.synthetic.withhold_parallel_text", False),
])
def test_config_errors_are_one_line(field, value):
  c = tiny_globetrotter_config(**{field: value})
  with pytest.raises(config_lib.ConfigError) as e:
    globetrotter.validate(c)
  message = str(e.value)
  assert message.startswith(f"config.{field}: ") and "\n" not in message, message


@pytest.mark.parametrize("field, value", [("model.image.depth", 20), ("model.image.width", 0)])
def test_tower_config_errors_at_build(field, value):
  c = tiny_globetrotter_config(**{field: value})
  with pytest.raises(config_lib.ConfigError, match=rf"^config\.{field}: [^\n]*$"):
    globetrotter.build_model(c, globetrotter.tasks(c))
  c = tiny_globetrotter_config(**{f"tasks.globetrotter.lambda_{n}": 0.0 for n in "tvxc"})
  with pytest.raises(config_lib.ConfigError, match=r"^config\.tasks\.globetrotter\.lambda_t: every lambda"):
    globetrotter.validate(c)
  with pytest.raises(config_lib.ConfigError, match="variant 'nope'"):
    globetrotter_defaults.apply_variant(tiny_globetrotter_config(), "nope")


def test_built_in_data_withholds_parallel_text():
  """No translation pairs for training; no image carries captions in two languages, while scenes
  do recur across languages (from different images); the eval set stays aligned."""
  from mural.data import synthetic
  c = tiny_globetrotter_config()
  with pytest.raises(config_lib.ConfigError, match=r"^config\.data\.synthetic\.withhold_parallel_text: "):
    synthetic.text_pair_source(c, "train", 0, 1)
  synthetic.text_pair_source(c, "eval", 0, 1)  # Eval pairs stay.
  settings = synthetic.Settings.from_config(c)
  seen = {}
  shared_scene = 0
  for i in range(600):
    d, image, _, lang = synthetic.image_text_example(settings, "train", i)
    key = image.tobytes()
    assert seen.get(key, lang) == lang, "one image captioned in two languages"
    seen[key] = lang
  by_scene = {}
  for i in range(600):
    d, _, _, lang = synthetic.image_text_example(settings, "train", i)
    by_scene.setdefault(d, set()).add(lang)
  shared_scene = sum(len(v) > 1 for v in by_scene.values())
  assert shared_scene > 0  # The transitive path exists: one scene, several languages, other images.
  data = synthetic.build_eval_data(c)
  assert all(len(data.languages[l].captions) == 8 for l in LANGS)


def test_two_views_come_from_the_pipeline(tiny_vocab):
  from mural.data import pipeline, tokenizer
  c = tiny_globetrotter_config(tiny_vocab)
  tasks = system.active_tasks(globetrotter.SYSTEM, c)
  tok = tokenizer.Tokenizer(tiny_vocab, c.model.text.max_len)
  b = next(pipeline.build_train_iterator(c, tasks, tok))["globetrotter"]  # Determinism: the resume test.
  assert b["image"].shape == b["image2"].shape == (8, 32, 32, 3)
  assert set(b) >= set(tasks[0].shapes(c))
  assert np.all(np.abs(b["image"]) <= 1.0) and np.all(np.abs(b["image2"]) <= 1.0)
  assert not np.array_equal(b["image"], b["image2"])  # Two different augmentations.


def test_cloze_masks_word_pieces_only():
  from mural.data import tokenizer
  first = len(tokenizer.RESERVED_TOKENS)
  ids = np.random.default_rng(0).integers(first, first + 40, (200, 20)).astype(np.int32)
  ids[:, 0], ids[:, 15] = tokenizer.CLS_ID, tokenizer.SEP_ID
  ids[:, 16:] = tokenizer.PAD_ID
  mask = (ids != tokenizer.PAD_ID).astype(np.int32)
  masked, labels, weights = globetrotter._mask_tokens(jax.random.PRNGKey(0), jnp.asarray(ids), jnp.asarray(mask),
                                                      0.15)
  masked, weights = np.asarray(masked), np.asarray(weights)
  np.testing.assert_array_equal(labels, ids)
  assert np.all(weights[:, [0, 15, 16, 17, 18, 19]] == 0)
  assert np.all(masked[weights == 0] == ids[weights == 0])
  assert abs(weights[:, 1:15].mean() - 0.15) < 0.015
  picked, original = masked[weights > 0], ids[weights > 0]
  assert abs(np.mean(picked == tokenizer.MASK_ID) - 0.8) < 0.04
  replaced = picked[(picked != tokenizer.MASK_ID) & (picked != original)]
  assert abs(len(replaced) / len(picked) - 0.1 * 39 / 40) < 0.04  # Random pieces (1 in 40 is itself).
  assert set(replaced.tolist()) <= set(ids[:, 1:15].ravel().tolist())  # Pieces of the batch only.


def test_text_only_baseline_has_no_image_parameters():
  c = tiny_globetrotter_config(variant="text_only")
  tasks = system.active_tasks(globetrotter.SYSTEM, c)
  model = globetrotter.build_model(c, tasks)
  variables = jax.eval_shape(lambda r: system.init_variables(model, tasks, c, r), jax.random.PRNGKey(0))
  assert set(variables["params"]) == {"text_tower", "mlm_head"}
  full = tiny_globetrotter_config()
  tasks = system.active_tasks(globetrotter.SYSTEM, full)
  model = globetrotter.build_model(full, tasks)
  variables = jax.eval_shape(lambda r: system.init_variables(model, tasks, full, r), jax.random.PRNGKey(0))
  assert set(variables["params"]) == {"image_tower", "text_tower", "image_head", "text_head", "mlm_head"}
  # The cloze head has no output matrix of its own: it reads the token table.
  assert set(variables["params"]["mlm_head"]) == {"transform", "transform_norm", "output_bias"}


@pytest.fixture(scope="module")
def reference(tmp_path_factory, tiny_vocab):
  """4 uninterrupted steps: (workdir, result)."""
  workdir = tmp_path_factory.mktemp("globetrotter_reference")
  return workdir, train.train_and_evaluate(tiny_globetrotter_config(tiny_vocab), str(workdir), evaluators=[])


def test_exports_with_its_heads_and_embeds_as_the_evaluator(reference, tiny_vocab):
  """Globetrotter's export embeds through its image and text heads (System.retrieval_heads)."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from mural import export  # pylint: disable=g-import-not-at-top
  from mural.data import tokenizer  # pylint: disable=g-import-not-at-top
  workdir, result = reference
  config = tiny_globetrotter_config(tiny_vocab)
  model = export.load(export.export(config, str(workdir), saved_model=False), batch_size=4)
  assert model.manifest["heads"] == {"image": "image", "text": "text"}
  texts = ["a red circle", "ein roter Kreis", "duara jekundu"]
  ids, mask = (a.numpy() for a in tokenizer.Tokenizer(tiny_vocab, config.model.text.max_len).tokenize(
      tf.constant(texts)))
  setup = result["setup"]
  want = setup.embedder(config.eval_batch_size).texts(result["state"].variables(), ids, mask, "text")
  np.testing.assert_allclose(model.embed_texts(texts), want, atol=1e-5)


def test_trains_end_to_end(reference, tiny_vocab):
  workdir, result = reference
  lines = [json.loads(l) for l in (workdir / "metrics.jsonl").read_text().splitlines()]
  assert [l["step"] for l in lines] == [1, 2, 3, 4]
  for l in lines:
    parts = l["loss/text_text"] + 0.2 * (l["loss/views"] + l["loss/image_caption"] + l["loss/cloze"])
    assert np.isfinite(l["loss"]) and l["loss"] == pytest.approx(parts, rel=1e-5)
  params = result["state"].params
  init = jax.device_get(result["setup"].init_state(jax.random.PRNGKey(0)))
  final = jax.device_get(params)
  for name in ("image_tower", "text_tower", "image_head", "text_head", "mlm_head"):
    moved = [not np.array_equal(a, b) for a, b in zip(jax.tree.leaves(init.params[name]), jax.tree.leaves(final[name]))]
    assert any(moved), f"{name} did not train"
  stats = zip(jax.tree.leaves(init.batch_stats), jax.tree.leaves(jax.device_get(result["state"].batch_stats)))
  assert all(not np.array_equal(a, b) for a, b in stats)  # The ResNet's running statistics moved.


def test_resumes_bit_exactly(reference, tmp_path_factory, tiny_vocab):
  config = tiny_globetrotter_config(tiny_vocab)
  workdir = tmp_path_factory.mktemp("globetrotter_resumed")
  assert_resumes_bit_exactly(config, workdir, reference[1])


def test_evaluates_translation_by_retrieval(reference, tiny_vocab):
  workdir, _ = reference
  results = train.evaluate(tiny_globetrotter_config(tiny_vocab), str(workdir), setup=reference[1]["setup"])
  for lang in LANGS:
    assert 0.0 <= results[f"translation_retrieval/{lang}"] <= 100.0
    assert 0.0 <= results[f"{lang}/mR"] <= 100.0
  assert 0.0 <= results["translation_retrieval/mean"] <= 100.0
  assert 0.0 <= results["translation_retrieval_tower/mean"] <= 100.0
  for key in ("word_translation/nn", "word_translation/procrustes"):
    assert 0.0 <= results.get(key, 0.0) <= 100.0


def test_system_is_in_the_table():
  assert systems.SYSTEMS["globetrotter"].system is globetrotter.SYSTEM
