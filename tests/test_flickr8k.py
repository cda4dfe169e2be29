"""Flickr8k subset on the real files: captions, the image-text source, eval data, converter round trip."""

import collections
import os
import re
import shutil

import numpy as np
import pytest
import tensorflow as tf

from mural.data import convert
from mural.data import flickr8k
from mural.data import sources

# Counted from captions.tsv once by hand (awk) for these tests.
COUNTS = {
    "train": dict(en=7995, de=4230, zh=3765, ar=2259, fr=705, cs=705),
    "dev": dict(en=1207, de=642, zh=565, ar=339, fr=107, cs=107),
    "none": dict(en=93, de=48, zh=45, ar=27, fr=8, cs=8),
}
IMAGES = dict(train=753, dev=113, none=9)


@pytest.fixture(scope="module")
def rows(flickr8k_dir):
  return flickr8k.read_captions(flickr8k_dir)


def test_captions_file(flickr8k_dir, rows):
  assert len(rows) == 22855
  assert len({r.image for r in rows}) == 875 == len(os.listdir(os.path.join(flickr8k_dir, "images")))
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
    with open(os.path.join(flickr8k_dir, "images", r.image), "rb") as f:
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
  with pytest.raises(ValueError, match="unknown split 'test'"):
    flickr8k.image_text_source(dict(path=flickr8k_dir), "test", 0, 1)


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


def test_convert_dev_split_and_read_back_through_tfrecord(flickr8k_dir, tmp_path):
  with open(os.path.join(flickr8k_dir, "captions.tsv"), encoding="utf-8") as f:
    lines = f.read().splitlines()
  dev = [line for line in lines[1:] if line.split("\t")[1] == "dev"]
  extra = ["no_such_image.jpg\tdev\ten\ttest\ttest\tA caption whose image is missing",
           "../captions.tsv\tdev\ten\ttest\ttest\tNot an image"]
  tsv = tmp_path / "dev.tsv"
  tsv.write_text("\n".join([lines[0]] + dev + extra) + "\n", encoding="utf-8")
  out = str(tmp_path / "records")
  stats = convert.convert(str(tsv), out, num_shards=4, image_root=os.path.join(flickr8k_dir, "images"),
                          columns=["image", "caption", "lang"])
  try:
    assert stats.rows == len(dev) + 2 == 2967 + 2
    assert stats.written == 2967 and stats.per_lang == COUNTS["dev"]
    assert stats.skipped == {**{r: 0 for r in convert.SKIP_REASONS}, "missing_image": 1, "not_an_image": 1}
    pattern = os.path.join(out, "data-*-of-00004.tfrecord")
    cfg = dict(name="tfrecord", files=pattern)
    got = _elements(sources.tfrecord_image_text(cfg, "train", 0, 1))
    assert collections.Counter(lang for _, _, lang in got) == collections.Counter(COUNTS["dev"])
    expected = collections.Counter((r.split("\t")[5], r.split("\t")[2]) for r in dev)
    assert collections.Counter((c, lang) for _, c, lang in got) == expected
    sizes = {r.split("\t")[0]: os.path.getsize(os.path.join(flickr8k_dir, "images", r.split("\t")[0])) for r in dev}
    assert sorted(len(img) for img, _, _ in got) == sorted(sizes[r.split("\t")[0]] for r in dev)
    # Two hosts: disjoint shards that together give everything.
    parts = [_elements(sources.tfrecord_image_text(cfg, "train", p, 2)) for p in range(2)]
    assert len(parts[0]) + len(parts[1]) == 2967
    assert collections.Counter((c, lang) for part in parts for _, c, lang in part) == expected
  finally:
    shutil.rmtree(out)  # ~400 MB of JPEG copies.


def test_missing_dir_is_a_clear_error(tmp_path, monkeypatch):
  missing = str(tmp_path / "nowhere")
  with pytest.raises(ValueError, match=re.escape(missing) + ".*captions.tsv"):
    flickr8k.image_text_source(dict(path=missing), "dev", 0, 1)
  monkeypatch.setenv(flickr8k.ENV_VAR, missing)
  with pytest.raises(ValueError, match=re.escape(missing) + r".*\$MURAL_FLICKR8K_DIR"):
    flickr8k.eval_data()
