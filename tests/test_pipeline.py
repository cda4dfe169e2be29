"""The training input pipeline and the eval sets, on real TFRecord/TSV files written here.

Captions are 'cap <n>' with a hand-written vocab in which every number is one
token, so a batch's text_ids name the records it holds; each record's image
is one solid colour derived from n, so image and caption can be checked to
travel together.
"""

import ast
import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from conftest import set_fields
from mural import config_lib
from mural import system
from mural import systems
from mural.data import eval_data
from mural.data import pipeline
from mural.data import synthetic
from mural.data import tokenizer as tokenizer_lib
from mural.data import vocab

MAX_NUMBER = 4000
_NUMBER0 = len(tokenizer_lib.RESERVED_TOKENS) + 2  # Id of token '0' (after 'cap', 'x').


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
  path = str(tmp_path_factory.mktemp("vocab") / "vocab.txt")
  tokenizer_lib.save_vocab(list(tokenizer_lib.RESERVED_TOKENS) + ["cap", "x"] +
                           [str(i) for i in range(MAX_NUMBER)], path)
  return tokenizer_lib.Tokenizer(path, max_len=6)


def _numbers(text_ids):
  """The n of each 'cap <n>' row (token 2 of [CLS] cap n [SEP])."""
  return text_ids[:, 2] - _NUMBER0


def _colour(n):
  return np.array([(n * 37) % 200 + 20, (n * 91) % 200 + 20, (n * 53) % 200 + 20], np.uint8)


def _jpeg(n, size=8):
  return tf.io.encode_jpeg(np.tile(_colour(n), (size, size + n % 3, 1)), quality=100).numpy()


def _example(image=None, caption=None, lang=None):
  feature = {}
  for key, value in (("image/encoded", image), ("caption", caption), ("lang", lang)):
    if value is not None:
      value = value.encode() if isinstance(value, str) else value
      feature[key] = tf.train.Feature(bytes_list=tf.train.BytesList(value=[value]))
  return tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString()


def _good(n, lang="en"):
  return _example(_jpeg(n), f"cap {n}", lang)


def _write(path, records):
  with tf.io.TFRecordWriter(str(path)) as w:
    for r in records:
      w.write(r)
  return str(path)


def _config(i2t_sources, t2t_sources=(), batch_size=8, t2t_batch_size=4, **data):
  c = systems.base_config("mural")
  c.tasks.i2t.batch_size, c.tasks.t2t.batch_size = batch_size, t2t_batch_size
  c.data.image_size, c.data.eval_resize = 8, 10
  c.data.shuffle_buffer = 0
  c.tasks.i2t.sources = [dict(s) for s in i2t_sources]
  c.data.autotune = False  # With it, deleting a used iterator can wait up to 60 s (config_lib).
  c.tasks.t2t.sources = [dict(s) for s in t2t_sources]
  for k, v in data.items():
    c.data[k] = v
  systems.validate(c)
  return c


def _iterator(c, tok, **kw):
  """The pipeline of the config's active tasks (MURAL: i2t, and t2t when it has sources)."""
  return pipeline.build_train_iterator(c, system.active_tasks(systems.get(c), c), tok, **kw)


def _take(it, n, task="i2t"):
  return [next(it)[task] for _ in range(n)]


def _tfrecord(path):
  return dict(name="tfrecord", weight=1.0, files=str(path))


def test_language_sampling_formula_hand_values():
  np.testing.assert_allclose(pipeline.language_probabilities([100, 25, 0, 1], 2.0),
                             np.array([10, 5, 0, 1]) / 16)
  np.testing.assert_allclose(pipeline.language_probabilities([3, 1], 1.0), [0.75, 0.25])
  a = pipeline.language_acceptance([100, 25, 0, 1], 2.0)
  q = np.array([100, 25, 0, 1]) / 126
  kept = q * a
  np.testing.assert_allclose(kept / kept.sum(), np.array([10, 5, 0, 1]) / 16)
  assert a.max() == 1.0 and a[2] == 0.0
  np.testing.assert_allclose(pipeline.language_acceptance([5, 7], 1.0), [1.0, 1.0])


