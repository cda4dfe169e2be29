"""Scenes of the built-in data: objects (shape, colour, size), their relations, and the one
canonical `Description` of each scene.

A scene's description is what its image shows and what every caption of it says, so the
renderer (synthetic_render.py), the grammars (synthetic_grammars.py) and the dataset
(synthetic.py) all build on it. It also holds what depends on descriptions alone: the held-out
split (a hash of the canonical key, `is_heldout`), sampling a description on either side of it,
and the parts of a scene a comparable caption may describe (`views`).
"""

import hashlib
from typing import NamedTuple, Sequence

import numpy as np

SHAPES = ("circle", "square", "triangle", "star", "heart", "cross")
COLOURS = ("red", "green", "blue", "yellow", "white", "black", "purple", "orange")
SIZES = ("small", "large")
RELATIONS = ("left", "right", "above", "below")  # Figure object relative to the anchor.
INVERSE = {"left": "right", "right": "left", "above": "below", "below": "above"}
_NUM_OBJECTS_CDF = np.cumsum([0.2, 0.4, 0.4])  # Scenes with 1, 2, 3 objects.


class Obj(NamedTuple):
  shape: str
  colour: str
  size: str


class Description(NamedTuple):
  """Canonical scene: objects[0] is the anchor; objects[k] (k >= 1) lies at
  relations[k - 1] of the anchor. Two objects: relation in {left, above}.
  Three: the two relations differ and are in RELATIONS order."""
  objects: tuple
  relations: tuple

  @property
  def key(self) -> str:
    parts = ["/".join(self.objects[0])]
    parts += [f"{r}:{'/'.join(o)}" for o, r in zip(self.objects[1:], self.relations)]
    return "|".join(parts)


def canonical(anchor: Obj, figures: Sequence[tuple]) -> Description:
  """The one Description of a scene given as anchor + [(figure, relation)]."""
  if len(figures) == 1:
    (fig, rel), = figures
    if rel in ("right", "below"):  # "B right of A" is the scene "A left of B".
      anchor, fig, rel = fig, anchor, INVERSE[rel]
    return Description((anchor, fig), (rel,))
  figures = sorted(figures, key=lambda fr: RELATIONS.index(fr[1]))
  if len({r for _, r in figures}) != len(figures):
    raise ValueError(f"two figures share a relation: {figures}")
  return Description((anchor,) + tuple(f for f, _ in figures), tuple(r for _, r in figures))


def heldout_score(description: Description) -> float:
  """Uniform in [0, 1), a hash of the canonical key only (no seed)."""
  digest = hashlib.blake2b(description.key.encode(), digest_size=8).digest()
  return int.from_bytes(digest, "little") / 2.0**64


def is_heldout(description: Description, heldout_fraction: float) -> bool:
  return heldout_score(description) < heldout_fraction


def _random_obj(u: np.ndarray) -> Obj:
  return Obj(SHAPES[int(u[0] * len(SHAPES))], COLOURS[int(u[1] * len(COLOURS))],
             SIZES[int(u[2] * len(SIZES))])


def sample_description(rng: np.random.Generator, heldout: bool, heldout_fraction: float) -> Description:
  """A random description on the requested side of the split (rejection)."""
  while True:
    u = rng.random(14)
    n = 1 + int(np.searchsorted(_NUM_OBJECTS_CDF, u[0], side="right"))
    anchor = _random_obj(u[1:4])
    if n == 1:
      d = Description((anchor,), ())
    elif n == 2:
      d = canonical(anchor, [(_random_obj(u[4:7]), RELATIONS[int(u[10] * 4)])])
    else:
      r1 = int(u[10] * 4)
      r2 = (r1 + 1 + int(u[11] * 3)) % 4  # Any relation but r1.
      d = canonical(anchor, [(_random_obj(u[4:7]), RELATIONS[r1]), (_random_obj(u[7:10]), RELATIONS[r2])])
    if is_heldout(d, heldout_fraction) == heldout:
      return d


def views(description: Description, heldout_fraction: float) -> list:
  """What an independent caption of the scene may describe: the whole scene, or its anchor
  (the object the others are placed by) alone (two objects) or with one of its figures (three).
  Two such captions always share the anchor, as independent captions of one image share its
  main subject (captions with nothing in common would be noise to a ranking loss). A part
  that is a held-out description is left out, so training text never names a held-out scene."""
  objs, rels = description.objects, description.relations
  if len(objs) == 2:
    parts = [Description(objs[:1], ())]
  elif len(objs) == 3:
    parts = [canonical(objs[0], [(objs[k], rels[k - 1])]) for k in (1, 2)]
  else:
    parts = []
  return list(dict.fromkeys([description] + [p for p in parts if not is_heldout(p, heldout_fraction)]))
