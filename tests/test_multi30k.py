"""Multi30k on the real release: counts, alignment, comparable pairs, the t2t source."""

import itertools
import re

import pytest

from mural.data import multi30k
from mural.data import sources

# Hand-checked lines of the release (task1 train line 1 and 29000, test_2016 line 1000).
TRAIN_FIRST = {
    "en": "Two young, White males are outside near many bushes.",
    "de": "Zwei junge weiße Männer sind im Freien in der Nähe vieler Büsche.",
    "fr": "Deux jeunes hommes blancs sont dehors près de buissons.",
    "cs": "Dva mladí bílí muži jsou venku poblíž mnoha keřů.",
}
TRAIN_LAST_CS = "Muž v šortkách a hawajské košili se naklání přes zábradlí pilotní lodi a na pozadí je hora v mlze."
TEST_LAST_FR = "Une fille au bord d'une plage avec une montagne au loin."
VAL_FIRST_TASK2 = {
    "en": ["A group of people stand in the back of a truck filled with cotton.",
           "Men are standing on and about a truck carrying a white substance.",
           "A group of people are standing on a pile of wool in a truck.",
           "A group of men are loading cotton onto a truck",
           "Workers load sheared wool onto a truck."],
    "de": ["Baumwolllager mit LKW", "Ein beladener LKW mit Menschen auf der Ladung.",
           "die Menschen laden Baumwolle oder Schafswolle auf  den LKW",
           "Die Männer stehen auf und vor dem Lastwagen mit der Baumwolle.",
           "Bauarbeiter arbeiten auf einer Baustelle mit weißem Material."],
}


@pytest.fixture(scope="module")
def train(multi30k_dir):
  return multi30k.task1("train", path=multi30k_dir)


def test_task1_line_counts(multi30k_dir, train):
  assert len(train.images) == 29000 and train.images[0] == "1000092795.jpg" and train.images[-1] == "998845445.jpg"
  assert {lang: len(c) for lang, c in train.captions.items()} == {lang: 29000 for lang in multi30k.LANGUAGES}
  for split, n in (("val", 1014), ("test", 1000), ("test_2016_flickr", 1000)):
    t = multi30k.task1(split, path=multi30k_dir)
    assert len(t.images) == n and all(len(c) == n for c in t.captions.values()), split
    assert set(t.captions) == {"en", "de", "fr", "cs"}
  assert {lang: c[0] for lang, c in train.captions.items()} == TRAIN_FIRST
  assert train.captions["cs"][-1] == TRAIN_LAST_CS
  assert multi30k.task1("test", ("fr",), path=multi30k_dir).captions["fr"][-1] == TEST_LAST_FR


def test_translation_pairs_for_every_language_pair_are_aligned(multi30k_dir, train):
  pairs = multi30k.all_translation_pairs("train", path=multi30k_dir)
  assert set(pairs) == set(itertools.combinations(("en", "de", "fr", "cs"), 2))
  for (a, b), p in pairs.items():
    assert (p.left_lang, p.right_lang, len(p)) == (a, b, 29000)
    assert (p.left[0], p.right[0]) == (TRAIN_FIRST[a], TRAIN_FIRST[b])
    assert p.left == train.captions[a] and p.right == train.captions[b] and p.image == train.images
  de_cs = multi30k.translation_pairs("train", "de", "cs", path=multi30k_dir)
  assert (de_cs.left[0], de_cs.right[-1]) == (TRAIN_FIRST["de"], TRAIN_LAST_CS)


def test_comparable_pairs_are_the_5x5_same_image_captions(multi30k_dir):
  t2 = multi30k.task2("val", path=multi30k_dir)
  assert len(t2.images) == 1014 and all(len(c) == 5 for lang in ("en", "de") for c in t2.captions[lang])
  assert t2.images[0] == "1018148011.jpg"
  assert t2.captions["en"][0] == VAL_FIRST_TASK2["en"] and t2.captions["de"][0] == VAL_FIRST_TASK2["de"]
  p = multi30k.comparable_pairs("val", path=multi30k_dir)
  assert (p.left_lang, p.right_lang, len(p)) == ("en", "de", 1014 * 25)
  first = set(zip(p.left[:25], p.right[:25]))
  assert first == set(itertools.product(VAL_FIRST_TASK2["en"], VAL_FIRST_TASK2["de"]))
  assert set(p.image[:25]) == {"1018148011.jpg"} and p.image[25] == t2.images[1]
  # Same images as task 1 (task 2 captions are comparable, not translations).
  assert t2.images == multi30k.task1("val", ("en",), path=multi30k_dir).images
  assert len(multi30k.task2("train", ("de",), path=multi30k_dir).captions["de"]) == 29000