def test_batches_fixed_shapes_tokenised_and_paired(tmp_path, tok):
  path = _write(tmp_path / "a.tfrecord", [_good(n, ["en", "de", "zh"][n % 3]) for n in range(24)])
  it = _iterator(_config([_tfrecord(path)]), tok, seed=0)
  seen = []
  for b in _take(it, 3):
    assert set(b) == {"image", "text_ids", "text_mask", "lang", "valid"}
    assert b["image"].shape == (8, 8, 8, 3) and b["image"].dtype == np.float32
    assert b["text_ids"].shape == b["text_mask"].shape == (8, 6) and b["text_ids"].dtype == np.int32
    assert b["text_mask"].dtype == np.int32 and b["lang"].dtype == np.int32
    assert b["valid"].dtype == bool and b["valid"].all()
    numbers = _numbers(b["text_ids"])
    want_ids, want_mask = tok.tokenize(tf.constant([f"cap {n}" for n in numbers]))
    np.testing.assert_array_equal(b["text_ids"], want_ids.numpy())
    np.testing.assert_array_equal(b["text_mask"], want_mask.numpy())
    np.testing.assert_array_equal(b["lang"], [[0, 1, 9][n % 3] for n in numbers])  # en, de, zh.
    for image, n in zip(b["image"], numbers):  # Solid colour -> the same colour after crop/flip.
      np.testing.assert_allclose(image, np.broadcast_to(_colour(n) / 127.5 - 1, image.shape), atol=0.04)
    seen += list(numbers)
  assert seen == list(range(24))  # shuffle_buffer 0: file order, nothing lost.



@pytest.mark.parametrize("autotune", [True, False])
def test_autotune_option_reaches_every_dataset_a_run_iterates(tmp_path, tok, monkeypatch, autotune):
  """Each task's stream, the language counts and the vocab's reader. Off in the CPU configs:
  TF's autotune thread can hold an iterator's deletion up to 60 s (records.run_options)."""
  path = _write(tmp_path / "a.tfrecord", [_good(n, lang) for n, lang in enumerate(["en", "de"] * 4)])
  pairs = _pairs_tsv(tmp_path / "p.tsv", [("cap 1", "cap 2", "en", "de")] * 4)
  c = _config([_tfrecord(path)], [pairs], autotune=autotune, language_sampling_temperature=2.0)
  iterated = []
  as_numpy_iterator = tf.data.Dataset.as_numpy_iterator
  monkeypatch.setattr(tf.data.Dataset, "as_numpy_iterator",
                      lambda ds: iterated.append(ds.options().autotune.enabled) or as_numpy_iterator(ds))
  it = _iterator(c, tok, seed=0)
  assert len(iterated) == 2  # Both tasks' sources counted by language (temperature 2).
  assert [t.dataset().options().autotune.enabled for t in it._tasks] == [autotune, autotune]
  assert len(list(vocab.training_texts(c, system.active_tasks(systems.get(c), c)))) == 8 + 2 * 4
  assert len(iterated) == 4 and set(iterated) == {autotune}


@pytest.mark.parametrize("field,value", [
    ("languages", ["en", "EN"]), ("languages", ["en", "en"]), ("languages", ["en,de"]), ("languages", []),
    ("language_sampling_temperature", 0.0),
    ("shuffle_buffer", -1), ("crop_area_range", (0.0, 1.0)), ("crop_area_range", (0.9, 0.5)),
    ("crop_aspect_range", (2.0, 1.0)), ("max_text_chars", 0), ("num_parallel_calls", 0),
    ("prefetch_batches", -1), ("autotune", None), ("tf_intra_op_threads", -1), ("tf_intra_op_threads", True),
    ("tasks.i2t.sources", [dict(weight=1.0)]),
    ("tasks.t2t.sources", [dict(name="x", weight=0)]), ("tasks.t2t.batch_size", 0),
    ("tasks.i2t.learning_rate", -1.0),
])
def test_validate_rejects_bad_data_and_task_fields(field, value):
  c = systems.base_config("mural")
  if field.startswith("tasks."):
    set_fields(c, **{field: value})
  else:
    c.data[field] = value
  name = field if field.startswith("tasks.") else f"data.{field}"
  with pytest.raises(config_lib.ConfigError, match=re.escape(f"config.{name}")):
    systems.validate(c)


@pytest.mark.parametrize("field", ["data.languages", "data.synthetic.languages"])
def test_a_comma_list_given_to_a_language_tuple_flag_is_an_error_that_shows_the_tuple(field):
  """`--config.data.languages=en,de` reaches the config as the one entry 'en,de', which no
  record's language would match (every record skipped as unknown): the error says so and
  gives the flag that works; that flag's value is accepted."""
  c = systems.base_config("mural")
  section = c.data if field == "data.languages" else c.data.synthetic
  section.languages = ("en,de",)
  with pytest.raises(config_lib.ConfigError) as error:
    systems.validate(c)  # It validates data.synthetic too.
  fix = f"""--config.{field}="('en', 'de')\""""
  assert str(error.value) == f"config.{field}: 'en,de' is one entry, not a list: a flag gives a tuple, e.g. {fix}"
  section.languages = ast.literal_eval(fix.split("=", 1)[1].strip('"'))
  systems.validate(c)
  synthetic.Settings.from_config(c)
  # A bare string (a hand-written value) would read as one code per character.
  with pytest.raises(config_lib.ConfigError, match=f"^config.{field}: must be a tuple of codes, got the string 'en'"):
    config_lib.language_codes("en", field)


