"""SMALR (mural/systems/smalr.py, models/hem.py, clc.py): its losses against NumPy float64, the
hybrid embedding against a hand-computed lookup, the exploration rule, CLC-A / CLC-C on
hand-made scores, config errors, parameter counts, and training end to end (both phases) with a
bit-exact resume.

Tiny sizes; the end-to-end tests share one config (one compiled step) and one word vocabulary.
"""

import json
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from conftest import (assert_resumes_bit_exactly, numeric_grad, records_per_source, set_fields,
                      tiny_word_system, workdir_with_words)
from mural import clc
from mural import config_lib
from mural import describe
from mural import losses
from mural import metric_log
from mural import metrics
from mural import system
from mural import systems
from mural import train
from mural.data import training_text
from mural.data import word_vocab
from mural.models import hem
from mural.models import word_lstm
from mural.systems import smalr
from mural.systems.defaults import smalr as smalr_defaults

LANGS = ["en", "de", "sw"]


def tiny_smalr_config(ablation="smalr", **overrides):
  """SMALR at toy sizes on the built-in data (3 languages, 16 held-out scenes, 8 for CLC-C)."""
  c = tiny_word_system(smalr_defaults.get_config(), LANGS)
  c.model.image.hidden_dim = 32
  c.model.image.output_dim = 16
  t = c.model.text
  t.words_per_language = 48
  t.specific_words = 4
  t.latent_tokens = 12
  t.specific_dim = t.latent_dim = 6
  t.word_dim = 8
  t.hem_dim = 16
  t.lstm_dim = 16
  t.output_dim = 16
  t.max_len = 16
  t.explore_top = 4
  c.data.synthetic.translation_pair_list = smalr_defaults.all_pairs(LANGS)
  c.clc.validation_images = 8
  for name in ("mm", "pairs", "latent"):
    c.tasks[name].batch_size = 8
    c.tasks[name].learning_rate = 1e-2
  c.optim.warmup_steps = 1
  smalr_defaults.apply_ablation(c, ablation)
  return set_fields(c, **overrides)


def _unit(x):
  return x / np.linalg.norm(x, axis=-1, keepdims=True)


# ---- Losses against NumPy float64 ----------------------------------------------------


def np_masked_reconstruction(masked, predicted, full, valid):
  rows = [np.linalg.norm(_unit(masked[i] + predicted[i]) - _unit(full[i])) for i in np.flatnonzero(valid)]
  return float(np.mean(rows))


def test_masked_reconstruction_loss_matches_numpy():
  rng = np.random.default_rng(0)
  masked, predicted, full = (rng.normal(size=(5, 4)) for _ in range(3))
  valid = np.array([True, True, False, True, True])
  f32 = lambda a: jnp.asarray(a, jnp.float32)
  loss = lambda a, b, c: losses.masked_reconstruction_loss(a, b, c, jnp.asarray(valid))
  got, grads = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2)))(f32(masked), f32(predicted), f32(full))
  np.testing.assert_allclose(float(got), np_masked_reconstruction(masked, predicted, full, valid), rtol=1e-5)
  want = [numeric_grad(lambda x: np_masked_reconstruction(x, predicted, full, valid), masked),
          numeric_grad(lambda x: np_masked_reconstruction(masked, x, full, valid), predicted),
          numeric_grad(lambda x: np_masked_reconstruction(masked, predicted, x, valid), full)]
  for g, w in zip(grads, want):
    np.testing.assert_allclose(g, w, atol=2e-5)
  assert np.all(np.asarray(grads[0])[2] == 0)  # The padding row takes no part.
  # A perfect reconstruction costs 0 and its gradient is finite (the norm at 0).
  same = f32(full)
  zero = losses.masked_reconstruction_loss(same, jnp.zeros_like(same), same)
  assert float(zero) == 0.0
  assert np.all(np.isfinite(jax.jit(jax.grad(lambda a: losses.masked_reconstruction_loss(a, 0 * a, same)))(same)))


