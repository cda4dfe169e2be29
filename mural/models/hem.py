"""SMALR's text side (Burns et al., ECCV 2020): the Hybrid Embedding Model and its pre-training.

HybridEmbeddingTower ('hem_lstm'), ids in the per-language block layout of
mural/data/word_vocab.py (language l owns ids [l*N, (l+1)*N); offset 0 is its
padding, 1 its unknown word, 2 + k its k-th most frequent word):
  - the language's padding, unknown word and top K = specific_words words keep
    a language-specific vector (specific_dim = 50: FastText 300 -> PCA 50 when
    vectors are given, learned otherwise) -> the language's own FC -> hem_dim;
  - every other word is hard-assigned to one token of a shared,
    language-agnostic latent vocabulary (`assignment`, a constant int table
    id -> token) whose features (latent_dim = 50) are learned and go through
    one shared FC -> hem_dim.
  The HEM features are the universal language embedding; the sentence is
  represented twice, as in the paper: their mean (u, aux 'mean', the features
  the adversarial classifier, NC and MCLM read) and an LSTM over them (the
  last hidden state -> FC -> s, the multimodal sentence embedding; the
  LSTM of mural/models/word_lstm.py). `word_mask` (MCLM) removes words from the
  mean and replaces them by a learned [MASK] vector in the LSTM's input (the
  paper's supplementary, Fig. 7).

LatentVocabTower ('latent_vocab'): the latent-vocabulary pre-training. A
word's features (FastText, fixed, when given; otherwise learned vectors:
on the built-in data there is no FastText) -> FC -> a point z in the latent
space; the word takes the nearest latent token (hard attention predicted
from the word's features) or, with probability explore_p, one drawn
uniformly among the explore_top nearest (the exploration rule, p = 0.2,
M = 20); the sentence is the mean of its words' token features. Where the
paper is silent on how a hard choice learns: as VQ-VAE (van den Oord et al.
2017), the triplet loss's gradient passes straight through the choice to z,
the chosen token's features move to z and z is held near them (aux 'vq':
||sg(z) - e||^2 + 0.01 ||z - sg(e)||^2, added to the task's loss; a
commitment of 0.25, VQ-VAE's, outweighs a triplet loss of margin 0.05 and
pulled every z onto the tokens). The
paper's "sentence representations obtained by feeding FastText embeddings
into a fully connected layer" are trained too (aux 'continuous': the mean of
the z; the task adds their triplet loss): without them every word fell onto
one token on the built-in data (identical sentences are a fixed point of the
triplet loss on token features), as it did with a softmax straight-through
estimator tried first. Exploration also gives tokens no word is nearest to
a share of the words, hence gradient. Even so the pre-training first collapses: on the
built-in data, within 50 steps every sentence is one point and both triplet losses sit at
their margin, and only after 900-1100 steps at Adam 1e-2 (1700 at 3e-3) do the sentences part
and the words of one meaning gather on one token (configs/smalr_demo.py: 3000 steps). An
assignment read before that says little about meaning; the task logs latent/sentence_cosine
(near 1 in the collapse) and phase 2 warns when phase 1's last is (mural/systems/smalr.py).

Where the assignment lives, and why: it is a constant of the HEM tower
(never a parameter: an int table has no gradient and nothing to decay),
computed deterministically (argmax, no exploration) from the pre-training
run's checkpoint and word vocabulary (config.model.text.latent_workdir), as
the frozen image backbone is read from backbone_workdir
(mural/models/feature_tower.py). The pre-training checkpoint is the one
record of it; resume, evaluation, describe and export rebuild the same table
from it, and the main run's checkpoint holds the fine-tuned latent features
of exactly the tokens that table uses (unused tokens dropped, so their count,
a parameter shape, is fixed by the pre-training). A variable collection would
need the trainer, optimizer and checkpoints to carry a new non-parameter
collection for one system; a table rebuilt from a checkpoint needs nothing.
"""

from typing import Any, Optional

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from mural.models.multilingual import MultilingualDualEncoder
from mural.models.multilingual import grouped_matmul
from mural.models.word_lstm import sentence_lstm


def _param(module, name, init, names, shape, dtype):
  return module.param(name, nn.with_logical_partitioning(init, names), shape, dtype)


def _table_init(init: Optional[np.ndarray], dim: int):
  if init is not None:
    return lambda _, shape, dtype: jnp.asarray(init, dtype).reshape(shape)
  return nn.initializers.normal(dim ** -0.5)