def test_every_epoch_is_a_new_permutation(tmp_path, tok):
  path = _write(tmp_path / "a.tfrecord", [_good(n) for n in range(16)])
  it = _iterator(_config([_tfrecord(path)], shuffle_buffer=16), tok, seed=0)
  numbers = np.concatenate([_numbers(b["text_ids"]) for b in _take(it, 6)]).reshape(3, 16)
  for epoch in numbers:
    assert sorted(epoch) == list(range(16))
  assert len({tuple(e) for e in numbers}) == 3 and list(numbers[0]) != list(range(16))


def test_bad_records_skipped_and_counted_exactly(tmp_path, tok):
  png = tf.io.encode_png(np.full((16, 16, 3), 9, np.uint8)).numpy()
  bad = [
      _example(_jpeg(1)[:60], "cap 1", "en"),  # Truncated JPEG -> undecodable_image.
      _example(b"<html>404</html>", "cap 1", "en"),  # Not an image.
      _example(_jpeg(1), "", "en"),  # Empty caption.
      _example(_jpeg(1), None, "en"),  # No caption field -> '' -> empty_text.
      _example(_jpeg(1), "   ", "de"),  # Whitespace only -> empty_text.
      _example(_jpeg(1), "cap 1", "xx"),  # Unknown language.
      _example(_jpeg(1), "cap 1", None),  # No lang field -> unknown_language.
      _example(_jpeg(1), "", "xx"),  # Two problems: the first reason counts, once.
      _example(png[:40] + bytes(30) + png[70:], "cap 1", "en"),  # PNG, bad CRC -> undecodable_image.
      _example(None, "cap 1", "en"),  # No image field.
      _example(_jpeg(1), "cap 1 " + "x " * 40, "en"),  # 86 chars > max_text_chars 50.
  ]
  good = [_good(n, "de" if n % 2 else "en") for n in range(100, 124)]
  records = good[:5] + bad[:6] + good[5:17] + bad[6:] + good[17:]  # The last record is good.
  path = _write(tmp_path / "mixed.tfrecord", records)
  it = _iterator(_config([_tfrecord(path)], max_text_chars=50), tok, seed=0)
  assert set(it.skip_counts().values()) == {0}
  numbers = np.concatenate([_numbers(b["text_ids"]) for b in _take(it, 3)])
  assert list(numbers) == list(range(100, 124))  # Every good record, once, in order.
  assert it.skip_counts() == {"i2t/unknown_language": 3, "i2t/empty_text": 3, "i2t/long_text": 1,
                              "i2t/missing_image": 1, "i2t/not_an_image": 1, "i2t/undecodable_image": 2}
  # The second epoch counts the same records again.
  _take(it, 3)
  assert sum(it.skip_counts().values()) == 2 * len(bad)


def test_unusable_sources_fail_clearly(tmp_path, tok, monkeypatch):
  with pytest.raises(ValueError, match="no file matches"):
    _iterator(_config([_tfrecord(tmp_path / "absent-*.tfrecord")]), tok)
  with pytest.raises(ValueError, match=re.escape("config.tasks.i2t.sources[0]: unknown image_text source 'nope'")):
    _iterator(_config([dict(name="nope", weight=1.0)]), tok)
  path = _write(tmp_path / "good.tfrecord", [_good(n) for n in range(8)])
  with pytest.raises(ValueError, match="batch_size: 8 is not divisible by process_count 3"):
    _iterator(_config([_tfrecord(path)]), tok, process_index=0, process_count=3)
  with pytest.raises(ValueError, match="no records on process 0"):
    _iterator(_config([_tfrecord(_write(tmp_path / "empty.tfrecord", []))]), tok)
  # Every record in a language outside data.languages: an error, not an endless spin.
  monkeypatch.setattr(pipeline, "MAX_CONSECUTIVE_SKIPS", 50)
  path = _write(tmp_path / "klingon.tfrecord", [_good(n, "tlh") for n in range(8)])
  it = _iterator(_config([_tfrecord(path)]), tok)
  with pytest.raises(ValueError, match=re.escape(
      "config.tasks.i2t.sources[0] ('tfrecord'): 50 records in a row were skipped (so far, by "
      "reason: unknown_language ") + r"\d+\), so it has no usable records"):
    next(it)


