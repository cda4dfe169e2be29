"""The converter's policy (mural/data/convert.py docstring) on generated good rows mixed with broken ones."""

import collections
import dataclasses
import io
import json
import os
import random
import re
import struct
import subprocess
import sys
import zlib

import numpy as np
from PIL import Image, ImageFile, features
import pytest

from conftest import spy_on_tensorflow
from mural import disk_space
from mural.data import convert
from mural.data import preprocess
from mural.data import sources

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
WEBP = features.check("webp")
COLOURS = np.array([[255, 0, 0], [0, 128, 0], [0, 0, 255], [250, 250, 250]], np.uint8)


def _save(im: Image.Image, fmt: str, **kw) -> bytes:
  buf = io.BytesIO()
  im.save(buf, fmt, **kw)
  return buf.getvalue()


def _png_chunks(w: int, h: int, depth: int, colour_type: int, idat: bytes) -> bytes:
  """A PNG written by hand: 16-bit RGB, headers that lie (bombs), broken data."""
  chunk = lambda t, d: struct.pack(">I", len(d)) + t + d + struct.pack(">I", zlib.crc32(t + d))
  return (PNG_MAGIC + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, depth, colour_type, 0, 0, 0))
          + chunk(b"IDAT", idat) + chunk(b"IEND", b""))


def _smooth(h: int, w: int, shift: int = 0) -> np.ndarray:
  yy, xx = np.mgrid[0:h, 0:w]
  return np.stack([xx * 12 + shift, yy * 12, (xx + yy) * 6 + shift], -1).clip(0, 255).astype(np.uint8)


def _palette(idx: np.ndarray, **info) -> Image.Image:
  im = Image.frombytes("P", idx.shape[::-1], idx.astype(np.uint8).tobytes())
  im.putpalette(COLOURS.flatten().tolist())
  im.info.update(info)
  return im


