"""Per-language word vocabularies (MULE, SMALR): learned from the training text into the workdir.

Word-embedding systems give every language its own embedding rows (MULE:
"the word embeddings and the language-specific FC layers are the only
language-specific parameters"). Ids are laid out in blocks so that one table
holds every language and a token id alone says its language:

  language l (its index in config.data.languages) owns ids [l*N, (l+1)*N),
  N = config.model.text.words_per_language;
  l*N + 0 is its padding, l*N + 1 its unknown word, l*N + 2 + k its k-th
  most frequent training word.

So a text tower reads the language of a sentence as `ids[:, 0] // N` (padding
rows too), and the evaluators need no language argument. Words: the same
normalisation as the wordpiece tokenizer (NFKC_Casefold, accents kept), then
BERT's basic splitting (whitespace, punctuation, one word per CJK ideograph).
A word seen fewer than config.data.word_min_count times in its language's
training text, or beyond the N - 2 most frequent, is unknown (MULE used FastText
vocabularies; Kádár et al.: fewer than 4 times -> UNK).

config.data.word_vocab_union = True gives ONE block for every language instead
(Kádár et al.: "a single word embedding matrix containing the union of all
words in all considered languages"): ids [0, N), a word's count is summed
over the languages, and a word spelt the same in two languages is one row.
The file then holds one word list under the key UNION, and the tokenizer needs
no language index.

The text comes from the training sources of every task the system configures
with sources, those at weight 0 included (the record kind's `text_langs`: which
language field names each text field's language), up to
training_text.RECORDS_PER_SOURCE records each; process 0 writes workdir/words.json.
A pre-training phase (SMALR's latent vocabulary, MULE's LP) trains on sentence
pairs with the image-caption task at weight 0, and its words.json is the later
phase's vocabulary (config.data.word_vocab_path): it holds the caption
languages too, where pairs alone left Flickr8k's zh and ar without a word.
"""

import collections
import json
from typing import Dict, Iterator, Optional, Sequence, Tuple

import jax
import numpy as np
import tensorflow as tf
from absl import logging
from etils import epath
from jax.experimental import multihost_utils
from tensorflow_text.python.ops.bert_tokenizer import BasicTokenizer

from mural import config_lib
from mural.data import tokenizer as wordpiece
from mural.data import training_text

PAD, UNK = 0, 1  # Offsets inside each language's block.
FIRST_WORD = 2
FILE_NAME = "words.json"
UNION = "*"  # The one block's key in a union vocabulary's file.

_splitter = BasicTokenizer(lower_case=False, keep_whitespace=False, normalization_form=None)


def split_words(texts: tf.Tensor) -> tf.RaggedTensor:
  """[N] strings -> ragged [N, (words)] normalised words."""
  return _splitter.tokenize(wordpiece.normalize(texts))


def training_texts(config, tasks: Sequence) -> Iterator[Tuple[str, bytes]]:
  """(language code, text) of the records the wordpiece vocab learns from too (training_text)."""
  for task in tasks:
    if not getattr(task.input, "text_langs", ()):
      raise ValueError(f"task {task.name!r}: record kind {task.input.name!r} names no language per "
                       f"text field (text_langs), which a per-language word vocabulary needs")
  for task, record in training_text.training_records(config, tasks):
    for text_field, lang_field in task.input.text_langs:
      yield record[lang_field].decode().strip().lower(), record[text_field]


def count_words(texts: Sequence[Tuple[str, bytes]], languages: Sequence[str]) -> Dict[str, collections.Counter]:
  """Word counts per language (texts in other languages are ignored)."""
  counts = {l: collections.Counter() for l in languages}
  by_lang = collections.defaultdict(list)
  for lang, text in texts:
    if lang in counts:
      by_lang[lang].append(text)
  for lang, items in by_lang.items():
    for start in range(0, len(items), 4096):
      words = split_words(tf.constant(items[start:start + 4096])).flat_values.numpy()
      counts[lang].update(w.decode("utf-8", "replace") for w in words)
  return counts