def np_score_triplet(s, t, margin, k, weight, valid):
  m, n = s.shape
  rows = np.flatnonzero(valid)

  def mean_top(h, count):
    kk = min(k, max(count, 1))
    return sum((sorted(h, reverse=True) + [0.0] * kk)[:kk]) / kk

  s2i = np.mean([mean_top([max(0.0, margin + s[i, j] - s[i, t[i]]) for j in range(n) if j != t[i]], n - 1)
                 for i in rows])
  i2s = np.mean([mean_top([max(0.0, margin + s[q, t[i]] - s[i, t[i]]) for q in rows if t[q] != t[i]], m - 1)
                 for i in rows])
  return i2s + weight * s2i


@pytest.mark.parametrize("k", [1, 3, 10])
def test_score_triplet_loss_matches_numpy(k):
  rng = np.random.default_rng(k)
  scores = rng.normal(size=(7, 4)) * 0.3
  t = np.array([0, 0, 1, 2, 3, 3, 1])  # Several captions per image.
  valid = np.array([True, True, True, True, True, True, False])
  loss = lambda s: losses.score_triplet_loss(s, jnp.asarray(t), 0.2, k, 1.5, jnp.asarray(valid))
  (got, parts), g = jax.jit(jax.value_and_grad(loss, has_aux=True))(jnp.asarray(scores, jnp.float32))
  np.testing.assert_allclose(float(got), np_score_triplet(scores, t, 0.2, k, 1.5, valid), rtol=1e-5)
  assert float(parts["i2s"]) + 1.5 * float(parts["s2i"]) == pytest.approx(float(got))
  np.testing.assert_allclose(g, numeric_grad(lambda s: np_score_triplet(s, t, 0.2, k, 1.5, valid), scores),
                             atol=2e-5)


def test_score_triplet_is_top_k_triplet_on_distances():
  """One caption per image, in order: the two triplet losses agree (d = 1 - cos, S = cos)."""
  rng = np.random.default_rng(3)
  images, texts = rng.normal(size=(6, 5)), rng.normal(size=(6, 5))
  cos = _unit(texts) @ _unit(images).T
  got, parts = jax.jit(losses.score_triplet_loss, static_argnums=(2, 3, 4))(
      jnp.asarray(cos, jnp.float32), jnp.arange(6), 0.05, 3, 1.5)
  _, want = jax.jit(losses.top_k_triplet_loss, static_argnums=(2, 3))(
      jnp.asarray(images, jnp.float32), jnp.asarray(texts, jnp.float32), 0.05, 3)
  np.testing.assert_allclose(float(parts["i2s"]), float(want["x2y"]), rtol=1e-5)
  np.testing.assert_allclose(float(parts["s2i"]), float(want["y2x"]), rtol=1e-5)


# ---- The hybrid embedding ---------------------------------------------------------------


