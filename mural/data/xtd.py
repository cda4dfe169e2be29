"""XTD10 (Aggarwal and Kale 2020): 1000 MSCOCO images with one caption each in 10+ languages.

Layout (the public release, github.com/adobe-research/Cross-lingual-Test-Dataset-XTD10):
  XTD10/test_image_names.txt          one COCO 2014 file name per line (the 1000 images)
  XTD10/test_1kcaptions_<lang>.txt    line i captions image line i (es, it, ko, pl, ru, tr, zh, en)
  MIC/test_1kcaptions_{de,fr}.txt     German and French, from Multilingual Image Captioning
  STAIR/test_1kcaptions_jp.txt        Japanese, from STAIR Captions
The release's folder is read as it is (every test_1kcaptions_*.txt under it; 'jp' is mural's
'ja'); the images come from the user's COCO folder (train2014/ and val2014/, or all in one).
"""

import dataclasses
import os
import pathlib
from typing import Dict, List

from mural.data import image_files

IMAGE_NAMES = "test_image_names.txt"
CAPTIONS = "test_1kcaptions_"
LANGUAGE_CODES = {"jp": "ja"}  # The release's file suffix -> the language code mural uses.


@dataclasses.dataclass
class XTD:
  images: List[str]  # The images' paths, in the release's order.
  captions: Dict[str, List[str]]  # lang -> one caption per image, in that order.


def _lines(path: pathlib.Path) -> List[str]:
  with open(path, encoding="utf-8") as f:
    return [line.rstrip("\r\n") for line in f]


def read(folder: str, coco_images: str, languages=None) -> XTD:
  """The release's folder and the COCO images folder -> XTD; one line naming the file and what
  was expected when something is missing or not aligned (nothing is scored on part of the set)."""
  root = pathlib.Path(folder)
  names_files = sorted(root.rglob(IMAGE_NAMES))
  if not names_files:
    raise ValueError(f"XTD10: no {IMAGE_NAMES} under {folder} (the release's XTD10/ folder)")
  names = [n.strip() for n in _lines(names_files[0]) if n.strip()]
  captions = {}
  for path in sorted(root.rglob(f"{CAPTIONS}*.txt")):
    lang = path.stem.removeprefix(CAPTIONS)
    lang = LANGUAGE_CODES.get(lang, lang)
    if languages and lang not in languages:
      continue
    lines = _lines(path)
    while lines and not lines[-1].strip():
      lines.pop()
    if len(lines) != len(names):
      raise ValueError(f"XTD10: {path} has {len(lines)} captions for the {len(names)} images of "
                       f"{names_files[0]}: they must be aligned line by line")
    captions[lang] = lines
  missing_langs = sorted(set(languages or ()) - set(captions))
  if missing_langs or not captions:
    raise ValueError(f"XTD10: no {CAPTIONS}<lang>.txt for {missing_langs or 'any language'} under {folder}")
  if not os.path.isdir(coco_images):
    raise ValueError(f"XTD10: the COCO images folder {coco_images} does not exist")
  paths = [image_files.coco_2014_file(coco_images, n) for n in names]
  absent = [n for n, p in zip(names, paths) if not os.path.exists(p)]
  if absent:
    raise ValueError(f"XTD10: {len(absent)} of its {len(names)} images are not in {coco_images} (nor its "
                     f"train2014/, val2014/), e.g. {absent[0]}: XTD10 is scored on all of them")
  return XTD(paths, captions)
