"""The table of systems: `config.system` -> a mural.system.System.

A new system is one file here (its tasks, model, evaluators and config
defaults, as a `SYSTEM` value) and one entry below; nothing else in mural
changes.
"""

import difflib

import ml_collections

from mural import config_lib
from mural.systems import align
from mural.systems import kadar
from mural.systems import globetrotter
from mural.systems import mule
from mural.systems import mural
from mural.systems import smalr

SYSTEMS = {
    "align": align.SYSTEM,
    "mural": mural.SYSTEM,
    "mule": mule.SYSTEM,
    "kadar": kadar.SYSTEM,
    "smalr": smalr.SYSTEM,
    "globetrotter": globetrotter.SYSTEM,
}


def get(config):
  """The system named by config.system; every field of `config` must be one of its defaults."""
  name = config.system
  if name not in SYSTEMS:
    raise config_lib.ConfigError(f"config.system: {name!r} not in {sorted(SYSTEMS)}")
  _check_fields(config, SYSTEMS[name].get_config(), name)
  return SYSTEMS[name]


def _check_fields(config, defaults, name: str):
  """A field the system's defaults lack is a misspelling (a config file can add one without an
  error: `c.optim.warmup_step = 5`); it would be ignored, so it is an error naming the field.
  A field the config lacks (a config.json record edited by hand) is one too."""
  known, free = _field_names(defaults)
  given = _field_names(config)[0]
  missing = {f for f in known - given if not any(f.startswith(g + ".") for g in free)}
  missing = sorted(f for f in missing if not any(f.startswith(m + ".") for m in missing))
  if missing:
    raise config_lib.ConfigError(f"config: missing field{'s' * (len(missing) > 1)} of system {name!r}: "
                                 + ", ".join(missing))
  for field in sorted(given - known):
    if not any(field.startswith(f + ".") for f in free):
      near = difflib.get_close_matches(field, known, n=1)
      raise config_lib.ConfigError(f"config.{field}: not a field of system {name!r}"
                                   + (f"; did you mean {near[0]}?" if near else ""))


# Dicts whose fields depend on a kind they name; their own code checks them (eval_data.py).
_FREE_FORM = ("data.eval_source",)


def _field_names(config, prefix: str = ""):
  """(dotted names of every field, nested ConfigDicts included but not lists; the free-form
  dicts: _FREE_FORM and those empty by default, keyed by language say)."""
  names, free = set(), set()
  for key, value in config.items():
    names.add(prefix + key)
    if not isinstance(value, ml_collections.ConfigDict):
      continue
    if not value or prefix + key in _FREE_FORM:
      free.add(prefix + key)
    else:
      inner, inner_free = _field_names(value, f"{prefix}{key}.")
      names, free = names | inner, free | inner_free
  return names, free


def base_config(name: str):
  """base_config() with the defaults of system `name` (config files start here)."""
  if name not in SYSTEMS:
    raise config_lib.ConfigError(f"system {name!r} not in {sorted(SYSTEMS)}")
  return SYSTEMS[name].get_config()
