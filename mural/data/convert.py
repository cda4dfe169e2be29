r"""CSV/TSV of (image path, caption, lang) rows -> sharded TFRecords for 'tfrecord'.

  python -m mural.data.convert --input=captions.tsv --output_dir=DIR --num_shards=8 \
      [--image_root=DIR] [--columns=image_path,caption,lang] [--delimiter=TAB] [--lang=en] \
      [--quoting=rfc4180|none] [--max_caption_chars=1000] [--max_field_chars=131072] \
      [--max_pixels=64000000] [--prefix=data] [--overwrite]

Output: `<prefix>-<i>-of-<n>.tfrecord` shards of tf.train.Example {image/encoded:
bytes, caption: bytes, lang: bytes} (rows round-robin), and
`<prefix>.stats.json`. Relative image paths are taken from --image_root
(default: the input file's directory).

Policy: a bad row is skipped and counted, never fatal; the run fails (exit 2)
only for unusable arguments, a missing input, a header lacking a column, or
an existing output without --overwrite; it exits 1 when nothing was written.

Text. UTF-8 with or without a BOM, LF or CRLF, final newline optional.
Quoting is RFC 4180 for CSV (',' for *.csv) and TSV (TAB otherwise) alike: a
quoted field may hold the delimiter, newlines and doubled quotes ("").
`--quoting=none` reads plain TSV where '"' is an ordinary character (use it
when captions start with a quote; with RFC quoting a stray opening quote
swallows the rows up to the next quote). `--columns` names the image, caption
and lang columns; when the first row holds all of them it is a header (other
columns are ignored), otherwise the first columns are image, caption, lang.
`--lang` gives a constant language (no lang column then). Every row must have
as many fields as the header (headerless: as the first row, and at least the
image, caption, lang columns). Rows are skipped, and counted with their line
number (1-based, where the row starts), for:
  field_count      wrong number of fields;
  bad_utf8         bytes that are not UTF-8 in the image, caption or lang field;
  oversized_field  a field over --max_field_chars (Python's csv limit, 128 Ki
                   chars); the reader goes on at the next line of the file;
  unparsable_row   any other csv error;
  empty_caption    empty or whitespace-only caption (after the clean-up below).
Blank lines are ignored. Captions: C0/C1 control characters (tab, CR, LF,
NEL U+0085, ...) and U+2028/U+2029 become spaces, a stray BOM is dropped, ends
are stripped, and captions are cut to --max_caption_chars (default 1000;
counted as `truncated`), so no later stage (tokenizer vocab files hold one
token per line) meets a line break. Languages: stripped, lowercased, '_' ->
'-', primary subtag kept ('en-GB', 'en-Latn-US' -> 'en'); anything that is not
2-3 ASCII letters, or empty, becomes 'und'. Three-letter codes stay as given.

Images are decoded here with Pillow, not sniffed. JPEG, PNG, GIF (first
frame), BMP and WebP are read in any colour mode and bit depth (palette, L,
LA, RGBA, CMYK, 16-bit: high byte kept) and turned into 8-bit RGB; images with
transparency are composited on white. The pixel count comes from the header
and an image over --max_pixels (default 64,000,000, e.g. 8000 x 8000) is
refused before any pixel is decoded (decompression bombs). Skip reasons:
  missing_image    no such file (or a directory);
  not_an_image     not one of the five formats;
  corrupt_image    looks like one of them but does not decode (truncated, bad data);
  too_many_pixels  over --max_pixels.
Stored bytes: the original file when it is a JPEG (baseline or progressive) in
RGB or grey, or an 8-bit RGB or grey PNG without transparency or animation,
and mural.data.preprocess.decode (the training pipeline's decoder) decodes it
to the same size; everything else is re-encoded (counted as `reencoded`):
JPEG sources (CMYK, YCCK) as JPEG quality 95, all others losslessly as PNG. So
the pipeline decodes exactly the pixels the converter saw (PNG), or the same
up to JPEG decoder rounding (JPEG). EXIF orientation is not applied, as in the
pipeline.

Output is atomic: shards and stats are written as `*.incomplete` files and
renamed when the whole input is done, stats last. A failed or killed run
leaves only `*.incomplete` files, which the next run removes, so a retry needs
no --overwrite; an existing output (shards or stats) needs --overwrite, and
is replaced only when the new run has finished. The stats (rows read, written,
skipped per reason with up to 10 line numbers each, records per language,
truncated, reencoded) are printed at the end and written to
`<prefix>.stats.json`.
"""

