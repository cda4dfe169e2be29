"""Retrieval and translation eval sets, as NumPy arrays ready for the embedders.

`build_eval_sets(config, tokenizer) -> (list[EvalSet], list[TranslationEvalSet])`
from config.data.eval_source (a dict; 'name' picks the builder in EVAL_SOURCES, '' none):
  'synthetic': held-out scenes of mural.data.synthetic (config.data.synthetic):
      one image per scene shared by every language, captions per language, and
      aligned caption pairs per translation pair.
  'flickr8k': real photos of a Flickr8k split, the release's folder
      (mural/data/flickr8k.py; fields: split 'dev', path None: $MURAL_FLICKR8K_DIR,
      caption_sources None, max_images 0 = all, multi30k_path None:
      $MURAL_MULTI30K_DIR) with their captions per language; no translation sets
      (its languages are not line-aligned).
  'multi30k': a Multi30k split with its images (mural/data/multi30k.py; fields: split
      'test_2016_flickr', task 1 (one caption per image in en, de, fr, cs) or 2 (five in
      en, de), path None: $MURAL_MULTI30K_DIR, images None: $MURAL_MULTI30K_IMAGES,
      max_images 0 = all): retrieval per language, the benchmark of the papers.
  'karpathy': a split of COCO, Flickr30k or Flickr8k by Karpathy's split file
      (mural/data/karpathy.py; fields: split 'test', split_file, images, max_images):
      English retrieval, 5 captions per image (COCO 5k test, Flickr30k 1k).
  'records': the user's held-out image-text records, in any format training reads
      (fields: source, an image-text source's dict as in config.tasks.*.sources, e.g.
      dict(name='tfrecord', files='/data/heldout-*.tfrecord'); split 'eval', the
      '{split}' of its file globs or a TFDS split; max_images 0 = all). Records
      with the same image bytes are one image with several captions; a record in
      a language outside data.languages, or with an empty caption, is skipped
      and counted in one log line. With the source's `holdout` (a fraction, the
      same source dict as training's), only its held-out records: the split a
      run makes from one file (mural/data/records.py, HOLDOUT_BUCKETS).
and, from config.data.eval_translations ('name' in EVAL_TRANSLATIONS; '' for none), more
translation sets:
  'multi30k': Multi30k task 1's line-aligned captions of a split (fields: split
      'test_2016_flickr', path None, max_pairs 0 = all), a set per pair of
      config.data.languages among en, de, fr, cs (test_2017_* have no cs), named
      'multi30k:en-de' and so on (beside the eval source's own 'en-de').
  'records': the user's held-out text pairs, in any format training reads (fields:
      source, a text-pair source's dict, e.g. dict(name='pairs_tsv',
      files='/data/heldout_pairs.tsv'); split 'eval'; max_pairs 0 = all, per
      language pair; label 'pairs'), a set per language pair found, named
      'pairs:en-de' and so on.
Only languages in config.data.languages get an EvalSet. Images go through the
eval preprocessing (short side to data.eval_resize, central data.image_size
crop, [-1, 1]); an eval image that cannot be decoded is an error naming it,
since an incomplete eval set would change the metric silently.
"""

import collections
import dataclasses
import hashlib
import itertools
from typing import Dict, List, Sequence, Tuple

import numpy as np
import tensorflow as tf
from absl import logging

from mural.data import flickr8k
from mural.data import karpathy
from mural.data import multi30k
from mural.data import preprocess
from mural.data import records
from mural.data import sources
from mural.data import synthetic


@dataclasses.dataclass(frozen=True)
class EvalSet:
  """Retrieval in one language: caption m describes image text_to_image[m]."""
  name: str  # Language code.
  images: np.ndarray  # float32 [N, S, S, 3] in [-1, 1].
  text_ids: np.ndarray  # int32 [M, L]
  text_mask: np.ndarray  # int32 [M, L]
  text_to_image: np.ndarray  # int32 [M]


