"""EfficientNet B0-B7 and L2 (Tan & Le 2019) as an image tower.

Follows the TF reference (tensorflow/tpu models/official/efficientnet): the B0
block table scaled by width/depth coefficients with `round_filters` /
`round_repeats`, MBConv blocks with squeeze-excite, swish, batch norm
(momentum 0.99, epsilon 1e-3), SAME padding and drop-connect whose rate grows
with the block index. The embedding is the global average pool of the last
MBConv stage (ALIGN drops the 1x1 head conv); the head conv and the classifier
are optional so parameter counts can be checked against the paper.
"""

import dataclasses
import math
from typing import Any

import flax.linen as nn
import jax.numpy as jnp

from mural import config_lib

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


def _conv(features, names, kernel=1, strides=1, use_bias=False, **kw):
  """SAME-padded conv with the reference's init N(0, 2 / fan_out), named axes."""
  # The reference's fan_out is k * k * out_channels of its kernel; a depthwise
  # kernel there is [k, k, C, 1], so its fan_out is k * k, which is our fan_in.
  mode = "fan_in" if names == DEPTHWISE else "fan_out"
  return nn.Conv(
      features, (kernel, kernel), strides=strides, padding="SAME", use_bias=use_bias,
      kernel_init=nn.with_logical_partitioning(
          nn.initializers.variance_scaling(2.0, mode, "normal"), names),
      bias_init=nn.with_logical_partitioning(nn.initializers.zeros, ("conv_out",)),
      **kw)


def _batch_norm(train, momentum, name, **kw):
  """BatchNorm with the reference's epsilon and named scale/bias."""
  return nn.BatchNorm(
      use_running_average=not train, momentum=momentum, epsilon=1e-3, name=name,
      scale_init=nn.with_logical_partitioning(nn.initializers.ones, ("norm",)),
      bias_init=nn.with_logical_partitioning(nn.initializers.zeros, ("norm",)), **kw)


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

  @nn.compact
  def __call__(self, inputs, train: bool):
    kw = dict(dtype=self.dtype, param_dtype=self.param_dtype)
    bn = lambda name: _batch_norm(train, self.bn_momentum, name, **kw)
    mid = self.in_filters * self.expand_ratio
    x = inputs
    if self.expand_ratio != 1:
      x = _conv(mid, CONV, name="expand_conv", **kw)(x)
      x = nn.swish(bn("expand_bn")(x))
    x = _conv(mid, DEPTHWISE, kernel=self.kernel, strides=self.stride,
              feature_group_count=mid, name="depthwise_conv", **kw)(x)
    x = nn.swish(bn("depthwise_bn")(x))
    if self.se_ratio:
      # Squeeze width comes from the block's input filters, as in the reference.
      squeezed = max(1, int(self.in_filters * self.se_ratio))
      s = jnp.mean(x, axis=(1, 2), keepdims=True)
      s = nn.swish(_conv(squeezed, CONV, use_bias=True, name="se_reduce", **kw)(s))
      s = _conv(mid, CONV, use_bias=True, name="se_expand", **kw)(s)
      x = x * nn.sigmoid(s)
    x = _conv(self.out_filters, CONV, name="project_conv", **kw)(x)
    x = bn("project_bn")(x)
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

  @property
  def output_dim(self) -> int:
    return round_filters(HEAD_FILTERS if self.include_head else B0_STAGES[-1].out_filters,
                         self.width)

  def blocks(self):
    """Per-block MBConv arguments after compound scaling, in order."""
    out = []
    for stage in B0_STAGES:
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
    kw = dict(dtype=self.dtype, param_dtype=self.param_dtype)
    x = _conv(round_filters(STEM_FILTERS, self.width), CONV, kernel=3, strides=2,
              name="stem_conv", **kw)(images)
    x = nn.swish(_batch_norm(train, self.bn_momentum, "stem_bn", **kw)(x))
    for i, args in enumerate(self.blocks()):
      x = MBConv(**args, bn_momentum=self.bn_momentum, name=f"block_{i}", **kw)(x, train)
    if self.include_head:
      x = _conv(self.output_dim, CONV, name="head_conv", **kw)(x)
      x = nn.swish(_batch_norm(train, self.bn_momentum, "head_bn", **kw)(x))
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
  """config.model.image -> EfficientNet; coefficient fields override the variant."""
  if image_config.variant not in VARIANTS:
    raise config_lib.ConfigError(
        f"config.model.image.variant: {image_config.variant!r} not in {sorted(VARIANTS)}")
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
      dtype=dtype, param_dtype=param_dtype)
