"""Multi30k task 1, every released test split: translation retrieval en <-> de/fr/cs and, given the
split's images, image<->text retrieval per language (mR: MURAL Table 2, test_2016_flickr)."""

import os
from typing import Optional

from mural.data import multi30k
from mural.public_sets.parts import PublicSet, Retrieval, Translation


def read(folder: str, images: Optional[str], log) -> list:
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


SET = PublicSet(read, "mean_recall", {"test_2016_flickr": {
    # MURAL, Table 2: mR on test_2016_flickr, zero-shot and fine-tuned (Multi30k + MSCOCO).
    "ALIGN-BASE zero-shot (paper)": {"en": 83.3, "de": 75.0, "fr": 74.2, "cs": 47.9},
    "MURAL-BASE zero-shot (paper)": {"en": 82.4, "de": 76.2, "fr": 75.0, "cs": 64.6},
    "MURAL-LARGE zero-shot (paper)": {"en": 89.2, "de": 83.5, "fr": 83.1, "cs": 77.0},
    "MURAL-BASE fine-tuned (paper)": {"en": 92.2, "de": 88.6, "fr": 87.6, "cs": 84.2},
    "MURAL-LARGE fine-tuned (paper)": {"en": 93.8, "de": 90.4, "fr": 89.9, "cs": 87.1},
}})