def _rows(ds):
  """(left, right, left_lang, right_lang) of every element, in order (read in batches: element by
  element, Python's iteration cost more than the pipeline)."""
  keys = ("left", "right", "left_lang", "right_lang")
  return [tuple(x.decode() for x in row) for b in ds.batch(4096).as_numpy_iterator()
          for row in zip(*(b[k] for k in keys))]


def test_text_pair_source_translations(multi30k_dir):
  cfg = dict(name="multi30k", weight=1.0, path=multi30k_dir, languages=["en", "de", "fr"])
  rows = _rows(sources.TEXT_PAIR_SOURCES["multi30k"](cfg, "val", 0, 1))
  assert len(rows) == 1014 * 3
  val = multi30k.task1("val", ("en", "de", "fr"), path=multi30k_dir)
  assert rows[:3] == [(val.captions[a][0], val.captions[b][0], a, b) for a, b in (("en", "de"), ("en", "fr"), ("de", "fr"))]
  rows = _rows(multi30k.text_pair_source(dict(path=multi30k_dir, language_pairs=["en-cs"]), "test", 0, 1))
  assert len(rows) == 1000 and rows[-1][1:] == ("Dívka na břehu pláže s horami v dáli.", "en", "cs")


def test_text_pair_source_sharding_and_comparable(multi30k_dir):
  cfg = dict(path=multi30k_dir, kinds=["translation", "comparable"], languages=["en", "de"])
  everything = _rows(multi30k.text_pair_source(cfg, "val", 0, 1))
  assert len(everything) == 1014 * (1 + 25)
  assert sum(r[2:] == ("en", "de") for r in everything) == len(everything)
  parts = [_rows(multi30k.text_pair_source(cfg, "val", p, 2)) for p in range(2)]
  assert len(parts[0]) == 507 * 26 and len(parts[1]) == 507 * 26
  assert sorted(parts[0] + parts[1]) == sorted(everything)
  # Process p holds images p, p + 2, ...: each image's translation, then its 25 comparable pairs.
  t1, t2 = multi30k.task1("val", ("en", "de"), path=multi30k_dir), multi30k.task2("val", path=multi30k_dir)
  for p in range(2):
    expected = []
    for i in range(p, 1014, 2):
      expected.append((t1.captions["en"][i], t1.captions["de"][i], "en", "de"))
      expected += [(en, de, "en", "de") for en, de in itertools.product(t2.captions["en"][i], t2.captions["de"][i])]
    assert parts[p] == expected


def test_bad_config_and_missing_data_are_clear_errors(multi30k_dir, tmp_path, monkeypatch):
  with pytest.raises(ValueError, match="test_2017_flickr.cs.gz"):
    multi30k.task1("test_2017_flickr", path=multi30k_dir)
  with pytest.raises(ValueError, match="unknown split 'tset'"):
    multi30k.task1("tset", path=multi30k_dir)
  with pytest.raises(ValueError, match="kinds"):
    multi30k.text_pair_source(dict(path=multi30k_dir, kinds=["bitext"]), "val", 0, 1)
  with pytest.raises(ValueError, match="'en-ru'"):
    multi30k.text_pair_source(dict(path=multi30k_dir, language_pairs=["en-ru"]), "val", 0, 1)
  missing = str(tmp_path / "no_multi30k")
  with pytest.raises(ValueError, match=re.escape(missing)):
    multi30k.text_pair_source(dict(path=missing), "val", 0, 1)
  monkeypatch.setenv(multi30k.ENV_VAR, missing)
  with pytest.raises(ValueError, match=re.escape(missing) + r".*\$MURAL_MULTI30K_DIR"):
    multi30k.task1("val")
