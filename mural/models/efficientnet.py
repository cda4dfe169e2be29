"""EfficientNet B0-B7 and L2 (Tan & Le 2019) as an image tower.

Follows the TF reference (tensorflow/tpu models/official/efficientnet): the B0
block table scaled by width/depth coefficients with `round_filters` /
`round_repeats`, MBConv blocks with squeeze-excite, swish, batch norm
(momentum 0.99, epsilon 1e-3), SAME padding and drop-connect whose rate grows
with the block index. The embedding is the global average pool of the last
MBConv stage (ALIGN drops the 1x1 head conv); the head conv and the classifier
are optional so parameter counts can be checked against the paper.

Convolutions have two implementations of the same function with the same
parameters (`conv_impl`, config.model.image.conv_impl):
  'xla'   lax.conv_general_dilated, as nn.Conv: good on GPU and TPU;
  'fast'  depthwise convs as k * k shifted multiply-adds, pointwise (1x1)
          convs as one matmul and other convs as patches @ kernel: XLA's CPU
          convolutions are several times slower than these (jax-ml/jax#23713,
          openxla/xla#34273; benchmarks/bench_convs.py);
  'native' 'fast', and with 'fused' norms, in training, a block's expand conv +
          norm + swish + depthwise conv and its depthwise norm + swish +
          squeeze-excite in float32 by mural's C++ kernels (mural/kernels, built
          on first use; native_expand_norm_act_depthwise,
          native_norm_act_depthwise_conv, native_norm_act_squeeze_excite): the
          CPU only;
  'auto'  'native' where the default backend is the CPU and the kernels build,
          'fast' where they do not, else 'xla'.
A checkpoint saved with one loads into the others.

Batch norm and the swish after it likewise (`norm_impl`, config.model.image.norm_impl):
  'flax'  nn.BatchNorm then nn.swish, autodiff'd;
  'fused' FusedBatchNorm: the same variables and function, one op whose custom
          VJP keeps only its input for the backward (see batch_norm_act); with
          'fast' convs, a block's expand norm + swish is applied by its depthwise
          conv, one op that keeps only the norm's input (norm_act_depthwise_conv);
  'auto'  'fused' on the CPU, else 'flax'.
"""

import dataclasses
import functools
import math
from typing import Any, Callable, NamedTuple, Optional, Tuple

import flax.linen as nn
import jax
from jax import lax
import jax.numpy as jnp

from mural import config_lib
from mural import kernels
from mural.models import remat

# (width, depth, resolution, dropout) per variant, from the reference.
VARIANTS = {
    "b0": (1.0, 1.0, 224, 0.2),
    "b1": (1.0, 1.1, 240, 0.2),
    "b2": (1.1, 1.2, 260, 0.3),
    "b3": (1.2, 1.4, 300, 0.3),
    "b4": (1.4, 1.8, 380, 0.4),
    "b5": (1.6, 2.2, 456, 0.4),
    "b6": (1.8, 2.6, 528, 0.5),
    "b7": (2.0, 3.1, 600, 0.5),
    "l2": (4.3, 5.3, 800, 0.5),
}


@dataclasses.dataclass(frozen=True)
class Stage:
  repeats: int
  kernel: int
  stride: int
  expand_ratio: int
  in_filters: int
  out_filters: int
  se_ratio: float = 0.25


# The B0 stages (the reference's 'r1_k3_s11_e1_i32_o16_se0.25', ...).
B0_STAGES = (
    Stage(1, 3, 1, 1, 32, 16),
    Stage(2, 3, 2, 6, 16, 24),
    Stage(2, 5, 2, 6, 24, 40),
    Stage(3, 3, 2, 6, 40, 80),
    Stage(3, 5, 1, 6, 80, 112),
    Stage(4, 5, 2, 6, 112, 192),
    Stage(1, 3, 1, 6, 192, 320),
)
STEM_FILTERS = 32
HEAD_FILTERS = 1280


