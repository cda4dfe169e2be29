"""The table of systems: `config.system` -> a mural.system.System.

A new system is one file here (its tasks, model, evaluators and config
defaults, as a `SYSTEM` value) and one entry below; nothing else in mural
changes.
"""

from mural import config_lib
from mural.systems import align
from mural.systems import globetrotter
from mural.systems import mule
from mural.systems import mural
from mural.systems import smalr

SYSTEMS = {
    "align": align.SYSTEM,
    "mural": mural.SYSTEM,
    "mule": mule.SYSTEM,
    "smalr": smalr.SYSTEM,
    "globetrotter": globetrotter.SYSTEM,
}


def get(config):
  """The system named by config.system."""
  name = config.system
  if name not in SYSTEMS:
    raise config_lib.ConfigError(f"config.system: {name!r} not in {sorted(SYSTEMS)}")
  return SYSTEMS[name]


def base_config(name: str):
  """base_config() with the defaults of system `name` (config files start here)."""
  if name not in SYSTEMS:
    raise config_lib.ConfigError(f"system {name!r} not in {sorted(SYSTEMS)}")
  return SYSTEMS[name].get_config()
