"""The image towers' conv and batch-norm layers, computed by the implementation that
config.model.image.conv_impl and norm_impl name (op_impls).

Conv is nn.Conv with SAME padding, FusedBatchNorm nn.BatchNorm (+ swish), each with
the same variables as the Flax layer, so a checkpoint loads whichever implementation
computed it. In training FusedBatchNorm(defer=True) hands its norm + swish on as a
NormAct, which the depthwise Conv after it applies in one op (norm_ops, native_ops).
CONV and DEPTHWISE are the logical axis names of their kernels.
"""

from typing import Any, Callable, NamedTuple

import flax.linen as nn
import jax
from jax import lax
import jax.numpy as jnp

from mural import config_lib
from mural.models.conv_ops import conv2d
from mural.models.conv_ops import symmetric_conv
from mural.models.native_ops import native_applies
from mural.models.native_ops import native_expand_norm_act_depthwise
from mural.models.native_ops import native_norm_act_depthwise_conv
from mural.models.native_ops import pointwise_batch_stats
from mural.models.native_ops import Pointwise
from mural.models.native_ops import WithStats
from mural.models.norm_ops import batch_norm_act
from mural.models.norm_ops import batch_stats
from mural.models.norm_ops import norm_act_depthwise_conv
from mural.models.op_impls import resolve_conv_impl


CONV = (None, None, "conv_in", "conv_out")  # Logical names of a conv kernel.
DEPTHWISE = (None, None, None, "conv_out")  # Depthwise kernel: one input channel per group.
PADDINGS = ("same", "symmetric")  # TF's SAME, or (k - 1) // 2 each side (PyTorch, Keras' ResNets).


def pixel_triple(value, field: str):
  """config.model.image.<field>: None or three numbers (R, G, B) -> a tuple (hashable: a module
  field), or a one-line ConfigError."""
  if value is None:
    return None
  if len(value) != 3 or not all(isinstance(v, (int, float)) for v in value):
    raise config_lib.ConfigError(f"config.model.image.{field}: three numbers (R, G, B), got {value!r}")
  return tuple(float(v) for v in value)


def pixel_normalize(images, mean, std):
  """Images in the pipeline's [-1, 1] -> (pixel - mean) / std per channel, with mean and std
  in [0, 255] units: what a public ImageNet checkpoint was trained on. None: unchanged."""
  if mean is None and std is None:
    return images
  pixels = (images.astype(jnp.float32) + 1.0) * 127.5
  mean = jnp.asarray(mean if mean is not None else (0.0, 0.0, 0.0), jnp.float32)
  std = jnp.asarray(std if std is not None else (1.0, 1.0, 1.0), jnp.float32)
  return ((pixels - mean) / std).astype(images.dtype)


class NormAct(NamedTuple):
  """A training batch norm + swish of x, not yet computed, that the depthwise conv after it
  applies in its own op (FusedBatchNorm(defer=True), Conv, norm_act_depthwise_conv)."""
  x: Any  # The norm's input [B, H, W, C], or a Pointwise that computes it, or a WithStats.
  scale: jax.Array
  bias: jax.Array
  epsilon: float
  dtype: Any  # Of the activation.

  def materialize(self):
    x = self.x.materialize() if isinstance(self.x, (Pointwise, WithStats)) else self.x
    return batch_norm_act(x, self.scale, self.bias, self.epsilon, True, self.dtype)[0]


