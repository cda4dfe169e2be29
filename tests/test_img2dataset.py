"""img2dataset output (webdataset tars, TFRecords) through the training pipeline.

The shards are written by img2dataset's own writer classes (img2dataset.writer,
as its downloader calls them) from solid-colour images made here; captions are
'cap <n>' with a vocab in which every number is one token, so a batch names
its records and each image can be checked against its caption's colour.
"""

import importlib.util
import io
import logging
import os
import re
import sys
import tarfile
import types

import numpy as np
import pytest
from PIL import Image

os.environ.setdefault("NO_ALBUMENTATIONS_UPDATE", "1")  # img2dataset imports albumentations: no update check.
writer = pytest.importorskip("img2dataset.writer", reason="img2dataset is in setup.py's 'test' extra")
pa = pytest.importorskip("pyarrow")

from mural import system  # pylint: disable=g-import-not-at-top
from mural import systems
from mural.data import img2dataset as i2d_source
from mural.data import pipeline
from mural.data import tokenizer as tokenizer_lib

_NUMBER0 = len(tokenizer_lib.RESERVED_TOKENS) + 1  # Id of token '0' (after 'cap').
# What img2dataset's downloader passes as `schema`: the input columns plus its own
# (here: caption, one extra 'language' column, key and status).
_SCHEMA = pa.schema([("caption", pa.string()), ("language", pa.string()), ("key", pa.string()),
                     ("status", pa.string())])


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
  path = str(tmp_path_factory.mktemp("vocab") / "vocab.txt")
  tokenizer_lib.save_vocab(list(tokenizer_lib.RESERVED_TOKENS) + ["cap"] + [str(i) for i in range(400)], path)
  return tokenizer_lib.Tokenizer(path, max_len=5)


def _colour(n):
  return np.array([(n * 37) % 200 + 20, (n * 91) % 200 + 20, (n * 53) % 200 + 20], np.uint8)


def _image(n, fmt="JPEG"):
  out = io.BytesIO()
  options = dict(quality=100) if fmt == "JPEG" else dict(lossless=True)
  Image.fromarray(np.tile(_colour(n), (8, 8, 1))).save(out, fmt, **options)
  return out.getvalue()


def _good(n, fmt="JPEG"):
  return (n, _image(n, fmt), f"cap {n}", "de" if n % 2 else "en")


def _write(cls, folder, shard_id, samples, encode_format="jpg"):
  """Writes (n, image bytes, caption, language) samples the way img2dataset's downloader does."""
  w = cls(shard_id, str(folder), True, 5, _SCHEMA, encode_format)
  for n, image, caption, language in samples:
    key = f"{shard_id:05d}{n:04d}"
    w.write(image, key, caption, dict(caption=caption, language=language, key=key, status="success"))
  w.close()


def _config(source, batch_size):
  c = systems.base_config("mural")
  c.tasks.i2t.batch_size = batch_size
  c.data.image_size, c.data.eval_resize, c.data.shuffle_buffer = 8, 10, 0
  c.data.autotune = False  # With it, deleting a used iterator can wait up to 60 s (config_lib).
  c.tasks.i2t.sources = [dict(source, weight=1.0)]
  c.tasks.t2t.sources = []
  systems.validate(c)
  return c