import csv
import dataclasses
import io
import json
import os
import re
import sys
import warnings
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
from PIL import Image
from absl import app
from absl import flags
import tensorflow as tf

from mural import data
from mural import disk_space
from mural.data import preprocess

DEFAULT_COLUMNS = ("image_path", "caption", "lang")
SKIP_REASONS = ("field_count", "bad_utf8", "oversized_field", "unparsable_row", "empty_caption",
                "missing_image", "not_an_image", "corrupt_image", "too_many_pixels")
IMAGE_FORMATS = ("JPEG", "PNG", "GIF", "BMP", "WEBP")
QUOTING = {"rfc4180": csv.QUOTE_MINIMAL, "none": csv.QUOTE_NONE}
DEFAULT_MAX_PIXELS = 64_000_000
DEFAULT_MAX_CAPTION_CHARS = 1000
DEFAULT_MAX_FIELD_CHARS = 128 * 1024  # Python's csv default.
INCOMPLETE = ".incomplete"
# Controls (C0, DEL, C1 incl. NEL) and line/paragraph separators -> space; BOM dropped.
_CLEAN = {**{c: " " for c in [*range(0x20), *range(0x7f, 0xa0), 0x2028, 0x2029]}, 0xfeff: None}


class Skip(Exception):
  """A row left out and counted under `reason`."""

  def __init__(self, reason: str):
    super().__init__(reason)
    self.reason = reason


@dataclasses.dataclass
class ConvertStats:
  rows: int = 0  # Data rows read (header and blank lines excluded) = written + skipped.
  written: int = 0
  skipped: Dict[str, int] = dataclasses.field(default_factory=lambda: {r: 0 for r in SKIP_REASONS})
  skipped_lines: Dict[str, List[int]] = dataclasses.field(default_factory=dict)  # First few per reason.
  per_lang: Dict[str, int] = dataclasses.field(default_factory=dict)  # Written records per lang.
  truncated: int = 0  # Written captions cut to max_caption_chars.
  reencoded: int = 0  # Written images not stored as their original bytes.
  shards: List[str] = dataclasses.field(default_factory=list)
  max_examples: int = 10

  def skip(self, reason: str, line: int):
    self.skipped[reason] += 1
    lines = self.skipped_lines.setdefault(reason, [])
    if len(lines) < self.max_examples:
      lines.append(line)

  def summary(self) -> str:
    lines = [f"read {self.rows} rows, wrote {self.written} records to {len(self.shards)} shards "
             f"({self.reencoded} images re-encoded, {self.truncated} captions truncated)",
             "written per lang: " + ", ".join(f"{k}={v}" for k, v in sorted(self.per_lang.items()))]
    for reason, n in self.skipped.items():
      if n:
        lines.append(f"SKIPPED {n} rows: {reason} (lines {', '.join(map(str, self.skipped_lines[reason]))}"
                     f"{', ...' if n > len(self.skipped_lines[reason]) else ''})")
    return "\n".join(lines)


# ---- text -----------------------------------------------------------------------


def normalize_text(text: str) -> str:
  """Controls and line/paragraph separators -> spaces, ends stripped (inner spaces kept)."""
  return text.translate(_CLEAN).strip()


def normalize_lang(code: str) -> str:
  """'en-GB', ' EN_us ', 'en-Latn-US' -> 'en'; empty or not 2-3 letters -> 'und'."""
  primary = code.strip().lower().replace("_", "-").split("-")[0]
  return primary if re.fullmatch("[a-z]{2,3}", primary) else "und"


