"""ALIGN-BASE: MURAL-BASE without the text-text task (EfficientNet-B5 + BERT-Base; MURAL 3.2, A.1)."""

import pathlib

from mural import config_lib
from mural.systems.defaults import align


def get_config():
  return align.from_mural(config_lib.from_file(pathlib.Path(__file__).with_name("mural_base.py")))
