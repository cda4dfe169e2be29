"""The public sets' cost at the field's sizes: time and peak memory of scoring, and of the command.

    python benchmarks/public_sets_cost.py --work=/tmp/public_sets_cost [--export=DIR] [--record]

Each case runs as its own process (this one imports no framework: a child's peak RSS, from wait4,
starts at its parent's RSS when it forks):
  score 5k        MSCOCO 5k's shape: 5,000 images, 25,000 captions, image<->text (random unit
                  embeddings of 640; mural.public_sets.parts.score, as the command scores)
  score 36k       36,000 images, one caption each, image<->text and translation retrieval of the
                  captions against 36,000 translations
  score cxc 5k    Crisscrossed Captions' shape: 25,000 captions and 5,000 images, all four
                  retrieval directions with ~44k rated pairs per file, the three correlations
                  (1000 resamples each)
  score zero-shot ImageNet's shape: 50,000 images, 1,000 classes of 7 prompts
  command 5k/36k  with --export: `python -m mural.evaluate_public` on a Multi30k-layout release of
                  N generated photos (64x64 JPEGs) with en and de captions, written to --work once:
                  every image decoded and embedded by the export, the tables printed
--record appends the figures to benchmarks/results.jsonl.
"""

import argparse
import gzip
import json
import os
import pathlib
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
import process_cost  # pylint: disable=g-import-not-at-top,wrong-import-position

DIM = 640  # MURAL-BASE's embedding width (EfficientNet-B7's pooled features are 640 wide).


class Fixed:
  """Embeddings fixed in advance, by sentence and by image name: what an export's embed_texts and
  embed_images return, without a model (the scoring is what these cases time)."""

  def __init__(self, seed: int):
    import numpy as np  # pylint: disable=g-import-not-at-top
    self.np, self.rng = np, np.random.default_rng(seed)

  def _unit(self, n):
    x = self.rng.normal(size=(n, DIM)).astype(self.np.float32)
    return x / self.np.linalg.norm(x, axis=1, keepdims=True)

  def embed_texts(self, texts, langs):
    del langs
    return self._unit(len(texts))

  def embed_images(self, paths):
    return self._unit(len(paths))


def _score_case(case: str) -> None:
  import numpy as np  # pylint: disable=g-import-not-at-top
  from mural.public_sets import cxc, parts, zero_shot  # pylint: disable=g-import-not-at-top
  rng = np.random.default_rng(0)
  if case == "score 5k":
    n, per = 5000, 5
    work = [parts.Retrieval("5k", "en", [f"i{i}" for i in range(n)], [f"c{j}" for j in range(n * per)],
                            np.repeat(np.arange(n), per))]
  elif case == "score 36k":
    n = 36000
    work = [parts.Retrieval("36k", "en", [f"i{i}" for i in range(n)], [f"c{j}" for j in range(n)], np.arange(n)),
            parts.Translation("36k", "en", "de", [f"c{j}" for j in range(n)], [f"t{j}" for j in range(n)])]
  elif case == "score cxc 5k":
    images, captions = [f"i{i}" for i in range(5000)], [f"c{j}" for j in range(25000)]

    def rated(rows, left, right):
      pairs = np.stack([rng.integers(0, left, rows), rng.integers(0, right, rows)], 1)
      return cxc.Ratings(pairs, rng.integers(0, 11, rows) / 2, pairs[:, 1 if left != right else 0])

    sts, sis, sits = rated(44045, 25000, 25000), rated(46719, 5000, 5000), rated(44833, 25000, 5000)
    original = np.stack([np.arange(25000), np.repeat(np.arange(5000), 5)], 1)
    work = [cxc.CrossModal("test/image-text", images, captions,
                           np.unique(np.concatenate([original, sits.pairs[sits.scores >= 3]]), axis=0)),
            cxc.IntraModal("test/text-text", "text", captions, sts.pairs[sts.scores >= 3]),
            cxc.IntraModal("test/image-image", "image", images, sis.pairs[sis.scores >= 2.5]),
            cxc.Similarity("test/similarity", images, captions, [("sts", sts), ("sis", sis), ("sits", sits)])]
  elif case == "score zero-shot":
    classes = [f"class {c}" for c in range(1000)]
    work = [zero_shot.Classification("val", "en", [f"i{i}" for i in range(50000)], rng.integers(0, 1000, 50000),
                                     classes, zero_shot.fill([f"prompt {k} of {{c}}" for k in range(7)], classes))]
  else:
    raise SystemExit(f"unknown case {case!r}")
  start = time.time()
  rows = parts.score(case, work, Fixed(1), log=lambda line: None)
  print(json.dumps({"rows": len(rows), "score s": round(time.time() - start, 1)}))


