"""Kádár et al. (CoNLL 2018) at the paper's sizes, on the built-in data.

    python -m mural.main --config=configs/kadar.py --workdir=/tmp/kadar
    python -m mural.main --config=configs/kadar.py --mode=describe
    python -m mural.main --config=configs/kadar.py --workdir=/tmp/kadar_no_c2c --config.tasks.c2c.weight=0

One word table (300-d) for the union of every language's words (fewer than 4
occurrences -> UNK) -> GRU 1024, its final state the caption; frozen image
features -> linear 1024; max of hinges (margin 0.2), c2i and c2c drawn with
p = 0.5 per step, Adam 2e-4, batch 128, early stopping on the mean sum of
R@1/5/10 (patience 10 evaluations, every 500 steps). mural/systems/kadar.py
says where the paper is silent. The frozen backbone is the EfficientNet of
model.image (B5 by default), seeded unless model.image.backbone_workdir names
a trained mural run; the paper used ImageNet ResNet-50 features (2048-d).
Sized for an accelerator: configs/kadar_demo.py is the CPU version.
"""

from mural import systems


def get_config():
  c = systems.base_config("kadar")
  c.model.image.include_head = True  # The frozen B5 with its head conv: 2048-d features, as ResNet-50's.
  c.data.synthetic.eval_scenes = 1000  # Multi30K's 2016 test split has 1k images.
  c.eval_batch_size = 500
  return c