class _Raw(io.RawIOBase):
  """A GFile as a raw stream (GFile lacks readable()), so any tf.io.gfile path can be decoded lazily."""

  def __init__(self, f):
    super().__init__()
    self._f = f

  def readable(self):
    return True

  def readinto(self, b):
    data = self._f.read(len(b))
    b[:len(data)] = data
    return len(data)


def _records(fh, delimiter: str, quoting: int):
  """(line, fields, None) or (line, None, reason) per record: a csv error costs one row, not the file.

  After an error (e.g. a field over csv.field_size_limit) the csv reader goes on at the next line.
  """
  reader = csv.reader(fh, delimiter=delimiter, quoting=quoting)
  while True:
    line = reader.line_num + 1
    try:
      fields = next(reader)
    except StopIteration:
      return
    except csv.Error as e:
      yield line, None, "oversized_field" if "field larger" in str(e) else "unparsable_row"
      continue
    yield line, fields, None


# ---- images ---------------------------------------------------------------------


def _looks_like_image(data: bytes) -> bool:
  return (data.startswith((b"\xff\xd8\xff", b"\x89PNG\r\n\x1a\n", b"GIF87a", b"GIF89a", b"BM"))
          or (data[:4] == b"RIFF" and data[8:12] == b"WEBP"))


def open_image(data: bytes, max_pixels: int = DEFAULT_MAX_PIXELS) -> Image.Image:
  """Reads the header only, so bombs are refused before any pixel is decoded. Raises Skip."""
  try:
    with warnings.catch_warnings():
      warnings.simplefilter("ignore", Image.DecompressionBombWarning)  # Our own limit below.
      im = Image.open(io.BytesIO(data), formats=IMAGE_FORMATS)
  except Image.DecompressionBombError as e:  # Over 2x Image.MAX_IMAGE_PIXELS.
    raise Skip("too_many_pixels") from e
  except Exception as e:  # pylint: disable=broad-except  # Untrusted bytes: any decoder error.
    raise Skip("corrupt_image" if _looks_like_image(data) else "not_an_image") from e
  if im.width * im.height > max_pixels:
    raise Skip("too_many_pixels")
  return im


def to_rgb(im: Image.Image) -> Image.Image:
  """Decodes the first frame to 8-bit RGB (16-bit grey: high byte; transparency on white)."""
  im.seek(0)
  im.load()
  if im.mode.startswith("I"):  # 16-bit grey; Pillow's convert would clip at 255.
    im = Image.fromarray((np.asarray(im) >> 8).astype(np.uint8))
  if im.has_transparency_data:
    im = Image.alpha_composite(Image.new("RGBA", im.size, (255, 255, 255, 255)), im.convert("RGBA"))
  return im.convert("RGB")


def _keep_original(im: Image.Image, data: bytes) -> bool:
  """JPEG in RGB/grey, or 8-bit RGB/grey PNG (IHDR bit depth, colour type) without alpha or frames."""
  if im.format == "JPEG":
    return im.mode in ("RGB", "L")
  return (im.format == "PNG" and data[24:26] in (b"\x08\x00", b"\x08\x02")
          and not im.has_transparency_data and not getattr(im, "is_animated", False))


def _pipeline_decodes(data: bytes, shape) -> bool:
  try:
    return tuple(preprocess.decode(tf.constant(data)).shape) == tuple(shape)
  except (tf.errors.OpError, ValueError):
    return False


def stored_image(data: bytes, max_pixels: int = DEFAULT_MAX_PIXELS) -> Tuple[bytes, np.ndarray, bool]:
  """(bytes to store, the RGB pixels the converter saw, re-encoded?). Raises Skip."""
  im = open_image(data, max_pixels)
  try:
    rgb = to_rgb(im)
  except Exception as e:  # pylint: disable=broad-except  # Truncated or corrupt data, any decoder error.
    raise Skip("corrupt_image") from e
  pixels = np.asarray(rgb)
  if _keep_original(im, data) and _pipeline_decodes(data, pixels.shape):
    return data, pixels, False
  buf = io.BytesIO()
  if im.format == "JPEG":
    rgb.save(buf, "JPEG", quality=95)
  else:
    rgb.save(buf, "PNG")
  return buf.getvalue(), pixels, True