def _release(folder: pathlib.Path, n: int) -> pathlib.Path:
  """A Multi30k-layout release of n generated photos (images/) with en and de captions, once."""
  done = folder / "done"
  if done.exists():
    return folder
  import numpy as np  # pylint: disable=g-import-not-at-top
  from PIL import Image  # pylint: disable=g-import-not-at-top
  rng = np.random.default_rng(n)
  (folder / "task1" / "image_splits").mkdir(parents=True, exist_ok=True)
  (folder / "task1" / "raw").mkdir(exist_ok=True)
  (folder / "images").mkdir(exist_ok=True)
  names = [f"{i:06d}.jpg" for i in range(n)]
  for name in names:  # Coarse colour blocks, upsampled: photo-sized JPEGs that decode like photos.
    blocks = rng.integers(0, 256, (8, 8, 3), np.uint8)
    Image.fromarray(blocks).resize((64, 64), Image.BILINEAR).save(folder / "images" / name, quality=90)
  (folder / "task1" / "image_splits" / "test_2016_flickr.txt").write_text("".join(f"{m}\n" for m in names))
  words = {"en": ("a", "red", "dog", "runs", "on", "the", "grass", "near", "two", "people"),
           "de": ("ein", "roter", "Hund", "läuft", "auf", "dem", "Gras", "bei", "zwei", "Leuten")}
  for lang, vocab in words.items():
    with gzip.open(folder / "task1" / "raw" / f"test_2016_flickr.{lang}.gz", "wt", encoding="utf-8") as f:
      for i in range(n):
        f.write(" ".join(vocab[(i // 10 ** k + k) % len(vocab)] for k in range(8)) + f" {i}\n")
  done.write_text("")
  return folder


def _run(name: str, argv) -> dict:
  """process_cost.run in the repository, with the child's last JSON line's figures."""
  step = process_cost.run(name, argv, ROOT)
  last = [line for line in step.pop("output").splitlines() if line.startswith("{")]
  return {**step, **(json.loads(last[-1]) if last else {})}


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--work", default="/tmp/public_sets_cost")
  parser.add_argument("--export", default="", help="an export directory: also time the command end to end")
  parser.add_argument("--case", default="", help=argparse.SUPPRESS)  # A child's one case.
  parser.add_argument("--record", action="store_true")
  args = parser.parse_args()
  if args.case:
    _score_case(args.case)
    return
  figures = {}
  for case in ("score 5k", "score 36k", "score cxc 5k", "score zero-shot"):
    step = _run(case, [sys.executable, __file__, f"--case={case}"])
    figures.update({f"{case} s": step["score s"], f"{case} peak RSS MiB": step["peak RSS MiB"]})
  if args.export:
    for n in (5000, 36000):
      release = _release(pathlib.Path(args.work) / f"multi30k_{n}", n)
      label = f"command {n // 1000}k"
      step = _run(label, [sys.executable, "-m", "mural.evaluate_public", f"--export={args.export}",
                          f"--set=multi30k:{release}", f"--images=multi30k:{release / 'images'}"])
      figures.update({f"{label} s": step["wall s"], f"{label} peak RSS MiB": step["peak RSS MiB"]})
  print(json.dumps(figures, indent=1))
  if args.record:
    import results  # pylint: disable=g-import-not-at-top
    config = f"embeddings of {DIM}"
    if args.export:
      with open(os.path.join(args.export, "manifest.json"), encoding="utf-8") as f:
        config += f"; command: an export embedding {json.load(f)['embed_dim']} wide"
    results.record("public_sets_cost", figures, config=config)


if __name__ == "__main__":
  main()
