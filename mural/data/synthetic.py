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
word order, with gender/case/noun-class agreement (see the `_Language`
classes), and a few paraphrase templates; a two-object scene may be described
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

Public API: `LANGUAGES`, `SCRIPTS`, `image_text_source`, `text_pair_source`,
`build_eval_data`, and the pure functions they use (`sample_description`,
`render`, `caption`, `all_captions`, `image_text_example`, `training_example`,
`text_pair_example`).
"""

import dataclasses
import functools
import hashlib
import math
from typing import NamedTuple, Optional, Sequence

import numpy as np

from mural import config_lib

SHAPES = ("circle", "square", "triangle", "star", "heart", "cross")
COLOURS = ("red", "green", "blue", "yellow", "white", "black", "purple", "orange")
SIZES = ("small", "large")
RELATIONS = ("left", "right", "above", "below")  # Figure object relative to the anchor.
_INVERSE = {"left": "right", "right": "left", "above": "below", "below": "above"}
SPLITS = ("train", "eval")
_SPLIT_ID = {"train": 0, "eval": 1}
# Independent random streams inside a split.
_I2T, _T2T, _EVAL_SCENE, _EVAL_RENDER, _EVAL_CAPTION = range(5)
CAPTION_PAIRS = ("translations", "comparable")  # config.data.synthetic.caption_pairs.
_NUM_OBJECTS_CDF = np.cumsum([0.2, 0.4, 0.4])  # Scenes with 1, 2, 3 objects.


# ---- Scene descriptions ----------------------------------------------------

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
      anchor, fig, rel = fig, anchor, _INVERSE[rel]
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


# ---- Rendering -----------------------------------------------------------

COLOUR_RGB = {
    "red": (220, 35, 35), "green": (35, 165, 55), "blue": (40, 80, 225),
    "yellow": (245, 215, 35), "white": (248, 248, 248), "black": (18, 18, 18),
    "purple": (145, 50, 190), "orange": (250, 135, 25),
}
_RADIUS = {"small": 0.09, "large": 0.15}  # Fraction of the image side.
_EXTENT = 1.15  # Shapes reach at most this many radii from their centre.
_COLOUR_JITTER = 12


def _sdf(shape: str, u: np.ndarray, v: np.ndarray) -> np.ndarray:
  """Signed distance-like field in radius units, > 0 inside; v points up."""
  if shape == "circle":
    return 1.0 - np.sqrt(u * u + v * v)
  if shape == "square":
    return 0.82 - np.maximum(np.abs(u), np.abs(v))
  if shape == "triangle":  # Equilateral, apex up, circumradius 1.15, box-centred.
    v = v + 0.29
    d = 0.575
    s3 = math.sqrt(3) / 2
    return np.minimum(np.minimum(d + v, d - (s3 * u + 0.5 * v)), d - (-s3 * u + 0.5 * v))
  if shape == "star":  # Five points, one up; fold into one tip's half-sector.
    outer, inner = 1.15, 0.48
    sector = 2 * math.pi / 5
    theta = np.mod(np.arctan2(u, v) + sector / 2, sector) - sector / 2
    rho = np.sqrt(u * u + v * v)
    px, py = rho * np.cos(theta), rho * np.abs(np.sin(theta))
    ix, iy = inner * math.cos(sector / 2), inner * math.sin(sector / 2)
    ex, ey = ix - outer, iy
    norm = math.hypot(ex, ey)
    nx, ny = -ey / norm, ex / norm  # Points to the origin's side of the tip edge.
    return nx * (px - outer) + ny * py
  if shape == "heart":  # (x^2 + y^2 - 1)^3 - x^2 y^3 <= 0, distance by f / |grad f|.
    scale = 1.15
    x, y = u * scale, v * scale + 0.12
    q = x * x + y * y - 1.0
    f = q**3 - x * x * y**3
    gx = 6 * x * q * q - 2 * x * y**3
    gy = 6 * y * q * q - 3 * x * x * y * y
    return -f / (np.sqrt(gx * gx + gy * gy) + 1e-6) / scale
  if shape == "cross":
    au, av = np.abs(u), np.abs(v)
    arm = 0.34
    return np.maximum(np.minimum(1.0 - au, arm - av), np.minimum(arm - au, 1.0 - av))
  raise ValueError(f"unknown shape {shape!r}")


def _layout(description: Description, rng: np.random.Generator):
  """Centres and radii (image-side units) that realise the relations."""
  radii = np.array([_RADIUS[o.size] for o in description.objects]) * rng.uniform(0.93, 1.07, len(description.objects))
  centres = np.zeros((len(radii), 2))  # (x, y), y down; anchor at the origin.
  step = {"left": (-1, 0), "right": (1, 0), "above": (0, -1), "below": (0, 1)}
  for k, rel in enumerate(description.relations, start=1):
    direction = np.array(step[rel], float)
    dist = _EXTENT * (radii[0] + radii[k]) + rng.uniform(0.03, 0.09)
    perp = np.array([direction[1], direction[0]]) * rng.uniform(-0.15, 0.15) * dist
    centres[k] = direction * dist + perp
  ext = _EXTENT * radii[:, None]
  lo, hi = (centres - ext).min(0), (centres + ext).max(0)
  room = 0.98
  scale = min(1.0, room / (hi - lo).max())  # Three in a row may need a slight shrink.
  centres, radii, lo, hi = centres * scale, radii * scale, lo * scale, hi * scale
  margin = (1.0 - (hi - lo)) / 2
  shift = 0.5 - (lo + hi) / 2 + rng.uniform(-1, 1, 2) * np.maximum(margin - 0.01, 0)
  return centres + shift, radii


def _muted_colour(rng: np.random.Generator) -> np.ndarray:
  """Low-saturation mid-value colour, far from every object colour."""
  h, s, v = rng.uniform(0, 1), rng.uniform(0.05, 0.3), rng.uniform(0.38, 0.72)
  k = (np.array([5.0, 3.0, 1.0]) + h * 6) % 6
  return 255 * v * (1 - s * np.clip(np.minimum(k, 4 - k), 0, 1))


@functools.lru_cache(maxsize=16)
def _upsample_matrix(size: int, grid: int) -> np.ndarray:
  """[size, grid] bilinear interpolation weights (align corners)."""
  pos = np.linspace(0, grid - 1, size)
  lo = np.minimum(np.floor(pos).astype(int), grid - 2)
  w = np.zeros((size, grid), np.float32)
  w[np.arange(size), lo] = 1 - (pos - lo)
  w[np.arange(size), lo + 1] = pos - lo
  return w


class _Nuisance(NamedTuple):
  """Everything a scene's image draws from the rng, in draw order (painting draws nothing)."""
  background: dict  # kind, c0, c1 and the kind's own parameters.
  centres: np.ndarray  # [objects, (x, y)], image-side units.
  radii: np.ndarray
  colours: list  # Per object, jittered RGB.