def _check_one_epoch(source, tok, goods, skips, batch_size):
  """Exactly one epoch of `source` (the stream's last record is good): every good record once,
  with its caption, language and pixels; every bad one counted under its reason."""
  c = _config(source, batch_size)
  it = pipeline.build_train_iterator(c, system.active_tasks(systems.get(c), c), tok, seed=0)
  seen = []
  for _ in range(len(goods) // batch_size):
    b = next(it)["i2t"]
    numbers = b["text_ids"][:, 2] - _NUMBER0  # [CLS] cap <n> [SEP]
    for image, lang, n in zip(b["image"], b["lang"], numbers):
      assert lang == n % 2, n  # en = 0, de = 1.
      np.testing.assert_allclose(image, np.broadcast_to(_colour(n) / 127.5 - 1, image.shape), atol=0.04)
    seen += [int(n) for n in numbers]
  assert sorted(seen) == sorted(goods)  # Each good record exactly once.
  want = {f"i2t/{r}": 0 for r in pipeline.SKIP_REASONS}
  want.update({f"i2t/{r}": k for r, k in skips.items()})
  assert it.skip_counts() == want
  it.close()


def test_webdataset_tars_good_bad_webp_and_truncated(tmp_path, tok, caplog):
  _write(writer.WebDatasetSampleWriter, tmp_path, 0, [
      _good(0), _good(1), (50, _image(50), "", "en"),  # Empty caption.
      _good(2), (51, b"", "cap 51", "en"),  # Missing image (zero bytes).
      _good(3), (52, b"<html>404</html>", "cap 52", "en"),  # Not an image.
      _good(4), (53, _image(53), "cap 53", "xx"),  # Unknown language.
      _good(5), (54, _image(54), "cap 54", None),  # No language (JSON null).
      _good(6), _good(7)])
  _write(writer.WebDatasetSampleWriter, tmp_path, 1, [  # encode_format webp: <key>.webp members.
      _good(100, "WEBP"), (55, b"RIFF\x10\x00\x00\x00WEBPVP8 junk", "cap 55", "en"), _good(101, "WEBP"),
      _good(102, "WEBP"), _good(103, "WEBP")], encode_format="webp")
  _write(writer.WebDatasetSampleWriter, tmp_path, 2, [_good(n) for n in range(200, 210)])
  # Shard 2 is cut inside sample 206's caption (members: jpg, json, txt): 206 comes
  # without its caption, 207-209 are lost.
  path = tmp_path / "00002.tar"
  with tarfile.open(path) as tar:
    txt = tar.getmember("000020206.txt")
  path.write_bytes(path.read_bytes()[:txt.offset_data + 2])

  caplog.set_level(logging.WARNING)
  goods = list(range(8)) + [100, 101, 102, 103] + list(range(200, 206))
  _check_one_epoch(dict(name="webdataset", files=str(tmp_path / "*.tar"), lang_field="language"), tok, goods,
                   dict(unknown_language=2, empty_text=2, missing_image=1, not_an_image=2), batch_size=6)
  assert re.search(r"webdataset .*00002\.tar: unreadable after 6 samples", caplog.text), caplog.text


def test_img2dataset_tfrecords_through_the_tfrecord_source(tmp_path, tok, monkeypatch):
  if importlib.util.find_spec("tensorflow_io") is None:  # Imported by the writer only for gs:// etc.
    monkeypatch.setitem(sys.modules, "tensorflow_io", types.ModuleType("tensorflow_io"))
  _write(writer.TFRecordSampleWriter, tmp_path, 0, [
      _good(300), (56, _image(56), "", "en"), _good(301), (57, b"", "cap 57", "en"),
      _good(302), (58, b"GIF89a", "cap 58", "en"), _good(303), (59, _image(59), "cap 59", None),
      _good(304), _good(305)])
  source = dict(name="tfrecord", files=str(tmp_path / "*.tfrecord"), image_field="jpg", caption_field="txt",
                lang_field="language")
  _check_one_epoch(source, tok, list(range(300, 306)),
                   dict(unknown_language=1, empty_text=1, missing_image=1, not_an_image=1), batch_size=6)


def _captions(ds):
  return [(e["caption"].decode(), e["lang"].decode()) for e in ds.as_numpy_iterator()]


def test_webdataset_source_sharding_constant_lang_and_errors(tmp_path):
  for shard in range(3):
    _write(writer.WebDatasetSampleWriter, tmp_path, shard, [_good(10 * shard + j) for j in range(3)])
  source = dict(name="webdataset", files=str(tmp_path / "0000*.tar"), lang="sw")
  parts = [_captions(i2d_source.image_text_source(source, "train", p, 2)) for p in range(2)]
  every = [(f"cap {10 * s + j}", "sw") for s in range(3) for j in range(3)]
  assert sorted(parts[0] + parts[1]) == sorted(every)
  assert {c for c, _ in parts[0]} == {f"cap {n}" for n in (0, 1, 2, 20, 21, 22)}  # Files 0 and 2.
  one_file = dict(source, files=str(tmp_path / "00001.tar"))  # Fewer files than processes: by element.
  assert [_captions(i2d_source.image_text_source(one_file, "train", p, 2)) for p in range(2)] == [
      [("cap 10", "sw"), ("cap 12", "sw")], [("cap 11", "sw")]]

  (tmp_path / "00009.tar").write_bytes(b"")  # Cut short before its first member: a warning, no records.
  with_empty = dict(source, files=str(tmp_path / "0000[19].tar"))
  assert _captions(i2d_source.image_text_source(with_empty, "train", 0, 1)) == [
      (f"cap {n}", "sw") for n in (10, 11, 12)]

  with pytest.raises(ValueError, match="set 'lang'"):
    i2d_source.image_text_source(dict(name="webdataset", files=source["files"]), "train", 0, 1)
  with pytest.raises(ValueError, match=r"unknown field\(s\) \['langs'\]"):
    i2d_source.image_text_source(dict(source, langs="en"), "train", 0, 1)
  with pytest.raises(ValueError, match=r"00000\.parquet is not a readable tar file"):
    i2d_source.image_text_source(dict(source, files=str(tmp_path / "*")), "train", 0, 1)
  with pytest.raises(ValueError, match="lang_field 'lang' in its <key>.json"):
    i2d_source.image_text_source(dict(source, lang="", lang_field="lang"), "train", 0, 1)
  with pytest.raises(ValueError, match="no file matches"):
    i2d_source.image_text_source(dict(source, files=str(tmp_path / "{split}-*.tar")), "dev", 0, 1)
