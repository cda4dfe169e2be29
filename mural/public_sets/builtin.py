"""The built-in data's objects and colours, classified zero-shot in every language its grammars define.

The images are every one-object scene (each shape in each colour and size, mural.data.synthetic_scenes),
rendered afresh from a seed of their own, so no training or held-out image is among them. Split
"shape" classifies the object, "colour" its colour. A class's prompts are the grammar's own
captions of every one-object scene of that class, its other attributes varied ("a small red circle",
"Il y a un grand cercle bleu.", ...): CLIP's prompt ensemble, natural in each language, in the words
the grammar trains with. The folder names the languages: '' is every one, else a comma-separated list.
"""

import io
from typing import Optional

import numpy as np
from PIL import Image

from mural import config_lib
from mural.data import synthetic_grammars
from mural.data import synthetic_render
from mural.data import synthetic_scenes
from mural.public_sets.parts import PublicSet
from mural.public_sets.zero_shot import Classification

RENDERS = 2  # Images of each one-object scene (nuisance drawn afresh each time).
_SEED = 20231  # The renders' own: training and held-out renders are seeded [seed, split, ...].


def languages(folder: str) -> list:
  """The languages `folder` names: '' is every language the grammars define."""
  if not folder.strip():
    return list(synthetic_grammars.LANGUAGES)
  out = [l.strip() for l in folder.split(",") if l.strip()]
  unknown = [l for l in out if l not in synthetic_grammars.LANGUAGES]
  if unknown:
    raise ValueError(f"builtin: {unknown[0]!r} is not a language of the built-in grammars: expected '' (all) or "
                     f"a comma-separated list of {', '.join(synthetic_grammars.LANGUAGES)}")
  return list(dict.fromkeys(out))


def scenes() -> list:
  """Every one-object Description, in shape, colour, size order."""
  return [synthetic_scenes.Description((synthetic_scenes.Obj(s, c, z),), ())
          for s in synthetic_scenes.SHAPES for c in synthetic_scenes.COLOURS for z in synthetic_scenes.SIZES]


def _png(image: np.ndarray) -> bytes:
  out = io.BytesIO()
  Image.fromarray(image).save(out, format="PNG")
  return out.getvalue()


def images(size: int) -> list:
  """PNG bytes of RENDERS renders of each of scenes(), in that order (what a model reads from a file)."""
  return [_png(synthetic_render.render(d, size, np.random.default_rng([_SEED, k, r])))
          for k, d in enumerate(scenes()) for r in range(RENDERS)]


def prompts(attribute: str, classes: tuple, lang: str) -> list:
  """Per class, the grammar's captions of every one-object scene whose `attribute` is that class."""
  return [[text for d in scenes() if getattr(d.objects[0], attribute) == c
           for text in synthetic_grammars.all_captions(d, lang)] for c in classes]


def read(folder: str, images_dir: Optional[str], log) -> list:
  """A "shape" and a "colour" Classification per language the folder names."""
  if images_dir:
    raise ValueError("builtin: renders its own images (--images is not used)")
  langs = languages(folder)
  size = config_lib.base_config().data.synthetic.render_size
  files = images(size)
  objects = [d.objects[0] for d in scenes() for _ in range(RENDERS)]
  parts = []
  for attribute, classes in (("shape", synthetic_scenes.SHAPES), ("colour", synthetic_scenes.COLOURS)):
    labels = np.array([classes.index(getattr(o, attribute)) for o in objects], np.int64)
    parts += [Classification(attribute, lang, files, labels, list(classes), prompts(attribute, classes, lang))
              for lang in langs]
  log(f"builtin: {len(files)} rendered one-object scenes ({size} px); languages {langs}")
  return parts


SET = PublicSet(read, "acc1", {})  # The built-in data has no published figures.