def _draw_background(size: int, rng: np.random.Generator) -> dict:
  kind = int(rng.integers(4))
  b = dict(kind=kind, c0=_muted_colour(rng).astype(np.float32), c1=_muted_colour(rng).astype(np.float32))
  if kind == 0:  # Solid.
    return b
  b["angle"] = rng.uniform(0, 2 * math.pi)
  if kind == 2:  # Smooth colour noise plus grain.
    grid = int(rng.integers(3, 7))
    b["cells"] = b["c0"] + rng.uniform(-25, 25, (grid, grid, 3)).astype(np.float32)
    b["grain"] = rng.normal(0, 5, (size, size, 1)).astype(np.float32)
  elif kind == 3:  # Stripes with soft edges.
    b["period"] = rng.uniform(0.12, 0.3)
    b["phase"] = rng.uniform(0, 2 * math.pi)
  return b


def _paint_background(b: dict, size: int) -> np.ndarray:
  c0, c1 = b["c0"], b["c1"]
  if b["kind"] == 0:
    return np.broadcast_to(c0, (size, size, 3)).copy()
  coords = (np.arange(size, dtype=np.float32) + 0.5) / size
  t = coords[None, :] * math.cos(b["angle"]) + coords[:, None] * math.sin(b["angle"])  # [y, x]
  if b["kind"] == 1:  # Linear gradient.
    t = (t - t.min()) / max(float(t.max() - t.min()), 1e-6)
    return c0 + t[..., None] * (c1 - c0)
  if b["kind"] == 2:
    cells = b["cells"]
    grid = cells.shape[0]
    w = _upsample_matrix(size, grid)
    rows = (w @ cells.reshape(grid, grid * 3)).reshape(size, grid, 3)  # [y, j, c]
    img = np.matmul(w[None], rows)  # [y, x, c]: separable bilinear upsampling.
    return img + b["grain"]
  period = b["period"]
  wave = np.clip(np.sin(2 * math.pi * t / period + b["phase"]) * size * period / 4, -0.5, 0.5) + 0.5
  return c0 + wave[..., None] * (c1 - c0)


