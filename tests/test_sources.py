"""Raw sources on real files written to tmp_path: TFRecord, TSV pairs, TFDS, the converter."""

import gzip
import os
import re
import subprocess
import sys
import tempfile
from unittest import mock

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_datasets as tfds

from mural.data import convert
from mural.data import sources


def _jpeg(seed: int, size: int = 16) -> bytes:
  img = np.random.default_rng(seed).integers(0, 255, (size, size, 3), dtype=np.uint8)
  return tf.io.encode_jpeg(img).numpy()


def _png(seed: int, size: int = 12) -> bytes:
  img = np.random.default_rng(seed).integers(0, 255, (size, size, 3), dtype=np.uint8)
  return tf.io.encode_png(img).numpy()


def _example(**features) -> bytes:
  feats = {}
  for k, v in features.items():
    if isinstance(v, int):
      feats[k] = tf.train.Feature(int64_list=tf.train.Int64List(value=[v]))
    else:
      vals = v if isinstance(v, list) else [v]
      vals = [x.encode("utf-8") if isinstance(x, str) else x for x in vals]
      feats[k] = tf.train.Feature(bytes_list=tf.train.BytesList(value=vals))
  return tf.train.Example(features=tf.train.Features(feature=feats)).SerializeToString()


def _write(path, records):
  with tf.io.TFRecordWriter(str(path)) as w:
    for r in records:
      w.write(r)
  return str(path)


def _read(ds):
  return [{k: (v.decode("utf-8") if k != "image" else v) for k, v in e.items()} for e in ds.as_numpy_iterator()]


def _image_text_files(tmp_path, num_files, per_file):
  """num_files TFRecord files; caption 'f<i>r<j>' identifies every record."""
  for i in range(num_files):
    _write(tmp_path / f"part-{i}.tfrecord",
           [_example(**{"image/encoded": _jpeg(i * 100 + j), "caption": f"f{i}r{j}", "lang": "en"})
            for j in range(per_file)])
  return str(tmp_path / "part-*.tfrecord")


# ---- tfrecord image-text -------------------------------------------------------


def test_tfrecord_reads_corrupt_records_as_raw_elements(tmp_path):
  good, png = _jpeg(1), _png(2)
  truncated = _jpeg(3)[:200]
  _write(tmp_path / "a.tfrecord", [
      _example(**{"image/encoded": good, "caption": "Ein kleines Mädchen", "lang": "de"}),
      _example(**{"image/encoded": truncated, "caption": "truncated jpeg", "lang": "en"}),
      _example(**{"image/encoded": good, "lang": "cs"}),  # No caption feature.
      _example(**{"image/encoded": good, "caption": "", "lang": "en"}),  # Empty caption.
      _example(**{"image/encoded": png, "caption": "两只狗", "lang": "zh"}),
      _example(**{"image/encoded": good, "caption": ["one", "two"], "lang": "en"}),  # Two values.
      _example(caption="no image at all", lang="fr"),
  ])
  got = _read(sources.tfrecord_image_text(dict(name="tfrecord", weight=2.0, files=str(tmp_path / "*.tfrecord")),
                                          "train", 0, 1))
  assert [(e["image"], e["caption"], e["lang"]) for e in got] == [
      (good, "Ein kleines Mädchen", "de"), (truncated, "truncated jpeg", "en"), (good, "", "cs"),
      (good, "", "en"), (png, "两只狗", "zh"), (good, "", "en"), (b"", "no image at all", "fr")]
  spec = sources.tfrecord_image_text(dict(files=str(tmp_path / "*.tfrecord")), "train", 0, 1).element_spec
  assert {k: (s.dtype, s.shape.rank) for k, s in spec.items()} == {
      "image": (tf.string, 0), "caption": (tf.string, 0), "lang": (tf.string, 0)}


def test_tfrecord_custom_fields_constant_lang_and_split_pattern(tmp_path):
  _write(tmp_path / "dev-0.rec", [_example(img=_jpeg(i), text=f"c{i}") for i in range(3)])
  _write(tmp_path / "train-0.rec", [_example(img=_jpeg(9), text="train one")])
  cfg = dict(files=str(tmp_path / "{split}-*.rec"), image_field="img", caption_field="text", lang="en")
  got = _read(sources.tfrecord_image_text(cfg, "dev", 0, 1))
  assert [(e["caption"], e["lang"]) for e in got] == [("c0", "en"), ("c1", "en"), ("c2", "en")]
  assert got[1]["image"] == _jpeg(1)
  assert [e["caption"] for e in _read(sources.tfrecord_image_text(cfg, "train", 0, 1))] == ["train one"]


