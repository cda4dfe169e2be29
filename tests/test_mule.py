"""MULE (mural/systems/mule.py) and its shared pieces: losses against NumPy float64, the
word-LSTM tower against a NumPy LSTM, the per-language word vocabulary, config
errors, and a few steps of training end to end with a bit-exact resume.

Tiny sizes throughout; every run shares one config (so one compiled step,
JAX's persistent cache) and one learned word vocabulary.
"""

import json
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from conftest import (TINY_FEATURES, assert_resumes_bit_exactly, numeric_grad, records_per_source,
                      set_fields, tiny_word_system, workdir_with_words)
from mural import config_lib
from mural import describe
from mural import losses
from mural import system
from mural import systems
from mural import train
from mural.data import vocab
from mural.data import word_vocab
from mural.models import multilingual
from mural.models import word_lstm
from mural.systems import mule
from mural.systems.defaults import mule as mule_defaults

LANGS = ["en", "de", "sw"]


def tiny_mule_config(**overrides):
  """MULE at toy sizes on the built-in data (3 languages, 16 held-out scenes)."""
  c = tiny_word_system(mule_defaults.get_config(), LANGS)
  c.model.image.hidden_dim = 32
  c.model.image.output_dim = 16
  c.model.text.words_per_language = 64
  c.model.text.word_dim = 8
  c.model.text.mule_dim = 16
  c.model.text.lstm_dim = 16
  c.model.text.output_dim = 16
  c.model.text.max_len = 16
  c.tasks.mm.batch_size = c.tasks.nc.batch_size = 8
  c.tasks.mm.learning_rate = c.tasks.nc.learning_rate = 1e-2
  c.optim.warmup_steps = 1
  return set_fields(c, **overrides)


# ---- Losses against NumPy float64 ----------------------------------------------------


def _np_normalize(x):
  return x / np.linalg.norm(x, axis=-1, keepdims=True)


def np_top_k_triplet(x, y, margin, k, valid):
  d = 1.0 - _np_normalize(x) @ _np_normalize(y).T
  rows = np.flatnonzero(valid)
  kk = min(k, len(d) - 1)

  def one_way(d):
    total = 0.0
    for i in rows:
      hinges = sorted((max(0.0, margin + d[i, i] - d[i, j]) for j in rows if j != i), reverse=True)
      total += sum((hinges + [0.0] * kk)[:kk]) / kk
    return total / max(len(rows), 1)

  return one_way(d) + one_way(d.T)


@pytest.mark.parametrize("k", [1, 3, 10])
def test_top_k_triplet_matches_numpy(k):
  rng = np.random.default_rng(k)
  x, y = rng.normal(size=(6, 4)), rng.normal(size=(6, 4))
  valid = np.array([True, True, True, True, True, False])
  margin = 0.4
  loss = lambda a, b: losses.top_k_triplet_loss(a, b, margin, k, jnp.asarray(valid))
  (got, parts), (gx, gy) = jax.jit(jax.value_and_grad(loss, argnums=(0, 1), has_aux=True))(
      jnp.asarray(x, jnp.float32), jnp.asarray(y, jnp.float32))
  np.testing.assert_allclose(float(got), np_top_k_triplet(x, y, margin, k, valid), rtol=1e-5)
  assert float(parts["x2y"]) + float(parts["y2x"]) == pytest.approx(float(got))
  # Gradients, both sides, against central differences of the float64 NumPy loss.
  np.testing.assert_allclose(gx, numeric_grad(lambda a: np_top_k_triplet(a, y, margin, k, valid), x), atol=2e-5)
  np.testing.assert_allclose(gy, numeric_grad(lambda b: np_top_k_triplet(x, b, margin, k, valid), y), atol=2e-5)
  assert np.all(gx[5] == 0) and np.all(gy[5] == 0)  # The padding row takes no part.


