"""Retrieval metrics: pure NumPy, apart from any code that reads data or models.

Ties count against the model: a candidate scoring equal to the right answer
ranks ahead of it. A constant scorer therefore gets chance-level recall, not
a perfect one.
"""

from typing import Dict, Sequence

import numpy as np

RECALL_KS = (1, 5, 10)


def unit_rows(x: np.ndarray) -> np.ndarray:
  """Rows over their L2 norms, in float64 (a zero row stays zero): cosine scores as dot products."""
  x = np.asarray(x, np.float64)
  return x / np.maximum(np.linalg.norm(x, axis=-1, keepdims=True), 1e-12)


def _recall_at(ranks: np.ndarray, ks: Sequence[int]) -> Dict[int, float]:
  """Percent of queries whose 0-based rank of the first right answer is < k."""
  return {k: 100.0 * float(np.mean(ranks < k)) for k in ks}


def text_to_image_ranks(sim: np.ndarray, text_to_image: np.ndarray) -> np.ndarray:
  """0-based rank of each text's image among all images.

  Args:
    sim: [M texts, N images] similarity.
    text_to_image: [M] index of each text's image.
  """
  sim = np.asarray(sim, np.float64)
  rows = np.arange(sim.shape[0])
  target = sim[rows, text_to_image]
  ahead = sim >= target[:, None]
  ahead[rows, text_to_image] = False
  return ahead.sum(axis=1)


def image_to_text_ranks(sim: np.ndarray, text_to_image: np.ndarray) -> np.ndarray:
  """0-based rank of each image's best-ranked caption among all texts.

  An image with several captions is answered by whichever ranks highest.
  Images without any caption are left out (the result has one entry per image
  that has at least one caption).
  """
  sim = np.asarray(sim, np.float64)
  num_images = sim.shape[1]
  best = np.full(num_images, -np.inf)
  np.maximum.at(best, text_to_image, sim[np.arange(sim.shape[0]), text_to_image])
  relevant = text_to_image[:, None] == np.arange(num_images)[None, :]  # [M, N]
  ahead = (sim >= best[None, :]) & ~relevant
  has_caption = np.isfinite(best)
  return ahead.sum(axis=0)[has_caption]


def retrieval_metrics(sim: np.ndarray, text_to_image: np.ndarray,
                      ks: Sequence[int] = RECALL_KS) -> Dict[str, float]:
  """Image->text and text->image Recall@K (percent) and their mean, mR.

  mR is the mean of the 2 * len(ks) recalls (MURAL: R@1/5/10 both ways).
  """
  text_to_image = np.asarray(text_to_image, np.int64)
  if sim.ndim != 2 or sim.shape[0] != text_to_image.shape[0]:
    raise ValueError(f"sim {sim.shape} does not match text_to_image {text_to_image.shape}")
  if text_to_image.size and (text_to_image.min() < 0 or text_to_image.max() >= sim.shape[1]):
    raise ValueError(f"text_to_image indices must lie in [0, {sim.shape[1]})")
  out = {}
  for k, r in _recall_at(image_to_text_ranks(sim, text_to_image), ks).items():
    out[f"i2t_R@{k}"] = r
  for k, r in _recall_at(text_to_image_ranks(sim, text_to_image), ks).items():
    out[f"t2i_R@{k}"] = r
  out["mR"] = float(np.mean(list(out.values())))
  return out


# Similarities held at once by the blockwise functions below (float64: 128 MiB).
BLOCK_ELEMENTS = 1 << 24