def _draw(description: Description, size: int, rng: np.random.Generator) -> _Nuisance:
  background = _draw_background(size, rng)
  centres, radii = _layout(description, rng)
  colours = [np.array(COLOUR_RGB[o.colour], np.float32) + rng.integers(-_COLOUR_JITTER, _COLOUR_JITTER + 1, 3)
             for o in description.objects]
  return _Nuisance(background, centres, radii, colours)


def render(description: Description, size: int, rng: np.random.Generator, with_layout: bool = False):
  """uint8 [size, size, 3] image of the scene (nuisance drawn from rng).

  with_layout: also return object centres (x, y) and radii in pixels."""
  nuisance = _draw(description, size, rng)
  img = _paint_background(nuisance.background, size)
  for obj, (cx, cy), r, colour in zip(description.objects, nuisance.centres * size, nuisance.radii * size,
                                      nuisance.colours):
    reach = _EXTENT * r + 1
    x0, x1 = max(int(cx - reach), 0), min(int(math.ceil(cx + reach)), size)
    y0, y1 = max(int(cy - reach), 0), min(int(math.ceil(cy + reach)), size)
    u = ((np.arange(x0, x1, dtype=np.float32) + 0.5 - cx) / r)[None, :]
    v = ((cy - np.arange(y0, y1, dtype=np.float32) - 0.5) / r)[:, None]
    cover = np.clip(_sdf(obj.shape, u, v) * r + 0.5, 0.0, 1.0)[..., None]  # Antialiased edge.
    patch = img[y0:y1, x0:x1]
    img[y0:y1, x0:x1] = patch + cover * (colour - patch)
  image = np.clip(img + 0.5, 0, 255).astype(np.uint8)
  return (image, nuisance.centres * size, nuisance.radii * size) if with_layout else image


# ---- Captions --------------------------------------------------------------
# Each language renders every paraphrase of a scene: one(a), two(fig, rel,
# anchor) and three(anchor, (f1, r1), (f2, r2)) return lists of strings.

def _cap(s: str) -> str:
  return s[:1].upper() + s[1:]


class _English:
  code, script = "en", "Latin"
  rel = {"left": "to the left of", "right": "to the right of", "above": "above", "below": "below"}

  def phrase(self, o, art="a"):
    return f"{art} {o.size} {o.colour} {o.shape}"

  def one(self, a):
    return [self.phrase(a), f"There is {self.phrase(a)}."]

  def two(self, f, r, g):
    fig, rp = self.phrase(f), f"{self.rel[r]} {self.phrase(g)}"
    return [f"{fig} {rp}", f"There is {fig} {rp}.", f"{_cap(fig)} is {rp}."]

  def three(self, g, c1, c2):
    (f1, r1), (f2, r2) = c1, c2
    p1 = f"{self.phrase(f1)} {self.rel[r1]} {self.phrase(g)}"
    p2 = f"{self.phrase(f2)} {self.rel[r2]} {self.phrase(g, 'the')}"
    return [f"{p1}, and {p2}", f"There is {p1}, and {p2}."]


class _German:
  """Mixed declension after ein (nominative), -en after einem/einer/dem."""
  code, script = "de", "Latin"
  noun = {"circle": ("Kreis", "m", "Kreis"), "square": ("Quadrat", "n", "Quadrat"),
          "triangle": ("Dreieck", "n", "Dreieck"), "star": ("Stern", "m", "Stern"),
          "heart": ("Herz", "n", "Herzen"), "cross": ("Kreuz", "n", "Kreuz")}  # (nom, gender, dat)
  adj = {"small": "klein", "large": "groß", "red": "rot", "green": "grün", "blue": "blau",
         "yellow": "gelb", "white": "weiß", "black": "schwarz", "purple": "violett",
         "orange": "orangefarben"}
  rel = {"left": "links von", "right": "rechts von", "above": "über", "below": "unter"}

  def nom(self, o):
    n, gender, _ = self.noun[o.shape]
    art, end = {"m": ("ein", "er"), "n": ("ein", "es"), "f": ("eine", "e")}[gender]
    return f"{art} {self.adj[o.size]}{end} {self.adj[o.colour]}{end} {n}"

  def relp(self, r, o, definite=False):
    _, gender, dat = self.noun[o.shape]
    art = ({"m": "dem", "n": "dem", "f": "der"} if definite else
           {"m": "einem", "n": "einem", "f": "einer"})[gender]
    prep = self.rel[r]
    if prep.endswith(" von") and art == "dem":
      prep, art = prep[:-4], "vom"  # von dem -> vom
    return f"{prep} {art} {self.adj[o.size]}en {self.adj[o.colour]}en {dat}"

  def one(self, a):
    return [self.nom(a), f"Zu sehen ist {self.nom(a)}."]

  def two(self, f, r, g):
    fig, rp = self.nom(f), self.relp(r, g)
    return [f"{fig} {rp}", f"{_cap(fig)} befindet sich {rp}.", f"{_cap(rp)} befindet sich {fig}."]

  def three(self, g, c1, c2):
    (f1, r1), (f2, r2) = c1, c2
    p1, p2 = self.relp(r1, g), self.relp(r2, g, definite=True)
    return [f"{self.nom(f1)} {p1} und {self.nom(f2)} {p2}",
            f"{_cap(self.nom(f1))} befindet sich {p1}, und {self.nom(f2)} befindet sich {p2}."]


