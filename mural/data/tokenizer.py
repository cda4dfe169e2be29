"""Multilingual wordpiece tokenizer (tensorflow_text), usable inside tf.data.

Normalisation (the same for vocab learning and tokenizing, see `normalize`):
`tensorflow_text.case_fold_utf8`, i.e. Unicode NFKC_Casefold: NFKC (full-width
forms, ligatures and compatibility characters fold to their plain form,
composed and decomposed accents become the same string) plus full case folding
('Straße' -> 'strasse'). Accents and other combining marks are KEPT: BERT's
`lower_case=True` strips every nonspacing mark after NFD, which merges Czech
'byt'/'být' and deletes Devanagari vowel signs and viramas (Hindi 'लड़की'
would lose its matras) and Arabic harakat. NFKC_Casefold also drops default
ignorable code points (e.g. ZWJ/ZWNJ, soft hyphen).

Word splitting and wordpieces: `tensorflow_text.BertTokenizer` with
`lower_case=False` (we fold case ourselves): splits on whitespace and
punctuation, makes every CJK ideograph its own word (Japanese kana runs and
Hangul stay whole words and are split by wordpiece), then greedy longest-match
wordpiece with '##' continuation pieces. `split_unknown_characters=True`: a
character missing from the vocab becomes one [UNK] piece and the rest of the
word is still tokenized (instead of the whole word becoming [UNK]).

Ids: [PAD]=0, [UNK]=1, [CLS]=2, [SEP]=3, [MASK]=4; every sequence is
[CLS] pieces... [SEP] [PAD]..., truncated so that [SEP] stays last.

A vocabulary that came with a public BERT checkpoint (mural.import_weights) is
tokenized as that checkpoint's own tokenizer does, so its token table means what it
was trained to mean: `normalization` 'bert_cased' or 'bert_uncased' (NORMALIZATIONS)
applies BERT's text cleaning (control and format characters removed, every Unicode
space a space) and, uncased, lower-casing with accents stripped (NFD, nonspacing marks
removed); the special tokens are wherever that vocabulary has them, and a word with a
character the vocabulary lacks is one [UNK], as BERT's wordpiece does. Words over
MAX_BYTES_PER_BERT_WORD bytes are one [UNK] (BERT's tokenizers count 100 characters:
the two differ only on words of over 100 bytes and at most 100 characters).
"""

from __future__ import annotations  # tf.Tensor annotations are not evaluated at import.

import collections
import os
from typing import Iterable, Optional, Sequence, Union

from mural import config_lib
from mural import lazy_import

# The reserved ids are read where TensorFlow is not needed (describe).
tf = lazy_import.module("tensorflow")
tft = lazy_import.module("tensorflow_text")
bert_vocab = lazy_import.module("tensorflow_text.tools.wordpiece_vocab.bert_vocab_from_dataset")

PAD, UNK, CLS, SEP, MASK = "[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"
RESERVED_TOKENS = (PAD, UNK, CLS, SEP, MASK)  # Their ids are their positions.
PAD_ID, UNK_ID, CLS_ID, SEP_ID, MASK_ID = range(len(RESERVED_TOKENS))
SUFFIX = "##"
MAX_BYTES_PER_WORD = 200  # Longer words become [UNK] (BERT uses 100; kana runs are long).
MAX_BYTES_PER_BERT_WORD = 100
NORMALIZATIONS = config_lib.TEXT_NORMALIZATIONS

# The BertTokenizer options shared by vocab learning and tokenizing.
_BERT_PARAMS = dict(lower_case=False, keep_whitespace=False, normalization_form=None)


def normalize(texts: tf.Tensor, normalization: str = "casefold") -> tf.Tensor:
  """`normalization` of texts (NORMALIZATIONS; see the module docstring); graph-mode safe."""
  if normalization == "casefold":
    return tft.case_fold_utf8(texts)
  # BERT's cleaning: tab, newline, return and every Unicode space separate words; other
  # control, format, unassigned and private-use characters and U+FFFD are removed.
  texts = tf.strings.regex_replace(texts, r"[\t\n\r]|\p{Zs}", " ")
  texts = tf.strings.regex_replace(texts, r"\p{C}|\x{FFFD}", "")
  if normalization == "bert_uncased":
    texts = tft.normalize_utf8(tf.strings.lower(texts, encoding="utf-8"), "NFD")
    texts = tf.strings.regex_replace(texts, r"\p{Mn}", "")
  return texts


def check_normalization(normalization: str) -> str:
  if normalization not in NORMALIZATIONS:
    raise ValueError(f"text normalization {normalization!r} not in {NORMALIZATIONS}")
  return normalization


