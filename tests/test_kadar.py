"""Kádár et al. (mural/systems/kadar.py) and the shared pieces it added: the max-of-hinges loss
against NumPy float64 (values and gradients), the GRU tower against a NumPy GRU (its state at
each sentence's true length), the union word vocabulary's UNK threshold, config errors,
batches of one language, a few steps end to end with a bit-exact resume, and early stopping
(a trainer feature: stops after `patience` evaluations without improvement, keeps the best
checkpoint, which restore_params / export read).

Tiny sizes throughout; every run shares one config (so one compiled step, JAX's persistent
cache) and one learned word vocabulary.
"""

import json

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from conftest import (TINY_FEATURES, assert_resumes_bit_exactly, numeric_grad, records_per_source,
                      set_fields, tiny_word_system, train_step_lowerings, workdir_with_words)
from mural import checkpointing
from mural import config_lib
from mural import describe
from mural import losses
from mural import system
from mural import systems
from mural import train
from mural.data import pipeline
from mural.data import vocab
from mural.data import word_vocab
from mural.models import word_lstm
from mural.systems import kadar
from mural.systems.defaults import kadar as kadar_defaults

LANGS = ["en", "de", "sw"]


def tiny_kadar_config(**overrides):
  """Kádár et al. at toy sizes on the built-in data (3 languages, 16 held-out scenes)."""
  c = tiny_word_system(kadar_defaults.get_config(), LANGS)
  c.model.image.output_dim = 16
  c.model.text.words_per_language = 128
  c.model.text.word_dim = 8
  c.model.text.lstm_dim = 16
  c.model.text.output_dim = 16
  c.model.text.max_len = 16
  c.data.synthetic.translation_pair_list = ["en-de", "en-sw", "de-sw"]
  c.data.word_min_count = 2
  c.tasks.c2i.batch_size = c.tasks.c2c.batch_size = 8
  c.tasks.c2i.learning_rate = c.tasks.c2c.learning_rate = 1e-2
  c.early_stopping.metric = ""
  return set_fields(c, **overrides)


# ---- The loss against NumPy float64 ----------------------------------------------------


def np_max_hinge(x, y, margin, valid):
  s = (x / np.linalg.norm(x, axis=-1, keepdims=True)) @ (y / np.linalg.norm(y, axis=-1, keepdims=True)).T
  rows = np.flatnonzero(valid)

  def one_way(s):
    hardest = [max([0.0] + [max(0.0, margin - s[i, i] + s[i, j]) for j in rows if j != i]) for i in rows]
    return sum(hardest) / max(len(rows), 1)

  return one_way(s) + one_way(s.T)


# Jitted: a program each, not each op compiled alone.
_max_hinge = jax.jit(losses.max_hinge_loss, static_argnums=2)


@pytest.mark.parametrize("seed, margin", [(0, 0.2), (1, 0.5), (2, 1.5)])
def test_max_hinge_matches_numpy(seed, margin):
  rng = np.random.default_rng(seed)
  x, y = rng.normal(size=(6, 4)), rng.normal(size=(6, 4))
  valid = np.array([True, True, False, True, True, True])
  got, parts = _max_hinge(jnp.asarray(x, jnp.float32), jnp.asarray(y, jnp.float32), margin, jnp.asarray(valid))
  np.testing.assert_allclose(float(got), np_max_hinge(x, y, margin, valid), rtol=1e-5)
  assert float(parts["x2y"]) + float(parts["y2x"]) == pytest.approx(float(got))
  grad = jax.jit(jax.grad(lambda a, b: losses.max_hinge_loss(a, b, margin, jnp.asarray(valid))[0], argnums=(0, 1)))
  gx, gy = grad(jnp.asarray(x, jnp.float32), jnp.asarray(y, jnp.float32))
  np.testing.assert_allclose(gx, numeric_grad(lambda a: np_max_hinge(a, y, margin, valid), x), atol=2e-5)
  np.testing.assert_allclose(gy, numeric_grad(lambda b: np_max_hinge(x, b, margin, valid), y), atol=2e-5)
  assert np.all(gx[2] == 0) and np.all(gy[2] == 0)  # The padding row takes no part.