class _French:
  """Size before the noun, colour after, both agreeing in gender."""
  code, script = "fr", "Latin"
  noun = {"circle": ("cercle", "m"), "square": ("carré", "m"), "triangle": ("triangle", "m"),
          "star": ("étoile", "f"), "heart": ("cœur", "m"), "cross": ("croix", "f")}
  adj = {"small": ("petit", "petite"), "large": ("grand", "grande"), "red": ("rouge", "rouge"),
         "green": ("vert", "verte"), "blue": ("bleu", "bleue"), "yellow": ("jaune", "jaune"),
         "white": ("blanc", "blanche"), "black": ("noir", "noire"), "purple": ("violet", "violette"),
         "orange": ("orange", "orange")}
  rel = {"left": "à gauche", "right": "à droite", "above": "au-dessus", "below": "en dessous"}

  def phrase(self, o, det=None):
    n, gender = self.noun[o.shape]
    g = 0 if gender == "m" else 1
    det = det[g] if det else ("un", "une")[g]
    return f"{det} {self.adj[o.size][g]} {n} {self.adj[o.colour][g]}"

  def relp(self, r, o, definite=False):  # Size (p-, g-) always follows: no elision.
    return f"{self.rel[r]} " + self.phrase(o, ("du", "de la") if definite else ("d'un", "d'une"))

  def one(self, a):
    return [self.phrase(a), f"Il y a {self.phrase(a)}."]

  def two(self, f, r, g):
    fig, rp = self.phrase(f), self.relp(r, g)
    return [f"{fig} {rp}", f"Il y a {fig} {rp}.", f"{_cap(fig)} se trouve {rp}."]

  def three(self, g, c1, c2):
    (f1, r1), (f2, r2) = c1, c2
    p = f"{self.phrase(f1)} {self.relp(r1, g)} et {self.phrase(f2)} {self.relp(r2, g, definite=True)}"
    return [p, f"Il y a {p}."]


class _Czech:
  """Hard adjectives; 'vlevo/vpravo od' + genitive, 'nad/pod' + instrumental."""
  code, script = "cs", "Latin"
  noun = {"circle": ("kruh", "m", "kruhu", "kruhem"), "square": ("čtverec", "m", "čtverce", "čtvercem"),
          "triangle": ("trojúhelník", "m", "trojúhelníku", "trojúhelníkem"),
          "star": ("hvězda", "f", "hvězdy", "hvězdou"), "heart": ("srdce", "n", "srdce", "srdcem"),
          "cross": ("kříž", "m", "kříže", "křížem")}  # (nom, gender, gen, ins)
  stem = {"small": "mal", "large": "velk", "red": "červen", "green": "zelen", "blue": "modr",
          "yellow": "žlut", "white": "bíl", "black": "čern", "purple": "fialov", "orange": "oranžov"}
  ending = {"nom": {"m": "ý", "f": "á", "n": "é"}, "gen": {"m": "ého", "f": "é", "n": "ého"},
            "ins": {"m": "ým", "f": "ou", "n": "ým"}}
  rel = {"left": ("vlevo od", "gen"), "right": ("vpravo od", "gen"), "above": ("nad", "ins"),
         "below": ("pod", "ins")}

  def phrase(self, o, case="nom"):
    nom, gender, gen, ins = self.noun[o.shape]
    e = self.ending[case][gender]
    return f"{self.stem[o.size]}{e} {self.stem[o.colour]}{e} {dict(nom=nom, gen=gen, ins=ins)[case]}"

  def relp(self, r, o):
    prep, case = self.rel[r]
    return f"{prep} {self.phrase(o, case)}"

  def one(self, a):
    return [self.phrase(a), f"Na obrázku je {self.phrase(a)}."]

  def two(self, f, r, g):
    fig, rp = self.phrase(f), self.relp(r, g)
    return [f"{fig} {rp}", f"{_cap(fig)} je {rp}.", f"{_cap(rp)} je {fig}."]

  def three(self, g, c1, c2):
    (f1, r1), (f2, r2) = c1, c2
    a, b = self.phrase(f1), self.phrase(f2)
    p1, p2 = self.relp(r1, g), self.relp(r2, g)
    return [f"{a} {p1} a {b} {p2}", f"{_cap(a)} je {p1} a {b} je {p2}."]


