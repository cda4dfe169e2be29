"""SVCCA between languages: how alike a model represents the same sentences in two languages.

MURAL (Jain et al. 2021, section 5) compares the languages' representations with SVCCA
(Raghu et al. 2017) and finds them grouped by language family and by area. For two views
of the same n data points, X [n, p] and Y [n, q] (here: the text embeddings of n parallel
sentences in two languages):
  1. centre each view and keep its top singular directions, the fewest that hold `keep`
     (99%) of its variance (SV);
  2. take the canonical correlations between the two reduced views (CCA), the singular
     values of Ux' Uy for orthonormal bases Ux, Uy of the kept directions;
  3. report their mean, in [0, 1]: 1 when one view is a linear map of the other.
CCA needs many more points than kept directions, or its correlations rise towards 1 by
chance: `svcca` refuses fewer than 2 points per kept direction, and the command line
prints n and the kept directions beside the matrix. As the paper plots its figure 3,
`laplacian_eigenmap` places the languages in 2-D from the matrix (Belkin and Niyogi 2003).

  python -m mural.svcca --export=EXP                  # the synthetic held-out scenes of EXP's config
  python -m mural.svcca --export=EXP --scenes=2000    # more of them
  python -m mural.svcca --export=EXP --texts=parallel.tsv   # a header of language codes, then a
                                                            # sentence per language on each row
Prints the languages' similarity matrix and their 2-D Laplacian eigenmap, then one JSON line.
"""

import argparse
import csv
import json
import sys
from typing import Dict, Sequence

import numpy as np


def _kept_basis(x: np.ndarray, keep: float) -> np.ndarray:
  """Orthonormal basis [n, k] of the centred view's top directions holding `keep` of its variance."""
  x = np.asarray(x, np.float64)
  u, s, _ = np.linalg.svd(x - x.mean(axis=0), full_matrices=False)
  if not np.sum(s ** 2) > 0:
    raise ValueError("svcca: a view is constant (every point the same): it has no direction to compare")
  variance = np.cumsum(s ** 2) / np.sum(s ** 2)
  k = int(np.searchsorted(variance, keep - 1e-12) + 1)
  return u[:, :k]


def canonical_correlations(x: np.ndarray, y: np.ndarray, keep: float = 0.99) -> np.ndarray:
  """The canonical correlations of the two views after SV reduction, largest first."""
  if len(x) != len(y):
    raise ValueError(f"svcca: the views have {len(x)} and {len(y)} points; they must be the same points")
  if not 0.0 < keep <= 1.0:
    raise ValueError(f"svcca: keep must be in (0, 1], got {keep}")
  if len(x) < 3:
    raise ValueError(f"svcca: {len(x)} points; it compares many (any 2 are linearly related)")
  bx, by = _kept_basis(x, keep), _kept_basis(y, keep)
  kept = max(bx.shape[1], by.shape[1])
  if len(x) < 2 * kept:
    raise ValueError(f"svcca: {len(x)} points for {kept} kept directions; CCA needs at least twice as "
                     f"many points (more sentences, or a smaller keep)")
  return np.clip(np.linalg.svd(bx.T @ by, compute_uv=False), 0.0, 1.0)


def svcca(x: np.ndarray, y: np.ndarray, keep: float = 0.99) -> float:
  """Mean canonical correlation of the SV-reduced views: 1 for linearly related views."""
  return float(np.mean(canonical_correlations(x, y, keep)))


def similarity_matrix(embeddings: Dict[str, np.ndarray], keep: float = 0.99) -> Dict[str, Dict[str, float]]:
  """{lang: {lang: SVCCA}} over every pair of languages (row i of each array: the same sentence)."""
  langs = list(embeddings)
  out = {a: {a: 1.0} for a in langs}
  for i, a in enumerate(langs):
    for b in langs[i + 1:]:
      out[a][b] = out[b][a] = svcca(embeddings[a], embeddings[b], keep)
  return out


def laplacian_eigenmap(matrix: Dict[str, Dict[str, float]], dims: int = 2) -> Dict[str, list]:
  """{lang: coordinates}: the languages embedded by the similarity matrix as affinities W, the
  eigenvectors of L v = lambda D v (L = D - W, D the degrees) after the constant one, smallest
  first (up to the number of languages - 1)."""
  langs = list(matrix)
  w = np.array([[matrix[a][b] for b in langs] for a in langs], np.float64)
  degree = w.sum(axis=1)
  scale = 1.0 / np.sqrt(degree)
  # The symmetric form D^-1/2 L D^-1/2 u = lambda u, v = D^-1/2 u.
  _, u = np.linalg.eigh(scale[:, None] * (np.diag(degree) - w) * scale[None, :])
  v = scale[:, None] * u[:, 1:1 + min(dims, len(langs) - 1)]
  v = v * np.sign(v[np.argmax(np.abs(v), axis=0), np.arange(v.shape[1])])  # One sign per axis.
  return {lang: [float(x) for x in row] for lang, row in zip(langs, v)}