def round_filters(filters: int, width: float, divisor: int = 8) -> int:
  """Channels scaled by width, rounded to a multiple of divisor (reference)."""
  filters *= width
  new = max(divisor, int(filters + divisor / 2) // divisor * divisor)
  if new < 0.9 * filters:  # Never round down by more than 10%.
    new += divisor
  return int(new)


def round_repeats(repeats: int, depth: float) -> int:
  return int(math.ceil(depth * repeats))


CONV = (None, None, "conv_in", "conv_out")  # Logical names of a conv kernel.
DEPTHWISE = (None, None, None, "conv_out")  # Depthwise kernel: one input channel per group.


CONV_IMPLS = ("auto", "xla", "fast", "native")
NORM_IMPLS = ("auto", "flax", "fused")


def _check_impl(impl: str, impls: tuple, field: str) -> str:
  """Returns impl, or raises ConfigError naming config.model.image.<field>."""
  if impl not in impls:
    raise config_lib.ConfigError(f"config.model.image.{field}: {impl!r} not in {list(impls)}")
  return impl


def _resolve(impl: str, on_cpu: str, elsewhere: str) -> str:
  """'auto' -> on_cpu on the CPU backend, elsewhere on others; other values unchanged."""
  if impl == "auto":
    return on_cpu if jax.default_backend() == "cpu" else elsewhere
  return impl


def check_conv_impl(impl: str) -> str:
  return _check_impl(impl, CONV_IMPLS, "conv_impl")


def resolve_conv_impl(impl: str) -> str:
  """'auto' -> 'native' on the CPU backend ('fast' if the kernels cannot be built), 'xla'
  elsewhere; others unchanged. 'native' off the CPU or without the kernels: ConfigError."""
  impl = check_conv_impl(impl)
  on_cpu = jax.default_backend() == "cpu"
  if impl == "native" and not (on_cpu and kernels.available()):
    why = kernels.unavailable_reason() if on_cpu else f"the backend is {jax.default_backend()}"
    raise config_lib.ConfigError(
        f"config.model.image.conv_impl: 'native' needs mural's C++ kernels on the CPU ({why}); "
        "'fast' is the same function in XLA ops")
  return _resolve(impl, "native" if on_cpu and kernels.available() else "fast", "xla")


def check_norm_impl(impl: str) -> str:
  return _check_impl(impl, NORM_IMPLS, "norm_impl")


def resolve_norm_impl(impl: str) -> str:
  """'auto' -> 'fused' on the CPU backend, 'flax' elsewhere; others unchanged."""
  return _resolve(check_norm_impl(impl), "fused", "flax")


def same_padding(size: int, kernel: int, stride: int) -> tuple[int, int]:
  """TF/XLA SAME padding of one spatial axis: the odd pixel goes after."""
  out = -(-size // stride)
  total = max((out - 1) * stride + kernel - size, 0)
  return total // 2, total - total // 2


def _accumulator(dtype):
  """Sums of bf16/f16 products are kept in float32, as convs and dots do."""
  return jnp.promote_types(dtype, jnp.float32)


def _taps(x, kernel: int, stride: int):
  """Yields (i, j, x_ij): x_ij[b, h, w] = padded x[b, stride * h + i, stride * w + j].

  Stride 1 pads x once and slices it; a strided tap is the strided slice of x
  that lands inside, padded: XLA then fuses it into its consumer instead of
  writing out the padded x (7-8x faster forward at stride 2 on CPU).
  """
  b, height, width, c = x.shape
  (top, bottom), (left, right) = (same_padding(height, kernel, stride),
                                  same_padding(width, kernel, stride))
  out_h, out_w = -(-height // stride), -(-width // stride)
  if stride == 1:
    # The barrier keeps XLA from fusing x's producer into every tap (or, for the centre
    # tap, slice(pad(x)) back into x's producer): x is written out padded once, and the
    # k * k taps read only that (norm + swish -> 5x5 conv forward at [128, 16, 16, 240]:
    # 22.8 -> 15.7 ms on 2 cores; bench_step.py's bytes accessed 48.8 -> 48.1 GB a step).
    x = lax.optimization_barrier(jnp.pad(x, ((0, 0), (top, bottom), (left, right), (0, 0))))
    for i in range(kernel):
      for j in range(kernel):
        yield i, j, lax.slice(x, (0, i, j, 0), (b, i + out_h, j + out_w, c))
    return

  def inside(offset, pad, size, out):
    """First and last output index whose input index o * stride + offset - pad is in x."""
    first = max(0, -(-(pad - offset) // stride))
    return first, min(out - 1, (size - 1 + pad - offset) // stride)

  for i in range(kernel):
    h0, h1 = inside(i, top, height, out_h)
    for j in range(kernel):
      w0, w1 = inside(j, left, width, out_w)
      if h0 > h1 or w0 > w1:  # The tap sees only padding.
        yield i, j, jnp.zeros((b, out_h, out_w, c), x.dtype)
        continue
      tap = lax.slice(x, (0, h0 * stride + i - top, w0 * stride + j - left, 0),
                      (b, h1 * stride + i - top + 1, w1 * stride + j - left + 1, c),
                      (1, stride, stride, 1))
      yield i, j, jnp.pad(tap, ((0, 0), (h0, out_h - 1 - h1), (w0, out_w - 1 - w1), (0, 0)))


def _depthwise_forward(x, kernel, stride):
  """sum_ij x_ij * kernel[i, j, 0], accumulated in float32 or wider."""
  acc = _accumulator(x.dtype)
  out = None
  for i, j, tap in _taps(x, kernel.shape[0], stride):
    term = tap.astype(acc) * kernel[i, j, 0].astype(acc)
    out = term if out is None else out + term
  return out.astype(x.dtype)


# Bytes of input per step of the depthwise kernel gradient's loop over the
# batch: the k * k shifted products of a step stay in cache instead of being
# written out whole (2-3x faster backward at [32-128, 64, 64, 96] on 2 cores).
DEPTHWISE_GRAD_CHUNK_BYTES = 2 << 20


def _batch_chunk(x) -> int:
  """Examples per step of the loop: a multiple of the batch's shards, the rest fitting the bytes.

  Under jit x is the global batch, split over the devices of the traced mesh
  (jax.sharding.get_abstract_mesh; the trainer traces its step under it): a
  step must take the same number of examples from every device, else XLA
  gathers the whole global batch onto each device to slice it (at 128
  devices, 128x the activations). The batch's shard count divides both the
  batch and the mesh size, hence their gcd: steps take a multiple of that.
  """
  mesh = jax.sharding.get_abstract_mesh()
  shards = math.gcd(x.shape[0], 1 if mesh is None or mesh.empty else mesh.size)
  local = x.shape[0] // shards
  per_example = math.prod(x.shape[1:]) * x.dtype.itemsize
  fit = max(1, DEPTHWISE_GRAD_CHUNK_BYTES // per_example)
  return shards * max(d for d in range(1, min(fit, local) + 1) if local % d == 0)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def depthwise_conv(x, kernel, stride: int):
  """Depthwise SAME conv: x [B,H,W,C], kernel [k,k,1,C] (HWIO, C groups) -> [B,H',W',C].

  The same function as lax.conv_general_dilated(x, kernel, (stride, stride),
  'SAME', feature_group_count=C) in NHWC/HWIO, as k * k shifted multiply-adds
  that XLA fuses into one loop. Reverse mode only (custom VJP).
  """
  return _depthwise_forward(x, kernel, stride)


def _depthwise_fwd(x, kernel, stride):
  return _depthwise_forward(x, kernel, stride), (x, kernel)


def _depthwise_input_grad(g, kernel, stride: int, height: int, width: int):
  """The transpose of the forward in x: g [B, H', W', C] -> dx [B, height, width, C].

  dx[u, v] = sum_ij up[u + i, v + j] * kernel[k-1-i, k-1-j]: g spread onto the
  input grid (stride - 1 zeros between its rows and columns) and padded, then
  the k * k dense shifted multiply-adds of the forward with the kernel
  flipped. jax.linear_transpose of the forward gives instead one pad of g per
  tap (with interior zeros when strided), which XLA's CPU back end fuses with
  g's producer and evaluates element by element, the producer once per tap:
  in bench_step.py's step, block 1's fused backward of its depthwise conv and
  batch norms at [128, 64, 64, 96] took 0.54 s that way, 0.05 s this way, and
  the step's op time went 11.4 -> 7.7 s (`--profile`, 2-core AMD EPYC).
  """
  k = kernel.shape[0]
  acc = _accumulator(g.dtype)
  b, rows, cols, c = g.shape
  (top, _), (left, _) = same_padding(height, k, stride), same_padding(width, k, stride)
  # Forward: y[h] = sum_i x[stride * h + i - top] * kernel[i]; so dx[u] gets g[h] * kernel[i]
  # for u = stride * h + i - top, i.e. up[u + k - 1 - i] with up[stride * h + k - 1 - top] = g[h].
  up = lax.pad(g, jnp.zeros((), g.dtype),
               ((0, 0, 0),
                (k - 1 - top, height - 1 + top - stride * (rows - 1), stride - 1),
                (k - 1 - left, width - 1 + left - stride * (cols - 1), stride - 1),
                (0, 0, 0)))
  dx = None
  for i in range(k):
    for j in range(k):
      tap = lax.slice(up, (0, i, j, 0), (b, i + height, j + width, c))
      term = tap.astype(acc) * kernel[k - 1 - i, k - 1 - j, 0].astype(acc)
      dx = term if dx is None else dx + term
  return dx.astype(g.dtype)


def _depthwise_kernel_grad(x, g, kernel, stride: int, prepare=lambda xc: xc):
  """dk[i, j, 0, c] = sum_bhw prepare(x)_ij * g, in a loop over batch chunks.

  Left to autodiff, XLA writes out every shifted x_ij whole. Chunk s holds examples
  s, s + steps, ...: a batch sharded over devices stays sharded (on the outer axis)
  and the loop runs over local data. `prepare` maps a chunk of x to the conv's input
  (norm_act_depthwise_conv recomputes its activation there, chunk by chunk)."""
  k = kernel.shape[0]
  acc = _accumulator(x.dtype)
  chunk = _batch_chunk(x)
  steps = x.shape[0] // chunk
  xs, gs = (a.reshape((chunk, steps) + a.shape[1:]) for a in (x, g))

  def step(s, total):
    xc, gc = (lax.dynamic_index_in_dim(a, s, axis=1, keepdims=False) for a in (xs, gs))
    gc = gc.astype(acc)
    sums = [jnp.sum(tap.astype(acc) * gc, axis=(0, 1, 2))
            for _, _, tap in _taps(prepare(xc), k, stride)]
    return total + jnp.stack(sums)

  dk = lax.fori_loop(0, steps, step, jnp.zeros((k * k, x.shape[-1]), acc))
  return dk.reshape(kernel.shape).astype(kernel.dtype)


def _depthwise_bwd(stride, residuals, g):
  x, kernel = residuals
  dx = _depthwise_input_grad(g, kernel, stride, x.shape[1], x.shape[2])
  return dx, _depthwise_kernel_grad(x, g, kernel, stride)


depthwise_conv.defvjp(_depthwise_fwd, _depthwise_bwd)


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
  dy = _depthwise_input_grad(g, kernel, stride, x.shape[1], x.shape[2])
  dk = _depthwise_kernel_grad(x, g, kernel, stride, activation)
  no_stats = jnp.zeros_like(mean)  # The op's statistics feed no loss.
  dx, d_scale, d_bias = _norm_act_bwd(epsilon, True, dtype, (x, scale, bias, mean, inv),
                                      (dy, no_stats, no_stats))
  return dx, d_scale, d_bias, dk


norm_act_depthwise_conv.defvjp(_norm_act_depthwise_fwd, _norm_act_depthwise_bwd)


def _native_applies(*arrays) -> bool:
  """The C++ kernels take float32 on one device. Under a mesh of several devices XLA
  could not split their custom calls over the batch and would gather it whole onto
  every device, so the XLA ops ('fast') run there instead (on the CPU a mesh of
  several devices is a test set-up; accelerators run 'xla')."""
  mesh = jax.sharding.get_abstract_mesh()
  one_device = mesh is None or mesh.empty or mesh.size == 1
  return one_device and all(a.dtype == jnp.float32 for a in arrays)


class WithStats(NamedTuple):
  """A native depthwise conv's output y with its batch statistics (_batch_stats's mean
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
  var = _variance(mean, moments[1] / n)
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
  mean, var = _batch_stats(x)
  inv = lax.rsqrt(var + epsilon)
  out = kernels.norm_act_depthwise_forward(x, mean, inv, scale, bias, kernel[:, :, 0], stride)
  return out, (x, scale, bias, mean, inv, kernel)


def _native_norm_act_depthwise_bwd(epsilon, stride, residuals, cotangents):
  del epsilon
  g, _ = cotangents  # The moments': stop_gradient in _with_stats.
  x, scale, bias, mean, inv, kernel = residuals
  dz, dk, d_bias, d_scale = kernels.norm_act_depthwise_backward(
      x, mean, inv, scale, bias, kernel[:, :, 0], g, stride)
  dx = _norm_input_grad((x - mean) * inv, scale, inv, dz, d_scale, d_bias)
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
  """_batch_stats(x @ w) from x's column sums and Gram matrix (K channels, not N = 6K):
  mean = mean(x) @ w, E[y^2] = diag(w' (x'x / n) w). Also returns the sums and the Gram
  matrix, which the backward of native_expand_norm_act_depthwise uses."""
  x = x.reshape(-1, x.shape[-1])
  w = w.reshape(x.shape[-1], -1)
  n = x.shape[0]
  col_sum, gram = jnp.sum(x, 0), x.T @ x
  mean = col_sum @ w / n
  var = _variance(mean, jnp.sum(w * (gram @ w), 0) / n)
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
  # _norm_input_grad: dy = a * (dz - d_bias / n - (y - mean) * inv * d_scale / n).
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
    stats = lax.stop_gradient(_batch_stats(y))
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


def pointwise_conv(x, kernel, stride: int = 1):
  """1x1 SAME conv as one [B*H*W, Cin] @ [Cin, Cout] matmul (a 4-D dot_general is slower)."""
  x = x[:, ::stride, ::stride]  # A 1x1 SAME conv never pads.
  b, h, w, c = x.shape
  y = jnp.dot(x.reshape(b * h * w, c), kernel.reshape(c, -1),
              preferred_element_type=_accumulator(x.dtype))
  return y.reshape(b, h, w, -1).astype(x.dtype)


def patches_conv(x, kernel, stride: int):
  """Dense k x k SAME conv as [B*H'*W', k*k*Cin] patches @ [k*k*Cin, Cout] (im2col)."""
  k = kernel.shape[0]
  patches = jnp.concatenate([tap for _, _, tap in _taps(x, k, stride)], axis=-1)
  return pointwise_conv(patches, kernel.reshape(1, 1, -1, kernel.shape[-1]))


def xla_conv(x, kernel, stride: int, groups: int = 1):
  """What nn.Conv computes: lax.conv_general_dilated, SAME, NHWC / HWIO."""
  return lax.conv_general_dilated(
      x, kernel, (stride, stride), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC"),
      feature_group_count=groups)


def conv2d(x, kernel, stride: int, groups: int, impl: str):
  """SAME conv of x [B,H,W,Cin] with an HWIO kernel by impl ('xla' | 'fast' | 'auto')."""
  impl = resolve_conv_impl(impl)
  k, _, per_group, features = kernel.shape
  if impl == "xla":
    return xla_conv(x, kernel, stride, groups)
  if groups == 1 and k == 1:
    return pointwise_conv(x, kernel, stride)
  if groups == 1:
    return patches_conv(x, kernel, stride)
  if per_group == 1 and groups == features == x.shape[-1]:
    return depthwise_conv(x, kernel, stride)
  return xla_conv(x, kernel, stride, groups)  # Grouped convs: not in EfficientNet.


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

  @nn.compact
  def __call__(self, inputs):
    """inputs: [B, H, W, Cin], or a NormAct that a 'fast' depthwise conv applies in its own op."""
    k, groups = self.kernel_size, self.feature_group_count
    impl = resolve_conv_impl(self.impl)
    fast = impl in ("fast", "native")
    kernel, bias = self.weights((inputs.x if isinstance(inputs, NormAct) else inputs).shape[-1])
    channels = kernel.shape[2] * groups
    if isinstance(inputs, NormAct) and isinstance(inputs.x, Pointwise):
      # MBConv makes one only where the native op applies.
      kernel, bias = nn.dtypes.promote_dtype(kernel, bias, dtype=self.dtype)
      if (impl == "native" and groups == self.features == channels and k > 1
          and _native_applies(inputs.x.x, inputs.x.w, inputs.scale, inputs.bias, kernel)):
        y = native_expand_norm_act_depthwise(inputs.x.x, inputs.x.w, inputs.scale, inputs.bias,
                                             kernel, inputs.epsilon, self.strides)
        return y if bias is None else y.y + bias
      inputs = inputs._replace(x=inputs.x.materialize())
    if isinstance(inputs, NormAct):
      x, kernel, bias = nn.dtypes.promote_dtype(inputs.x, kernel, bias, dtype=self.dtype)
      if (fast and groups == self.features == channels and k > 1
          and x.dtype == inputs.x.dtype == inputs.dtype):
        if impl == "native" and _native_applies(inputs.x, inputs.scale, inputs.bias, kernel):
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


def _conv(features, names, kernel=1, strides=1, use_bias=False, cls=Conv, **kw):
  """SAME-padded conv (or its ConvWeights) with the reference's init N(0, 2 / fan_out),
  named axes."""
  # The reference's fan_out is k * k * out_channels of its kernel; a depthwise
  # kernel there is [k, k, C, 1], so its fan_out is k * k, which is our fan_in.
  mode = "fan_in" if names == DEPTHWISE else "fan_out"
  return cls(
      features, kernel, strides=strides, use_bias=use_bias,
      kernel_init=nn.with_logical_partitioning(
          nn.initializers.variance_scaling(2.0, mode, "normal"), names),
      bias_init=nn.with_logical_partitioning(nn.initializers.zeros, ("conv_out",)),
      **kw)


def _batch_stats(x):
  """nn.BatchNorm's training statistics: the mean and E[x^2] - mean^2 (clipped at 0) over
  every axis but the last, in float32 or wider."""
  x = x.astype(_accumulator(x.dtype))
  axes = tuple(range(x.ndim - 1))
  mean = jnp.mean(x, axes)
  return mean, _variance(mean, jnp.mean(jnp.square(x), axes))


def _variance(mean, mean_square):
  """E[x^2] - mean^2, clipped at 0 (float32 rounding can take it below)."""
  return jnp.maximum(0.0, mean_square - jnp.square(mean))


def _swish_derivative(y):
  s = jax.nn.sigmoid(y)
  return s * (1 + y * (1 - s))


def _normalize_act(x, mean, inv, scale, bias, swish, dtype):
  y = (x.astype(mean.dtype) - mean) * (inv * scale) + bias
  return (nn.swish(y) if swish else y).astype(dtype)


def _norm_act_forward(x, scale, bias, epsilon, swish, dtype):
  mean, var = _batch_stats(x)
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
  dx = _norm_input_grad(xhat, scale, inv, g, d_scale, d_bias) + (g_mean + 2 * g_var * centred) / n
  return dx.astype(x.dtype), d_scale.astype(scale.dtype), d_bias.astype(bias.dtype)


def _norm_input_grad(xhat, scale, inv, g, d_scale, d_bias):
  """A training batch norm's input gradient, through x and the batch mean and variance,
  given g at its output (before any activation), d_scale = sum(g * xhat), d_bias = sum(g)."""
  n = xhat.size // xhat.shape[-1]
  return (scale * inv) * (g - d_bias / n - xhat * (d_scale / n))


batch_norm_act.defvjp(_norm_act_fwd, _norm_act_bwd)


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
        stats = (x.mean, x.var) if isinstance(x, WithStats) else _batch_stats(x)
      mean, var = lax.stop_gradient(stats)
      y = NormAct(x, scale, bias, self.epsilon, jnp.dtype(dtype))
    else:
      y, mean, var = batch_norm_act(x, scale, bias, self.epsilon, self.swish, jnp.dtype(dtype))
    if not self.is_initializing():
      ra_mean.value = self.momentum * ra_mean.value + (1 - self.momentum) * mean
      ra_var.value = self.momentum * ra_var.value + (1 - self.momentum) * var
    return y


def _norm(train, momentum, name, swish, impl="flax", defer=False, **kw):
  """Batch norm with the reference's epsilon and named scale/bias, then swish if `swish`;
  computed by nn.BatchNorm + nn.swish ('flax') or FusedBatchNorm ('fused'; 'auto': see
  resolve_norm_impl)."""
  args = dict(use_running_average=not train, momentum=momentum, epsilon=1e-3, name=name,
              scale_init=nn.with_logical_partitioning(nn.initializers.ones, ("norm",)),
              bias_init=nn.with_logical_partitioning(nn.initializers.zeros, ("norm",)), **kw)
  if resolve_norm_impl(impl) == "fused":
    return FusedBatchNorm(swish=swish, defer=defer, **args)
  bn = nn.BatchNorm(**args)
  return (lambda x: nn.swish(bn(x))) if swish else bn


class MBConv(nn.Module):
  """Inverted bottleneck: expand 1x1, depthwise kxk, squeeze-excite, project."""
  in_filters: int
  out_filters: int
  kernel: int
  stride: int
  expand_ratio: int
  se_ratio: float
  drop_connect_rate: float
  bn_momentum: float = 0.99
  dtype: Any = jnp.float32
  param_dtype: Any = jnp.float32
  conv_impl: str = "auto"  # 'auto' | 'xla' | 'fast' | 'native': see the module docstring.
  norm_impl: str = "auto"  # 'auto' | 'flax' | 'fused': see the module docstring.

  @property
  def _native(self) -> bool:
    return resolve_conv_impl(self.conv_impl) == "native"

  @nn.compact
  def __call__(self, inputs, train: bool):
    kw = dict(dtype=self.dtype, param_dtype=self.param_dtype)
    conv = functools.partial(_conv, impl=self.conv_impl, **kw)
    bn = lambda name, swish=True, defer=False: _norm(train, self.bn_momentum, name, swish,
                                                     self.norm_impl, defer, **kw)
    mid = self.in_filters * self.expand_ratio
    x = inputs
    if self.expand_ratio != 1:
      if (train and self._native and resolve_norm_impl(self.norm_impl) == "fused"
          and self.dtype == jnp.float32 and _native_applies(x)):
        # The conv, its norm + swish and the depthwise conv are one op there
        # (native_expand_norm_act_depthwise).
        w, _ = conv(mid, CONV, name="expand_conv", cls=ConvWeights)(x.shape[-1])
        x = Pointwise(x, w)
      else:
        x = conv(mid, CONV, name="expand_conv")(x)
      x = bn("expand_bn", defer=True)(x)  # The depthwise conv applies it (norm_act_depthwise_conv).
    x = conv(mid, DEPTHWISE, kernel=self.kernel, strides=self.stride,
             feature_group_count=mid, name="depthwise_conv")(x)
    # 'native': the squeeze-excite applies the norm (native_norm_act_squeeze_excite).
    x = bn("depthwise_bn", defer=bool(self.se_ratio) and self._native)(x)
    if self.se_ratio:
      # Squeeze width comes from the block's input filters, as in the reference.
      squeezed = max(1, int(self.in_filters * self.se_ratio))
      se = functools.partial(conv, names=CONV, use_bias=True)
      if (isinstance(x, NormAct) and x.dtype == jnp.float32
          and _native_applies(x.x, x.scale, x.bias)):
        w_reduce, b_reduce = se(squeezed, name="se_reduce", cls=ConvWeights)(mid)
        w_expand, b_expand = se(mid, name="se_expand", cls=ConvWeights)(squeezed)
        x = native_norm_act_squeeze_excite(x.x, x.scale, x.bias, w_reduce, b_reduce,
                                           w_expand, b_expand, x.epsilon)
      else:
        x = x.materialize() if isinstance(x, NormAct) else x
        s = jnp.mean(x, axis=(1, 2), keepdims=True)
        s = nn.swish(se(squeezed, name="se_reduce")(s))
        s = se(mid, name="se_expand")(s)
        x = x * nn.sigmoid(s)
    x = conv(self.out_filters, CONV, name="project_conv")(x)
    x = bn("project_bn", swish=False)(x)
    if self.stride == 1 and self.in_filters == self.out_filters:
      # Drop-connect: drop the whole residual branch per example.
      x = nn.Dropout(self.drop_connect_rate, broadcast_dims=(1, 2, 3),
                     deterministic=not train)(x)
      x = x + inputs
    return x


class EfficientNet(nn.Module):
  """Returns (pooled features [B, output_dim], {'logits' if num_classes})."""
  width: float
  depth: float
  dropout_rate: float
  stochastic_depth_rate: float = 0.2
  include_head: bool = False
  num_classes: int = 0
  bn_momentum: float = 0.99
  dtype: Any = jnp.float32
  param_dtype: Any = jnp.float32
  conv_impl: str = "auto"  # 'auto' | 'xla' | 'fast' | 'native': see the module docstring.
  norm_impl: str = "auto"  # 'auto' | 'flax' | 'fused': see the module docstring.
  remat: str = "none"  # Per MBConv block: mural/models/remat.py.
  num_stages: Optional[int] = None  # The first N of B0's 7 stages; None: all (every paper tower).

  @property
  def stages(self) -> Tuple[Stage, ...]:
    return B0_STAGES[:self.num_stages]

  @property
  def output_dim(self) -> int:
    return round_filters(HEAD_FILTERS if self.include_head else self.stages[-1].out_filters,
                         self.width)

  def blocks(self):
    """Per-block MBConv arguments after compound scaling, in order."""
    out = []
    for stage in self.stages:
      in_f = round_filters(stage.in_filters, self.width)
      out_f = round_filters(stage.out_filters, self.width)
      for r in range(round_repeats(stage.repeats, self.depth)):
        out.append(dict(in_filters=in_f if r == 0 else out_f, out_filters=out_f,
                        kernel=stage.kernel, stride=stage.stride if r == 0 else 1,
                        expand_ratio=stage.expand_ratio, se_ratio=stage.se_ratio))
    for i, block in enumerate(out):
      # Reference: the drop-connect rate grows linearly with the block index.
      block["drop_connect_rate"] = self.stochastic_depth_rate * i / len(out)
    return out

  @nn.compact
  def __call__(self, images, train: bool):
    check_conv_impl(self.conv_impl)
    check_norm_impl(self.norm_impl)
    kw = dict(dtype=self.dtype, param_dtype=self.param_dtype)
    conv = functools.partial(_conv, impl=self.conv_impl, **kw)
    x = conv(round_filters(STEM_FILTERS, self.width), CONV, kernel=3, strides=2,
             name="stem_conv")(images)
    # Where the first block starts with its depthwise conv and has no residual (B0-B7), that
    # conv applies the stem's norm + swish in its own op (norm_act_depthwise_conv), as a
    # block's expand norm is applied by its own. Not under remat: a NormAct holds Python values.
    first = self.blocks()[0]
    defer = (first["expand_ratio"] == 1 and self.remat == "none"
             and not (first["stride"] == 1 and first["in_filters"] == first["out_filters"]))
    x = _norm(train, self.bn_momentum, "stem_bn", True, self.norm_impl, defer, **kw)(x)
    block = remat.block(MBConv, self.remat, static_argnums=(2,))  # (self, inputs, train).
    for i, args in enumerate(self.blocks()):
      x = block(**args, bn_momentum=self.bn_momentum, conv_impl=self.conv_impl,
                norm_impl=self.norm_impl, name=f"block_{i}", **kw)(x, train)
    if self.include_head:
      x = conv(self.output_dim, CONV, name="head_conv")(x)
      x = _norm(train, self.bn_momentum, "head_bn", True, self.norm_impl, **kw)(x)
    features = jnp.mean(x, axis=(1, 2))
    aux = {}
    if self.num_classes:
      # Dropout only feeds the classifier, as in the reference; the embedding
      # given to the contrastive loss is the plain pooled feature.
      h = nn.Dropout(self.dropout_rate, deterministic=not train)(features)
      aux["logits"] = nn.Dense(
          self.num_classes, name="classifier",
          kernel_init=nn.with_logical_partitioning(
              nn.initializers.variance_scaling(1 / 3, "fan_out", "uniform"),
              ("conv_in", "conv_out")),
          bias_init=nn.with_logical_partitioning(nn.initializers.zeros, ("conv_out",)),
          **kw)(h)
    return features, aux


def from_config(image_config, dtype, param_dtype) -> EfficientNet:
  """config.model.image -> EfficientNet; coefficient fields override the variant.

  conv_impl, norm_impl and num_stages are read with .get (default 'auto', all) so configs
  without them work.
  """
  if image_config.variant not in VARIANTS:
    raise config_lib.ConfigError(
        f"config.model.image.variant: {image_config.variant!r} not in {sorted(VARIANTS)}")
  num_stages = image_config.get("num_stages")
  if num_stages is not None and not 1 <= num_stages <= len(B0_STAGES):
    raise config_lib.ConfigError(
        f"config.model.image.num_stages: {num_stages} not in 1..{len(B0_STAGES)} (None: all)")
  width, depth, _, dropout = VARIANTS[image_config.variant]
  pick = lambda override, default: default if override is None else override
  return EfficientNet(
      width=pick(image_config.width_coefficient, width),
      depth=pick(image_config.depth_coefficient, depth),
      dropout_rate=pick(image_config.dropout_rate, dropout),
      stochastic_depth_rate=image_config.stochastic_depth_rate,
      include_head=image_config.include_head,
      num_classes=image_config.num_classes,
      bn_momentum=image_config.bn_momentum,
      conv_impl=check_conv_impl(image_config.get("conv_impl", "auto")),
      norm_impl=check_norm_impl(image_config.get("norm_impl", "auto")),
      remat=remat.check(image_config.get("remat", "none"), "model.image.remat"),
      num_stages=num_stages,
      dtype=dtype, param_dtype=param_dtype)
