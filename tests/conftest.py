"""Shared pytest helpers: config loading, the tiny training config, one vocab per session,
real data directories (skip when absent), quiet TF.

Subprocess workers (test_sharding, test_multihost) import this file as a
module too (`import conftest`: their directory is on sys.path).
"""

import os
import pathlib

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # Before anything imports TensorFlow.

import pytest  # pylint: disable=g-import-not-at-top

from mural import config_lib  # pylint: disable=g-import-not-at-top  (ml_collections only: no JAX)

ROOT = pathlib.Path(__file__).resolve().parents[1]


def load_config(name: str = "tiny"):
  """configs/<name>.py's get_config()."""
  return config_lib.from_file(ROOT / "configs" / f"{name}.py")


def set_fields(config, **overrides):
  """config with 'a.b.c'-named fields set (keyword names use '__' for '.')."""
  for key, value in overrides.items():
    node = config
    *parents, leaf = key.replace("__", ".").split(".")
    for p in parents:
      node = node[p]
    node[leaf] = value
  return config


def tiny_config(vocab_path: str = "", languages=("en", "de", "sw"), **overrides):
  """configs/tiny.py on the built-in data in `languages`, 16 held-out scenes, a given vocab."""
  c = load_config("tiny")
  c.data.vocab_path = vocab_path
  c.data.synthetic.eval_scenes = 16
  c.data.synthetic.languages = list(languages)
  c.data.languages = list(languages)
  return set_fields(c, **overrides)


def learn_vocab(workdir) -> str:
  """A wordpiece vocab learned from the tiny config's training text (1000 records per source)."""
  from mural import system, systems  # pylint: disable=g-import-not-at-top
  from mural.data import vocab  # pylint: disable=g-import-not-at-top
  config = tiny_config()
  saved, vocab.RECORDS_PER_SOURCE = vocab.RECORDS_PER_SOURCE, 1000
  try:
    tasks = system.active_tasks(systems.get(config), config)
    return vocab.tokenizer(config, tasks, str(workdir)).vocab_path
  finally:
    vocab.RECORDS_PER_SOURCE = saved


class HookedIterator:
  """Wraps a training iterator; `hook(batch)` runs on batch number `at` (1-based; None: every
  batch) and may replace it."""

  def __init__(self, inner, at, hook):
    self.inner, self.at, self.hook, self.count = inner, at, hook, 0

  def __iter__(self):
    return self

  def __next__(self):
    self.count += 1
    batch = next(self.inner)
    if self.at is None or self.count == self.at:
      batch = self.hook(batch) or batch
    return batch

  def get_state(self):
    return self.inner.get_state()

  def set_state(self, state):
    self.inner.set_state(state)

  def skip_counts(self):
    return self.inner.skip_counts()


def sigterm(batch):
  """A HookedIterator hook: SIGTERM this process (the trainer checkpoints and stops after the step)."""
  import signal  # pylint: disable=g-import-not-at-top
  os.kill(os.getpid(), signal.SIGTERM)
  return batch


@pytest.fixture(scope="session")
def tiny_vocab(tmp_path_factory) -> str:
  """One vocab for every test that trains the tiny model (learning it is the slow part of set-up)."""
  return learn_vocab(tmp_path_factory.mktemp("vocab"))


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
