"""Built-in multilingual image-text data: rendered shape scenes, grammar captions.

Why it exists: mural must train and be tested on one machine with no download,
and the data must be able to show MURAL's claim (translation pairs lift
image-text retrieval for a language with few image-caption pairs).

A *scene* is one to three objects, each a (shape, colour, size), with a spatial
relation between them. Its canonical `Description` (the objects and relations,
normalised so one scene has exactly one description) is what the captions say,
in every language, so captions of the same scene in two languages are
translations of each other and a caption identifies its scene. Position, exact
size, colour shade and background (solid, gradient, noise, stripes) are
nuisance and never described.

Captions come from a small hand-written grammar per language, each in its own
word order, with gender/case/noun-class agreement (see synthetic_grammars.py), and a few paraphrase templates; a two-object scene may be described
from either object ("A left of B" / "B right of A").

Splits. `is_heldout(description)` hashes the canonical key (seed independent):
held-out descriptions never appear in 'train' (neither in image-caption pairs
nor in translation pairs). 'eval' holds `eval_scenes` distinct held-out
descriptions, one image each, so retrieval ground truth is exact.

Determinism. Example i of a split is a pure function of (dataset config, split,
i): a NumPy generator seeded with [seed, split, stream, language, j]. The
sources map a global index to (language, j) through a fixed per-epoch affine
permutation (languages come mixed), shard by index (host p of P reads
p, p+P, ...) and resume at any index.

Parallel text. Each training image-caption example draws its scene, its render and its caption
from its own generator (language, index): one image never carries captions in two languages, so
captions of one scene in two languages always come from different images. The translation pairs
are the only parallel text; `withhold_parallel_text = True` (Globetrotter) makes reading them for
training an error. The eval set keeps aligned captions (one image, every language).
`caption_pairs = "comparable"` makes the training pairs comparable rather than translations:
each side describes the scene or a part of it around its anchor (`views`), drawn independently.

Amounts. `pairs_per_language` (else `default_pairs`) image-caption pairs per
language; `translation_pairs` per language pair (override per pair with
`translation_pairs_per_pair`), pairs = (`translation_pivot`, x) for every other
language, or the explicit `translation_pair_list`. The two are independent.

MURAL's claim on one machine. Make Swahili scarce in image-caption pairs and
compare the two losses on its held-out retrieval:
  config.data.synthetic.pairs_per_language = {'sw': 20}    # others: 20k each
  config.data.synthetic.translation_pairs = 20_000          # en-x for every x
  ALIGN: config.tasks.t2t.weight = 0.0   MURAL: config.tasks.t2t.weight = 0.1
and read the 'sw' image<->text recall of both runs; a control run with
`translation_pairs_per_pair = {'en-sw': 0}` removes only the Swahili bitext.
benchmarks/mural_claim.py runs the three and prints the table.
Swahili shares no content word with English, so what sw learns beyond its 20
captions comes through the en-sw translation pairs. Those 20 do use every word
of its held-out captions, so a long run without the en-sw pairs can learn much
of Swahili from them once the other tasks have trained the shared towers; at 5,
147 of the 200 held-out scenes have a word only the bitext teaches (the script
prints this count).

Modules. Scenes and the held-out split: synthetic_scenes.py; images: synthetic_render.py;
captions: synthetic_grammars.py; the config section's checks and `Settings`:
synthetic_settings.py (no TensorFlow or JAX). This module is the dataset: the examples of each
split, the tf.data sources and the held-out retrieval data.

Public API: `__all__` below. `Settings`, `LANGUAGES`, `SCRIPTS` and `caption` live in the
modules above and are re-exported here, since the sources, the systems' checks, tests and
benchmarks read them beside the dataset functions.
"""

import dataclasses
import functools
import hashlib
import math
from typing import Optional, Sequence

import numpy as np

from mural import config_lib
from mural import lazy_import
from mural.data.synthetic_grammars import caption
from mural.data.synthetic_grammars import LANGUAGES
from mural.data.synthetic_grammars import SCRIPTS
from mural.data.synthetic_render import draw
from mural.data.synthetic_render import render
from mural.data.synthetic_scenes import sample_description
from mural.data.synthetic_scenes import views
from mural.data.synthetic_settings import Settings

tf = lazy_import.module("tensorflow")  # For the tf.data sources only: the generator is NumPy.