def test_max_hinge_takes_only_the_hardest_negative():
  x = np.eye(3, dtype=np.float32)
  y = np.array([[1, 0, 0], [0.6, 0.8, 0], [0, 0, 1]], np.float32)  # s(x0, y1) = 0.6: x0's hardest negative.
  got, parts = _max_hinge(jnp.asarray(x), jnp.asarray(y), 0.5)
  # x -> y: anchor 0: max(0, 0.5 - 1 + 0.6) = 0.1; anchor 1: 0.5 - 0.8 + 0 = 0 (its negatives score 0);
  # anchor 2: 0. y -> x: y1 against x0: 0.5 - 0.8 + 0.6 = 0.3; the rest 0.
  assert float(parts["x2y"]) == pytest.approx(0.1 / 3, abs=1e-6)
  assert float(parts["y2x"]) == pytest.approx(0.3 / 3, abs=1e-6)
  one, _ = _max_hinge(jnp.ones((1, 3)), jnp.ones((1, 3)), 0.5)
  assert float(one) == 0.0  # No negative at all.


# ---- The GRU text tower against a NumPy GRU ----------------------------------------------


def np_gru_last_state(p, ids, mask):
  """PyTorch's GRU equations in float64, one sentence and one word at a time, up to its length."""
  p = jax.tree.map(lambda a: np.asarray(a, np.float64), p)
  g, sig = p["gru"], lambda z: 1 / (1 + np.exp(-z))
  out = []
  for row, m in zip(ids, mask):
    h = np.zeros(g["hr"]["kernel"].shape[0])
    for t in range(int(m.sum())):
      x = p["token_embed"][row[t]]
      r = sig(x @ g["ir"]["kernel"] + g["ir"]["bias"] + h @ g["hr"]["kernel"])
      z = sig(x @ g["iz"]["kernel"] + g["iz"]["bias"] + h @ g["hz"]["kernel"])
      n = np.tanh(x @ g["in"]["kernel"] + g["in"]["bias"] + r * (h @ g["hn"]["kernel"] + g["hn"]["bias"]))
      h = (1 - z) * n + z * h
    out.append(h)
  return np.stack(out)


def test_gru_tower_is_the_last_state_at_the_true_length():
  tower = word_lstm.WordLstmTower(num_languages=1, words_per_language=12, word_dim=4, mule_dim=0, lstm_dim=6,
                                  output_dim=6, cell="gru", lang_fc=False, output_fc=False)
  lengths = [3, 1, 6, 4]
  rng = np.random.default_rng(0)
  ids = np.zeros((4, 6), np.int32)
  mask = (np.arange(6)[None] < np.array(lengths)[:, None]).astype(np.int32)
  ids[mask > 0] = rng.integers(1, 12, int(mask.sum()))
  apply = jax.jit(tower.apply)  # Jitted: op by op, the scan and each small op compile alone.
  params = nn.unbox(jax.jit(tower.init)(jax.random.PRNGKey(0), ids, mask)["params"])
  params = jax.tree.map(lambda a: a + 0.1 * jax.random.normal(jax.random.PRNGKey(1), a.shape), params)
  s, aux = apply({"params": params}, ids, mask)
  np.testing.assert_allclose(s, np_gru_last_state(params, ids, mask), rtol=1e-4, atol=1e-5)
  junk = np.where(mask > 0, ids, rng.integers(1, 12, ids.shape)).astype(np.int32)  # Words past the end.
  np.testing.assert_array_equal(apply({"params": params}, junk, mask)[0], s)
  words = np.asarray(params["token_embed"], np.float64)[ids]
  np.testing.assert_allclose(aux["mule"], (words * mask[..., None]).sum(1) / mask.sum(1, keepdims=True),
                             rtol=1e-5, atol=1e-6)
  assert s.shape == (4, 6) and set(params) == {"token_embed", "gru"}
  assert params["gru"]["ir"]["kernel"].shape == (4, 6) and params["gru"]["hn"]["kernel"].shape == (6, 6)


