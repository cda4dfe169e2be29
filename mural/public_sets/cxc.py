"""Crisscrossed Captions (CxC; Parekh et al. 2021): Karpathy's MSCOCO 5k test split with human
similarity ratings of caption-caption (STS), image-image (SIS) and caption-image (SITS) pairs
(MURAL Tables 5 and 6).

The release (github.com/google-research-datasets/Crisscrossed-Captions) holds data/sts_test.csv
(caption1,caption2,agg_score,sampling_method), data/sis_test.csv (image1,image2,...) and
data/sits_test.csv (caption,image,...), agg_score in [0, 5]. A caption is
COCO_val2014:sentid:<sentid of Karpathy's dataset_coco.json>, an image its filename there
(COCO_val2014_000000365325.jpg); the captions and images are Karpathy's, so dataset_coco.json is
expected beside data/ in the release's folder.

Scored as the paper states:
  retrieval  a pair rated at least 3 (STS, SITS) or 2.5 (SIS) is a positive (the paper's
             thresholds, Section 3). image<->text: the 25k captions and 5k images, each COCO
             caption-image pair a positive as usual, plus SITS's. text->text and image->image:
             each caption (image) a query against all the others, STS's (SIS's) positives both
             ways; a query without a positive is a candidate only. Recall@1/5/10 (the query
             answered when any positive ranks within k) and the mean rank of the best positive,
             1-based ("avg r").
  similarity Spearman's rho between the model's score (the dot product it retrieves by) and the
             human ratings, as avg +- std over 1000 resamples, each drawing one rated pair per
             item: per first caption in STS, per first image in SIS, per image in SITS (items in
             the numbers the published spreads fit: +-0.4 over STS's 25k captions, +-0.7 to 1.3
             over 5k images); and rho over all of a file's pairs.
"""

import csv
import os
from typing import List, NamedTuple, Optional

import numpy as np

from mural import metrics
from mural.data import karpathy
from mural.public_sets.parts import Embedder, PublicSet


SPLITS = ("test",)  # MURAL reports the test split; "val" is released alike.
SPLIT_FILE = "dataset_coco.json"  # Karpathy's split file, beside the release's data/.
LANGUAGE = "en"
POSITIVE = {"sts": 3.0, "sis": 2.5, "sits": 3.0}  # A rating at least this is a positive (Section 3).
RESAMPLES = 1000  # Draws behind the correlations' avg +- std.
SEED = 0
# Each file's columns; its rows are resampled by the first ("caption1", "image1") or, in SITS, the image.
COLUMNS = {"sts": ("caption1", "caption2", "agg_score", "sampling_method"),
           "sis": ("image1", "image2", "agg_score", "sampling_method"),
           "sits": ("caption", "image", "agg_score", "sampling_method")}
GROUP_COLUMN = {"sts": 0, "sis": 0, "sits": 1}


class Split(NamedTuple):
  """Karpathy's split as CxC names it: image files and captions, each caption's image."""
  name: str
  images: List[str]
  captions: List[str]
  caption_image: np.ndarray  # [len(captions)] index into images.
  sentid: dict  # Karpathy's sentid -> caption index.
  filename: dict  # Image filename -> image index.


class Ratings(NamedTuple):
  """A CxC file: index pairs into the split's captions or images, the human ratings, the
  resampling item of each pair."""
  pairs: np.ndarray  # [P, 2]
  scores: np.ndarray  # [P]
  groups: np.ndarray  # [P]


def _karpathy(split_file: str, split: str, images: str) -> Split:
  records = [r for r in karpathy.split_images(split_file) if isinstance(r, dict) and r.get("split") == split]
  if not records:
    raise ValueError(f"cxc: {split_file} has no {split!r} images (Karpathy's dataset_coco.json expected)")
  paths, captions, caption_image, sentid, filename = [], [], [], {}, {}
  for record in records:
    try:
      filename[record["filename"]] = len(paths)
      paths.append(os.path.join(images, record.get("filepath", ""), record["filename"]))
      for s in record["sentences"]:
        sentid[int(s["sentid"])] = len(captions)
        captions.append(s["raw"].strip())
        caption_image.append(len(paths) - 1)
    except (KeyError, TypeError, ValueError, AttributeError):
      raise ValueError(f"cxc: {split_file}: a {split} image lacks a filename or sentences' sentid and raw "
                       f"text: {str(record)[:120]}") from None
  absent = [p for p in paths if not os.path.isfile(p)]
  if absent:
    raise ValueError(f"cxc: {len(absent)} of its {len(paths)} image files are missing under {images} "
                     f"(e.g. {absent[0]}); expected <images>/<filepath>/<filename> of {split_file}")
  return Split(split, paths, captions, np.asarray(caption_image, np.int64), sentid, filename)


