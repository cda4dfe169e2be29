"""Time and peak memory of the evaluator's retrieval scoring at 10^5 and 10^6 candidates (issue 13).

  .venv/bin/python benchmarks/bench_retrieval.py                    # 1e4 captions vs 1e4, 1e5, 1e6 images
  .venv/bin/python benchmarks/bench_retrieval.py --images=100000 --texts=1000 --dim=512

Random unit embeddings (float64, as the evaluator holds them): `--texts`
captions, caption i of image i, against `--images` candidate images. Each size
runs in its own process (so its peak RSS is its own) through
mural.metrics.retrieval_metrics_from_embeddings, the evaluator's scoring: blocks
of at most metrics.BLOCK_ELEMENTS similarities, never the texts x images
matrix. Beside it, for the sizes where it fits in --full_limit_gb, the full
matrix (metrics.retrieval_metrics on texts @ images.T), with its figures
checked equal. Peak RSS is the process's (ru_maxrss), before and after scoring. Prints one
line per size and a JSON line.
"""

import argparse
import json
import resource
import subprocess
import sys
import time


def _one(images: int, texts: int, dim: int, full: bool) -> dict:
  import numpy as np  # pylint: disable=g-import-not-at-top
  from mural import metrics  # pylint: disable=g-import-not-at-top
  rng = np.random.default_rng(0)
  image_emb = rng.normal(size=(images, dim))
  image_emb /= np.linalg.norm(image_emb, axis=1, keepdims=True)
  text_to_image = np.arange(texts)
  text_emb = image_emb[:texts] + 1.5 * rng.normal(size=(texts, dim)) / np.sqrt(dim)
  text_emb /= np.linalg.norm(text_emb, axis=1, keepdims=True)
  del rng
  peak_mb = lambda: resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
  out = dict(images=images, texts=texts, dim=dim, embeddings_mb=(image_emb.nbytes + text_emb.nbytes) / 2**20,
             peak_before_mb=peak_mb())
  start = time.perf_counter()
  got = metrics.retrieval_metrics_from_embeddings(text_emb, image_emb, text_to_image)
  out.update(blockwise_s=time.perf_counter() - start, blockwise_peak_mb=peak_mb(), mR=got["mR"])
  if full:
    start = time.perf_counter()
    want = metrics.retrieval_metrics(text_emb @ image_emb.T, text_to_image)
    out.update(full_s=time.perf_counter() - start, equal=(want == got), full_peak_mb=peak_mb())
  return out


def main():
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--images", type=int, nargs="*", default=[10_000, 100_000, 1_000_000])
  parser.add_argument("--texts", type=int, default=10_000)
  parser.add_argument("--dim", type=int, default=64)
  parser.add_argument("--full_limit_gb", type=float, default=4.0,
                      help="Run the full-matrix scoring too where texts x images x 8 bytes fit in this.")
  parser.add_argument("--one", type=int, default=None, help=argparse.SUPPRESS)  # Child process.
  args = parser.parse_args()
  if args.one is not None:
    full = args.texts * args.one * 8 * 2 <= args.full_limit_gb * 2**30  # Scores + their comparisons.
    print("RESULT " + json.dumps(_one(args.one, args.texts, args.dim, full)), flush=True)
    return
  results = []
  for n in args.images:
    proc = subprocess.run([sys.executable, __file__, f"--one={n}", f"--texts={args.texts}", f"--dim={args.dim}",
                           f"--full_limit_gb={args.full_limit_gb}"], capture_output=True, text=True, check=True)
    r = json.loads([l for l in proc.stdout.splitlines() if l.startswith("RESULT ")][-1][7:])
    results.append(r)
    full = (f"; then the full matrix: {r['full_s']:.1f} s, peak RSS {r['full_peak_mb']:.0f} MB, "
            f"figures equal: {r['equal']}" if "full_s" in r else "; full matrix not run (over --full_limit_gb)")
    print(f"{r['texts']} captions x {n} images (D={r['dim']}, embeddings {r['embeddings_mb']:.0f} MB, "
          f"peak RSS before scoring {r['peak_before_mb']:.0f} MB): blockwise {r['blockwise_s']:.1f} s, "
          f"peak RSS {r['blockwise_peak_mb']:.0f} MB, mR {r['mR']:.2f}{full}", flush=True)
  print(json.dumps(results))


if __name__ == "__main__":
  main()
