"""Record kinds: what a task's records look like and how they become its batch.

A task (mural/system.py) reads one kind of record from its sources:
  IMAGE_TEXT: {'image', 'caption', 'lang'}                      -> 'image', 'text_ids', 'text_mask', 'valid' (+ 'lang' on the host)
  TEXT_PAIR:  {'left', 'right', 'left_lang', 'right_lang'}      -> 'left_ids', 'left_mask', 'right_ids', 'right_mask', 'valid'
  IMAGE_TEXT_VIEWS: image-text records as two SimCLR views      -> 'image', 'image2', 'text_ids', 'text_mask', 'valid' (Globetrotter)
  IMAGE_TEXT_LANG, TEXT_PAIR_LANG: the same records, with each text's language
      index on the device too ('lang_id'; 'left_lang_id', 'right_lang_id') and
      passed to the tokenizer (systems with per-language parameters: MULE, SMALR).
A kind is the one place that knows its batch layout: the pipeline builds the
batches with `check` and `finish`, the trainer takes their shapes from
`layout` (init, shardings, the jitted step). 'valid' is False on padding rows.

`check` gives each raw record a status (records.STATUS: the first failing
cheap check) and a language key: the language's index in data.languages
(image-text) or left * L + right (text pairs), -1 when unknown. The pipeline
samples languages by that key and counts skips by status. `check` and `finish`
run in tf.data without AutoGraph (sources.py's docstring says what that asks).
"""

from __future__ import annotations  # tf.Tensor annotations are not evaluated at import.

import dataclasses
from typing import Callable, Dict, Mapping, Optional, Sequence, Tuple

import jax
import jax.numpy as jnp
from mural import lazy_import
from mural.data import records

# TensorFlow loads when a pipeline first uses a kind, not when a task names one:
# building a model and its step (a benchmark, a host without TensorFlow) needs none.
tf = lazy_import.module("tensorflow")
preprocess = lazy_import.module("mural.data.preprocess")
sources = lazy_import.module("mural.data.sources")

_STATUS, _OK = records.STATUS, records.OK


def lang_index(lang: tf.Tensor, languages: tf.Tensor) -> tf.Tensor:
  """Index of `lang` (scalar or [N] tf.string) in `languages`; -1 if absent."""
  lang = tf.strings.lower(tf.strings.strip(lang))
  hits = tf.cast(tf.equal(lang[..., None], languages), tf.int32)
  return tf.where(tf.reduce_any(hits > 0, -1), tf.argmax(hits, -1, output_type=tf.int32), -1)


def text_status(text: tf.Tensor, max_chars: int) -> tf.Tensor:
  """0, or the status of an empty / whitespace-only / too long text."""
  empty = tf.equal(tf.strings.length(tf.strings.strip(text)), 0)
  long = tf.strings.length(text, unit="UTF8_CHAR") > max_chars
  return tf.where(empty, _STATUS["empty_text"], tf.where(long, _STATUS["long_text"], _OK))


def first_status(*statuses) -> tf.Tensor:
  """The first nonzero status (statuses in SKIP_REASONS priority order)."""
  out = tf.constant(_OK)
  for s in reversed(statuses):
    out = tf.where(tf.not_equal(s, _OK), s, out)
  return out


@dataclasses.dataclass(frozen=True)
class RecordKind:
  """One kind of training record (see the module docstring)."""
  name: str
  table_name: str  # Its table of source constructors by name: sources.<table_name>.
  text_fields: Tuple[str, ...]  # Raw text fields (the vocabulary is learned from them).
  has_image: bool  # The pipeline decodes and crops 'image'.
  reasons: Tuple[str, ...]  # The skip reasons that can occur (reported).
  num_lang_keys: Callable[[int], int]  # L languages -> size of the key space.
  lang_key: Callable[[dict, tf.Tensor], tf.Tensor]  # (raw record, languages) -> int32 key.
  key_of_name: Callable[[str, Sequence[str]], int]  # 'en' / 'en-de' -> key (-1: unknown).
  check: Callable[[dict, tf.Tensor, int], dict]  # (raw, languages, max_chars) -> status, lang_key, payload.
  finish: Callable[[dict, object], dict]  # (batched payload, tokenizer) -> the layout's arrays.
  layout: Callable[[int, object], Dict[str, Tuple[tuple, object]]]  # (batch, config) -> key: (shape, dtype).
  # (text field, its language field) of a raw record: per-language vocabularies learn from these.
  text_langs: Tuple[Tuple[str, str], ...] = ()
  # (decoded uint8 image, stateless seed, config.data) -> {key: float32 [S, S, 3]}: the kind's
  # own training augmentation; None: the pipeline's crop (+ flip) into 'image'.
  train_views: Optional[Callable[[tf.Tensor, tf.Tensor, object], Dict[str, tf.Tensor]]] = None

  @property
  def table(self) -> Mapping[str, Callable]:
    return getattr(sources, self.table_name)

  def shapes(self, batch_size: int, config) -> Dict[str, jax.ShapeDtypeStruct]:
    return {k: jax.ShapeDtypeStruct(s, d) for k, (s, d) in self.layout(batch_size, config).items()}


