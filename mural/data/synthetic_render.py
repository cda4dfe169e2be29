"""Draws a scene's `Description` into an image with NumPy: each shape a signed distance field,
its colour jittered, a layout that realises the relations, a nuisance background (solid,
gradient, noise, stripes).

`draw` makes every random draw of an image, in order, without painting it: a record whose image
is not needed (the captions a vocabulary reads) consumes the same draws and so gets the same
caption. `render` is `draw`, then paint.
"""

import functools
import math
from typing import NamedTuple

import numpy as np

from mural.data.synthetic_scenes import Description

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


def draw(description: Description, size: int, rng: np.random.Generator) -> _Nuisance:
  background = _draw_background(size, rng)
  centres, radii = _layout(description, rng)
  colours = [np.array(COLOUR_RGB[o.colour], np.float32) + rng.integers(-_COLOUR_JITTER, _COLOUR_JITTER + 1, 3)
             for o in description.objects]
  return _Nuisance(background, centres, radii, colours)


def render(description: Description, size: int, rng: np.random.Generator, with_layout: bool = False):
  """uint8 [size, size, 3] image of the scene (nuisance drawn from rng).

  with_layout: also return object centres (x, y) and radii in pixels."""
  nuisance = draw(description, size, rng)
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
