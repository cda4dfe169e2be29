"""ALIGN (Jia et al. 2021): MURAL's image-text task alone.

The same towers, head and loss as MURAL's i2t task (mural/systems/mural.py);
no text-text task and no t2t head. Translation retrieval is still evaluated,
with the image-text text head.
"""

from mural import system
from mural.systems import mural
from mural.systems.defaults import align as defaults

SYSTEM = system.System(
    name="align", get_config=defaults.get_config, tasks=lambda config: (mural.image_text_task(config),),
    build_model=mural.build_model, evaluators=mural.evaluators, retrieval_heads=mural.retrieval_heads)