def test_tfrecord_unusable_sources_are_clear_errors(tmp_path):
  pattern = str(tmp_path / "none-*.tfrecord")
  with pytest.raises(ValueError, match=re.escape(pattern)):
    sources.tfrecord_image_text(dict(files=pattern), "train", 0, 1)
  with pytest.raises(ValueError, match="unknown field.*'file'"):
    sources.tfrecord_image_text(dict(file=pattern), "train", 0, 1)
  # Wrong schema: the records use other feature names.
  wrong = _write(tmp_path / "wrong.tfrecord", [_example(img=_jpeg(0), text="x", lang="en")] * 3)
  with pytest.raises(ValueError, match=re.escape(wrong) + r".*'image/encoded'.*\['img', 'lang', 'text'\]"):
    sources.tfrecord_image_text(dict(files=wrong), "train", 0, 1)
  # A field of the wrong type.
  typed = _write(tmp_path / "typed.tfrecord", [_example(**{"image/encoded": _jpeg(0), "caption": 7, "lang": "en"})])
  with pytest.raises(ValueError, match=re.escape(typed) + ".*'caption' holds int64_list"):
    sources.tfrecord_image_text(dict(files=typed), "train", 0, 1)
  # Not a TFRecord file at all, among good ones: named at construction.
  d = tmp_path / "mixed"
  d.mkdir()
  _write(d / "a.tfrecord", [_example(**{"image/encoded": _jpeg(0), "caption": "x", "lang": "en"})])
  (d / "b.tfrecord").write_text("image_path,caption\nx.jpg,a dog\n")
  with pytest.raises(ValueError, match=re.escape(str(d / "b.tfrecord")) + ".*not a readable TFRecord"):
    sources.tfrecord_image_text(dict(files=str(d / "*.tfrecord")), "train", 0, 1)
  # Records that are not tf.train.Example.
  junk = _write(tmp_path / "junk.tfrecord", [b"\xff\xfe not a proto"])
  with pytest.raises(ValueError, match=re.escape(junk) + ".*not a tf.train.Example"):
    sources.tfrecord_image_text(dict(files=junk), "train", 0, 1)


def test_tfrecord_empty_shard_is_fine(tmp_path):
  _write(tmp_path / "s-0.tfrecord", [])
  _write(tmp_path / "s-1.tfrecord", [_example(**{"image/encoded": _jpeg(0), "caption": "x", "lang": "en"})])
  assert [e["caption"] for e in _read(sources.tfrecord_image_text(
      dict(files=str(tmp_path / "s-*.tfrecord")), "train", 0, 1))] == ["x"]


@pytest.mark.parametrize("num_files,process_count", [(5, 2), (1, 3), (2, 3), (4, 4)])
def test_tfrecord_per_host_sharding_is_disjoint_and_complete(tmp_path, num_files, process_count):
  pattern = _image_text_files(tmp_path, num_files, per_file=7)
  everything = [e["caption"] for e in _read(sources.tfrecord_image_text(dict(files=pattern), "train", 0, 1))]
  assert sorted(everything) == sorted(f"f{i}r{j}" for i in range(num_files) for j in range(7))
  parts = [[e["caption"] for e in _read(sources.tfrecord_image_text(dict(files=pattern), "train", p, process_count))]
           for p in range(process_count)]
  seen = [c for part in parts for c in part]
  assert len(seen) == len(set(seen)) and sorted(seen) == sorted(everything)
  assert all(parts)
  if num_files >= process_count:  # File-level: a process holds whole files.
    for p, part in enumerate(parts):
      assert {c.split("r")[0] for c in part} == {f"f{i}" for i in range(p, num_files, process_count)}
  with pytest.raises(ValueError, match="process_index"):
    sources.tfrecord_image_text(dict(files=pattern), "train", process_count, process_count)


# ---- text pairs ------------------------------------------------------------------