def _caption(value: str, split: Split) -> Optional[int]:
  head, _, number = value.rpartition(":sentid:")
  return split.sentid.get(int(number)) if head and number.isdigit() else None


def _ratings(path: str, kind: str, split: Split, split_file: str) -> Ratings:
  """A CxC file's rows as index pairs; an ID outside Karpathy's split is a ValueError naming it."""
  columns = COLUMNS[kind]
  if not os.path.isfile(path):
    raise ValueError(f"cxc: no {path} (the release's data/{os.path.basename(path)}: {','.join(columns)})")
  pairs, scores = [], []
  with open(path, newline="", encoding="utf-8") as f:
    reader = csv.reader(f)
    header = tuple(next(reader, ()))
    if header != columns:
      raise ValueError(f"cxc: {path} starts {','.join(header) or 'empty'}; expected the columns {','.join(columns)}")
    for line, row in enumerate(reader, start=2):
      if len(row) != len(columns):
        raise ValueError(f"cxc: {path} line {line}: {len(row)} fields, expected {len(columns)} ({','.join(columns)})")
      ids = []
      for column, value in zip(columns[:2], row[:2]):
        index = split.filename.get(value) if column.startswith("image") else _caption(value, split)
        if index is None:
          what = "an image filename" if column.startswith("image") else "a caption (COCO_val2014:sentid:<sentid>)"
          raise ValueError(f"cxc: {path} line {line}: {column} {value!r} is not {what} of Karpathy's "
                           f"{split.name} split in {split_file}")
        ids.append(index)
      try:
        scores.append(float(row[2]))
      except ValueError:
        raise ValueError(f"cxc: {path} line {line}: agg_score {row[2]!r} is not a number") from None
      pairs.append(ids)
  if not pairs:
    raise ValueError(f"cxc: {path} has no rated pairs")
  pairs = np.asarray(pairs, np.int64)
  return Ratings(pairs, np.asarray(scores, np.float64), pairs[:, GROUP_COLUMN[kind]])


def read(folder: str, images: Optional[str], log) -> list:
  """The release's folder (data/*.csv, with Karpathy's dataset_coco.json beside data/) and the
  COCO 2014 images folder: every CxC task of each split."""
  del log
  if not images:
    raise ValueError("cxc: needs the COCO 2014 images folder (--images=cxc:DIR, holding val2014/)")
  split_file = os.path.join(folder, SPLIT_FILE)
  if not os.path.isfile(split_file):
    raise ValueError(f"cxc: no {split_file}: Karpathy's {SPLIT_FILE} is expected beside the release's data/")
  parts = []
  for name in SPLITS:
    split = _karpathy(split_file, name, images)
    rated = {kind: _ratings(os.path.join(folder, "data", f"{kind}_{name}.csv"), kind, split, split_file)
             for kind in COLUMNS}
    sits = rated["sits"]
    original = np.stack([np.arange(len(split.captions)), split.caption_image], axis=1)
    image_text = np.unique(np.concatenate([original, sits.pairs[sits.scores >= POSITIVE["sits"]]]), axis=0)
    parts.append(CrossModal(f"{name}/image-text", split.images, split.captions, image_text))
    for kind, modality in (("sts", "text"), ("sis", "image")):
      items = split.captions if modality == "text" else split.images
      positive = rated[kind].pairs[rated[kind].scores >= POSITIVE[kind]]
      parts.append(IntraModal(f"{name}/{modality}-{modality}", modality, items, positive))
    parts.append(Similarity(f"{name}/similarity", split.images, split.captions,
                            [(kind, rated[kind]) for kind in ("sts", "sis", "sits")]))
  return parts