@dataclasses.dataclass(frozen=True)
class TranslationEvalSet:
  """Aligned text pairs: row k of left and right say the same thing."""
  name: str  # 'en-de'.
  left_ids: np.ndarray  # int32 [K, L]
  left_mask: np.ndarray
  right_ids: np.ndarray
  right_mask: np.ndarray


def _tokenize(tokenizer, texts: Sequence[str], lang: int, chunk: int = 4096):
  """Texts of one language (its index in data.languages: per-language word tokenizers read it)."""
  ids, masks = [], []
  for i in range(0, len(texts), chunk):
    part = list(texts[i:i + chunk])
    a, b = tokenizer.tokenize(tf.constant(part, tf.string), tf.fill([len(part)], lang))
    ids.append(a.numpy())
    masks.append(b.numpy())
  return np.concatenate(ids), np.concatenate(masks)


def eval_images(images, data_config) -> np.ndarray:
  """uint8 images ([N,H,W,3] array or a list of [H,W,3]) -> float32 [N, S, S, 3].

  The resize and crop run as one graph for every image, whatever its size (op by op in eager
  mode each image took ~6 ms of Python dispatch: the demo's 200, 1.2 s); the normalisation runs
  once on them all, eagerly, as eval_image's own does (a graph may fold its division into a
  product, which rounds differently)."""
  if not len(images):  # pylint: disable=g-explicit-length-test  (a list or an array)
    raise ValueError("no evaluation images")
  size = data_config.image_size
  crop = tf.function(lambda image: preprocess.eval_crop(image, data_config.eval_resize, size),
                     input_signature=[tf.TensorSpec([None, None, 3], tf.uint8)], autograph=False)
  crops = np.empty((len(images), size, size, 3), np.float32)
  for k, image in enumerate(images):
    crops[k] = crop(tf.constant(image)).numpy()
  return preprocess.normalize(crops).numpy()


def _decode(data, what: str) -> np.ndarray:
  """Encoded image bytes -> uint8 [H, W, 3]; a ValueError naming `what` when they do not decode
  (an eval set must be whole: a skipped image would change the metric silently)."""
  try:
    if not bool(preprocess.is_encoded_image(data)):
      raise ValueError("not a JPEG/PNG file")
    return preprocess.decode(data).numpy()
  except (tf.errors.OpError, ValueError) as e:
    raise ValueError(f"{what} cannot be decoded: {str(e).splitlines()[0]}") from None


def _decode_files(paths: Sequence[str]) -> List[np.ndarray]:
  return [_decode(tf.io.read_file(p), f"eval image {p}") for p in paths]


def _source_fields(eval_source, defaults: dict, field: str = "eval_source") -> dict:
  cfg = dict(eval_source)
  name = cfg.pop("name")
  unknown = sorted(set(cfg) - set(defaults))
  if unknown:
    raise ValueError(f"config.data.{field} ({name!r}): unknown field(s) {unknown}; "
                     f"known: {sorted(defaults)}")
  return {**defaults, **cfg}


def _count(field: str, value, name: str) -> int:
  if not isinstance(value, int) or isinstance(value, bool) or value < 0:
    raise ValueError(f"config.data.{field}.{name}: must be an int >= 0 (0: all), got {value!r}")
  return value


def synthetic_eval_sets(config, tokenizer) -> Tuple[List[EvalSet], List[TranslationEvalSet]]:
  _source_fields(config.data.eval_source, {})
  data = synthetic.build_eval_data(config)
  images = eval_images(data.images, config.data)
  sets = []
  for lang, d in data.languages.items():
    if lang in config.data.languages:
      ids, mask = _tokenize(tokenizer, d.captions, list(config.data.languages).index(lang))
      sets.append(EvalSet(lang, images, ids, mask, np.asarray(d.text_to_image, np.int32)))
  translations = []
  for name, p in data.translations.items():
    if p.left_lang in config.data.languages and p.right_lang in config.data.languages:
      index = list(config.data.languages).index
      left_ids, left_mask = _tokenize(tokenizer, p.left, index(p.left_lang))
      right_ids, right_mask = _tokenize(tokenizer, p.right, index(p.right_lang))
      translations.append(TranslationEvalSet(name, left_ids, left_mask, right_ids, right_mask))
  return sets, translations


