"""Flickr8k subset: 875 real JPEGs with captions in en, zh, ar, de, fr, cs.

captions.tsv columns: image, flickr8k_split (train | dev | none: the image is
in neither official list), lang, source, kind, caption. Tab separated, no
quoting (captions hold '"'). Images in images/<image>.

Serves a small real image-text source ('flickr8k' in IMAGE_TEXT_SOURCES),
the dev-split retrieval eval data (`eval_data`), and the converter's test bed.
"""

import collections
import csv
import dataclasses
import logging
import os
from typing import Dict, List, Optional, Sequence

import numpy as np
import tensorflow as tf

from mural.data import paths
from mural.data import records

ENV_VAR = "MURAL_FLICKR8K_DIR"
LANGUAGES = ("en", "zh", "ar", "de", "fr", "cs")
COLUMNS = ("image", "flickr8k_split", "lang", "source", "kind", "caption")
SPLITS = ("train", "dev", "none")  # Values of the flickr8k_split column.
SPLIT_ALIASES = {"val": "dev", "validation": "dev"}  # And 'all': every row.


def data_dir(path: Optional[str] = None) -> str:
  """path -> $MURAL_FLICKR8K_DIR -> <repo>/../shared/data/flickr8k_1k; ValueError naming the path."""
  return paths.resolve_data_dir(path, ENV_VAR, "flickr8k_1k", "captions.tsv", "Flickr8k")


@dataclasses.dataclass(frozen=True)
class Row:
  image: str  # File name under images/.
  split: str
  lang: str
  source: str
  kind: str
  caption: str


def read_captions(path: Optional[str] = None) -> List[Row]:
  """All rows of captions.tsv, in file order; checks the header."""
  f = os.path.join(data_dir(path), "captions.tsv")
  with open(f, encoding="utf-8", newline="") as fh:
    reader = csv.reader(fh, delimiter="\t", quoting=csv.QUOTE_NONE)
    header = next(reader, None)
    if header is None or tuple(header) != COLUMNS:
      raise ValueError(f"{f}: header {header} is not {list(COLUMNS)}")
    rows = []
    for n, values in enumerate(reader, start=2):
      if len(values) != len(COLUMNS):
        raise ValueError(f"{f}: line {n} has {len(values)} columns, expected {len(COLUMNS)}")
      rows.append(Row(*values))
  return rows


def _split_name(split: str) -> str:
  split = SPLIT_ALIASES.get(split, split)
  if split not in SPLITS and split != "all":
    raise ValueError(f"Flickr8k: unknown split {split!r}; known: {list(SPLITS) + ['all'] + list(SPLIT_ALIASES)}")
  return split


def select(rows: Sequence[Row], split: str, languages: Optional[Sequence[str]] = None,
           caption_sources: Optional[Sequence[str]] = None) -> List[Row]:
  """Rows of a split ('train' | 'dev' | 'none' | 'all'), languages and caption sources."""
  split = _split_name(split)
  languages = tuple(languages or LANGUAGES)
  for lang in languages:
    if lang not in LANGUAGES:
      raise ValueError(f"Flickr8k: language {lang!r} not in {LANGUAGES}")
  return [r for r in rows
          if (split == "all" or r.split == split) and r.lang in languages
          and (not caption_sources or r.source in caption_sources)]


def image_text_source(source_config, split: str, process_index: int, process_count: int,
                      config=None) -> tf.data.Dataset:
  """'flickr8k': encoded JPEG bytes + caption + lang, one element per caption.

  Fields: path (None: $MURAL_FLICKR8K_DIR, then <repo>/../shared/data/flickr8k_1k),
  languages (all six), caption_sources (None: all; e.g. ['flickr8k',
  'flickr8k-cn-zhc'] drops the Multi30k copies). Order: file order (grouped by
  image); processes get disjoint images (the k-th image -> process k % count).
  A missing image file gives image '' (the pipeline skips and counts it).
  """

  cfg = records.source_fields(source_config, "flickr8k", dict(path=None, languages=list(LANGUAGES),
                                                                caption_sources=None))
  records.check_process(process_index, process_count)
  root = data_dir(cfg["path"])
  rows = select(read_captions(root), split, cfg["languages"], cfg["caption_sources"])
  if not rows:
    raise ValueError(f"Flickr8k {root}: no captions for split {split!r}, languages {cfg['languages']}")
  order = {name: k for k, name in enumerate(dict.fromkeys(r.image for r in rows))}
  mine = [r for r in rows if order[r.image] % process_count == process_index]
  paths, missing = [], 0
  for r in mine:
    p = os.path.join(root, "images", r.image)
    if os.path.exists(p):
      paths.append(p)
    else:
      paths.append("")
      missing += 1
  if missing:
    logging.warning("Flickr8k %s: %d captions point at missing image files (they come as image '')",
                    root, missing)
  ds = tf.data.Dataset.from_tensor_slices({
      "path": tf.constant(paths, tf.string),
      "caption": tf.constant([r.caption for r in mine], tf.string),
      "lang": tf.constant([r.lang for r in mine], tf.string)})

  def read(ex):
    image = tf.cond(tf.equal(ex["path"], ""), lambda: tf.constant("", tf.string),
                    lambda: tf.io.read_file(ex["path"]))
    return {"image": image, "caption": ex["caption"], "lang": ex["lang"]}

  return ds.map(read, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)


@dataclasses.dataclass
class EvalData:
  """Retrieval eval data: unique images, and per language captions with the index of their image."""
  split: str
  images: List[str]  # Absolute JPEG paths, unique, in file order.
  captions: Dict[str, List[str]]
  caption_image: Dict[str, np.ndarray]  # lang -> int32 [num captions], index into images.

  def image_bytes(self) -> List[bytes]:
    out = []
    for p in self.images:
      with open(p, "rb") as f:
        out.append(f.read())
    return out


def eval_data(split: str = "dev", languages: Optional[Sequence[str]] = None, path: Optional[str] = None,
              caption_sources: Optional[Sequence[str]] = None) -> EvalData:
  """Images of `split` (those with a caption in `languages`) and their captions per language.

  Images whose file is missing are a ValueError (eval sets must be complete).
  """
  root = data_dir(path)
  rows = select(read_captions(root), split, languages, caption_sources)
  if not rows:
    raise ValueError(f"Flickr8k {root}: no captions for split {split!r}, languages {languages}")
  names = list(dict.fromkeys(r.image for r in rows))
  index = {name: k for k, name in enumerate(names)}
  images = [os.path.join(root, "images", n) for n in names]
  absent = [p for p in images if not os.path.exists(p)]
  if absent:
    raise ValueError(f"Flickr8k eval split {split!r}: {len(absent)} image files missing, e.g. {absent[0]}")
  captions, caption_image = collections.defaultdict(list), collections.defaultdict(list)
  for r in rows:
    captions[r.lang].append(r.caption)
    caption_image[r.lang].append(index[r.image])
  langs = [lang for lang in (languages or LANGUAGES) if lang in captions]
  return EvalData(_split_name(split), images, {lang: captions[lang] for lang in langs},
                  {lang: np.asarray(caption_image[lang], np.int32) for lang in langs})
