"""A block's norm + swish + depthwise conv (with or without the expand conv before them)
and its norm + swish + squeeze-excite, in float32 by mural's C++ kernels (mural.kernels).

Each op is the same function as its composition in XLA ops (conv_ops, norm_ops) with
fewer passes over memory and fewer activations kept for the backward: the 'native'
conv_impl with 'fused' norms, in training, on the CPU. Two values carry work from one
layer to the op in the next: Pointwise, an expand conv not yet computed, and WithStats,
a conv's output with the batch statistics its op summed. native_applies says where
the kernels may run (float32 arrays, one device).
"""

import functools
from typing import NamedTuple

import flax.linen as nn
import jax
from jax import lax
import jax.numpy as jnp

from mural import kernels
from mural.models.conv_ops import pointwise_conv
from mural.models.norm_ops import batch_stats
from mural.models.norm_ops import norm_input_grad
from mural.models.norm_ops import variance


def native_applies(*arrays) -> bool:
  """The C++ kernels take float32 on one device. Under a mesh of several devices XLA
  could not split their custom calls over the batch and would gather it whole onto
  every device, so the XLA ops ('fast') run there instead (on the CPU a mesh of
  several devices is a test set-up; accelerators run 'xla')."""
  mesh = jax.sharding.get_abstract_mesh()
  one_device = mesh is None or mesh.empty or mesh.size == 1
  return one_device and all(a.dtype == jnp.float32 for a in arrays)


class WithStats(NamedTuple):
  """A native depthwise conv's output y with its batch statistics (batch_stats's mean
  and variance, without gradient), which the op summed as it wrote y: the norm after
  the conv takes them instead of two more passes over y (FusedBatchNorm,
  native_norm_act_squeeze_excite, whose backward carries the statistics' gradient)."""
  y: jax.Array
  mean: jax.Array
  var: jax.Array

  @property
  def shape(self):
    return self.y.shape

  @property
  def dtype(self):
    return self.y.dtype

  def materialize(self):
    return self.y


def _with_stats(y, moments) -> WithStats:
  """WithStats from a native op's moments [2, C] (the sums of y and y * y)."""
  n = y.size // y.shape[-1]
  mean = moments[0] / n
  var = variance(mean, moments[1] / n)
  return WithStats(y, *lax.stop_gradient((mean, var)))


def native_norm_act_depthwise_conv(x, scale, bias, kernel, epsilon: float,
                                   stride: int) -> WithStats:
  """norm_act_depthwise_conv in float32 by mural's C++ kernels (mural/kernels): the
  same function, one pass over memory per image forward and one backward; its output
  comes with its batch statistics."""
  return _with_stats(*_native_norm_act_depthwise(x, scale, bias, kernel, epsilon, stride))


@functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5))
def _native_norm_act_depthwise(x, scale, bias, kernel, epsilon: float, stride: int):
  """(y, y's moments): the moments' gradient is dropped, so only _with_stats reads them."""
  return _native_norm_act_depthwise_fwd(x, scale, bias, kernel, epsilon, stride)[0]


def _native_norm_act_depthwise_fwd(x, scale, bias, kernel, epsilon, stride):
  mean, var = batch_stats(x)
  inv = lax.rsqrt(var + epsilon)
  out = kernels.norm_act_depthwise_forward(x, mean, inv, scale, bias, kernel[:, :, 0], stride)
  return out, (x, scale, bias, mean, inv, kernel)


def _native_norm_act_depthwise_bwd(epsilon, stride, residuals, cotangents):
  del epsilon
  g, _ = cotangents  # The moments': stop_gradient in _with_stats.
  x, scale, bias, mean, inv, kernel = residuals
  dz, dk, d_bias, d_scale = kernels.norm_act_depthwise_backward(
      x, mean, inv, scale, bias, kernel[:, :, 0], g, stride)
  dx = norm_input_grad((x - mean) * inv, scale, inv, dz, d_scale, d_bias)
  return dx, d_scale, d_bias, dk.reshape(kernel.shape)


_native_norm_act_depthwise.defvjp(_native_norm_act_depthwise_fwd, _native_norm_act_depthwise_bwd)


class Pointwise(NamedTuple):
  """x @ w over the pixels (a 1x1 conv), not yet computed: a block's expand conv, whose
  norm + swish + depthwise conv after it are one op (native_expand_norm_act_depthwise)."""
  x: jax.Array  # [B, H, W, K]
  w: jax.Array  # The conv's kernel [1, 1, K, N].

  @property
  def shape(self):
    return (*self.x.shape[:-1], self.w.shape[-1])

  @property
  def dtype(self):
    return jnp.result_type(self.x, self.w)

  def materialize(self):
    return pointwise_conv(self.x, self.w)


