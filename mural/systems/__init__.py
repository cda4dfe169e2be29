"""The table of systems: `config.system` -> a mural.system.System.

A new system is one file here (its tasks, model, evaluators and config
defaults, as a `SYSTEM` value) and one entry below; nothing else in mural
changes.
"""

import difflib
from typing import Optional

import ml_collections

from mural import config_lib
from mural.data import synthetic_settings
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


def validate(config) -> None:
  """Every check of a config's values that needs neither JAX nor TensorFlow (a mistake is one
  line in under a second): config_lib's, then the built-in data's section (NumPy only)."""
  config_lib.validate(config)
  synthetic_settings.Settings.from_config(config)


def _check_fields(config, defaults, name: str):
  """A field the system's defaults lack is a misspelling (a config file can add one without an
  error: `c.optim.warmup_step = 5`); it would be ignored, so it is an error naming the field."""
  known, free = _field_names(defaults)
  for field in sorted(_field_names(config)[0] - known):
    if not any(field.startswith(f + ".") for f in free):
      near = difflib.get_close_matches(field, known, n=1)
      raise config_lib.ConfigError(f"config.{field}: not a field of system {name!r}"
                                   + (f"; did you mean {near[0]}?" if near else ""))


# Dicts whose fields depend on a kind they name; their own code checks them (eval_data.py).
_FREE_FORM = ("data.eval_source", "data.eval_translations")


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


def recorded(workdir: str):
  """The config WORKDIR/config.json records (config_lib.write_record), rebuilt on its system's
  defaults: each value assigned as a --config flag's would be, so one of the wrong type is a
  ConfigError naming its field, and a field the record lacks (one added to mural after the run)
  keeps its default. Locked, as a config file's."""
  values = config_lib.read_record(workdir)
  try:
    config = base_config(values["system"])
    with config.unlocked():  # Free-form sections (data.eval_source, ...) may gain fields.
      _assign(config, values, "")
  except config_lib.ConfigError as e:
    raise config_lib.ConfigError(f"{config_lib.record_path(workdir)}: {e}") from None
  config.lock()
  return config


def record_changes(config, workdir: str) -> Optional[list]:
  """The fields (dotted names) in which `config` differs from the one WORKDIR records, read on
  today's defaults (a field added to mural since the record was written is no change); None
  without a record."""
  if not config_lib.record_path(workdir).exists():
    return None
  return config_lib.differences(recorded(workdir), config)


def _assign(config, values: dict, prefix: str):
  for key, value in values.items():
    if isinstance(value, dict) and isinstance(config.get(key), ml_collections.ConfigDict):
      _assign(config[key], value, f"{prefix}{key}.")
      continue
    try:
      config[key] = value
    except TypeError:
      raise config_lib.ConfigError(f"config.{prefix}{key}: {value!r} is not a "
                                   f"{config.get_type(key).__name__}") from None
