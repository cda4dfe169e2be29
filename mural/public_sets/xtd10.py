"""XTD10: text->image Recall@10 per language over its 1000 COCO images (MURAL Table 4)."""

from typing import Optional

import numpy as np

from mural.data import xtd
from mural.public_sets.parts import PublicSet, Retrieval


def read(folder: str, images: Optional[str], log) -> list:
  del log
  if not images:
    raise ValueError("xtd10: needs the COCO 2014 images folder (--images=xtd10:DIR): it is image retrieval")
  data = xtd.read(folder, images)
  order = np.arange(len(data.images))
  return [Retrieval("test", lang, data.images, captions, order) for lang, captions in sorted(data.captions.items())]


SET = PublicSet(read, "image_retrieval_recall@10", {"test": {
    # MURAL (Jain et al. 2021), Table 4: zero-shot text->image Recall@10.
    "mUSE+M3L (paper)": {"it": 78.9, "es": 76.7, "ru": 73.6, "zh": 76.1, "pl": 71.7, "tr": 70.9, "ko": 70.7},
    "ALIGN-BASE (paper)": {"it": 87.9, "es": 88.8, "ru": 82.3, "zh": 86.5, "pl": 79.8, "tr": 73.5, "ko": 76.6},
    "MURAL-BASE (paper)": {"it": 88.4, "es": 89.6, "ru": 83.6, "zh": 88.3, "pl": 86.1, "tr": 84.8, "ko": 82.4},
    "MURAL-LARGE (paper)": {"it": 91.8, "es": 92.9, "ru": 87.2, "zh": 89.7, "pl": 91.0, "tr": 89.5, "ko": 88.1},
}})
