"""COCO, Flickr30k and Flickr8k with Karpathy's split files (dataset_coco.json and its siblings).

The split file (Karpathy and Fei-Fei 2015; the usual train/val/test of English
image-text retrieval) lists every image with its split and captions:

  {"dataset": "coco", "images": [{"filepath": "val2014", "filename": "COCO_val2014_000000391895.jpg",
    "split": "test", "sentences": [{"raw": "A man with a red helmet ...", ...}, ...]}, ...]}

An image's file is <images>/<filepath>/<filename> (COCO: the folder that holds
train2014/ and val2014/ as COCO's zips unpack) or <images>/<filename> (Flickr30k,
Flickr8k: no filepath). Splits: 'train' (with COCO's 'restval' unless the source
says restval=False: the 113k training images most papers use), 'val', 'test'
(COCO 5k, Flickr30k and Flickr8k 1k), 'restval'. Captions are English.

Serves 'karpathy' in IMAGE_TEXT_SOURCES and the retrieval eval data of a split
(`eval_data`).
"""

import functools
import json
import os
from typing import List, Optional

from mural.data import image_files
from mural.data import paths
from mural.data import records

SPLIT_FILE_ENV_VAR = "MURAL_KARPATHY_SPLIT_FILE"
IMAGES_ENV_VAR = "MURAL_KARPATHY_IMAGES"
SPLITS = ("train", "val", "test", "restval")


@functools.lru_cache(maxsize=4)
def _images(split_file: str) -> tuple:
  try:
    with open(split_file, encoding="utf-8") as f:
      data = json.load(f)
  except (OSError, ValueError) as e:
    raise ValueError(f"Karpathy split file {split_file}: {e}") from None
  if not isinstance(data, dict) or not isinstance(data.get("images"), list):
    raise ValueError(f"Karpathy split file {split_file}: no 'images' list (dataset_coco.json's form)")
  return tuple(data["images"])


def split_images(split_file: str) -> tuple:
  """Every image record of a split file, as it is (filepath, filename, split, sentences with their
  sentid), read once: sets that name captions by sentid (Crisscrossed Captions) index into it."""
  return _images(split_file)


def split_file_path(split_file: Optional[str] = None) -> str:
  """split_file, else $MURAL_KARPATHY_SPLIT_FILE; ValueError naming what was tried."""
  if split_file:
    where = "the source's split_file"
  elif os.environ.get(SPLIT_FILE_ENV_VAR):
    split_file, where = os.environ[SPLIT_FILE_ENV_VAR], f"${SPLIT_FILE_ENV_VAR}"
  else:
    raise ValueError(f"Karpathy splits: no split file given; set the source's split_file or ${SPLIT_FILE_ENV_VAR} "
                     "(dataset_coco.json, dataset_flickr30k.json or dataset_flickr8k.json)")
  if not os.path.isfile(split_file):
    raise ValueError(f"Karpathy split file {split_file} ({where}) does not exist")
  return split_file


def captions(split: str, split_file: Optional[str] = None, images: Optional[str] = None,
             restval: bool = True) -> List[image_files.Caption]:
  """The English captions of a split with their image files, image by image in file order."""
  if split not in SPLITS:
    raise ValueError(f"Karpathy splits: unknown split {split!r}; known: {list(SPLITS)}")
  split_file = split_file_path(split_file)
  folder = paths.resolve_data_dir(images, IMAGES_ENV_VAR, "Karpathy split images")
  wanted = {split, "restval"} if split == "train" and restval else {split}
  out = []
  for n, image in enumerate(_images(split_file)):
    try:
      if image["split"] not in wanted:
        continue
      path = os.path.join(folder, image.get("filepath", ""), image["filename"])
      out.extend(image_files.Caption(path, s["raw"].strip(), "en") for s in image["sentences"])
    except (KeyError, TypeError, AttributeError):
      raise ValueError(f"Karpathy split file {split_file}: image {n} lacks a split, filename or "
                       f"sentences' raw text: {str(image)[:120]}") from None
  return out


def image_text_source(source_config, split: str, process_index: int, process_count: int, config=None):
  """'karpathy' image-text source (image_files.dataset). Fields: split_file (None:
  $MURAL_KARPATHY_SPLIT_FILE), images (None: $MURAL_KARPATHY_IMAGES), restval (True: COCO's
  restval images train too)."""
  del config
  cfg = records.source_fields(source_config, "karpathy", dict(split_file=None, images=None, restval=True))
  rows = captions(split, cfg["split_file"], cfg["images"], cfg["restval"])
  return image_files.dataset(rows, f"Karpathy split {split} of {cfg['split_file'] or '$' + SPLIT_FILE_ENV_VAR}",
                             process_index, process_count)


def eval_data(split: str = "test", split_file: Optional[str] = None,
              images: Optional[str] = None) -> image_files.EvalData:
  """Retrieval eval data of a split (5 captions per image, English)."""
  return image_files.eval_data(captions(split, split_file, images, restval=False), split, ["en"],
                               f"Karpathy split {split}")