def test_hybrid_lookup_matches_a_hand_computed_reference():
  n, k, num_langs = 6, 2, 2  # Offsets 0 pad, 1 unk, 2-3 specific, 4-5 latent.
  assignment = np.array([-1, -1, -1, -1, 1, 0,  # en: offsets 4, 5 -> tokens 1, 0.
                         -1, -1, -1, -1, 2, 1], np.int32)  # de: 4, 5 -> tokens 2, 1 (token 1 shared).
  tower = hem.HybridEmbeddingTower(num_languages=num_langs, words_per_language=n, specific_words=k,
                                   assignment=assignment, num_latent=3, specific_dim=3, latent_dim=2,
                                   hem_dim=4, lstm_dim=5, output_dim=3)
  ids = np.array([[2, 4, 5, 1], [6 + 5, 6 + 3, 6 + 4, 6]], np.int32)
  mask = np.array([[1, 1, 1, 1], [1, 1, 1, 0]], np.int32)
  apply = jax.jit(tower.apply)  # Jitted: op by op, each of the tower's ~100 small ops compiles alone.
  init = jax.jit(tower.init)
  hem_params = jax.tree.map(np.asarray, nn_unbox(init(jax.random.PRNGKey(0), ids, mask)["params"]))
  params = jax.tree.map(lambda a: a + np.random.default_rng(1).normal(size=a.shape).astype(a.dtype), hem_params)
  s, aux = apply({"params": params}, ids, mask)
  p = jax.tree.map(lambda a: np.asarray(a, np.float64), params)

  def word(i):
    lang, off = divmod(int(i), n)
    if assignment[i] >= 0:  # The shared latent token's features through the shared FC.
      return p["token_latent"][assignment[i]] @ p["latent_fc"]["kernel"] + p["latent_fc"]["bias"]
    return p["token_specific"][lang * (k + 2) + off] @ p["lang_fc_kernel"][lang] + p["lang_fc_bias"][lang]

  want = np.array([[word(i) for i in row] for row in ids])
  np.testing.assert_allclose(aux["words"], want, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(aux["words"][0, 1], aux["words"][1, 0], rtol=1e-6)  # en 4, de 5: one token.
  np.testing.assert_allclose(aux["mean"], [want[0].mean(0), want[1, :3].mean(0)], rtol=1e-5, atol=1e-6)
  np.testing.assert_array_equal(aux["lang"], [0, 1])
  assert s.shape == (2, 3)
  # Masked words leave the mean; the LSTM reads [MASK] in their place.
  word_mask = np.array([[False, True, False, False], [False, False, False, False]])
  s_m, aux_m = apply({"params": params}, ids, mask, word_mask=jnp.asarray(word_mask))
  np.testing.assert_allclose(aux_m["mean"][0], want[0, [0, 2, 3]].mean(0), rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(aux_m["words"][0, 1], params["mask_embed"], rtol=1e-6)
  np.testing.assert_allclose(s_m[1], s[1], rtol=1e-6)  # Nothing masked in row 1.
  assert not np.allclose(s_m[0], s[0])


def nn_unbox(tree):
  import flax.linen as nn  # pylint: disable=g-import-not-at-top
  return nn.unbox(tree)


def test_assignment_tables():
  rows = hem.latent_rows(2, 6, 2, words=[["a", "b", "c"], ["d", "e", "f", "g"]])
  # en has 3 words (offsets 2-4): offset 4 is latent; de has 4 (2-5): offsets 4, 5.
  np.testing.assert_array_equal(rows, [0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 1, 1])
  tokens = np.array([9, 9, 9, 9, 7, 3, 9, 9, 9, 9, 30, 7])
  assignment, used = hem.compact_assignment(tokens, rows)
  np.testing.assert_array_equal(used, [7, 30])  # Token 3 (row 5 is no word) and 9 are unused: dropped.
  np.testing.assert_array_equal(assignment, [-1, -1, -1, -1, 0, -1, -1, -1, -1, -1, 1, 0])
  # Words -> FC -> points z; each takes its nearest latent token.
  params = {"token_embed": np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]]),
            "assign_fc": {"kernel": np.array([[2.0, 0.0], [0.0, 1.0]]), "bias": np.array([0.0, 0.5])},
            "token_latent": np.array([[2.0, 0.0], [0.0, 2.0], [2.0, 2.0]])}
  # z = (2, .5), (0, 1.5), (2, 1.5): nearest (2, 0), (0, 2), (2, 2).
  np.testing.assert_array_equal(hem.final_assignment(params), [0, 1, 2])
  z = np.array([[2.0, 0.5]])
  dist = ((z[:, None] - params["token_latent"][None]) ** 2).sum(-1)
  scores = np.asarray(hem.token_scores(jnp.asarray(z, jnp.float32), jnp.asarray(params["token_latent"], jnp.float32)))
  np.testing.assert_allclose(scores - scores.max(), -(dist - dist.min()), rtol=1e-6)  # -||z - e||^2 + const.


def test_exploration_rule():
  rng = np.random.default_rng(0)
  logits = jnp.asarray(rng.normal(size=(20_000, 30)), jnp.float32)
  best = np.argmax(logits, -1)
  np.testing.assert_array_equal(hem.explore(logits, jax.random.PRNGKey(0), 0.0, 20), best)
  top = np.argsort(-np.asarray(logits), -1)[:, :20]
  always = np.asarray(hem.explore(logits, jax.random.PRNGKey(1), 1.0, 20))
  assert np.all((always[:, None] == top).any(-1))  # Always among the 20 best...
  position = np.argmax(always[:, None] == top, -1)
  counts = np.bincount(position, minlength=20) / len(position)
  np.testing.assert_allclose(counts, 1 / 20, atol=0.01)  # ...uniformly.
  chosen = np.asarray(hem.explore(logits, jax.random.PRNGKey(2), 0.2, 20))
  assert np.all((chosen[:, None] == top).any(-1))
  assert np.mean(chosen != best) == pytest.approx(0.2 * 19 / 20, abs=0.01)  # p, less draws of the best.


