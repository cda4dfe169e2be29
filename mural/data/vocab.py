"""The run's wordpiece vocabulary: config.data.vocab_path, or learned once from the training text
(or, for a warm start that loads the text tower, the source's: mural/warm_start.py).

The text comes from every active task's training sources (its record kind's
text fields: captions, both sides of translation pairs), up to
training_text.RECORDS_PER_SOURCE records each. Process 0 learns it into workdir/vocab.txt;
the others wait for it.
"""

import functools
import hashlib
from typing import Iterator, Optional, Sequence, Tuple

import jax
from absl import logging
from etils import epath
from jax.experimental import multihost_utils
import tensorflow as tf

from mural import config_lib
from mural.data import tokenizer as tokenizer_lib
from mural.data import training_text
from mural.data import word_vocab


def training_texts(config, tasks: Sequence) -> Iterator[str]:
  """Text fields of the first training_text.RECORDS_PER_SOURCE records of each task's sources."""
  for task, record in training_text.training_records(config, tasks):
    for f in task.input.text_fields:
      yield record[f].decode("utf-8", "replace")


@tf.autograph.experimental.do_not_convert  # Graph-mode code only: pipeline._open_sources says why.
def learn(config, tasks: Sequence, workdir: str) -> str:
  """workdir/vocab.txt, learned from the training text of the tasks at weight > 0 unless it
  exists, or copied from the source of a warm start that loads the text tower
  (config_lib.source_vocab) (config.data.tokenizer 'words': workdir/words.json from every task
  given, see word_vocab.py). `tasks`: system.vocabulary_tasks.

  Touches no JAX device: a multi-process run learns it in process 0 before
  the processes connect (mural/main.py), so no peer waits on it in a collective.
  """
  if _kind(config) == "words":
    return word_vocab.learn(config, tasks, workdir)
  path = epath.Path(workdir) / "vocab.txt"
  if path.exists():
    return str(path)
  source = config_lib.source_vocab(config.init_from) if config_lib.takes_text_tower(config) else None
  if source:  # The warm start's token table goes with its vocabulary.
    logging.info("Vocabulary: %s, the warm start's (its text tower is loaded), copied to %s.", source, path)
    path.write_bytes(epath.Path(source).read_bytes())
  else:
    logging.info("Learning a %d-token wordpiece vocab into %s.", config.model.text.vocab_size, path)
    active = [t for t in tasks if t.weight > 0]
    tokenizer_lib.build_vocab(list(training_texts(config, active)), config.model.text.vocab_size, str(path))
  return str(path)


# config.data.tokenizer: 'wordpiece' (the shared wordpiece vocab below) or
# 'words' (per-language word vocabularies, mural/data/word_vocab.py).
TOKENIZER_KINDS = ("wordpiece", "words")


def _kind(config) -> str:
  kind = config.data.get("tokenizer", "wordpiece")
  if kind not in TOKENIZER_KINDS:
    raise config_lib.ConfigError(f"config.data.tokenizer: {kind!r} not in {TOKENIZER_KINDS}")
  return kind


@functools.lru_cache(maxsize=8)
def _tokenizer(path: str, max_len: int, normalization: str, digest: str) -> tokenizer_lib.Tokenizer:
  """One Tokenizer per vocab (path and contents) and length in a process: runs after the first
  (a resume, evaluation, a notebook's next run) reuse its traced graph."""
  del digest  # Part of the cache key only.
  return tokenizer_lib.Tokenizer(path, max_len, normalization)


def wordpiece_path(config, workdir: str) -> Optional[str]:
  """The run's wordpiece vocabulary file: config.data.vocab_path, else workdir/vocab.txt (learned
  or copied there); None for per-language words."""
  if _kind(config) == "words":
    return None
  return config.data.vocab_path or str(epath.Path(workdir) / "vocab.txt")


def vocab_file(config, workdir: str) -> Tuple[str, str]:
  """(the config field that names the run's vocabulary, its file): data.vocab_path and the
  wordpiece vocabulary, or data.word_vocab_path and the word vocabularies (an export copies it
  and points that field at the copy)."""
  if _kind(config) == "words":
    return "data.word_vocab_path", (config.data.get("word_vocab_path", "")
                                    or str(epath.Path(workdir) / word_vocab.FILE_NAME))
  return "data.vocab_path", wordpiece_path(config, workdir)


def tokenizer(config, tasks: Sequence, workdir: str, learn_missing: bool = True) -> tokenizer_lib.Tokenizer:
  """config.data.vocab_path, else workdir/vocab.txt (learned from the tasks' text once, by process 0);
  per-language words when config.data.tokenizer is 'words'."""
  if _kind(config) == "words":
    return word_vocab.tokenizer(config, tasks, workdir, learn_missing)
  path = wordpiece_path(config, workdir)
  if not config.data.vocab_path:
    if not learn_missing and not epath.Path(path).exists():
      raise FileNotFoundError(f"{path} does not exist: the vocab is learned by --mode=train "
                              f"(or set config.data.vocab_path)")
    if jax.process_index() == 0:
      learn(config, tasks, workdir)
    if jax.process_count() > 1:
      multihost_utils.sync_global_devices("mural_vocab")
  elif not epath.Path(path).exists():
    raise FileNotFoundError(f"config.data.vocab_path: {path} does not exist")
  digest = hashlib.sha256(epath.Path(path).read_bytes()).hexdigest()  # A rewritten file is read again.
  tok = _tokenizer(path, config.model.text.max_len,
                   config.data.get("text_normalization", "casefold"), digest)
  if tok.vocab_size > config.model.text.vocab_size:
    raise config_lib.ConfigError(
        f"config.model.text.vocab_size: {config.model.text.vocab_size} is smaller than the "
        f"vocab {path} ({tok.vocab_size} tokens)")
  return tok
