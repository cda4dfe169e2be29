"""Captioned image files as released datasets ship them: a training source and retrieval eval data.

A released dataset (Flickr8k, Multi30k with Flickr30k's photos, COCO or Flickr30k
with Karpathy's split file) reads its own files into `Caption`s, image by image;
this module turns them into what training and evaluation read, the same way for
each: a tf.data source of encoded image bytes + caption + lang with whole images
per process, and the unique images of a split with their captions per language.
"""

import collections
import dataclasses
import logging
import os
from typing import Dict, List, Sequence

import numpy as np

from mural import lazy_import
from mural.data import records

tf = lazy_import.module("tensorflow")  # For the tf.data source only.


@dataclasses.dataclass(frozen=True)
class Caption:
  image: str  # The image file's path.
  caption: str
  lang: str


COCO_2014_FOLDERS = ("train2014", "val2014")  # As COCO's zips unpack; XTD10 and COCO-CN name their files.


def coco_2014_file(images: str, file_name: str) -> str:
  """The file of a COCO 2014 image name (COCO_val2014_000000000042.jpg) in a user's folder: the
  folder that holds train2014/ and val2014/, or the images all in one. Where it is in neither, the
  path it would have under its own subfolder (for the caller's missing-image message)."""
  for candidate in (os.path.join(images, sub, file_name) for sub in COCO_2014_FOLDERS + ("",)):
    if os.path.exists(candidate):
      return candidate
  own = next((sub for sub in COCO_2014_FOLDERS if f"_{sub}_" in file_name), "")
  return os.path.join(images, own, file_name)


def dataset(captions: Sequence[Caption], title: str, process_index: int, process_count: int):
  """tf.data of {'image': encoded bytes, 'caption', 'lang'} in `captions`' order; the k-th image
  (in order of first appearance) and all its captions go to process k % count. A missing image
  file gives image '' (the pipeline skips the record and counts it), said here in one line."""
  records.check_process(process_index, process_count)
  if not captions:
    raise ValueError(f"{title}: no captions")
  order = {path: k for k, path in enumerate(dict.fromkeys(c.image for c in captions))}
  mine = [c for c in captions if order[c.image] % process_count == process_index]
  present = {path: os.path.exists(path) for path in dict.fromkeys(c.image for c in mine)}
  logging.info("%s: %d captions of %d images for this process", title, len(mine), len(present))
  if not all(present.values()):
    missing = [p for p, here in present.items() if not here]
    logging.warning("%s: %d of %d image files are missing (e.g. %s); their captions are skipped and counted",
                    title, len(missing), len(present), missing[0])
  ds = tf.data.Dataset.from_tensor_slices({
      "path": tf.constant([c.image if present[c.image] else "" for c in mine], tf.string),
      "caption": tf.constant([c.caption for c in mine], tf.string),
      "lang": tf.constant([c.lang for c in mine], tf.string)})

  def read(ex):
    image = tf.cond(tf.equal(ex["path"], ""), lambda: tf.constant("", tf.string),
                    lambda: tf.io.read_file(ex["path"]))
    return {"image": image, "caption": ex["caption"], "lang": ex["lang"]}

  return ds.map(read, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)


@dataclasses.dataclass
class EvalData:
  """Retrieval eval data: unique images, and per language captions with the index of their image."""
  split: str
  images: List[str]  # Image file paths, unique, in order of first appearance.
  captions: Dict[str, List[str]]
  caption_image: Dict[str, np.ndarray]  # lang -> int32 [num captions], index into images.

  def image_bytes(self) -> List[bytes]:
    out = []
    for p in self.images:
      with open(p, "rb") as f:
        out.append(f.read())
    return out


def eval_data(captions: Sequence[Caption], split: str, languages: Sequence[str], title: str) -> EvalData:
  """The images of `captions` and their captions per language (in `languages` order); an image
  file missing is a ValueError: an eval set is complete or not evaluated."""
  if not captions:
    raise ValueError(f"{title}: no captions for split {split!r}, languages {list(languages)}")
  images = list(dict.fromkeys(c.image for c in captions))
  absent = [p for p in images if not os.path.exists(p)]
  if absent:
    raise ValueError(f"{title}, split {split!r}: {len(absent)} of its {len(images)} image files are missing, "
                     f"e.g. {absent[0]}")
  index = {path: k for k, path in enumerate(images)}
  texts, caption_image = collections.defaultdict(list), collections.defaultdict(list)
  for c in captions:
    texts[c.lang].append(c.caption)
    caption_image[c.lang].append(index[c.image])
  langs = [lang for lang in languages if lang in texts]
  return EvalData(split, images, {lang: texts[lang] for lang in langs},
                  {lang: np.asarray(caption_image[lang], np.int32) for lang in langs})