# ---- Image-text ---------------------------------------------------------------------


def _image_text_check(raw, languages, max_chars):
  lang = lang_index(raw["lang"], languages)
  image = raw["image"]
  if image.dtype == tf.string:
    missing = tf.equal(tf.strings.length(image), 0)
    image_status = tf.where(missing, _STATUS["missing_image"],
                            tf.where(preprocess.is_encoded_image(image), _OK, _STATUS["not_an_image"]))
  else:
    image_status = tf.where(tf.size(image) > 0, _OK, _STATUS["missing_image"])
  status = first_status(tf.where(lang < 0, _STATUS["unknown_language"], _OK),
                        text_status(raw["caption"], max_chars), image_status)
  return dict(image=image, text=raw["caption"], lang=lang, lang_key=lang, status=status)


def _image_text_finish(b, tokenizer):
  ids, mask = tokenizer.tokenize(b["text"])
  return dict(image=b["image"], text_ids=ids, text_mask=mask, lang=b["lang"],
              valid=tf.ones_like(b["lang"], tf.bool))


def _image_text_layout(b, config):
  s, l = config.data.image_size, config.model.text.max_len
  return {"image": ((b, s, s, 3), jnp.float32), "text_ids": ((b, l), jnp.int32),
          "text_mask": ((b, l), jnp.int32), "valid": ((b,), jnp.bool_)}


def _index_of(name, languages):
  return list(languages).index(name) if name in languages else -1


IMAGE_TEXT = RecordKind(
    name="image_text", table_name="IMAGE_TEXT_SOURCES", text_fields=("caption",), has_image=True,
    reasons=records.SKIP_REASONS, num_lang_keys=lambda n: n,
    lang_key=lambda raw, languages: lang_index(raw["lang"], languages), key_of_name=_index_of,
    check=_image_text_check, finish=_image_text_finish, layout=_image_text_layout,
    text_langs=(("caption", "lang"),))


# ---- Text pairs ---------------------------------------------------------------------


def _pair_key(left, right, num):
  return tf.where(tf.logical_or(left < 0, right < 0), -1, left * num + right)


def _text_pair_lang_key(raw, languages):
  num = tf.shape(languages)[0]
  return _pair_key(lang_index(raw["left_lang"], languages), lang_index(raw["right_lang"], languages), num)


def _text_pair_key_of_name(name, languages):
  a, _, b = name.partition("-")
  i, j = _index_of(a, languages), _index_of(b, languages)
  return -1 if i < 0 or j < 0 else i * len(languages) + j


def _text_pair_check(raw, languages, max_chars):
  key = _text_pair_lang_key(raw, languages)
  status = first_status(tf.where(key < 0, _STATUS["unknown_language"], _OK),
                        text_status(raw["left"], max_chars), text_status(raw["right"], max_chars))
  return dict(left=raw["left"], right=raw["right"], lang_key=key, status=status)


def _text_pair_finish(b, tokenizer):
  left_ids, left_mask = tokenizer.tokenize(b["left"])
  right_ids, right_mask = tokenizer.tokenize(b["right"])
  return dict(left_ids=left_ids, left_mask=left_mask, right_ids=right_ids, right_mask=right_mask,
              valid=tf.ones_like(b["_source"], tf.bool))