@pytest.mark.parametrize("num_files", [1, 4])
def test_processes_read_disjoint_parts_that_cover_the_source(tmp_path, tok, num_files):
  for f in range(num_files):
    _write(tmp_path / f"part-{f}.tfrecord", [_good(n) for n in range(f, 32, num_files)])
  src = _tfrecord(tmp_path / "part-*.tfrecord")
  parts = []
  for p in range(2):
    it = _iterator(_config([src], shuffle_buffer=64), tok, process_index=p,
                                       process_count=2)
    batches = _take(it, 4)  # 4 x (8 / 2) = 16 = this process's half.
    assert batches[0]["image"].shape[0] == 4
    parts.append(set(np.concatenate([_numbers(b["text_ids"]) for b in batches]).tolist()))
    assert it.get_state()["tasks"]["i2t"]["sources"][0]["epoch"] == 0
  assert len(parts[0]) == len(parts[1]) == 16
  assert not parts[0] & parts[1]
  assert parts[0] | parts[1] == set(range(32))


def _pairs_tsv(path, rows):
  with open(path, "w") as f:
    f.write("left\tright\tleft_lang\tright_lang\n")
    for r in rows:
      f.write("\t".join(r) + "\n")
  return dict(name="pairs_tsv", weight=1.0, files=str(path))


def test_text_pairs_batch(tmp_path, tok):
  rows = [(f"cap {n}", f"cap {n + 1000}", "en", "de") for n in range(12)]
  rows.insert(3, ("", "cap 5", "en", "de"))
  rows.insert(7, ("cap 5", "cap 6", "en", "xx"))
  src = _pairs_tsv(tmp_path / "pairs.tsv", rows)
  it = _iterator(_config([_tfrecord(_write(tmp_path / "a.tfrecord", [_good(0)]))],
                                             [src]), tok)
  lefts = []
  for b in _take(it, 3, task="t2t"):
    assert b["left_ids"].shape == b["right_ids"].shape == b["left_mask"].shape == (4, 6)
    assert b["valid"].dtype == bool and b["valid"].all()
    np.testing.assert_array_equal(_numbers(b["right_ids"]), _numbers(b["left_ids"]) + 1000)
    want, mask = tok.tokenize(tf.constant([f"cap {n}" for n in _numbers(b["left_ids"])]))
    np.testing.assert_array_equal(b["left_ids"], want.numpy())
    np.testing.assert_array_equal(b["left_mask"], mask.numpy())
    lefts += list(_numbers(b["left_ids"]))
  assert lefts == list(range(12))
  counts = it.skip_counts()
  assert {k: v for k, v in counts.items() if k.startswith("t2t/")} == {
      "t2t/unknown_language": 1, "t2t/empty_text": 1, "t2t/long_text": 0}
  # No t2t batch when the t2t task is off.
  c = _config([_tfrecord(_write(tmp_path / "b.tfrecord", [_good(0)]))], [src])
  c.tasks.t2t.weight = 0.0
  assert set(next(_iterator(c, tok))) == {"i2t"}


def _resume_config(tmp_path):
  en = [_good(n, "en") for n in range(40)] + [_example(b"junk", "cap 1", "en")]
  de = [_good(n, "de") for n in range(200, 215)] + [_example(_jpeg(3), "", "de")]
  fr = [_good(n, "fr") for n in range(300, 305)]
  a = _write(tmp_path / "a.tfrecord", en[:20] + fr + en[20:])
  b = _write(tmp_path / "b.tfrecord", de)
  src_a, src_b = _tfrecord(a), dict(_tfrecord(b), weight=0.5)
  pairs = _pairs_tsv(tmp_path / "p.tsv", [(f"cap {n}", f"cap {n}", "en", "de") for n in range(9)] +
                     [(f"cap {n}", f"cap {n}", "en", "fr") for n in range(3)])
  return _config([src_a, src_b], [pairs], shuffle_buffer=8, language_sampling_temperature=2.0)


def test_resume_from_state_gives_identical_batches(tmp_path, tok):
  c = _resume_config(tmp_path)
  it = _iterator(c, tok, seed=5)
  _take(it, 7)  # Several epochs of the small sources, both tasks.
  state = json.loads(json.dumps(it.get_state()))
  counts = it.skip_counts()
  assert counts["i2t/not_an_image"] >= 1 and counts["i2t/empty_text"] >= 1
  reference = [next(it) for _ in range(5)]

  resumed = _iterator(c, tok, seed=5)
  resumed.set_state(state)
  assert resumed.skip_counts() == counts
  for want, got in zip(reference, [next(resumed) for _ in range(5)]):
    assert set(want) == set(got) == {"i2t", "t2t"}
    for task in want:
      assert set(want[task]) == set(got[task])
      for k in want[task]:
        np.testing.assert_array_equal(want[task][k], got[task][k], err_msg=f"{task}/{k}")
  assert resumed.skip_counts() == it.skip_counts()
  assert resumed.get_state() == it.get_state()

  other_seed = dict(state, fingerprint=dict(state["fingerprint"], seed=6))
  with pytest.raises(ValueError, match="different input setup"):
    resumed.set_state(other_seed)