def _image_file_sets(config, tokenizer, data, max_images: int) -> List[EvalSet]:
  """image_files.EvalData -> one retrieval set per language, on its first max_images images (0: all)."""
  n = len(data.images) if not max_images else min(max_images, len(data.images))
  images = eval_images(_decode_files(data.images[:n]), config.data)
  sets = []
  for lang, captions in data.captions.items():
    keep = np.flatnonzero(data.caption_image[lang] < n)
    if keep.size:
      ids, mask = _tokenize(tokenizer, [captions[k] for k in keep], list(config.data.languages).index(lang))
      sets.append(EvalSet(lang, images, ids, mask, data.caption_image[lang][keep].astype(np.int32)))
  return sets


def _configured_languages(config, offered: Sequence[str], title: str) -> List[str]:
  languages = [l for l in offered if l in config.data.languages]
  if not languages:
    raise ValueError(f"config.data.eval_source ({title}): none of its languages {list(offered)} "
                     f"is in config.data.languages {list(config.data.languages)}")
  return languages


def flickr8k_eval_sets(config, tokenizer) -> Tuple[List[EvalSet], List[TranslationEvalSet]]:
  cfg = _source_fields(config.data.eval_source, dict(split="dev", path=None, caption_sources=None,
                                                     max_images=0, multi30k_path=None))
  languages = _configured_languages(config, flickr8k.LANGUAGES, "Flickr8k")
  max_images = _count("eval_source", cfg["max_images"], "max_images")
  data = flickr8k.eval_data(cfg["split"], languages, cfg["path"], cfg["caption_sources"], cfg["multi30k_path"])
  return _image_file_sets(config, tokenizer, data, max_images), []


def multi30k_eval_sets(config, tokenizer) -> Tuple[List[EvalSet], List[TranslationEvalSet]]:
  cfg = _source_fields(config.data.eval_source, dict(split="test_2016_flickr", task=1, path=None, images=None,
                                                     max_images=0))
  offered = multi30k.task1_languages(cfg["split"], cfg["path"]) if cfg["task"] == 1 else multi30k.TASK2_LANGUAGES
  languages = _configured_languages(config, offered, f"Multi30k task {cfg['task']}")
  max_images = _count("eval_source", cfg["max_images"], "max_images")
  data = multi30k.eval_data(cfg["split"], cfg["task"], languages, cfg["path"], cfg["images"])
  return _image_file_sets(config, tokenizer, data, max_images), []


def karpathy_eval_sets(config, tokenizer) -> Tuple[List[EvalSet], List[TranslationEvalSet]]:
  cfg = _source_fields(config.data.eval_source, dict(split="test", split_file=None, images=None, max_images=0))
  _configured_languages(config, ("en",), "Karpathy splits")
  max_images = _count("eval_source", cfg["max_images"], "max_images")
  data = karpathy.eval_data(cfg["split"], cfg["split_file"], cfg["images"])
  return _image_file_sets(config, tokenizer, data, max_images), []


def multi30k_translation_sets(config, tokenizer) -> List[TranslationEvalSet]:
  cfg = _source_fields(config.data.eval_translations, dict(split="test_2016_flickr", path=None, max_pairs=0),
                       "eval_translations")
  languages = [l for l in config.data.languages if l in multi30k.LANGUAGES]
  if len(languages) < 2:
    raise ValueError(f"config.data.eval_translations: Multi30k has {list(multi30k.LANGUAGES)}, of which "
                     f"config.data.languages {list(config.data.languages)} hold fewer than two")
  max_pairs = _count("eval_translations", cfg["max_pairs"], "max_pairs")
  data = multi30k.task1(cfg["split"], languages, cfg["path"])
  n = max_pairs or len(data.images)
  # Each language tokenized once; its arrays shared by its pairs (the evaluator embeds them once).
  tokens = {l: _tokenize(tokenizer, data.captions[l][:n], list(config.data.languages).index(l)) for l in languages}
  return [TranslationEvalSet(f"multi30k:{a}-{b}", *tokens[a], *tokens[b]) for a, b in itertools.combinations(languages, 2)]