# ---- Cross-lingual consistency ---------------------------------------------------------


def test_translation_index():
  t = [np.array([0, 0, 1, 2]), np.array([2, 1, 0]), np.array([0, 1])]
  index = clc.translation_index(t)
  np.testing.assert_array_equal(index[0, 1, :4], [2, 2, 1, 0])  # Image 0 has one caption in language 1.
  np.testing.assert_array_equal(index[0, 2, :4], [0, 0, 1, -1])  # Language 2 has no caption of image 2.
  np.testing.assert_array_equal(index[1, 0, :3], [3, 2, 0])
  np.testing.assert_array_equal(index[0, 0, :4], [0, 1, 2, 3])  # A query stands for itself.


def test_clc_average_and_scores():
  sims = [np.array([[0.9, 0.1], [0.2, 0.4]]), np.array([[0.1, 0.3], [0.5, 0.7]])]
  index = clc.translation_index([np.array([0, 1]), np.array([0, 1])])
  scores = clc.language_scores(sims, index, 0)
  np.testing.assert_array_equal(scores[..., 0], sims[0])
  np.testing.assert_array_equal(scores[..., 1], sims[1])
  np.testing.assert_allclose(clc.clc_average(scores), [[0.5, 0.2], [0.35, 0.55]])


def test_clc_mlp_has_the_papers_352_parameters_and_starts_near_the_average():
  params = clc.mlp_init(jax.random.PRNGKey(0), 10, 32)
  assert sum(x.size for x in jax.tree.leaves(params)) == 352
  assert np.all(np.asarray(params["w1"]) >= 0) and np.all(np.asarray(params["w1"]) <= 0.2)
  scores = np.abs(np.random.default_rng(0).normal(size=(50, 10)))
  out = np.asarray(clc.mlp_apply(params, jnp.asarray(scores, jnp.float32)))
  want = np.maximum(scores @ np.asarray(params["w1"], np.float64), 0) @ np.asarray(params["w2"], np.float64)
  np.testing.assert_allclose(out, want, rtol=1e-5)
  # Positive scores: the untrained MLP ranks like the average (correlation near 1).
  assert np.corrcoef(out, clc.clc_average(scores))[0, 1] > 0.9


def _hand_made_sims(seed, n_images=40):
  """Language 0: informative but noisy; language 1: pure noise; language 2: informative."""
  rng = np.random.default_rng(seed)
  eye = np.eye(n_images)
  return [0.3 + 0.25 * eye + 0.15 * rng.random((n_images, n_images)),
          0.3 + 0.3 * rng.random((n_images, n_images)),
          0.3 + 0.25 * eye + 0.15 * rng.random((n_images, n_images))]


class _Set:
  def __init__(self, name, n):
    self.name, self.images, self.text_to_image = name, np.zeros((n, 1)), np.arange(n)


def test_clc_evaluator_on_hand_made_scores():
  images = np.zeros((40, 1))
  sets = [_Set(l, 40) for l in LANGS]
  for s in sets:
    s.images = images
  evaluator = clc.CrossLingualConsistency(sets, validation_images=20, iterations=30, learning_rate=0.05)
  sims = _hand_made_sims(0)
  out = evaluator.score(sims)
  for l, lang in enumerate(LANGS):  # The single-language query: its own scores on the 20 test images.
    want = metrics.retrieval_metrics(sims[l][20:, 20:], np.arange(20))
    assert out[f"{lang}:one/mR"] == pytest.approx(want["mR"])
  # Averaging with a second informative language beats the single noisy query; the learned
  # combination (which can leave out the noise language) does at least as well as the average.
  assert out["clc/clc-a_mR"] > out["clc/one_mR"]
  assert out["clc/clc-c_mR"] >= out["clc/clc-a_mR"] - 1.0
  # CLC-C's training lowers its loss and learns to trust language 1 less than the others.
  val_scores = [clc.language_scores([s[:20, :20] for s in sims], clc.translation_index([np.arange(20)] * 3), l)
                for l in range(3)]
  params, history = clc.train_mlp(clc.mlp_init(jax.random.PRNGKey(0), 3), val_scores, [np.arange(20)] * 3,
                                  iterations=30, learning_rate=0.05)
  assert history[-1] < history[0]
  weight = np.asarray(params["w1"]) @ np.maximum(np.asarray(params["w2"]), 0)
  assert weight[1] < min(weight[0], weight[2])