def test_language_temperature_sampling_frequencies(tmp_path, tok):
  counts = {"en": 300, "de": 60, "fr": 15}
  records, n = [], 0
  for lang, k in counts.items():
    for _ in range(k):
      records.append(_good(n % MAX_NUMBER, lang))
      n += 1
  path = _tfrecord(_write(tmp_path / "langs.tfrecord", records))
  index = {"en": 0, "de": 1, "fr": 2}
  # T = 1: the natural mix, exactly, epoch by epoch (5 batches of 75 = one epoch).
  it = _iterator(_config([path], batch_size=75, shuffle_buffer=500), tok)
  langs = np.concatenate([b["lang"] for b in _take(it, 5)])
  assert [int(np.sum(langs == index[l])) for l in counts] == [300, 60, 15]
  # T = 2: p_l ∝ sqrt(n_l); 3000 draws, binomial sd <= 0.009.
  it = _iterator(
      _config([path], batch_size=100, shuffle_buffer=500, language_sampling_temperature=2.0), tok)
  langs = np.concatenate([b["lang"] for b in _take(it, 30)])
  freq = np.array([np.mean(langs == index[l]) for l in counts])
  want = np.sqrt(list(counts.values())) / np.sqrt(list(counts.values())).sum()
  np.testing.assert_allclose(freq, want, atol=0.035)


def test_source_mixture_weights(tmp_path, tok):
  a = _tfrecord(_write(tmp_path / "en.tfrecord", [_good(n, "en") for n in range(50)]))
  b = dict(_tfrecord(_write(tmp_path / "de.tfrecord", [_good(n, "de") for n in range(50)])), weight=1 / 3)
  it = _iterator(_config([a, b], batch_size=100, shuffle_buffer=50), tok)
  langs = np.concatenate([b["lang"] for b in _take(it, 20)])
  assert abs(np.mean(langs == 0) - 0.75) < 0.03


# ---- The synthetic source and the eval sets ---------------------------------


def _synthetic_config(**synthetic_fields):
  c = systems.base_config("mural")
  c.tasks.i2t.batch_size, c.tasks.t2t.batch_size = 8, 8
  c.data.image_size, c.data.eval_resize = 16, 18
  c.data.shuffle_buffer = 0
  s = c.data.synthetic
  s.default_pairs, s.translation_pairs, s.eval_scenes = 40, 40, 6
  c.data.autotune = False  # With it, deleting a used iterator can wait up to 60 s (config_lib).
  for k, v in synthetic_fields.items():
    s[k] = v
  if "render_size" in s:
    s.render_size = 16
  return c


def test_synthetic_source_batches_and_resume(tok):
  c = _synthetic_config()
  it = _iterator(c, tok, seed=1)
  b = next(it)
  assert b["i2t"]["image"].shape == (8, 16, 16, 3) and b["t2t"]["left_ids"].shape == (8, 6)
  assert b["i2t"]["image"].min() >= -1 and b["i2t"]["image"].max() <= 1
  assert set(b["i2t"]["lang"]) <= set(range(len(c.data.synthetic.languages)))
  _take(it, 2)
  state = it.get_state()
  want = next(it)
  resumed = _iterator(c, tok, seed=1)
  resumed.set_state(state)
  got = next(resumed)
  for task in want:
    for k in want[task]:
      np.testing.assert_array_equal(want[task][k], got[task][k], err_msg=f"{task}/{k}")


def test_synthetic_eval_sets(tok):
  c = _synthetic_config()
  sets, translations = eval_data.build_eval_sets(c, tok)
  assert [s.name for s in sets] == [l for l in c.data.synthetic.languages if l in c.data.languages]
  for s in sets:
    assert s.images.shape == (6, 16, 16, 3) and s.images.dtype == np.float32
    assert s.text_ids.shape[0] == s.text_mask.shape[0] == s.text_to_image.shape[0] >= 6
    assert s.text_ids.shape[1] == 6 and s.text_to_image.dtype == np.int32
    assert set(s.text_to_image) == set(range(6))
  assert translations and all(t.left_ids.shape == t.right_ids.shape == (6, 6) for t in translations)
  again, _ = eval_data.build_eval_sets(c, tok)
  np.testing.assert_array_equal(again[0].images, sets[0].images)