def _text_pair_layout(b, config):
  l = config.model.text.max_len
  return {"left_ids": ((b, l), jnp.int32), "left_mask": ((b, l), jnp.int32),
          "right_ids": ((b, l), jnp.int32), "right_mask": ((b, l), jnp.int32), "valid": ((b,), jnp.bool_)}


TEXT_PAIR = RecordKind(
    name="text_pair", table_name="TEXT_PAIR_SOURCES", text_fields=("left", "right"), has_image=False,
    reasons=("unknown_language", "empty_text", "long_text"), num_lang_keys=lambda n: n * n,
    lang_key=_text_pair_lang_key, key_of_name=_text_pair_key_of_name,
    check=_text_pair_check, finish=_text_pair_finish, layout=_text_pair_layout,
    text_langs=(("left", "left_lang"), ("right", "right_lang")))


# ---- The same kinds with language ids on the device ----------------------------------
# Language index = position in config.data.languages (int32). The tokenizer gets
# it too: per-language word vocabularies (mural/data/word_vocab.py) need it.


def _image_text_lang_finish(b, tokenizer):
  ids, mask = tokenizer.tokenize(b["text"], b["lang"])
  return dict(image=b["image"], text_ids=ids, text_mask=mask, lang=b["lang"], lang_id=b["lang"],
              valid=tf.ones_like(b["lang"], tf.bool))


def _image_text_lang_layout(b, config):
  return {**_image_text_layout(b, config), "lang_id": ((b,), jnp.int32)}


IMAGE_TEXT_LANG = dataclasses.replace(IMAGE_TEXT, name="image_text_lang", finish=_image_text_lang_finish,
                                      layout=_image_text_lang_layout)


def _text_pair_lang_check(raw, languages, max_chars):
  out = _text_pair_check(raw, languages, max_chars)
  out.update(left_lang=lang_index(raw["left_lang"], languages),
             right_lang=lang_index(raw["right_lang"], languages))
  return out


def _text_pair_lang_finish(b, tokenizer):
  left_ids, left_mask = tokenizer.tokenize(b["left"], b["left_lang"])
  right_ids, right_mask = tokenizer.tokenize(b["right"], b["right_lang"])
  return dict(left_ids=left_ids, left_mask=left_mask, right_ids=right_ids, right_mask=right_mask,
              left_lang_id=b["left_lang"], right_lang_id=b["right_lang"],
              valid=tf.ones_like(b["_source"], tf.bool))


def _text_pair_lang_layout(b, config):
  return {**_text_pair_layout(b, config), "left_lang_id": ((b,), jnp.int32),
          "right_lang_id": ((b,), jnp.int32)}


TEXT_PAIR_LANG = dataclasses.replace(TEXT_PAIR, name="text_pair_lang", check=_text_pair_lang_check,
                                     finish=_text_pair_lang_finish, layout=_text_pair_lang_layout)


# ---- Image-text with two augmented views of each image (SimCLR; Globetrotter) ---------
# config.data.views: colour_strength, colour_prob, grayscale_prob, blur_prob (preprocess.simclr_view);
# the crop ranges and flip are config.data's.


def _two_views(image, seed, data):
  v = data.views
  kw = dict(size=data.image_size, area_range=tuple(data.crop_area_range),
            aspect_range=tuple(data.crop_aspect_range), flip=data.random_flip,
            colour_strength=float(v.colour_strength), colour_prob=float(v.colour_prob),
            grayscale_prob=float(v.grayscale_prob), blur_prob=float(v.blur_prob))
  first, second = tf.unstack(tf.random.experimental.stateless_split(seed, 2))
  return {"image": preprocess.simclr_view(image, first, **kw), "image2": preprocess.simclr_view(image, second, **kw)}


def _image_text_views_finish(b, tokenizer):
  return {**_image_text_finish(b, tokenizer), "image2": b["image2"]}


def _image_text_views_layout(b, config):
  layout = _image_text_layout(b, config)
  return {**layout, "image2": layout["image"]}


IMAGE_TEXT_VIEWS = dataclasses.replace(IMAGE_TEXT, name="image_text_views", finish=_image_text_views_finish,
                                       layout=_image_text_views_layout, train_views=_two_views)