def _read_file(path: str) -> Optional[bytes]:
  try:
    if not path or tf.io.gfile.isdir(path):
      return None
    with tf.io.gfile.GFile(path, "rb") as f:
      return f.read()
  except (tf.errors.OpError, OSError, ValueError, UnicodeError):
    return None


def _image_for(path: str, max_pixels: int) -> Tuple[Optional[bytes], bool, Optional[str]]:
  """(stored bytes, re-encoded?, None) or (None, False, skip reason)."""
  data = _read_file(path)
  if data is None:
    return None, False, "missing_image"
  try:
    stored, _, reencoded = stored_image(data, max_pixels)
    return stored, reencoded, None
  except Skip as s:
    return None, False, s.reason


# ---- conversion -----------------------------------------------------------------


def example(image: bytes, caption: str, lang: str, image_field: str = "image/encoded",
            caption_field: str = "caption", lang_field: str = "lang") -> tf.train.Example:
  b = lambda v: tf.train.Feature(bytes_list=tf.train.BytesList(value=[v]))
  return tf.train.Example(features=tf.train.Features(feature={
      image_field: b(image), caption_field: b(caption.encode("utf-8")), lang_field: b(lang.encode("utf-8"))}))


def _delimiter_for(path: str, delimiter: Optional[str]) -> str:
  if delimiter:
    return {"TAB": "\t", "\\t": "\t", "tab": "\t"}.get(delimiter, delimiter)
  return "," if path.lower().endswith(".csv") else "\t"


def _outputs(output_dir: str, prefix: str) -> Tuple[List[str], List[str]]:
  """(finished shards and stats, *.incomplete leftovers) of `prefix` in output_dir."""
  done = re.compile(re.escape(prefix) + r"(-\d+-of-\d+\.tfrecord|\.stats\.json)")
  names = tf.io.gfile.listdir(output_dir)
  finished = [n for n in names if done.fullmatch(n)]
  leftovers = [n for n in names if n.endswith(INCOMPLETE) and done.fullmatch(n[:-len(INCOMPLETE)])]
  return [os.path.join(output_dir, n) for n in sorted(finished)], [os.path.join(output_dir, n) for n in leftovers]