def test_flickr8k_eval_sets(tok, flickr8k_dir):
  c = _synthetic_config()
  c.data.image_size, c.data.eval_resize = 32, 36
  c.data.eval_source = dict(name="flickr8k", path=flickr8k_dir, max_images=6)
  sets, translations = eval_data.build_eval_sets(c, tok)
  assert translations == [] and sets and sets[0].name == "en"
  for s in sets:
    assert s.images.shape == (6, 32, 32, 3) and s.images.dtype == np.float32
    assert -1 <= s.images.min() and s.images.max() <= 1 and s.images.std() > 0.05
    assert s.text_ids.shape == (len(s.text_to_image), 6)
    assert s.text_to_image.max() < 6
  for bad in (-3, 2.5):
    c.data.eval_source = dict(name="flickr8k", path=flickr8k_dir, max_images=bad)
    with pytest.raises(ValueError, match="max_images: must be an int >= 0"):
      eval_data.build_eval_sets(c, tok)


def test_multi30k_eval_translations_beside_the_eval_source(tok, multi30k_dir):
  """Multi30k's test captions, line-aligned: a set per pair of data.languages among its four,
  named apart from the eval source's own; bad fields are one-line errors naming them."""
  from mural.data import multi30k  # pylint: disable=g-import-not-at-top
  c = _synthetic_config()
  c.data.eval_translations = dict(name="multi30k", split="test", path=multi30k_dir, max_pairs=5)
  _, translations = eval_data.build_eval_sets(c, tok)
  names = [t.name for t in translations]
  assert names[-6:] == ["multi30k:en-de", "multi30k:en-fr", "multi30k:en-cs", "multi30k:de-fr", "multi30k:de-cs",
                        "multi30k:fr-cs"]
  assert names[:-6] and all(":" not in n for n in names[:-6])  # The synthetic source's own pairs stay.
  by_name = dict(zip(names, translations))  # A language's arrays, tokenized once, shared by its pairs.
  assert by_name["multi30k:en-fr"].left_ids is by_name["multi30k:en-de"].left_ids
  assert by_name["multi30k:de-fr"].right_ids is by_name["multi30k:en-fr"].right_ids
  test = multi30k.task1("test", ("en", "fr"), multi30k_dir).captions
  en_fr = translations[names.index("multi30k:en-fr")]
  for ids, mask, lang in ((en_fr.left_ids, en_fr.left_mask, "en"), (en_fr.right_ids, en_fr.right_mask, "fr")):
    want = tok.tokenize(tf.constant(test[lang][:5]))
    np.testing.assert_array_equal(ids, want[0].numpy())
    np.testing.assert_array_equal(mask, want[1].numpy())
  for fields, message in ((dict(max_pairs=-1), "eval_translations.max_pairs: must be an int >= 0"),
                          (dict(name="wmt"), r"eval_translations.name: 'wmt' not in \['multi30k', 'records'\]"),
                          (dict(lines=3), r"eval_translations \('multi30k'\): unknown field\(s\) \['lines'\]"),
                          (dict(split="test_2017_flickr"), "has no 'cs' captions")):
    c.data.eval_translations = dict(dict(name="multi30k", path=multi30k_dir), **fields)
    with pytest.raises(ValueError, match=message):
      eval_data.build_eval_sets(c, tok)
  c.data.eval_translations = dict(name="multi30k", path=multi30k_dir)
  c.data.languages = ("en", "ja")
  with pytest.raises(ValueError, match="hold fewer than two"):
    eval_data.build_eval_sets(c, tok)


def test_held_out_records_in_any_training_format_are_eval_sets(tok, tmp_path, caplog):
  """eval_source 'records': a training source's records; one image per distinct image bytes, its
  captions per language in record order; other languages and empty captions skipped and counted;
  eval_translations 'records': a set per language pair of a pairs file."""
  records = [_example(_jpeg(0), "cap 0", "en"), _example(_jpeg(1), "cap 1", "EN "), _example(_jpeg(0), "cap 2", "de"),
             _example(_jpeg(2), "cap 3", "fr"), _example(_jpeg(1), " ", "en"), _example(_jpeg(2), "cap 4", "de")]
  files = _write(tmp_path / "heldout.tfrecord", records)
  c = _synthetic_config()
  c.data.languages = ("en", "de", "sw")
  c.data.eval_source = dict(name="records", source=dict(name="tfrecord", files=files))
  (tmp_path / "pairs.tsv").write_text("left\tright\tleft_lang\tright_lang\ncap 5\tcap 6\ten\tde\n"
                                      "cap 7\tcap 8\tde\tsw\ncap 9\tcap 10\ten\tde\ncap 11\tcap 12\ten\tja\n")
  c.data.eval_translations = dict(name="records", source=dict(name="pairs_tsv", files=str(tmp_path / "pairs.tsv")))
  with caplog.at_level("INFO"):
    sets, translations = eval_data.build_eval_sets(c, tok)
  want_images = eval_data.eval_images([tf.io.decode_jpeg(_jpeg(n)).numpy() for n in (0, 1, 2)], c.data)
  assert [s.name for s in sets] == ["en", "de"]
  for s, numbers, images in ((sets[0], [0, 1], [0, 1]), (sets[1], [2, 4], [0, 2])):
    np.testing.assert_array_equal(s.images, want_images)
    assert list(_numbers(s.text_ids)) == numbers and list(s.text_to_image) == images
  log = caplog.text
  assert "3 images" in log and "'unknown_language': 1" in log and "'empty_text': 1" in log and "'fr': 1" in log
  assert "no caption in ['sw']" in log
  assert [t.name for t in translations] == ["pairs:de-sw", "pairs:en-de"]
  assert list(_numbers(translations[1].left_ids)) == [5, 9] and list(_numbers(translations[1].right_ids)) == [6, 10]
  assert list(_numbers(translations[0].left_ids)) == [7] and list(_numbers(translations[0].right_ids)) == [8]
  c.data.eval_source = dict(name="records", source=dict(name="tfrecord", files=files), max_images=2)
  sets, _ = eval_data.build_eval_sets(c, tok)
  assert sets[0].images.shape[0] == 2 and list(_numbers(sets[1].text_ids)) == [2]  # Image 2's caption dropped.