def _finite_records(field: str, cfg: dict, open_source, config, has_image: bool) -> tf.data.Dataset:
  """The records of `cfg['source']` (a training source's dict), read once, in order; with the
  source's `holdout`, only its held-out records (the ones training skips: records.py)."""
  source = cfg["source"]
  source = source.to_dict() if hasattr(source, "to_dict") else dict(source or {})
  if not source.get("name"):
    raise ValueError(f"config.data.{field}.source: a data source's dict, as in config.tasks.*.sources "
                     "(e.g. dict(name='tfrecord', files='/data/heldout-*.tfrecord'))")
  holdout = records.holdout_fraction(source, f"config.data.{field}.source")
  ds = open_source(source, cfg["split"], 0, 1, config=config)
  if not isinstance(ds, tf.data.Dataset):
    raise ValueError(f"config.data.{field}.source: {source['name']!r} is endless; the built-in data "
                     "is evaluated by eval_source 'synthetic'")
  return records.holdout_side(ds, records.holdout_key(has_image), holdout, held_out=True) if holdout else ds


def _no_records(count: int, cfg: dict, field: str = "eval_source") -> None:
  """A ValueError when the source gave no record at all (an empty held-out side says so)."""
  if count:
    return
  holdout = dict(cfg["source"]).get("holdout", 0)
  raise ValueError(f"config.data.{field}: {cfg['source']['name']!r} has no record" + (
      f" in its held-out {holdout:g} (too few records to hold any out: raise holdout, or give a held-out "
      "file)" if holdout else ""))


def _language(raw: bytes) -> str:
  return raw.decode("utf-8", "replace").strip().lower()  # As the training input reads it.


def records_eval_sets(config, tokenizer) -> Tuple[List[EvalSet], List[TranslationEvalSet]]:
  """'records' (the module docstring): one EvalSet per language of data.languages with captions."""
  cfg = _source_fields(config.data.eval_source, dict(source=None, split="eval", max_images=0))
  max_images = _count("eval_source", cfg["max_images"], "max_images")
  languages = list(config.data.languages)
  images: List[np.ndarray] = []
  image_of: Dict[bytes, int] = {}
  captions = {lang: [] for lang in languages}
  caption_image = {lang: [] for lang in languages}
  skipped, other_languages, n = collections.Counter(), collections.Counter(), -1
  for n, record in enumerate(_finite_records("eval_source", cfg, sources.image_text_source, config, True)
                             .as_numpy_iterator()):
    lang, caption = _language(record["lang"]), record["caption"].decode("utf-8", "replace").strip()
    if lang not in captions:
      skipped["unknown_language"] += 1
      other_languages[lang] += 1
      continue
    if not caption:
      skipped["empty_text"] += 1
      continue
    key = hashlib.sha256(record["image"]).digest()
    if key not in image_of:
      if max_images and len(images) == max_images:
        skipped["beyond_max_images"] += 1
        continue
      images.append(_decode(tf.constant(record["image"]),
                            f"config.data.eval_source: the image of record {n} of {cfg['source']['name']!r}"))
      image_of[key] = len(images) - 1
    captions[lang].append(caption)
    caption_image[lang].append(image_of[key])
  found = {lang: len(c) for lang, c in captions.items() if c}
  _no_records(n + 1, cfg)
  if not found:
    raise ValueError(f"config.data.eval_source: no record of {cfg['source']['name']!r} has a caption in "
                     f"config.data.languages {languages} (languages seen: {sorted(other_languages) or 'none'})")
  logging.info("Eval set 'records': %d images; captions per language %s; skipped %s%s.", len(images), found,
               dict(skipped) or "none",
               f" (languages not in data.languages: {dict(other_languages)})" if other_languages else "")
  missing = [lang for lang in languages if lang not in found]
  if missing:
    logging.warning("Eval set 'records' has no caption in %s: no image-text scores for %s.", missing,
                    "it" if len(missing) == 1 else "them")
  pixels = eval_images(images, config.data)
  sets = []
  for lang in found:
    ids, mask = _tokenize(tokenizer, captions[lang], languages.index(lang))
    sets.append(EvalSet(lang, pixels, ids, mask, np.asarray(caption_image[lang], np.int32)))
  return sets, []


