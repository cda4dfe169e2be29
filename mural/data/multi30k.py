"""Multi30k captions (text only): translations (task 1) and comparable captions (task 2).

Layout (the public release, github.com/multi30k/dataset):
  task1/raw/<split>.<lang>.gz   one caption per line, line i of every language
                                describes image line i of task1/image_splits/<split>.txt
  task2/raw/<split>.<k>.<lang>.gz  k = 1..5, en and de written independently;
                                image i of task2/image_splits/<split>_images.txt

It serves the text-text (t2t) task ('multi30k' in TEXT_PAIR_SOURCES) and, with
the images of a split (Flickr30k's flickr30k-images/ for train, val and
test_2016_flickr; the test_2017 sets' own image releases), the image-text task
('multi30k' in IMAGE_TEXT_SOURCES) and retrieval evaluation per language
(`eval_data`), task 1 or task 2.
"""

import dataclasses
import gzip
import itertools
import os
from typing import Dict, List, Optional, Sequence, Tuple

from mural import lazy_import
from mural.data import image_files
from mural.data import paths
from mural.data import records

tf = lazy_import.module("tensorflow")  # For the tf.data source only.

ENV_VAR = "MURAL_MULTI30K_DIR"
IMAGES_ENV_VAR = "MURAL_MULTI30K_IMAGES"  # The folder of a split's image files.
LANGUAGES = ("en", "de", "fr", "cs")  # Task 1; test_2017_* have no cs.
TASK2_LANGUAGES = ("en", "de")
TASK2_CAPTIONS = 5

# Our split names -> release file stems.
TASK1_SPLITS = {
    "train": "train", "val": "val", "dev": "val", "validation": "val",
    "test": "test_2016_flickr", "test_2016": "test_2016_flickr", "test_2016_flickr": "test_2016_flickr",
    "test_2017_flickr": "test_2017_flickr", "test_2017_mscoco": "test_2017_mscoco",
    "test_2018_flickr": "test_2018_flickr",
}
TEST_SPLITS = ("test_2016_flickr", "test_2017_flickr", "test_2017_mscoco", "test_2018_flickr")  # As released.
TASK2_SPLITS = {
    "train": "train", "val": "val", "dev": "val", "validation": "val",
    "test": "test_2016", "test_2016": "test_2016", "test_2016_flickr": "test_2016",
}
PAIR_KINDS = ("translation", "comparable")


def data_dir(path: Optional[str] = None) -> str:
  """path, else $MURAL_MULTI30K_DIR; ValueError naming what was tried."""
  return paths.resolve_data_dir(path, ENV_VAR, "Multi30k", ("task1/",))


def _read_lines(path: str) -> List[str]:
  if not os.path.exists(path):
    raise ValueError(f"Multi30k file {path} does not exist")
  opener = gzip.open if path.endswith(".gz") else open
  with opener(path, "rt", encoding="utf-8") as f:
    return [line.rstrip("\r\n") for line in f]


def _split(table: Dict[str, str], split: str, task: str) -> str:
  if split not in table:
    raise ValueError(f"Multi30k {task}: unknown split {split!r}; known: {sorted(table)}")
  return table[split]


@dataclasses.dataclass
class Task1:
  """Line-aligned translations: captions[lang][i] describes images[i]."""
  split: str
  images: List[str]
  captions: Dict[str, List[str]]


@dataclasses.dataclass
class Task2:
  """Independent captions: captions[lang][i] holds the 5 captions of images[i]."""
  split: str
  images: List[str]
  captions: Dict[str, List[List[str]]]


@dataclasses.dataclass
class Pairs:
  """Aligned text pairs: (left[i], right[i]) describe image[i]."""
  left_lang: str
  right_lang: str
  left: List[str]
  right: List[str]
  image: List[str]

  def __len__(self):
    return len(self.left)


def task1(split: str, languages: Sequence[str] = LANGUAGES, path: Optional[str] = None) -> Task1:
  """Per-language caption lists of task 1, checked to be line-aligned with the image list."""
  root, stem = data_dir(path), _split(TASK1_SPLITS, split, "task1")
  images = _read_lines(os.path.join(root, "task1", "image_splits", f"{stem}.txt"))
  captions = {}
  for lang in languages:
    f = os.path.join(root, "task1", "raw", f"{stem}.{lang}.gz")
    if not os.path.exists(f):
      raise ValueError(f"Multi30k task1 has no {lang!r} captions for split {stem!r} ({f} is missing)")
    captions[lang] = _read_lines(f)
    if len(captions[lang]) != len(images):
      raise ValueError(f"{f}: {len(captions[lang])} lines, but the image list has {len(images)}")
  return Task1(stem, images, captions)


