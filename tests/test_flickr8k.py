"""Flickr8k in the release's layout, on the real files (the 875-photo subset) and on a small release
written here: captions, the image-text source, eval data, the subset tool, converter round trip."""

import collections
import csv
import os
import re
import shutil

import numpy as np
import pytest
import tensorflow as tf

from mural.data import convert
from mural.data import flickr8k
from mural.data import flickr8k_subset
from mural.data import sources

from conftest import TEST_DATA

# Counted from flickr8k_1k/captions.tsv once by hand (awk) for these tests.
COUNTS = {
    "train": dict(en=7995, de=4230, zh=3765, ar=2259, fr=705, cs=705),
    "dev": dict(en=1207, de=642, zh=565, ar=339, fr=107, cs=107),
    "none": dict(en=93, de=48, zh=45, ar=27, fr=8, cs=8),
}
IMAGES = dict(train=753, dev=113, none=9)


@pytest.fixture(scope="module")
def rows(flickr8k_dir):
  return flickr8k.read_captions(flickr8k_dir)


def test_the_release_files_give_the_curated_captions(flickr8k_dir, rows):
  """flickr8k_1k/captions.tsv lists the captions of its 875 photos, gathered when the subset was made
  from the same releases: read from the release's files, every row is there, in its order."""
  with open(TEST_DATA / "flickr8k_1k" / "captions.tsv", encoding="utf-8", newline="") as f:
    reader = csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE)
    assert tuple(next(reader)) == ("image", "flickr8k_split", "lang", "source", "kind", "caption")
    curated = [tuple(r) for r in reader]
  assert [(r.image, r.split, r.lang, r.source, r.kind, r.caption) for r in rows] == curated


def test_captions(flickr8k_dir, rows):
  assert len(rows) == 22855
  assert len({r.image for r in rows}) == 875 == len(os.listdir(flickr8k.photo_dir(flickr8k_dir)))
  got = collections.Counter((r.split, r.lang) for r in rows)
  assert got == collections.Counter({(s, lang): n for s, c in COUNTS.items() for lang, n in c.items()})
  for split, n in IMAGES.items():
    assert len({r.image for r in rows if r.split == split}) == n
  assert rows[0].caption == "A child in a pink dress is climbing up a set of stairs in an entry way ."
  # Quotes are text, not CSV quoting.
  assert any(r.caption == 'Young boy with a black "ADHD" t-shirt nodding off' for r in rows)
  assert flickr8k.select(rows, "val", ["fr"]) == flickr8k.select(rows, "dev", ["fr"])


def _elements(ds):
  return [(e["image"], e["caption"].decode(), e["lang"].decode()) for e in ds.as_numpy_iterator()]


def test_image_text_source_dev_counts_and_bytes(flickr8k_dir, rows):
  got = _elements(sources.IMAGE_TEXT_SOURCES["flickr8k"](dict(name="flickr8k", path=flickr8k_dir), "dev", 0, 1))
  assert collections.Counter(lang for _, _, lang in got) == collections.Counter(COUNTS["dev"])
  dev = flickr8k.select(rows, "dev")
  assert [(c, lang) for _, c, lang in got] == [(r.caption, r.lang) for r in dev]
  for (image, _, _), r in list(zip(got, dev))[::200]:
    with open(os.path.join(flickr8k.photo_dir(flickr8k_dir), r.image), "rb") as f:
      assert image == f.read() and image[:3] == b"\xff\xd8\xff"
  assert tf.io.decode_jpeg(got[0][0]).shape[2] == 3


def test_image_text_source_languages_sources_and_sharding(flickr8k_dir, rows):
  cfg = dict(path=flickr8k_dir, languages=["fr", "cs", "ar"])
  everything = _elements(flickr8k.image_text_source(cfg, "dev", 0, 1))
  assert len(everything) == 107 + 107 + 339
  parts = [_elements(flickr8k.image_text_source(cfg, "dev", p, 2)) for p in range(2)]
  assert all(parts) and sorted(parts[0] + parts[1]) == sorted(everything)
  images = [{img for img, _, _ in part} for part in parts]
  assert not images[0] & images[1]  # Whole images go to one process.
  en_flickr8k = _elements(flickr8k.image_text_source(dict(path=flickr8k_dir, languages=["en"],
                                                      caption_sources=["flickr8k"]), "none", 0, 1))
  assert len(en_flickr8k) == 9 * 5
  with pytest.raises(ValueError, match="language 'ru'"):
    flickr8k.image_text_source(dict(path=flickr8k_dir, languages=["ru"]), "dev", 0, 1)
  with pytest.raises(ValueError, match="split test: no captions"):  # The subset has no test photos.
    flickr8k.image_text_source(dict(path=flickr8k_dir), "test", 0, 1)
  with pytest.raises(ValueError, match="unknown split 'eval'"):
    flickr8k.image_text_source(dict(path=flickr8k_dir), "eval", 0, 1)


