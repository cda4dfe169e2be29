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

Public ImageNet ResNets differ in small ways, each a field, so their weights
compute here what they compute there (mural.pretrained): keras.applications'
ResNet-50/101/152 are v1 (`stride_on='first'`: the stride on a bottleneck's
first 1x1 conv), with conv biases and epsilon 1.001e-5; theirs and PyTorch's pad
(k - 1) // 2 on every side (`padding='symmetric'`), where TF's SAME pads one
pixel less before a strided conv or pool. `pixel_mean`/`pixel_std` give the
per-channel input normalisation a checkpoint was trained with.
"""

from typing import Any, Optional, Tuple

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


STRIDE_ON = ("middle", "first")  # A bottleneck's 3x3 conv (v1.5) or its first 1x1 conv (v1).


def _conv(features, kernel, strides, impl, name, bias=False, padding="same", **kw):
  """He init (fan_out, as torchvision), named axes; a bias only where a checkpoint has one."""
  return image_layers.Conv(
      features, kernel, strides=strides, impl=impl, name=name, use_bias=bias, padding=padding,
      kernel_init=nn.with_logical_partitioning(nn.initializers.variance_scaling(2.0, "fan_out", "normal"), CONV),
      bias_init=nn.with_logical_partitioning(nn.initializers.zeros, ("conv_out",)),
      **kw)


def _bn(train, name, zero=False, epsilon=1e-5, **kw):
  return nn.BatchNorm(
      use_running_average=not train, momentum=0.9, epsilon=epsilon, name=name,
      scale_init=nn.with_logical_partitioning(nn.initializers.zeros if zero else nn.initializers.ones, ("norm",)),
      bias_init=nn.with_logical_partitioning(nn.initializers.zeros, ("norm",)), **kw)


class Block(nn.Module):
  """Basic (3x3, 3x3) or bottleneck (1x1, 3x3, 1x1 x4) residual block."""
  kind: str
  features: int
  strides: int
  conv_impl: str = "auto"
  stride_on: str = "middle"
  conv_bias: bool = False
  bn_epsilon: float = 1e-5
  padding: str = "same"
  dtype: Any = jnp.float32
  param_dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, x, train: bool):
    kw = dict(dtype=self.dtype, param_dtype=self.param_dtype)
    conv = lambda f, k, s, name: _conv(f, k, s, self.conv_impl, name, self.conv_bias,
                                       self.padding, **kw)
    bn = lambda name, zero=False: _bn(train, name, zero, self.bn_epsilon, **kw)
    out_features = self.features * _EXPANSION[self.kind]
    if self.kind == "basic":
      y = nn.relu(bn("bn1")(conv(self.features, 3, self.strides, "conv1")(x)))
      y = bn("bn2", zero=True)(conv(self.features, 3, 1, "conv2")(y))
    else:
      first, middle = (self.strides, 1) if self.stride_on == "first" else (1, self.strides)
      y = nn.relu(bn("bn1")(conv(self.features, 1, first, "conv1")(x)))
      y = nn.relu(bn("bn2")(conv(self.features, 3, middle, "conv2")(y)))
      y = bn("bn3", zero=True)(conv(out_features, 1, 1, "conv3")(y))
    if self.strides != 1 or x.shape[-1] != out_features:
      x = bn("downsample_bn")(conv(out_features, 1, self.strides, "downsample_conv")(x))
    return nn.relu(x + y)


class ResNet(nn.Module):
  """Returns (pooled last stage [B, output_dim], {'feature_map': [B, h, w, output_dim]})."""
  depth: int = 18
  width: int = 64
  conv_impl: str = "auto"
  stride_on: str = "middle"
  conv_bias: bool = False
  bn_epsilon: float = 1e-5
  padding: str = "same"  # image_layers.PADDINGS: of the strided convs and the stem's max pool.
  pixel_mean: Optional[Tuple[float, float, float]] = None
  pixel_std: Optional[Tuple[float, float, float]] = None
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
    images = image_layers.pixel_normalize(images, self.pixel_mean, self.pixel_std)
    x = _conv(self.width, 7, 2, self.conv_impl, "stem_conv", self.conv_bias, self.padding,
              **kw)(images.astype(self.dtype))
    x = nn.relu(_bn(train, "stem_bn", epsilon=self.bn_epsilon, **kw)(x))
    x = nn.max_pool(x, (3, 3), strides=(2, 2),
                    padding=((1, 1), (1, 1)) if self.padding == "symmetric" else "SAME")
    for s, blocks in enumerate(stages):
      for b in range(blocks):
        strides = 2 if s > 0 and b == 0 else 1
        x = Block(kind, self.width * 2**s, strides, self.conv_impl, self.stride_on,
                  self.conv_bias, self.bn_epsilon, self.padding,
                  name=f"stage{s + 1}_block{b}", **kw)(x, train)
    return jnp.mean(x, axis=(1, 2)), {"feature_map": x}


def from_config(image_config, dtype, param_dtype) -> ResNet:
  """config.model.image (depth, width, conv_impl; stride_on, conv_bias, bn_epsilon, padding,
  pixel_mean, pixel_std where a checkpoint sets them) -> ResNet."""
  depth, width = image_config.depth, image_config.width
  if depth not in DEPTHS:
    raise config_lib.ConfigError(f"config.model.image.depth: {depth!r} not in {sorted(DEPTHS)}")
  if not isinstance(width, int) or width < 1:
    raise config_lib.ConfigError(f"config.model.image.width: must be an int >= 1, got {width!r}")
  get = image_config.get
  for field, allowed in (("stride_on", STRIDE_ON), ("padding", image_layers.PADDINGS)):
    if get(field, allowed[0]) not in allowed:
      raise config_lib.ConfigError(f"config.model.image.{field}: {get(field)!r} not in {allowed}")
  return ResNet(depth=depth, width=width,
                conv_impl=op_impls.check_conv_impl(get("conv_impl", "auto")),
                stride_on=get("stride_on", "middle"), conv_bias=get("conv_bias", False),
                bn_epsilon=get("bn_epsilon", 1e-5), padding=get("padding", "same"),
                pixel_mean=image_layers.pixel_triple(get("pixel_mean"), "pixel_mean"),
                pixel_std=image_layers.pixel_triple(get("pixel_std"), "pixel_std"),
                dtype=dtype, param_dtype=param_dtype)
