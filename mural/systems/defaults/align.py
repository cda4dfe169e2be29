"""ALIGN's config defaults: MURAL's without the text-text task.

Config files import this module: it imports no JAX or TensorFlow, so a
config mistake is reported in under a second. The system itself is
mural/systems/align.py.
"""

from mural.systems.defaults import mural


def from_mural(config):
  """A MURAL config turned ALIGN: the same model and image-text task, no text-text task."""
  config.system = "align"
  del config.tasks["t2t"]
  return config


def get_config():
  return from_mural(mural.get_config())