def test_a_held_out_fraction_of_one_file_splits_it_by_image_for_training_and_evaluation(tok, tmp_path):
  """holdout=0.25 on a source: training (pipeline and vocabulary) reads the other side of a split by
  the image's bytes, evaluation ('records' with the same source dict) the held-out side: disjoint,
  whole, an image's captions on one side, the same split every time."""
  from mural.data import records  # pylint: disable=g-import-not-at-top
  from mural.data import sources  # pylint: disable=g-import-not-at-top
  from mural.data import training_text  # pylint: disable=g-import-not-at-top
  path = _write(tmp_path / "all.tfrecord", [_example(_jpeg(n % 60), f"cap {n}", "en") for n in range(120)])
  source = dict(name="tfrecord", files=path, holdout=0.25)
  ds = sources.image_text_source(source, "train")
  sides = {}
  for held_out in (True, False):
    side = records.holdout_side(ds, "image", 0.25, held_out)
    sides[held_out] = sorted(int(r["caption"].split()[1]) for r in side.as_numpy_iterator())
    assert sides[held_out] == sorted(int(r["caption"].split()[1]) for r in side.as_numpy_iterator())
  assert sorted(sides[True] + sides[False]) == list(range(120))
  assert not {n % 60 for n in sides[True]} & {n % 60 for n in sides[False]}  # By image.
  assert 5 <= len({n % 60 for n in sides[True]}) <= 25  # About a quarter of the 60 images.

  c = _config([source], batch_size=4)
  trained = [int(n) for b in _take(_iterator(c, tok, seed=0), 30) for n in _numbers(b["text_ids"])]
  assert set(trained) == set(sides[False])  # 120 draws: an epoch of training's side, and no other.
  task = system.active_tasks(systems.get(c), c)
  texts = [r["caption"].decode() for _, r in training_text.training_records(c, task)]
  assert sorted(int(t.split()[1]) for t in texts) == sides[False]
  c.data.languages = ("en",)
  c.data.eval_source = dict(name="records", source=source)
  (evaluated,), _ = eval_data.build_eval_sets(c, tok)
  assert sorted(_numbers(evaluated.text_ids)) == sides[True]
  for bad in (1.0, -0.1, True, "0.1"):
    c.tasks.i2t.sources = [dict(source, holdout=bad)]
    with pytest.raises(ValueError, match=r"config.tasks.i2t.sources\[0\].holdout: the fraction"):
      _iterator(c, tok, seed=0)


