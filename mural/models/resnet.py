"""ResNet-10/18/34/50/101/152 (He et al. 2016; 10 is 18 with one block per stage) as an image
tower (Globetrotter's image network).

torchvision's layout: a 7x7 stride-2 stem conv, batch norm, ReLU, 3x3
stride-2 max pool, four stages of basic (10, 18, 34) or bottleneck (50+) blocks
with the stride on the 3x3 conv (ResNet v1.5) and a 1x1 conv + batch norm on
the shortcut where the shape changes; the embedding is the global average
pool of the last stage (the classifier is not part of the tower). `width`
(64 in the paper) scales every stage's channels, for towers small enough to
train on a CPU. Convs are SAME-padded and computed by the EfficientNet
tower's `image_layers.Conv` (same parameters, 'fast' maths on CPU); batch norm uses
torchvision's momentum 0.1 (Flax 0.9) and epsilon 1e-5; the last batch norm
of each residual branch starts at zero scale (Goyal et al. 2017), so each
block starts as the identity.
"""

from typing import Any

import flax.linen as nn
import jax.numpy as jnp

from mural import config_lib
from mural.models import image_layers
from mural.models import op_impls

# depth -> (block kind, blocks per stage).
DEPTHS = {
    10: ("basic", (1, 1, 1, 1)),
    18: ("basic", (2, 2, 2, 2)),
    34: ("basic", (3, 4, 6, 3)),
    50: ("bottleneck", (3, 4, 6, 3)),
    101: ("bottleneck", (3, 4, 23, 3)),
    152: ("bottleneck", (3, 8, 36, 3)),
}
_EXPANSION = {"basic": 1, "bottleneck": 4}
CONV = image_layers.CONV


def _conv(features, kernel, strides, impl, name, **kw):
  """He init (fan_out, as torchvision), no bias, named axes."""
  return image_layers.Conv(
      features, kernel, strides=strides, impl=impl, name=name,
      kernel_init=nn.with_logical_partitioning(nn.initializers.variance_scaling(2.0, "fan_out", "normal"), CONV),
      **kw)


def _bn(train, name, zero=False, **kw):
  return nn.BatchNorm(
      use_running_average=not train, momentum=0.9, epsilon=1e-5, name=name,
      scale_init=nn.with_logical_partitioning(nn.initializers.zeros if zero else nn.initializers.ones, ("norm",)),
      bias_init=nn.with_logical_partitioning(nn.initializers.zeros, ("norm",)), **kw)


class Block(nn.Module):
  """Basic (3x3, 3x3) or bottleneck (1x1, 3x3, 1x1 x4) residual block."""
  kind: str
  features: int
  strides: int
  conv_impl: str = "auto"
  dtype: Any = jnp.float32
  param_dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, x, train: bool):
    kw = dict(dtype=self.dtype, param_dtype=self.param_dtype)
    conv = lambda f, k, s, name: _conv(f, k, s, self.conv_impl, name, **kw)
    out_features = self.features * _EXPANSION[self.kind]
    if self.kind == "basic":
      y = nn.relu(_bn(train, "bn1", **kw)(conv(self.features, 3, self.strides, "conv1")(x)))
      y = _bn(train, "bn2", zero=True, **kw)(conv(self.features, 3, 1, "conv2")(y))
    else:
      y = nn.relu(_bn(train, "bn1", **kw)(conv(self.features, 1, 1, "conv1")(x)))
      y = nn.relu(_bn(train, "bn2", **kw)(conv(self.features, 3, self.strides, "conv2")(y)))
      y = _bn(train, "bn3", zero=True, **kw)(conv(out_features, 1, 1, "conv3")(y))
    if self.strides != 1 or x.shape[-1] != out_features:
      x = _bn(train, "downsample_bn", **kw)(conv(out_features, 1, self.strides, "downsample_conv")(x))
    return nn.relu(x + y)


class ResNet(nn.Module):
  """Returns (pooled last stage [B, output_dim], {'feature_map': [B, h, w, output_dim]})."""
  depth: int = 18
  width: int = 64
  conv_impl: str = "auto"
  dtype: Any = jnp.float32
  param_dtype: Any = jnp.float32

  @property
  def output_dim(self) -> int:
    kind, _ = DEPTHS[self.depth]
    return 8 * self.width * _EXPANSION[kind]

  @nn.compact
  def __call__(self, images, train: bool):
    kw = dict(dtype=self.dtype, param_dtype=self.param_dtype)
    kind, stages = DEPTHS[self.depth]
    x = _conv(self.width, 7, 2, self.conv_impl, "stem_conv", **kw)(images.astype(self.dtype))
    x = nn.relu(_bn(train, "stem_bn", **kw)(x))
    x = nn.max_pool(x, (3, 3), strides=(2, 2), padding="SAME")
    for s, blocks in enumerate(stages):
      for b in range(blocks):
        strides = 2 if s > 0 and b == 0 else 1
        x = Block(kind, self.width * 2**s, strides, self.conv_impl, name=f"stage{s + 1}_block{b}", **kw)(x, train)
    return jnp.mean(x, axis=(1, 2)), {"feature_map": x}


def from_config(image_config, dtype, param_dtype) -> ResNet:
  """config.model.image (depth, width, conv_impl) -> ResNet."""
  depth, width = image_config.depth, image_config.width
  if depth not in DEPTHS:
    raise config_lib.ConfigError(f"config.model.image.depth: {depth!r} not in {sorted(DEPTHS)}")
  if not isinstance(width, int) or width < 1:
    raise config_lib.ConfigError(f"config.model.image.width: must be an int >= 1, got {width!r}")
  return ResNet(depth=depth, width=width,
                conv_impl=op_impls.check_conv_impl(image_config.get("conv_impl", "auto")),
                dtype=dtype, param_dtype=param_dtype)