def _as_dataset(texts: Union[tf.data.Dataset, Iterable[str]]) -> tf.data.Dataset:
  if isinstance(texts, tf.data.Dataset):
    spec = texts.element_spec
    if not isinstance(spec, tf.TensorSpec) or spec.dtype != tf.string:
      raise ValueError(f"build_vocab: the dataset must hold tf.string tensors, got element_spec {spec}")
    return texts.unbatch() if spec.shape.rank else texts
  if isinstance(texts, (str, bytes)):
    raise ValueError("build_vocab: texts must be an iterable of strings, not one string")
  texts = list(texts)
  bad = next((i for i, t in enumerate(texts) if not isinstance(t, (str, bytes))), None)
  if bad is not None:
    raise ValueError(f"build_vocab: texts[{bad}] is a {type(texts[bad]).__name__}, not a string")
  # One tensor, not from_generator: a Python call per text made learning the demo's vocab 8x slower.
  return tf.data.Dataset.from_tensor_slices(tf.constant(texts, tf.string))


def build_vocab(texts: Union[tf.data.Dataset, Iterable[str]],
                vocab_size: int,
                path: str,
                *,
                max_unique_chars: int = 3000,
                lower_thresh: int = 2,
                batch_size: int = 1024) -> list:
  """Learns a wordpiece vocab of at most `vocab_size` tokens and writes it to `path`.

  `texts`: a tf.data.Dataset of tf.string (scalars or batches) or a Python
  iterable of str. `max_unique_chars`: the alphabet size kept as single
  character pieces; CJK needs thousands (BERT's 1000 default drops rare
  ideographs, and words holding them, from learning). `lower_thresh`: the
  smallest token count the learner's threshold search may reach.
  Returns the vocab (a list of str, reserved tokens first).
  """
  if vocab_size <= len(RESERVED_TOKENS):
    raise ValueError(f"build_vocab: vocab_size {vocab_size} leaves no room beyond the reserved tokens")
  ds = _as_dataset(texts).batch(batch_size).map(normalize)
  vocab = bert_vocab.bert_vocab_from_dataset(
      ds, vocab_size=vocab_size, reserved_tokens=list(RESERVED_TOKENS),
      bert_tokenizer_params=_BERT_PARAMS,
      learn_params=dict(max_unique_chars=max_unique_chars, lower_thresh=lower_thresh))
  if len(vocab) <= len(RESERVED_TOKENS):
    raise ValueError("build_vocab: the texts hold no words (empty input?)")
  # The learner can overshoot vocab_size (it adds '##c' for every character c).
  # Its list is reserved tokens, then characters, then learned pieces by falling
  # count (with the '##c' among them): drop the rarest learned multi-character
  # pieces; every 'c' / '##c' stays, so every word can still back off to them.
  if len(vocab) > vocab_size:
    fixed = [i < len(RESERVED_TOKENS) or len(t.removeprefix(SUFFIX)) == 1 for i, t in enumerate(vocab)]
    budget = vocab_size - sum(fixed)
    if budget < 0:
      raise ValueError(f"build_vocab: {sum(fixed) - len(RESERVED_TOKENS)} character pieces alone exceed "
                       f"vocab_size {vocab_size}; raise vocab_size or lower max_unique_chars")
    kept = []
    for tok, is_fixed in zip(vocab, fixed):
      if is_fixed or budget > 0:
        kept.append(tok)
        budget -= 0 if is_fixed else 1
    vocab = kept
  save_vocab(vocab, path)
  return vocab


def save_vocab(vocab: Sequence[str], path: str) -> None:
  """One token per line, id = line number (written atomically)."""
  for tok in vocab:
    if not tok or "\n" in tok or tok != tok.strip():
      raise ValueError(f"save_vocab: token {tok!r} cannot be stored one per line")
  parent = os.path.dirname(path)
  if parent:
    tf.io.gfile.makedirs(parent)
  tmp = path + ".tmp"
  with tf.io.gfile.GFile(tmp, "w") as f:
    f.write("".join(t + "\n" for t in vocab))
  tf.io.gfile.rename(tmp, path, overwrite=True)


def load_vocab(path: str, reserved_at_their_ids: bool = True) -> list:
  """Reads a vocab file and checks the reserved tokens sit at their ids (or, for a public
  BERT vocabulary, `reserved_at_their_ids=False`, that [PAD], [UNK], [CLS], [SEP] are in it)."""
  if not tf.io.gfile.exists(path):
    raise ValueError(f"vocab file {path} does not exist")
  with tf.io.gfile.GFile(path, "r") as f:
    vocab = [line.rstrip("\n") for line in f]
  while vocab and vocab[-1] == "":
    vocab.pop()
  for i, tok in enumerate(RESERVED_TOKENS if reserved_at_their_ids else ()):
    if i >= len(vocab) or vocab[i] != tok:
      got = vocab[i] if i < len(vocab) else "<end of file>"
      raise ValueError(f"vocab file {path}: line {i + 1} must be {tok}, got {got!r}")
  dupes = [t for t, n in collections.Counter(vocab).items() if n > 1]
  if dupes:
    raise ValueError(f"vocab file {path}: duplicate tokens {dupes[:5]}")
  if "" in vocab:
    raise ValueError(f"vocab file {path}: empty line {vocab.index('') + 1}")
  missing = [t for t in RESERVED_TOKENS[:4] if t not in vocab]
  if missing:
    raise ValueError(f"vocab file {path}: no {', '.join(missing)} token")
  return vocab