# ---- The union word vocabulary ---------------------------------------------------------


def test_union_vocabulary_unk_threshold(tmp_path):
  texts = [("en", b"a red star"), ("en", b"a red circle"), ("en", b"a blue star"), ("de", b"ein rot a"),
           ("de", b"ein rot star"), ("sw", b"nyota a"), ("sw", b"star")]
  counts = word_vocab.union_counts(word_vocab.count_words(texts, LANGS))
  assert set(counts) == {word_vocab.UNION}
  assert counts[word_vocab.UNION]["a"] == 5 and counts[word_vocab.UNION]["star"] == 4  # Summed over languages.
  words = word_vocab.choose_words(counts, words_per_language=10, min_count=4)
  assert words == {word_vocab.UNION: ["a", "star"]}  # Fewer than 4 occurrences -> UNK.
  assert word_vocab.choose_words(counts, 10, min_count=2)[word_vocab.UNION] == ["a", "star", "ein", "red", "rot"]
  path = tmp_path / "words.json"
  word_vocab.save(path, LANGS, words)
  tok = word_vocab.WordTokenizer(str(path), LANGS, words_per_language=10, max_len=4, union=True)
  assert tok.vocab_size == 10
  ids, mask = tok.tokenize(np.array(["a red star", "nyota star", "star a"]))  # No language needed.
  a, star = word_vocab.FIRST_WORD, word_vocab.FIRST_WORD + 1
  np.testing.assert_array_equal(ids, [[a, word_vocab.UNK, star, 0], [word_vocab.UNK, star, 0, 0], [star, a, 0, 0]])
  np.testing.assert_array_equal(mask, [[1, 1, 1, 0], [1, 1, 0, 0], [1, 1, 0, 0]])
  with pytest.raises(config_lib.ConfigError, match=r"^config\.data\.word_vocab_union: False, but .* a union"):
    word_vocab.WordTokenizer(str(path), LANGS, 10, 4)


# ---- Config errors ---------------------------------------------------------------------


@pytest.mark.parametrize("field, value", [
    ("model.text.words_per_language", 2),
    ("model.text.lstm_dim", 0),
    ("model.text.cell", "rnn"),
    ("model.text.lang_fc", True),
    ("model.text.output_dim", 12),
    ("model.image.output_dim", 12),
    ("model.image.hidden_dim", -1),
    ("data.tokenizer", "wordpiece"),
    ("data.word_vocab_union", False),
    ("data.word_min_count", 0),
    ("tasks.c2i.margin", -0.1),
    ("tasks.c2c.draw_weight", 0.0),
    ("tasks.c2i.draw_weight", -1.0),
])
def test_config_errors_are_one_line(field, value):
  c = tiny_kadar_config(**{field: value})
  with pytest.raises(config_lib.ConfigError) as e:
    kadar.validate(c)
  message = str(e.value)
  assert message.startswith(f"config.{field}: ") and "\n" not in message, message


@pytest.mark.parametrize("field, value", [
    ("early_stopping.patience", 0), ("early_stopping.mode", "up")])
def test_early_stopping_config_errors(field, value):
  with pytest.raises(config_lib.ConfigError, match=rf"^config\.{field.replace('.', '[.]')}: "):
    systems.validate(tiny_kadar_config(**{field: value, "eval_every_steps": 2}))
  with pytest.raises(config_lib.ConfigError, match=r"^config\.early_stopping\.metric: .*eval_every_steps"):
    systems.validate(tiny_kadar_config(**{"early_stopping.metric": "mean/rsum"}))


