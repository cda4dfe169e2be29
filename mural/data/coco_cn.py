"""COCO-CN (Li et al. 2019): human-written Chinese sentences for 20,341 MSCOCO 2014 images,
split 18,341 / 1,000 / 1,000 (train / val / test).

Layout (the release, coco-cn-version1805v1.1/, given on request at github.com/li-xirong/coco-cn):
  coco-cn_train.txt, coco-cn_val.txt, coco-cn_test.txt   one COCO image id a line
                                                         (COCO_val2014_000000000042)
  imageid.human-written-caption.txt   <image id>#<k>\\t<sentence>: the k-th sentence written for it
  (imageid.manually-translated-caption.txt, imageid.human-written-tags.txt, ...: not read here)
Its images are COCO 2014's, <id>.jpg in the user's COCO folder as COCO's zips unpack
(train2014/, val2014/) or all in one (image_files.coco_2014_file).
"""

import os
from typing import Optional

from mural.data import image_files

RELEASE = "coco-cn-version1805v1.1"  # The release's folder, read where it is unpacked beside other files.
SPLIT_FILE = "coco-cn_{split}.txt"
CAPTION_FILE = "imageid.human-written-caption.txt"
SPLITS = ("train", "val", "test")


def find(folder: str, split: str = "test") -> Optional[str]:
  """The folder holding COCO-CN's split file: `folder` itself or its coco-cn-version1805v1.1/; None."""
  for candidate in (folder, os.path.join(folder, RELEASE)):
    if os.path.isfile(os.path.join(candidate, SPLIT_FILE.format(split=split))):
      return candidate
  return None


def eval_data(folder: str, images: str, split: str = "test") -> image_files.EvalData:
  """A split's images (the split file's order) and their human-written sentences ('zh', each
  image's in sentence order); ValueError (one line, naming the file) when a file is missing, a
  line is not in the release's form, an image has no sentence, or an image file is missing."""
  if split not in SPLITS:
    raise ValueError(f"COCO-CN: unknown split {split!r}; released: {list(SPLITS)}")
  root = find(folder, split)
  split_file = os.path.join(root or folder, SPLIT_FILE.format(split=split))
  if root is None:
    raise ValueError(f"COCO-CN: {split_file} does not exist (nor under {RELEASE}/)")
  caption_file = os.path.join(root, CAPTION_FILE)
  if not os.path.isfile(caption_file):
    raise ValueError(f"COCO-CN: {caption_file} does not exist (the release's human-written sentences, "
                     f"beside {os.path.basename(split_file)})")
  with open(split_file, encoding="utf-8") as f:
    ids = list(dict.fromkeys(line.strip() for line in f if line.strip()))
  if not ids:
    raise ValueError(f"COCO-CN: {split_file} lists no image id")
  wanted, sentences = set(ids), {}
  with open(caption_file, encoding="utf-8") as f:
    for n, line in enumerate(f, 1):
      if not line.strip():
        continue
      key, tab, text = line.rstrip("\r\n").partition("\t")
      image_id, hash_, index = key.partition("#")
      if not tab or not hash_ or not index.isdigit() or not text.strip():
        raise ValueError(f"COCO-CN: {caption_file} line {n} is not '<image id>#<k>\\t<sentence>': {line[:80]!r}")
      if image_id in wanted:
        sentences.setdefault(image_id, []).append((int(index), text.strip()))
  absent = [i for i in ids if i not in sentences]
  if absent:
    raise ValueError(f"COCO-CN: {caption_file} has no sentence for {len(absent)} of the {len(ids)} images of "
                     f"{split_file}, e.g. {absent[0]}")
  captions = [image_files.Caption(image_files.coco_2014_file(images, f"{i}.jpg"), text, "zh")
              for i in ids for _, text in sorted(sentences[i])]
  return image_files.eval_data(captions, split, ["zh"], f"COCO-CN ({images}: train2014/, val2014/)")