def test_pairs_tsv_header_constants_gzip_and_bad_lines(tmp_path):
  (tmp_path / "a.tsv").write_text(
      "right_lang\tleft\tright\tleft_lang\n"  # Header in another order.
      'de\tA "big" dog\tEin großer Hund\ten\r\n'
      "cs\tA cat\n"  # Missing columns -> ''.
      "\n", encoding="utf-8")
  got = _read(sources.tsv_text_pairs(dict(name="pairs_tsv", files=str(tmp_path / "a.tsv")), "train", 0, 1))
  assert got == [
      dict(left='A "big" dog', right="Ein großer Hund", left_lang="en", right_lang="de"),
      dict(left="A cat", right="", left_lang="", right_lang="cs"),
      dict(left="", right="", left_lang="", right_lang="")]
  with gzip.open(tmp_path / "b.tsv.gz", "wt", encoding="utf-8") as f:
    f.write("Two dogs\tДве собаки\nA girl\tДевочка\n")
  got = _read(sources.tsv_text_pairs(dict(files=str(tmp_path / "b.tsv.gz"), columns=["left", "right"],
                                          left_lang="en", right_lang="ru"), "train", 0, 1))
  assert got == [dict(left="Two dogs", right="Две собаки", left_lang="en", right_lang="ru"),
                 dict(left="A girl", right="Девочка", left_lang="en", right_lang="ru")]


def test_pairs_tsv_schema_errors(tmp_path):
  (tmp_path / "h.tsv").write_text("left\tright\nA dog\tEin Hund\n", encoding="utf-8")
  with pytest.raises(ValueError, match=re.escape(str(tmp_path / "h.tsv")) + r".*lacks column\(s\) \['left_lang', 'right_lang'\]"):
    sources.tsv_text_pairs(dict(files=str(tmp_path / "h.tsv")), "train", 0, 1)
  (tmp_path / "n.tsv").write_text("A dog\tEin Hund\n", encoding="utf-8")
  with pytest.raises(ValueError, match="lacks column"):
    sources.tsv_text_pairs(dict(files=str(tmp_path / "n.tsv"), columns=["left", "right"], left_lang="en"), "train", 0, 1)
  with pytest.raises(ValueError, match="no file matches"):
    sources.tsv_text_pairs(dict(files=str(tmp_path / "zzz*.tsv")), "train", 0, 1)


@pytest.mark.parametrize("num_files,process_count", [(3, 2), (1, 2)])
def test_pairs_tsv_per_host_sharding_is_disjoint_and_complete(tmp_path, num_files, process_count):
  for i in range(num_files):
    lines = ["left\tright\tleft_lang\tright_lang"] + [f"l{i}-{j}\tr{i}-{j}\ten\tde" for j in range(9)]
    (tmp_path / f"p{i}.tsv").write_text("\n".join(lines) + "\n", encoding="utf-8")
  cfg = dict(files=str(tmp_path / "p*.tsv"))
  everything = {e["left"] for e in _read(sources.tsv_text_pairs(cfg, "train", 0, 1))}
  assert everything == {f"l{i}-{j}" for i in range(num_files) for j in range(9)}
  parts = [[e["left"] for e in _read(sources.tsv_text_pairs(cfg, "train", p, process_count))]
           for p in range(process_count)]
  seen = [x for part in parts for x in part]
  assert len(seen) == len(set(seen)) and set(seen) == everything and all(parts)


def test_pairs_tfrecord(tmp_path):
  _write(tmp_path / "t.tfrecord", [
      _example(left="A dog", right="Un chien", left_lang="en", right_lang="fr"),
      _example(left="A cat", left_lang="en", right_lang="fr"),  # No right.
  ])
  got = _read(sources.tfrecord_text_pairs(dict(files=str(tmp_path / "t.tfrecord")), "train", 0, 1))
  assert got == [dict(left="A dog", right="Un chien", left_lang="en", right_lang="fr"),
                 dict(left="A cat", right="", left_lang="en", right_lang="fr")]
  _write(tmp_path / "u.tfrecord", [_example(src="A dog", tgt="Hund")])
  got = _read(sources.tfrecord_text_pairs(dict(files=str(tmp_path / "u.tfrecord"), left_field="src",
                                               right_field="tgt", left_lang="en", right_lang="de"), "train", 0, 1))
  assert got == [dict(left="A dog", right="Hund", left_lang="en", right_lang="de")]


# ---- TFDS ------------------------------------------------------------------------


def _tiny_image(i):
  return np.full((4 + i % 3, 5, 3), i * 10, dtype=np.uint8)


class MuralTinyCaptions(tfds.core.GeneratorBasedBuilder):
  """A TFDS dataset built locally by the test (nothing downloads)."""

  VERSION = tfds.core.Version("1.0.0")

  def _info(self):
    return tfds.core.DatasetInfo(builder=self, features=tfds.features.FeaturesDict({
        "image": tfds.features.Image(shape=(None, None, 3)),
        "caption": tfds.features.Text(),
        "language": tfds.features.Text(),
        "captions": tfds.features.Sequence({"text": tfds.features.Text()}),
    }))

  def _split_generators(self, dl_manager):
    del dl_manager
    return {"train": self._generate_examples(range(0, 10)), "validation": self._generate_examples(range(10, 13))}

  def _generate_examples(self, ids):
    for i in ids:
      yield i, dict(image=_tiny_image(i), caption=f"caption {i}", language=["en", "de"][i % 2],
                    captions=dict(text=[f"c{i}-{k}" for k in range(i % 3 + 1)]))


