"""MULE (Kim et al. 2020) at the paper's sizes, on the built-in data.

    python -m mural.main --config=configs/mule.py --workdir=/tmp/mule
    python -m mural.main --config=configs/mule.py:parallel_embn --workdir=/tmp/parallel_embn
    python -m mural.main --config=configs/mule.py --mode=describe

Words 300-d -> per-language FC -> 512 (MULE) -> LSTM 1024 -> FC 512; images:
frozen features -> FC 2048 -> BN -> ReLU -> FC 512; batch 450, Adam 1e-4,
K = 10, lambda_1 = lambda_3 = 1, lambda_2 = 1e-6 (mural/systems/mule.py). The
argument after ':' picks one of mural.systems.mule.ABLATIONS (default
'embn_nc_lc'). The frozen backbone is the EfficientNet of model.image (B5 by
default, as MURAL-BASE), seeded unless model.image.backbone_workdir names a
trained mural run; the paper used ImageNet ResNet-152 features (2048-d).
Sized for an accelerator: configs/mule_demo.py is the CPU version.
"""

from mural import systems
from mural.systems.defaults import mule


def get_config(ablation: str = "embn_nc_lc"):
  c = systems.base_config("mule")
  c.model.text.words_per_language = 20_000
  c.model.text.max_len = 32
  c.data.synthetic.eval_scenes = 1000  # Multi30K's test split has 1k images.
  c.total_steps = 20_000
  c.optim.warmup_steps = 500
  c.eval_every_steps = 2_000
  c.checkpoint_every_steps = 2_000
  c.eval_batch_size = 500
  return mule.apply_ablation(c, ablation)
