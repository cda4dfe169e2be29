"""Karpathy's MSCOCO test split: 5k images and 1k (the mean over 5 folds), English, and Japanese from
STAIR Captions where its file is beside the split file (MURAL Table 2); and Chinese on COCO-CN's own
test split where COCO-CN's release is beside it (no MURAL figure: its Table 2 cites UC2's, on
another split of COCO-CN)."""

import json
import os
from typing import Dict, List, Optional

import numpy as np

from mural.data import coco_cn
from mural.data import karpathy
from mural.public_sets.parts import PublicSet, Retrieval


COCO_CN_SPLIT = "coco-cn_test"  # COCO-CN's 1000 test images (COCO 2014 train and val), not Karpathy's.
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


def read(folder: str, images: Optional[str], log) -> list:
  """Karpathy's test split (dataset_coco.json in `folder`): 5k and 1k (5 folds), English;
  Japanese where STAIR's file is beside it (its captions of the same images); Chinese on COCO-CN's
  test split where its release is beside it (split 'coco-cn_test': other images, from train2014/
  and val2014/)."""
  if not images:
    raise ValueError("mscoco: needs the COCO 2014 images folder (--images=mscoco:DIR, holding val2014/, "
                     "and train2014/ for COCO-CN)")
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
  if coco_cn.find(folder):
    chinese = coco_cn.eval_data(folder, images, "test")  # Refuses a missing file, sentence or image.
    parts.append(Retrieval(COCO_CN_SPLIT, "zh", chinese.images, chinese.captions["zh"], chinese.caption_image["zh"]))
  else:
    log(f"mscoco: no {coco_cn.SPLIT_FILE.format(split='test')} in {folder} (nor its {coco_cn.RELEASE}/): "
        "no Chinese (COCO-CN)")
  return parts


SET = PublicSet(read, "mean_recall", {
    # MURAL, Table 2: zero-shot mR on Karpathy's test images (1k: the mean over 5 folds).
    "1k": {"ALIGN-BASE zero-shot (paper)": {"en": 79.5, "ja": 70.9},
           "MURAL-BASE zero-shot (paper)": {"en": 79.2, "ja": 73.4},
           "MURAL-LARGE zero-shot (paper)": {"en": 84.4, "ja": 81.3}},
    "5k": {"ALIGN-BASE zero-shot (paper)": {"en": 59.6, "ja": 53.9},
           "MURAL-BASE zero-shot (paper)": {"en": 59.5, "ja": 54.4},
           "MURAL-LARGE zero-shot (paper)": {"en": 67.7, "ja": 64.6},
           "ALIGN-L2 zero-shot (paper)": {"en": 70.9}},
})