def _ru_hard(stem: str) -> tuple:
  """Hard-stem adjective: nom m/f/n, gen m/n, gen f, ins m/n, ins f."""
  return (stem + "ый", stem + "ая", stem + "ое", stem + "ого", stem + "ой", stem + "ым", stem + "ой")


class _Russian:
  """'слева/справа от' + genitive, 'над/под' + instrumental."""
  code, script = "ru", "Cyrillic"
  noun = {"circle": ("круг", "m", "круга", "кругом"), "square": ("квадрат", "m", "квадрата", "квадратом"),
          "triangle": ("треугольник", "m", "треугольника", "треугольником"),
          "star": ("звезда", "f", "звезды", "звездой"), "heart": ("сердце", "n", "сердца", "сердцем"),
          "cross": ("крест", "m", "креста", "крестом")}  # (nom, gender, gen, ins)

  adj = {"small": ("маленький", "маленькая", "маленькое", "маленького", "маленькой", "маленьким", "маленькой"),
         "large": ("большой", "большая", "большое", "большого", "большой", "большим", "большой"),
         "blue": ("синий", "синяя", "синее", "синего", "синей", "синим", "синей")}
  adj.update({k: _ru_hard(stem) for k, stem in (
      ("red", "красн"), ("green", "зелён"), ("yellow", "жёлт"), ("white", "бел"), ("black", "чёрн"),
      ("purple", "фиолетов"), ("orange", "оранжев"))})
  rel = {"left": ("слева от", "gen"), "right": ("справа от", "gen"), "above": ("над", "ins"),
         "below": ("под", "ins")}

  def phrase(self, o, case="nom"):
    nom, gender, gen, ins = self.noun[o.shape]
    slot = {("nom", "m"): 0, ("nom", "f"): 1, ("nom", "n"): 2, ("gen", "m"): 3, ("gen", "n"): 3,
            ("gen", "f"): 4, ("ins", "m"): 5, ("ins", "n"): 5, ("ins", "f"): 6}[case, gender]
    return f"{self.adj[o.size][slot]} {self.adj[o.colour][slot]} {dict(nom=nom, gen=gen, ins=ins)[case]}"

  def relp(self, r, o):
    prep, case = self.rel[r]
    return f"{prep} {self.phrase(o, case)}"

  def one(self, a):
    return [self.phrase(a), f"На картинке {self.phrase(a)}."]

  def two(self, f, r, g):
    fig, rp = self.phrase(f), self.relp(r, g)
    return [f"{fig} {rp}", f"{_cap(fig)} находится {rp}.", f"{_cap(rp)} находится {fig}."]

  def three(self, g, c1, c2):
    (f1, r1), (f2, r2) = c1, c2
    a, b = self.phrase(f1), self.phrase(f2)
    p1, p2 = self.relp(r1, g), self.relp(r2, g)
    return [f"{a} {p1} и {b} {p2}", f"{_cap(a)} находится {p1}, и {b} находится {p2}."]


class _Japanese:
  """SOV, no spaces: '<anchor>の左に<figure>があります'."""
  code, script = "ja", "Japanese"
  noun = {"circle": "丸", "square": "四角", "triangle": "三角", "star": "星", "heart": "ハート", "cross": "十字"}
  adj = {"small": "小さい", "large": "大きい", "red": "赤い", "green": "緑の", "blue": "青い",
         "yellow": "黄色い", "white": "白い", "black": "黒い", "purple": "紫の", "orange": "オレンジ色の"}
  rel = {"left": "左", "right": "右", "above": "上", "below": "下"}

  def phrase(self, o):
    return f"{self.adj[o.size]}{self.adj[o.colour]}{self.noun[o.shape]}"

  def one(self, a):
    return [self.phrase(a), f"{self.phrase(a)}があります。"]

  def two(self, f, r, g):
    fig, loc = self.phrase(f), f"{self.phrase(g)}の{self.rel[r]}"
    return [f"{loc}にある{fig}", f"{loc}に{fig}があります。", f"{fig}が{loc}にあります。"]

  def three(self, g, c1, c2):
    (f1, r1), (f2, r2) = c1, c2
    a, b = self.phrase(f1), self.phrase(f2)
    l1, l2 = f"{self.phrase(g)}の{self.rel[r1]}", f"{self.phrase(g)}の{self.rel[r2]}"
    return [f"{l1}にある{a}と、{l2}にある{b}", f"{l1}に{a}があり、{l2}に{b}があります。"]