def test_top_k_triplet_is_zero_when_every_constraint_holds():
  x = np.eye(4, dtype=np.float32)
  got, _ = losses.top_k_triplet_loss(jnp.asarray(x), jnp.asarray(x), 0.5, 10)
  assert float(got) == 0.0  # d(pos) = 0, d(neg) = 1 > margin.
  got, _ = losses.top_k_triplet_loss(jnp.asarray(x), jnp.asarray(x), 1.5, 10)
  assert float(got) == pytest.approx(2 * 0.5)  # Every hinge is 1.5 - 1.


def test_language_classifier_loss_matches_numpy():
  rng = np.random.default_rng(0)
  logits, labels = rng.normal(size=(5, 3)), np.array([0, 2, 1, 1, 0])
  valid = np.array([True, True, True, False, True])
  log_p = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
  want = -np.mean([log_p[i, labels[i]] for i in np.flatnonzero(valid)])
  got, m = losses.language_classifier_loss(jnp.asarray(logits, jnp.float32), jnp.asarray(labels),
                                           jnp.asarray(valid))
  np.testing.assert_allclose(float(got), want, rtol=1e-5)
  right = [np.argmax(logits[i]) == labels[i] for i in np.flatnonzero(valid)]
  assert float(m["accuracy"]) == pytest.approx(np.mean(right))


# ---- Model pieces --------------------------------------------------------------------


def test_grouped_matmul_matches_per_row_weights():
  rng = np.random.default_rng(0)
  x, w = rng.normal(size=(7, 3)).astype(np.float32), rng.normal(size=(4, 3, 5)).astype(np.float32)
  groups = np.array([2, 0, 3, 2, 2, 0, 1])
  want = np.einsum("nd,nde->ne", x, w[groups])
  np.testing.assert_allclose(multilingual.grouped_matmul(jnp.asarray(x), jnp.asarray(groups), jnp.asarray(w)),
                             want, rtol=1e-5, atol=1e-6)
  f = lambda a, b: jnp.sum(jnp.sin(multilingual.grouped_matmul(a, jnp.asarray(groups), b)))
  ref = lambda a, b: jnp.sum(jnp.sin(jnp.einsum("nd,nde->ne", a, b[groups])))
  for got, exp in zip(jax.grad(f, (0, 1))(x, w), jax.grad(ref, (0, 1))(x, w)):
    np.testing.assert_allclose(got, exp, rtol=1e-5, atol=1e-6)


def test_language_classifier_reverses_the_gradient_below_it():
  clf = multilingual.LanguageClassifier(3)
  u = jnp.asarray(np.random.default_rng(1).normal(size=(4, 5)), jnp.float32)
  labels = jnp.array([0, 1, 2, 1])
  params = nn_unbox(jax.jit(clf.init)(jax.random.PRNGKey(0), u)["params"])
  dense = lambda p, x: x @ p["dense"]["kernel"] + p["dense"]["bias"]
  ce = lambda logits: losses.language_classifier_loss(logits, labels)[0]
  g_params, g_u = jax.jit(jax.grad(lambda p, x: ce(clf.apply({"params": p}, x)), (0, 1)))(params, u)
  want_params, want_u = jax.jit(jax.grad(lambda p, x: ce(dense(p, x)), (0, 1)))(params, u)
  np.testing.assert_allclose(g_params["dense"]["kernel"], want_params["dense"]["kernel"], rtol=1e-6)
  np.testing.assert_allclose(g_u, -want_u, rtol=1e-6)  # Reversed below the classifier.


def nn_unbox(tree):
  import flax.linen as nn  # pylint: disable=g-import-not-at-top
  return nn.unbox(tree)


def np_word_lstm(p, ids, mask, n, per_language):
  """The tower in float64 NumPy, one sentence and one time step at a time."""
  p = jax.tree.map(lambda a: np.asarray(a, np.float64), nn_unbox(p))
  sig = lambda z: 1 / (1 + np.exp(-z))
  s_out, u_out = [], []
  for row, m in zip(ids, mask):
    lang = row[0] // n
    mule = p["token_embed"][row] @ p["lang_fc_kernel"][lang] + p["lang_fc_bias"][lang]
    length = int(m.sum())
    u_out.append(mule[:length].mean(0))
    g = lang if per_language else 0
    h = c = np.zeros(p["lstm_recurrent_kernel"].shape[1])
    for t in range(length):
      z = mule[t] @ p["lstm_input_kernel"][g] + h @ p["lstm_recurrent_kernel"][g] + p["lstm_bias"][g]
      i, f, gg, o = np.split(z, 4)
      c = sig(f) * c + sig(i) * np.tanh(gg)
      h = sig(o) * np.tanh(c)
    s_out.append(h @ p["out_kernel"][g] + p["out_bias"][g])
  return np.stack(s_out), np.stack(u_out)


