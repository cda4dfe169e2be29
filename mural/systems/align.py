"""ALIGN (Jia et al. 2021): MURAL's image-text task alone.

The same towers, head and loss as MURAL's i2t task (mural/systems/mural.py);
no text-text task and no t2t head. Translation retrieval is still evaluated,
with the image-text text head.
"""

from mural import system
from mural.systems import mural


def from_mural(config):
  """A MURAL config turned ALIGN: the same model and image-text task, no text-text task."""
  config.system = "align"
  del config.tasks["t2t"]
  return config


def get_config():
  return from_mural(mural.get_config())


SYSTEM = system.System(
    name="align", get_config=get_config, tasks=lambda config: (mural.image_text_task(config),),
    build_model=mural.build_model, evaluators=mural.evaluators, retrieval_heads=mural.retrieval_heads)