def choose_words(counts: Dict[str, collections.Counter], words_per_language: int,
                 min_count: int) -> Dict[str, list]:
  """Per language its words by falling count (ties by the word), at most N - 2, each seen >= min_count."""
  return {lang: [w for w, n in sorted(c.items(), key=lambda wn: (-wn[1], wn[0])) if n >= min_count]
          [:words_per_language - FIRST_WORD] for lang, c in counts.items()}


def union_counts(counts: Dict[str, collections.Counter]) -> Dict[str, collections.Counter]:
  """{UNION: every language's counts summed} (one block for all languages)."""
  return {UNION: sum(counts.values(), collections.Counter())}


def save(path, languages: Sequence[str], words: Dict[str, list]) -> None:
  """words: lang -> its words, or {UNION: words} for a union vocabulary."""
  path = epath.Path(path)
  path.parent.mkdir(parents=True, exist_ok=True)
  tmp = path.parent / (path.name + ".tmp")
  union = set(words) == {UNION}
  data = {"languages": list(languages), "union": union,
          "words": words if union else {l: words[l] for l in languages}}
  tmp.write_text(json.dumps(data, ensure_ascii=False, indent=0))
  tmp.rename(path)


class WordTokenizer:
  """(texts, language indices) -> fixed-length (ids, mask) in the block layout; usable in tf.data."""

  def __init__(self, path: str, languages: Sequence[str], words_per_language: int, max_len: int,
               union: bool = False):
    data = json.loads(epath.Path(path).read_text())
    if list(data["languages"]) != list(languages):
      raise config_lib.ConfigError(
          f"config.data.languages: {list(languages)} differs from the languages of the word vocabulary "
          f"{path} ({data['languages']}); use a new workdir")
    if bool(data.get("union", False)) != union:
      raise config_lib.ConfigError(
          f"config.data.word_vocab_union: {union}, but the word vocabulary {path} is "
          f"{'a union' if data.get('union') else 'per language'}; use a new workdir")
    n = words_per_language
    self.vocab_path, self.max_len, self.words_per_language, self.union = str(path), max_len, n, union
    self.languages = list(languages)
    blocks = [UNION] if union else self.languages  # Block b owns ids [b*N, (b+1)*N).
    self.words = {l: list(data["words"][l]) for l in blocks}
    empty = [l for l in blocks if not self.words[l]]
    if empty:
      logging.warning("The word vocabulary %s has no word of %s: every word of theirs reads as unknown "
                      "(no training text in that language%s).", path, ", ".join(empty),
                      "" if union else "; data.word_vocab_path from a run of other data?")
    too_many = {l: len(w) for l, w in self.words.items() if len(w) > n - FIRST_WORD}
    if too_many:
      raise config_lib.ConfigError(
          f"config.model.text.words_per_language: {n} rows hold {n - FIRST_WORD} words, the vocabulary "
          f"{path} has {too_many}")
    keys, ids = [], []
    for l, lang in enumerate(blocks):
      keys += [f"{lang}\t{w}" for w in self.words[lang]]
      ids += [l * n + FIRST_WORD + k for k in range(len(self.words[lang]))]
    self._codes = tf.constant(blocks)
    init = tf.lookup.KeyValueTensorInitializer(tf.constant(keys, tf.string), tf.constant(ids, tf.int64))
    self._table = tf.lookup.StaticHashTable(init, default_value=-1)

  @property
  def trackables(self) -> list:
    """The TensorFlow objects a SavedModel that tokenizes with this must track."""
    return [self._table]

  @property
  def needs_language(self) -> bool:
    """Whether tokenize needs each text's language (per-language blocks; a union needs none)."""
    return not self.union

  @property
  def vocab_size(self) -> int:
    return len(self.words) * self.words_per_language

  def tokenize(self, strings: tf.Tensor, langs: Optional[tf.Tensor] = None):
    """[N] strings, [N] int language indices (ignored by a union vocabulary, which needs none)
    -> (ids int32 [N, max_len], mask int32 [N, max_len])."""
    strings = tf.convert_to_tensor(strings, tf.string)
    if self.union:
      langs = tf.zeros(tf.shape(strings), tf.int64)  # Every text reads the one block.
    elif langs is None:
      raise ValueError("WordTokenizer.tokenize needs each text's language index (langs=)")
    langs = tf.cast(tf.convert_to_tensor(langs), tf.int64)
    scalar = strings.shape.rank == 0
    if scalar:
      strings, langs = strings[None], tf.reshape(langs, [1])
    words = split_words(strings)[:, :self.max_len]
    rows = words.value_rowids()
    word_lang = tf.gather(langs, rows)
    keys = tf.strings.join([tf.gather(self._codes, word_lang), words.flat_values], separator="\t")
    found = self._table.lookup(keys)
    flat = tf.where(found < 0, word_lang * self.words_per_language + UNK, found)
    ids = words.with_flat_values(flat).to_tensor(default_value=-1, shape=[None, self.max_len])
    mask = tf.cast(ids >= 0, tf.int32)
    ids = tf.where(ids >= 0, ids, langs[:, None] * self.words_per_language + PAD)
    ids = tf.cast(ids, tf.int32)
    return (ids[0], mask[0]) if scalar else (ids, mask)

  def __call__(self, strings, langs=None):
    return self.tokenize(strings, langs)