@pytest.mark.parametrize("branches", ["shared", "per_language"])
def test_word_lstm_tower_matches_numpy(branches):
  n, num_langs = 10, 3
  tower = word_lstm.WordLstmTower(num_languages=num_langs, words_per_language=n, word_dim=4, mule_dim=5,
                                  lstm_dim=6, output_dim=3, branches=branches)
  lengths, langs = [3, 1, 5, 4], [2, 0, 1, 2]
  rng = np.random.default_rng(0)
  ids = np.zeros((4, 6), np.int32)
  mask = np.zeros((4, 6), np.int32)
  for r, (length, lang) in enumerate(zip(lengths, langs)):
    ids[r] = lang * n + word_vocab.PAD
    ids[r, :length] = lang * n + rng.integers(1, n, length)
    mask[r, :length] = 1
  # Jitted: op by op, the LSTM's scan and every small op would each compile on their own (44 s).
  params = jax.jit(tower.init)(jax.random.PRNGKey(0), ids, mask)["params"]
  params = jax.tree.map(lambda a: a + 0.1 * jax.random.normal(jax.random.PRNGKey(1), a.shape), nn_unbox(params))
  s, aux = jax.jit(tower.apply)({"params": params}, ids, mask)
  want_s, want_u = np_word_lstm(params, ids, mask, n, branches == "per_language")
  np.testing.assert_allclose(s, want_s, rtol=1e-4, atol=1e-5)
  np.testing.assert_allclose(aux["mule"], want_u, rtol=1e-4, atol=1e-5)
  np.testing.assert_array_equal(aux["lang"], langs)
  g = 1 if branches == "shared" else num_langs
  assert params["lstm_recurrent_kernel"].shape == (g, 6, 24) and params["lang_fc_kernel"].shape == (3, 4, 5)


# ---- The per-language word vocabulary --------------------------------------------------


def test_word_tokenizer_block_layout(tmp_path):
  texts = [("en", b"A red circle."), ("en", b"a red star"), ("de", b"Ein roter Kreis"), ("sw", b"duara"),
           ("xx", b"ignored")]
  counts = word_vocab.count_words(texts, LANGS)
  assert counts["en"]["red"] == 2 and counts["en"]["."] == 1 and "ignored" not in str(counts)
  assert word_vocab.choose_words(counts, words_per_language=6, min_count=1)["en"] == ["a", "red", ".", "circle"]
  words = word_vocab.choose_words(counts, words_per_language=5, min_count=1)  # At most N - 2 words.
  assert words["en"] == ["a", "red", "."]  # Falling count, then the word.
  assert word_vocab.choose_words(counts, 10, min_count=2)["en"] == ["a", "red"]
  path = tmp_path / "words.json"
  word_vocab.save(path, LANGS, words)
  tok = word_vocab.WordTokenizer(str(path), LANGS, words_per_language=10, max_len=4)
  ids, mask = tok.tokenize(np.array(["a red square", "Kreis ein ein ein ein", "duara"]), np.array([0, 1, 2]))
  en, de, sw = (lambda w, lang=l: LANGS.index(lang) * 10 + 2 + words[lang].index(w) for l in LANGS)
  np.testing.assert_array_equal(ids, [[en("a"), en("red"), 0 * 10 + 1, 0],  # 'square' unknown; en padding 0.
                                      [de("kreis"), de("ein"), de("ein"), de("ein")],  # Truncated to max_len.
                                      [sw("duara"), 20, 20, 20]])  # sw's padding is 2 * 10.
  np.testing.assert_array_equal(mask, [[1, 1, 1, 0], [1, 1, 1, 1], [1, 0, 0, 0]])
  np.testing.assert_array_equal(word_vocab.language_of(ids.numpy(), 10), [0, 1, 2])
  with pytest.raises(ValueError, match="language index"):
    tok.tokenize(np.array(["a"]))
  with pytest.raises(config_lib.ConfigError, match=r"^config\.data\.languages: "):
    word_vocab.WordTokenizer(str(path), ["en", "de"], 10, 4)
  with pytest.raises(config_lib.ConfigError, match=r"^config\.model\.text\.words_per_language: "):
    word_vocab.WordTokenizer(str(path), LANGS, 4, 4)


