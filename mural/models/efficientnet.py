"""EfficientNet B0-B7 and L2 (Tan & Le 2019) as an image tower.

Follows the TF reference (tensorflow/tpu models/official/efficientnet): the B0
block table scaled by width/depth coefficients with `round_filters` /
`round_repeats`, MBConv blocks with squeeze-excite, swish, batch norm
(momentum 0.99, epsilon 1e-3), SAME padding and drop-connect whose rate grows
with the block index. The embedding is the global average pool of the last
MBConv stage (ALIGN drops the 1x1 head conv); the head conv and the classifier
are optional so parameter counts can be checked against the paper.

Convolutions and batch norms are image_layers' Conv and FusedBatchNorm (or
nn.BatchNorm), computed by the implementation that config.model.image.conv_impl
and norm_impl name (`conv_impl`, `norm_impl`; op_impls lists them). With
'native' convs and 'fused' norms, in training, MBConv hands a block's expand
conv, norms and squeeze-excite to mural's C++ kernels (native_ops).
"""

import dataclasses
import functools
import math
from typing import Any, Optional, Tuple

import flax.linen as nn
import jax.numpy as jnp

from mural import config_lib
from mural.models import remat
from mural.models.image_layers import CONV
from mural.models.image_layers import Conv
from mural.models.image_layers import ConvWeights
from mural.models.image_layers import DEPTHWISE
from mural.models.image_layers import FusedBatchNorm
from mural.models.image_layers import NormAct
from mural.models.image_layers import pixel_normalize
from mural.models.image_layers import pixel_triple
from mural.models.native_ops import native_applies
from mural.models.native_ops import native_norm_act_squeeze_excite
from mural.models.native_ops import Pointwise
from mural.models.op_impls import check_conv_impl
from mural.models.op_impls import check_norm_impl
from mural.models.op_impls import resolve_conv_impl
from mural.models.op_impls import resolve_norm_impl


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
  conv_impl: str = "auto"  # 'auto' | 'xla' | 'fast' | 'native': see mural/models/op_impls.py.
  norm_impl: str = "auto"  # 'auto' | 'flax' | 'fused': see mural/models/op_impls.py.

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
          and self.dtype == jnp.float32 and native_applies(x)):
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
          and native_applies(x.x, x.scale, x.bias)):
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
  conv_impl: str = "auto"  # 'auto' | 'xla' | 'fast' | 'native': see mural/models/op_impls.py.
  norm_impl: str = "auto"  # 'auto' | 'flax' | 'fused': see mural/models/op_impls.py.
  remat: str = "none"  # Per MBConv block: mural/models/remat.py.
  num_stages: Optional[int] = None  # The first N of B0's 7 stages; None: all (every paper tower).
  # Per-channel input normalisation in [0, 255] units (an imported ImageNet tower's); None: none.
  pixel_mean: Optional[Tuple[float, float, float]] = None
  pixel_std: Optional[Tuple[float, float, float]] = None

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
    images = pixel_normalize(images, self.pixel_mean, self.pixel_std)
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
      pixel_mean=pixel_triple(image_config.get("pixel_mean"), "pixel_mean"),
      pixel_std=pixel_triple(image_config.get("pixel_std"), "pixel_std"),
      dtype=dtype, param_dtype=param_dtype)