def test_describe_and_system_table():
  c = tiny_kadar_config()
  counts = describe.describe(c)
  gru = 3 * (8 * 16 + 16) + 3 * 16 * 16 + 16  # Input kernels + biases, recurrent kernels, hn's bias.
  features = TINY_FEATURES  # The frozen backbone's pooled width.
  assert counts["image_tower"] == (features + 1) * 16  # One linear layer over the frozen features.
  assert counts["token_embeddings"] == 128 * 8  # ONE table for every language.
  assert counts["total"] == (features + 1) * 16 + 128 * 8 + gru
  assert systems.SYSTEMS["kadar"].system is kadar.SYSTEM
  tasks = system.active_tasks(kadar.SYSTEM, c)
  assert [t.name for t in tasks] == ["c2i", "c2c"] and [t.draw_weight for t in tasks] == [0.5, 0.5]
  assert [s["languages"] for s in tasks[0].sources] == [["en"], ["de"], ["sw"]]  # One source per language.
  only_c2i = system.active_tasks(kadar.SYSTEM, tiny_kadar_config(**{"tasks.c2c.weight": 0.0}))
  assert [t.name for t in only_c2i] == ["c2i"]


def test_claim_budgets_count_c2i_steps():
  """benchmarks/kadar_claim.py: a model with c2c (drawn on half the steps) gets twice the steps and
  twice the evaluation interval, so every model has the same c2i steps; the rate never decays."""
  import argparse  # pylint: disable=g-import-not-at-top
  import importlib.util  # pylint: disable=g-import-not-at-top
  from conftest import ROOT  # pylint: disable=g-import-not-at-top
  spec = importlib.util.spec_from_file_location("kadar_claim", ROOT / "benchmarks" / "kadar_claim.py")
  claim = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(claim)
  args = argparse.Namespace(seed=0, backbone_workdir="", rich=100, scarce=20, rich_pairs=100, steps=300,
                            eval_every=50, patience=4, caption_pairs="comparable")
  budgets = {}
  for name, (langs, pairs) in claim.MODELS.items():
    c = claim.model_config(args, langs, pairs)
    systems.validate(c)
    assert c.optim.decay is False and c.early_stopping.patience == 4
    assert c.data.synthetic.caption_pairs == "comparable"
    budgets[name] = (c.total_steps, c.eval_every_steps, bool(c.tasks.c2c.weight))
  assert budgets == {"mono-en": (300, 50, False), "bi-en-de": (600, 100, True), "multi": (600, 100, True),
                     "multi-c2c": (300, 50, False), "mono-cs": (300, 50, False),
                     "bi-en-cs": (600, 100, True), "bi-en-cs-c2c": (300, 50, False)}


def test_draw_by_weight_draws_each_task_in_proportion():
  tasks = system.active_tasks(kadar.SYSTEM, tiny_kadar_config(**{"tasks.c2i.draw_weight": 0.25,
                                                                 "tasks.c2c.draw_weight": 0.75}))
  draws = jax.vmap(lambda k: system.draw_by_weight(k, tasks))(jax.random.split(jax.random.PRNGKey(0), 4000))
  assert set(np.unique(draws)) == {0, 1}
  assert np.mean(np.asarray(draws) == 1) == pytest.approx(0.75, abs=0.03)


# ---- Data: batches of one language -----------------------------------------------------


@pytest.fixture(scope="module")
def words_file(tmp_path_factory):
  """One union vocabulary (learned from 200 records per source) copied into every run's workdir."""
  c = tiny_kadar_config()
  with records_per_source(200):
    workdir = tmp_path_factory.mktemp("words")
    return word_vocab.learn(c, system.vocabulary_tasks(kadar.SYSTEM, c), str(workdir))