# ---- Config errors ---------------------------------------------------------------------


@pytest.mark.parametrize("field, value", [
    ("model.text.name", "bert"),
    ("model.text.words_per_language", 2),
    ("model.text.specific_words", 47),
    ("model.text.specific_words", -1),
    ("model.text.latent_tokens", -3),
    ("model.text.specific_dim", 0),
    ("model.text.latent_dim", 0),
    ("model.text.hem_dim", -1),
    ("model.text.explore_p", 1.5),
    ("model.text.explore_top", 0),
    ("model.text.latent_workdir", None),
    ("model.text.latent_workdir", "/some/run"),
    ("model.text.embeddings_path", "x.vec"),
    ("data.tokenizer", "wordpiece"),
    ("data.word_vocab_path", None),
    ("tasks.mm.sentence_weight", -1.0),
    ("tasks.mm.classifier_weight", -1e-6),
    ("tasks.mm.mask_rate", 1.0),
    ("tasks.pairs.mask_rate", -0.1),
    ("tasks.pairs.nc_weight", -1.0),
    ("tasks.pairs.mask_weight", -1e-4),
    ("tasks.latent.margin", 3.0),
    ("tasks.pairs.top_k", 0),
    ("clc.validation_images", -1),
    ("clc.hidden_dim", 0),
    ("clc.iterations", 0),
    ("clc.learning_rate", 0.0),
])
def test_config_errors_are_one_line(field, value):
  c = tiny_smalr_config(**{field: value})
  with pytest.raises(config_lib.ConfigError) as e:
    smalr.validate(c)
  message = str(e.value)
  assert message.startswith(f"config.{field}: ") and "\n" not in message, message


def test_config_errors_cross_fields():
  c = tiny_smalr_config(**{"model.text.latent_tokens": 0})  # No latent vocabulary, yet K < N - 2.
  with pytest.raises(config_lib.ConfigError, match=r"^config\.model\.text\.latent_tokens: 0 .*specific_words"):
    smalr.validate(c)
  with pytest.raises(config_lib.ConfigError, match=r"^config\.model\.text\.output_dim: "):
    smalr.validate(tiny_smalr_config(**{"model.text.output_dim": 12}))
  with pytest.raises(config_lib.ConfigError, match="ablation 'nope'"):
    smalr_defaults.apply_ablation(tiny_smalr_config(), "nope")
  c = tiny_smalr_config(**{"model.text.latent_workdir": "/nonexistent/run", "data.word_vocab_path": "/x/words.json"})
  with pytest.raises((config_lib.ConfigError, FileNotFoundError)):
    smalr.hybrid_tables(c)


# ---- Parameter counts -------------------------------------------------------------------


def test_describe_counts_the_hybrid_vocabulary():
  c = tiny_smalr_config()
  t, langs = c.model.text, len(LANGS)
  counts = describe.describe(c)
  assert counts["token_embeddings"] == langs * (t.specific_words + 2) * t.specific_dim + t.latent_tokens * t.latent_dim
  full = describe.describe(tiny_smalr_config("full_vocab"))
  assert full["token_embeddings"] == langs * t.words_per_language * t.specific_dim
  assert counts["token_embeddings"] < 0.25 * full["token_embeddings"]
  params = nn_unbox(describe.param_shapes(c))
  assert set(params) == {"image_tower", "text_tower", "language_classifier", "mclm_mean", "mclm_sentence"}
  assert params["mclm_mean"]["fc"]["kernel"].shape == (2 * t.hem_dim, 2 * t.hem_dim)
  assert "token_latent" not in nn_unbox(describe.param_shapes(tiny_smalr_config("full_vocab")))["text_tower"]
  assert set(nn_unbox(describe.param_shapes(tiny_smalr_config("hem")))) == {
      "image_tower", "text_tower", "language_classifier"}


