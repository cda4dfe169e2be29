"""The field's evaluation sets by name, each read as released and scored as its paper states.

A set reads its files into parts: `Retrieval` (images and one list of captions per language,
scored image<->text Recall@1/5/10 and mR) and `Translation` (line-aligned sentences in two
languages, scored translation retrieval accuracy both ways). `score` embeds each part with a
model that has `embed_texts(texts, langs)` and `embed_images(paths)` (mural.export.Model) and
gives one row per (set, split, language, metric), with CLIP_benchmark's metric names so rows
from mural and from open_clip sit side by side. Each set keeps its paper's published figures
for its headline metric (REFERENCES), printed beside a model's.

  xtd10     XTD10: text->image Recall@10 per language over its 1000 COCO images (MURAL Table 4).
  mscoco    Karpathy's test split: 5k images and 1k (the mean over 5 folds), English, and Japanese
            from STAIR Captions where its file is beside the split file (MURAL Table 2).
  multi30k  Multi30k task 1, every released test split: translation retrieval en <-> de/fr/cs
            and, given the split's images, image<->text retrieval per language (mR: MURAL
            Table 2, test_2016_flickr).
"""

import json
import os
import time
from typing import Callable, Dict, List, NamedTuple, Optional, Sequence, Union

import numpy as np

from mural import metrics
from mural.data import karpathy
from mural.data import multi30k
from mural.data import xtd


class Retrieval(NamedTuple):
  split: str
  language: str
  images: List[str]  # Image files.
  captions: List[str]
  text_to_image: np.ndarray  # [len(captions)] index into images.


class Translation(NamedTuple):
  split: str
  left_language: str
  right_language: str
  left: List[str]
  right: List[str]  # right[i] translates left[i].


Part = Union[Retrieval, Translation]


class PublicSet(NamedTuple):
  read: Callable[[str, Optional[str], Callable[[str], None]], List[Part]]  # (text dir, images dir, log)
  headline: str  # The metric the paper reports, a key of the rows' metrics.
  # split -> a published model -> {language: headline value (percent)}.
  references: Dict[str, Dict[str, Dict[str, float]]]


def _read_xtd(folder: str, images: Optional[str], log) -> List[Part]:
  del log
  if not images:
    raise ValueError("xtd10: needs the COCO 2014 images folder (--images=xtd10:DIR): it is image retrieval")
  data = xtd.read(folder, images)
  order = np.arange(len(data.images))
  return [Retrieval("test", lang, data.images, captions, order) for lang, captions in sorted(data.captions.items())]


def _read_multi30k(folder: str, images: Optional[str], log) -> List[Part]:
  parts = []
  for split in multi30k.TEST_SPLITS:
    if not os.path.exists(os.path.join(folder, "task1", "image_splits", f"{split}.txt")):
      log(f"multi30k {split}: not in {folder}/task1/image_splits, skipped")
      continue
    languages = multi30k.task1_languages(split, folder)
    if "en" not in languages:
      log(f"multi30k {split}: no English captions (the release's references), skipped")
      continue
    t1 = multi30k.task1(split, languages, folder)
    for other in languages:
      if other != "en":
        parts.append(Translation(split, "en", other, t1.captions["en"], t1.captions[other]))
    if images:
      try:
        data = multi30k.eval_data(split, 1, languages, folder, images)
      except ValueError as e:  # An image missing: the split is scored whole or not at all.
        log(f"multi30k {split}: image-text retrieval skipped: {e}")
        continue
      parts += [Retrieval(split, lang, data.images, data.captions[lang], data.caption_image[lang])
                for lang in data.captions]
  if not parts:
    raise ValueError(f"multi30k: no released test split under {folder} (task1/image_splits/<split>.txt)")
  return parts


FOLDS = 5  # MSCOCO 1k: the first 5000 test images in 5 folds of 1000, the mean reported.
STAIR_FILE = "stair_captions_v1.2_val.json"  # STAIR Captions' release: Japanese captions of val2014.


def _stair(path: str) -> Dict[int, List[str]]:
  """STAIR Captions (COCO's annotation format): COCO image id -> its Japanese captions."""
  try:
    with open(path, encoding="utf-8") as f:
      annotations = json.load(f)["annotations"]
    out = {}
    for a in annotations:
      out.setdefault(int(a["image_id"]), []).append(a["caption"].strip())
  except (ValueError, KeyError, TypeError, AttributeError) as e:
    raise ValueError(f"{path}: not STAIR Captions' annotation file (annotations of image_id and "
                     f"caption): {e!r}") from None
  return out