def task2(split: str, languages: Sequence[str] = TASK2_LANGUAGES, path: Optional[str] = None) -> Task2:
  """The 5 independent captions per image and language of task 2."""
  root, stem = data_dir(path), _split(TASK2_SPLITS, split, "task2")
  images = _read_lines(os.path.join(root, "task2", "image_splits", f"{stem}_images.txt"))
  captions = {}
  for lang in languages:
    if lang not in TASK2_LANGUAGES:
      raise ValueError(f"Multi30k task2 has only {TASK2_LANGUAGES} captions, not {lang!r}")
    columns = []
    for k in range(1, TASK2_CAPTIONS + 1):
      f = os.path.join(root, "task2", "raw", f"{stem}.{k}.{lang}.gz")
      columns.append(_read_lines(f))
      if len(columns[-1]) != len(images):
        raise ValueError(f"{f}: {len(columns[-1])} lines, but the image list has {len(images)}")
    captions[lang] = [list(c) for c in zip(*columns)]
  return Task2(stem, images, captions)


def translation_pairs(split: str, left: str, right: str, path: Optional[str] = None) -> Pairs:
  """Task 1 translations left -> right, one pair per image."""
  t = task1(split, (left, right), path)
  return Pairs(left, right, t.captions[left], t.captions[right], t.images)


def all_translation_pairs(split: str, languages: Sequence[str] = LANGUAGES,
                          path: Optional[str] = None) -> Dict[Tuple[str, str], Pairs]:
  """Translation pairs for every unordered language pair (in `languages` order)."""
  t = task1(split, languages, path)
  return {(a, b): Pairs(a, b, t.captions[a], t.captions[b], t.images)
          for a, b in itertools.combinations(languages, 2)}


def comparable_pairs(split: str, path: Optional[str] = None) -> Pairs:
  """Task 2 en-de pairs of captions of the same image: all 5 x 5 per image.

  Image-major, then en caption, then de caption.
  """
  t = task2(split, ("en", "de"), path)
  left, right, image = [], [], []
  for i, name in enumerate(t.images):
    for en, de in itertools.product(t.captions["en"][i], t.captions["de"][i]):
      left.append(en)
      right.append(de)
      image.append(name)
  return Pairs("en", "de", left, right, image)


def task1_languages(split: str, path: Optional[str] = None) -> Tuple[str, ...]:
  """The languages task 1 has for a split (the test_2017 sets have no cs)."""
  root, stem = data_dir(path), _split(TASK1_SPLITS, split, "task1")
  return tuple(l for l in LANGUAGES if os.path.exists(os.path.join(root, "task1", "raw", f"{stem}.{l}.gz")))


def images_dir(images: Optional[str] = None) -> str:
  """images, else $MURAL_MULTI30K_IMAGES; ValueError naming what was tried."""
  return paths.resolve_data_dir(images, IMAGES_ENV_VAR, "Multi30k's images (e.g. Flickr30k's flickr30k-images/)")


def captions(split: str, task: int = 1, languages: Optional[Sequence[str]] = None, path: Optional[str] = None,
             images: Optional[str] = None) -> List[image_files.Caption]:
  """The captions of a split with their image files, image by image: task 1, each image's line in
  every language; task 2, its 5 captions per language."""
  folder = images_dir(images)
  if task == 1:
    t1 = task1(split, languages or task1_languages(split, path), path)
    return [image_files.Caption(os.path.join(folder, image), t1.captions[lang][i].strip(), lang)
            for i, image in enumerate(t1.images) for lang in t1.captions]
  if task == 2:
    t2 = task2(split, languages or TASK2_LANGUAGES, path)
    return [image_files.Caption(os.path.join(folder, image), c.strip(), lang)
            for i, image in enumerate(t2.images) for lang in t2.captions for c in t2.captions[lang][i]]
  raise ValueError(f"Multi30k: task {task!r} is 1 (translations) or 2 (independent captions)")


def image_text_source(source_config, split: str, process_index: int, process_count: int, config=None):
  """'multi30k' image-text source: a split's images with their captions (image_files.dataset).

  Fields: path (None: $MURAL_MULTI30K_DIR), images (the split's image folder; None:
  $MURAL_MULTI30K_IMAGES), task (1: en, de, fr, cs translations; 2: 5 independent en and de
  captions per image), languages (None: the task's).
  """
  del config
  cfg = records.source_fields(source_config, "multi30k", dict(path=None, images=None, task=1, languages=None))
  rows = captions(split, cfg["task"], cfg["languages"], cfg["path"], cfg["images"])
  return image_files.dataset(rows, f"Multi30k task {cfg['task']}, split {split}", process_index, process_count)


