"""Reading FastText .vec rows for a word vocabulary (MULE's and SMALR's initial word vectors).

  .venv/bin/python benchmarks/fasttext_read.py                       # 200k lines of 300-d
  git show REV:mural/models/word_lstm.py > /tmp/old_word_lstm.py
  .venv/bin/python benchmarks/fasttext_read.py --against=/tmp/old_word_lstm.py   # A/B in one process

Writes a .vec file of --lines random --dim-d vectors (FastText's text format: a
'count dim' header, then 'word v1 ... vD ' lines; once, kept in --dir), then
times word_lstm.load_fasttext for vocabularies of --vocab words spread over
the file, --repeats times (with --against, the two versions in turn and their
tables compared); prints the median seconds. FastText's published files hold
2M words a language, of which a vocabulary of 5k-50k words is 0.25-2.5%.
"""

import argparse
import importlib.util
import os
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from mural.models import word_lstm  # pylint: disable=g-import-not-at-top,wrong-import-position


def write_vec(path: str, lines: int, dim: int) -> None:
  rng = np.random.default_rng(0)
  with open(path, "w", encoding="utf-8") as f:
    f.write(f"{lines} {dim}\n")
    for start in range(0, lines, 10_000):
      block = rng.normal(size=(min(10_000, lines - start), dim))
      f.write("".join(f"w{start + j} " + " ".join(f"{x:.4f}" for x in row) + " \n" for j, row in enumerate(block)))


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--dir", default="/tmp/mural_fasttext_bench")
  parser.add_argument("--lines", type=int, default=200_000)
  parser.add_argument("--dim", type=int, default=300)
  parser.add_argument("--vocab", type=int, nargs="+", default=[5_000, 45_000])
  parser.add_argument("--repeats", type=int, default=3)
  parser.add_argument("--against", default="", help="another version of mural/models/word_lstm.py")
  args = parser.parse_args()
  os.makedirs(args.dir, exist_ok=True)
  path = os.path.join(args.dir, f"en_{args.lines}x{args.dim}.vec")
  if not os.path.exists(path):
    write_vec(path + ".tmp", args.lines, args.dim)
    os.rename(path + ".tmp", path)
  versions = {"this": word_lstm}
  if args.against:
    spec = importlib.util.spec_from_file_location("other_word_lstm", args.against)
    versions["other"] = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(versions["other"])
  pattern = path.replace("en_", "{lang}_")
  for vocab in args.vocab:
    step = max(1, args.lines // vocab)
    words = {"en": [f"w{i}" for i in range(0, args.lines, step)][:vocab]}
    seconds = {name: [] for name in versions}
    for _ in range(args.repeats):
      tables = {}
      for name, module in versions.items():
        start = time.perf_counter()
        tables[name], found = module.load_fasttext(pattern, ["en"], words, vocab + 2, args.dim)
        seconds[name].append(time.perf_counter() - start)
        assert found == {"en": len(words["en"])}, found
      if args.against:
        np.testing.assert_array_equal(tables["this"], tables["other"])
    line = f"{len(words['en'])} words of {args.lines} lines ({args.dim}-d): " + ", ".join(
        f"{name} {statistics.median(s):.2f} s" for name, s in seconds.items())
    if args.against:
      line += f"; other / this {statistics.median(seconds['other']) / statistics.median(seconds['this']):.1f}x"
    print(line + f" (medians of {args.repeats})", flush=True)


if __name__ == "__main__":
  main()
