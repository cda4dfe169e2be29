"""Zero-shot classification as CLIP scores it: a classifier made from text alone, one vector per class.

A class's vector is CLIP's prompt ensemble (open_clip's and CLIP_benchmark's zero_shot_classifier):
its prompts embedded, each L2-normalised, averaged, normalised again. An image is scored by cosine
against every class vector. The metrics carry CLIP_benchmark's names (fractions), so rows from mural
and from open_clip sit side by side.
"""

import re
from typing import Dict, List, NamedTuple, Sequence

import numpy as np

from mural import metrics
from mural.public_sets.parts import Embedder

# A template's place for the class name: CLIP_benchmark's templates say {c}; CLIP's own and
# Babel-ImageNet's, {}.
PLACEHOLDER = re.compile(r"\{c?\}")


def fill(templates: Sequence[str], classes: Sequence[str]) -> List[List[str]]:
  """Each class's prompts: every template with the class name in its placeholders (replaced as text,
  not str.format, so other braces in a template or a name stay as they are)."""
  return [[PLACEHOLDER.sub(lambda _: name, t) for t in templates] for name in classes]


def class_ranks(images: np.ndarray, classes: np.ndarray, labels: np.ndarray) -> np.ndarray:
  """0-based rank of each image's class among all classes by cosine, ties against the model
  (mural.metrics: a class scoring equal to the right one ranks ahead of it), in blocks of images
  so ImageNet's 50k x 1000 scores are never held at once."""
  images, classes = metrics.unit_rows(images), metrics.unit_rows(classes)
  step = max(1, metrics.BLOCK_ELEMENTS // max(classes.shape[0], 1))
  return np.concatenate([metrics.text_to_image_ranks(images[i:i + step] @ classes.T, labels[i:i + step])
                         for i in range(0, images.shape[0], step)] or [np.zeros(0, np.int64)])


def classification_rows(images: np.ndarray, classes: np.ndarray, labels: np.ndarray) -> Dict[str, float]:
  """acc1, acc5 and mean_per_class_recall (fractions) of images [N, D] against class vectors [C, D].

  acc5 is left out below 5 classes, where the true class is always among the top 5 (CLIP_benchmark
  writes NaN there, which is not JSON). mean_per_class_recall is the mean over the classes that have
  images of the fraction ranked first (sklearn's balanced accuracy), ties against the model as acc1."""
  labels = np.asarray(labels, np.int64)
  ranks = class_ranks(images, classes, labels)
  out = {"acc1": float(np.mean(ranks < 1))}
  if classes.shape[0] >= 5:
    out["acc5"] = float(np.mean(ranks < 5))
  out["mean_per_class_recall"] = float(np.mean([np.mean(ranks[labels == c] == 0) for c in np.unique(labels)]))
  return out


class Classification(NamedTuple):
  """Images with one label each, classified zero-shot in one language: acc1, acc5, mean per-class recall."""
  split: str
  language: str  # The prompts' language.
  images: list  # Image files: paths, or an image file's bytes.
  labels: np.ndarray  # [len(images)] index into classes.
  classes: List[str]  # Class names, label order.
  prompts: List[List[str]]  # prompts[c]: the texts whose mean embedding is class c's vector.

  def class_vectors(self, embed: Embedder) -> np.ndarray:
    """[C, D] float64: CLIP's ensemble of each class's prompts (one embedding call for them all)."""
    texts = metrics.unit_rows(embed.texts([p for ps in self.prompts for p in ps], self.language))
    ends = np.cumsum([len(ps) for ps in self.prompts])
    return metrics.unit_rows(np.stack([texts[end - len(ps):end].mean(0) for ps, end in zip(self.prompts, ends)]))

  def evaluate(self, embed: Embedder):
    values = classification_rows(embed.images(self.images), self.class_vectors(embed), self.labels)
    return self.language, "zeroshot_classification", values
