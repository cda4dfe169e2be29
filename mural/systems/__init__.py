"""The table of systems: `config.system` -> its config defaults and its mural.system.System.

A new system is two files, its config defaults in defaults/ (what config
files import: no JAX, no TensorFlow) and its tasks, model and evaluators
here (a `SYSTEM` value), and one entry below; nothing else in mural changes.
A system's module is imported when the system is first asked for, so loading
a config file stays a matter of milliseconds.
"""

import dataclasses
import difflib
from typing import Any, Callable, Optional

import ml_collections

from mural import config_lib
from mural import lazy_import
from mural.data import synthetic_settings
from mural.systems.defaults import align as align_defaults
from mural.systems.defaults import globetrotter as globetrotter_defaults
from mural.systems.defaults import kadar as kadar_defaults
from mural.systems.defaults import mule as mule_defaults
from mural.systems.defaults import mural as mural_defaults
from mural.systems.defaults import smalr as smalr_defaults


@dataclasses.dataclass(frozen=True)
class Entry:
  """One system: its config defaults, and the module whose SYSTEM it is (imported on first use)."""
  get_config: Callable[[], ml_collections.ConfigDict]
  module: Any

  @property
  def system(self):
    return self.module.SYSTEM


SYSTEMS = {
    "align": Entry(align_defaults.get_config, lazy_import.module("mural.systems.align")),
    "mural": Entry(mural_defaults.get_config, lazy_import.module("mural.systems.mural")),
    "mule": Entry(mule_defaults.get_config, lazy_import.module("mural.systems.mule")),
    "kadar": Entry(kadar_defaults.get_config, lazy_import.module("mural.systems.kadar")),
    "smalr": Entry(smalr_defaults.get_config, lazy_import.module("mural.systems.smalr")),
    "globetrotter": Entry(globetrotter_defaults.get_config, lazy_import.module("mural.systems.globetrotter")),
}


def get(config):
  """The system named by config.system; every field of `config` must be one of its defaults."""
  _check_system_and_fields(config)
  return SYSTEMS[config.system].system


def validate(config) -> None:
  """Every check of a config that needs neither JAX nor TensorFlow (a mistake is one line in
  under a second): its system and fields, config_lib's values, the built-in data's section
  (NumPy only)."""
  _check_system_and_fields(config)
  config_lib.validate(config)
  synthetic_settings.Settings.from_config(config)


def _check_system_and_fields(config) -> None:
  name = config.system
  if name not in SYSTEMS:
    raise config_lib.ConfigError(f"config.system: {name!r} not in {sorted(SYSTEMS)}")
  _check_fields(config, SYSTEMS[name].get_config(), name)


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
_FREE_FORM = ("data.eval_source", "data.eval_translations", "data.eval_sets")


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