__all__ = [
    # Re-exported from synthetic_settings.py and synthetic_grammars.py.
    "Settings", "LANGUAGES", "SCRIPTS", "caption",
    # The dataset.
    "SPLITS", "eval_descriptions", "num_image_text", "num_text_pairs", "image_text_example",
    "training_example", "text_pair_example", "image_text_batch", "text_pair_batch",
    "image_text_source", "text_pair_source", "EvalLanguage", "EvalPairs", "EvalData",
    "build_eval_data",
]

SPLITS = ("train", "eval")
_SPLIT_ID = {"train": 0, "eval": 1}
# Independent random streams inside a split.
_I2T, _T2T, _EVAL_SCENE, _EVAL_RENDER, _EVAL_CAPTION = range(5)


def _rng(settings: Settings, split: str, *key: int) -> np.random.Generator:
  return np.random.default_rng([settings.seed, _SPLIT_ID[split], *key])


def _check_split(split: str):
  if split not in _SPLIT_ID:
    raise ValueError(f"synthetic split {split!r} not in {SPLITS}")


@functools.lru_cache(maxsize=8)
def eval_descriptions(settings: Settings) -> tuple:
  """`eval_scenes` distinct held-out descriptions, in a fixed order."""
  found, seen = [], set()
  for c in range(100 * settings.eval_scenes + 1000):
    d = sample_description(_rng(settings, "eval", _EVAL_SCENE, c), True, settings.heldout_fraction)
    if d not in seen:
      seen.add(d)
      found.append(d)
      if len(found) == settings.eval_scenes:
        return tuple(found)
  raise config_lib.ConfigError(
      f"config.data.synthetic.eval_scenes: only {len(found)} distinct held-out descriptions found for "
      f"{settings.eval_scenes}; raise heldout_fraction or lower eval_scenes")


@functools.lru_cache(maxsize=16)  # Eval sources read each scene's languages in a row.
def _eval_image(settings: Settings, k: int) -> np.ndarray:
  image = render(eval_descriptions(settings)[k], settings.render_size, _rng(settings, "eval", _EVAL_RENDER, k))
  image.setflags(write=False)  # Cached and shared.
  return image


def _eval_caption(settings: Settings, k: int, lang: str, m: int) -> str:
  rng = _rng(settings, "eval", _EVAL_CAPTION, k, LANGUAGES.index(lang), m)
  return caption(eval_descriptions(settings)[k], lang, rng)


def _permute(n: int, i: int, salt: str) -> int:
  """Position of global index i in a fixed per-epoch affine permutation of range(n)."""
  epoch, r = divmod(i, n)
  a = _multiplier(n)
  b = int(hashlib.blake2b(f"{salt}:{epoch}".encode(), digest_size=8).hexdigest(), 16) % n
  return (a * r + b) % n


@functools.lru_cache(maxsize=64)
def _multiplier(n: int) -> int:
  a = max(1, round(n * 0.6180339887)) | 1  # Golden-ratio stride mixes the blocks evenly.
  while math.gcd(a, n) != 1:
    a += 1
  return a % n if n > 1 else 0


def num_image_text(settings: Settings, split: str) -> int:
  """Examples in one epoch of the image-text source."""
  _check_split(split)
  if split == "eval":
    return settings.eval_scenes * len(settings.languages) * settings.eval_captions_per_scene
  return sum(settings.image_caption_counts)


def num_text_pairs(settings: Settings, split: str) -> int:
  _check_split(split)
  if split == "eval":
    return settings.eval_scenes * len(settings.translation_pairs)
  return sum(settings.translation_counts)


def _block(counts: Sequence[int], p: int):
  """(block, offset inside it) of position p in consecutive blocks of `counts`."""
  for b, c in enumerate(counts):
    if p < c:
      return b, p
    p -= c
  raise IndexError(p)


