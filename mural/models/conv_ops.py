"""SAME convolutions of NHWC inputs with HWIO kernels, as functions, in XLA ops.

xla_conv is lax.conv_general_dilated, what nn.Conv computes. The others compute the
same function in ops that XLA's CPU back end runs several times faster than its
convolutions (benchmarks/bench_convs.py): a depthwise conv as k * k shifted
multiply-adds with its own VJP (depthwise_conv; its input and kernel gradients also
serve the norm ops that end in one, norm_ops), a pointwise (1x1) conv as one matmul
(pointwise_conv) and any other dense conv as patches @ kernel (patches_conv). conv2d
picks one by the implementation name (op_impls).
"""

import functools
import math

import jax
from jax import lax
import jax.numpy as jnp

from mural.models.op_impls import resolve_conv_impl


def same_padding(size: int, kernel: int, stride: int) -> tuple[int, int]:
  """TF/XLA SAME padding of one spatial axis: the odd pixel goes after."""
  out = -(-size // stride)
  total = max((out - 1) * stride + kernel - size, 0)
  return total // 2, total - total // 2


def accumulator(dtype):
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
  acc = accumulator(x.dtype)
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


def depthwise_input_grad(g, kernel, stride: int, height: int, width: int):
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
  acc = accumulator(g.dtype)
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


def depthwise_kernel_grad(x, g, kernel, stride: int, prepare=lambda xc: xc):
  """dk[i, j, 0, c] = sum_bhw prepare(x)_ij * g, in a loop over batch chunks.

  Left to autodiff, XLA writes out every shifted x_ij whole. Chunk s holds examples
  s, s + steps, ...: a batch sharded over devices stays sharded (on the outer axis)
  and the loop runs over local data. `prepare` maps a chunk of x to the conv's input
  (norm_act_depthwise_conv recomputes its activation there, chunk by chunk)."""
  k = kernel.shape[0]
  acc = accumulator(x.dtype)
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
  dx = depthwise_input_grad(g, kernel, stride, x.shape[1], x.shape[2])
  return dx, depthwise_kernel_grad(x, g, kernel, stride)


depthwise_conv.defvjp(_depthwise_fwd, _depthwise_bwd)


def pointwise_conv(x, kernel, stride: int = 1):
  """1x1 SAME conv as one [B*H*W, Cin] @ [Cin, Cout] matmul (a 4-D dot_general is slower)."""
  x = x[:, ::stride, ::stride]  # A 1x1 SAME conv never pads.
  b, h, w, c = x.shape
  y = jnp.dot(x.reshape(b * h * w, c), kernel.reshape(c, -1),
              preferred_element_type=accumulator(x.dtype))
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


def symmetric_conv(x, kernel, stride: int, groups: int = 1):
  """A conv padded (k - 1) // 2 on every side, as PyTorch and Keras' explicit ZeroPadding
  pad (torchvision / timm / keras.applications ResNets): at stride 1 the same as SAME; at
  stride 2 SAME pads one pixel less before and one more after."""
  pad = (kernel.shape[0] - 1) // 2
  return lax.conv_general_dilated(
      x, kernel, (stride, stride), ((pad, pad), (pad, pad)),
      dimension_numbers=("NHWC", "HWIO", "NHWC"), feature_group_count=groups)


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