def eval_data(split: str = "test_2016_flickr", task: int = 1, languages: Optional[Sequence[str]] = None,
              path: Optional[str] = None, images: Optional[str] = None) -> image_files.EvalData:
  """Retrieval eval data of a split: its images and their captions per language."""
  rows = captions(split, task, languages, path, images)
  present = {r.lang for r in rows}
  return image_files.eval_data(rows, split, [l for l in LANGUAGES if l in present], f"Multi30k task {task}")


def _language_pairs(cfg) -> List[Tuple[str, str]]:
  langs = list(cfg["languages"])
  for lang in langs:
    if lang not in LANGUAGES:
      raise ValueError(f"data source 'multi30k': language {lang!r} not in {LANGUAGES}")
  if not cfg["language_pairs"]:
    return list(itertools.combinations(langs, 2))
  pairs = []
  for p in cfg["language_pairs"]:
    a, _, b = str(p).partition("-")
    if a not in LANGUAGES or b not in LANGUAGES or a == b:
      raise ValueError(f"data source 'multi30k': language_pairs entry {p!r} is not 'xx-yy' of {LANGUAGES}")
    pairs.append((a, b))
  return pairs


def text_pair_source(source_config, split: str, process_index: int, process_count: int,
                      config=None):
  """'multi30k' t2t source.

  Fields: path (None: $MURAL_MULTI30K_DIR),
  kinds (['translation']; add 'comparable' for task 2 en-de same-image
  captions, 25 per image), languages (['en','de','fr','cs']), language_pairs
  (None: every pair of `languages`; or ['en-de', ...]). Elements are grouped
  by image (its translations, then its comparable pairs) so a shuffle buffer
  mixes them; processes get disjoint images (image i -> process i % count).
  """

  cfg = records.source_fields(source_config, "multi30k", dict(
      path=None, kinds=["translation"], languages=list(LANGUAGES), language_pairs=None))
  records.check_process(process_index, process_count)
  kinds = list(cfg["kinds"])
  if not kinds or any(k not in PAIR_KINDS for k in kinds):
    raise ValueError(f"data source 'multi30k': kinds {kinds} must be a non-empty subset of {PAIR_KINDS}")
  lang_pairs = _language_pairs(cfg) if "translation" in kinds else []
  # One dataset row per image of this process; flat_map expands it into its
  # pairs in-graph (the 25 comparable pairs per image would be 725k strings).
  per_image, images = {}, None
  if lang_pairs:
    langs = sorted({lang for p in lang_pairs for lang in p}, key=LANGUAGES.index)
    t1 = task1(split, langs, cfg["path"])
    images = t1.images
    per_image["t_left"] = [[t1.captions[a][i] for a, _ in lang_pairs] for i in range(len(images))]
    per_image["t_right"] = [[t1.captions[b][i] for _, b in lang_pairs] for i in range(len(images))]
  if "comparable" in kinds:
    t2 = task2(split, ("en", "de"), cfg["path"])
    if images is not None and images != t2.images:
      raise ValueError(f"Multi30k split {split!r}: task1 and task2 image lists differ")
    images = t2.images
    per_image["en"], per_image["de"] = t2.captions["en"], t2.captions["de"]
  mine = range(process_index, len(images), process_count)
  ds = tf.data.Dataset.from_tensor_slices(
      {k: tf.constant([v[i] for i in mine], tf.string, shape=[len(mine), len(v[0])]) for k, v in per_image.items()})
  left_langs = tf.constant([a for a, _ in lang_pairs], tf.string)
  right_langs = tf.constant([b for _, b in lang_pairs], tf.string)
  n = TASK2_CAPTIONS
  en_idx, de_idx = [i for i in range(n) for _ in range(n)], [j for _ in range(n) for j in range(n)]

  def expand(row):
    parts = []
    if "t_left" in row:
      parts.append((row["t_left"], row["t_right"], left_langs, right_langs))
    if "en" in row:
      m = n * n
      parts.append((tf.gather(row["en"], en_idx), tf.gather(row["de"], de_idx),
                    tf.fill([m], "en"), tf.fill([m], "de")))
    columns = [tf.concat(list(c), 0) for c in zip(*parts)]
    return tf.data.Dataset.from_tensor_slices(dict(zip(("left", "right", "left_lang", "right_lang"), columns)))

  return ds.flat_map(expand)