class Tokenizer:
  """Text -> fixed-length (ids, mask); built once, then called in tf.data maps."""

  def __init__(self, vocab_path: str, max_len: int, normalization: str = "casefold"):
    if max_len < 3:
      raise ValueError(f"Tokenizer: max_len {max_len} must be >= 3 ([CLS] token [SEP])")
    self.vocab_path = vocab_path
    self.max_len = max_len
    self.normalization = check_normalization(normalization)
    own = normalization == "casefold"
    self.vocab = load_vocab(vocab_path, reserved_at_their_ids=own)
    self._ids = {t: i for i, t in enumerate(self.vocab)}
    self.pad_id, self.unk_id, self.cls_id, self.sep_id = (self._ids[t] for t in RESERVED_TOKENS[:4])
    init = tf.lookup.KeyValueTensorInitializer(
        tf.constant(self.vocab), tf.range(len(self.vocab), dtype=tf.int64))
    self._table = tf.lookup.StaticHashTable(init, default_value=self.unk_id)
    self._bert = tft.BertTokenizer(
        self._table, suffix_indicator=SUFFIX,
        max_bytes_per_word=MAX_BYTES_PER_WORD if own else MAX_BYTES_PER_BERT_WORD,
        token_out_type=tf.int64, unknown_token=UNK, split_unknown_characters=own,
        **_BERT_PARAMS)
    # Traced once per Tokenizer: every tf.data map (and export graph) that tokenizes calls this
    # one graph function instead of tracing the wordpiece ops again (~0.6 CPU-s per pipeline).
    self._tokenize_batch = tf.function(self._tokenize_batch_body, autograph=False,
                                       input_signature=[tf.TensorSpec([None], tf.string)])

  needs_language = False  # One vocabulary for every language (word_vocab.WordTokenizer may not).

  @property
  def trackables(self) -> list:
    """The TensorFlow objects a SavedModel that tokenizes with this must track."""
    return [self._table, self._bert]

  @property
  def vocab_size(self) -> int:
    return len(self.vocab)

  def wordpieces(self, strings: tf.Tensor) -> tf.RaggedTensor:
    """[N] strings -> ragged [N, (pieces)] int64 ids, no specials, no truncation."""
    return self._bert.tokenize(normalize(strings, self.normalization)).merge_dims(-2, -1)

  def tokenize(self, strings: tf.Tensor, langs=None):
    """[N] (or scalar) tf.string -> (ids int32 [N, max_len], mask int32 [N, max_len]).

    Graph-mode safe (tf.data map, tf.function). mask is 1 on [CLS], the
    pieces and [SEP], 0 on padding. `langs` (the texts' language indices) is
    ignored: one wordpiece vocab serves every language (per-language word
    tokenizers, mural/data/word_vocab.py, read it).
    """
    del langs
    strings = tf.convert_to_tensor(strings, dtype=tf.string)
    scalar = strings.shape.rank == 0
    if scalar:
      strings = strings[tf.newaxis]
    elif strings.shape.rank != 1:
      raise ValueError(f"Tokenizer.tokenize: expected a scalar or [N] strings, got shape {strings.shape}")
    ids, mask = self._tokenize_batch(strings)
    if scalar:
      return ids[0], mask[0]
    return ids, mask

  def _tokenize_batch_body(self, strings: tf.Tensor):
    """[N] tf.string -> (ids, mask) int32 [N, max_len]."""
    pieces = self.wordpieces(strings)[:, :self.max_len - 2]
    n = tf.shape(strings, out_type=tf.int64)[:1]
    cls = tf.fill(tf.concat([n, [1]], 0), tf.constant(self.cls_id, tf.int64))
    sep = tf.fill(tf.concat([n, [1]], 0), tf.constant(self.sep_id, tf.int64))
    seq = tf.concat([cls, pieces, sep], axis=1)
    ids, mask = tft.pad_model_inputs(seq, max_seq_length=self.max_len, pad_value=self.pad_id)
    ids, mask = tf.cast(ids, tf.int32), tf.cast(mask, tf.int32)
    ids.set_shape([None, self.max_len])
    mask.set_shape([None, self.max_len])
    return ids, mask

  def __call__(self, strings, langs=None):
    return self.tokenize(strings, langs)

  def detokenize(self, ids, mask=None) -> list:
    """ids [N, L] -> N strings of space-joined words, special tokens dropped (for inspection)."""
    ids = tf.cast(ids, tf.int64)
    special = [self._ids[t] for t in RESERVED_TOKENS if t in self._ids and t != UNK]
    keep = tf.reduce_all(tf.not_equal(ids[..., None], tf.constant(special, tf.int64)), axis=-1)
    if mask is not None:
      keep = tf.logical_and(keep, tf.cast(mask, tf.bool))
    words = self._bert.detokenize(tf.ragged.boolean_mask(ids, keep))
    return [" ".join(w.decode("utf-8") for w in row) for row in words.to_list()]

  def id_to_token(self, i: int) -> str:
    return self.vocab[i]

  def token_to_id(self, token: str) -> Optional[int]:
    return self._ids.get(token)