class HybridEmbeddingTower(nn.Module):
  """See the module docstring. Returns (s [B, output_dim], {'mean', 'mule', 'words', 'lang'})."""
  num_languages: int
  words_per_language: int
  specific_words: int  # K: language-specific words per language (besides padding and unknown).
  assignment: Any  # int32 [L * N]: latent token of each id, -1 where the id keeps its own vector.
  num_latent: int  # Latent tokens kept (rows of token_latent).
  specific_dim: int = 50
  latent_dim: int = 50
  hem_dim: int = 512
  lstm_dim: int = 1024
  output_dim: int = 512
  specific_init: Optional[np.ndarray] = None  # [L * (K + 2), specific_dim] (PCA'd FastText) or None.
  latent_init: Optional[np.ndarray] = None  # [num_latent, latent_dim] (pre-trained) or None.
  dtype: Any = jnp.float32
  param_dtype: Any = jnp.float32

  def hem_features(self, ids):
    """[B, T] ids -> [B, T, hem_dim] universal word features (the hybrid lookup)."""
    n, rows_per_lang = self.words_per_language, self.specific_words + 2
    lang_of = jnp.clip(ids // n, 0, self.num_languages - 1)
    offset = ids - lang_of * n
    specific = _param(self, "token_specific", _table_init(self.specific_init, self.specific_dim),
                      ("vocab", "token_embed"), (self.num_languages * rows_per_lang, self.specific_dim),
                      self.param_dtype)
    rows = lang_of * rows_per_lang + jnp.minimum(offset, rows_per_lang - 1)  # Latent words: any row.
    vectors = jnp.take(specific, rows, axis=0).astype(self.dtype)
    kernel = _param(self, "lang_fc_kernel", nn.initializers.lecun_normal(batch_axis=(0,)),
                    ("lang", "token_embed", "embed"), (self.num_languages, self.specific_dim, self.hem_dim),
                    self.param_dtype)
    bias = _param(self, "lang_fc_bias", nn.initializers.zeros, ("lang", "embed"),
                  (self.num_languages, self.hem_dim), self.param_dtype)
    flat = grouped_matmul(vectors.reshape(-1, self.specific_dim), lang_of.reshape(-1), kernel.astype(self.dtype))
    out = flat.reshape(ids.shape + (self.hem_dim,)) + bias[lang_of].astype(self.dtype)
    if self.num_latent:
      token = jnp.asarray(np.asarray(self.assignment, np.int32))[jnp.clip(ids, 0, len(self.assignment) - 1)]
      latent = _param(self, "token_latent", _table_init(self.latent_init, self.latent_dim),
                      ("vocab", "token_embed"), (self.num_latent, self.latent_dim), self.param_dtype)
      shared = nn.Dense(self.hem_dim, name="latent_fc", dtype=self.dtype, param_dtype=self.param_dtype,
                        kernel_init=nn.with_logical_partitioning(nn.initializers.lecun_normal(),
                                                                 ("token_embed", "embed")),
                        bias_init=nn.with_logical_partitioning(nn.initializers.zeros, ("embed",)))
      agnostic = shared(jnp.take(latent, jnp.maximum(token, 0), axis=0).astype(self.dtype))
      out = jnp.where((token >= 0)[..., None], agnostic, out)
    return out

  @nn.compact
  def __call__(self, ids, mask, train: bool = False, word_mask=None):
    del train  # No dropout, no batch statistics.
    lang = jnp.clip(ids[:, 0] // self.words_per_language, 0, self.num_languages - 1)
    words = self.hem_features(ids)
    keep = mask > 0 if word_mask is None else (mask > 0) & ~word_mask
    weights = keep.astype(jnp.float32)[..., None]
    u = jnp.sum(words.astype(jnp.float32) * weights, 1) / jnp.maximum(jnp.sum(weights, 1), 1.0)
    mask_vector = _param(self, "mask_embed", nn.initializers.normal(self.hem_dim ** -0.5), ("embed",),
                         (self.hem_dim,), self.param_dtype)
    if word_mask is not None:  # The LSTM sees [MASK] where a word was: the sentence keeps its length.
      words = jnp.where(word_mask[..., None], mask_vector.astype(self.dtype), words)
    s = sentence_lstm(self, words, mask, jnp.zeros_like(lang), 1, self.lstm_dim, self.output_dim,
                      self.dtype, self.param_dtype)
    return s, {"mean": u, "mule": u, "words": words, "lang": lang}


def explore(logits: jax.Array, rng: jax.Array, p: float, top: int) -> jax.Array:
  """SMALR's exploration rule: per row of logits [..., T] the argmax, or with probability p a
  token drawn uniformly among the `top` best (the best included). int32 [...]."""
  top = min(top, logits.shape[-1])
  best = jnp.argmax(logits, axis=-1).astype(jnp.int32)
  if p <= 0 or top <= 1:
    return best
  k_use, k_pick = jax.random.split(rng)
  candidates = jax.lax.top_k(logits, top)[1].astype(jnp.int32)
  pick = jax.random.randint(k_pick, best.shape, 0, top)
  drawn = jnp.take_along_axis(candidates, pick[..., None], axis=-1)[..., 0]
  return jnp.where(jax.random.bernoulli(k_use, p, best.shape), drawn, best)


class LatentVocabTower(nn.Module):
  """Latent-vocabulary pre-training (see the module docstring). Returns (u [B, latent_dim], aux);
  aux['vq']: the quantisation term the pre-training task adds to its triplet loss."""
  num_languages: int
  words_per_language: int
  word_dim: int = 300
  num_latent: int = 40_000
  latent_dim: int = 50
  explore_p: float = 0.2
  explore_top: int = 20
  commitment: float = 0.01
  word_init: Optional[np.ndarray] = None  # [L * N, word_dim] FastText (kept fixed) or None (learned).
  dtype: Any = jnp.float32
  param_dtype: Any = jnp.float32

  @property
  def output_dim(self) -> int:
    return self.latent_dim

  @nn.compact
  def __call__(self, ids, mask, train: bool = False):
    lang = jnp.clip(ids[:, 0] // self.words_per_language, 0, self.num_languages - 1)
    table = _param(self, "token_embed", _table_init(self.word_init, self.word_dim), ("vocab", "token_embed"),
                   (self.num_languages * self.words_per_language, self.word_dim), self.param_dtype)
    if self.word_init is not None:  # FastText features are inputs, not trained.
      table = jax.lax.stop_gradient(table)
    words = jnp.take(table, ids, axis=0).astype(jnp.float32)
    z = nn.Dense(self.latent_dim, name="assign_fc", param_dtype=self.param_dtype,
                 kernel_init=nn.with_logical_partitioning(nn.initializers.lecun_normal(),
                                                          ("token_embed", "embed")),
                 bias_init=nn.with_logical_partitioning(nn.initializers.zeros, ("embed",)))(words)
    latent = _param(self, "token_latent", nn.initializers.normal(self.latent_dim ** -0.5),
                    ("vocab", "token_embed"), (self.num_latent, self.latent_dim), self.param_dtype)
    latent = latent.astype(jnp.float32)
    scores = token_scores(z, latent)
    choice = explore(scores, self.make_rng("dropout"), self.explore_p, self.explore_top) if train else (
        jnp.argmax(scores, -1))
    hard = jnp.take(latent, choice, axis=0)
    features = z + jax.lax.stop_gradient(hard - z)  # Forward: the token's features; backward: to z.
    weights = (mask > 0).astype(jnp.float32)[..., None]
    u = jnp.sum(features * weights, 1) / jnp.maximum(jnp.sum(weights, 1), 1.0)
    sq = lambda x: jnp.sum(x * x, -1, keepdims=True)
    vq = (sq(jax.lax.stop_gradient(z) - hard) + self.commitment * sq(z - jax.lax.stop_gradient(hard)))
    vq = jnp.sum(vq * weights) / jnp.maximum(jnp.sum(weights), 1.0)
    continuous = jnp.sum(z * weights, 1) / jnp.maximum(jnp.sum(weights, 1), 1.0)
    return u, {"mean": u, "mule": u, "lang": lang, "vq": vq, "continuous": continuous}


def token_scores(z: jax.Array, latent: jax.Array) -> jax.Array:
  """[..., D] word points, [T, D] latent features -> [..., T] scores, -||z - latent_t||^2 up to a
  per-row constant (the nearest token scores highest)."""
  return 2.0 * z @ latent.T - jnp.sum(latent * latent, -1)


def final_assignment(text_params, word_rows: Optional[np.ndarray] = None, chunk: int = 8192) -> np.ndarray:
  """int32 [L * N]: the nearest latent token of every id under a pre-trained LatentVocabTower's
  params (no exploration). word_rows: the FastText table it read (None: its learned table)."""
  rows = np.asarray(text_params["token_embed"] if word_rows is None else word_rows, np.float32)
  kernel = jnp.asarray(text_params["assign_fc"]["kernel"], jnp.float32)
  bias = jnp.asarray(text_params["assign_fc"]["bias"], jnp.float32)
  latent = jnp.asarray(text_params["token_latent"], jnp.float32)
  best = jax.jit(lambda x: jnp.argmax(token_scores(x @ kernel + bias, latent), axis=-1))
  return np.concatenate([np.asarray(best(rows[i:i + chunk])) for i in range(0, len(rows), chunk)]).astype(np.int32)


def compact_assignment(tokens: np.ndarray, latent_rows: np.ndarray):
  """(assignment [L*N] with -1 off latent_rows and tokens renumbered 0..U-1, used token ids [U]):
  the frozen assignment with unused latent tokens dropped."""
  tokens = np.asarray(tokens, np.int64)
  used = np.unique(tokens[latent_rows])
  out = np.full(tokens.shape, -1, np.int32)
  out[latent_rows] = np.searchsorted(used, tokens[latent_rows])
  return out, used


def latent_rows(num_languages: int, words_per_language: int, specific_words: int, words=None) -> np.ndarray:
  """bool [L * N]: the ids that take a latent token: offsets >= K + 2, and (when `words`, the
  vocabulary's word lists per language, is given) below 2 + the language's word count."""
  offset = np.tile(np.arange(words_per_language), num_languages)
  out = offset >= specific_words + 2
  if words is not None:
    counts = np.repeat(np.asarray([len(w) for w in words]), words_per_language)
    out &= offset < counts + 2
  return out


def pca_rows(table: np.ndarray, dim: int) -> np.ndarray:
  """Rows projected on their `dim` principal components (centred; SMALR's FastText 300 -> 50)."""
  x = np.asarray(table, np.float64)
  x = x - x.mean(0, keepdims=True)
  _, _, vt = np.linalg.svd(x, full_matrices=False)
  out = x @ vt[:dim].T
  if out.shape[1] < dim:  # Fewer rows than dim: pad with zeros.
    out = np.pad(out, ((0, 0), (0, dim - out.shape[1])))
  return out.astype(np.float32)


class MaskedPredictor(nn.Module):
  """MCLM's FC, shared across language pairs: [S_i^m ; S_j^m] -> [S_i' ; S_j'] (Eq. 2)."""
  dim: int
  dtype: Any = jnp.float32
  param_dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, left, right):
    y = nn.Dense(2 * self.dim, name="fc", dtype=self.dtype, param_dtype=self.param_dtype,
                 kernel_init=nn.with_logical_partitioning(nn.initializers.lecun_normal(), ("embed", "mlp")),
                 bias_init=nn.with_logical_partitioning(nn.initializers.zeros, ("mlp",)))(
                     jnp.concatenate([left, right], axis=-1))
    return y[:, :self.dim].astype(jnp.float32), y[:, self.dim:].astype(jnp.float32)


class SmalrDualEncoder(MultilingualDualEncoder):
  """MultilingualDualEncoder + MCLM's two predictors (on the mean and on the LSTM sentence) and
  masked text features."""
  mclm_mean: Optional[nn.Module] = None
  mclm_sentence: Optional[nn.Module] = None

  def text_features(self, ids, mask, train: bool = False, word_mask=None):
    kw = {} if word_mask is None else {"word_mask": word_mask}
    x, aux = self.text_tower(ids, mask, train=train, **kw)
    return x.astype(jnp.float32), aux

  def predict_missing(self, which: str, left, right):
    """(S_left', S_right') from the masked representations; which: 'mean' | 'sentence'."""
    return {"mean": self.mclm_mean, "sentence": self.mclm_sentence}[which](left, right)


def from_config(text_config, dtype, param_dtype) -> HybridEmbeddingTower:
  """config.model.text + what the system sets (num_languages, assignment, num_latent,
  latent_init, specific_init: mural/systems/smalr.py hybrid_tables) -> the HEM tower."""
  t = text_config
  assignment = np.asarray(t.assignment, np.int32)
  return HybridEmbeddingTower(
      num_languages=int(t.num_languages), words_per_language=int(t.words_per_language),
      specific_words=int(t.specific_words), assignment=assignment,
      num_latent=int(t.num_latent),
      specific_dim=int(t.specific_dim), latent_dim=int(t.latent_dim), hem_dim=int(t.hem_dim),
      lstm_dim=int(t.lstm_dim), output_dim=int(t.output_dim), specific_init=t.get("specific_init"),
      latent_init=t.get("latent_init"), dtype=dtype, param_dtype=param_dtype)


def pretrain_from_config(text_config, dtype, param_dtype) -> LatentVocabTower:
  """config.model.text (+ num_languages, word_init) -> the latent-vocabulary pre-training tower."""
  t = text_config
  return LatentVocabTower(num_languages=int(t.num_languages), words_per_language=int(t.words_per_language),
                          word_dim=int(t.word_dim), num_latent=int(t.latent_tokens), latent_dim=int(t.latent_dim),
                          explore_p=float(t.explore_p), explore_top=int(t.explore_top),
                          word_init=t.get("word_init"), dtype=dtype, param_dtype=param_dtype)