@pytest.fixture(scope="module")
def tfds_dir(tmp_path_factory):
  d = str(tmp_path_factory.mktemp("tfds"))
  # tfds makes an empty tempfile.mkdtemp("tfds") while building (DatasetInfo.initialize_from_bucket):
  # keep it out of /tmp.
  with mock.patch.object(tempfile, "tempdir", str(tmp_path_factory.mktemp("tfds_tempdir"))):
    MuralTinyCaptions(data_dir=d).download_and_prepare()
  return d


def test_tfds_source_reads_a_locally_built_dataset(tfds_dir):
  cfg = dict(name="tfds", dataset="mural_tiny_captions", data_dir=tfds_dir, lang_field="language",
             splits=dict(dev="validation"))
  got = sorted(_read(sources.tfds_image_text(cfg, "train", 0, 1)), key=lambda e: int(e["caption"].split()[1]))
  assert [(e["caption"], e["lang"]) for e in got] == [(f"caption {i}", ["en", "de"][i % 2]) for i in range(10)]
  for i, e in enumerate(got):  # Bytes stay encoded (PNG), decode to exactly what was stored.
    np.testing.assert_array_equal(tf.io.decode_image(e["image"]).numpy(), _tiny_image(i))
  dev = _read(sources.tfds_image_text(cfg, "dev", 0, 1))
  assert sorted(e["caption"] for e in dev) == ["caption 10", "caption 11", "caption 12"]


def test_tfds_sequence_captions_and_sharding(tfds_dir):
  cfg = dict(dataset="mural_tiny_captions", data_dir=tfds_dir, caption_field="captions/text", lang="en")
  allc = sorted(e["caption"] for e in _read(sources.tfds_image_text(cfg, "train", 0, 1)))
  assert allc == sorted(f"c{i}-{k}" for i in range(10) for k in range(i % 3 + 1))
  parts = [[e["caption"] for e in _read(sources.tfds_image_text(cfg, "train", p, 2))] for p in range(2)]
  assert all(parts) and sorted(parts[0] + parts[1]) == allc and not set(parts[0]) & set(parts[1])
  e = _read(sources.tfds_image_text(cfg, "train", 0, 1).take(1))[0]
  assert e["lang"] == "en" and isinstance(e["image"], bytes)


def test_tfds_errors_name_the_problem(tfds_dir, tmp_path):
  with pytest.raises(ValueError, match="'mural_tiny_captions'.*no prepared split 'test'"):
    sources.tfds_image_text(dict(dataset="mural_tiny_captions", data_dir=tfds_dir, lang="en"), "test", 0, 1)
  with pytest.raises(ValueError, match="caption_field 'text'.*features"):
    sources.tfds_image_text(dict(dataset="mural_tiny_captions", data_dir=tfds_dir, lang="en",
                                 caption_field="text"), "train", 0, 1)
  with pytest.raises(ValueError, match="cannot load 'no_such_dataset_xyz'"):
    sources.tfds_image_text(dict(dataset="no_such_dataset_xyz", data_dir=str(tmp_path), lang="en"), "train", 0, 1)
  with pytest.raises(ValueError, match="'lang'.*'lang_field'"):
    sources.tfds_image_text(dict(dataset="mural_tiny_captions", data_dir=tfds_dir), "train", 0, 1)


# ---- the tables ------------------------------------------------------------------


def test_tables_and_lookup(tmp_path):
  assert {"tfrecord", "tfds", "flickr8k"} <= set(sources.IMAGE_TEXT_SOURCES)
  assert {"tsv", "pairs_tsv", "pairs_tfrecord", "multi30k"} <= set(sources.TEXT_PAIR_SOURCES)
  pattern = _image_text_files(tmp_path, 1, 2)
  got = _read(sources.image_text_source(dict(name="tfrecord", weight=1.0, files=pattern), "train"))
  assert [e["caption"] for e in got] == ["f0r0", "f0r1"]
  with pytest.raises(ValueError, match="'tsv' is not a image-text source"):
    sources.image_text_source(dict(name="tsv"), "train")


# ---- converter (synthetic rows; the real Flickr8k run is in test_flickr8k.py) ------


