"""What a public set is read into, and how each part is scored.

A set's reader gives parts. Each part has a `split` and `evaluate(embed)`, which returns its
language label, its task and its metrics (fractions, CLIP_benchmark's names so rows from mural and
from open_clip sit side by side); `embed` is an `Embedder`, which embeds each image file and each
sentence list once whichever parts share them. A new kind of part (intra-modal retrieval,
correlations, classification) is a new class with the same two members.
"""

import time
from typing import Callable, Dict, List, NamedTuple, Optional, Sequence

import numpy as np

from mural import metrics


IMAGE_CHUNK = 256  # Images decoded and embedded at a time (5k images at 289 px would be 5 GB at once).


class Embedder:
  """A model's embeddings (mural.export.Model: embed_texts(texts, langs), embed_images(paths)),
  each image file and each (language, sentence list) computed once: 5k and its 1k folds share
  images, and Multi30k's English is scored against each other language."""

  def __init__(self, model):
    self.model, self._images, self._texts = model, {}, {}

  def texts(self, lines: Sequence[str], language: str) -> np.ndarray:
    key = (language, tuple(lines))
    if key not in self._texts:
      self._texts[key] = self.model.embed_texts(list(lines), [language] * len(lines))
    return self._texts[key]

  def images(self, paths: Sequence[str]) -> np.ndarray:
    new = [p for p in dict.fromkeys(paths) if p not in self._images]
    for i in range(0, len(new), IMAGE_CHUNK):
      self._images.update(zip(new[i:i + IMAGE_CHUNK], self.model.embed_images(new[i:i + IMAGE_CHUNK])))
    return np.stack([self._images[p] for p in paths])


def retrieval_rows(texts: np.ndarray, images: np.ndarray, text_to_image: np.ndarray) -> Dict[str, float]:
  """CLIP_benchmark's names (fractions): image_retrieval_recall@k is text->image,
  text_retrieval_recall@k image->text; mean_recall is MURAL's mR (the mean of the six)."""
  m = metrics.retrieval_metrics_from_embeddings(texts, images, text_to_image)
  out = {}
  for k in metrics.RECALL_KS:
    out[f"image_retrieval_recall@{k}"] = m[f"t2i_R@{k}"] / 100
    out[f"text_retrieval_recall@{k}"] = m[f"i2t_R@{k}"] / 100
  out["mean_recall"] = m["mR"] / 100
  return out


def translation_rows(left: np.ndarray, right: np.ndarray) -> Dict[str, float]:
  """Translation retrieval among the split's sentences (fractions), both ways and their mean."""
  m = metrics.translation_accuracy_from_embeddings(left, right)
  return {"translation_accuracy_l2r": m["l2r_acc"] / 100, "translation_accuracy_r2l": m["r2l_acc"] / 100,
          "translation_accuracy": m["acc"] / 100}


class Retrieval(NamedTuple):
  """Images and their captions in one language: image<->text Recall@1/5/10 and mR."""
  split: str
  language: str
  images: List[str]  # Image files.
  captions: List[str]
  text_to_image: np.ndarray  # [len(captions)] index into images.

  def evaluate(self, embed: Embedder):
    values = retrieval_rows(embed.texts(self.captions, self.language), embed.images(self.images),
                            self.text_to_image)
    return self.language, "zeroshot_retrieval", values


class Translation(NamedTuple):
  """Line-aligned sentences in two languages: translation retrieval accuracy both ways."""
  split: str
  left_language: str
  right_language: str
  left: List[str]
  right: List[str]  # right[i] translates left[i].

  def evaluate(self, embed: Embedder):
    values = translation_rows(embed.texts(self.left, self.left_language),
                              embed.texts(self.right, self.right_language))
    return f"{self.left_language}-{self.right_language}", "translation_retrieval", values


class PublicSet(NamedTuple):
  read: Callable[[str, Optional[str], Callable[[str], None]], list]  # (text dir, images dir, log) -> parts
  headline: str  # The metric the paper reports, a key of the rows' metrics.
  # split -> a published model -> {language: headline value (percent)}.
  references: Dict[str, Dict[str, Dict[str, float]]]


def score(name: str, parts: Sequence, model, log=print) -> List[dict]:
  """Rows {dataset, split, language, task, metric, value} of every part, embedded by `model`,
  with the folds' means (fold_means)."""
  rows, embed, start = [], Embedder(model), time.time()
  for i, part in enumerate(parts):
    language, task, values = part.evaluate(embed)
    rows += [dict(dataset=name, split=part.split, language=language, task=task, metric=metric, value=value)
             for metric, value in values.items()]
    log(f"  {name} {part.split} {language}: {i + 1}/{len(parts)} parts ({time.time() - start:.0f} s)")
  return rows + fold_means(rows)


def fold_means(rows: Sequence[dict]) -> List[dict]:
  """Rows of split 'S' averaging those of splits 'S/fold<k>' (MSCOCO 1k), per language and metric."""
  groups = {}
  for r in rows:
    if "/fold" in r["split"]:
      groups.setdefault((r["dataset"], r["split"].split("/fold")[0], r["language"], r["task"], r["metric"]),
                        []).append(r["value"])
  return [dict(dataset=d, split=s, language=l, task=t, metric=m, value=float(np.mean(v)))
          for (d, s, l, t, m), v in groups.items()]
