"""Public datasets read from small folders written here in their releases' layouts: Multi30k with
its images (task 1 and 2), COCO and Flickr30k by Karpathy's split files; as training sources and as
retrieval eval sets."""

import collections
import gzip
import json

import numpy as np
import pytest
import tensorflow as tf

from mural.data import eval_data
from mural.data import karpathy
from mural.data import multi30k
from mural.data import sources
from mural.data import tokenizer as tokenizer_lib

from conftest import tiny_config


def _jpeg(seed: int) -> bytes:
  return tf.io.encode_jpeg(tf.fill([12, 16, 3], tf.constant(seed * 30 % 256, tf.uint8))).numpy()


def _gz(path, lines):
  path.parent.mkdir(parents=True, exist_ok=True)
  with gzip.open(path, "wt", encoding="utf-8") as f:
    f.write("\n".join(lines) + "\n")


def _elements(ds):
  return [(e["image"], e["caption"].decode(), e["lang"].decode()) for e in ds.as_numpy_iterator()]


@pytest.fixture
def multi30k_release(tmp_path):
  """test_2016_flickr of task 1 (3 images, en de fr cs) and test_2016 of task 2 (5 en, 5 de per
  image), in the release's data/ layout, and the images' folder."""
  root, images = tmp_path / "data", tmp_path / "flickr30k-images"
  names = ["101.jpg", "102.jpg", "103.jpg"]
  (root / "task1" / "image_splits").mkdir(parents=True)
  (root / "task1" / "image_splits" / "test_2016_flickr.txt").write_text("\n".join(names) + "\n")
  for lang in multi30k.LANGUAGES:
    _gz(root / "task1" / "raw" / f"test_2016_flickr.{lang}.gz", [f"{lang} line {i} " for i in range(3)])
  (root / "task2" / "image_splits").mkdir(parents=True)
  (root / "task2" / "image_splits" / "test_2016_images.txt").write_text("\n".join(names) + "\n")
  for k in range(1, 6):
    for lang in ("en", "de"):
      _gz(root / "task2" / "raw" / f"test_2016.{k}.{lang}.gz", [f"{lang} {k} of image {i}" for i in range(3)])
  images.mkdir()
  for i, name in enumerate(names):
    (images / name).write_bytes(_jpeg(i))
  return str(root), str(images)


def test_multi30k_task1_and_task2_with_their_images(multi30k_release):
  root, images = multi30k_release
  rows = multi30k.captions("test_2016_flickr", 1, path=root, images=images)
  assert [(r.image.rsplit("/", 1)[1], r.lang, r.caption) for r in rows[:5]] == [
      ("101.jpg", "en", "en line 0"), ("101.jpg", "de", "de line 0"), ("101.jpg", "fr", "fr line 0"),
      ("101.jpg", "cs", "cs line 0"), ("102.jpg", "en", "en line 1")]
  task1 = multi30k.eval_data("test", 1, path=root, images=images)
  assert len(task1.images) == 3 and list(task1.captions) == ["en", "de", "fr", "cs"]
  assert all(list(task1.caption_image[l]) == [0, 1, 2] for l in task1.captions)
  task2 = multi30k.eval_data("test_2016", 2, path=root, images=images)
  assert {l: len(c) for l, c in task2.captions.items()} == {"en": 15, "de": 15}
  assert list(task2.caption_image["de"][:6]) == [0, 0, 0, 0, 0, 1] and task2.captions["de"][5] == "de 1 of image 1"
  got = _elements(sources.image_text_source(dict(name="multi30k", path=root, images=images, task=2,
                                                 languages=["de"]), "test", 0, 1))
  assert len(got) == 15 and got[0][0] == _jpeg(0) and got[5][1:] == ("de 1 of image 1", "de")
  parts = [_elements(multi30k.image_text_source(dict(path=root, images=images), "test", p, 2)) for p in range(2)]
  assert [len(p) for p in parts] == [8, 4] and not {i for i, _, _ in parts[0]} & {i for i, _, _ in parts[1]}


def test_a_missing_multi30k_image_is_skipped_in_training_and_refused_in_evaluation(multi30k_release, caplog):
  root, images = multi30k_release
  (tf.io.gfile.remove(f"{images}/102.jpg"))
  got = _elements(multi30k.image_text_source(dict(path=root, images=images, languages=["en"]), "test", 0, 1))
  assert [image == b"" for image, _, _ in got] == [False, True, False]  # The pipeline counts and skips ''.
  assert "1 of 3 image files are missing" in caplog.text
  with pytest.raises(ValueError, match=r"Multi30k task 1, split 'test': 1 of its 3 image files are missing"):
    multi30k.eval_data("test", 1, path=root, images=images)
  with pytest.raises(ValueError, match=r"MURAL_MULTI30K_IMAGES"):
    multi30k.eval_data("test", 1, path=root, images=f"{images}/nowhere")