# ---- End to end ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def words_file(tmp_path_factory):
  c = tiny_smalr_config()
  with records_per_source(200):
    return word_vocab.learn(c, system.vocabulary_tasks(smalr.SYSTEM, c), str(tmp_path_factory.mktemp("words")))


def test_phase_1_learns_the_words_of_the_caption_task_it_leaves_at_weight_0(tmp_path, caplog):
  """Phase 1 trains on pairs alone, and its words file is phase 2's vocabulary: a caption language
  without pairs (sw, as Flickr8k's zh and ar) needs its words from the weight-0 caption task."""
  c = tiny_smalr_config("pretrain", **{"data.synthetic.translation_pair_list": ("en-de",)})
  assert [t.name for t in system.active_tasks(smalr.SYSTEM, c)] == ["latent"]
  with records_per_source(200):
    path = word_vocab.learn(c, system.vocabulary_tasks(smalr.SYSTEM, c), str(tmp_path))
  data = json.loads(open(path).read())
  assert all(len(data["words"][l]) > 10 for l in LANGS)
  main = tiny_smalr_config(**{"data.synthetic.translation_pair_list": ("en-de",)})
  with records_per_source(200):  # Phase 2's own: the pairs the latent task shares count once.
    alone = word_vocab.learn(main, system.vocabulary_tasks(smalr.SYSTEM, main), str(tmp_path / "main"))
  assert json.loads(open(alone).read()) == data
  tasks = {t.name: t for t in smalr.tasks(c)}
  with records_per_source(50):
    read = [task.name for task, _ in training_text.training_records(c, [tasks["latent"], tasks["pairs"]])]
  assert read == ["latent"] * 50  # One source of the two tasks: read once.
  data["words"]["sw"] = []  # A words file of other data: sw's words would all read as unknown.
  no_sw = tmp_path / "no_sw.json"
  no_sw.write_text(json.dumps(data))
  with caplog.at_level("WARNING"):
    word_vocab.WordTokenizer(str(no_sw), LANGS, 48, 16)
  (warning,) = [r.getMessage() for r in caplog.records if "has no word of" in r.getMessage()]
  assert "no word of sw:" in warning


@pytest.fixture(scope="module")
def pretrained(tmp_path_factory, words_file):
  """Phase 1, two steps: (workdir, result)."""
  workdir = workdir_with_words(tmp_path_factory, "smalr_lv", words_file)
  config = tiny_smalr_config("pretrain", total_steps=2)
  return workdir, train.train_and_evaluate(config, str(workdir), evaluators=[])


def _main_config(pretrained, words_file):
  return tiny_smalr_config(**{"model.text.latent_workdir": str(pretrained[0]),
                              "data.word_vocab_path": str(words_file)})


@pytest.fixture(scope="module")
def reference(tmp_path_factory, pretrained, words_file):
  """Phase 2, 4 uninterrupted steps on phase 1's assignment: (workdir, result)."""
  workdir = tmp_path_factory.mktemp("smalr_reference")
  return workdir, train.train_and_evaluate(_main_config(pretrained, words_file), str(workdir), evaluators=[])


def test_pretraining_freezes_an_assignment_with_unused_tokens_dropped(pretrained, words_file):
  workdir, result = pretrained
  lines = [json.loads(l) for l in (workdir / "metrics.jsonl").read_text().splitlines()]
  assert [l["step"] for l in lines] == [1, 2] and all(np.isfinite(l["loss"]) for l in lines)
  saved = jax.device_get(result["state"].params["text_tower"])
  assert set(saved) == {"token_embed", "assign_fc", "token_latent"}
  assert all(np.isfinite(l["loss/vq"]) for l in lines)
  config = _main_config(pretrained, words_file)
  assignment, num_latent, latent, _ = smalr.hybrid_tables(config)
  t = config.model.text
  words = [json.loads(open(words_file).read())["words"][l] for l in LANGS]
  rows = hem.latent_rows(len(LANGS), t.words_per_language, t.specific_words, words)
  best = hem.final_assignment(saved)
  used = np.unique(best[rows])
  np.testing.assert_array_equal(assignment[rows], np.searchsorted(used, best[rows]))
  assert np.all(assignment[~rows] == -1)
  np.testing.assert_array_equal(latent, np.asarray(saved["token_latent"])[used])
  model = smalr.build_model(config, system.active_tasks(smalr.SYSTEM, config))
  assert model.text_tower.num_latent == num_latent == len(used) <= t.latent_tokens