def _recalls(ranks: np.ndarray, prefix: str) -> dict:
  out = {f"{prefix}_recall@{k}": float(np.mean(ranks < k)) for k in metrics.RECALL_KS}
  out[f"{prefix}_mean_rank"] = float(np.mean(ranks + 1))
  return out


class CrossModal(NamedTuple):
  """Captions and images with any number of positives each way: image<->text Recall@1/5/10 and mean
  rank (CLIP_benchmark's names: image_retrieval is text->image)."""
  split: str
  images: List[str]
  captions: List[str]
  positives: np.ndarray  # [P, 2] (caption, image).

  def evaluate(self, embed: Embedder):
    texts, images = embed.texts(self.captions, LANGUAGE), embed.images(self.images)
    out = _recalls(metrics.positive_ranks(texts, images, self.positives), "image_retrieval")
    out.update(_recalls(metrics.positive_ranks(images, texts, self.positives[:, ::-1]), "text_retrieval"))
    return LANGUAGE, "zeroshot_retrieval", out


class IntraModal(NamedTuple):
  """Captions (or images) retrieved by each other, a rated pair a positive both ways:
  text_to_text (image_to_image) Recall@1/5/10 and mean rank."""
  split: str
  modality: str  # "text" or "image".
  items: List[str]  # Captions or image files.
  positives: np.ndarray  # [P, 2] index pairs, either order.

  def evaluate(self, embed: Embedder):
    vectors = embed.texts(self.items, LANGUAGE) if self.modality == "text" else embed.images(self.items)
    both = np.concatenate([self.positives, self.positives[:, ::-1]])
    name = f"{self.modality}_to_{self.modality}"
    ranks = metrics.positive_ranks(vectors, vectors, both, exclude_self=True)
    return LANGUAGE, f"{name}_retrieval", _recalls(ranks, name)


def average_ranks(values: np.ndarray) -> np.ndarray:
  """1-based ranks, tied values sharing their mean rank (as Spearman's rho needs)."""
  values = np.asarray(values, np.float64)
  order = np.argsort(values, kind="stable")
  ordered = values[order]
  first = np.concatenate([[True], ordered[1:] != ordered[:-1]]) if values.size else np.zeros(0, bool)
  starts = np.flatnonzero(first)
  ends = np.append(starts[1:], values.size)
  out = np.empty(values.size)
  out[order] = ((starts + ends + 1) / 2)[np.cumsum(first) - 1]
  return out


def spearman(x: np.ndarray, y: np.ndarray) -> float:
  """Spearman's rho: Pearson's r of the average ranks (nan where one side is constant)."""
  a, b = average_ranks(x), average_ranks(y)
  a, b = a - a.mean(), b - b.mean()
  scale = np.sqrt((a @ a) * (b @ b))
  return float(a @ b / scale) if scale > 0 else float("nan")


def resample_draws(groups: np.ndarray, rounds: int = RESAMPLES, seed: int = SEED) -> np.ndarray:
  """[rounds, items] pair indices: each round one pair drawn uniformly from each item's pairs."""
  groups = np.asarray(groups)
  order = np.argsort(groups, kind="stable")
  _, starts, sizes = np.unique(groups[order], return_index=True, return_counts=True)
  pick = np.random.default_rng(seed).random((rounds, starts.size))
  return order[starts + np.minimum((pick * sizes).astype(np.int64), sizes - 1)]


class Similarity(NamedTuple):
  """CxC's rated pairs (STS captions, SIS images, SITS caption-image): Spearman's rho of the model's
  score with the ratings, avg +- std over resamples of one pair per item, and over all pairs."""
  split: str
  images: List[str]
  captions: List[str]
  ratings: list  # [(kind, Ratings)]: kind in COLUMNS.

  def evaluate(self, embed: Embedder):
    texts, images = embed.texts(self.captions, LANGUAGE), embed.images(self.images)
    sides = {"sts": (texts, texts), "sis": (images, images), "sits": (texts, images)}
    out = {}
    for kind, rated in self.ratings:
      left, right = (np.asarray(v, np.float64) for v in sides[kind])
      score = np.einsum("pd,pd->p", left[rated.pairs[:, 0]], right[rated.pairs[:, 1]])
      rhos = np.array([spearman(score[d], rated.scores[d]) for d in resample_draws(rated.groups)])
      out[f"{kind}_spearman"] = float(np.mean(rhos))
      out[f"{kind}_spearman_std"] = float(np.std(rhos))
      out[f"{kind}_spearman_all_pairs"] = spearman(score, rated.scores)
    return LANGUAGE, "semantic_similarity", out


