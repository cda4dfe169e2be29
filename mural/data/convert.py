r"""CSV/TSV of (image path, caption, lang) rows -> sharded TFRecords for 'tfrecord'.

  python -m mural.data.convert --input=captions.tsv --output_dir=DIR --num_shards=8 \
      [--image_root=DIR] [--columns=image_path,caption,lang] [--delimiter=TAB] [--lang=en]

`--columns` names the image, caption and lang columns (in that role order).
When the first row holds all of them it is a header and the columns are found
by name (other columns are ignored); otherwise the file has no header and its
first columns are image, caption, lang in that order. TSV is read without
quoting (captions may hold '"'), CSV with standard quoting. `--lang` gives a
constant language (then the lang column is not needed).

Each written record is a tf.train.Example {image/encoded: bytes, caption:
bytes, lang: bytes} (names changeable in `convert`). Rows go round-robin to
`<prefix>-<i>-of-<n>.tfrecord` shards. Rows whose image file is missing or is
not JPEG/PNG, rows with an empty caption, and rows with missing columns are
skipped and counted; the counts are printed at the end and written to
`<prefix>.stats.json`. Relative image paths are taken from --image_root
(default: the input file's directory).
"""

import csv
import dataclasses
import json
import os
import sys
from typing import Dict, List, Optional, Sequence

import tensorflow as tf

JPEG_MAGIC = b"\xff\xd8\xff"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
DEFAULT_COLUMNS = ("image_path", "caption", "lang")
SKIP_REASONS = ("missing_image", "not_jpeg_or_png", "empty_caption", "missing_columns")


@dataclasses.dataclass
class ConvertStats:
  rows: int = 0  # Data rows read (header excluded).
  written: int = 0
  skipped: Dict[str, int] = dataclasses.field(default_factory=lambda: {r: 0 for r in SKIP_REASONS})
  per_lang: Dict[str, int] = dataclasses.field(default_factory=dict)  # Written records per lang.
  shards: List[str] = dataclasses.field(default_factory=list)
  examples_skipped: Dict[str, List[str]] = dataclasses.field(default_factory=dict)  # A few per reason.

  def skip(self, reason: str, what: str):
    self.skipped[reason] += 1
    ex = self.examples_skipped.setdefault(reason, [])
    if len(ex) < 3:
      ex.append(what)

  def summary(self) -> str:
    lines = [f"read {self.rows} rows, wrote {self.written} records to {len(self.shards)} shards",
             "written per lang: " + ", ".join(f"{k}={v}" for k, v in sorted(self.per_lang.items()))]
    for reason, n in self.skipped.items():
      if n:
        lines.append(f"SKIPPED {n} rows: {reason} (e.g. {self.examples_skipped.get(reason)})")
    return "\n".join(lines)


def _delimiter_for(path: str, delimiter: Optional[str]) -> str:
  if delimiter:
    return {"TAB": "\t", "\\t": "\t", "tab": "\t"}.get(delimiter, delimiter)
  return "," if path.lower().endswith(".csv") else "\t"