def convert(input_path: str,
            output_dir: str,
            num_shards: int,
            image_root: Optional[str] = None,
            columns: Sequence[str] = DEFAULT_COLUMNS,
            delimiter: Optional[str] = None,
            lang: Optional[str] = None,
            prefix: str = "data",
            overwrite: bool = False,
            image_field: str = "image/encoded",
            caption_field: str = "caption",
            lang_field: str = "lang",
            quoting: str = "rfc4180",
            max_caption_chars: int = DEFAULT_MAX_CAPTION_CHARS,
            max_field_chars: int = DEFAULT_MAX_FIELD_CHARS,
            max_pixels: int = DEFAULT_MAX_PIXELS,
            max_examples: int = 10) -> ConvertStats:
  """Converts; returns the counts. ValueError for unusable arguments, input file, header or output."""
  if num_shards < 1:
    raise ValueError(f"num_shards must be >= 1, got {num_shards}")
  if quoting not in QUOTING:
    raise ValueError(f"quoting must be one of {sorted(QUOTING)}, got {quoting!r}")
  if min(max_caption_chars, max_field_chars, max_pixels) < 1:
    raise ValueError("max_caption_chars, max_field_chars and max_pixels must be >= 1")
  columns = list(columns)
  needed = 2 if lang else 3
  if len(columns) < needed:
    raise ValueError(f"columns {columns}: need the image, caption{'' if lang else ' and lang'} column names")
  columns = columns[:needed]
  delim = _delimiter_for(input_path, delimiter)
  if len(delim) != 1:
    raise ValueError(f"delimiter must be one character, got {delim!r}")
  if not tf.io.gfile.exists(input_path):
    raise ValueError(f"input file {input_path} does not exist")
  image_root = image_root if image_root is not None else os.path.dirname(os.path.abspath(input_path))

  tf.io.gfile.makedirs(output_dir)
  finished, leftovers = _outputs(output_dir, prefix)
  if finished and not overwrite:
    shards = [f for f in finished if f.endswith(".tfrecord")]
    state = ("a complete earlier run" if len(shards) < len(finished) else
             "no stats file: an earlier run was killed while renaming its shards")
    raise ValueError(f"{output_dir} already holds {len(shards)} {prefix}-*.tfrecord shards ({state}); "
                     "pass overwrite=True (--overwrite) or another prefix/output_dir")
  for f in leftovers:  # From a failed or killed run: never in the way.
    tf.io.gfile.remove(f)

  stats = ConvertStats(max_examples=max_examples)
  stats.shards = [os.path.join(output_dir, f"{prefix}-{i:05d}-of-{num_shards:05d}.tfrecord")
                  for i in range(num_shards)]
  stats_path = os.path.join(output_dir, f"{prefix}.stats.json")
  temps = [p + INCOMPLETE for p in stats.shards + [stats_path]]
  writers = [tf.io.TFRecordWriter(p) for p in temps[:-1]]
  old_field_limit, old_max_pixels = csv.field_size_limit(max_field_chars), Image.MAX_IMAGE_PIXELS
  Image.MAX_IMAGE_PIXELS = max_pixels
  full_disk = disk_space.writing(f"{prefix}-*.tfrecord shards", output_dir,
                                 resume="the partial shards are removed: the same command converts "
                                        "the input once there is space")
  try:
    with tf.io.gfile.GFile(input_path, "rb") as raw:
      text = io.TextIOWrapper(io.BufferedReader(_Raw(raw)), encoding="utf-8-sig",
                              errors="surrogateescape", newline="")  # Bad bytes -> lone surrogates.
      _convert_rows(_records(text, delim, QUOTING[quoting]), input_path, columns, lang, image_root,
                    writers, stats, (image_field, caption_field, lang_field), max_caption_chars, max_pixels)
    for w in writers:
      w.close()
    with tf.io.gfile.GFile(temps[-1], "w") as f:
      json.dump(dataclasses.asdict(stats), f, indent=1, ensure_ascii=False)
  except BaseException as e:
    for w in writers:
      try:
        w.close()
      except Exception:  # pylint: disable=broad-except  (a full disk fails the flush: e says it)
        pass
    for t in temps:
      if tf.io.gfile.exists(t):
        tf.io.gfile.remove(t)
    with full_disk:  # DiskFull when e is a full disk, else e itself.
      raise e
  finally:
    csv.field_size_limit(old_field_limit)
    Image.MAX_IMAGE_PIXELS = old_max_pixels
  for f in finished:  # --overwrite: the old output goes only now that the new one is complete.
    if f not in stats.shards and f != stats_path:
      tf.io.gfile.remove(f)
  for t, f in zip(temps, stats.shards + [stats_path]):  # Stats last: its presence marks a complete output.
    tf.io.gfile.rename(t, f, overwrite=True)
  return stats


