"""BERT encoder (Devlin et al. 2019) as a text tower.

Post-LN transformer with GELU MLPs, learned position embeddings and a padding
mask; the text embedding is the output at position 0 ([CLS]), or BERT's pooler
(Dense + tanh) of it (`pooler`, as LaBSE embeds). Every input is a single segment:
a public checkpoint's token-type table (`type_vocab_size` rows) adds its row 0 to
every position, as BERT does for segment 0; mural's own towers have none.

The token table may be factorised (ALBERT-style, as in MURAL-LARGE): a
vocab x token_embed_dim table projected by a Dense to hidden_dim, which cuts
250k x 1024 to 250k x 256 + 256 x 1024. Parameter names under `token_*` are
what `mural.describe` counts as token embeddings.
"""

from typing import Any, Optional

import flax.linen as nn
import jax.numpy as jnp

from mural.models import dropout
from mural.models import remat

_init = nn.initializers.truncated_normal(0.02)  # BERT's initializer range.


def _named(init, names):
  return nn.with_logical_partitioning(init, names)


def _dense(features, in_name, out_name, name, **kw):
  return nn.Dense(features, name=name, kernel_init=_named(_init, (in_name, out_name)),
                  bias_init=_named(nn.initializers.zeros, (out_name,)), **kw)


def _layer_norm(name, **kw):
  return nn.LayerNorm(epsilon=1e-12, name=name,
                      scale_init=_named(nn.initializers.ones, ("norm",)),
                      bias_init=_named(nn.initializers.zeros, ("norm",)), **kw)


def attention(query, key, value, mask=None, dropout_rng=None, dropout_rate=0.0,
              deterministic=True, dtype=None):
  """flax's dot-product attention (softmax in float32) with BERT's attention dropout: each
  probability of each example and head dropped on its own (flax's default shares one [q, k]
  mask across the batch and the heads), drawn as mural.models.dropout draws.
  query [B, Lq, heads, d], key and value [B, Lk, heads, d] -> [B, Lq, heads, d]."""
  weights = nn.dot_product_attention_weights(query, key, mask=mask, dtype=dtype,
                                             force_fp32_for_softmax=True)
  if not deterministic and dropout_rate > 0.0:
    weights = dropout.drop(dropout_rng, dropout_rate, weights)
  return jnp.einsum("...hqk,...khd->...qhd", weights, value)


class Attention(nn.Module):
  """Multi-head attention with flax.linen.MultiHeadDotProductAttention's parameters (the same
  names, shapes and inits: checkpoints of either load in the other) and `attention`'s dropout.

  Its four projections read the tokens as one [B * L, features] matrix, so each weight
  gradient contracts one axis: with [B, L] kept apart, XLA's CPU back end transposed every
  activation gradient to contract two (15% of BERT L4/H256 forward + backward, 128 x 32 tokens).
  """
  num_heads: int
  dropout_rate: float
  kernel_init: Any
  bias_init: Any
  out_kernel_init: Any
  out_bias_init: Any
  dtype: Any = jnp.float32
  param_dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, inputs_q, inputs_kv, mask, deterministic: bool):
    """inputs_q [B, Lq, E], inputs_kv [B, Lk, E], mask [B, 1, Lq, Lk] -> [B, Lq, E]."""
    features = inputs_q.shape[-1]
    if features % self.num_heads:
      raise ValueError(f"{features} features do not split into {self.num_heads} heads")
    heads = (self.num_heads, features // self.num_heads)
    kw = dict(dtype=self.dtype, param_dtype=self.param_dtype)

    def project(name, inputs):  # [B, L, E] -> [B, L, heads, head_dim]
      rows = inputs.reshape(-1, features)
      out = nn.DenseGeneral(heads, kernel_init=self.kernel_init, bias_init=self.bias_init,
                            name=name, **kw)(rows)
      return out.reshape(inputs.shape[:-1] + heads)

    query = project("query", inputs_q)
    key, value = project("key", inputs_kv), project("value", inputs_kv)
    dropout_rng = None if deterministic or self.dropout_rate == 0.0 else self.make_rng("dropout")
    y = attention(query, key, value, mask=mask, dropout_rng=dropout_rng,
                  dropout_rate=self.dropout_rate, deterministic=deterministic, dtype=self.dtype)
    out = nn.DenseGeneral(features, axis=(-2, -1), kernel_init=self.out_kernel_init,
                          bias_init=self.out_bias_init, name="out", **kw)(y.reshape((-1,) + heads))
    return out.reshape(inputs_q.shape)


class EncoderLayer(nn.Module):
  """Post-LN: x = LN(x + Attn(x)); x = LN(x + MLP(x))."""
  num_heads: int
  mlp_dim: int
  dropout_rate: float
  gelu_approximate: bool = False
  dtype: Any = jnp.float32
  param_dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, x, attention_mask, train: bool, first_rows: Optional[int] = None):
    """x [B, L, H] -> [B, L, H], or the outputs of its first `first_rows` positions only (the
    same values: a position's output reads every position's keys and values, its own query)."""
    kw = dict(dtype=self.dtype, param_dtype=self.param_dtype)
    hidden = x.shape[-1]
    drop = lambda y: dropout.Dropout(self.dropout_rate, deterministic=not train)(y)
    if first_rows is not None:
      x, kv, attention_mask = x[:, :first_rows], x, attention_mask[:, :, :first_rows]
    else:
      kv = x
    y = Attention(
        num_heads=self.num_heads, dropout_rate=self.dropout_rate,
        kernel_init=_named(_init, ("embed", "heads", "kv")),
        bias_init=_named(nn.initializers.zeros, ("heads", "kv")),
        out_kernel_init=_named(_init, ("heads", "kv", "embed")),
        out_bias_init=_named(nn.initializers.zeros, ("embed",)),
        name="attention", **kw)(x, kv, attention_mask, not train)
    x = _layer_norm("attention_norm", **kw)(x + drop(y))
    y = _dense(self.mlp_dim, "embed", "mlp", "mlp_in", **kw)(x.reshape(-1, hidden))
    y = _dense(hidden, "mlp", "embed", "mlp_out", **kw)(nn.gelu(y, approximate=self.gelu_approximate))
    return _layer_norm("mlp_norm", **kw)(x + drop(y.reshape(x.shape)))