class _Hindi:
  """Postpositions; -ā adjectives and तारा take the oblique -e before them."""
  code, script = "hi", "Devanagari"
  noun = {"circle": ("वृत्त", "वृत्त"), "square": ("वर्ग", "वर्ग"), "triangle": ("त्रिभुज", "त्रिभुज"),
          "star": ("तारा", "तारे"), "heart": ("दिल", "दिल"), "cross": ("क्रॉस", "क्रॉस")}  # (direct, oblique); all masculine
  adj = {"small": ("छोटा", "छोटे"), "large": ("बड़ा", "बड़े"), "red": ("लाल", "लाल"), "green": ("हरा", "हरे"),
         "blue": ("नीला", "नीले"), "yellow": ("पीला", "पीले"), "white": ("सफ़ेद", "सफ़ेद"),
         "black": ("काला", "काले"), "purple": ("बैंगनी", "बैंगनी"), "orange": ("नारंगी", "नारंगी")}
  rel = {"left": "के बाईं ओर", "right": "के दाईं ओर", "above": "के ऊपर", "below": "के नीचे"}

  def phrase(self, o, oblique=False):
    k = int(oblique)
    return f"{self.adj[o.size][k]} {self.adj[o.colour][k]} {self.noun[o.shape][k]}"

  def loc(self, r, g):
    return f"{self.phrase(g, oblique=True)} {self.rel[r]}"

  def one(self, a):
    return [self.phrase(a), f"चित्र में एक {self.phrase(a)} है।"]

  def two(self, f, r, g):
    fig, loc = self.phrase(f), self.loc(r, g)
    return [f"{loc} {fig}", f"{loc} एक {fig} है।", f"{fig} {loc} है।"]

  def three(self, g, c1, c2):
    (f1, r1), (f2, r2) = c1, c2
    a, b = self.phrase(f1), self.phrase(f2)
    l1, l2 = self.loc(r1, g), self.loc(r2, g)
    return [f"{l1} {a} और {l2} {b}", f"{l1} एक {a} है और {l2} एक {b} है।"]


class _Swahili:
  """Adjectives follow the noun and agree with its class (3: m-mi, 9: n)."""
  code, script = "sw", "Latin"
  noun = {"circle": ("mduara", 3), "square": ("mraba", 3), "triangle": ("pembetatu", 9),
          "star": ("nyota", 9), "heart": ("moyo", 3), "cross": ("msalaba", 3)}
  size = {"small": {3: "mdogo", 9: "ndogo"}, "large": {3: "mkubwa", 9: "kubwa"}}
  agreeing = {"red": {3: "mwekundu", 9: "nyekundu"}, "white": {3: "mweupe", 9: "nyeupe"},
              "black": {3: "mweusi", 9: "nyeusi"}}
  colour_noun = {"green": "kijani", "blue": "buluu", "yellow": "njano", "purple": "zambarau",
                 "orange": "rangi ya machungwa"}  # After the genitive: wa (3) / ya (9).
  copula = {3: "uko", 9: "iko"}
  rel = {"left": "kushoto kwa", "right": "kulia kwa", "above": "juu ya", "below": "chini ya"}

  def phrase(self, o):
    n, cls = self.noun[o.shape]
    colour = (self.agreeing[o.colour][cls] if o.colour in self.agreeing
              else f"{'wa' if cls == 3 else 'ya'} {self.colour_noun[o.colour]}")
    return f"{n} {self.size[o.size][cls]} {colour}"

  def one(self, a):
    return [self.phrase(a), f"Kuna {self.phrase(a)}."]

  def two(self, f, r, g):
    fig, rp = self.phrase(f), f"{self.rel[r]} {self.phrase(g)}"
    return [f"{fig} {rp}", f"Kuna {fig} {rp}.", f"{_cap(fig)} {self.copula[self.noun[f.shape][1]]} {rp}."]

  def three(self, g, c1, c2):
    (f1, r1), (f2, r2) = c1, c2
    p1 = f"{self.phrase(f1)} {self.rel[r1]} {self.phrase(g)}"
    p2 = f"{self.phrase(f2)} {self.rel[r2]} {self.phrase(g)}"
    return [f"{p1} na {p2}", f"Kuna {p1}, na {p2}."]