def test_a_collapsed_phase_1_is_measured_and_warned_of(pretrained, words_file, monkeypatch, caplog, tmp_path):
  """Phase 1 first collapses every sentence onto one point (hem.py): its log shows it
  (latent/sentence_cosine, tested in test_losses) and phase 2 warns when phase 1 ended there."""
  workdir, _ = pretrained
  lines = [json.loads(l) for l in (workdir / "metrics.jsonl").read_text().splitlines()]
  last = lines[-1]["latent/sentence_cosine"]
  assert -1 <= last < smalr.COLLAPSED_SENTENCE_COSINE  # Two steps from random: not collapsed.
  assert metric_log.last_value(str(workdir), "latent/sentence_cosine") == last
  assert metric_log.last_value(str(workdir), "no/such_metric") is None
  assert metric_log.last_value(str(tmp_path), "latent/sentence_cosine") is None  # No metrics.jsonl.
  config = _main_config(pretrained, words_file)
  with caplog.at_level("WARNING"):
    smalr.hybrid_tables(config)
    assert not [r for r in caplog.records if "collapse" in r.getMessage()]
    monkeypatch.setattr(smalr, "COLLAPSED_SENTENCE_COSINE", last - 1e-3)
    smalr.hybrid_tables(config)
  (warning,) = [r.getMessage() for r in caplog.records if "collapse" in r.getMessage()]
  assert str(workdir) in warning and f"{last:.2f}" in warning and "Train phase 1 longer" in warning


def test_trains_end_to_end(reference, pretrained, words_file):
  workdir, result = reference
  lines = [json.loads(l) for l in (workdir / "metrics.jsonl").read_text().splitlines()]
  assert [l["step"] for l in lines] == [1, 2, 3, 4]
  for l in lines:
    assert np.isfinite(l["loss"])
    mm = (l["loss/i2s"] + 1.5 * l["loss/s2i"] + l["loss/i2s_masked"] + 1.5 * l["loss/s2i_masked"]
          + 1e-6 * l["loss/language"])
    pairs = 5e-2 * (l["loss/nc_sentence"] + l["loss/nc_mean"]) + 1e-4 * (l["loss/mask_mean"] + l["loss/mask_sentence"])
    assert l["loss"] == pytest.approx(mm + pairs, rel=1e-5)
  params = result["state"].params
  config = _main_config(pretrained, words_file)
  init = jax.device_get(result["setup"].init_state(jax.random.PRNGKey(0)))
  final = jax.device_get(params)
  np.testing.assert_array_equal(init.params["text_tower"]["token_latent"],  # Starts from phase 1's...
                                smalr.hybrid_tables(config)[2])
  for path, before in jax.tree_util.tree_leaves_with_path(init.params):
    after = final
    for key in path:
      after = after[key.key]
    assert not np.array_equal(before, after), f"{jax.tree_util.keystr(path)} did not train"  # ...and fine-tunes.


