"""Corpus embedding with an export: images and/or texts to sharded .npy files, resumable.

  python -m mural.embed --export=DIR --images='photos/*.jpg' --texts=captions.tsv --output=OUT

--images: a glob of image files (id: the path), or of TFRecord files (names
  containing '.tfrecord'; --image_field holds the bytes, --id_field the id,
  else '<file>:<record>'). --texts: a TSV file, 'id<TAB>text' or
  'id<TAB>text<TAB>lang' per line. An export with a word vocabulary per
  language (MULE's) needs each text's language: the third column, else --lang;
  other exports ignore it.
OUT/images/ and OUT/texts/ hold, per shard of --shard_size inputs,
  shard-NNNNN.npy   float16 or float32 [rows, D], L2-normalised
  shard-NNNNN.ids   one id per line, in row order
  shard-NNNNN.json  {first, inputs, rows, skipped: [[id, reason], ...]}
The .json is written last (each file written whole, then renamed): a shard
is done when its .json exists. Inputs are read in a fixed order (sorted
files, record order, line order), so a killed run started again skips the
done shards and goes on from the first missing one. Unreadable images, and
empty, untabbed or non-UTF-8 lines, are skipped and counted, never fatal.
OUT/embed.json keeps the export, dtype and shard size; resuming with others
is refused. Batches are split over the local devices (mural.export.Model).
"""

import argparse
import glob
import io
import json
import os
import sys
import time
from typing import Callable, Iterator, List, Optional, Tuple

import numpy as np

from mural import disk_space

Item = Tuple[str, object]  # (id, input)


def _fail(message: str, module: str = "mural.embed", code: int = 1):
  print(f"{module}: error: {message}", file=sys.stderr)
  sys.exit(code)


