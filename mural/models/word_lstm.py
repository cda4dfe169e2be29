"""Word-embedding + LSTM text tower (MULE, Kim et al. 2020; reusable by SMALR).

  ids [B, T] in the per-language block layout (mural/data/word_vocab.py:
  language l owns rows [l*N, (l+1)*N), so language = ids[:, 0] // N)
  -> word vectors (one table; each language its own rows; word_dim = 300)
  -> the language's own FC into the shared space (MULE features, mule_dim = 512)
  -> u = mean of the MULE features over the words (MULE's sentence in MULE space)
  -> LSTM (lstm_dim = 1024) over the MULE features, its hidden state at the
     sentence's last word (masks respected)
  -> FC to output_dim (512): s, the multimodal sentence embedding.
Returns (s, {'mule': u, 'lang': language index [B]}).

Kádár et al. (2018) is the same tower with three switches: `cell='gru'` (a
flax.linen.GRUCell run by nn.RNN; its state at each sentence's true length),
`lang_fc=False` (the word vectors go straight into the RNN; with a union
vocabulary there is one block, so u is the mean word vector) and
`output_fc=False` (the RNN's last state is the embedding: output_dim =
lstm_dim, the RNN's width for either cell).

`branches`: 'shared' is MULE (one LSTM and FC for every language);
'per_language' is PARALLEL-EmbN (Gella et al. 2017 as adapted in MULE: each
language its own LSTM and FC). Per-language weights are stacked [L, ...] and
applied with one grouped matmul over rows sorted by language
(multilingual.grouped_matmul), never a loop per language.

Word vectors start random (normal, std 1 / sqrt(word_dim)) or, when
`embeddings_path` is given, from FastText `.vec` text files (one per
language: the path with '{lang}' replaced by the code); words missing from a
file keep their random row.
"""

import itertools
import os
from typing import Any, Optional, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from mural import config_lib
from mural import lazy_import
from mural.models.multilingual import grouped_matmul

word_vocab = lazy_import.module("mural.data.word_vocab")  # TensorFlow: for reading .vec files only.

BRANCHES = ("shared", "per_language")
CELLS = ("lstm", "gru")


def _param(module, name, init, names, shape, dtype):
  return module.param(name, nn.with_logical_partitioning(init, names), shape, dtype)