def test_each_c2i_batch_is_one_language(words_file):
  config = tiny_kadar_config(**{"data.word_vocab_path": str(words_file)})
  tasks = system.active_tasks(kadar.SYSTEM, config)
  tok = vocab.tokenizer(config, tasks, "/nonexistent")
  it = pipeline.build_train_iterator(config, tasks, tok)
  batches = [next(it) for _ in range(8)]
  state = it.get_state()
  langs = [set(b["c2i"]["lang"].tolist()) for b in batches]
  assert all(len(l) == 1 for l in langs), langs  # Each batch whole from one language's source.
  assert len(set.union(*langs)) >= 2  # The language is drawn per batch.
  assert np.all(batches[0]["c2i"]["text_ids"] < config.model.text.words_per_language)  # One block.
  pairs = {(a, b) for a, b in zip(batches[0]["c2c"]["left_ids"][:, 0], batches[0]["c2c"]["right_ids"][:, 0])}
  assert pairs and set(batches[0]["c2c"]) == {"left_ids", "left_mask", "right_ids", "right_mask", "valid"}
  resumed = pipeline.build_train_iterator(config, tasks, tok)  # Resumes at the next batch's draw.
  resumed.set_state(state)
  for a, b in zip(jax.tree.leaves(next(resumed)), jax.tree.leaves(next(it))):
    np.testing.assert_array_equal(a, b)
  resumed.close()
  it.close()


# ---- End to end ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def reference(tmp_path_factory, words_file):
  """4 uninterrupted steps: (workdir, result)."""
  workdir = workdir_with_words(tmp_path_factory, "kadar_reference", words_file)
  return workdir, train.train_and_evaluate(tiny_kadar_config(), str(workdir), evaluators=[])


def test_trains_one_task_per_step(reference):
  workdir, result = reference
  lines = [json.loads(l) for l in (workdir / "metrics.jsonl").read_text().splitlines()]
  assert [l["step"] for l in lines] == [1, 2, 3, 4]
  for l in lines:
    assert np.isfinite(l["loss"]) and l["task_index"] in (0, 1)
    chosen = ["c2i", "c2c"][int(l["task_index"])]
    other = "c2c" if chosen == "c2i" else "c2i"
    assert l["loss"] == pytest.approx(l[f"loss/{chosen}"], rel=1e-6) and l[f"loss/{other}"] == 0.0
    assert l["lr/c2i"] == l["lr/c2c"] == pytest.approx(1e-2)  # Constant (optim.decay = False).
  params = result["state"].params
  assert set(params) == {"image_tower", "text_tower"}
  assert set(params["image_tower"]) == {"fc_out"}  # The backbone is no parameter.


