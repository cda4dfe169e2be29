"""Translation by retrieval as Globetrotter scores it, and word translation by Procrustes.

Sentence level (paper 5.2): N scenes captioned in all M languages, N * M
sentences. Each sentence is a query against the other N * M - 1; its M - 1
positives are its scene's captions in the other languages; the score is the
share of positives among its top M - 1, averaged over queries (chance
(M - 1) / (N M - 1)). `MultiwayTranslation` runs it on the eval sets (one
per language, the same scenes) with a text head.

Word level (paper 3.4): the rows of two languages' word embeddings are
aligned by an orthogonal map (Procrustes, Schönemann 1966) fitted on anchor
pairs, the mutual nearest neighbours under CSLS with k = 5 neighbours
(Conneau et al. 2018's refinement, the 'standard practice' the paper
follows), refitted on the new anchors a few times.
"""

from typing import Any, Dict, Optional, Sequence

import numpy as np


def multiway_translation_score(embeddings: np.ndarray, scene: np.ndarray, lang: np.ndarray) -> Dict[str, float]:
  """Share of each query's M - 1 translations ranked in its top M - 1, among all other sentences.

  embeddings [S, D] (L2-normalised; S = N * M), scene [S] and lang [S]
  integer ids; every scene must have exactly one sentence per language.
  Ties are broken by position (a stable sort of -similarity). Returns
  {'mean': the score in percent, <lang id>: the score of that language's
  queries in percent}.
  """
  emb = np.asarray(embeddings, np.float64)
  scene, lang = np.asarray(scene), np.asarray(lang)
  langs = np.unique(lang)
  m = len(langs)
  counts = np.unique(scene * (lang.max() + 1) + lang, return_counts=True)[1]
  if m < 2 or np.any(counts != 1) or len(scene) != m * len(np.unique(scene)):
    raise ValueError("multiway_translation_score: needs every scene once in each of >= 2 languages")
  sims = emb @ emb.T
  np.fill_diagonal(sims, -np.inf)  # A query never retrieves itself.
  top = np.argsort(-sims, axis=1, kind="stable")[:, :m - 1]
  hits = (scene[top] == scene[:, None]).sum(axis=1) / (m - 1)
  out = {"mean": 100.0 * float(hits.mean())}
  out.update({int(l): 100.0 * float(hits[lang == l].mean()) for l in langs})
  return out


class MultiwayTranslation:
  """Translation by retrieval over every language of the eval sets (eval_data.EvalSet per
  language over the same scenes; the first caption of each scene is its sentence)."""

  def __init__(self, sets: Sequence[Any], head: Optional[str]):
    self.sets, self.head = list(sets), head

  def run(self, embedder, variables) -> Dict[str, float]:
    embs, scenes, langs = [], [], []
    for l, s in enumerate(self.sets):
      scene_ids, first = np.unique(s.text_to_image, return_index=True)
      embs.append(embedder.texts(variables, s.text_ids[first], s.text_mask[first], self.head))
      scenes.append(scene_ids)
      langs.append(np.full(len(first), l))
    scores = multiway_translation_score(np.concatenate(embs), np.concatenate(scenes), np.concatenate(langs))
    out = {"translation_retrieval/mean": scores["mean"]}
    out.update({f"translation_retrieval/{s.name}": scores[l] for l, s in enumerate(self.sets)})
    return out


# ---- Word translation ------------------------------------------------------------------


def _unit(x):
  x = np.asarray(x, np.float64)
  return x / np.maximum(np.linalg.norm(x, axis=-1, keepdims=True), 1e-12)


def procrustes(x: np.ndarray, y: np.ndarray) -> np.ndarray:
  """The orthogonal W minimising ||x W - y||_F for paired rows: U V^T of svd(x^T y)."""
  u, _, vt = np.linalg.svd(np.asarray(x, np.float64).T @ np.asarray(y, np.float64))
  return u @ vt


def csls(x: np.ndarray, y: np.ndarray, k: int = 5) -> np.ndarray:
  """[n, m] CSLS scores 2 cos(x_i, y_j) - r_y(x_i) - r_x(y_j), r the mean cosine of the k nearest
  rows of the other set (Conneau et al. 2018): it discounts hubs."""
  cos = _unit(x) @ _unit(y).T
  kx, ky = min(k, cos.shape[1]), min(k, cos.shape[0])
  r_x = np.mean(-np.sort(-cos, axis=1)[:, :kx], axis=1)  # Of each x_i, over y.
  r_y = np.mean(-np.sort(-cos, axis=0)[:ky, :], axis=0)  # Of each y_j, over x.
  return 2 * cos - r_x[:, None] - r_y[None, :]


def mutual_nearest_neighbours(x: np.ndarray, y: np.ndarray, k: int = 5) -> np.ndarray:
  """[P, 2] index pairs (i, j): y_j is x_i's best match under CSLS(k) and x_i is y_j's."""
  s = csls(x, y, k)
  best_y, best_x = np.argmax(s, axis=1), np.argmax(s, axis=0)
  i = np.flatnonzero(best_x[best_y] == np.arange(len(x)))
  return np.stack([i, best_y[i]], axis=1)


def align_words(x: np.ndarray, y: np.ndarray, k: int = 5, iterations: int = 5) -> np.ndarray:
  """W mapping x's rows onto y's space: anchors from mutual nearest neighbours (CSLS, k), Procrustes
  on them, repeated with the anchors of the mapped rows."""
  x, y = _unit(x), _unit(y)
  w = np.eye(x.shape[1])
  for _ in range(iterations):
    pairs = mutual_nearest_neighbours(x @ w, y, k)
    if len(pairs) == 0:
      break
    w = procrustes(x[pairs[:, 0]], y[pairs[:, 1]])
  return w


def word_translation_accuracy(x: np.ndarray, y: np.ndarray, gold: Sequence[tuple], k: int = 5,
                              iterations: int = 5) -> float:
  """Percent of gold (i, j) pairs whose x_i, mapped by align_words, has y_j as its CSLS best match."""
  w = align_words(x, y, k, iterations)
  best = np.argmax(csls(_unit(x) @ w, y, k), axis=1)
  return 100.0 * float(np.mean([best[i] == j for i, j in gold]))