# The retrieval parts' metric prefixes (Table 5's i2t, t2i, t2t, i2i) by split suffix.
_TASKS = {"image-text": ("text_retrieval", "image_retrieval"), "text-text": ("text_to_text",),
          "image-image": ("image_to_image",)}


def _figures(rows: tuple, task: str) -> dict:
  """A Table 5 row's figures (R@1, R@5, R@10, avg r per direction; None: not reported) of a task."""
  out = {}
  for prefix, values in zip(("text_retrieval", "image_retrieval", "text_to_text", "image_to_image"), rows):
    if prefix in _TASKS[task]:
      out.update({f"{prefix}_recall@{k}": v for k, v in zip(metrics.RECALL_KS, values)})
      if values[3] is not None:
        out[f"{prefix}_mean_rank"] = values[3]
  return out


# MURAL Table 5 (R@1/5/10 percent, avg r as ranks) and Table 6 (rho x 100, avg +- std), test split.
# DE-T2T+I2T and ALIGN-L2 are fine-tuned on MSCOCO, ALIGN-BASE and MURAL on Multi30k and MSCOCO.
_TABLE5 = {
    "DE-T2T+I2T (Parekh et al.)": ((55.9, 84.2, 91.8, None), (41.7, 72.3, 83.0, None),
                                   (42.4, 64.9, 74.0, None), (38.5, 73.6, 84.9, None)),
    "ALIGN-BASE fine-tuned (paper)": ((67.1, 89.0, 94.2, 3.6), (50.0, 77.3, 85.9, 11.5),
                                      (43.5, 64.7, 73.5, 45.4), (42.6, 76.6, 86.2, 16.0)),
    "MURAL-BASE fine-tuned (paper)": ((65.8, 89.1, 94.3, 3.2), (49.7, 77.5, 86.0, 11.0),
                                      (43.9, 64.9, 73.9, 44.9), (43.9, 76.7, 86.5, 16.1)),
    "MURAL-LARGE fine-tuned (paper)": ((74.6, 92.8, 96.6, 2.3), (57.8, 83.1, 90.0, 9.4),
                                       (46.5, 67.5, 76.1, 47.8), (50.3, 81.8, 90.1, 12.4)),
    "ALIGN-L2 fine-tuned (paper)": ((78.1, 94.3, 97.4, None), (61.8, 84.9, 91.1, None),
                                    (45.4, 66.8, 75.2, None), (49.4, 81.4, 89.1, None)),
}
_TABLE6 = {
    "DE-T2T+I2T (Parekh et al.)": ((74.5, 0.4), (74.5, 0.9), (61.9, 1.3)),
    "ALIGN-BASE fine-tuned (paper)": ((72.7, 0.4), (80.4, 0.7), (63.7, 1.3)),
    "MURAL-BASE fine-tuned (paper)": ((73.9, 0.4), (80.0, 0.7), (64.0, 1.2)),
    "MURAL-LARGE fine-tuned (paper)": ((74.1, 0.4), (80.4, 0.7), (67.1, 1.3)),
    "ALIGN-L2 fine-tuned (paper)": ((72.9, 0.4), (77.2, 0.8), (67.6, 1.2)),
}

# References by metric (one language): split -> model -> {metric: figure}.
SET = PublicSet(read, "text_to_text_recall@1", {
    **{f"test/{task}": {model: _figures(rows, task) for model, rows in _TABLE5.items()} for task in _TASKS},
    "test/similarity": {model: {m: v for kind, (avg, std) in zip(("sts", "sis", "sits"), rows)
                                for m, v in ((f"{kind}_spearman", avg), (f"{kind}_spearman_std", std))}
                        for model, rows in _TABLE6.items()},
})
