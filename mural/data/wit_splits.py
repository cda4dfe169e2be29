"""WIT's evaluation splits as MURAL builds them (its Appendix A.3), by a rule anyone can rerun.

WIT (Srinivasan et al. 2021, github.com/google-research-datasets/wit) releases its training set as
10 gzipped TSVs, wit_v1.train.all-0000K-of-00010.tsv.gz, each with a header row of the 17 COLUMNS.
MURAL keeps only reference descriptions (caption_reference_description: the text under an image
on its page), splits them per language of the Wikipedia page (`language`) into train/val/test
with an image in only one of them per language, and keeps 5k pairs for val and test (3k or 1k
for under-resourced languages). The paper publishes neither the images nor each language's size,
so these are fixed by a rule that gives the same split to anyone with the same TSVs, in any order:

  rank     an image ranks by sha256(image_url) (UTF-8) read as a big-endian integer, lowest first;
           the same rank in every language.
  caption  an image with several reference descriptions in a language keeps the one whose
           sha256 is lowest: a pair is one image and one text.
  size     a language with n images (distinct urls with a reference description) gets, per
           split, the largest of SIZES (5000, 3000, 1000) with n >= 4 x size, so val and test
           together take at most half its images and the rest stay for training; a language
           with fewer than 4 x 1000 images is skipped, said in the manifest.
  split    its `size` lowest-ranked images are test, the next `size` val, all others train.

Reading ~25 GB of gzipped TSV takes long, so the splits are written once (one process per file):

  python -m mural.data.wit_splits --tsv='/data/wit/wit_v1.train.all-*.tsv.gz' --out=/data/wit-splits

The folder then holds, per language, <lang>.test.jsonl and <lang>.val.jsonl ({"image_url",
"caption"} a line, by rank), test_urls.txt (every test image's url, one a line: img2dataset's
txt input) and manifest.json (the rule, the TSVs read and rows skipped, each language's images
and size). The 'wit' public set reads that folder (`read_split`); train is every other image of
a language.
"""

import argparse
import array
import csv
import glob
import gzip
import hashlib
import heapq
import json
import multiprocessing
import os
import sys
import time
import zlib
from typing import Dict, List, Sequence, Tuple

import numpy as np

COLUMNS = (
    "language", "page_url", "image_url", "page_title", "section_title", "hierarchical_section_title",
    "caption_reference_description", "caption_attribution_description", "caption_alt_text_description",
    "mime_type", "original_height", "original_width", "is_main_image", "attribution_passes_lang_id",
    "page_changed_recently", "context_page_description", "context_section_description")
# MURAL's two evaluation groups (Appendix A.3, Table 3), WIT's language codes.
WELL_RESOURCED = ("en", "de", "fr", "cs", "ja", "zh", "ru", "pl", "tr")
UNDER_RESOURCED = ("tg", "uz", "ga", "be", "mg", "ceb", "ht", "war")
LANGUAGES = WELL_RESOURCED + UNDER_RESOURCED
SIZES = (5000, 3000, 1000)  # Pairs per split, the largest that leaves half a language's images for training.
TRAIN_SHARE = 4  # n >= TRAIN_SHARE x size: val + test take at most half the images.
SPLITS = ("test", "val")
RULE = ("rank: sha256(image_url) as a big-endian integer, lowest first; caption: of an image's reference "
        "descriptions in the language, the lowest sha256; size: the largest of sizes with images >= 4 x size; "
        "split: the size lowest-ranked images are test, the next size val, the others train")
MANIFEST = "manifest.json"
TEST_URLS = "test_urls.txt"
_LANGUAGE, _URL, _CAPTION = (COLUMNS.index(c) for c in ("language", "image_url", "caption_reference_description"))
_PROGRESS_ROWS = 1_000_000


def _digest(text: str) -> int:
  return int.from_bytes(hashlib.sha256(text.encode("utf-8")).digest(), "big")


def size_for(images: int, sizes: Sequence[int] = SIZES) -> int:
  """Pairs per split for a language with `images` images; 0: too few to split."""
  return max((s for s in sizes if images >= TRAIN_SHARE * s), default=0)