def pointwise_batch_stats(x, w):
  """batch_stats(x @ w) from x's column sums and Gram matrix (K channels, not N = 6K):
  mean = mean(x) @ w, E[y^2] = diag(w' (x'x / n) w). Also returns the sums and the Gram
  matrix, which the backward of native_expand_norm_act_depthwise uses."""
  x = x.reshape(-1, x.shape[-1])
  w = w.reshape(x.shape[-1], -1)
  n = x.shape[0]
  col_sum, gram = jnp.sum(x, 0), x.T @ x
  mean = col_sum @ w / n
  var = variance(mean, jnp.sum(w * (gram @ w), 0) / n)
  return mean, var, col_sum, gram


# The widest expand-conv input that the C++ op expands itself, forward and backward
# (see native_expand_norm_act_depthwise). With few input channels the expanded
# activation's bytes bound XLA's matmuls; with more, their FLOPs do, and XLA's run
# faster than the op's loops. In B0's train step (batch 128, 128 px, 2-core Xeon; each
# op's least time over 5 traced steps) the backward of K = 16 went 154 -> 118 ms, K = 24
# 101 -> 99 and 56 -> 48, but K = 40 45 -> 76 and K = 80 20-32 -> 31-45; on an AVX2 EPYC
# thresholds 0-88 ran the step alike (benchmarks/README.md).
KERNEL_EXPAND_MAX_CHANNELS = 32


def native_expand_norm_act_depthwise(x, w, scale, bias, kernel, epsilon: float,
                                     stride: int) -> WithStats:
  """native_norm_act_depthwise_conv(pointwise_conv(x, w), ...): a block's expand conv,
  norm, swish and depthwise conv, with the norm's statistics from x's Gram matrix
  (pointwise_batch_stats) instead of two passes over the expanded activation.

  The backward never writes the norm's input gradient dy out: dy is dz * A + y * B + C
  per channel (A, B, C from the norm's two sums), so the expand conv's gradients are
  x' dz * A + (x'x) w * B + sum(x) C' for w and dz (w * A)' + x (w * B) w' + (w C)'
  for x, with the [K, K] Gram matrix in place of y.

  With at most KERNEL_EXPAND_MAX_CHANNELS input channels K, the C++ op also computes
  y = x @ w itself, image by image, forward and again backward, and takes dz on into
  dz (w * A)' and x' dz a band of rows at a time: neither y nor dz (6x the input's
  channels) is written out or kept. B0's train step at batch 128 and 128 px:
  temporaries 1.97 -> 1.68 GiB (benchmarks/README.md)."""
  return _with_stats(*_native_expand(x, w, scale, bias, kernel, epsilon, stride))


@functools.partial(jax.custom_vjp, nondiff_argnums=(5, 6))
def _native_expand(x, w, scale, bias, kernel, epsilon: float, stride: int):
  """(y, y's moments), as _native_norm_act_depthwise."""
  return _native_expand_fwd(x, w, scale, bias, kernel, epsilon, stride)[0]


def _expanded_in_kernel(x) -> bool:
  return x.shape[-1] <= KERNEL_EXPAND_MAX_CHANNELS


def _native_expand_fwd(x, w, scale, bias, kernel, epsilon, stride):
  mean, var, col_sum, gram = pointwise_batch_stats(x, w)
  inv = lax.rsqrt(var + epsilon)
  if _expanded_in_kernel(x):
    y = None  # The backward computes it again.
    out = kernels.norm_act_depthwise_forward(x, mean, inv, scale, bias, kernel[:, :, 0], stride,
                                             w=w.reshape(x.shape[-1], -1))
  else:
    y = pointwise_conv(x, w)
    out = kernels.norm_act_depthwise_forward(y, mean, inv, scale, bias, kernel[:, :, 0], stride)
  return out, (x, w, y, scale, bias, mean, inv, kernel, col_sum, gram)


def _native_expand_bwd(epsilon, stride, residuals, cotangents):
  del epsilon
  g, _ = cotangents  # The moments': stop_gradient in _with_stats.
  x, w, y, scale, bias, mean, inv, kernel, col_sum, gram = residuals
  x2 = x.reshape(-1, x.shape[-1])
  w2 = w.reshape(x2.shape[1], -1)
  n = x2.shape[0]
  # norm_input_grad: dy = a * (dz - d_bias / n - (y - mean) * inv * d_scale / n).
  a = scale * inv
  if y is None:  # dz @ (w * a)' and x' dz from the kernel, which never writes dz out.
    dx_a, xdz, dk, d_bias, d_scale = kernels.expand_norm_act_depthwise_backward(
        x, w2, mean, inv, scale, bias, kernel[:, :, 0], g, stride)
    dx_a, xdz_a = dx_a.reshape(x2.shape), xdz * a
  else:
    dz, dk, d_bias, d_scale = kernels.norm_act_depthwise_backward(
        y, mean, inv, scale, bias, kernel[:, :, 0], g, stride)
    dz = dz.reshape(n, -1)
    dx_a, xdz_a = dz @ (w2 * a).T, (x2.T @ dz) * a
  b = -a * inv * d_scale / n
  c = -a * d_bias / n - b * mean
  dw = xdz_a + (gram @ w2) * b + jnp.outer(col_sum, c)
  dx = dx_a + x2 @ ((w2 * b) @ w2.T) + w2 @ c
  return dx.reshape(x.shape), dw.reshape(w.shape), d_scale, d_bias, dk.reshape(kernel.shape)


