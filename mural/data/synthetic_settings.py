"""config.data.synthetic: its checks (`validate`) and the `Settings` read from it.

`Settings` is everything that defines the built-in dataset, read once and hashable, so the
dataset's caches key on it. mural.systems.validate calls `Settings.from_config` to check a
config, so this module imports neither TensorFlow nor JAX: a config mistake is reported before
they load.
"""

import dataclasses
from typing import Sequence

from mural import config_lib
from mural.data.synthetic_grammars import LANGUAGES

CAPTION_PAIRS = ("translations", "comparable")  # config.data.synthetic.caption_pairs.


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