class Progress:
  """One stderr line every few seconds: done/total, rate, time left."""

  def __init__(self, what: str, total: Optional[int], done: int = 0, every_s: float = 5.0):
    self.what, self.total, self.done, self.every_s = what, total, done, every_s
    self.start, self.first = time.monotonic(), done
    self.last = self.start  # First line after every_s, when the rate means something.

  def add(self, n: int, final: bool = False):
    self.done += n
    now = time.monotonic()
    if not final and now - self.last < self.every_s:
      return
    self.last = now
    rate = (self.done - self.first) / max(now - self.start, 1e-9)
    of = f"/{self.total} ({100 * self.done / max(self.total, 1):.0f}%)" if self.total else ""
    left = f", {(self.total - self.done) / rate:.0f} s left" if self.total and rate > 0 and not final else ""
    print(f"{self.what}: {self.done}{of} inputs, {rate:.0f}/s{left}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------
# Inputs: (count or None, start -> iterator of (id, input) from input number `start`).


def image_inputs(pattern: str, image_field: str = "image/encoded",
                 id_field: str = "image/id") -> Tuple[Optional[int], Callable[[int], Iterator[Item]]]:
  files = sorted(glob.glob(pattern, recursive=True))
  if not files:
    raise FileNotFoundError(f"--images: no file matches {pattern!r}")
  if not all(".tfrecord" in os.path.basename(f) for f in files):
    return len(files), lambda start: ((f, f) for f in files[start:])

  def records(start: int) -> Iterator[Item]:
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    n = 0
    for f in files:
      for i, raw in enumerate(tf.data.TFRecordDataset(f).as_numpy_iterator()):
        n += 1
        if n <= start:
          continue
        feature = tf.train.Example.FromString(raw).features.feature
        image = feature[image_field].bytes_list.value if image_field in feature else []
        ids = feature[id_field].bytes_list.value if id_field in feature else []
        key = ids[0].decode("utf-8", "replace") if ids else f"{f}:{i}"
        yield key, (image[0] if image else ValueError(f"no feature {image_field!r}"))

  return None, records


def text_inputs(path: str) -> Tuple[Optional[int], Callable[[int], Iterator[Item]]]:
  if not os.path.isfile(path):
    raise FileNotFoundError(f"--texts: {path} is not a file")
  with open(path, "rb") as f:
    total = sum(1 for _ in f)

  def lines(start: int) -> Iterator[Item]:
    with open(path, "rb") as f:
      for n, raw in enumerate(f):
        if n < start:
          continue
        try:  # Not decoded with replacement characters: an id must come back as it went in.
          line = raw.decode("utf-8")
        except UnicodeDecodeError as e:
          yield f"line {n + 1}", ValueError(f"not UTF-8 (byte {e.start + 1})")
          continue
        key, tab, text = line.rstrip("\r\n").partition("\t")
        yield (key, text) if tab else (f"line {n + 1}", ValueError("no TAB (id<TAB>text)"))

  return total, lines


# ---------------------------------------------------------------------------
# Shards.


def done_shards(directory: str) -> List[dict]:
  """The .json of shards 0, 1, ... that are done (stops at the first missing one)."""
  out = []
  while os.path.exists(os.path.join(directory, f"shard-{len(out):05d}.json")):
    with open(os.path.join(directory, f"shard-{len(out):05d}.json")) as f:
      out.append(json.load(f))
  return out


def _save_shard(directory: str, index: int, first: int, inputs: int, ids: List[str],
                vectors: np.ndarray, skipped: List[List[str]], dtype: str):
  """Each file whole, then renamed; the .json last (a shard is done when it exists). A full disk
  removes the shard's files written so far and says which shards are whole."""
  base = os.path.join(directory, f"shard-{index:05d}")
  buffer = io.BytesIO()
  np.save(buffer, vectors.astype(dtype))
  meta = {"first": first, "inputs": inputs, "rows": len(ids), "skipped": skipped}
  what = f"embedding shard {index}"
  try:
    disk_space.write_file(base + ".npy", buffer.getvalue(), what)
    disk_space.write_file(base + ".ids", "".join(i + "\n" for i in ids), what)
    disk_space.write_file(base + ".json", json.dumps(meta), what)
  except disk_space.DiskFull as e:
    for suffix in (".npy", ".ids"):
      disk_space.remove(base + suffix)
    whole = ("no shard is whole yet", "shard 0 is whole")[index] if index < 2 else \
        f"shards 0-{index - 1} are whole"
    raise e.resuming(f"{whole}: the same command goes on from shard {index} once there is space") \
        from e.__cause__


def embed_inputs(model, kind: str, total: Optional[int], items: Callable[[int], Iterator[Item]],
                 directory: str, shard_size: int, dtype: str, lang: Optional[str] = None) -> dict:
  """Embeds every input of `kind` ('images' | 'texts') into `directory`'s shards; returns counts.
  `lang`: the language of texts whose line gives none (Model.embed_texts)."""
  os.makedirs(directory, exist_ok=True)
  done = done_shards(directory)
  start = sum(s["inputs"] for s in done)
  if done:
    print(f"{kind}: resuming after {len(done)} done shards ({start} inputs)", file=sys.stderr)
  progress = Progress(kind, total, start)
  index, it = len(done), items(start)
  exhausted = False
  while not exhausted:
    ids, vectors, skipped, pending, inputs = [], [], [], [], 0
    while inputs < shard_size:
      item = next(it, None)
      if item is None:
        exhausted = True
        break
      inputs += 1
      key, value = item
      try:
        if isinstance(value, Exception):
          raise value
        if kind == "texts":
          text, _, code = value.partition("\t")  # 'id<TAB>text<TAB>lang': the line's language.
          code = code.strip() or lang
          if not text.strip():
            raise ValueError("empty text")
          if model.tokenizer.needs_language and code not in model.languages:
            raise ValueError(f"language {code!r} is not one of this export's {model.languages}"
                             if code else "no language (a third column, or --lang)")
          pending.append((key, (text, code)))
        else:
          pending.append((key, model.prepare_image(value)))
      except ValueError as e:
        skipped.append([key, str(e)])
      if len(pending) == model.batch_size:
        vectors.append(_embed(model, kind, pending))
        ids += [k for k, _ in pending]
        pending = []
      progress.add(1)
    if pending:
      vectors.append(_embed(model, kind, pending))
      ids += [k for k, _ in pending]
    if inputs:
      matrix = np.concatenate(vectors) if vectors else np.zeros((0, model.embed_dim), np.float32)
      _save_shard(directory, index, start, inputs, ids, matrix, skipped, dtype)
      index, start = index + 1, start + inputs
  shards = done_shards(directory)
  counts = {"inputs": sum(s["inputs"] for s in shards), "rows": sum(s["rows"] for s in shards),
            "skipped": sum(len(s["skipped"]) for s in shards), "shards": len(shards)}
  progress.done = counts["inputs"]
  progress.add(0, final=True)
  print(f"{kind}: {counts['rows']} embedded, {counts['skipped']} skipped, {counts['shards']} shards "
        f"in {directory}", file=sys.stderr)
  return counts


def _embed(model, kind: str, pending) -> np.ndarray:
  if kind == "texts":
    langs = [code for _, (_, code) in pending] if model.tokenizer.needs_language else None
    return model.embed_texts([text for _, (text, _) in pending], langs)
  return model.embed_prepared(np.stack([v for _, v in pending]))


def check_lang(model, lang: Optional[str], flag: str = "--lang") -> None:
  """ValueError (one line) when an export whose texts need their language gets none, or a code
  it does not know (others ignore the language)."""
  if not model.tokenizer.needs_language:
    return
  if lang is None:
    raise ValueError(f"{flag}: this export has a word vocabulary per language: give the texts' "
                     f"language, one of {model.languages}")
  if lang not in model.languages:
    raise ValueError(f"{flag}: {lang!r} is not a language of this export ({model.languages})")


def _first_line_has_language(path: str) -> bool:
  """Whether the TSV's first line has a third column: without one (nor --lang), an export that
  needs languages is a usage error at once, not a file of skipped lines."""
  with open(path, encoding="utf-8", errors="replace") as f:
    return len(f.readline().rstrip("\n").split("\t")) >= 3


def load_embeddings(directory: str) -> Tuple[np.ndarray, List[str]]:
  """(float32 [N, D], ids) of every done shard in `directory` (OUT/images or OUT/texts)."""
  shards = done_shards(directory)
  if not shards:
    raise FileNotFoundError(f"no embedding shards in {directory} (write them with python -m mural.embed)")
  vectors, ids = [], []
  for i in range(len(shards)):
    base = os.path.join(directory, f"shard-{i:05d}")
    vectors.append(np.load(base + ".npy").astype(np.float32))
    with open(base + ".ids", encoding="utf-8") as f:
      ids += f.read().splitlines()
  return np.concatenate(vectors), ids


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(prog="python -m mural.embed", description=__doc__.split("\n")[0])
  parser.add_argument("--export", required=True, help="Export directory (--mode=export).")
  parser.add_argument("--images", help="Glob of image files or of TFRecord files.")
  parser.add_argument("--texts", help="TSV file: id<TAB>text, or id<TAB>text<TAB>lang, per line.")
  parser.add_argument("--lang", help="The language code of texts whose line has no third column, for "
                                     "an export with a vocabulary per language (MULE); others ignore it.")
  parser.add_argument("--output", required=True, help="Output directory.")
  parser.add_argument("--dtype", choices=("float16", "float32"), default="float16")
  parser.add_argument("--shard_size", type=int, default=10_000, help="Inputs per shard.")
  parser.add_argument("--batch_size", type=int, default=64, help="Rows per embedding call.")
  parser.add_argument("--image_field", default="image/encoded", help="TFRecord feature with image bytes.")
  parser.add_argument("--id_field", default="image/id", help="TFRecord feature with the id.")
  args = parser.parse_args(argv)
  if not args.images and not args.texts:
    _fail("give --images and/or --texts")
  if args.shard_size < 1:
    _fail("--shard_size must be >= 1")
  if args.batch_size < 1:
    _fail("--batch_size must be >= 1")
  from mural import data  # pylint: disable=g-import-not-at-top
  data.set_tensorflow_env_defaults()  # Before TensorFlow loads.
  try:
    inputs = {}
    if args.images:
      inputs["images"] = image_inputs(args.images, args.image_field, args.id_field)
    if args.texts:
      inputs["texts"] = text_inputs(args.texts)
    from mural import export  # pylint: disable=g-import-not-at-top
    model = export.load(args.export, args.batch_size)
    if args.texts and args.lang is not None:
      check_lang(model, args.lang)
    elif args.texts and not _first_line_has_language(args.texts):
      check_lang(model, None, "--lang (or a third column per line)")
    os.makedirs(args.output, exist_ok=True)
    settings = {"export": os.path.abspath(args.export), "step": model.manifest["step"],
                "embed_dim": model.embed_dim, "dtype": args.dtype, "shard_size": args.shard_size,
                "lang": args.lang}
    path = os.path.join(args.output, "embed.json")
    if os.path.exists(path):
      with open(path) as f:
        before = json.load(f)
      changed = [k for k in settings if before.get(k) != settings[k]]
      if changed:
        raise ValueError(f"{args.output} holds embeddings written with other settings "
                         f"({', '.join(f'{k}={before.get(k)!r}' for k in changed)}); use a new --output")
    disk_space.write_file(path, json.dumps(settings, indent=1), "the embedding settings")
    for kind, (total, items) in inputs.items():
      embed_inputs(model, kind, total, items, os.path.join(args.output, kind), args.shard_size, args.dtype,
                   args.lang)
  except disk_space.DiskFull as e:
    _fail(str(e))
  except (FileNotFoundError, ValueError) as e:
    _fail(str(e).splitlines()[0] if str(e) else type(e).__name__)
  except KeyboardInterrupt:
    _fail(f"interrupted (Ctrl-C): the same command goes on after the done shards in {args.output}",
          code=130)
  return 0


if __name__ == "__main__":
  sys.exit(main())