_native_expand.defvjp(_native_expand_fwd, _native_expand_bwd)


def _squeeze_excite_gate(pooled, w_reduce, b_reduce, w_expand, b_expand):
  """The squeeze-excite's gate [B, C] from the pooled activation [B, C], as MBConv's
  se_reduce (+ swish) and se_expand (+ sigmoid) compute it on the 1 x 1 pooled image."""
  s = nn.swish(pointwise_conv(pooled[:, None, None, :], w_reduce) + b_reduce)
  return nn.sigmoid(pointwise_conv(s, w_expand) + b_expand)[:, 0, 0, :]


def native_norm_act_squeeze_excite(y, scale, bias, w_reduce, b_reduce, w_expand, b_expand,
                                   epsilon: float):
  """a * gate(mean of a over each image's pixels), a = batch_norm_act(y, scale, bias,
  epsilon, True)[0]: a block's depthwise norm + swish and squeeze-excite in float32,
  the passes over y by mural's C++ kernels (mural/kernels): two forward (the pool,
  then the gated output), two backward (per-image sums, then y's gradient); the gate's
  two small matmuls stay in XLA. Over B0's 16 blocks at batch 128 and 128 px, forward +
  backward: 280 ms against 420-430 for the composition in XLA ops (benchmarks/README.md).
  y: an array, or a WithStats whose statistics the norm takes."""
  if isinstance(y, WithStats):
    y, stats = y.y, (y.mean, y.var)
  else:
    stats = lax.stop_gradient(batch_stats(y))
  return _native_squeeze_excite(y, *stats, scale, bias, w_reduce, b_reduce, w_expand, b_expand,
                                epsilon)


@functools.partial(jax.custom_vjp, nondiff_argnums=(9,))
def _native_squeeze_excite(y, mean, var, scale, bias, w_reduce, b_reduce, w_expand, b_expand,
                           epsilon: float):
  """With y's batch statistics given: their gradient is in y's (the backward's sums)."""
  return _native_squeeze_excite_fwd(y, mean, var, scale, bias, w_reduce, b_reduce, w_expand,
                                    b_expand, epsilon)[0]


def _native_squeeze_excite_fwd(y, mean, var, scale, bias, w_reduce, b_reduce, w_expand,
                               b_expand, epsilon):
  inv = lax.rsqrt(var + epsilon)
  pooled = kernels.squeeze_forward(y, mean, inv, scale, bias)
  weights = (w_reduce, b_reduce, w_expand, b_expand)
  gate = _squeeze_excite_gate(pooled, *weights)
  out = kernels.excite_forward(y, mean, inv, scale, bias, gate)
  return out, (y, scale, bias, mean, inv, pooled, gate, weights)


def _native_squeeze_excite_bwd(epsilon, residuals, g):
  del epsilon
  y, scale, bias, mean, inv, pooled, gate, weights = residuals
  # Per image and channel: sums of g * a (the gate's gradient), and of swish'(z) times
  # g, g * xhat, 1 and xhat, from which the norm's two sums follow without another pass.
  d_gate, s_g, s_gx, s_1, s_x = jnp.moveaxis(kernels.excite_sums(y, mean, inv, scale, bias, g),
                                             1, 0)
  _, pull = jax.vjp(_squeeze_excite_gate, pooled, *weights)
  d_pooled, *d_weights = pull(d_gate)
  pixels = y.shape[1] * y.shape[2]
  # dz = swish'(z) * (g * gate + d_pooled / pixels), summed for the norm's backward.
  dpool = d_pooled / pixels
  d_bias = jnp.sum(gate * s_g + dpool * s_1, axis=0)
  d_scale = jnp.sum(gate * s_gx + dpool * s_x, axis=0)
  n = y.shape[0] * pixels
  dy = kernels.excite_input_grad(y, mean, inv, scale, bias, g, gate, dpool, d_bias / n,
                                 d_scale / n)
  return (dy, jnp.zeros_like(mean), jnp.zeros_like(mean), d_scale, d_bias, *d_weights)


_native_squeeze_excite.defvjp(_native_squeeze_excite_fwd, _native_squeeze_excite_bwd)