def test_eval_data(flickr8k_dir, rows):
  ev = flickr8k.eval_data("dev", path=flickr8k_dir)
  assert ev.split == "dev" and len(ev.images) == len(set(ev.images)) == 113
  assert {lang: len(c) for lang, c in ev.captions.items()} == COUNTS["dev"]
  by_lang = collections.defaultdict(list)
  for r in flickr8k.select(rows, "dev"):
    by_lang[r.lang].append(r)
  for lang, idx in ev.caption_image.items():
    assert idx.dtype == np.int32 and idx.shape == (len(ev.captions[lang]),)
    assert [os.path.basename(ev.images[i]) for i in idx] == [r.image for r in by_lang[lang]]
    assert ev.captions[lang] == [r.caption for r in by_lang[lang]]
  assert all(os.path.exists(p) for p in ev.images)
  cs = flickr8k.eval_data("dev", ["cs"], path=flickr8k_dir)
  assert list(cs.captions) == ["cs"] and len(cs.images) == 107
  assert cs.image_bytes()[0][:3] == b"\xff\xd8\xff"


def test_convert_dev_split_and_read_back_through_tfrecord(flickr8k_dir, rows, tmp_path):
  dev = ["\t".join((r.image, r.split, r.lang, r.caption)) for r in flickr8k.select(rows, "dev")]
  extra = ["no_such_image.jpg\tdev\ten\tA caption whose image is missing",
           f"../{flickr8k.TOKENS}\tdev\ten\tNot an image"]
  tsv = tmp_path / "dev.tsv"
  tsv.write_text("\n".join(["image\tsplit\tlang\tcaption"] + dev + extra) + "\n", encoding="utf-8")
  out = str(tmp_path / "records")
  photos = flickr8k.photo_dir(flickr8k_dir)
  stats = convert.convert(str(tsv), out, num_shards=4, image_root=photos, columns=["image", "caption", "lang"])
  try:
    assert stats.rows == len(dev) + 2 == 2967 + 2
    assert stats.written == 2967 and stats.per_lang == COUNTS["dev"]
    assert stats.skipped == {**{r: 0 for r in convert.SKIP_REASONS}, "missing_image": 1, "not_an_image": 1}
    pattern = os.path.join(out, "data-*-of-00004.tfrecord")
    cfg = dict(name="tfrecord", files=pattern)
    got = _elements(sources.tfrecord_image_text(cfg, "train", 0, 1))
    assert collections.Counter(lang for _, _, lang in got) == collections.Counter(COUNTS["dev"])
    expected = collections.Counter((r.split("\t")[3], r.split("\t")[2]) for r in dev)
    assert collections.Counter((c, lang) for _, c, lang in got) == expected
    sizes = {r.split("\t")[0]: os.path.getsize(os.path.join(photos, r.split("\t")[0])) for r in dev}
    assert sorted(len(img) for img, _, _ in got) == sorted(sizes[r.split("\t")[0]] for r in dev)
    # Two hosts: disjoint shards that together give everything.
    parts = [_elements(sources.tfrecord_image_text(cfg, "train", p, 2)) for p in range(2)]
    assert len(parts[0]) + len(parts[1]) == 2967
    assert collections.Counter((c, lang) for part in parts for _, c, lang in part) == expected
  finally:
    shutil.rmtree(out)  # ~400 MB of JPEG copies.


def test_missing_dir_is_a_clear_error(tmp_path, monkeypatch):
  missing = str(tmp_path / "nowhere")
  with pytest.raises(ValueError, match=re.escape(missing) + ".*Flickr8k.token.txt"):
    flickr8k.image_text_source(dict(path=missing), "dev", 0, 1)
  monkeypatch.setenv(flickr8k.ENV_VAR, missing)
  with pytest.raises(ValueError, match=re.escape(missing) + r".*\$MURAL_FLICKR8K_DIR"):
    flickr8k.eval_data()


# ---- A small release written here: the layout's variants, bad files, the subset tool ----------------


def _jpeg(seed: int) -> bytes:
  return tf.io.encode_jpeg(tf.fill([8, 8, 3], tf.constant(seed * 40, tf.uint8))).numpy()