def records_translation_sets(config, tokenizer) -> List[TranslationEvalSet]:
  """'records' (the module docstring): one TranslationEvalSet per language pair found."""
  cfg = _source_fields(config.data.eval_translations, dict(source=None, split="eval", max_pairs=0,
                                                           label="pairs"), "eval_translations")
  max_pairs = _count("eval_translations", cfg["max_pairs"], "max_pairs")
  languages = list(config.data.languages)
  pairs = collections.defaultdict(list)
  skipped, other_languages, n = collections.Counter(), collections.Counter(), 0
  pair_records = _finite_records("eval_translations", cfg, sources.text_pair_source, config, False)
  for n, record in enumerate(pair_records.as_numpy_iterator(), 1):
    a, b = _language(record["left_lang"]), _language(record["right_lang"])
    left = record["left"].decode("utf-8", "replace").strip()
    right = record["right"].decode("utf-8", "replace").strip()
    if a not in languages or b not in languages:
      skipped["unknown_language"] += 1
      other_languages.update(l for l in (a, b) if l not in languages)
    elif not left or not right:
      skipped["empty_text"] += 1
    elif a == b:
      skipped["same_language"] += 1
    elif not max_pairs or len(pairs[a, b]) < max_pairs:
      pairs[a, b].append((left, right))
  _no_records(n, cfg, "eval_translations")
  if not pairs:
    raise ValueError(f"config.data.eval_translations: no pair of {cfg['source']['name']!r} is between two "
                     f"languages of config.data.languages {languages} (languages seen outside them: "
                     f"{sorted(other_languages) or 'none'})")
  logging.info("Translation eval sets %r: pairs per language pair %s; skipped %s.", cfg["label"],
               {f"{a}-{b}": len(p) for (a, b), p in pairs.items()}, dict(skipped) or "none")
  out = []
  for (a, b), rows in sorted(pairs.items()):
    left = _tokenize(tokenizer, [l for l, _ in rows], languages.index(a))
    right = _tokenize(tokenizer, [r for _, r in rows], languages.index(b))
    out.append(TranslationEvalSet(f"{cfg['label']}:{a}-{b}", *left, *right))
  return out


EVAL_SOURCES = {
    "synthetic": synthetic_eval_sets,
    "flickr8k": flickr8k_eval_sets,
    "multi30k": multi30k_eval_sets,
    "karpathy": karpathy_eval_sets,
    "records": records_eval_sets,
}
EVAL_TRANSLATIONS = {
    "multi30k": multi30k_translation_sets,
    "records": records_translation_sets,
}


def build_eval_sets(config, tokenizer) -> Tuple[List[EvalSet], List[TranslationEvalSet]]:
  """The eval sets of config.data.eval_source and config.data.eval_translations (see the module
  docstring)."""
  name = config.data.eval_source.get("name")
  if name and name not in EVAL_SOURCES:
    raise ValueError(f"config.data.eval_source.name: {name!r} not in {sorted(EVAL_SOURCES)} ('' for none)")
  sets, translations = EVAL_SOURCES[name](config, tokenizer) if name else ([], [])
  extra = config.data.eval_translations.name
  if extra:
    if extra not in EVAL_TRANSLATIONS:
      raise ValueError(f"config.data.eval_translations.name: {extra!r} not in {sorted(EVAL_TRANSLATIONS)} "
                       "('' for none)")
    translations = translations + EVAL_TRANSLATIONS[extra](config, tokenizer)
  return sets, translations
