"""Training-mode batch norm, and the swish after it, as ops with their own VJPs.

batch_norm_act is nn.BatchNorm(use_running_average=False) then nn.swish as one op
whose backward keeps only its input and two [C] vectors, where autodiff would keep
the normalised input and the sigmoid as well; norm_act_depthwise_conv is it followed
by the depthwise conv (conv_ops.depthwise_conv), whose backward recomputes the
activation instead of keeping it. batch_stats, variance and norm_input_grad are the
statistics and input gradient the C++-kernel ops share (native_ops).
"""

import functools

import flax.linen as nn
import jax
from jax import lax
import jax.numpy as jnp

from mural.models.conv_ops import accumulator
from mural.models.conv_ops import depthwise_conv
from mural.models.conv_ops import depthwise_input_grad
from mural.models.conv_ops import depthwise_kernel_grad


def batch_stats(x):
  """nn.BatchNorm's training statistics: the mean and E[x^2] - mean^2 (clipped at 0) over
  every axis but the last, in float32 or wider."""
  x = x.astype(accumulator(x.dtype))
  axes = tuple(range(x.ndim - 1))
  mean = jnp.mean(x, axes)
  return mean, variance(mean, jnp.mean(jnp.square(x), axes))


def variance(mean, mean_square):
  """E[x^2] - mean^2, clipped at 0 (float32 rounding can take it below)."""
  return jnp.maximum(0.0, mean_square - jnp.square(mean))


def _swish_derivative(y):
  s = jax.nn.sigmoid(y)
  return s * (1 + y * (1 - s))


def _normalize_act(x, mean, inv, scale, bias, swish, dtype):
  y = (x.astype(mean.dtype) - mean) * (inv * scale) + bias
  return (nn.swish(y) if swish else y).astype(dtype)


def _norm_act_forward(x, scale, bias, epsilon, swish, dtype):
  mean, var = batch_stats(x)
  inv = lax.rsqrt(var + epsilon)
  return (_normalize_act(x, mean, inv, scale, bias, swish, dtype), mean, var), inv


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4, 5))
def batch_norm_act(x, scale, bias, epsilon: float, swish: bool, dtype):
  """Training-mode batch norm of x [..., C], then swish if `swish`: (out, mean, var).

  The same function as nn.BatchNorm(use_running_average=False) (fast variance,
  float32 statistics) followed by nn.swish, as one op with its own VJP that keeps
  only x and two [C] vectors for the backward: autodiff keeps the normalised x
  and the sigmoid too, and XLA's CPU back end spends its step on such
  elementwise passes (a profile of the CPU train step). mean and var are returned for the
  running averages.
  """
  return _norm_act_forward(x, scale, bias, epsilon, swish, dtype)[0]


def _norm_act_fwd(x, scale, bias, epsilon, swish, dtype):
  out, inv = _norm_act_forward(x, scale, bias, epsilon, swish, dtype)
  return out, (x, scale, bias, out[1], inv)


def _norm_act_bwd(epsilon, swish, dtype, residuals, cotangents):
  del epsilon, dtype
  x, scale, bias, mean, inv = residuals
  g, g_mean, g_var = cotangents
  centred = x.astype(mean.dtype) - mean
  xhat = centred * inv
  g = g.astype(mean.dtype)
  if swish:
    g = g * _swish_derivative(xhat * scale + bias)
  axes = tuple(range(x.ndim - 1))
  d_bias = jnp.sum(g, axes)
  d_scale = jnp.sum(g * xhat, axes)
  # Through x directly and through the batch mean and variance; then the statistics'
  # own cotangents (zero when they only feed the running averages).
  n = x.size // x.shape[-1]
  dx = norm_input_grad(xhat, scale, inv, g, d_scale, d_bias) + (g_mean + 2 * g_var * centred) / n
  return dx.astype(x.dtype), d_scale.astype(scale.dtype), d_bias.astype(bias.dtype)


def norm_input_grad(xhat, scale, inv, g, d_scale, d_bias):
  """A training batch norm's input gradient, through x and the batch mean and variance,
  given g at its output (before any activation), d_scale = sum(g * xhat), d_bias = sum(g)."""
  n = xhat.size // xhat.shape[-1]
  return (scale * inv) * (g - d_bias / n - xhat * (d_scale / n))


batch_norm_act.defvjp(_norm_act_fwd, _norm_act_bwd)


@functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5, 6))
def norm_act_depthwise_conv(x, scale, bias, kernel, epsilon: float, stride: int, dtype):
  """depthwise_conv(batch_norm_act(x, scale, bias, epsilon, True, dtype)[0], kernel, stride)
  as one op.

  Its backward recomputes the activation from x, chunk by chunk inside the kernel
  gradient's loop, instead of keeping it: composed of two ops, the norm keeps x and
  the conv its input, two activations of the block's widest shape where one does
  (bench_step.py's B0: temporaries 3.31 -> 2.77 GiB)."""
  return depthwise_conv(batch_norm_act(x, scale, bias, epsilon, True, dtype)[0], kernel, stride)


def _norm_act_depthwise_fwd(x, scale, bias, kernel, epsilon, stride, dtype):
  (y, mean, _), inv = _norm_act_forward(x, scale, bias, epsilon, True, dtype)
  return depthwise_conv(y, kernel, stride), (x, scale, bias, mean, inv, kernel)


def _norm_act_depthwise_bwd(epsilon, stride, dtype, residuals, g):
  x, scale, bias, mean, inv, kernel = residuals
  # The forward's activation, bit for bit, from a chunk of x.
  activation = lambda xc: _normalize_act(xc, mean, inv, scale, bias, True, dtype)
  dy = depthwise_input_grad(g, kernel, stride, x.shape[1], x.shape[2])
  dk = depthwise_kernel_grad(x, g, kernel, stride, activation)
  no_stats = jnp.zeros_like(mean)  # The op's statistics feed no loss.
  dx, d_scale, d_bias = _norm_act_bwd(epsilon, True, dtype, (x, scale, bias, mean, inv),
                                      (dy, no_stats, no_stats))
  return dx, d_scale, d_bias, dk


norm_act_depthwise_conv.defvjp(_norm_act_depthwise_fwd, _norm_act_depthwise_bwd)