def tokenizer(config, tasks: Sequence, workdir: str, learn_missing: bool = True) -> WordTokenizer:
  """config.data.word_vocab_path, else workdir/words.json (learned once, by process 0: `learn`),
  as a tokenizer."""
  t = config.model.text
  union = bool(config.data.get("word_vocab_union", False))
  given = config.data.get("word_vocab_path", "")
  if given:  # E.g. the pre-training run's, so a warm start keeps every word's row.
    if not epath.Path(given).exists():
      raise FileNotFoundError(f"config.data.word_vocab_path: {given} does not exist")
    return WordTokenizer(given, config.data.languages, t.words_per_language, t.max_len, union)
  path = epath.Path(workdir) / FILE_NAME
  if not path.exists() and not learn_missing:
    raise FileNotFoundError(f"{path} does not exist: the word vocabulary is learned by --mode=train")
  if jax.process_index() == 0:
    learn(config, tasks, workdir)
  if jax.process_count() > 1:
    multihost_utils.sync_global_devices("mural_word_vocab")
  return WordTokenizer(str(path), config.data.languages, t.words_per_language, t.max_len, union)


def learn(config, tasks: Sequence, workdir: str) -> str:
  """workdir/words.json from the training text of `tasks` (system.vocabulary_tasks: the active
  ones and the system's weight-0 tasks with sources; the module's docstring says why), unless it
  exists. Touches no JAX device."""
  if config.data.get("word_vocab_path", ""):
    return config.data.word_vocab_path
  path = epath.Path(workdir) / FILE_NAME
  if not path.exists():
    languages = list(config.data.languages)
    logging.info("Learning word vocabularies (%s) into %s from tasks %s.", languages, path,
                 [t.name for t in tasks])
    counts = count_words(list(training_texts(config, tasks)), languages)
    if config.data.get("word_vocab_union", False):
      counts = union_counts(counts)
    words = choose_words(counts, config.model.text.words_per_language, config.data.word_min_count)
    save(path, languages, words)
    logging.info("Words per language: %s.", {l: len(w) for l, w in words.items()})
  return str(path)


def language_of(ids: np.ndarray, words_per_language: int) -> np.ndarray:
  """Language index of each row of block-layout ids [N, L] (host-side helper for tests/tools)."""
  return np.asarray(ids)[:, 0] // words_per_language