def _coco_id(path: str) -> int:
  """COCO_val2014_000000391895.jpg -> 391895."""
  return int(os.path.splitext(os.path.basename(path))[0].rsplit("_", 1)[-1])


def _read_mscoco(folder: str, images: Optional[str], log) -> List[Part]:
  """Karpathy's test split (dataset_coco.json in `folder`): 5k and 1k (5 folds), English; and
  Japanese where STAIR's file is beside it (its captions of the same images)."""
  if not images:
    raise ValueError("mscoco: needs the COCO 2014 images folder (--images=mscoco:DIR, holding val2014/)")
  data = karpathy.eval_data("test", os.path.join(folder, "dataset_coco.json"), images)  # Refuses a missing image.
  order = data.images
  per_language = {"en": list(zip(data.captions["en"], data.caption_image["en"]))}
  stair = os.path.join(folder, STAIR_FILE)
  if os.path.exists(stair):
    japanese = _stair(stair)
    per_language["ja"] = [(text, i) for i, path in enumerate(order) for text in japanese.get(_coco_id(path), ())]
    missing = sum(1 for path in order if not japanese.get(_coco_id(path)))
    if missing:
      raise ValueError(f"mscoco: {stair} has no caption for {missing} of the {len(order)} test images")
  else:
    log(f"mscoco: no {STAIR_FILE} in {folder}: English only")
  parts = []
  for lang, rows in per_language.items():
    texts, index = [t for t, _ in rows], np.array([i for _, i in rows])
    parts.append(Retrieval("5k", lang, order, texts, index))
    size = len(order) // FOLDS
    for fold in range(FOLDS):
      inside = (index >= fold * size) & (index < (fold + 1) * size)
      parts.append(Retrieval(f"1k/fold{fold}", lang, order[fold * size:(fold + 1) * size],
                             [t for t, keep in zip(texts, inside) if keep], index[inside] - fold * size))
  return parts


SETS = {
    "xtd10": PublicSet(_read_xtd, "image_retrieval_recall@10", {"test": {
        # MURAL (Jain et al. 2021), Table 4: zero-shot text->image Recall@10.
        "mUSE+M3L (paper)": {"it": 78.9, "es": 76.7, "ru": 73.6, "zh": 76.1, "pl": 71.7, "tr": 70.9, "ko": 70.7},
        "ALIGN-BASE (paper)": {"it": 87.9, "es": 88.8, "ru": 82.3, "zh": 86.5, "pl": 79.8, "tr": 73.5, "ko": 76.6},
        "MURAL-BASE (paper)": {"it": 88.4, "es": 89.6, "ru": 83.6, "zh": 88.3, "pl": 86.1, "tr": 84.8, "ko": 82.4},
        "MURAL-LARGE (paper)": {"it": 91.8, "es": 92.9, "ru": 87.2, "zh": 89.7, "pl": 91.0, "tr": 89.5, "ko": 88.1},
    }}),
    "multi30k": PublicSet(_read_multi30k, "mean_recall", {"test_2016_flickr": {
        # MURAL, Table 2: mR on test_2016_flickr, zero-shot and fine-tuned (Multi30k + MSCOCO).
        "ALIGN-BASE zero-shot (paper)": {"en": 83.3, "de": 75.0, "fr": 74.2, "cs": 47.9},
        "MURAL-BASE zero-shot (paper)": {"en": 82.4, "de": 76.2, "fr": 75.0, "cs": 64.6},
        "MURAL-LARGE zero-shot (paper)": {"en": 89.2, "de": 83.5, "fr": 83.1, "cs": 77.0},
        "MURAL-BASE fine-tuned (paper)": {"en": 92.2, "de": 88.6, "fr": 87.6, "cs": 84.2},
        "MURAL-LARGE fine-tuned (paper)": {"en": 93.8, "de": 90.4, "fr": 89.9, "cs": 87.1},
    }}),
    "mscoco": PublicSet(_read_mscoco, "mean_recall", {
        # MURAL, Table 2: zero-shot mR on Karpathy's test images (1k: the mean over 5 folds).
        "1k": {"ALIGN-BASE zero-shot (paper)": {"en": 79.5, "ja": 70.9},
               "MURAL-BASE zero-shot (paper)": {"en": 79.2, "ja": 73.4},
               "MURAL-LARGE zero-shot (paper)": {"en": 84.4, "ja": 81.3}},
        "5k": {"ALIGN-BASE zero-shot (paper)": {"en": 59.6, "ja": 53.9},
               "MURAL-BASE zero-shot (paper)": {"en": 59.5, "ja": 54.4},
               "MURAL-LARGE zero-shot (paper)": {"en": 67.7, "ja": 64.6},
               "ALIGN-L2 zero-shot (paper)": {"en": 70.9}},
    }),
}


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
  m = metrics.translation_accuracy(np.asarray(left, np.float64) @ np.asarray(right, np.float64).T)
  return {"translation_accuracy_l2r": m["l2r_acc"] / 100, "translation_accuracy_r2l": m["r2l_acc"] / 100,
          "translation_accuracy": m["acc"] / 100}