# ---- Config errors ---------------------------------------------------------------------


@pytest.mark.parametrize("field, value", [
    ("model.text.words_per_language", 2),
    ("model.text.word_dim", 0),
    ("model.text.lstm_dim", -1),
    ("model.text.branches", "each"),
    ("model.image.hidden_dim", 0),
    ("model.image.backbone_workdir", None),
    ("data.tokenizer", "wordpiece"),
    ("data.word_min_count", 0),
    ("tasks.mm.margin", -0.1),
    ("tasks.nc.top_k", 0),
    ("tasks.mm.classifier_weight", -1.0),
    ("data.word_vocab_path", None),
])
def test_config_errors_are_one_line(field, value):
  c = tiny_mule_config(**{field: value})
  with pytest.raises(config_lib.ConfigError) as e:
    mule.validate(c)
  message = str(e.value)
  assert message.startswith(f"config.{field}: ") and "\n" not in message, message


def test_config_errors_at_build():
  c = tiny_mule_config(**{"model.text.output_dim": 12})
  with pytest.raises(config_lib.ConfigError, match=r"^config\.model\.text\.output_dim: .*12.*16"):
    mule.validate(c)
  c = tiny_mule_config(**{"data.tokenizer": "letters"})
  with pytest.raises(config_lib.ConfigError, match=r"^config\.data\.tokenizer: 'letters' not in"):
    vocab.tokenizer(c, (), "/nonexistent")
  c = tiny_mule_config(**{"model.image.backbone_workdir": "/nonexistent/run"})
  with pytest.raises(config_lib.ConfigError, match=r"^config\.model\.image\.backbone_workdir: "):
    mule.build_model(c, mule.tasks(c))
  with pytest.raises(config_lib.ConfigError, match="ablation 'nope'"):
    mule_defaults.apply_ablation(tiny_mule_config(), "nope")


# ---- Describe and the ablations as configs ---------------------------------------------


def _text_params(c, g):
  t, langs = c.model.text, len(c.data.languages)
  h = t.lstm_dim
  return (langs * t.words_per_language * t.word_dim + langs * (t.word_dim + 1) * t.mule_dim
          + g * ((t.mule_dim + h + 1) * 4 * h + (h + 1) * t.output_dim))


def test_describe_counts_what_trains():
  c = tiny_mule_config()
  counts = describe.describe(c)
  features = TINY_FEATURES  # The tiny EfficientNet's pooled width (frozen: not a parameter).
  image = (features + 1) * 32 + 2 * 32 + (32 + 1) * 16
  classifier = (16 + 1) * 3
  assert counts["image_tower"] == image
  assert counts["token_embeddings"] == 3 * 64 * 8
  assert counts["total"] == image + _text_params(c, 1) + classifier


class _NoTokenizer:
  """Tokenizes anything to one padding-free id per text (enough to build eval sets)."""

  def tokenize(self, strings, langs=None):
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    n = tf.shape(strings)[0]
    return tf.zeros([n, 4], tf.int32), tf.ones([n, 4], tf.int32)