@pytest.fixture
def coco(tmp_path):
  """A dataset_coco.json of five images (two train, one restval, one val, one test) under
  train2014/ and val2014/ as COCO's zips unpack."""
  entries = []
  for i, (folder, split) in enumerate([("train2014", "train"), ("train2014", "train"), ("val2014", "restval"),
                                       ("val2014", "val"), ("val2014", "test")]):
    name = f"COCO_{folder}_{i:012d}.jpg"
    (tmp_path / "coco" / folder).mkdir(parents=True, exist_ok=True)
    (tmp_path / "coco" / folder / name).write_bytes(_jpeg(i))
    entries.append({"filepath": folder, "filename": name, "split": split, "imgid": i,
                    "sentences": [{"raw": f" image {i} caption {k}", "tokens": []} for k in range(5)]})
  split_file = tmp_path / "dataset_coco.json"
  split_file.write_text(json.dumps({"dataset": "coco", "images": entries}))
  return str(split_file), str(tmp_path / "coco")


def test_karpathy_splits_with_restval_and_their_images(coco):
  split_file, images = coco
  train = _elements(karpathy.image_text_source(dict(split_file=split_file, images=images), "train", 0, 1))
  assert collections.Counter(c.split(" caption")[0] for _, c, _ in train) == {"image 0": 5, "image 1": 5, "image 2": 5}
  assert train[0] == (_jpeg(0), "image 0 caption 0", "en")
  no_restval = _elements(karpathy.image_text_source(dict(split_file=split_file, images=images, restval=False),
                                                    "train", 0, 1))
  assert len(no_restval) == 10
  test = karpathy.eval_data("test", split_file, images)
  assert [p.rsplit("/", 2)[1:] for p in test.images] == [["val2014", "COCO_val2014_000000000004.jpg"]]
  assert list(test.captions) == ["en"] and list(test.caption_image["en"]) == [0] * 5


def test_karpathy_bad_files_are_one_line(coco, tmp_path):
  split_file, images = coco
  with pytest.raises(ValueError, match="unknown split 'testing'"):
    karpathy.captions("testing", split_file, images)
  with pytest.raises(ValueError, match=r"no split file given; set the source's split_file or \$MURAL_KARPATHY"):
    karpathy.captions("test", None, images)
  bad = tmp_path / "bad.json"
  bad.write_text(json.dumps({"images": [{"filename": "x.jpg", "split": "test"}]}))
  with pytest.raises(ValueError, match=r"bad\.json: image 0 lacks a split, filename or sentences"):
    karpathy.captions("test", str(bad), images)
  bad.write_text("{not json")
  with pytest.raises(ValueError, match=r"Karpathy split file .*bad\.json: "):
    karpathy.captions("test", str(bad) + "", images)


def test_the_eval_sources_give_one_retrieval_set_per_language(multi30k_release, coco, tmp_path):
  vocab = str(tmp_path / "vocab.txt")
  tokenizer_lib.save_vocab(list(tokenizer_lib.RESERVED_TOKENS) + ["line", "image", "caption"], vocab)
  tok = tokenizer_lib.Tokenizer(vocab, max_len=6)
  c = tiny_config(vocab)
  c.data.languages = ["en", "de", "fr"]
  root, images = multi30k_release
  c.data.eval_source = dict(name="multi30k", path=root, images=images, max_images=2)
  sets, translations = eval_data.build_eval_sets(c, tok)
  assert [s.name for s in sets] == ["en", "de", "fr"] and translations == []  # cs is not configured.
  assert sets[0].images.shape[0] == 2 and list(sets[0].text_to_image) == [0, 1]
  split_file, coco_images = coco
  c.data.eval_source = dict(name="karpathy", split="test", split_file=split_file, images=coco_images)
  (s,), _ = eval_data.build_eval_sets(c, tok)
  assert s.name == "en" and s.images.shape[0] == 1 and np.all(s.text_to_image == 0)
  c.data.languages = ["de"]
  with pytest.raises(ValueError, match=r"\(Karpathy splits\): none of its languages \['en'\]"):
    eval_data.build_eval_sets(c, tok)