def test_exports_and_embeds_as_the_evaluator_without_languages(reference):
  """One union vocabulary: a text needs no language (MULE's per-language export:
  tests/test_mule.py)."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from mural import export  # pylint: disable=g-import-not-at-top
  workdir, result = reference
  config = tiny_kadar_config()
  d = export.export(config, str(workdir))
  model = export.load(d, batch_size=4)
  assert model.manifest["text"] == dict(model.manifest["text"], tokenizer="words", needs_language=False)
  assert set(model.manifest["inputs"]) == {"data.word_vocab_path", "model.image.backbone_workdir"}
  texts = ["a red circle", "ein roter Kreis", "kreis"]
  setup = result["setup"]
  ids, mask = (a.numpy() for a in vocab.tokenizer(config, setup.tasks, str(workdir)).tokenize(tf.constant(texts)))
  want = setup.embedder(config.eval_batch_size).texts(result["state"].variables(), ids, mask, "")
  np.testing.assert_allclose(model.embed_texts(texts), want, atol=1e-5)
  np.testing.assert_allclose(model.embed_texts(texts, "de"), want, atol=1e-5)  # Ignored.
  saved = tf.saved_model.load(f"{d}/saved_model")  # Its signature takes the texts alone.
  np.testing.assert_allclose(saved.signatures["embed_text"](text=tf.constant(texts))["embedding"].numpy(),
                             want, atol=1e-5)


def test_resumes_bit_exactly(reference, tmp_path_factory, words_file):
  config = tiny_kadar_config()
  workdir = workdir_with_words(tmp_path_factory, "kadar_resumed", words_file)
  assert_resumes_bit_exactly(config, workdir, reference[1])


def test_evaluates_rsum_per_language(reference):
  workdir, _ = reference
  results = train.evaluate(tiny_kadar_config(), str(workdir), setup=reference[1]["setup"])
  for lang in LANGS:
    six = sum(results[f"{lang}/{d}_R@{k}"] for d in ("i2t", "t2i") for k in (1, 5, 10))
    assert results[f"{lang}/rsum"] == pytest.approx(six)
  assert results["mean/rsum"] == pytest.approx(np.mean([results[f"{l}/rsum"] for l in LANGS]))
  assert "en-de/acc" in results and "de-sw/acc" in results


class ScriptedScore:
  """An evaluator whose score at the k-th evaluation is scores[k] (drives the trainer's stopping)."""

  def __init__(self, scores):
    self.scores, self.calls = list(scores), 0

  def run(self, embedder, variables):
    del embedder, variables
    self.calls += 1
    return {"mean/rsum": self.scores[self.calls - 1]}


class ParamsSeen:
  """An evaluator that keeps the parameters it is given."""

  def __init__(self):
    self.params = []

  def run(self, embedder, variables):
    del embedder
    self.params.append(jax.device_get(variables["params"]))
    return {"mean/rsum": 0.0}


def test_early_stopping_keeps_the_best_checkpoint(reference, tmp_path_factory, words_file):
  """Best at the 2nd evaluation; patience 2 -> stops after the 4th; step 2's checkpoint is kept
  (keep_checkpoints=1: the newest, 4, and the best) and restore_params / export / --mode=eval
  read it."""
  config = tiny_kadar_config(**{"early_stopping.metric": "mean/rsum", "early_stopping.patience": 2,
                                "eval_every_steps": 1, "checkpoint_every_steps": 100, "keep_checkpoints": 1,
                                "total_steps": 4})
  workdir = workdir_with_words(tmp_path_factory, "kadar_early", words_file)
  scores = ScriptedScore([1.0, 3.0, 2.0, 2.5])
  result = train.train_and_evaluate(config, str(workdir), evaluators=[scores])
  assert result["early_stopped"] and result["best_step"] == 2 and result["step"] == 4 and scores.calls == 4
  steps = sorted(int(p.name) for p in (workdir / "checkpoints").iterdir() if p.name.isdigit())
  assert steps == [2, 4]
  assert checkpointing.best_step(str(workdir)) == 2
  step, variables = checkpointing.read_params(str(workdir))
  assert step == 2
  _, reference_step2 = checkpointing.read_params(str(reference[0]), 2)  # The same run's step 2.
  for a, b in zip(jax.tree.leaves(variables["params"]), jax.tree.leaves(reference_step2["params"])):
    np.testing.assert_array_equal(a, b)
  # --mode=eval reads the best step too, or the one --step names.
  seen = ParamsSeen()
  train.evaluate(config, str(workdir), evaluators=[seen])
  train.evaluate(config, str(workdir), step=4, evaluators=[seen])
  _, step4 = checkpointing.read_params(str(workdir), 4)
  for got, want in zip(seen.params, (reference_step2, step4)):
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want["params"])):
      np.testing.assert_array_equal(a, b)
  with pytest.raises(FileNotFoundError, match="no checkpoint 3 in"):
    train.evaluate(config, str(workdir), step=3, evaluators=[seen])
  # Patience 2 with a longer budget: the 5th and 6th evaluations never come.
  config.total_steps = 6
  with train_step_lowerings() as lowerings:
    again = train.train_and_evaluate(config, str(workdir), evaluators=[ScriptedScore([9.0] * 3)])
  assert again["early_stopped"] and again["step"] == 4
  assert not lowerings  # Nothing left to train: the step is not even lowered.