def test_held_out_records_that_cannot_make_an_eval_set_are_one_line(tok, tmp_path):
  c = _synthetic_config()
  c.data.languages = ("en", "de")
  only_fr = _write(tmp_path / "fr.tfrecord", [_example(_jpeg(0), "cap 0", "fr")])
  broken = _write(tmp_path / "broken.tfrecord", [_good(0), _example(b"not an image", "cap 1", "en")])
  for source, message in (
      (None, r"eval_source.source: a data source's dict"),
      (dict(name="tfrecord", files=only_fr), r"no record of 'tfrecord' has a caption in config.data.languages "
                                             r"\['en', 'de'\] \(languages seen: \['fr'\]\)"),
      (dict(name="tfrecord", files=broken), r"the image of record 1 of 'tfrecord' cannot be decoded: not a JPEG/PNG file"),
      (dict(name="synthetic"), "is endless"),
      (dict(name="tfrecord", files=str(tmp_path / "none-*.tfrecord")), "no file matches"),
      (dict(name="tfrecord", files=only_fr, holdout=0.01), r"'tfrecord' has no record in its held-out 0.01 \(too few")):
    c.data.eval_source = dict(name="records", source=source)
    with pytest.raises(ValueError, match=message):
      eval_data.build_eval_sets(c, tok)
  c.data.eval_source = dict(name="synthetic")
  (tmp_path / "ja.tsv").write_text("cap 1\tcap 2\ten\tja\n")
  c.data.eval_translations = dict(name="records", source=dict(name="pairs_tsv", files=str(tmp_path / "ja.tsv")))
  with pytest.raises(ValueError, match=r"no pair of 'pairs_tsv' is between two languages .* \(languages seen "
                                       r"outside them: \['ja'\]\)"):
    eval_data.build_eval_sets(c, tok)


_EXIT_SCRIPT = """
import sys
from mural import system, systems
from mural.data import pipeline, tokenizer
tokenizer.save_vocab(list(tokenizer.RESERVED_TOKENS) + ["a"], sys.argv[1])
c = systems.base_config("align")
c.tasks.i2t.batch_size = 64
c.data.image_size = c.data.synthetic.render_size = 64
tasks = system.active_tasks(systems.get(c), c)
it = pipeline.build_train_iterator(c, tasks, tokenizer.Tokenizer(sys.argv[1], 6))
next(it)
print("done")
"""


def test_process_exits_with_a_live_iterator(tmp_path):
  # tf.data threads busy in the synthetic source's numpy_function at exit hung
  # the interpreter (about every second run without pipeline's atexit hook).
  repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  env = dict(os.environ, PYTHONPATH=repo, TF_CPP_MIN_LOG_LEVEL="2")
  out = subprocess.run([sys.executable, "-c", _EXIT_SCRIPT, str(tmp_path / "v.txt")], cwd=repo, env=env,
                       capture_output=True, text=True, timeout=120)
  assert out.returncode == 0, out.stderr[-2000:]
  assert out.stdout.strip().endswith("done")


def _reference_counts(status, keep, skips):
  """The skip count one record at a time: (position, running counts) of each emitted record."""
  counts, out = np.array(skips, np.int64), []
  for i, (s, k) in enumerate(zip(status, keep)):
    if k and s:
      counts[s - 1] += 1
    elif k:  # Thinned records (k False) are neither counted nor emitted.
      out.append((i, counts.copy()))
  return out


def _longest_run(status, keep):
  run = best = 0
  for s, k in zip(status, keep):
    if k:
      run = run + 1 if s else 0
      best = max(best, run)
  return best


@pytest.mark.parametrize("seed", [0, 1])
def test_chunked_skip_count_matches_a_record_by_record_count(seed, monkeypatch):
  """_counted works on chunks of records; across chunk edges it equals a record-by-record
  running count, drops skipped and thinned records, and fails once a run reaches the limit."""
  rng = np.random.default_rng(seed)
  n, skips = 3 * pipeline._CHUNK + 17, [1, 0, 2, 0, 0, 5]
  status = np.where(rng.random(n) < 0.4, rng.integers(1, len(pipeline.SKIP_REASONS) + 1, n), 0)
  status[70:150] = np.where(rng.random(80) < 0.05, 0, 3)  # Long runs across a chunk edge.
  keep = rng.random(n) < 0.8
  records = tf.data.Dataset.from_tensor_slices(dict(
      status=tf.constant(status, tf.int32), _keep=tf.constant(keep), _pos=tf.range(n, dtype=tf.int64),
      lang_key=tf.zeros([n], tf.int32), _seed=tf.zeros([n, 2], tf.int64)))
  run = lambda: list(pipeline._counted(records, 3, skips).as_numpy_iterator())

  expected = _reference_counts(status, keep, skips)
  got = run()
  assert [int(r["_pos"]) for r in got] == [i for i, _ in expected]
  np.testing.assert_array_equal(np.stack([r["_skips"] for r in got]), np.stack([c for _, c in expected]))
  assert all(int(r["_source"]) == 3 and set(r) == {"_pos", "_skips", "_source"} for r in got)

  longest = _longest_run(status, keep)
  assert longest > 5
  monkeypatch.setattr(pipeline, "MAX_CONSECUTIVE_SKIPS", longest + 1)
  assert len(run()) == len(expected)
  monkeypatch.setattr(pipeline, "MAX_CONSECUTIVE_SKIPS", longest)
  with pytest.raises(tf.errors.InvalidArgumentError, match=re.escape(f"{pipeline._SKIP_LIMIT} 3, counts:")):
    run()