def example(image: bytes, caption: str, lang: str, image_field: str = "image/encoded",
            caption_field: str = "caption", lang_field: str = "lang") -> tf.train.Example:
  b = lambda v: tf.train.Feature(bytes_list=tf.train.BytesList(value=[v]))
  return tf.train.Example(features=tf.train.Features(feature={
      image_field: b(image), caption_field: b(caption.encode("utf-8")), lang_field: b(lang.encode("utf-8"))}))


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
            lang_field: str = "lang") -> ConvertStats:
  """Converts; returns the counts. ValueError for unusable input (file, header, shards)."""
  if num_shards < 1:
    raise ValueError(f"num_shards must be >= 1, got {num_shards}")
  columns = list(columns)
  needed = 2 if lang else 3
  if len(columns) < needed:
    raise ValueError(f"columns {columns}: need the image, caption{'' if lang else ' and lang'} column names")
  columns = columns[:needed]
  if not tf.io.gfile.exists(input_path):
    raise ValueError(f"input file {input_path} does not exist")
  image_root = image_root if image_root is not None else os.path.dirname(os.path.abspath(input_path))
  delim = _delimiter_for(input_path, delimiter)
  quoting = csv.QUOTE_NONE if delim == "\t" else csv.QUOTE_MINIMAL

  tf.io.gfile.makedirs(output_dir)
  stale = tf.io.gfile.glob(os.path.join(output_dir, f"{prefix}-*-of-*.tfrecord"))
  if stale and not overwrite:
    raise ValueError(f"{output_dir} already holds {len(stale)} {prefix}-*.tfrecord shards; "
                     "pass overwrite=True (--overwrite) or another prefix/output_dir")
  for f in stale:
    tf.io.gfile.remove(f)

  stats = ConvertStats()
  stats.shards = [os.path.join(output_dir, f"{prefix}-{i:05d}-of-{num_shards:05d}.tfrecord")
                  for i in range(num_shards)]
  writers = [tf.io.TFRecordWriter(p) for p in stats.shards]
  cache_path, cache_bytes = None, None
  try:
    with tf.io.gfile.GFile(input_path, "r") as fh:
      reader = csv.reader(fh, delimiter=delim, quoting=quoting)
      first = next(reader, None)
      if first is None:
        raise ValueError(f"{input_path} is empty")
      present = [c for c in columns if c in first]
      if present and len(present) < len(columns):
        raise ValueError(f"{input_path}: header {first} lacks column(s) "
                         f"{[c for c in columns if c not in first]} (set --columns)")
      if present:
        pos = [first.index(c) for c in columns]
        rows = reader
      else:  # No header: the first columns in role order.
        pos = list(range(len(columns)))
        rows = _chain([first], reader)
      for values in rows:
        stats.rows += 1
        if len(values) <= max(pos):
          stats.skip("missing_columns", f"row {stats.rows}: {values!r}"[:200])
          continue
        image_path, caption = values[pos[0]].strip(), values[pos[1]].strip()
        row_lang = lang or values[pos[2]].strip()
        if not caption:
          stats.skip("empty_caption", f"row {stats.rows} ({image_path})")
          continue
        full = image_path if os.path.isabs(image_path) or "://" in image_path else os.path.join(image_root, image_path)
        if full != cache_path:
          cache_path, cache_bytes = full, _read_image(full)
        if cache_bytes is None:
          stats.skip("missing_image", full)
          continue
        if not (cache_bytes.startswith(JPEG_MAGIC) or cache_bytes.startswith(PNG_MAGIC)):
          stats.skip("not_jpeg_or_png", full)
          continue
        ex = example(cache_bytes, caption, row_lang, image_field, caption_field, lang_field)
        writers[stats.written % num_shards].write(ex.SerializeToString())
        stats.written += 1
        stats.per_lang[row_lang] = stats.per_lang.get(row_lang, 0) + 1
  finally:
    for w in writers:
      w.close()
  with tf.io.gfile.GFile(os.path.join(output_dir, f"{prefix}.stats.json"), "w") as f:
    json.dump(dataclasses.asdict(stats), f, indent=1, ensure_ascii=False)
  return stats


def _chain(first_rows, reader):
  yield from first_rows
  yield from reader


def _read_image(path: str) -> Optional[bytes]:
  if not path or not tf.io.gfile.exists(path) or tf.io.gfile.isdir(path):
    return None
  with tf.io.gfile.GFile(path, "rb") as f:
    return f.read()


def _define_flags():
  from absl import flags  # pylint: disable=g-import-not-at-top
  flags.DEFINE_string("input", None, "CSV/TSV file of image path, caption, lang rows.", required=True)
  flags.DEFINE_string("output_dir", None, "Where the TFRecord shards go.", required=True)
  flags.DEFINE_integer("num_shards", 8, "Number of output shards (>= the number of reading hosts).")
  flags.DEFINE_string("image_root", None, "Directory of relative image paths (default: the input's).")
  flags.DEFINE_list("columns", list(DEFAULT_COLUMNS), "Names of the image, caption, lang columns.")
  flags.DEFINE_string("delimiter", None, "Field delimiter (TAB or ','); default from the extension.")
  flags.DEFINE_string("lang", None, "Constant language code (no lang column).")
  flags.DEFINE_string("prefix", "data", "Shard file name prefix.")
  flags.DEFINE_bool("overwrite", False, "Replace existing <prefix>-*.tfrecord shards in output_dir.")


def main(argv):
  from absl import flags  # pylint: disable=g-import-not-at-top
  del argv
  f = flags.FLAGS
  try:
    stats = convert(f.input, f.output_dir, f.num_shards, image_root=f.image_root, columns=f.columns,
                    delimiter=f.delimiter, lang=f.lang, prefix=f.prefix, overwrite=f.overwrite)
  except ValueError as e:
    print(f"convert: error: {e}", file=sys.stderr)
    return 2
  print(stats.summary())
  return 0 if stats.written else 1


if __name__ == "__main__":
  from absl import app  # pylint: disable=g-import-not-at-top
  _define_flags()
  app.run(main)
