"""keras.applications' weight files -> mural's EfficientNet and ResNet towers.

EfficientNetB0-B7 (`efficientnetb0_notop.h5`, ...; the variant is read off the file: its stem
width and blocks per stage) and ResNet50/101/152 (`resnet50_weights_tf_dim_ordering_tf_kernels_notop.h5`,
...): the HDF5 layout those files have, which Keras writes with the HDF5 format. Each tower
computes what the Keras model computes from the same RGB pixels in eval mode, pooled:

- EfficientNet: with its 1x1 head conv (Keras' pooled features, 1280 x width); the input
  normalisation of the file's Normalization layer becomes model.image.pixel_mean / pixel_std
  (keras.applications' ImageNet files store the standard deviations where the variance goes
  and divide by their square root once more: the ImageNet constants are read that way).
- ResNet (v1: the stride on each bottleneck's first conv, conv biases, epsilon 1.001e-5,
  symmetric padding): Keras' ResNets read BGR pixels less the ImageNet mean ('caffe'); the stem
  kernel's input channels are reversed so the tower reads RGB, and the mean becomes pixel_mean.
"""

import re

import numpy as np

from mural.models import efficientnet
from mural.models import resnet
from mural.pretrained.source import CheckpointError, KerasH5, Mapped, Tower

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
CAFFE_MEAN_RGB = (123.68, 116.779, 103.939)
_BN = (("scale", "gamma", "params"), ("bias", "beta", "params"), ("mean", "moving_mean", "batch_stats"),
       ("var", "moving_variance", "batch_stats"))


def _get(reader, path, *names):
  """reader's tensor '<names[i]>' for the first name it has (Keras 2 and 3 name a depthwise
  kernel differently), or a one-line error."""
  for name in names:
    if name in reader.names():
      return name
  raise CheckpointError(f"{path}: no tensor {' or '.join(names)}")


def _map(reader, path, ours, theirs, transform="", fn=None):
  return Mapped(ours, theirs, transform, lambda: fn(reader.get(theirs)) if fn else reader.get(theirs))


def _bn(reader, path, tower, ours, theirs):
  return [_map(reader, path, f"{collection}/{tower}/{ours}/{mine}", _get(reader, path, f"{theirs}/{keras}"))
          for mine, keras, collection in _BN]


def _stage_blocks(names, pattern):
  """{stage: number of blocks} from tensor names matching `pattern` (groups: stage, block)."""
  out = {}
  for name in names:
    m = re.match(pattern, name)
    if m:
      out.setdefault(int(m.group(1)), set()).add(m.group(2))
  return {s: len(b) for s, b in sorted(out.items())}


def _efficientnet_variant(reader, path) -> str:
  """The variant whose stem and head widths and blocks per stage the file has (B1 and B2 differ
  in width only)."""
  stem = reader.get(_get(reader, path, "stem_conv/kernel")).shape[-1]
  head = reader.get(_get(reader, path, "top_conv/kernel")).shape[-1]
  found = [n for _, n in sorted(_stage_blocks(reader.names(), r"block(\d)([a-z])_").items())]
  for variant, (width, depth, _, _) in efficientnet.VARIANTS.items():
    expected = [efficientnet.round_repeats(s.repeats, depth) for s in efficientnet.B0_STAGES]
    if (efficientnet.round_filters(efficientnet.STEM_FILTERS, width) == stem and expected == found
        and efficientnet.round_filters(efficientnet.HEAD_FILTERS, width) == head):
      return variant
  raise CheckpointError(f"{path}: an EfficientNet with stem width {stem}, head width {head} and blocks "
                        f"per stage {found} is none of {sorted(efficientnet.VARIANTS)}")


def _pixel_normalisation(reader):
  """(pixel_mean, pixel_std) in [0, 255] units of the file's Normalization layer (Keras names it
  'normalization', or 'normalization_<n>' when a process built several models), and a note."""
  layers = sorted({n.rsplit("/", 1)[0] for n in reader.names() if re.fullmatch(r"normalization(_\d+)?/mean", n)})
  if len(layers) > 1:
    raise CheckpointError(f"several Normalization layers ({', '.join(layers)}): not one EfficientNet's file")
  if not layers:
    return ([255 * m for m in IMAGENET_MEAN], [255 * s for s in IMAGENET_STD],
            "no Normalization layer in the file: keras.applications' ImageNet mean and std")
  mean = reader.get(f"{layers[0]}/mean").reshape(-1)
  variance = reader.get(f"{layers[0]}/variance").reshape(-1)
  if np.allclose(variance, IMAGENET_STD, atol=1e-6):
    std, note = variance, "ImageNet's std stored as the variance (keras.applications' ImageNet files)"
  else:
    std, note = np.sqrt(variance), "the Normalization layer's mean and variance"
  return [float(255 * m) for m in mean], [float(255 * s) for s in std], note


def read_efficientnet(path: str) -> Tower:
  return efficientnet_tower(KerasH5(path), path)