def image_text_example(settings: Settings, split: str, i: int, with_image: bool = True):
  """(description, image uint8 [S,S,3], caption, lang) of global index i; with_image=False: a
  training record comes with None for its image (its draws are made, not painted: the
  caption's draws follow them)."""
  n = num_image_text(settings, split)
  if split == "eval":
    k, rest = divmod(i % n, len(settings.languages) * settings.eval_captions_per_scene)
    lang = settings.languages[rest // settings.eval_captions_per_scene]
    return (eval_descriptions(settings)[k], _eval_image(settings, k),
            _eval_caption(settings, k, lang, rest % settings.eval_captions_per_scene), lang)
  b, j = _block(settings.image_caption_counts, _permute(n, i, f"{settings.seed}:i2t:{split}"))
  return training_example(settings, settings.languages[b], j, with_image)


def training_example(settings: Settings, lang: str, j: int, with_image: bool = True):
  """(description, image, caption, lang) of `lang`'s j-th training image-caption pair (0 <= j <
  its count): the record image_text_example gives at the global index that maps to (lang, j)."""
  rng = _rng(settings, "train", _I2T, LANGUAGES.index(lang), j)
  d = sample_description(rng, False, settings.heldout_fraction)
  image = None
  if with_image:
    image = render(d, settings.render_size, rng)
  else:
    draw(d, settings.render_size, rng)  # The caption's draws come after the image's.
  return d, image, caption(d, lang, rng), lang


def text_pair_example(settings: Settings, split: str, i: int):
  """(description, left, right, left_lang, right_lang) of global index i."""
  n = num_text_pairs(settings, split)
  if split == "eval":
    q, k = divmod(i % n, settings.eval_scenes)
    a, b = settings.translation_pairs[q]
    return (eval_descriptions(settings)[k], _eval_caption(settings, k, a, 0),
            _eval_caption(settings, k, b, 0), a, b)
  q, j = _block(settings.translation_counts, _permute(n, i, f"{settings.seed}:t2t:{split}"))
  a, b = settings.translation_pairs[q]
  rng = _rng(settings, split, _T2T, LANGUAGES.index(a), LANGUAGES.index(b), j)
  d = sample_description(rng, False, settings.heldout_fraction)
  if settings.comparable_pairs:
    options = views(d, settings.heldout_fraction)  # Each side draws one, independently.
    left, right = (options[int(rng.integers(len(options)))] for _ in range(2))
    return d, caption(left, a, rng), caption(right, b, rng), a, b
  return d, caption(d, a, rng), caption(d, b, rng), a, b


def image_text_batch(settings: Settings, split: str, indices: Sequence[int], with_images: bool = True):
  """Arrays for a chunk of indices: images [n,S,S,3] uint8, captions, langs (bytes); without
  images: captions, langs."""
  s = settings.render_size
  images = np.empty((len(indices), s, s, 3) if with_images else 0, np.uint8)
  captions, langs = np.empty(len(indices), object), np.empty(len(indices), object)
  for t, i in enumerate(indices):
    _, image, cap, lang = image_text_example(settings, split, int(i), with_images)
    if with_images:
      images[t] = image
    captions[t], langs[t] = cap.encode(), lang.encode()
  return (images, captions, langs) if with_images else (captions, langs)


def text_pair_batch(settings: Settings, split: str, indices: Sequence[int]):
  out = [np.empty(len(indices), object) for _ in range(4)]
  for t, i in enumerate(indices):
    _, *texts = text_pair_example(settings, split, int(i))
    for column, text in zip(out, texts):
      column[t] = text.encode()
  return tuple(out)


# ---- tf.data sources -------------------------------------------------------

_CHUNK = 32  # Indices generated per py call (amortises the tf<->python hop).
# Py calls at a time: they run Python under the GIL, so a second one in parallel only adds
# GIL hand-offs (demo's batch of 64 on 2 cores: 100-105 CPU-ms with one, 115-131 with two).
# One call still runs in tf.data's own thread, ahead of the consumer.
_PY_CALLS = 1


def _index_dataset(n: int, process_index: int, process_count: int, start_index: int,
                   num_epochs: Optional[int]):
  if not 0 <= process_index < process_count:
    raise ValueError(f"process_index {process_index} not in [0, {process_count})")
  if start_index < 0:
    raise ValueError(f"start_index must be >= 0, got {start_index}")
  if n == 0:
    raise config_lib.ConfigError("config.data.synthetic: the source has no examples (all counts are 0)")
  first = start_index + (process_index - start_index) % process_count
  stop = n * num_epochs if num_epochs is not None else np.iinfo(np.int64).max
  return tf.data.Dataset.range(first, max(first, stop), process_count)


def image_text_source(config, split: str, process_index: int, process_count: int, start_index: int = 0,
                      *, num_epochs: Optional[int] = 1, languages: Sequence[str] = (),
                      with_images: bool = True):
  """tf.data of {'image': uint8 [S,S,3], 'caption': string, 'lang': string}; with_images=False:
  the same records' 'caption' and 'lang' only, their images drawn but not painted (for a vocab).

  config: the full config (reads config.data.synthetic and nothing else).
  Reads global indices i >= start_index with i % process_count ==
  process_index, so a host that has consumed k elements resumes with
  start_index = k * process_count. Index i >= epoch size continues in epoch
  i // size (a fresh order); num_epochs=None makes it endless. languages: only these
  (Settings.restricted)."""
  settings = Settings.from_config(config).restricted(languages)
  _check_split(split)
  s = settings.render_size
  ds = _index_dataset(num_image_text(settings, split), process_index, process_count, start_index, num_epochs)

  @tf.autograph.experimental.do_not_convert  # Plain graph code; AutoGraph only warns about it.
  def make(indices):
    out = tf.numpy_function(lambda idx: image_text_batch(settings, split, idx, with_images), [indices],
                            [tf.uint8, tf.string, tf.string][not with_images:], stateful=False)
    *images, captions, langs = out
    captions.set_shape([None])
    langs.set_shape([None])
    record = {"caption": captions, "lang": langs}
    if with_images:
      images[0].set_shape([None, s, s, 3])
      record["image"] = images[0]
    return record

  return ds.batch(_CHUNK).map(make, num_parallel_calls=_PY_CALLS, deterministic=True).unbatch()


def text_pair_source(config, split: str, process_index: int, process_count: int, start_index: int = 0,
                     *, num_epochs: Optional[int] = 1, languages: Sequence[str] = ()):
  """tf.data of {'left','right','left_lang','right_lang'} strings (config and
  indexing as image_text_source)."""
  settings = Settings.from_config(config).restricted(languages)
  _check_split(split)
  if split == "train" and settings.withhold_parallel_text:
    raise config_lib.ConfigError(
        "config.data.synthetic.withhold_parallel_text: True, yet a task reads the built-in translation "
        "pairs for training; turn that task off or set the option to False")
  ds = _index_dataset(num_text_pairs(settings, split), process_index, process_count, start_index, num_epochs)
  keys = ("left", "right", "left_lang", "right_lang")

  @tf.autograph.experimental.do_not_convert  # Plain graph code; AutoGraph only warns about it.
  def make(indices):
    columns = tf.numpy_function(lambda idx: text_pair_batch(settings, split, idx), [indices],
                                [tf.string] * 4, stateful=False)
    for c in columns:
      c.set_shape([None])
    return dict(zip(keys, columns))

  return ds.batch(_CHUNK).map(make, num_parallel_calls=_PY_CALLS, deterministic=True).unbatch()


# ---- Held-out retrieval data -----------------------------------------------

@dataclasses.dataclass(frozen=True)
class EvalLanguage:
  name: str  # Language code.
  images: np.ndarray  # uint8 [N,S,S,3], shared by every language.
  captions: list  # M = N * eval_captions_per_scene strings.
  text_to_image: np.ndarray  # int32 [M]: the image each caption describes.


@dataclasses.dataclass(frozen=True)
class EvalPairs:
  name: str  # 'en-de'.
  left_lang: str
  right_lang: str
  left: list  # Row k of left and right describe held-out scene k.
  right: list


@dataclasses.dataclass(frozen=True)
class EvalData:
  images: np.ndarray  # uint8 [N,S,S,3]
  descriptions: tuple  # N distinct held-out Descriptions.
  languages: dict  # lang -> EvalLanguage
  translations: dict  # 'en-de' -> EvalPairs


def build_eval_data(config) -> EvalData:
  """Held-out retrieval sets: every configured language, every translation pair."""
  settings = Settings.from_config(config)
  descriptions = eval_descriptions(settings)
  n, m = len(descriptions), settings.eval_captions_per_scene
  images = np.stack([_eval_image(settings, k) for k in range(n)])
  images.setflags(write=False)
  text_to_image = np.repeat(np.arange(n, dtype=np.int32), m)
  languages = {
      lang: EvalLanguage(lang, images, [_eval_caption(settings, k, lang, j) for k in range(n) for j in range(m)],
                         text_to_image)
      for lang in settings.languages}
  translations = {}
  for a, b in settings.translation_pairs:
    name = f"{a}-{b}"
    translations[name] = EvalPairs(name, a, b, [_eval_caption(settings, k, a, 0) for k in range(n)],
                                   [_eval_caption(settings, k, b, 0) for k in range(n)])
  return EvalData(images, descriptions, languages, translations)