class Conv(nn.Module):
  """nn.Conv with SAME padding: the same 'kernel' [k, k, Cin / groups, features]
  and 'bias' [features] params (declared in the same order, so the same init
  values), dtype promotion and maths, computed by `impl` (see conv2d)."""
  features: int
  kernel_size: int = 1
  strides: int = 1
  feature_group_count: int = 1
  use_bias: bool = False
  kernel_init: Callable = nn.initializers.lecun_normal()
  bias_init: Callable = nn.initializers.zeros
  dtype: Any = None
  param_dtype: Any = jnp.float32
  impl: str = "auto"
  padding: str = "same"  # PADDINGS.

  @nn.compact
  def __call__(self, inputs):
    """inputs: [B, H, W, Cin], or a NormAct that a 'fast' depthwise conv applies in its own op."""
    k, groups = self.kernel_size, self.feature_group_count
    impl = resolve_conv_impl(self.impl)
    fast = impl in ("fast", "native")
    kernel, bias = self.weights((inputs.x if isinstance(inputs, NormAct) else inputs).shape[-1])
    channels = kernel.shape[2] * groups
    if self.padding == "symmetric" and self.strides > 1 and k > 1:  # Elsewhere it is SAME.
      x = inputs.materialize() if isinstance(inputs, NormAct) else inputs
      x, kernel, bias = nn.dtypes.promote_dtype(x, kernel, bias, dtype=self.dtype)
      y = symmetric_conv(x, kernel, self.strides, groups)
      return y if bias is None else y + bias
    if isinstance(inputs, NormAct) and isinstance(inputs.x, Pointwise):
      # MBConv makes one only where the native op applies.
      kernel, bias = nn.dtypes.promote_dtype(kernel, bias, dtype=self.dtype)
      if (impl == "native" and groups == self.features == channels and k > 1
          and native_applies(inputs.x.x, inputs.x.w, inputs.scale, inputs.bias, kernel)):
        y = native_expand_norm_act_depthwise(inputs.x.x, inputs.x.w, inputs.scale, inputs.bias,
                                             kernel, inputs.epsilon, self.strides)
        return y if bias is None else y.y + bias
      inputs = inputs._replace(x=inputs.x.materialize())
    if isinstance(inputs, NormAct):
      x, kernel, bias = nn.dtypes.promote_dtype(inputs.x, kernel, bias, dtype=self.dtype)
      if (fast and groups == self.features == channels and k > 1
          and x.dtype == inputs.x.dtype == inputs.dtype):
        if impl == "native" and native_applies(inputs.x, inputs.scale, inputs.bias, kernel):
          y = native_norm_act_depthwise_conv(inputs.x, inputs.scale, inputs.bias, kernel,
                                             inputs.epsilon, self.strides)
          return y if bias is None else y.y + bias
        y = norm_act_depthwise_conv(inputs.x, inputs.scale, inputs.bias, kernel,
                                    inputs.epsilon, self.strides, inputs.dtype)
        return y if bias is None else y + bias
      inputs = inputs.materialize()
    inputs, kernel, bias = nn.dtypes.promote_dtype(inputs, kernel, bias, dtype=self.dtype)
    y = conv2d(inputs, kernel, self.strides, groups, self.impl)
    return y if bias is None else y + bias

  def weights(self, channels: int):
    """Declares (kernel, bias or None) for `channels` input channels."""
    k = self.kernel_size
    kernel = self.param("kernel", self.kernel_init,
                        (k, k, channels // self.feature_group_count, self.features),
                        self.param_dtype)
    bias = (self.param("bias", self.bias_init, (self.features,), self.param_dtype)
            if self.use_bias else None)
    return kernel, bias


class ConvWeights(Conv):
  """A Conv's parameters alone (same names, shapes and inits), for an op that applies
  them itself (native_norm_act_squeeze_excite): returns (kernel, bias), in `dtype`."""

  @nn.compact
  def __call__(self, channels: int):
    return nn.dtypes.promote_dtype(*self.weights(channels), dtype=self.dtype)


class FusedBatchNorm(nn.Module):
  """nn.BatchNorm (+ swish) with nn.BatchNorm's variables (params 'scale' and 'bias',
  batch_stats 'mean' and 'var': same names, shapes, inits and running-average update,
  so checkpoints load either way) computed in training by `batch_norm_act`."""
  use_running_average: bool
  momentum: float = 0.99
  epsilon: float = 1e-3
  swish: bool = False
  dtype: Any = None
  param_dtype: Any = jnp.float32
  scale_init: Callable = nn.initializers.ones
  bias_init: Callable = nn.initializers.zeros
  # Training, with swish: return a NormAct for the depthwise conv after it to apply
  # (norm_act_depthwise_conv), and only the running averages here.
  defer: bool = False

  @nn.compact
  def __call__(self, x):
    features = (x.shape[-1],)
    ra_mean = self.variable("batch_stats", "mean", lambda s: jnp.zeros(s, jnp.float32), features)
    ra_var = self.variable("batch_stats", "var", lambda s: jnp.ones(s, jnp.float32), features)
    scale = self.param("scale", self.scale_init, features, self.param_dtype)
    bias = self.param("bias", self.bias_init, features, self.param_dtype)
    dtype = self.dtype or jnp.result_type(x.dtype, scale, bias)
    if (isinstance(x, (Pointwise, WithStats))
        and not (self.defer and self.swish and not self.use_running_average)):
      x = x.materialize()
    if self.use_running_average:
      y = (x - ra_mean.value) * (lax.rsqrt(ra_var.value + self.epsilon) * scale) + bias
      return (nn.swish(y.astype(dtype)) if self.swish else y).astype(dtype)
    if self.defer and self.swish:
      # The same as the op's (a WithStats: the op's own sums): XLA computes them once.
      if isinstance(x, Pointwise):
        stats = pointwise_batch_stats(x.x, x.w)[:2]
      else:
        stats = (x.mean, x.var) if isinstance(x, WithStats) else batch_stats(x)
      mean, var = lax.stop_gradient(stats)
      y = NormAct(x, scale, bias, self.epsilon, jnp.dtype(dtype))
    else:
      y, mean, var = batch_norm_act(x, scale, bias, self.epsilon, self.swish, jnp.dtype(dtype))
    if not self.is_initializing():
      ra_mean.value = self.momentum * ra_mean.value + (1 - self.momentum) * mean
      ra_var.value = self.momentum * ra_var.value + (1 - self.momentum) * var
    return y
