"""Globetrotter (Surís et al. 2022) at the paper's sizes, on the built-in data.

    python -m mural.main --config=configs/globetrotter.py --workdir=/tmp/globetrotter
    python -m mural.main --config=configs/globetrotter.py --mode=describe
    python -m mural.main --config=configs/globetrotter.py:text_only --workdir=/tmp/text_only

ResNet-18 (from scratch: nothing is downloaded; the paper starts from
ImageNet) at 112 px, the synthetic scenes rendered at 112 px; BERT 4 layers
x 4 heads x 512 over one wordpiece vocabulary for all languages; heads to
D = 128; batch 800, Adam 1e-4; L_t + 0.2 L_v + 0.2 L_x + 0.2 L_c
(mural/systems/globetrotter.py). No parallel text: the built-in data
withholds its translation pairs. The argument after ':' is one of
mural.systems.globetrotter.VARIANTS ('full', 'text_only': the paper's
text-only baseline, the same text model trained with L_c alone). Sized for
an accelerator: configs/globetrotter_demo.py is the CPU version.
"""

from mural import systems
from mural.systems.defaults import globetrotter


def get_config(variant: str = "full"):
  c = systems.base_config("globetrotter")
  c.data.image_size = 112
  c.data.eval_resize = 112
  c.data.synthetic.render_size = 112
  c.total_steps = 50_000
  c.eval_every_steps = 5_000
  c.checkpoint_every_steps = 5_000
  c.eval_batch_size = 400
  return globetrotter.apply_variant(c, variant)