def _blocks(total: int, other: int):
  """Slices of `total` rows whose [rows, other] block stays within BLOCK_ELEMENTS."""
  step = max(1, BLOCK_ELEMENTS // max(other, 1))
  return [slice(start, min(start + step, total)) for start in range(0, total, step)]


def retrieval_metrics_from_embeddings(texts: np.ndarray, images: np.ndarray, text_to_image: np.ndarray,
                                      ks: Sequence[int] = RECALL_KS) -> Dict[str, float]:
  """retrieval_metrics(texts @ images.T, ...) without the [M, N] matrix: the same ranks and ties,
  computed over blocks of rows (text->image) and of columns (image->text), so a million
  candidates score in bounded memory. texts [M, D] and images [N, D] as the evaluator gives
  them (float64)."""
  texts, images = np.asarray(texts, np.float64), np.asarray(images, np.float64)
  text_to_image = np.asarray(text_to_image, np.int64)
  if text_to_image.shape != (texts.shape[0],):
    raise ValueError(f"text_to_image {text_to_image.shape} does not match {texts.shape[0]} texts")
  if text_to_image.size and (text_to_image.min() < 0 or text_to_image.max() >= images.shape[0]):
    raise ValueError(f"text_to_image indices must lie in [0, {images.shape[0]})")
  t2i = np.concatenate([text_to_image_ranks(texts[rows] @ images.T, text_to_image[rows])
                        for rows in _blocks(texts.shape[0], images.shape[0])] or [np.zeros(0, np.int64)])
  i2t = []
  for cols in _blocks(images.shape[0], texts.shape[0]):
    sim = texts @ images[cols].T  # [M, block]: every text against these images.
    inside = (text_to_image >= cols.start) & (text_to_image < cols.stop)
    local = np.where(inside, text_to_image - cols.start, -1)
    best = np.full(sim.shape[1], -np.inf)
    np.maximum.at(best, local[inside], sim[np.flatnonzero(inside), local[inside]])
    relevant = local[:, None] == np.arange(sim.shape[1])[None, :]
    ahead = (sim >= best[None, :]) & ~relevant
    i2t.append(ahead.sum(axis=0)[np.isfinite(best)])
  out = {f"i2t_R@{k}": r for k, r in _recall_at(np.concatenate(i2t or [np.zeros(0)]), ks).items()}
  out.update({f"t2i_R@{k}": r for k, r in _recall_at(t2i, ks).items()})
  out["mR"] = float(np.mean(list(out.values())))
  return out


def positive_ranks(queries: np.ndarray, candidates: np.ndarray, positives: np.ndarray,
                   exclude_self: bool = False) -> np.ndarray:
  """0-based rank of each query's best-scoring positive among the candidates, for retrieval where a
  query has any number of right answers (Crisscrossed Captions): the non-positive candidates scoring
  at least as high rank ahead of it. Computed over blocks of queries, so the [M, N] matrix is never
  held. queries [M, D], candidates [N, D]; positives [P, 2] (query, candidate) index pairs.
  exclude_self: queries and candidates are one set (text->text, image->image) and a query is not
  its own candidate. Queries without a positive are left out (one entry per query with one, in
  query order)."""
  queries, candidates = np.asarray(queries, np.float64), np.asarray(candidates, np.float64)
  positives = np.asarray(positives, np.int64).reshape(-1, 2)
  if ((positives < 0).any() or (positives[:, 0] >= queries.shape[0]).any()
      or (positives[:, 1] >= candidates.shape[0]).any()):
    raise ValueError(f"positives must index {queries.shape[0]} queries and {candidates.shape[0]} candidates")
  if exclude_self and queries.shape[0] != candidates.shape[0]:
    raise ValueError("exclude_self needs the queries to be the candidates")
  out = []
  for rows in _blocks(queries.shape[0], candidates.shape[0]):
    sim = queries[rows] @ candidates.T  # [block, N]
    mine = positives[(positives[:, 0] >= rows.start) & (positives[:, 0] < rows.stop)]
    relevant = np.zeros(sim.shape, bool)
    relevant[mine[:, 0] - rows.start, mine[:, 1]] = True
    if exclude_self:
      local = np.arange(rows.start, rows.stop)
      relevant[local - rows.start, local] = False  # A query is never its own answer either.
    best = np.where(relevant, sim, -np.inf).max(axis=1, initial=-np.inf)
    ahead = (sim >= best[:, None]) & ~relevant
    if exclude_self:
      ahead[local - rows.start, local] = False
    out.append(ahead.sum(axis=1)[relevant.any(axis=1)])
  return np.concatenate(out or [np.zeros(0, np.int64)])


def translation_accuracy_from_embeddings(left: np.ndarray, right: np.ndarray) -> Dict[str, float]:
  """Translation retrieval between aligned rows: percent of left rows whose best right row (by dot
  product, ties against the model) is their own, the same right to left, and the mean. Scored over
  blocks of rows each way, so 36k sentence pairs never hold the [N, N] matrix (dense: 10 GB)."""
  left, right = np.asarray(left, np.float64), np.asarray(right, np.float64)
  if left.ndim != 2 or left.shape != right.shape:
    raise ValueError(f"translation pairs must be aligned, got {left.shape} and {right.shape}")
  n = left.shape[0]
  if not n:  # Accuracy over no pair is undefined: say so rather than report NaN.
    raise ValueError("translation pairs: none to score (0 aligned rows)")

  def first(queries, candidates):
    return np.concatenate([text_to_image_ranks(queries[rows] @ candidates.T, np.arange(rows.start, rows.stop)) == 0
                           for rows in _blocks(n, n)])

  l2r, r2l = 100.0 * float(np.mean(first(left, right))), 100.0 * float(np.mean(first(right, left)))
  return {"l2r_acc": l2r, "r2l_acc": r2l, "acc": (l2r + r2l) / 2}


def chance_recall(num_candidates: int, k: int, num_relevant: int = 1) -> float:
  """Expected Recall@k (percent) of a random ranking with `num_relevant` right answers."""
  if k >= num_candidates:
    return 100.0
  # P(no relevant item among the top k) for a random permutation.
  miss = 1.0
  for i in range(num_relevant):
    miss *= (num_candidates - k - i) / (num_candidates - i)
  return 100.0 * (1.0 - max(miss, 0.0))