def test_export_carries_phase_1_and_embeds_as_the_evaluator(reference, pretrained, words_file, tmp_path):
  """The export holds phase 1's text tower (the frozen assignment's source) beside the words and
  the frozen backbone, so it loads the same model from a copy anywhere."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from mural import export  # pylint: disable=g-import-not-at-top
  from mural.data import vocab  # pylint: disable=g-import-not-at-top
  workdir, result = reference
  config = _main_config(pretrained, words_file)
  d = export.export(config, str(workdir))
  assert set(json.loads(open(f"{d}/manifest.json").read())["inputs"]) == {
      "data.word_vocab_path", "model.image.backbone_workdir", "model.text.latent_workdir"}
  moved = tmp_path / "moved"
  shutil.copytree(d, moved)
  model = export.load(str(moved), batch_size=4)
  assert model.config.model.text.latent_workdir == str(moved / "frozen_model_text_latent_workdir")
  np.testing.assert_array_equal(smalr.hybrid_tables(model.config)[0], smalr.hybrid_tables(config)[0])
  texts, langs = ["a red circle", "ein roter Kreis", "duara jekundu"], ["en", "de", "sw"]
  setup = result["setup"]
  ids, mask = (a.numpy() for a in vocab.tokenizer(config, setup.tasks, str(workdir)).tokenize(
      tf.constant(texts), tf.constant([LANGS.index(l) for l in langs])))
  want = setup.embedder(config.eval_batch_size).texts(result["state"].variables(), ids, mask, "")
  np.testing.assert_allclose(model.embed_texts(texts, langs), want, atol=1e-5)
  saved = tf.saved_model.load(str(moved / "saved_model"))  # The hybrid lookup in the graph too.
  got = saved.signatures["embed_text"](text=tf.constant(texts), lang=tf.constant(langs))["embedding"]
  np.testing.assert_allclose(got.numpy(), want, atol=1e-5)


def test_phase_1_does_not_export(pretrained):
  from mural import export  # pylint: disable=g-import-not-at-top
  with pytest.raises(config_lib.ConfigError, match=r"^config\.tasks: .* smalr config \(latent\) train no image tower"):
    export.export(tiny_smalr_config("pretrain", total_steps=2), str(pretrained[0]))


def test_frozen_phase_1_with_fasttext_rows_gives_the_same_assignment_without_them(pretrained, words_file, tmp_path,
                                                                                   monkeypatch):
  """With FastText, phase 2's assignment reads the .vec rows: the export's copy of phase 1 holds
  them as its word table, so the assignment comes out the same with model.text.embeddings_path
  cleared (System.initialisers)."""
  from mural import export  # pylint: disable=g-import-not-at-top
  words = json.loads(open(words_file).read())["words"]
  rng = np.random.default_rng(0)
  for lang in LANGS:  # 8-d vectors (tiny word_dim) for half of each language's words.
    (tmp_path / f"{lang}.vec").write_text("".join(
        f"{w} {' '.join(f'{x:.3f}' for x in rng.normal(size=8))}\n" for w in words[lang][::2]))
  config = _main_config(pretrained, words_file)
  config.model.text.embeddings_path = str(tmp_path / "{lang}.vec")
  assert config.model.text.word_dim == 8
  reads = []
  load = word_lstm.load_fasttext
  monkeypatch.setattr(word_lstm, "load_fasttext", lambda *a, **k: (reads.append(a[0]), load(*a, **k))[1])
  with_vectors = smalr.hybrid_tables(config)[0]
  assert not np.array_equal(with_vectors, smalr.hybrid_tables(_main_config(pretrained, words_file))[0])
  frozen = smalr.frozen_inputs(config)["model.text.latent_workdir"]
  assert len(reads) == 1  # An export builds the model, then copies phase 1: one read of the .vec files.
  export._write_frozen(tmp_path, "model.text.latent_workdir", frozen, 2)  # pylint: disable=protected-access
  config.model.text.latent_workdir = str(tmp_path / "frozen_model_text_latent_workdir")
  config.model.text.embeddings_path = ""
  np.testing.assert_array_equal(smalr.hybrid_tables(config)[0], with_vectors)


def test_resumes_bit_exactly(reference, pretrained, words_file, tmp_path_factory):
  config = _main_config(pretrained, words_file)
  workdir = tmp_path_factory.mktemp("smalr_resumed")
  assert_resumes_bit_exactly(config, workdir, reference[1])


def test_evaluates_plain_and_cross_lingual(reference, pretrained, words_file):
  workdir, result = reference
  results = train.evaluate(_main_config(pretrained, words_file), str(workdir), setup=result["setup"])
  for lang in LANGS:
    assert 0.0 <= results[f"{lang}/mR"] <= 100.0
    for variant in ("one", "clc-a", "clc-c"):
      assert 0.0 <= results[f"{lang}:{variant}/mR"] <= 100.0
  assert {"clc/one_mR", "clc/clc-a_mR", "clc/clc-c_mR", "mean/mR", "en-de/acc"} <= set(results)
  assert (workdir / "eval" / "step_4.json").exists()


def test_system_is_in_the_table():
  assert systems.SYSTEMS["smalr"].system is smalr.SYSTEM