def _images():
  """name -> (bytes, independent expected RGB, mean-error tolerance (0: exact), stored as is?)."""
  rng = np.random.default_rng(0)
  a, grey = _smooth(16, 16), _smooth(12, 20, 40)[..., 0]
  rgb3 = lambda g: np.repeat(g[..., None], 3, -1)
  idx, idx2 = rng.integers(0, 4, (10, 14)), rng.integers(0, 4, (10, 14))
  alpha = np.full((16, 16), 255, np.uint8)
  alpha[:, :6] = 0
  white_left = a.copy()
  white_left[:, :6] = 255
  rgb16 = (a.astype(">u2") * 257)
  bw = rng.integers(0, 2, (9, 11)).astype(bool)
  good = {
      "rgb.jpg": (_save(Image.fromarray(a), "JPEG", quality=90), a, 4, True),
      "grey.jpg": (_save(Image.fromarray(grey), "JPEG", quality=90), rgb3(grey), 4, True),
      "prog.jpg": (_save(Image.fromarray(a), "JPEG", quality=90, progressive=True), a, 4, True),
      "cmyk.jpg": (_save(Image.fromarray(a).convert("CMYK"), "JPEG", quality=90), a, 4, False),
      "rgb.png": (_save(Image.fromarray(a), "PNG"), a, 0, True),
      "grey.png": (_save(Image.fromarray(grey), "PNG"), rgb3(grey), 0, True),
      "palette.png": (_save(_palette(idx), "PNG"), COLOURS[idx], 0, False),
      "trns.png": (_save(_palette(idx), "PNG", transparency=1),
                   np.where((idx == 1)[..., None], 255, COLOURS[idx]).astype(np.uint8), 0, False),
      "rgba.png": (_save(Image.fromarray(np.dstack([a, alpha])), "PNG"), white_left, 0, False),
      "la.png": (_save(Image.fromarray(np.dstack([a[..., 0], alpha])), "PNG"), rgb3(white_left[..., 0]),
                 0, False),
      "grey16.png": (_save(Image.fromarray(grey.astype(np.uint16) * 257), "PNG"), rgb3(grey), 0, False),
      "rgb16.png": (_png_chunks(16, 16, 16, 2, zlib.compress(b"".join(b"\0" + r.tobytes() for r in rgb16))),
                    a, 0, False),
      "anim.gif": (_save(_palette(idx), "GIF", save_all=True, append_images=[_palette(idx2)]),
                   COLOURS[idx], 0, False),
      "rgb.bmp": (_save(Image.fromarray(a), "BMP"), a, 0, False),
      "bw.bmp": (_save(Image.fromarray(bw), "BMP"), rgb3(bw.astype(np.uint8) * 255), 0, False),
  }
  if WEBP:
    good["lossless.webp"] = (_save(Image.fromarray(a), "WEBP", lossless=True), a, 0, False)
    good["lossy.webp"] = (_save(Image.fromarray(a), "WEBP", quality=90), a, 6, False)
  rgb_png = good["rgb.png"][0]
  bad = {  # name -> (bytes, reason)
      "trunc.jpg": (good["rgb.jpg"][0][:len(good["rgb.jpg"][0]) // 2], "corrupt_image"),
      "trunc.png": (rgb_png[:-30], "corrupt_image"),
      "badzlib.png": (_png_chunks(8, 8, 8, 2, b"this is not zlib data"), "corrupt_image"),
      "fake.gif": (b"GIF89a but nothing else", "corrupt_image"),
      "bomb.png": (_png_chunks(50000, 50000, 8, 2, zlib.compress(b"")), "too_many_pixels"),
      "big.png": (_png_chunks(9000, 9000, 8, 0, zlib.compress(b"")), "too_many_pixels"),  # 81 MP.
      "text.jpg": (b"just some text\n", "not_an_image"),
      "empty.png": (b"", "not_an_image"),
      "image.tif": (_save(Image.fromarray(a), "TIFF"), "not_an_image"),
      "sound.webp": (b"RIFF\x24\0\0\0WAVEfmt " + bytes(28), "not_an_image"),
  }
  return good, bad


def _field(s: str) -> str:
  return '"' + s.replace('"', '""') + '"' if any(c in s for c in '\t"\r\n') else s


GOOD_TEXT = [  # (raw caption tail, what the converter must store)
    ("a cat on a mat", "a cat on a mat"),
    ("quoted\ttab", "quoted tab"),
    ("line\nbreak", "line break"),
    ("crlf\r\nbreak", "crlf  break"),
    ("lone\rcr", "lone cr"),
    ("seps\u2028a\u2029b\x85c", "seps a b c"),
    ("ctrl\x00a\x1bb\x7fc\x9bd\x0ce\x1ef", "ctrl a b c d e f"),
    ('she said "hi", ok', 'she said "hi", ok'),
    ("Červený čtverec 红色 مربع 🟥", "Červený čtverec 红色 مربع 🟥"),
    ("stray\ufeffbom", "straybom"),
    ("nbsp\u00a0kept", "nbsp\u00a0kept"),
    ("padded \t\u2028 ", "padded"),
]
LANGS = [("en", "en"), ("EN", "en"), (" en-GB ", "en"), ("en_US", "en"), ("en-Latn-US", "en"),
         ("zh-Hant", "zh"), ("DE", "de"), ("fra", "fra"), ("", "und"), ("english", "und"),
         ("x-klingon", "und"), ("12", "und"), ("i", "und"), ("cs", "cs"), ("\u2028", "und")]
MAX_CAPTION = 200


def _messy_tsv(tmp_path, rows=1100):
  """A BOM'd, CRLF/LF, RFC-quoted TSV of good rows mixed with every kind of bad one.

  Returns (path, image dir, images, good rows {caption: (lang, image)}, bad lines {reason: [line]}).
  """
  good_imgs, bad_imgs = _images()
  imgs = tmp_path / "imgs"
  (imgs / "subdir").mkdir(parents=True)
  for name, (data, *_) in {**good_imgs, **bad_imgs}.items():
    (imgs / name).write_bytes(data)
  rng = random.Random(0)
  good, bad = {}, collections.defaultdict(list)
  chunks, line = [b"\xef\xbb\xbfimage_path\tcaption\tlang\r\n"], 2

  def add(row: bytes, reason=None, expect=None):
    nonlocal line
    if reason:
      bad[reason].append(line)
    else:
      good[expect[0]] = expect[1:]
    chunks.append(row + rng.choice([b"\n", b"\r\n"]))
    line += len(re.findall(rb"\r\n|\r|\n", chunks[-1]))

  names = sorted(good_imgs)
  for i in range(rows):
    tag, img = f"r{i:04d}", rng.choice(names)
    lang, lang_norm = rng.choice(LANGS)
    enc = lambda *fields: "\t".join(_field(f) for f in fields).encode("utf-8")
    kind = rng.randrange(20)
    if kind < 11:
      raw, norm = rng.choice(GOOD_TEXT)
      add(enc(img, f"{tag} {raw}", lang), expect=(f"{tag} {norm}", lang_norm, img))
    elif kind == 11:
      long = f"{tag} " + "word " * 100
      add(enc(img, long, lang), expect=(long.strip()[:MAX_CAPTION].rstrip(), lang_norm, img))
    elif kind == 12:
      add(rng.choice([enc(img, tag), enc(img, tag, lang, "extra"), enc(img), enc(tag, img, "a\tb", "en")]),
          "field_count")
    elif kind == 13:
      add(rng.choice([f"{img}\t{tag} bad \xff\xfe\ten".encode("latin-1"),  # In the caption, image path, lang.
                      enc(img, tag).replace(b"\t", b" \xc3\x28\t") + b"\ten", enc(img, tag) + b"\ten\xff"]),
          "bad_utf8")
    elif kind == 14:
      add(enc(img, f"{tag} " + "x" * (128 * 1024 + 10), lang), "oversized_field")
    elif kind == 15:
      add(enc(img, rng.choice(["", "   ", "\t\r\n", "\u2028\x85\u2029", "\x00\x1b"]), lang), "empty_caption")
    elif kind == 16:
      add(enc(rng.choice([f"nope_{i}.jpg", "subdir", ""]), tag, lang), "missing_image")
    else:
      name = rng.choice(sorted(bad_imgs))
      add(enc(name, tag, lang), bad_imgs[name][1])
    if i % 97 == 0:
      chunks.append(b"\n")  # Blank lines are ignored.
      line += 1
  chunks[-1] = chunks[-1].rstrip(b"\r\n")  # No final newline.
  if chunks[-1] == b"":
    chunks.pop()
  path = tmp_path / "messy.tsv"
  path.write_bytes(b"".join(chunks))
  return str(path), str(imgs), good_imgs, good, bad


def _read_back(out: str, prefix: str = "data"):
  ds = sources.tfrecord_image_text(dict(name="tfrecord", files=os.path.join(out, f"{prefix}-*.tfrecord")),
                                   "train", 0, 1)
  return [(e["caption"].decode("utf-8"), e["lang"].decode("utf-8"), e["image"]) for e in ds.as_numpy_iterator()]


def test_messy_input_loses_no_good_row_and_counts_every_bad_one(tmp_path):
  path, imgs, good_imgs, good, bad = _messy_tsv(tmp_path)
  assert len(good) + sum(map(len, bad.values())) >= 1000 and len(bad) >= 8
  out = str(tmp_path / "out")
  stats = convert.convert(path, out, num_shards=3, image_root=imgs, max_caption_chars=MAX_CAPTION)

  assert stats.rows == len(good) + sum(map(len, bad.values()))
  assert stats.written == len(good) and stats.written + sum(stats.skipped.values()) == stats.rows
  assert stats.skipped == {r: len(bad.get(r, [])) for r in convert.SKIP_REASONS}
  assert stats.skipped_lines == {r: lines[:10] for r, lines in bad.items()}
  assert stats.per_lang == dict(collections.Counter(lang for lang, _ in good.values()))
  assert stats.truncated == sum(c.split(" ")[1] == "word" for c in good)
  assert stats.reencoded == sum(not good_imgs[img][3] for _, img in good.values())
  with open(os.path.join(out, "data.stats.json"), encoding="utf-8") as f:
    assert json.load(f) == dataclasses.asdict(stats)
  assert sorted(os.listdir(out)) == [f"data-0000{i}-of-00003.tfrecord" for i in range(3)] + ["data.stats.json"]
  summary = stats.summary()
  assert "written per lang: " + ", ".join(f"{k}={v}" for k, v in sorted(stats.per_lang.items())) in summary
  assert f"SKIPPED {stats.skipped['too_many_pixels']} rows: too_many_pixels (lines " in summary

  got = _read_back(out)
  assert len(got) == len(good)  # Every good row exactly once, with its clean caption and language.
  assert {c: lang for c, lang, _ in got} == {c: lang for c, (lang, _) in good.items()}
  assert all(len(c) <= MAX_CAPTION and not re.search(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]", c) for c, _, _ in got)
  seen = {}
  for caption, _, stored in got:
    name = good[caption][1]
    source, expected, tol, kept = good_imgs[name]
    if name not in seen:  # What the converter saw, checked against what the image was made from.
      seen[name] = convert.stored_image(source)
      diff = np.abs(seen[name][1].astype(int) - expected)
      assert (diff.mean() <= tol) if tol else not diff.any(), name
    assert stored == seen[name][0] and (stored == source) == kept, name
    decoded = preprocess.decode(stored).numpy().astype(int)  # What training will see.
    assert decoded.shape == seen[name][1].shape, name
    if stored.startswith(PNG_MAGIC):
      np.testing.assert_array_equal(decoded, seen[name][1], err_msg=name)
    else:
      assert stored[:3] == b"\xff\xd8\xff" and name.endswith(".jpg")
      assert np.abs(decoded - seen[name][1]).mean() <= 3, name


def test_bombs_are_refused_from_the_header(monkeypatch):
  good, bad = _images()

  def no_decoding(self):
    raise AssertionError("decoded pixels of an image over the limit")

  monkeypatch.setattr(ImageFile.ImageFile, "load", no_decoding)
  for data, limit in [(bad["bomb.png"][0], convert.DEFAULT_MAX_PIXELS), (bad["big.png"][0], convert.DEFAULT_MAX_PIXELS),
                      (good["rgb.png"][0], 255)]:
    with pytest.raises(convert.Skip, match="too_many_pixels"):
      convert.stored_image(data, max_pixels=limit)


def test_quoting_header_order_and_constant_lang(tmp_path):
  (tmp_path / "a.png").write_bytes(_save(Image.fromarray(_smooth(8, 8)), "PNG"))
  (tmp_path / "rows.csv").write_bytes(
      b'id,caption,lang,image_path\r\n1,"a, b",EN-us,a.png\r\n2,"multi\nline ""q""",de_AT,a.png\r\n3,short\r\n')
  stats = convert.convert(str(tmp_path / "rows.csv"), str(tmp_path / "csv"), 1)  # Header: other order, extra column.
  assert (stats.written, stats.skipped["field_count"], stats.skipped_lines) == (2, 1, {"field_count": [5]})
  assert sorted(_read_back(str(tmp_path / "csv"))) == sorted([
      ("a, b", "en", (tmp_path / "a.png").read_bytes()), ('multi line "q"', "de", (tmp_path / "a.png").read_bytes())])
  tsv = tmp_path / "plain.tsv"
  tsv.write_text('a.png\t"Quoted" start\na.png\t"two\tfields"\n', encoding="utf-8")
  stats = convert.convert(str(tsv), str(tmp_path / "plain"), 1, lang="EN", quoting="none")
  assert stats.written == 1 and stats.skipped["field_count"] == 1  # A tab is always a delimiter.
  assert [c for c, _, _ in _read_back(str(tmp_path / "plain"))] == ['"Quoted" start']
  stats = convert.convert(str(tsv), str(tmp_path / "rfc"), 1, lang="en")
  assert sorted(c for c, _, _ in _read_back(str(tmp_path / "rfc"))) == ["Quoted start", "two fields"]
  (tmp_path / "h.tsv").write_text("image_path\tcaption\nx.png\tA\n", encoding="utf-8")
  with pytest.raises(ValueError, match=r"lacks column\(s\) \['lang'\]"):
    convert.convert(str(tmp_path / "h.tsv"), str(tmp_path / "h"), 1)


def test_unit_normalisers():
  assert [convert.normalize_lang(raw) for raw, _ in LANGS] == [norm for _, norm in LANGS]
  for raw, norm in GOOD_TEXT:
    assert convert.normalize_text(raw) == norm


def test_failed_runs_leave_nothing_in_the_way(tmp_path, monkeypatch):
  (tmp_path / "a.png").write_bytes(_save(Image.fromarray(_smooth(8, 8)), "PNG"))
  rows = tmp_path / "rows.tsv"
  rows.write_text("".join(f"a.png\tcaption {i}\ten\n" for i in range(6)), encoding="utf-8")
  out = tmp_path / "out"
  real = convert._image_for

  def broken(*args):
    raise RuntimeError("disk gone")

  monkeypatch.setattr(convert, "_image_for", broken)
  with pytest.raises(RuntimeError, match="disk gone"):
    convert.convert(str(rows), str(out), 2)
  assert os.listdir(out) == []  # A failed run removes its *.incomplete files ...
  (out / "data-00000-of-00002.tfrecord.incomplete").write_bytes(b"half a shard")  # ... a killed one leaves them.
  (out / "data.stats.json.incomplete").write_text("{")
  monkeypatch.setattr(convert, "_image_for", real)
  stats = convert.convert(str(rows), str(out), 2)  # The retry needs no --overwrite.
  shards2 = ["data-00000-of-00002.tfrecord", "data-00001-of-00002.tfrecord"]
  assert stats.written == 6 and sorted(os.listdir(out)) == shards2 + ["data.stats.json"]
  before = {n: (out / n).read_bytes() for n in os.listdir(out)}

  with pytest.raises(ValueError, match=r"already holds 2 data-\*.tfrecord shards \(a complete earlier run\)"):
    convert.convert(str(rows), str(out), 2)
  monkeypatch.setattr(convert, "_image_for", broken)
  with pytest.raises(RuntimeError):
    convert.convert(str(rows), str(out), 3, overwrite=True)
  assert {n: (out / n).read_bytes() for n in os.listdir(out)} == before  # A failed overwrite keeps the old output.
  monkeypatch.setattr(convert, "_image_for", real)
  stats = convert.convert(str(rows), str(out), 3, overwrite=True)
  assert sorted(os.listdir(out)) == [f"data-0000{i}-of-00003.tfrecord" for i in range(3)] + ["data.stats.json"]
  assert sorted(c for c, _, _ in _read_back(str(out))) == [f"caption {i}" for i in range(6)]
  (out / "data.stats.json").unlink()  # As if killed between renaming the shards and the stats.
  with pytest.raises(ValueError, match="already holds 3 .*killed while renaming"):
    convert.convert(str(rows), str(out), 3)


def test_a_full_disk_is_one_error_and_leaves_no_partial_shard(tmp_path, small_disk):
  image = np.random.default_rng(0).integers(0, 255, (256, 256, 3), dtype=np.uint8)  # ~200 kB as PNG.
  (tmp_path / "a.png").write_bytes(_save(Image.fromarray(image), "PNG"))
  rows = tmp_path / "rows.tsv"
  rows.write_text("".join(f"a.png\tcaption {i}\ten\n" for i in range(20)), encoding="utf-8")
  out = small_disk.path / "out"
  small_disk.fill(leave=1_000_000)  # Room for a few records of the 20.
  with pytest.raises(disk_space.DiskFull, match=rf"^no space left on device writing data-\*\.tfrecord shards to "
                     rf"{out} \(.* free there now\); the partial shards are removed: the same command "
                     "converts the input once there is space$"):
    convert.convert(str(rows), str(out), 2)
  assert os.listdir(out) == []
  small_disk.empty()
  assert convert.convert(str(rows), str(out), 2).written == 20


def test_cli(tmp_path):
  (tmp_path / "a.png").write_bytes(_save(Image.fromarray(_smooth(8, 8)), "PNG"))
  (tmp_path / "rows.tsv").write_text('a.png\t"Long caption"\ten-GB\nb.png\tgone\ten\n', encoding="utf-8")
  out = tmp_path / "out"
  out.mkdir()
  (out / "data-00000-of-00001.tfrecord.incomplete").write_bytes(b"left by a killed run")
  repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  env = dict(os.environ, PYTHONPATH=repo, TF_CPP_MIN_LOG_LEVEL="3")
  args = [f"--input={tmp_path / 'rows.tsv'}", f"--output_dir={out}", "--num_shards=1", "--quoting=rfc4180",
          "--max_caption_chars=4", "--max_field_chars=1000", "--max_pixels=100", "--prefix=data"]
  cmd = [sys.executable, "-m", "mural.data.convert", *args]
  code, stdout, stderr = spy_on_tensorflow("mural.data.convert", *args)  # Also: GPUs hidden from TF.
  assert code == 0, stderr
  stdout = "\n".join(stdout)
  assert "read 2 rows, wrote 1 records to 1 shards (0 images re-encoded, 1 captions truncated)" in stdout
  assert "written per lang: en=1" in stdout and "SKIPPED 1 rows: missing_image (lines 2)" in stdout
  assert sorted(os.listdir(out)) == ["data-00000-of-00001.tfrecord", "data.stats.json"]
  assert [c for c, _, _ in _read_back(str(out))] == ["Long"]
  r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=120)  # A complete output is kept.
  assert r.returncode == 2 and "already holds 1" in r.stderr and "--overwrite" in r.stderr


def test_the_custom_template_reads_the_converters_folder(tmp_path):
  """configs/custom.py:FOLDER: languages from the converter's stats (most records first), training
  on train-*.tfrecord, evaluation on heldout-*.tfrecord or else on 5% of train held out by image,
  the text-text task on pairs.tsv when there is one (else ALIGN)."""
  from mural import config_lib  # pylint: disable=g-import-not-at-top
  from mural import systems  # pylint: disable=g-import-not-at-top
  from conftest import ROOT  # pylint: disable=g-import-not-at-top
  template = ROOT / "configs" / "custom.py"
  for n in range(3):
    (tmp_path / f"{n}.png").write_bytes(_save(Image.fromarray(_smooth(8, 8, n)), "PNG"))
  rows = tmp_path / "rows.tsv"
  rows.write_text("".join(f"{n}.png\tcap {n}\ten\n{n}.png\tKappe {n}\tde\n" for n in range(3))
                  + "0.png\tcap\ten\n", encoding="utf-8")
  folder = tmp_path / "mine"
  convert.convert(str(rows), str(folder), 1, prefix="train")
  c = config_lib.from_file(f"{template}:{folder}")
  systems.validate(c)
  train = dict(name="tfrecord", files=str(folder / "train-*.tfrecord"), holdout=0.05)
  assert tuple(c.data.languages) == ("en", "de") and [dict(s) for s in c.tasks.i2t.sources] == [train]
  assert c.data.eval_source.to_dict() == dict(name="records", source=train)
  assert c.tasks.t2t.weight == 0 and not c.tasks.t2t.sources and c.data.eval_translations.name == ""
  convert.convert(str(rows), str(folder), 1, prefix="heldout")
  (folder / "pairs.tsv").write_text("cap 1\tKappe 1\ten\tde\n")
  c = config_lib.from_file(f"{template}:{folder}")
  assert c.data.eval_source.source.to_dict() == dict(name="tfrecord", files=str(folder / "heldout-*.tfrecord"))
  assert [dict(s) for s in c.tasks.i2t.sources] == [dict(name="tfrecord", files=str(folder / "train-*.tfrecord"))]
  pairs = dict(name="pairs_tsv", files=str(folder / "pairs.tsv"), holdout=0.05)
  assert [dict(s) for s in c.tasks.t2t.sources] == [pairs] and c.tasks.t2t.weight > 0
  assert c.data.eval_translations.to_dict() == dict(name="records", source=pairs)
  with pytest.raises(config_lib.ConfigError, match="your data folder goes after ':'"):
    config_lib.from_file(template)
  with pytest.raises(config_lib.ConfigError, match=r"train.stats.json does not exist: convert"):
    config_lib.from_file(f"{template}:{tmp_path}")