@pytest.fixture
def release(tmp_path, monkeypatch):
  """Four photos (the last in the test split), the text files in Flickr8k_text/ as one unzip puts them,
  Arabic with a caption broken over two lines as in its release, no Chinese and no Multi30k."""
  monkeypatch.delenv("MURAL_MULTI30K_DIR", raising=False)
  root = tmp_path / "Flickr8k"
  (root / "Flicker8k_Dataset").mkdir(parents=True)
  names = ["100_a.jpg", "200_b.jpg", "300_c.jpg", "400_d.jpg"]
  for k, name in enumerate(names):
    (root / "Flicker8k_Dataset" / name).write_bytes(_jpeg(k))
  text = root / "Flickr8k_text"
  text.mkdir()
  tokens = [f"{n}#{k}\t{n[:3]} caption {k} ." for n in names + ["999_z.jpg"] for k in (1, 0)]
  (text / "Flickr8k.token.txt").write_text("\n".join(tokens) + "\n", encoding="utf-8")
  (text / "Flickr_8k.trainImages.txt").write_text("100_a.jpg\n200_b.jpg\n")
  (text / "Flickr_8k.devImages.txt").write_text("300_c.jpg\n")
  (text / "Flickr_8k.testImages.txt").write_text("400_d.jpg\n")
  (text / "Flickr8k.arabic.txt").write_text("200_b.jpg#0\tتعليق\nمكسور\n200_b.jpg#1\tثان\n", encoding="utf-8")
  return root


def test_a_release_folder_read_as_released(release):
  rows = flickr8k.read_captions(str(release), ["en", "ar"])
  assert [(r.image, r.split) for r in rows if r.lang == "en"][::2] == [
      ("100_a.jpg", "train"), ("200_b.jpg", "train"), ("300_c.jpg", "dev"), ("400_d.jpg", "test")]
  assert [r.caption for r in rows if r.image == "100_a.jpg"] == ["100 caption 0 .", "100 caption 1 ."]
  assert [r.caption for r in rows if r.lang == "ar"] == ["تعليق مكسور", "ثان"]  # One caption, two lines.
  assert "999_z.jpg" not in {r.image for r in rows}  # A photo the folder lacks has no rows.
  test = flickr8k.eval_data("test", ["en"], path=str(release))
  assert [os.path.basename(p) for p in test.images] == ["400_d.jpg"] and len(test.captions["en"]) == 2


def test_a_split_evaluated_on_fewer_photos_than_listed_says_so(release, caplog):
  (release / "Flickr8k_text" / "Flickr_8k.devImages.txt").write_text("300_c.jpg\n350_gone.jpg\n")
  dev = flickr8k.eval_data("dev", ["en"], path=str(release))
  assert len(dev.images) == 1
  assert "Flickr8k dev split: 1 of the 2 photos Flickr_8k.devImages.txt lists are in" in caplog.text


def test_a_missing_file_or_folder_is_one_line_naming_it(release, tmp_path):
  with pytest.raises(ValueError, match=r"zh captions need flickr8kzhc\.caption\.txt \(github\.com/li-xirong"):
    flickr8k.read_captions(str(release), ["en", "zh"])
  with pytest.raises(ValueError, match=r"Flickr8k's de captions come from Multi30k: .*\$MURAL_MULTI30K_DIR"):
    flickr8k.read_captions(str(release), ["en", "de"])
  (release / "Flickr8k_text" / "Flickr8k.arabic.txt").write_text("no key here\n", encoding="utf-8")
  with pytest.raises(ValueError, match=r"Flickr8k\.arabic\.txt: line 1 is not"):
    flickr8k.read_captions(str(release), ["ar"])
  (release / "Flicker8k_Dataset").rename(release / "photos")
  with pytest.raises(ValueError, match="no photo folder Flicker8k_Dataset/"):
    flickr8k.read_captions(str(release), ["en"])


def test_subset_tool_takes_the_first_photos_outside_the_test_split(release, tmp_path):
  assert flickr8k_subset.write(str(release), str(tmp_path / "two"), photos=2) == ["100_a.jpg", "200_b.jpg"]
  assert flickr8k_subset.write(str(release), str(tmp_path / "all"), photos=0, copy=True) == [
      "100_a.jpg", "200_b.jpg", "300_c.jpg"]
  rows = flickr8k.read_captions(str(tmp_path / "two"), ["en", "ar"])
  assert {r.image for r in rows} == {"100_a.jpg", "200_b.jpg"}
  assert os.path.islink(tmp_path / "two" / "Flicker8k_Dataset" / "100_a.jpg")
  copied = tmp_path / "all" / "Flicker8k_Dataset" / "300_c.jpg"
  assert not os.path.islink(copied) and copied.read_bytes() == (release / "Flicker8k_Dataset" / "300_c.jpg").read_bytes()
  assert (tmp_path / "all" / "Flickr_8k.testImages.txt").read_text() == "400_d.jpg\n"  # The release's files.
  with pytest.raises(ValueError, match="3 photos outside the test split, fewer than --photos=4"):
    flickr8k_subset.write(str(release), str(tmp_path / "four"), photos=4)
  with pytest.raises(ValueError, match="exists"):
    flickr8k_subset.write(str(release), str(tmp_path / "two"), photos=2)
