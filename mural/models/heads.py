"""Projection heads that map a tower's embedding into the shared space.

MURAL puts one head per task on the text side (i2t, t2t); a single Dense beat
an MLP (paper appendix A.1), so 'dense' is the default and 'mlp'
(Dense-gelu-Dense) the ablation.
"""

from typing import Any

import flax.linen as nn
import jax.numpy as jnp

from mural import config_lib


def _dense(features, in_name, out_name, name, **kw):
  return nn.Dense(
      features, name=name,
      kernel_init=nn.with_logical_partitioning(nn.initializers.lecun_normal(),
                                               (in_name, out_name)),
      bias_init=nn.with_logical_partitioning(nn.initializers.zeros, (out_name,)), **kw)


class DenseHead(nn.Module):
  """One Dense: [..., embed] -> [..., proj]."""
  embed_dim: int
  dtype: Any = jnp.float32
  param_dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, x):
    return _dense(self.embed_dim, "embed", "proj", "dense",
                  dtype=self.dtype, param_dtype=self.param_dtype)(x)


class MlpHead(nn.Module):
  """Dense-gelu-Dense: [..., embed] -> [..., mlp] -> [..., proj]."""
  embed_dim: int
  hidden_dim: int
  dtype: Any = jnp.float32
  param_dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, x):
    kw = dict(dtype=self.dtype, param_dtype=self.param_dtype)
    x = nn.gelu(_dense(self.hidden_dim, "embed", "mlp", "hidden", **kw)(x), approximate=False)
    return _dense(self.embed_dim, "mlp", "proj", "out", **kw)(x)


HEADS = {
    "dense": lambda c, **kw: DenseHead(c.embed_dim, **kw),
    "mlp": lambda c, **kw: MlpHead(c.embed_dim, c.mlp_hidden_dim, **kw),
}


def from_config(heads_config, dtype, param_dtype) -> nn.Module:
  """A new head of kind config.model.heads.kind."""
  if heads_config.kind not in HEADS:
    raise config_lib.ConfigError(
        f"config.model.heads.kind: {heads_config.kind!r} not in {sorted(HEADS)}")
  return HEADS[heads_config.kind](heads_config, dtype=dtype, param_dtype=param_dtype)