class Bert(nn.Module):
  """Returns ([CLS] output [B, hidden_dim], {'sequence': [B, L, hidden_dim]})."""
  vocab_size: int
  token_embed_dim: int
  hidden_dim: int
  num_layers: int
  num_heads: int
  mlp_dim: int
  max_len: int
  dropout_rate: float = 0.1
  remat: str = "none"  # Per encoder layer: mural/models/remat.py.
  type_vocab_size: int = 0
  pooler: bool = False
  # GELU's tanh approximation, as Google's BERT code (and HF's 'gelu_new') computes it; False:
  # the exact erf form (HF's 'gelu', mural's own towers).
  gelu_approximate: bool = False
  dtype: Any = jnp.float32
  param_dtype: Any = jnp.float32

  @property
  def output_dim(self) -> int:
    return self.hidden_dim

  @nn.compact
  def __call__(self, ids, mask, train: bool):
    if ids.shape[1] > self.max_len:
      raise ValueError(f"text length {ids.shape[1]} exceeds config.model.text.max_len "
                       f"{self.max_len}")
    kw = dict(dtype=self.dtype, param_dtype=self.param_dtype)
    factorised = self.token_embed_dim < self.hidden_dim
    x = nn.Embed(self.vocab_size, self.token_embed_dim, name="token_embed",
                 embedding_init=_named(_init, ("vocab", "token_embed" if factorised else "embed")),
                 **kw)(ids)
    if factorised:
      x = _dense(self.hidden_dim, "token_embed", "embed", "token_proj", **kw)(
          x.reshape(-1, self.token_embed_dim)).reshape(ids.shape + (self.hidden_dim,))
    positions = self.param("position_embed", _named(_init, ("position", "embed")),
                           (self.max_len, self.hidden_dim), self.param_dtype)
    x = x + positions[None, :ids.shape[1]].astype(x.dtype)
    if self.type_vocab_size:
      types = self.param("token_type_embed", _named(_init, (None, "embed")),
                         (self.type_vocab_size, self.hidden_dim), self.param_dtype)
      x = x + types[0].astype(x.dtype)
    x = _layer_norm("embed_norm", **kw)(x)
    x = dropout.Dropout(self.dropout_rate, deterministic=not train)(x)
    attention_mask = nn.make_attention_mask(mask > 0, mask > 0)
    # (self, x, mask, train, first_rows).
    layer = remat.block(EncoderLayer, self.remat, static_argnums=(3, 4))
    for i in range(self.num_layers - 1):
      x = layer(self.num_heads, self.mlp_dim, self.dropout_rate, self.gelu_approximate,
                name=f"layer_{i}", **kw)(x, attention_mask, train, None)
    # [CLS] goes through the last layer on its own (one query position), and is position 0
    # of the whole-sequence output too: a caller that reads only [CLS] (a dual encoder)
    # leaves the rest unused and XLA drops it, so the last layer runs 1 position, not L.
    # With dropout the one position draws its own masks, as it would in the whole layer:
    # no other position's mask reaches [CLS].
    last = layer(self.num_heads, self.mlp_dim, self.dropout_rate, self.gelu_approximate,
                 name=f"layer_{self.num_layers - 1}", **kw)
    cls = last(x, attention_mask, train, 1)
    x = jnp.concatenate([cls, last(x, attention_mask, train, None)[:, 1:]], axis=1)
    embedding = cls[:, 0]
    if self.pooler:
      embedding = jnp.tanh(_dense(self.hidden_dim, "embed", "proj", "pooler", **kw)(embedding))
    return embedding, {"sequence": x}


def from_config(text_config, dtype, param_dtype) -> Bert:
  """config.model.text -> Bert."""
  t = text_config
  return Bert(vocab_size=t.vocab_size, token_embed_dim=t.token_embed_dim,
              hidden_dim=t.hidden_dim, num_layers=t.num_layers, num_heads=t.num_heads,
              mlp_dim=t.mlp_dim, max_len=t.max_len, dropout_rate=t.dropout_rate,
              remat=remat.check(t.get("remat", "none"), "model.text.remat"),
              type_vocab_size=t.get("type_vocab_size", 0), pooler=t.get("pooler", False),
              gelu_approximate=t.get("gelu_approximate", False),
              dtype=dtype, param_dtype=param_dtype)