class WordLstmTower(nn.Module):
  """See the module docstring."""
  num_languages: int
  words_per_language: int
  word_dim: int = 300
  mule_dim: int = 512
  lstm_dim: int = 1024
  output_dim: int = 512
  branches: str = "shared"
  cell: str = "lstm"  # lstm | gru (shared branch only).
  lang_fc: bool = True  # False: no per-language FC; the words feed the RNN (mule_dim unused).
  output_fc: bool = True  # False: s is the RNN's last state (output_dim must equal lstm_dim).
  word_init: Optional[np.ndarray] = None  # [L * N, word_dim] initial table (FastText), or None.
  dtype: Any = jnp.float32
  param_dtype: Any = jnp.float32

  def languages_of(self, ids):
    return jnp.clip(ids[:, 0] // self.words_per_language, 0, self.num_languages - 1)

  @nn.compact
  def __call__(self, ids, mask, train: bool = False):
    del train  # No dropout, no batch statistics.
    b, t = ids.shape
    lang = self.languages_of(ids)
    rows = self.num_languages * self.words_per_language
    if self.word_init is not None:
      table_init = lambda *_: jnp.asarray(self.word_init, self.param_dtype)
    else:
      table_init = nn.initializers.normal(self.word_dim ** -0.5)
    table = _param(self, "token_embed", table_init, ("vocab", "token_embed"), (rows, self.word_dim),
                   self.param_dtype)
    words = jnp.take(table, ids, axis=0).astype(self.dtype)
    weights = mask.astype(jnp.float32)[..., None]
    mean = lambda x: jnp.sum(x.astype(jnp.float32) * weights, 1) / jnp.maximum(jnp.sum(weights, 1), 1.0)
    if not self.lang_fc:
      return sentence_gru(self, words, mask, self.lstm_dim, self.output_dim if self.output_fc else 0,
                          self.dtype, self.param_dtype), {"mule": mean(words), "lang": lang}

    # Each language's own FC into the MULE space.
    kernel = _param(self, "lang_fc_kernel", nn.initializers.lecun_normal(batch_axis=(0,)),
                    ("lang", "token_embed", "embed"), (self.num_languages, self.word_dim, self.mule_dim),
                    self.param_dtype)
    bias = _param(self, "lang_fc_bias", nn.initializers.zeros, ("lang", "embed"),
                  (self.num_languages, self.mule_dim), self.param_dtype)
    token_lang = jnp.repeat(lang, t)
    mule = grouped_matmul(words.reshape(b * t, -1), token_lang, kernel.astype(self.dtype))
    mule = mule.reshape(b, t, -1) + bias[lang][:, None].astype(self.dtype)
    u = mean(mule)
    if self.cell == "gru":
      return sentence_gru(self, mule, mask, self.lstm_dim, self.output_dim if self.output_fc else 0,
                          self.dtype, self.param_dtype), {"mule": u, "lang": lang}

    # The LSTM and the FC to the multimodal space: one branch, or one per language.
    g = 1 if self.branches == "shared" else self.num_languages
    s = sentence_lstm(self, mule, mask, lang if g > 1 else jnp.zeros_like(lang), g, self.lstm_dim,
                      self.output_dim, self.dtype, self.param_dtype)
    return s, {"mule": u, "lang": lang}


def sentence_gru(module: nn.Module, features, mask, gru_dim: int, output_dim: int = 0,
                 dtype=jnp.float32, param_dtype=jnp.float32):
  """flax.linen.GRUCell over features [B, T, D], its state at each row's last word (nn.RNN's
  seq_lengths: past a row's length its carry stays) -> FC to output_dim, or the state itself when
  output_dim is 0 (Kádár et al.: the GRU's final state is the sentence). Submodules of `module`:
  'gru', the cell (PyTorch's GRU gates: ir/iz/in with bias, hr/hz without, hn with) and 'out'."""
  cell = nn.GRUCell(
      gru_dim, dtype=dtype, param_dtype=param_dtype, name="gru",
      kernel_init=nn.with_logical_partitioning(nn.initializers.lecun_normal(), ("embed", "mlp")),
      recurrent_kernel_init=nn.with_logical_partitioning(nn.initializers.orthogonal(), ("kv", "mlp")),
      bias_init=nn.with_logical_partitioning(nn.initializers.zeros, ("mlp",)))
  del module  # The submodules below attach to the module whose compact method is running.
  last, _ = nn.RNN(cell, return_carry=True)(features, seq_lengths=jnp.sum(mask, -1))
  if output_dim:
    last = nn.Dense(output_dim, dtype=dtype, param_dtype=param_dtype, name="out",
                    kernel_init=nn.with_logical_partitioning(nn.initializers.lecun_normal(), ("mlp", "proj")),
                    bias_init=nn.with_logical_partitioning(nn.initializers.zeros, ("proj",)))(last)
  return last


def sentence_lstm(module: nn.Module, features, mask, branch, g: int, lstm_dim: int, output_dim: int,
                  dtype=jnp.float32, param_dtype=jnp.float32):
  """LSTM over features [B, T, D] (masks respected), its hidden state at the last word -> FC:
  [B, output_dim]. Its parameters live in `module` (stacked [g, ...]; row r uses branch[r]).
  The sentence half of WordLstmTower; SMALR's hybrid-embedding tower shares it."""
  b, t = mask.shape
  h = lstm_dim
  w_in = _param(module, "lstm_input_kernel", nn.initializers.lecun_normal(batch_axis=(0,)),
                ("branch", "embed", "mlp"), (g, features.shape[-1], 4 * h), param_dtype)
  w_rec = _param(module, "lstm_recurrent_kernel", nn.initializers.orthogonal(column_axis=-1),
                 ("branch", "kv", "mlp"), (g, h, 4 * h), param_dtype)
  # Gate order i, f, g, o; forget-gate bias 1 (Jozefowicz et al. 2015).
  b_lstm = _param(module, "lstm_bias",
                  lambda _, shape, dtype: jnp.zeros(shape, dtype).at[:, h:2 * h].set(1.0),
                  ("branch", "mlp"), (g, 4 * h), param_dtype)
  x_proj = grouped_matmul(features.reshape(b * t, -1), jnp.repeat(branch, t), w_in.astype(dtype))
  x_proj = x_proj.reshape(b, t, 4 * h) + b_lstm[branch][:, None].astype(dtype)
  w_rec = w_rec.astype(dtype)

  def step(carry, inputs):
    c, hid = carry
    z_x, m = inputs
    z = z_x + grouped_matmul(hid, branch, w_rec)
    i, f, gg, o = jnp.split(z.astype(jnp.float32), 4, axis=-1)
    c_new = jax.nn.sigmoid(f) * c + jax.nn.sigmoid(i) * jnp.tanh(gg)
    h_new = (jax.nn.sigmoid(o) * jnp.tanh(c_new)).astype(dtype)
    keep = m[:, None] > 0  # Past the sentence's end the state stays: the last word's state.
    return (jnp.where(keep, c_new, c), jnp.where(keep, h_new, hid)), None

  init = (jnp.zeros((b, h), jnp.float32), jnp.zeros((b, h), dtype))
  (_, last), _ = jax.lax.scan(step, init, (x_proj.swapaxes(0, 1), mask.swapaxes(0, 1)))

  w_out = _param(module, "out_kernel", nn.initializers.lecun_normal(batch_axis=(0,)),
                 ("branch", "mlp", "proj"), (g, h, output_dim), param_dtype)
  b_out = _param(module, "out_bias", nn.initializers.zeros, ("branch", "proj"), (g, output_dim),
                 param_dtype)
  s = grouped_matmul(last, branch, w_out.astype(dtype)) + b_out[branch].astype(dtype)
  return s


def load_fasttext(path_pattern: str, languages: Sequence[str], words: dict, words_per_language: int,
                  word_dim: int, seed: int = 0):
  """([L * N, word_dim] table, {lang: vectors found}): random rows, overwritten by the `.vec`
  vector of each vocabulary word.

  path_pattern: a path with '{lang}' (e.g. 'cc.{lang}.300.vec'); a language whose
  file does not exist keeps random rows (logged by the caller). words: lang ->
  word list of the vocabulary (word k has row l*N + 2 + k).
  """
  rng = np.random.default_rng(seed)
  table = rng.normal(0.0, word_dim ** -0.5, (len(languages) * words_per_language, word_dim)).astype(np.float32)
  found = {}
  for l, lang in enumerate(languages):
    path = path_pattern.replace("{lang}", lang)
    found[lang] = 0
    if not os.path.exists(path):
      continue
    row_of = {w: l * words_per_language + word_vocab.FIRST_WORD + k for k, w in enumerate(words.get(lang, []))}
    with open(path, encoding="utf-8", errors="replace") as f:
      first = f.readline()
      lines = f if len(first.split()) == 2 else itertools.chain([first], f)  # Optional 'count dim' header.
      checked = False
      for number, line in enumerate(lines, 2 if lines is f else 1):
        # Only the vocabulary's lines are parsed (a few % of FastText's 2M), and the first vector.
        word, _, vector = line.rstrip().partition(" ")
        row = row_of.get(word)
        if row is None and checked:
          continue
        values = vector.split(" ") if vector else []
        if len(values) != word_dim:
          if values:
            raise config_lib.ConfigError(
                f"config.model.text.embeddings_path: {path} has {len(values)}-d vectors, "
                f"model.text.word_dim is {word_dim}")
          continue
        checked = True
        if row is not None:
          try:
            table[row] = np.asarray(values, np.float32)
          except ValueError:
            raise config_lib.ConfigError(f"config.model.text.embeddings_path: {path} line {number} "
                                         f"({word!r}) holds a value that is not a number") from None
          found[lang] += 1
  return table, found


def from_config(text_config, dtype, param_dtype) -> WordLstmTower:
  """config.model.text (+ num_languages, set by the system from data.languages) -> the tower."""
  t = text_config
  if t.branches not in BRANCHES:
    raise config_lib.ConfigError(f"config.model.text.branches: {t.branches!r} not in {BRANCHES}")
  cell, lang_fc, output_fc = t.get("cell", "lstm"), bool(t.get("lang_fc", True)), bool(t.get("output_fc", True))
  if cell not in CELLS:
    raise config_lib.ConfigError(f"config.model.text.cell: {cell!r} not in {CELLS}")
  if cell == "gru" and t.branches != "shared":
    raise config_lib.ConfigError(f"config.model.text.branches: {t.branches!r} needs cell 'lstm' (a GRU is shared)")
  if not lang_fc and cell != "gru":
    raise config_lib.ConfigError("config.model.text.lang_fc: False needs config.model.text.cell 'gru'")
  if not output_fc and cell != "gru":
    raise config_lib.ConfigError("config.model.text.output_fc: False needs config.model.text.cell 'gru'")
  if not output_fc and int(t.output_dim) != int(t.lstm_dim):
    raise config_lib.ConfigError(
        f"config.model.text.output_dim: {t.output_dim}, but without the output FC (output_fc=False) the "
        f"embedding is the RNN's state, lstm_dim {t.lstm_dim}")
  return WordLstmTower(num_languages=int(t.num_languages), words_per_language=int(t.words_per_language),
                       word_dim=int(t.word_dim), mule_dim=int(t.mule_dim), lstm_dim=int(t.lstm_dim),
                       output_dim=int(t.output_dim), branches=t.branches, cell=cell, lang_fc=lang_fc,
                       output_fc=output_fc, dtype=dtype, param_dtype=param_dtype)
