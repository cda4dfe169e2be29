"""Flickr8k as released, with its captions in five more languages.

A Flickr8k folder, as the releases unpack (docs/data.md says where each is published):

  Flicker8k_Dataset/<photo>.jpg  the photos (Flickr8k_Dataset.zip, the release's spelling;
                                 Flickr8k_Dataset/ is read too)
  Flickr8k.token.txt             en: 5 captions per photo, '<photo>#<k><TAB><caption>'
  Flickr_8k.trainImages.txt      the official split, one photo name per line (6000 / 1000 /
  Flickr_8k.devImages.txt        1000); a photo in none of them is split 'none'. These
  Flickr_8k.testImages.txt       four come in Flickr8k_text.zip: here or in Flickr8k_text/.
  flickr8kzhc.caption.txt        zh: Flickr8k-CN's human-written captions, '<photo>#zhc#<k> <caption>'
  Flickr8k.arabic.txt            ar: 3 translated captions per photo, '<photo>#<k><TAB><caption>'

de, fr and cs (and more en) come from a Multi30k release folder
(mural/data/multi30k.py): a Flickr8k photo '<id>_<secret>.jpg' is Flickr30k's
'<id>.jpg', so task 1's translations and task 2's independent captions of the
Flickr30k photos that Flickr8k shares are theirs too.

Only photos present in the photo folder count: the release's 8,000, or a
subset (mural/data/flickr8k_subset.py writes one). A language asked for whose
file is absent is a one-line error naming the file.

Serves a real image-text source ('flickr8k' in IMAGE_TEXT_SOURCES), the
retrieval eval data of a split (`eval_data`), and the converter's test bed.
"""

import collections
import dataclasses
import functools
import logging
import os
from typing import Dict, List, Optional, Sequence, Tuple

from mural.data import image_files
from mural.data import multi30k
from mural.data import paths
from mural.data import records

ENV_VAR = "MURAL_FLICKR8K_DIR"
LANGUAGES = ("en", "zh", "ar", "de", "fr", "cs")
SPLITS = ("train", "dev", "test", "none")  # 'none': in no official list.
SPLIT_ALIASES = {"val": "dev", "validation": "dev"}  # And 'all': every row.
PHOTO_DIRS = ("Flicker8k_Dataset", "Flickr8k_Dataset")
TEXT_DIR = "Flickr8k_text"
TOKENS = "Flickr8k.token.txt"
SPLIT_FILES = {"train": "Flickr_8k.trainImages.txt", "dev": "Flickr_8k.devImages.txt",
               "test": "Flickr_8k.testImages.txt"}
CHINESE = "flickr8kzhc.caption.txt"
ARABIC = "Flickr8k.arabic.txt"
MULTI30K_LANGUAGES = ("de", "fr", "cs")  # Only Multi30k has them.
# Multi30k's splits whose photos are Flickr30k's (test_2017_mscoco's are COCO's).
TASK1_STEMS = ("train", "val", "test_2016_flickr", "test_2017_flickr")
TASK2_STEMS = ("train", "val", "test_2016")


@dataclasses.dataclass(frozen=True)
class Row:
  image: str  # File name in the photo folder.
  split: str
  lang: str
  source: str  # flickr8k | flickr8k-cn-zhc | flickr8k-arabic | multi30k-task1-<split> | multi30k-task2
  kind: str
  caption: str


def data_dir(path: Optional[str] = None) -> str:
  """path, else $MURAL_FLICKR8K_DIR; ValueError naming what was tried."""
  return paths.resolve_data_dir(path, ENV_VAR, "Flickr8k", (TOKENS, f"{TEXT_DIR}/{TOKENS}"))


def photo_dir(root: str) -> str:
  for name in PHOTO_DIRS:
    if os.path.isdir(os.path.join(root, name)):
      return os.path.join(root, name)
  raise ValueError(f"Flickr8k {root}: no photo folder {PHOTO_DIRS[0]}/ (Flickr8k_Dataset.zip unpacks to it)")


def text_file(root: str, name: str) -> Optional[str]:
  """root/name or root/Flickr8k_text/name, whichever exists; None if neither."""
  for f in (os.path.join(root, name), os.path.join(root, TEXT_DIR, name)):
    if os.path.exists(f):
      return f
  return None


