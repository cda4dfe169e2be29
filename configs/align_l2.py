"""ALIGN-L2: EfficientNet-L2 + BERT-Large (MURAL-LARGE's text tower), image-text only (MURAL 3.2, A.1)."""

import pathlib

from mural import config_lib
from mural.systems.defaults import align


def get_config():
  c = align.from_mural(config_lib.from_file(pathlib.Path(__file__).with_name("mural_large.py")))
  c.model.image.variant = "l2"  # MURAL A.1: EfficientNet-L2 image encoder (~480M).
  c.model.heads.embed_dim = 1376  # L2 pools to round_filters(320, 4.3) = 1376-d; the head matches it.
  # The BASE schedule is kept (ALIGN-L2's own run is not replicated).
  return c