@pytest.mark.parametrize("name, tasks, branches, classifier", [
    ("parallel_embn", ["mm"], 3, False),
    ("embn", ["mm"], 1, False),
    ("embn_nc", ["mm", "nc"], 1, False),
    ("embn_nc_lc", ["mm", "nc"], 1, True),
    ("pretrain", ["nc"], 1, False),
])
def test_ablations_are_config_values(name, tasks, branches, classifier):
  c = mule_defaults.apply_ablation(tiny_mule_config(), name)
  active = system.active_tasks(mule.SYSTEM, c)
  assert [t.name for t in active] == tasks
  kinds = [type(e).__name__ for e in mule.evaluators(c, active, _NoTokenizer())] if name == "pretrain" else []
  assert name != "pretrain" or kinds == ["Translation"]  # LP's pre-training trains no image side.
  params = nn_unbox(describe.param_shapes(c))
  assert params["text_tower"]["lstm_input_kernel"].shape[0] == branches
  assert ("language_classifier" in params) == classifier


# ---- End to end ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def words_file(tmp_path_factory):
  """One word vocabulary (learned from 200 records per source) copied into every run's workdir."""
  c = tiny_mule_config()
  with records_per_source(200):
    workdir = tmp_path_factory.mktemp("words")
    return word_vocab.learn(c, system.vocabulary_tasks(mule.SYSTEM, c), str(workdir))


@pytest.fixture(scope="module")
def reference(tmp_path_factory, words_file):
  """4 uninterrupted steps: (workdir, result)."""
  workdir = workdir_with_words(tmp_path_factory, "mule_reference", words_file)
  return workdir, train.train_and_evaluate(tiny_mule_config(), str(workdir), evaluators=[])


def test_trains_end_to_end(reference):
  workdir, result = reference
  lines = [json.loads(l) for l in (workdir / "metrics.jsonl").read_text().splitlines()]
  assert [l["step"] for l in lines] == [1, 2, 3, 4]
  for l in lines:
    assert np.isfinite(l["loss"])
    parts = l["loss/i2s"] + l["loss/s2i"] + 1e-6 * l["loss/language"] + l["loss/nc_multimodal"] + l["loss/nc_mule"]
    assert l["loss"] == pytest.approx(parts, rel=1e-5)
    assert 0.0 <= l["language_accuracy"] <= 1.0
  params = result["state"].params
  assert set(params) == {"image_tower", "text_tower", "language_classifier"}
  assert set(params["image_tower"]) == {"fc_hidden", "bn", "fc_out"}  # The backbone is no parameter.
  init = jax.device_get(result["setup"].init_state(jax.random.PRNGKey(0)))
  final = jax.device_get(params)
  for path, before in jax.tree_util.tree_leaves_with_path(init.params):
    after = final
    for key in path:
      after = after[key.key]
    assert not np.array_equal(before, after), f"{jax.tree_util.keystr(path)} did not train"


def test_resumes_bit_exactly(reference, tmp_path_factory, words_file):
  config = tiny_mule_config()
  workdir = workdir_with_words(tmp_path_factory, "mule_resumed", words_file)
  assert_resumes_bit_exactly(config, workdir, reference[1])


def test_evaluates_per_language(reference):
  workdir, _ = reference
  results = train.evaluate(tiny_mule_config(), str(workdir), setup=reference[1]["setup"])
  for lang in LANGS:
    assert 0.0 <= results[f"{lang}/mR"] <= 100.0
  assert "en-de/acc" in results and "mean/mR" in results
  assert (workdir / "eval" / "step_4.json").exists()


def test_plan_counts_the_frozen_backbone_in_every_devices_total(reference):
  """The frozen backbone's variables are constants of the step's program, neither arguments nor
  temporaries: XLA's argument/temp bytes leave them out, the plan adds them. (After `reference`,
  for the tests' compilation cache: the same step.)"""
  from mural import models  # pylint: disable=g-import-not-at-top
  from mural import plan  # pylint: disable=g-import-not-at-top
  c = tiny_mule_config()
  p = plan.plan(c)
  backbone = models.IMAGE_TOWERS[c.model.image.backbone](c.model.image, jnp.float32, jnp.float32)
  shapes = jax.eval_shape(lambda: backbone.init(jax.random.PRNGKey(0), jnp.zeros((1, 32, 32, 3)), train=False))
  want = sum(4 * x.size for x in jax.tree.leaves(shapes))
  assert want > 1000 and p["constant_bytes_per_device"] == want
  assert p["total_bytes_per_device"] == (p["argument_bytes_per_device"] + p["output_bytes_per_device"]
                                         - p["alias_bytes_per_device"] + p["temp_bytes_per_device"] + want)
  assert "frozen constants" in plan.table(p)