class _Lowest:
  """The `keep` lowest-ranked images of one language seen so far, each with its chosen caption
  (lowest sha256), and every image's 64-bit rank prefix to count them at the end."""

  def __init__(self, keep: int):
    self.keep, self.heap, self.kept, self.prefixes = keep, [], {}, array.array("Q")

  def add(self, rank: int, url: str, caption: str, caption_rank: int) -> None:
    if url in self.kept:
      if caption_rank < self.kept[url][1]:
        self.kept[url] = (rank, caption_rank, caption)
      return
    if len(self.heap) < self.keep:
      heapq.heappush(self.heap, (-rank, url))
    elif rank < -self.heap[0][0]:
      del self.kept[heapq.heappushpop(self.heap, (-rank, url))[1]]
    else:
      return
    self.kept[url] = (rank, caption_rank, caption)

  def state(self) -> tuple:
    """Plain data for another process to `merge`."""
    return self.kept, self.prefixes.tobytes()

  def merge(self, state: tuple) -> None:
    """Adds another file's images: the lowest of the union are among the lowest of each part."""
    kept, prefixes = state
    for url, (rank, caption_rank, caption) in kept.items():
      self.add(rank, url, caption, caption_rank)
    self.prefixes.frombytes(prefixes)

  def first(self, count: int) -> List[Tuple[str, str]]:
    """(image_url, caption) of the `count` lowest-ranked images, lowest first."""
    return [(url, caption) for url, (_, _, caption) in sorted(self.kept.items(), key=lambda kv: kv[1][0])[:count]]

  def images(self) -> int:
    return len(np.unique(np.frombuffer(self.prefixes, np.uint64))) if self.prefixes else 0


def read_tsv(path: str, languages: Sequence[str], keep: int, log=print) -> Tuple[Dict[str, _Lowest], int]:
  """One WIT TSV -> (language -> its lowest-ranked images with their captions and its image
  count, rows skipped). A row without WIT's 17 fields is skipped and counted rather than ending
  an hour's read: the same files skip the same rows, and the manifest says how many."""
  wanted = set(languages)
  out, malformed = {lang: _Lowest(keep) for lang in languages}, 0
  start = time.time()
  csv.field_size_limit(2 ** 31 - 1)  # Context descriptions run long.
  try:
    with gzip.open(path, "rt", encoding="utf-8", newline="") if path.endswith(".gz") else \
        open(path, encoding="utf-8", newline="") as f:
      rows = csv.reader(f, delimiter="\t")
      header = next(rows, None)
      if tuple(header or ()) != COLUMNS:
        raise ValueError(f"{path}: its header is not WIT's 17 columns ({', '.join(COLUMNS[:3])}, ...): "
                         f"{'(empty file)' if header is None else ', '.join(header[:3]) + ', ...'}")
      for n, row in enumerate(rows, 2):
        if len(row) != len(COLUMNS):
          malformed += 1
          continue
        caption = row[_CAPTION].strip()
        if row[_LANGUAGE] in wanted and caption:
          url = row[_URL]
          rank = _digest(url)
          lowest = out[row[_LANGUAGE]]
          lowest.prefixes.append(rank >> 192)
          lowest.add(rank, url, caption, _digest(caption))
        if n % _PROGRESS_ROWS == 0:
          log(f"wit_splits: {path}: {n:,} rows ({time.time() - start:.0f} s)")
  except (OSError, EOFError, UnicodeDecodeError, csv.Error, zlib.error) as e:
    raise ValueError(f"{path}: not a readable WIT TSV ({type(e).__name__}: {e})") from None
  log(f"wit_splits: {path}: done ({time.time() - start:.0f} s)" +
      (f"; {malformed} rows without {len(COLUMNS)} fields skipped" if malformed else ""))
  return out, malformed


def _read_one(job, log=lambda line: print(line, flush=True)) -> tuple:
  """(path, {language: plain data to merge}, rows skipped) of one TSV."""
  path, languages, keep = job
  lowest, malformed = read_tsv(path, languages, keep, log)
  return path, {lang: v.state() for lang, v in lowest.items()}, malformed


