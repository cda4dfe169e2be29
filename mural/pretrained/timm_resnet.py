"""timm's ResNets (resnet18/34/50/101/152: torchvision's layout, v1.5) -> mural's ResNet tower.

A directory with timm's `config.json` (its `architecture`) and `model.safetensors` (never a
pickle). Symmetric padding, no conv biases, epsilon 1e-5, the stride on each bottleneck's 3x3
conv; its input normalisation is the config's `pretrained_cfg` mean and std (ImageNet's where
it gives none).
"""

import re

from mural.models import resnet
from mural.pretrained.source import CheckpointError, mapper, oihw_to_hwio, Safetensors, timm_config, Tower

_IMAGENET = ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))
_BN = (("scale", "params", "weight"), ("bias", "params", "bias"), ("mean", "batch_stats", "running_mean"),
       ("var", "batch_stats", "running_var"))


def read(path: str) -> Tower:
  cfg = timm_config(path)
  m = re.fullmatch(r"resnet(\d+)", cfg.get("architecture", ""))
  if not m or int(m.group(1)) not in resnet.DEPTHS:
    raise CheckpointError(f"{path}/config.json: architecture {cfg.get('architecture')!r} is not one of timm's "
                          f"resnet{sorted(resnet.DEPTHS)[1:]} (plain stems, torchvision's layout)")
  depth = int(m.group(1))
  pretrained = cfg.get("pretrained_cfg", {})
  mean, std = pretrained.get("mean", _IMAGENET[0]), pretrained.get("std", _IMAGENET[1])
  reader = Safetensors(path)
  names = set(reader.names())
  tensor = mapper(reader, path)

  def conv(ours, theirs):
    return tensor(f"params/image_tower/{ours}/kernel", f"{theirs}.weight", "[out, in, kh, kw] -> [kh, kw, in, out]",
                  oihw_to_hwio)

  def bn(ours, theirs):
    return [tensor(f"{c}/image_tower/{ours}/{mine}", f"{theirs}.{key}") for mine, c, key in _BN]

  kind, stages = resnet.DEPTHS[depth]
  tensors = [conv("stem_conv", "conv1")] + bn("stem_bn", "bn1")
  convs = 2 if kind == "basic" else 3
  for s, blocks in enumerate(stages):
    for b in range(blocks):
      ours, theirs = f"stage{s + 1}_block{b}", f"layer{s + 1}.{b}"
      for c in range(1, convs + 1):
        tensors += [conv(f"{ours}/conv{c}", f"{theirs}.conv{c}")] + bn(f"{ours}/bn{c}", f"{theirs}.bn{c}")
      if f"{theirs}.downsample.0.weight" in names:
        tensors += [conv(f"{ours}/downsample_conv", f"{theirs}.downsample.0")] + bn(f"{ours}/downsample_bn",
                                                                                   f"{theirs}.downsample.1")
  used = {t.source for t in tensors}
  unused = {n: ("the classifier (the tower ends at the pooled features)" if n.startswith("fc.")
                else "batch norm's step counter" if n.endswith("num_batches_tracked")
                else "not part of the tower") for n in sorted(names - used)}
  fields = dict(name="resnet", depth=depth, width=64, stride_on="middle", conv_bias=False, bn_epsilon=1e-5,
                padding="symmetric", pixel_mean=[255 * v for v in mean], pixel_std=[255 * v for v in std])
  return Tower("image", fields, {}, None, tensors, unused,
               {"format": "timm_resnet", "path": str(path), "architecture": cfg["architecture"]})