class _Amharic:
  """Adjectives before the noun; 'ከ<anchor> በስተግራ' (circumposition), verb last."""
  code, script = "am", "Ethiopic"
  noun = {"circle": "ክብ", "square": "ካሬ", "triangle": "ሦስት ማዕዘን", "star": "ኮከብ", "heart": "ልብ",
          "cross": "መስቀል"}
  adj = {"small": "ትንሽ", "large": "ትልቅ", "red": "ቀይ", "green": "አረንጓዴ", "blue": "ሰማያዊ", "yellow": "ቢጫ",
         "white": "ነጭ", "black": "ጥቁር", "purple": "ሐምራዊ", "orange": "ብርቱካናማ"}
  rel = {"left": "በስተግራ", "right": "በስተቀኝ", "above": "በላይ", "below": "በታች"}

  def phrase(self, o):
    return f"{self.adj[o.size]} {self.adj[o.colour]} {self.noun[o.shape]}"

  def loc(self, r, g):
    return f"ከ{self.phrase(g)} {self.rel[r]}"  # ከ is a prefix of the phrase's first word.

  def one(self, a):
    return [self.phrase(a), f"{self.phrase(a)} አለ።"]

  def two(self, f, r, g):
    loc, fig = self.loc(r, g), self.phrase(f)
    return [f"{loc} {fig}", f"{loc} {fig} አለ።"]

  def three(self, g, c1, c2):
    (f1, r1), (f2, r2) = c1, c2
    l1, l2 = self.loc(r1, g), self.loc(r2, g)
    a, b = self.phrase(f1), self.phrase(f2)
    return [f"{l1} {a} እና {l2} {b}", f"{l1} {a} አለ፤ {l2} ደግሞ {b} አለ።"]


_GRAMMARS = {g.code: g for g in (_English(), _German(), _French(), _Czech(), _Russian(), _Japanese(),
                                  _Hindi(), _Swahili(), _Amharic())}
LANGUAGES = tuple(_GRAMMARS)
SCRIPTS = {code: g.script for code, g in _GRAMMARS.items()}


def all_captions(description: Description, lang: str) -> list:
  """Every caption the grammar can give the scene in `lang` (paraphrases)."""
  g = _GRAMMARS[lang]
  objs, rels = description.objects, description.relations
  if len(objs) == 1:
    return g.one(objs[0])
  if len(objs) == 2:  # Said from either object.
    return g.two(objs[1], rels[0], objs[0]) + g.two(objs[0], _INVERSE[rels[0]], objs[1])
  c1, c2 = (objs[1], rels[0]), (objs[2], rels[1])
  return g.three(objs[0], c1, c2) + g.three(objs[0], c2, c1)


def caption(description: Description, lang: str, rng: np.random.Generator) -> str:
  options = all_captions(description, lang)
  return options[int(rng.integers(len(options)))]


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


# ---- Dataset definition ----------------------------------------------------

def _require(ok: bool, field: str, message: str):
  if not ok:
    raise config_lib.ConfigError(f"config.{field}: {message}")


def validate(c) -> None:
  """config.data.synthetic; raises config_lib.ConfigError naming the field."""
  s, f = c.data.synthetic, "data.synthetic."
  langs = config_lib.language_codes(s.languages, f + "languages")
  _require(all(l in LANGUAGES for l in langs), f + "languages", f"{langs!r}: each must be one of {LANGUAGES}")
  _require(isinstance(s.seed, int) and s.seed >= 0, f + "seed", f"must be an int >= 0, got {s.seed!r}")
  for name in ("default_pairs", "translation_pairs"):
    _require(isinstance(s[name], int) and s[name] >= 0, f + name, f"must be an int >= 0, got {s[name]!r}")
  for lang, n in s.pairs_per_language.items():
    _require(lang in langs, f + "pairs_per_language", f"{lang!r} is not in data.synthetic.languages {langs}")
    _require(isinstance(n, int) and n >= 0, f"{f}pairs_per_language.{lang}", f"must be an int >= 0, got {n!r}")
  _require(s.translation_pivot == "" or s.translation_pivot in langs, f + "translation_pivot",
           f"{s.translation_pivot!r} is not '' nor in data.synthetic.languages {langs}")
  for name in list(s.translation_pair_list) + list(s.translation_pairs_per_pair.keys()):
    try:
      a, b = config_lib.parse_language_pair(name)
    except config_lib.ConfigError as e:
      raise config_lib.ConfigError(f"config.{f}translation_pair_list / translation_pairs_per_pair: {e}") from None
    _require(a in langs and b in langs and a != b, f + "translation_pair_list",
             f"{name!r}: needs two different languages of data.synthetic.languages {langs}")
  for name, n in s.translation_pairs_per_pair.items():
    _require(isinstance(n, int) and n >= 0, f"{f}translation_pairs_per_pair.{name}",
             f"must be an int >= 0, got {n!r}")
  _require(isinstance(s.get("withhold_parallel_text", False), bool), f + "withhold_parallel_text",
           f"must be a bool, got {s.get('withhold_parallel_text')!r}")
  _require(s.get("caption_pairs", "translations") in CAPTION_PAIRS, f + "caption_pairs",
           f"{s.get('caption_pairs')!r} not in {list(CAPTION_PAIRS)}")
  _require(0.01 <= s.heldout_fraction <= 0.5, f + "heldout_fraction",  # Rejection sampling stays cheap.
           f"must be in [0.01, 0.5], got {s.heldout_fraction}")
  for name in ("eval_scenes", "eval_captions_per_scene"):
    _require(isinstance(s[name], int) and s[name] >= 1, f + name, f"must be an int >= 1, got {s[name]!r}")
  _require(isinstance(s.render_size, int) and s.render_size >= 8, f + "render_size",
           f"must be an int >= 8, got {s.render_size!r}")