def format_matrix(matrix: Dict[str, Dict[str, float]]) -> str:
  langs = list(matrix)
  rows = ["      " + "".join(f"{b:>7s}" for b in langs)]
  rows += [f"{a:6s}" + "".join(f"{matrix[a][b]:7.3f}" for b in langs) for a in langs]
  return "\n".join(rows)


# ---------------------------------------------------------------------------
# Command line.


def read_parallel_tsv(path: str) -> Dict[str, list]:
  """{lang: sentences} from a plain TSV (no quoting: a quote is text) whose header names each
  column's language."""
  with open(path, newline="", encoding="utf-8") as f:
    rows = list(csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE))
  if len(rows) < 2 or len(rows[0]) < 2:
    raise ValueError(f"{path}: needs a header of >= 2 language codes and rows of parallel sentences")
  header = [h.strip() for h in rows[0]]
  bad = [i + 2 for i, r in enumerate(rows[1:]) if len(r) != len(header)]
  if bad:
    raise ValueError(f"{path}: rows {bad[:5]} do not have {len(header)} fields")
  return {lang: [r[j] for r in rows[1:]] for j, lang in enumerate(header)}


def synthetic_parallel(export_dir: str, scenes: int) -> Dict[str, list]:
  """The export's config's held-out synthetic scenes, captioned in each of its languages."""
  from mural import systems  # pylint: disable=g-import-not-at-top
  from mural.data import synthetic  # pylint: disable=g-import-not-at-top
  config = systems.recorded(export_dir)  # The export's config.json.
  if config.data.eval_source.name != "synthetic":
    raise ValueError(f"{export_dir} was evaluated on {config.data.eval_source.name!r}, not the built-in "
                     "scenes: give its parallel sentences with --texts")
  with config.unlocked():
    config.data.synthetic.eval_scenes = scenes
  data = synthetic.build_eval_data(config)
  every = config.data.synthetic.eval_captions_per_scene  # Scene k's first caption: row k.
  return {lang: s.captions[::every] for lang, s in data.languages.items()}


def main(argv: Sequence[str] = None) -> Dict[str, Dict[str, float]]:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--export", required=True, help="an export directory (python -m mural.main --mode=export)")
  p.add_argument("--texts", help="TSV of parallel sentences (header: language codes)")
  p.add_argument("--scenes", type=int, default=1000, help="without --texts: held-out synthetic scenes")
  p.add_argument("--keep", type=float, default=0.99, help="share of each view's variance kept (SV step)")
  args = p.parse_args(argv)
  from mural import data  # pylint: disable=g-import-not-at-top
  data.set_tensorflow_env_defaults()  # Before TensorFlow loads.
  from mural import export  # pylint: disable=g-import-not-at-top
  texts = read_parallel_tsv(args.texts) if args.texts else synthetic_parallel(args.export, args.scenes)
  model = export.load(args.export)
  embeddings = {lang: model.embed_texts(sentences, lang) for lang, sentences in texts.items()}
  matrix = similarity_matrix(embeddings, args.keep)
  kept = {lang: _kept_basis(e, args.keep).shape[1] for lang, e in embeddings.items()}
  n = len(next(iter(texts.values())))
  print(f"SVCCA of {n} parallel sentences' text embeddings ({model.embed_dim}-d), kept directions "
        + ", ".join(f"{k} {v}" for k, v in kept.items()) + f" ({args.keep:.0%} of each one's variance):")
  print(format_matrix(matrix))
  eigenmap = laplacian_eigenmap(matrix)
  print("Laplacian eigenmap: " + ", ".join(f"{lang} ({', '.join(f'{x:+.3f}' for x in xy)})"
                                           for lang, xy in eigenmap.items()))
  print(json.dumps({"sentences": n, "keep": args.keep, "kept": kept, "svcca": matrix, "eigenmap": eigenmap}))
  return matrix


def cli(argv: Sequence[str]) -> int:
  """main's exit code: a missing export or file, or too few sentences, is one line on stderr."""
  try:
    main(argv)
  except (FileNotFoundError, ValueError) as e:  # config_lib.ConfigError is a ValueError.
    print(f"mural.svcca: error: {str(e).splitlines()[0]}", file=sys.stderr)
    return 1
  return 0


if __name__ == "__main__":
  sys.exit(cli(sys.argv[1:]))