def write(tsv: Sequence[str], out: str, languages: Sequence[str] = LANGUAGES, sizes: Sequence[int] = SIZES,
          processes: int = 0, log=print) -> dict:
  """Reads the TSVs (`processes` at a time; 0: one per file, at most the CPUs) and writes the
  splits to `out` (see the module docstring); returns the manifest."""
  if not tsv:
    raise ValueError("wit_splits: no TSV given (WIT's wit_v1.train.all-0000K-of-00010.tsv.gz)")
  for path in tsv:
    if not os.path.isfile(path):
      raise ValueError(f"wit_splits: {path} does not exist (expected WIT's gzipped TSV)")
  keep = len(SPLITS) * max(sizes)
  jobs = [(path, tuple(languages), keep) for path in tsv]
  processes = processes or min(len(jobs), os.cpu_count() or 1)
  merged = {lang: _Lowest(keep) for lang in languages}
  if processes > 1:
    # Spawned, not forked: a fork of a process that runs JAX's or TensorFlow's threads can deadlock.
    with multiprocessing.get_context("spawn").Pool(processes) as pool:
      results = list(pool.imap_unordered(_read_one, jobs))
  else:
    results = [_read_one(job, log) for job in jobs]
  malformed = {}
  for path, states, skipped in results:
    for lang, state in states.items():
      merged[lang].merge(state)
    if skipped:
      malformed[os.path.basename(path)] = skipped
  malformed = dict(sorted(malformed.items()))  # Files finish in any order.
  os.makedirs(out, exist_ok=True)
  manifest = dict(dataset="WIT (reference descriptions), MURAL Appendix A.3", rule=RULE,
                  tsv=sorted(os.path.basename(p) for p in tsv), malformed_rows=malformed, sizes=list(sizes),
                  languages={}, skipped={})
  test_urls = {}
  for lang in languages:
    images = merged[lang].images()
    size = size_for(images, sizes)
    if not size:
      manifest["skipped"][lang] = f"{images} images, fewer than {TRAIN_SHARE} x {min(sizes)}"
      log(f"wit_splits: {lang}: skipped ({manifest['skipped'][lang]})")
      continue
    pairs = merged[lang].first(len(SPLITS) * size)
    for k, split in enumerate(SPLITS):
      with open(os.path.join(out, f"{lang}.{split}.jsonl"), "w", encoding="utf-8") as f:
        f.writelines(json.dumps(dict(image_url=url, caption=caption), ensure_ascii=False) + "\n"
                     for url, caption in pairs[k * size:(k + 1) * size])
    test_urls.update(dict.fromkeys(url for url, _ in pairs[:size]))
    manifest["languages"][lang] = dict(images=images, size=size)
    log(f"wit_splits: {lang}: {images} images, {size} test and {size} val pairs")
  with open(os.path.join(out, TEST_URLS), "w", encoding="utf-8") as f:
    f.writelines(f"{url}\n" for url in test_urls)
  with open(os.path.join(out, MANIFEST), "w", encoding="utf-8") as f:
    json.dump(manifest, f, indent=1, ensure_ascii=False)
  return manifest


def read_split(folder: str, split: str = "test") -> Dict[str, List[Tuple[str, str]]]:
  """language -> [(image_url, caption)] of a split written by `write`, in the manifest's order;
  ValueError (one line, naming the file) when a file is missing, malformed or short."""
  if split not in SPLITS:
    raise ValueError(f"WIT splits: unknown split {split!r}; written: {list(SPLITS)}")
  manifest = path = os.path.join(folder, MANIFEST)
  if not os.path.isfile(path):
    raise ValueError(f"WIT splits: no {MANIFEST} in {folder}: write the splits first "
                     f"(python -m mural.data.wit_splits --tsv=WIT_TSVS --out={folder})")
  try:
    with open(path, encoding="utf-8") as f:
      languages = {lang: int(v["size"]) for lang, v in json.load(f)["languages"].items()}
  except (ValueError, KeyError, TypeError, AttributeError) as e:
    raise ValueError(f"{path}: not a WIT splits manifest (languages: {{lang: {{size}}}}): {e!r}") from None
  out = {}
  for lang, size in languages.items():
    path = os.path.join(folder, f"{lang}.{split}.jsonl")
    if not os.path.isfile(path):
      raise ValueError(f"WIT splits: {path} is missing ({MANIFEST} lists {lang} with {size} pairs)")
    pairs = []
    with open(path, encoding="utf-8") as f:
      for n, line in enumerate(f, 1):
        try:
          row = json.loads(line)
          pairs.append((row["image_url"], row["caption"]))
        except (ValueError, KeyError, TypeError) as e:
          raise ValueError(f"{path}: line {n} is not {{\"image_url\", \"caption\"}}: {e!r}") from None
    if len(pairs) != size or len({url for url, _ in pairs}) != size:
      raise ValueError(f"{path}: {len(pairs)} pairs of {len({u for u, _ in pairs})} images; {MANIFEST} "
                       f"says {size} pairs, one per image")
    out[lang] = pairs
  if not out:
    raise ValueError(f"{manifest}: no language was split (see its 'skipped')")
  return out


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(prog="python -m mural.data.wit_splits", description=__doc__.split("\n")[0])
  parser.add_argument("--tsv", action="append", required=True,
                      help="WIT's training TSVs (globs; repeat the flag or quote a glob)")
  parser.add_argument("--out", required=True, help="the folder to write the splits to")
  parser.add_argument("--languages", default=",".join(LANGUAGES), help="WIT language codes (default: MURAL's)")
  parser.add_argument("--sizes", default=",".join(map(str, SIZES)), help="pairs per split to choose from")
  parser.add_argument("--processes", type=int, default=0, help="files read at once (0: one per file, <= CPUs)")
  args = parser.parse_args(argv)
  tsv = sorted({p for pattern in args.tsv for p in (glob.glob(pattern) or [pattern])})
  try:
    sizes = sorted({int(s) for s in args.sizes.split(",")}, reverse=True)
    write(tsv, args.out, [lang for lang in args.languages.split(",") if lang], sizes, args.processes,
          log=lambda line: print(line, flush=True))
  except ValueError as e:
    print(f"mural.data.wit_splits: error: {e}", file=sys.stderr)
    return 1
  print(f"Splits written to {args.out}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
