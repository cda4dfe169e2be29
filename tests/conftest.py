"""Shared pytest fixtures: real data directories (skip when absent), quiet TF."""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # Before anything imports TensorFlow.

import pytest  # pylint: disable=g-import-not-at-top


def _data_dir_or_skip(module, name: str) -> str:
  try:
    return module.data_dir()
  except ValueError as e:
    pytest.skip(f"{name} data not available: {e}")


@pytest.fixture(scope="session")
def multi30k_dir() -> str:
  """The Multi30k release dir ($MURAL_MULTI30K_DIR or <repo>/../shared/data/multi30k); skips if absent."""
  from mural.data import multi30k  # pylint: disable=g-import-not-at-top
  return _data_dir_or_skip(multi30k, "Multi30k")


@pytest.fixture(scope="session")
def flickr8k_dir() -> str:
  """The flickr8k_1k dir ($MURAL_FLICKR8K_DIR or <repo>/../shared/data/flickr8k_1k); skips if absent."""
  from mural.data import flickr8k  # pylint: disable=g-import-not-at-top
  return _data_dir_or_skip(flickr8k, "Flickr8k")
