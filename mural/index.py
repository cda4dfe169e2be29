"""A nearest-neighbour index (faiss, inner product on unit vectors) over mural.embed's output.

  python -m mural.index --embeddings=OUT [--kind=images|texts] --index=IDX [--type=auto]

--type: flat (exact), hnsw (graph; M, efConstruction, efSearch), ivfpq
(inverted lists of product-quantised codes, re-ranked exactly on the
--refine * k best: compact, still ~exact at the top), or auto: flat up to
--flat_max vectors, hnsw above. ScaNN is not offered: scann 1.4.2, the
current release, fails to import beside TensorFlow 2.21 (the version mural
pins), so it cannot run in mural's environment.
IDX is a directory: index.faiss, ids.txt (row order), index.json (type,
parameters, count, dim, the embeddings' settings).
"""

import argparse
import json
import os
import sys
import time
from typing import List, Tuple

import numpy as np

from mural import disk_space

TYPES = ("auto", "flat", "hnsw", "ivfpq")
_PQ_BITS = 8  # Per sub-quantiser code: 2^8 centroids each, learned from the vectors.
_PQ_CODES = 2 ** _PQ_BITS


def build(vectors: np.ndarray, kind: str = "auto", flat_max: int = 50_000, hnsw_m: int = 32,
          ef_construction: int = 128, ef_search: int = 512, nlist: int = 0, pq_m: int = 0,
          nprobe: int = 32, refine: int = 4, seed: int = 0):
  """(faiss index over the rows of `vectors`, {'type', parameters}) by inner product."""
  import faiss  # pylint: disable=g-import-not-at-top
  vectors = np.ascontiguousarray(vectors, np.float32)
  n, d = vectors.shape
  if kind not in TYPES:
    raise ValueError(f"--type: {kind!r} not in {TYPES}")
  # Checked here: faiss aborts the process on some bad values (HNSW's M = 0) and takes others.
  for flag, value, least in (("flat_max", flat_max, 0), ("hnsw_m", hnsw_m, 2), ("ef_construction", ef_construction, 1),
                             ("ef_search", ef_search, 1), ("nlist", nlist, 0), ("pq_m", pq_m, 0),
                             ("nprobe", nprobe, 1), ("refine", refine, 1)):
    if not (isinstance(value, (int, np.integer)) and value >= least):
      raise ValueError(f"--{flag} must be an int >= {least}, got {value!r}")
  if kind == "auto":
    kind = "flat" if n <= flat_max else "hnsw"
  params = {"type": kind}
  if kind == "flat":
    index = faiss.IndexFlatIP(d)
  elif kind == "hnsw":
    index = faiss.IndexHNSWFlat(d, hnsw_m, faiss.METRIC_INNER_PRODUCT)
    index.hnsw.efConstruction = ef_construction
    index.hnsw.efSearch = ef_search
    params.update(hnsw_m=hnsw_m, ef_construction=ef_construction, ef_search=ef_search)
  else:
    if n < _PQ_CODES:
      raise ValueError(f"--type=ivfpq: {n} vectors, and its product quantiser learns {_PQ_CODES} codes per "
                       "part from at least as many: use --type=flat or hnsw")
    nlist = nlist or max(1, min(int(4 * np.sqrt(n)), n // 39))  # faiss wants >= 39 points per list.
    if nlist > n:
      raise ValueError(f"--nlist {nlist}: more inverted lists than the {n} vectors")
    if pq_m and d % pq_m:
      raise ValueError(f"--pq_m {pq_m} does not divide the vectors' dimension {d}")
    pq_m = pq_m or next(m for m in (d // 4, d // 2, d, 1) if m and d % m == 0)
    quantizer = faiss.IndexFlatIP(d)
    ivf = faiss.IndexIVFPQ(quantizer, d, nlist, pq_m, _PQ_BITS, faiss.METRIC_INNER_PRODUCT)
    ivf.cp.seed = seed
    train = vectors if n <= 100_000 else vectors[np.random.default_rng(seed).choice(n, 100_000, replace=False)]
    ivf.train(train)
    ivf.nprobe = min(nprobe, nlist)
    index = faiss.IndexRefineFlat(ivf)
    index.k_factor = refine
    params.update(nlist=nlist, pq_m=pq_m, nprobe=ivf.nprobe, refine=refine)
  index.add(vectors)
  return index, params


class Index:
  """A saved index: search(queries [N, D], k) -> (scores [N, k], ids [N][k])."""

  def __init__(self, path: str):
    import faiss  # pylint: disable=g-import-not-at-top
    if not os.path.exists(os.path.join(path, "index.json")):
      raise FileNotFoundError(f"{path} is not an index directory (no index.json; build one with "
                              "python -m mural.index)")
    with open(os.path.join(path, "index.json")) as f:
      self.meta = json.load(f)
    self.index = faiss.read_index(os.path.join(path, "index.faiss"))
    if self.meta["type"] == "hnsw":
      self.index.hnsw.efSearch = self.meta["ef_search"]
    elif self.meta["type"] == "ivfpq":
      self.index.k_factor = self.meta["refine"]
      faiss.extract_index_ivf(self.index).nprobe = self.meta["nprobe"]
    with open(os.path.join(path, "ids.txt"), encoding="utf-8") as f:
      self.ids = f.read().splitlines()

  def search(self, queries: np.ndarray, k: int) -> Tuple[np.ndarray, List[List[str]]]:
    if not (isinstance(k, (int, np.integer)) and k >= 1):
      raise ValueError(f"k must be an int >= 1, got {k!r}")
    queries = np.ascontiguousarray(np.atleast_2d(queries), np.float32)
    scores, rows = self.index.search(queries, min(k, len(self.ids)))
    return scores, [[self.ids[r] for r in row if r >= 0] for row in rows]


def save(index, params: dict, ids: List[str], path: str, extra: dict) -> None:
  """Writes the index folder beside its place and renames it in (an older index there is
  replaced): a reader never sees half of one, and a full disk leaves no partial copy."""
  import faiss  # pylint: disable=g-import-not-at-top
  path = os.path.normpath(path)
  tmp = f"{path}.tmp-{os.getpid()}"
  disk_space.remove(tmp)
  with disk_space.writing("the index", path, partial=tmp,
                          resume="the embeddings are untouched: the same command builds it once there "
                                 "is space"):
    os.makedirs(tmp)
    faiss.write_index(index, os.path.join(tmp, "index.faiss"))
    with open(os.path.join(tmp, "ids.txt"), "w", encoding="utf-8") as f:
      f.write("".join(i + "\n" for i in ids))
    with open(os.path.join(tmp, "index.json"), "w") as f:
      json.dump({**params, "count": len(ids), "dim": index.d, **extra}, f, indent=1)
    disk_space.remove(path)
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    os.replace(tmp, path)


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(prog="python -m mural.index", description=__doc__.split("\n")[0])
  parser.add_argument("--embeddings", required=True, help="mural.embed's --output (or its images/ or texts/).")
  parser.add_argument("--kind", choices=("images", "texts"), default="images")
  parser.add_argument("--index", required=True, help="Index directory to write.")
  parser.add_argument("--type", choices=TYPES, default="auto")
  parser.add_argument("--flat_max", type=int, default=50_000, help="auto: exact up to this many vectors.")
  parser.add_argument("--hnsw_m", type=int, default=32)
  parser.add_argument("--ef_construction", type=int, default=128)
  parser.add_argument("--ef_search", type=int, default=512,
                      help="hnsw: candidates per query (recall vs time; 512: >= 0.95 on benchmarks/bench_ann.py).")
  parser.add_argument("--nlist", type=int, default=0, help="ivfpq lists (0: ~4 sqrt(N)).")
  parser.add_argument("--pq_m", type=int, default=0, help="ivfpq sub-quantisers (0: D/4).")
  parser.add_argument("--nprobe", type=int, default=32)
  parser.add_argument("--refine", type=int, default=4, help="ivfpq: re-rank refine * k exactly.")
  args = parser.parse_args(argv)
  try:
    from mural import embed  # pylint: disable=g-import-not-at-top
    directory = args.embeddings
    if not os.path.basename(os.path.normpath(directory)) in ("images", "texts"):
      directory = os.path.join(directory, args.kind)
    vectors, ids = embed.load_embeddings(directory)
    start = time.monotonic()
    index, params = build(vectors, args.type, args.flat_max, args.hnsw_m, args.ef_construction,
                          args.ef_search, args.nlist, args.pq_m, args.nprobe, args.refine)
    settings = os.path.join(os.path.dirname(os.path.normpath(directory)), "embed.json")
    extra = {"kind": os.path.basename(os.path.normpath(directory)), "embeddings": os.path.abspath(directory)}
    if os.path.exists(settings):
      with open(settings) as f:
        extra["embed"] = json.load(f)
    save(index, params, ids, args.index, extra)
    print(f"{params['type']} index of {len(ids)} vectors (dim {vectors.shape[1]}) in "
          f"{time.monotonic() - start:.1f} s: {args.index}", file=sys.stderr)
  except disk_space.DiskFull as e:
    print(f"mural.index: error: {e}", file=sys.stderr)
    return 1
  except (FileNotFoundError, ValueError) as e:
    print(f"mural.index: error: {str(e).splitlines()[0]}", file=sys.stderr)
    return 1
  return 0


if __name__ == "__main__":
  sys.exit(main())
