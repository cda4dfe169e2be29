"""Which implementation computes the image towers' convolutions and batch norms.

Each choice is the same function with the same parameters, so a checkpoint saved with one
loads into the others; they differ in speed and memory, by backend.

Convolutions (`conv_impl`, config.model.image.conv_impl):
  'xla'   lax.conv_general_dilated, as nn.Conv: good on GPU and TPU;
  'fast'  depthwise convs as k * k shifted multiply-adds, pointwise (1x1)
          convs as one matmul and other convs as patches @ kernel (conv_ops): XLA's
          CPU convolutions are several times slower than these (jax-ml/jax#23713,
          openxla/xla#34273; benchmarks/bench_convs.py);
  'native' 'fast', and with 'fused' norms, in training, a block's expand conv +
          norm + swish + depthwise conv and its depthwise norm + swish +
          squeeze-excite in float32 by mural's C++ kernels (mural/kernels, built
          on first use; native_ops: native_expand_norm_act_depthwise,
          native_norm_act_depthwise_conv, native_norm_act_squeeze_excite): the
          CPU only;
  'auto'  'native' where the default backend is the CPU and the kernels build,
          'fast' where they do not, else 'xla'.

Batch norm and the swish after it (`norm_impl`, config.model.image.norm_impl):
  'flax'  nn.BatchNorm then nn.swish, autodiff'd;
  'fused' FusedBatchNorm (image_layers): the same variables and function, one op
          whose custom VJP keeps only its input for the backward (norm_ops.batch_norm_act);
          with 'fast' convs, a block's expand norm + swish is applied by its depthwise
          conv, one op that keeps only the norm's input (norm_ops.norm_act_depthwise_conv);
  'auto'  'fused' on the CPU, else 'flax'.
"""

import jax

from mural import config_lib
from mural import kernels


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