def _lines(path: str) -> List[str]:
  with open(path, encoding="utf-8-sig") as f:
    return [line.rstrip("\r\n") for line in f if line.strip()]


def _numbered(path: str, separator: str, photos) -> Dict[str, List[str]]:
  """photo -> its captions in the order of their numbers, from '<photo>#[tag#]<k><sep><caption>' lines.

  A line that does not start so continues the caption before it (the Arabic release breaks one
  caption over two lines).
  """
  found, last = collections.defaultdict(list), None
  for n, line in enumerate(_lines(path), start=1):
    key, sep, caption = line.partition(separator)
    photo, _, number = key.rpartition("#")
    if sep and photo and number.isdigit():
      photo = photo.split("#")[0]
      last = [int(number), caption.strip()]
      if photo in photos:
        found[photo].append(last)
    elif last is not None:
      last[1] = f"{last[1]} {line.strip()}"
    else:
      raise ValueError(f"{path}: line {n} is not '<photo>#<k>{separator!r}<caption>': {line[:80]!r}")
  return {p: [c for _, c in sorted(v)] for p, v in found.items()}


def _splits(root: str, photos) -> Dict[str, str]:
  split = {}
  for name, file_name in SPLIT_FILES.items():
    f = text_file(root, file_name)
    for photo in _lines(f) if f else ():
      split.setdefault(photo.strip(), name)
  return {p: split.get(p, "none") for p in photos}


def _multi30k_rows(path: Optional[str], languages: Sequence[str], photos) -> Dict[str, List[Tuple]]:
  """photo -> [(lang, source, kind, caption)] from Multi30k's task 1 and task 2."""
  by_flickr30k = {p.split("_")[0] + ".jpg": p for p in photos}
  out = collections.defaultdict(list)
  root = multi30k.data_dir(path)
  task1_langs = [l for l in multi30k.LANGUAGES if l in languages]
  for stem in TASK1_STEMS if task1_langs else ():
    langs = [l for l in multi30k.task1_languages(stem, root) if l in task1_langs]
    if not langs or not os.path.exists(os.path.join(root, "task1", "image_splits", f"{stem}.txt")):
      continue  # A release without this split (or its languages): nothing of it to add.
    t = multi30k.task1(stem, langs, root)
    for i, image in enumerate(t.images):
      if image in by_flickr30k:
        for l in langs:
          kind = "original(flickr30k)" if l == "en" else "human-translated"
          out[by_flickr30k[image]].append((l, f"multi30k-task1-{stem}", kind, t.captions[l][i].strip()))
  task2_langs = [l for l in ("de", "en") if l in languages]
  for stem in TASK2_STEMS if task2_langs else ():
    t = multi30k.task2(stem, task2_langs, root)
    for i, image in enumerate(t.images):
      if image in by_flickr30k:
        for l in task2_langs:
          kind = "original(flickr30k)" if l == "en" else "human-written(independent)"
          out[by_flickr30k[image]].extend((l, "multi30k-task2", kind, c.strip()) for c in t.captions[l][i])
  return out


@functools.lru_cache(maxsize=8)
def _read(root: str, languages: Tuple[str, ...], multi30k_path: Optional[str]) -> Tuple[Row, ...]:
  photos = sorted(n for n in os.listdir(photo_dir(root)) if not n.startswith("."))
  present = set(photos)
  split = _splits(root, photos)
  per_photo = collections.defaultdict(list)

  def add(lang, file_name, separator, source, kind, release):
    if lang not in languages:
      return
    f = text_file(root, file_name)
    if f is None:
      raise ValueError(f"Flickr8k {root}: {lang} captions need {file_name} ({release}), here or in {TEXT_DIR}/")
    for photo, captions in _numbered(f, separator, present).items():
      per_photo[photo].extend((lang, source, kind, c) for c in captions)

  add("en", TOKENS, "\t", "flickr8k", "original", "Flickr8k_text.zip")
  add("ar", ARABIC, "\t", "flickr8k-arabic", "translated", "github.com/ObeidaElJundi/Arabic-Image-Captioning")
  add("zh", CHINESE, " ", "flickr8k-cn-zhc", "human-written", "github.com/li-xirong/flickr8kcn, data/")
  if multi30k_path or set(languages) & set(MULTI30K_LANGUAGES):
    try:
      for photo, rows in _multi30k_rows(multi30k_path, languages, present).items():
        per_photo[photo].extend(rows)
    except ValueError as e:
      raise ValueError(f"Flickr8k's {', '.join(l for l in languages if l in MULTI30K_LANGUAGES) or 'Multi30k'} "
                       f"captions come from Multi30k: {e}") from None
  return tuple(Row(p, split[p], *r) for p in photos for r in per_photo[p])