IMAGE_CHUNK = 256  # Images decoded and embedded at a time (5k images at 289 px would be 5 GB at once).


def score(name: str, parts: Sequence[Part], model, log=print) -> List[dict]:
  """Rows {dataset, split, language, task, metric, value} of every part, embedded by `model`.
  Each image file is embedded once, whichever parts share it (5k and its 1k folds, languages),
  and so is each list of sentences (Multi30k's English against each other language)."""
  rows, embedded, sentences = [], {}, {}
  start = time.time()

  def texts(lines, language):
    key = (language, tuple(lines))
    if key not in sentences:
      sentences[key] = model.embed_texts(list(lines), [language] * len(lines))
    return sentences[key]

  def images(paths):
    new = [p for p in dict.fromkeys(paths) if p not in embedded]
    for i in range(0, len(new), IMAGE_CHUNK):
      embedded.update(zip(new[i:i + IMAGE_CHUNK], model.embed_images(new[i:i + IMAGE_CHUNK])))
    return np.stack([embedded[p] for p in paths])

  for i, part in enumerate(parts):
    if isinstance(part, Retrieval):
      values = retrieval_rows(texts(part.captions, part.language), images(part.images), part.text_to_image)
      language, task = part.language, "zeroshot_retrieval"
    else:
      values = translation_rows(texts(part.left, part.left_language), texts(part.right, part.right_language))
      language, task = f"{part.left_language}-{part.right_language}", "translation_retrieval"
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


# Column labels of the printed tables (the JSON keeps CLIP_benchmark's names).
_LABELS = {"mean_recall": "mR", "translation_accuracy_l2r": "l2r", "translation_accuracy_r2l": "r2l",
           "translation_accuracy": "acc"}
_LABELS.update({f"image_retrieval_recall@{k}": f"t2i R@{k}" for k in metrics.RECALL_KS})
_LABELS.update({f"text_retrieval_recall@{k}": f"i2t R@{k}" for k in metrics.RECALL_KS})


def table(name: str, rows: Sequence[dict]) -> str:
  """One table per split of `rows` (percent), the set's published figures beneath as reference rows
  (folds are in the JSON lines; their mean is the table)."""
  out = []
  for split in dict.fromkeys(r["split"] for r in rows if "/fold" not in r["split"]):
    mine = [r for r in rows if r["split"] == split]
    languages = list(dict.fromkeys(r["language"] for r in mine))
    names = list(dict.fromkeys(r["metric"] for r in mine))
    value = {(r["language"], r["metric"]): r["value"] for r in mine}
    width = max(len(_LABELS.get(n, n)) for n in names) + 2
    out.append(f"{name} {split}")
    out.append(f"{'':>10}" + "".join(f"{_LABELS.get(n, n):>{width}}" for n in names))
    for lang in languages:
      cells = "".join(f"{100 * value[lang, n]:>{width}.1f}" if (lang, n) in value else f"{'-':>{width}}"
                      for n in names)
      out.append(f"{lang:>10}" + cells)
    headline = SETS[name].headline
    retrieval = [lang for lang in languages if (lang, headline) in value]
    references = SETS[name].references.get(split, {})
    if retrieval and references:
      out.append(f"  {_LABELS.get(headline, headline)} (percent) beside the paper's:")
      out.append(f"{'':>30}" + "".join(f"{lang:>7}" for lang in retrieval))
      out.append(f"{'this model':>30}" + "".join(f"{100 * value[lang, headline]:>7.1f}" for lang in retrieval))
      for model, figures in references.items():
        out.append(f"{model:>30}" + "".join(f"{figures[lang]:>7.1f}" if lang in figures else f"{'-':>7}"
                                           for lang in retrieval))
  return "\n".join(out)