def test_export_carries_its_words_and_frozen_backbone_and_embeds_as_the_evaluator(
    reference, words_file, tmp_path, capsys):
  """An export needs neither the workdir nor what the config names outside it: the word
  vocabularies and the frozen backbone travel with it (copied elsewhere here), FastText files
  (initial values only) are not read again, and a text embeds with its language's words."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from mural import export  # pylint: disable=g-import-not-at-top
  from mural.data import eval_data  # pylint: disable=g-import-not-at-top
  from mural.data import synthetic  # pylint: disable=g-import-not-at-top
  workdir, result = reference
  vectors = tmp_path / "en.vec"
  vectors.write_text(f"{json.loads(open(words_file).read())['words']['en'][0]} {' '.join(['0.5'] * 8)}\n")
  config = tiny_mule_config(**{"model.text.embeddings_path": str(tmp_path / "{lang}.vec"),
                               "data.word_vocab_path": str(words_file)})
  d = export.export(config, str(workdir))
  vectors.unlink()
  manifest = json.loads(open(f"{d}/manifest.json").read())
  frozen = "frozen_model_image_backbone_workdir"
  assert manifest["inputs"] == {"data.word_vocab_path": "words.json", "model.image.backbone_workdir": frozen,
                                "model.text.embeddings_path": ""}
  assert manifest["text"]["tokenizer"] == "words" and manifest["text"]["needs_language"]
  assert manifest["heads"] == {"image": "", "text": ""} and manifest["files"]["saved_model"] == "saved_model"
  assert "lang: tf.string [B]" in manifest["signatures"]["embed_text"]
  moved = tmp_path / "moved"
  shutil.copytree(d, moved)
  model = export.load(str(moved), batch_size=3)  # Batches of 3: padded tails.
  assert model.config.model.image.backbone_workdir == str(moved / frozen)

  setup, variables = result["setup"], result["state"].variables()
  embedder = setup.embedder(config.eval_batch_size)
  texts, langs = ["a red circle above a blue square", "ein roter Kreis", "duara jekundu", ""], ["en", "de", "sw", "de"]
  tok = vocab.tokenizer(config, setup.tasks, str(workdir))
  ids, mask = (a.numpy() for a in tok.tokenize(tf.constant(texts), tf.constant([LANGS.index(l) for l in langs])))
  np.testing.assert_allclose(model.embed_texts(texts, langs), embedder.texts(variables, ids, mask, ""), atol=1e-5)
  german = model.embed_texts(texts, "de")  # One code for every text: other words, other rows.
  assert not np.allclose(german[0], model.embed_texts(texts[:1], ["en"])[0], atol=1e-3)
  scenes = synthetic.build_eval_data(config)
  want = embedder.images(variables, eval_data.eval_images(scenes.images, config.data), "")
  np.testing.assert_allclose(model.embed_images(list(scenes.images)), want, atol=1e-5)
  for bad, message in [((texts,), r"per language: embed_texts\(texts, langs="),
                       ((texts, "xx"), r"langs: \['xx'\]"), ((texts, ["en"]), r"langs: 1 "),
                       ((texts, 5), r"langs: a language code or a list of them, got 5")]:
    with pytest.raises(ValueError, match=message):
      model.embed_texts(*bad)

  # The SavedModel: words looked up in the graph, each text with its language code.
  saved = tf.saved_model.load(str(moved / "saved_model"))
  got = saved.signatures["embed_text"](text=tf.constant(texts), lang=tf.constant(langs))["embedding"]
  np.testing.assert_allclose(got.numpy(), model.embed_texts(texts, langs), atol=1e-5)
  pixels = tf.constant(np.stack(scenes.images[:3]).astype(np.float32))
  np.testing.assert_allclose(saved.signatures["embed_image_pixels"](pixels=pixels)["embedding"].numpy(),
                             want[:3], atol=1e-5)
  with pytest.raises(tf.errors.InvalidArgumentError, match="lang: a code not in"):
    saved.signatures["embed_text"](text=tf.constant(texts[:1]), lang=tf.constant(["xx"]))
  with pytest.raises(tf.errors.InvalidArgumentError, match="lang: one code per text"):
    saved.signatures["embed_text"](text=tf.constant(texts[:2]), lang=tf.constant(["de"]))

  # The corpus embedder's command line: --lang for such an export.
  from mural import embed  # pylint: disable=g-import-not-at-top
  (tmp_path / "texts.tsv").write_text("a\tein roter Kreis\nb\tein blauer Kreis\n")
  args = [f"--export={moved}", f"--texts={tmp_path / 'texts.tsv'}", "--dtype=float32"]
  with pytest.raises(SystemExit):
    embed.main(args + [f"--output={tmp_path / 'none'}"])
  assert "--lang (or a third column per line): this export has a word vocabulary per language" in (
      capsys.readouterr().err)
  assert embed.main(args + [f"--output={tmp_path / 'de'}", "--lang=de"]) == 0
  vectors, ids = embed.load_embeddings(str(tmp_path / "de" / "texts"))
  assert ids == ["a", "b"]
  np.testing.assert_allclose(vectors, model.embed_texts(["ein roter Kreis", "ein blauer Kreis"], "de"), atol=1e-6)
  # A file of several languages: a third column per line, --lang for lines without one; a line
  # with an unknown code, or none, is skipped and counted.
  (tmp_path / "mixed.tsv").write_text(f"a\tein roter Kreis\tde\nb\t{texts[0]}\t{langs[0]}\n"
                                      "c\tein blauer Kreis\nd\tx\txx\n")
  mixed = [f"--export={moved}", f"--texts={tmp_path / 'mixed.tsv'}", "--dtype=float32"]
  assert embed.main(mixed + [f"--output={tmp_path / 'mixed'}"]) == 0
  vectors, ids = embed.load_embeddings(str(tmp_path / "mixed" / "texts"))
  assert ids == ["a", "b"]
  np.testing.assert_allclose(vectors, model.embed_texts(["ein roter Kreis", texts[0]], ["de", langs[0]]),
                             atol=1e-6)
  skipped = json.loads((tmp_path / "mixed" / "texts" / "shard-00000.json").read_text())["skipped"]
  assert skipped == [["c", "no language (a third column, or --lang)"],
                     ["d", f"language 'xx' is not one of this export's {model.languages}"]]
  assert embed.main(mixed + [f"--output={tmp_path / 'mixed_de'}", "--lang=de"]) == 0
  assert embed.load_embeddings(str(tmp_path / "mixed_de" / "texts"))[1] == ["a", "b", "c"]


def test_system_is_in_the_table():
  assert systems.SYSTEMS["mule"].system is mule.SYSTEM


def test_pretrained_text_tower_warm_starts_the_full_model(reference, words_file):
  """LP: a run warm-started from another (config.init_from) begins with its text tower."""
  from mural import warm_start  # pylint: disable=g-import-not-at-top
  workdir, result = reference
  config = tiny_mule_config(**{"init_from": str(workdir), "data.word_vocab_path": str(words_file)})
  setup = train.build(config)
  state = jax.jit(setup.init)(jax.random.PRNGKey(1))
  loaded, report = warm_start.load_into(state, config)
  for a, b in zip(jax.tree.leaves(jax.device_get(loaded.params["text_tower"])),
                  jax.tree.leaves(jax.device_get(result["state"].params["text_tower"]))):
    np.testing.assert_array_equal(a, b)
  assert any(name.startswith("params/language_classifier") for name in report["initialised"])
  tok = vocab.tokenizer(config, setup.tasks, "/nonexistent")  # The given words, nothing learned.
  assert tok.vocab_path == str(words_file)


def test_fasttext_vectors_fill_their_words_rows(words_file, tmp_path):
  words = json.loads(open(words_file).read())["words"]
  first, second = words["en"][0], words["en"][1]
  (tmp_path / "en.vec").write_text(f"3 8\n{first} {' '.join(['0.5'] * 8)}\nunseen {' '.join(['9'] * 8)}\n"
                                   f"{second} {' '.join(str(i) for i in range(8))}\n")
  config = tiny_mule_config(**{"model.text.embeddings_path": str(tmp_path / "{lang}.vec"),
                               "data.word_vocab_path": str(words_file)})
  tasks = mule.tasks(config)
  model = mule.build_model(config, tasks)
  init = jax.jit(lambda rng: system.init_variables(model, tasks, config, rng))  # Op by op: 444 compiles.
  table = nn_unbox(init(jax.random.PRNGKey(0)))["params"]["text_tower"]
  table = np.asarray(table["token_embed"])
  row = lambda k: 0 * 64 + word_vocab.FIRST_WORD + k
  np.testing.assert_array_equal(table[row(0)], [0.5] * 8)
  np.testing.assert_array_equal(table[row(1)], np.arange(8))
  assert np.abs(table[row(2)]).max() < 2  # A word without a vector keeps its random row.
  # No header; a line of another width (not a vocabulary word) after the first vector is skipped.
  (tmp_path / "en.vec").write_text(f"unseen {' '.join(['9'] * 8)}\nodd 1 2\n{second} {' '.join(['0.25'] * 8)} \n")
  rows, found = word_lstm.load_fasttext(str(tmp_path / "{lang}.vec"), ["en"], words, 64, 8)
  np.testing.assert_array_equal(rows[row(1)], [0.25] * 8)
  assert found == {"en": 1} and np.abs(rows[row(0)]).max() < 2
  (tmp_path / "en.vec").write_text(f"2 8\nunseen {' '.join(['x'] * 8)}\n{second} 1 2 3 4 5 6 7 nan?\n")
  with pytest.raises(config_lib.ConfigError, match=r"^config\.model\.text\.embeddings_path: .*en\.vec line 3 "):
    word_lstm.load_fasttext(str(tmp_path / "{lang}.vec"), ["en"], words, 64, 8)
  (tmp_path / "en.vec").write_text(f"{first} 1 2 3\n")
  with pytest.raises(config_lib.ConfigError, match=r"^config\.model\.text\.embeddings_path: .*3-d vectors"):
    mule.build_model(config, tasks)
  with pytest.raises(config_lib.ConfigError, match=r"^config\.model\.text\.embeddings_path: needs config\.data"):
    mule.validate(tiny_mule_config(**{"model.text.embeddings_path": "x.vec"}))


def test_batches_carry_language_ids_that_match_the_words(words_file):
  """IMAGE_TEXT_LANG / TEXT_PAIR_LANG: the device language ids are the data.languages indices,
  and each text's word ids sit in that language's block."""
  from mural.data import pipeline  # pylint: disable=g-import-not-at-top
  config = tiny_mule_config(**{"data.word_vocab_path": str(words_file)})
  tasks = system.active_tasks(mule.SYSTEM, config)
  tok = vocab.tokenizer(config, tasks, "/nonexistent")
  it = pipeline.build_train_iterator(config, tasks, tok)
  batch = next(it)
  it.close()
  n = config.model.text.words_per_language
  mm, nc = batch["mm"], batch["nc"]
  assert set(mm) == {"image", "text_ids", "text_mask", "lang", "lang_id", "valid"}
  np.testing.assert_array_equal(mm["lang_id"], mm["lang"])
  np.testing.assert_array_equal(word_vocab.language_of(mm["text_ids"], n), mm["lang_id"])
  assert np.all(mm["text_ids"] // n == mm["lang_id"][:, None])  # Every id, padding too, in its block.
  for side in ("left", "right"):
    np.testing.assert_array_equal(word_vocab.language_of(nc[f"{side}_ids"], n), nc[f"{side}_lang_id"])
  assert set(nc["left_lang_id"]) == {0} and set(nc["right_lang_id"]) <= {1, 2}  # en-x pairs.
  assert set(system.batch_shapes(tasks, config)["nc"]) == {
      "left_ids", "left_mask", "right_ids", "right_mask", "left_lang_id", "right_lang_id", "valid"}