def read_captions(path: Optional[str] = None, languages: Sequence[str] = LANGUAGES,
                  multi30k_path: Optional[str] = None) -> List[Row]:
  """Every caption in `languages` of the photos present, photo by photo in name order."""
  for lang in languages:
    if lang not in LANGUAGES:
      raise ValueError(f"Flickr8k: language {lang!r} not in {LANGUAGES}")
  multi30k_path = multi30k_path or os.environ.get(multi30k.ENV_VAR) or None  # Part of the cache key.
  return list(_read(os.path.abspath(data_dir(path)), tuple(languages), multi30k_path))


def _split_name(split: str) -> str:
  split = SPLIT_ALIASES.get(split, split)
  if split not in SPLITS and split != "all":
    raise ValueError(f"Flickr8k: unknown split {split!r}; known: {list(SPLITS) + ['all'] + list(SPLIT_ALIASES)}")
  return split


def select(rows: Sequence[Row], split: str, languages: Optional[Sequence[str]] = None,
           caption_sources: Optional[Sequence[str]] = None) -> List[Row]:
  """Rows of a split ('train' | 'dev' | 'test' | 'none' | 'all'), languages and caption sources."""
  split = _split_name(split)
  languages = tuple(languages or LANGUAGES)
  return [r for r in rows
          if (split == "all" or r.split == split) and r.lang in languages
          and (not caption_sources or r.source in caption_sources)]


def image_text_source(source_config, split: str, process_index: int, process_count: int,
                      config=None):
  """'flickr8k': encoded JPEG bytes + caption + lang, one element per caption.

  Fields: path (None: $MURAL_FLICKR8K_DIR), languages (all six), caption_sources
  (None: all; e.g. ['flickr8k', 'flickr8k-cn-zhc'] drops the Multi30k copies),
  multi30k_path (None: $MURAL_MULTI30K_DIR; needed for de, fr, cs). Order: photo
  by photo in name order; processes get disjoint photos (image_files.dataset).
  """
  del config
  cfg = records.source_fields(source_config, "flickr8k", dict(
      path=None, languages=list(LANGUAGES), caption_sources=None, multi30k_path=None))
  root = data_dir(cfg["path"])
  rows = select(read_captions(root, cfg["languages"], cfg["multi30k_path"]), split, cfg["languages"],
                cfg["caption_sources"])
  return image_files.dataset(_captions(root, rows), f"Flickr8k {root}, split {split}", process_index,
                             process_count)


def _captions(root: str, rows: Sequence[Row]) -> List[image_files.Caption]:
  photos = photo_dir(root)
  return [image_files.Caption(os.path.join(photos, r.image), r.caption, r.lang) for r in rows]


def _say_if_partial(root: str, split: str, evaluated: int) -> None:
  """A split evaluated on fewer photos than its official list names is said, with both counts."""
  list_file = text_file(root, SPLIT_FILES[split]) if split in SPLIT_FILES else None
  if list_file is not None:
    listed = len(set(_lines(list_file)))
    if evaluated < listed:
      logging.warning("Flickr8k %s split: %d of the %d photos %s lists are in %s; evaluating on those.",
                      split, evaluated, listed, os.path.basename(list_file), photo_dir(root))


def eval_data(split: str = "dev", languages: Optional[Sequence[str]] = None, path: Optional[str] = None,
              caption_sources: Optional[Sequence[str]] = None,
              multi30k_path: Optional[str] = None) -> image_files.EvalData:
  """The photos of `split` present (those with a caption in `languages`) and their captions per language."""
  root = data_dir(path)
  languages = tuple(languages or LANGUAGES)
  rows = select(read_captions(root, languages, multi30k_path), split, languages, caption_sources)
  data = image_files.eval_data(_captions(root, rows), _split_name(split), languages, f"Flickr8k {root}")
  _say_if_partial(root, _split_name(split), len(data.images))
  return data