def _convert_rows(records, input_path, columns, lang, image_root, writers, stats, fields,
                  max_caption_chars, max_pixels):
  """The per-row loop: every row is written or counted under one skip reason."""
  first = next((r for r in records if r[1] != []), None)  # pylint: disable=g-explicit-bool-comparison
  if first is None:
    raise ValueError(f"{input_path} is empty")
  names = [f.strip() for f in first[1] or []]
  present = [c for c in columns if c in names]
  if present and len(present) < len(columns):
    raise ValueError(f"{input_path}: header {names} lacks column(s) "
                     f"{[c for c in columns if c not in names]} (set --columns)")
  if present:
    pos, width = [names.index(c) for c in columns], len(names)
  else:  # No header: the first columns in role order; the first row sets the width.
    pos, width = list(range(len(columns))), max(len(columns), len(names))
    records = _chain([first], records)
  cache_path, cache = None, (None, False, "missing_image")
  for line, values, error in records:
    if values == []:  # Blank line.  pylint: disable=g-explicit-bool-comparison
      continue
    stats.rows += 1
    try:
      if error:
        raise Skip(error)
      if len(values) != width:
        raise Skip("field_count")
      used = [values[p] for p in pos]
      try:
        "".join(used).encode("utf-8")
      except UnicodeEncodeError as e:  # Lone surrogates from undecodable bytes.
        raise Skip("bad_utf8") from e
      caption = normalize_text(used[1])
      if not caption:
        raise Skip("empty_caption")
      row_lang = normalize_lang(lang or used[2])
      path = used[0].strip()
      full = path if os.path.isabs(path) or "://" in path else os.path.join(image_root, path)
      if full != cache_path:  # Captions of one image usually come together.
        cache_path, cache = full, _image_for(full, max_pixels)
      image, reencoded, reason = cache
      if reason:
        raise Skip(reason)
    except Skip as s:
      stats.skip(s.reason, line)
      continue
    if len(caption) > max_caption_chars:
      caption = caption[:max_caption_chars].rstrip()
      stats.truncated += 1
    writers[stats.written % len(writers)].write(example(image, caption, row_lang, *fields).SerializeToString())
    stats.written += 1
    stats.reencoded += reencoded
    stats.per_lang[row_lang] = stats.per_lang.get(row_lang, 0) + 1


def _chain(first_rows, rest):
  yield from first_rows
  yield from rest


def _define_flags():
  flags.DEFINE_string("input", None, "CSV/TSV file of image path, caption, lang rows.", required=True)
  flags.DEFINE_string("output_dir", None, "Where the TFRecord shards go.", required=True)
  flags.DEFINE_integer("num_shards", 8, "Number of output shards (>= the number of reading hosts).")
  flags.DEFINE_string("image_root", None, "Directory of relative image paths (default: the input's).")
  flags.DEFINE_list("columns", list(DEFAULT_COLUMNS), "Names of the image, caption, lang columns.")
  flags.DEFINE_string("delimiter", None, "Field delimiter (TAB or ','); default from the extension.")
  flags.DEFINE_string("lang", None, "Constant language code (no lang column).")
  flags.DEFINE_string("prefix", "data", "Shard file name prefix.")
  flags.DEFINE_bool("overwrite", False, "Replace an existing <prefix> output in output_dir.")
  flags.DEFINE_enum("quoting", "rfc4180", list(QUOTING), "rfc4180: quoted fields (CSV and TSV); "
                    "none: plain TSV, '\"' is an ordinary character.")
  flags.DEFINE_integer("max_caption_chars", DEFAULT_MAX_CAPTION_CHARS, "Longer captions are cut.")
  flags.DEFINE_integer("max_field_chars", DEFAULT_MAX_FIELD_CHARS, "Rows with a longer field are skipped.")
  flags.DEFINE_integer("max_pixels", DEFAULT_MAX_PIXELS, "Images with more pixels (from the header) are skipped.")


def main(argv):
  del argv
  data.hide_accelerators_from_tensorflow()
  f = flags.FLAGS
  try:
    stats = convert(f.input, f.output_dir, f.num_shards, image_root=f.image_root, columns=f.columns,
                    delimiter=f.delimiter, lang=f.lang, prefix=f.prefix, overwrite=f.overwrite,
                    quoting=f.quoting, max_caption_chars=f.max_caption_chars,
                    max_field_chars=f.max_field_chars, max_pixels=f.max_pixels)
  except ValueError as e:
    print(f"convert: error: {e}", file=sys.stderr)
    return 2
  except disk_space.DiskFull as e:
    print(f"convert: error: {e}", file=sys.stderr)
    return 1
  print(stats.summary())
  return 0 if stats.written else 1


if __name__ == "__main__":
  _define_flags()
  app.run(main)