@dataclasses.dataclass(frozen=True)
class Settings:
  """Everything that defines the dataset, read once from config (hashable)."""
  seed: int
  languages: tuple
  image_caption_counts: tuple  # Per language, aligned with `languages`.
  translation_pairs: tuple  # ((left_lang, right_lang), ...).
  translation_counts: tuple
  heldout_fraction: float
  eval_scenes: int
  eval_captions_per_scene: int
  render_size: int
  withhold_parallel_text: bool = False
  comparable_pairs: bool = False  # caption_pairs == "comparable".

  @classmethod
  def from_config(cls, config) -> "Settings":
    validate(config)
    s = config.data.synthetic
    langs = tuple(s.languages)
    counts = tuple(int(s.pairs_per_language.get(l, s.default_pairs)) for l in langs)
    pairs = translation_pair_list(s)
    overrides = {config_lib.parse_language_pair(k): v for k, v in s.translation_pairs_per_pair.items()}
    unknown = set(overrides) - set(pairs)
    if unknown:
      raise config_lib.ConfigError(
          f"config.data.synthetic.translation_pairs_per_pair: {sorted('-'.join(p) for p in unknown)} "
          f"not among the translation pairs {['-'.join(p) for p in pairs]}")
    return cls(seed=int(s.seed), languages=langs, image_caption_counts=counts, translation_pairs=pairs,
               translation_counts=tuple(int(overrides.get(p, s.translation_pairs)) for p in pairs),
               heldout_fraction=float(s.heldout_fraction), eval_scenes=int(s.eval_scenes),
               eval_captions_per_scene=int(s.eval_captions_per_scene), render_size=int(s.render_size),
               withhold_parallel_text=bool(s.get("withhold_parallel_text", False)),
               comparable_pairs=s.get("caption_pairs", "translations") == "comparable")


  def restricted(self, languages: Sequence[str]) -> "Settings":
    """Only `languages`' image-caption pairs and the translation pairs within them (() : all).

    Records are keyed by (language, index), so each kept one is the record the whole dataset
    holds; only the order of the mix changes. Unknown codes are a ConfigError."""
    if not languages:
      return self
    unknown = [l for l in languages if l not in self.languages]
    if unknown:
      raise config_lib.ConfigError(f"config.tasks: a 'synthetic' source's languages {unknown} are not in "
                                   f"config.data.synthetic.languages {list(self.languages)}")
    keep = [i for i, l in enumerate(self.languages) if l in languages]
    pairs = [i for i, (a, b) in enumerate(self.translation_pairs) if a in languages and b in languages]
    return dataclasses.replace(
        self, languages=tuple(self.languages[i] for i in keep),
        image_caption_counts=tuple(self.image_caption_counts[i] for i in keep),
        translation_pairs=tuple(self.translation_pairs[i] for i in pairs),
        translation_counts=tuple(self.translation_counts[i] for i in pairs))


def translation_pair_list(s) -> tuple:
  """(left, right) language pairs of config.data.synthetic, in a fixed order."""
  if s.translation_pair_list:
    return tuple(config_lib.parse_language_pair(p) for p in s.translation_pair_list)
  if not s.translation_pivot:
    return ()
  return tuple((s.translation_pivot, l) for l in s.languages if l != s.translation_pivot)


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
    _draw(d, settings.render_size, rng)  # The caption's draws come after the image's.
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
  import tensorflow as tf  # Deferred: the pure generator needs no TensorFlow.
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
  import tensorflow as tf
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
  import tensorflow as tf
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