def _convert_bed(tmp_path):
  imgs = tmp_path / "imgs"
  imgs.mkdir()
  (imgs / "a.jpg").write_bytes(_jpeg(1))
  (imgs / "b.png").write_bytes(_png(2))
  (imgs / "c.jpg").write_bytes(b"GIF89a not a jpeg")
  rows = ["id\tlang\tcaption\tpath",  # Header, extra column, other order.
          "1\ten\tA red square\ta.jpg",
          '2\tde\tEin "blaues" Quadrat\tb.png',
          "3\ten\tmissing file\tnope.jpg",
          "4\ten\tnot an image\tc.jpg",
          "5\tfr\t\ta.jpg",
          "6\tcs",
          "7\tcs\tČervený čtverec\ta.jpg"]
  (tmp_path / "rows.tsv").write_text("\n".join(rows) + "\n", encoding="utf-8")
  return str(tmp_path / "rows.tsv"), str(imgs)


def test_convert_counts_skips_and_reads_back(tmp_path):
  tsv, imgs = _convert_bed(tmp_path)
  out = str(tmp_path / "out")
  stats = convert.convert(tsv, out, num_shards=2, image_root=imgs, columns=["path", "caption", "lang"])
  assert (stats.rows, stats.written) == (7, 3)
  assert stats.skipped == {**{r: 0 for r in convert.SKIP_REASONS}, "field_count": 1, "empty_caption": 1,
                           "missing_image": 1, "corrupt_image": 1}
  assert stats.per_lang == dict(en=1, de=1, cs=1)
  assert "SKIPPED 1 rows: missing_image (lines 4)" in stats.summary()
  assert sorted(os.listdir(out)) == ["data-00000-of-00002.tfrecord", "data-00001-of-00002.tfrecord", "data.stats.json"]
  got = _read(sources.tfrecord_image_text(dict(files=os.path.join(out, "data-*.tfrecord")), "train", 0, 1))
  assert sorted((e["caption"], e["lang"], e["image"]) for e in got) == sorted([
      ("A red square", "en", _jpeg(1)), ('Ein "blaues" Quadrat', "de", _png(2)), ("Červený čtverec", "cs", _jpeg(1))])
  with pytest.raises(ValueError, match="already holds 2"):
    convert.convert(tsv, out, num_shards=3, image_root=imgs, columns=["path", "caption", "lang"])
  stats = convert.convert(tsv, out, num_shards=3, image_root=imgs, columns=["path", "caption", "lang"], overwrite=True)
  assert len(tf.io.gfile.glob(os.path.join(out, "data-*.tfrecord"))) == 3 and stats.written == 3


def test_convert_headerless_csv_constant_lang_and_bad_header(tmp_path):
  (tmp_path / "a.jpg").write_bytes(_jpeg(5))
  (tmp_path / "rows.csv").write_text('a.jpg,"A dog, running"\na.jpg,Plain\n', encoding="utf-8")
  stats = convert.convert(str(tmp_path / "rows.csv"), str(tmp_path / "o"), 1, lang="en")
  assert stats.written == 2 and stats.per_lang == {"en": 2}
  got = _read(sources.tfrecord_image_text(dict(files=str(tmp_path / "o" / "*.tfrecord")), "train", 0, 1))
  assert [e["caption"] for e in got] == ["A dog, running", "Plain"]
  (tmp_path / "h.tsv").write_text("image_path\tcaption\nx.jpg\tA\n", encoding="utf-8")
  with pytest.raises(ValueError, match=r"lacks column\(s\) \['lang'\]"):
    convert.convert(str(tmp_path / "h.tsv"), str(tmp_path / "o2"), 1)
  with pytest.raises(ValueError, match="does not exist"):
    convert.convert(str(tmp_path / "nope.tsv"), str(tmp_path / "o3"), 1)


def test_convert_cli(tmp_path):
  tsv, imgs = _convert_bed(tmp_path)
  out = str(tmp_path / "cli")
  repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  env = dict(os.environ, PYTHONPATH=repo, TF_CPP_MIN_LOG_LEVEL="3")
  cmd = [sys.executable, "-m", "mural.data.convert", f"--input={tsv}", f"--output_dir={out}", "--num_shards=2",
         f"--image_root={imgs}", "--columns=path,caption,lang"]
  r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=120)
  assert r.returncode == 0, r.stderr
  assert "wrote 3 records to 2 shards" in r.stdout and "SKIPPED 1 rows: missing_image" in r.stdout
  # (A second run refusing to overwrite the shards: tests/test_convert.py::test_cli.)