def efficientnet_tower(reader, path: str) -> Tower:
  """The Tower of a Keras EfficientNet's weights (reader: names() and get(name), as KerasH5)."""
  variant = _efficientnet_variant(reader, path)
  width, depth, _, _ = efficientnet.VARIANTS[variant]
  mean, std, note = _pixel_normalisation(reader)
  fields = dict(name="efficientnet", variant=variant, width_coefficient=None, depth_coefficient=None,
                include_head=True, num_classes=0, num_stages=None, pixel_mean=mean, pixel_std=std)
  t = "image_tower"
  tensors = [_map(reader, path, f"params/{t}/stem_conv/kernel", "stem_conv/kernel")]
  tensors += _bn(reader, path, t, "stem_bn", "stem_bn")
  index = 0
  for s, stage in enumerate(efficientnet.B0_STAGES):
    for r in range(efficientnet.round_repeats(stage.repeats, depth)):
      k, b = f"block{s + 1}{chr(r + 97)}_", f"block_{index}"
      if stage.expand_ratio != 1:
        tensors.append(_map(reader, path, f"params/{t}/{b}/expand_conv/kernel", f"{k}expand_conv/kernel"))
        tensors += _bn(reader, path, t, f"{b}/expand_bn", f"{k}expand_bn")
      tensors.append(_map(reader, path, f"params/{t}/{b}/depthwise_conv/kernel",
                          _get(reader, path, f"{k}dwconv/kernel", f"{k}dwconv/depthwise_kernel"),
                          "[k, k, C, 1] -> [k, k, 1, C]", lambda x: x.transpose(0, 1, 3, 2)))
      tensors += _bn(reader, path, t, f"{b}/depthwise_bn", f"{k}bn")
      for part in ("se_reduce", "se_expand"):
        for w in ("kernel", "bias"):
          tensors.append(_map(reader, path, f"params/{t}/{b}/{part}/{w}", f"{k}{part}/{w}"))
      tensors.append(_map(reader, path, f"params/{t}/{b}/project_conv/kernel", f"{k}project_conv/kernel"))
      tensors += _bn(reader, path, t, f"{b}/project_bn", f"{k}project_bn")
      index += 1
  tensors.append(_map(reader, path, f"params/{t}/head_conv/kernel", "top_conv/kernel"))
  tensors += _bn(reader, path, t, "head_bn", "top_bn")
  used = {m.source for m in tensors}
  unused = {n: (note if n.startswith("normalization") else "the classifier (the tower ends at the pooled features)")
            for n in reader.names() if n not in used}
  return Tower("image", fields, {}, None, tensors, unused,
               {"format": "keras_efficientnet", "path": str(path), "variant": variant})


def read_resnet(path: str) -> Tower:
  return resnet_tower(KerasH5(path), path)


def resnet_tower(reader, path: str) -> Tower:
  """The Tower of a Keras ResNet's weights (reader: names() and get(name), as KerasH5)."""
  blocks = _stage_blocks(reader.names(), r"conv(\d)_block(\d+)_")
  per_stage = tuple(blocks.get(s, 0) for s in (2, 3, 4, 5))
  depth = next((d for d, (kind, stages) in resnet.DEPTHS.items()
                if kind == "bottleneck" and stages == per_stage), None)
  if depth is None:
    raise CheckpointError(f"{path}: a ResNet with blocks per stage {per_stage} is none of keras.applications' "
                          "ResNet50/101/152 (v1)")
  fields = dict(name="resnet", depth=depth, width=64, stride_on="first", conv_bias=True,
                bn_epsilon=1.001e-5, padding="symmetric", pixel_mean=list(CAFFE_MEAN_RGB),
                pixel_std=[1.0, 1.0, 1.0])
  t = "image_tower"
  tensors = [_map(reader, path, f"params/{t}/stem_conv/kernel", "conv1_conv/kernel",
                  "input channels BGR -> RGB", lambda x: x[:, :, ::-1, :]),
             _map(reader, path, f"params/{t}/stem_conv/bias", "conv1_conv/bias")]
  tensors += _bn(reader, path, t, "stem_bn", "conv1_bn")
  for s, count in enumerate(per_stage):
    for b in range(count):
      ours, theirs = f"stage{s + 1}_block{b}", f"conv{s + 2}_block{b + 1}"
      parts = [("conv1", "bn1", "1"), ("conv2", "bn2", "2"), ("conv3", "bn3", "3")]
      if b == 0:
        parts.append(("downsample_conv", "downsample_bn", "0"))
      for conv, bn, k in parts:
        for w in ("kernel", "bias"):
          tensors.append(_map(reader, path, f"params/{t}/{ours}/{conv}/{w}", f"{theirs}_{k}_conv/{w}"))
        tensors += _bn(reader, path, t, f"{ours}/{bn}", f"{theirs}_{k}_bn")
  used = {m.source for m in tensors}
  unused = {n: "the classifier (the tower ends at the pooled features)" for n in reader.names() if n not in used}
  return Tower("image", fields, {}, None, tensors, unused,
               {"format": "keras_resnet", "path": str(path), "depth": str(depth)})
