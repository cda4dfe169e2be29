"""ANN recall@10 against exact search, with build and query times (mural.index's indexes).

  .venv/bin/python benchmarks/bench_ann.py                       # 100k x 80, 1000 queries, 1 thread
  .venv/bin/python benchmarks/bench_ann.py --dim=512 --threads=8  # MURAL-base's embedding size

Random unit vectors are the hard case for ANN (no clusters to exploit; every
distance looks alike), so recall here is a floor for real embeddings. Queries
are fresh random unit vectors, not database rows. Recall@10 = mean over
queries of |ANN top 10 ∩ exact top 10| / 10; exact is faiss IndexFlatIP. Each
index is built by mural.index.build with the command line's defaults (plus
the --ef_search / --nprobe values given here).
"""

import argparse
import time

import numpy as np

from mural import index as index_lib


def unit(rng, n: int, d: int) -> np.ndarray:
  x = rng.standard_normal((n, d), dtype=np.float32)
  return x / np.linalg.norm(x, axis=1, keepdims=True)


def main(argv=None) -> None:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--n", type=int, default=100_000, help="Database vectors.")
  p.add_argument("--dim", type=int, default=80, help="The demo embeds to 80, MURAL-base to 512.")
  p.add_argument("--queries", type=int, default=1000)
  p.add_argument("--k", type=int, default=10)
  p.add_argument("--threads", type=int, default=1, help="faiss OpenMP threads.")
  p.add_argument("--types", default="hnsw,ivfpq")
  p.add_argument("--ef_search", type=int, default=512)
  p.add_argument("--nprobe", type=int, default=32)
  p.add_argument("--seed", type=int, default=0)
  args = p.parse_args(argv)
  import faiss  # pylint: disable=g-import-not-at-top
  faiss.omp_set_num_threads(args.threads)
  rng = np.random.default_rng(args.seed)
  base, queries = unit(rng, args.n, args.dim), unit(rng, args.queries, args.dim)
  print(f"{args.n} x {args.dim} random unit vectors, {args.queries} queries, k={args.k}, "
        f"{args.threads} thread(s), faiss {faiss.__version__}")

  rows = []
  for kind in ["flat"] + args.types.split(","):
    start = time.perf_counter()
    index, params = index_lib.build(base, kind, ef_search=args.ef_search, nprobe=args.nprobe,
                                    seed=args.seed)
    built = time.perf_counter() - start
    start = time.perf_counter()
    _, found = index.search(queries, args.k)
    took = time.perf_counter() - start
    if kind == "flat":
      exact = found
    recall = np.mean([len(set(a) & set(b)) / args.k for a, b in zip(found, exact)])
    shown = {k: v for k, v in params.items() if k != "type"}
    rows.append((kind, recall, built, 1e3 * took / args.queries, shown))
  print(f"{'index':<7}{'recall@' + str(args.k):>10}{'build s':>10}{'ms/query':>10}  parameters")
  for kind, recall, built, per_query, shown in rows:
    print(f"{kind:<7}{recall:>10.4f}{built:>10.1f}{per_query:>10.3f}  {shown or ''}")


if __name__ == "__main__":
  main()
