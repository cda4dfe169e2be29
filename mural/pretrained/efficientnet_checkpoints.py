"""EfficientNet checkpoints outside Keras -> mural's EfficientNet tower.

- `tf_efficientnet`: the TF reference's checkpoints (tensorflow/tpu models/official/efficientnet:
  efficientnet-b0 ... b7, and the noisy-student ones, the only public L2), variables under
  'efficientnet-<variant>/'; where a checkpoint keeps exponential moving averages (the
  reference evaluates with them) those are taken.
- `timm_efficientnet`: timm's `tf_efficientnet_*` weights (TF's SAME padding and epsilon 1e-3,
  ported from the reference): a directory with `model.safetensors` and timm's `config.json`.

Both include the 1x1 head conv (the reference's pooled features). Neither file says how its
pixels were normalised: `normalization` 'imagenet' (the reference's and timm's default mean and
std) or 'inception' (pixels to [-1, 1]: AdvProp's checkpoints, timm's '*_ap').
"""

import re

from mural.models import efficientnet
from mural.pretrained.source import CheckpointError, Mapped, mapper, oihw_to_hwio, Safetensors, TfCheckpoint
from mural.pretrained.source import timm_config, Tower

NORMALIZATIONS = {"imagenet": ((0.485 * 255, 0.456 * 255, 0.406 * 255), (0.229 * 255, 0.224 * 255, 0.225 * 255)),
                  "inception": ((127.5, 127.5, 127.5), (127.5, 127.5, 127.5))}
_BN = (("scale", "params"), ("bias", "params"), ("mean", "batch_stats"), ("var", "batch_stats"))


def _blocks(variant: str):
  """(global block index, stage, has an expand conv) of the variant's blocks, in order."""
  _, depth, _, _ = efficientnet.VARIANTS[variant]
  index = 0
  for s, stage in enumerate(efficientnet.B0_STAGES):
    for r in range(efficientnet.round_repeats(stage.repeats, depth)):
      yield index, s, r, stage.expand_ratio != 1
      index += 1


def _normalization(normalization: str):
  if normalization not in NORMALIZATIONS:
    raise CheckpointError(f"normalization {normalization!r} not in {sorted(NORMALIZATIONS)}")
  mean, std = NORMALIZATIONS[normalization]
  return list(mean), list(std)


def _fields(variant, normalization):
  mean, std = _normalization(normalization)
  return dict(name="efficientnet", variant=variant, width_coefficient=None, depth_coefficient=None,
              include_head=True, num_classes=0, num_stages=None, pixel_mean=mean, pixel_std=std)


def read_tf(path: str, normalization: str = "imagenet") -> Tower:
  """The TF reference's checkpoint (a prefix, or a directory with a 'checkpoint' file)."""
  reader = TfCheckpoint(path)
  names = set(reader.names())
  scopes = {m.group(1) for n in names for m in [re.match(r"(efficientnet-(?:b\d|l2))/stem/conv2d/kernel$", n)] if m}
  if len(scopes) != 1:
    raise CheckpointError(f"{path}: no single 'efficientnet-<b0..b7|l2>/stem/conv2d/kernel' (found "
                          f"{sorted(scopes) or 'none'}): not a checkpoint of the TF reference's EfficientNet")
  scope = scopes.pop()
  variant = scope.split("-")[1]
  ema = any(n.endswith("/ExponentialMovingAverage") for n in names)

  def tensor(ours, theirs, transform="", fn=None):
    name = f"{scope}/{theirs}"
    if ema and f"{name}/ExponentialMovingAverage" in names:
      name += "/ExponentialMovingAverage"
    if name not in names:
      raise CheckpointError(f"{path}: no tensor {name} (for {ours}): not the {scope} the reference writes")
    return Mapped(ours, name, transform, (lambda: fn(reader.get(name))) if fn else (lambda: reader.get(name)))

  def bn(ours, theirs):
    keys = ("gamma", "beta", "moving_mean", "moving_variance")
    return [tensor(f"{c}/image_tower/{ours}/{mine}", f"{theirs}/{key}") for (mine, c), key in zip(_BN, keys)]

  t = "params/image_tower"
  tensors = [tensor(f"{t}/stem_conv/kernel", "stem/conv2d/kernel")] + bn("stem_bn", "stem/tpu_batch_normalization")
  count = 0
  for i, _, _, expand in _blocks(variant):
    b, k = f"block_{i}", f"blocks_{i}"
    # The reference names a block's convs and norms in the order it calls them.
    convs, norms = iter(["conv2d", "conv2d_1"]), iter(["tpu_batch_normalization", "tpu_batch_normalization_1",
                                                       "tpu_batch_normalization_2"])
    if expand:
      tensors.append(tensor(f"{t}/{b}/expand_conv/kernel", f"{k}/{next(convs)}/kernel"))
      tensors += bn(f"{b}/expand_bn", f"{k}/{next(norms)}")
    tensors.append(tensor(f"{t}/{b}/depthwise_conv/kernel", f"{k}/depthwise_conv2d/depthwise_kernel",
                          "[k, k, C, 1] -> [k, k, 1, C]", lambda x: x.transpose(0, 1, 3, 2)))
    tensors += bn(f"{b}/depthwise_bn", f"{k}/{next(norms)}")
    for part, theirs in (("se_reduce", "se/conv2d"), ("se_expand", "se/conv2d_1")):
      tensors += [tensor(f"{t}/{b}/{part}/{w}", f"{k}/{theirs}/{w}") for w in ("kernel", "bias")]
    tensors.append(tensor(f"{t}/{b}/project_conv/kernel", f"{k}/{next(convs)}/kernel"))
    tensors += bn(f"{b}/project_bn", f"{k}/{next(norms)}")
    count += 1
  extra = sorted({int(m.group(1)) for n in names for m in [re.match(rf"{scope}/blocks_(\d+)/", n)] if m} - set(range(count)))
  if extra:
    raise CheckpointError(f"{path}: block blocks_{extra[0]} beyond {scope}'s {count} blocks")
  tensors.append(tensor(f"{t}/head_conv/kernel", "head/conv2d/kernel"))
  tensors += bn("head_bn", "head/tpu_batch_normalization")
  used = {m.source for m in tensors}
  unused = {}
  for n in sorted(names - used):
    if "ExponentialMovingAverage" not in n and f"{n}/ExponentialMovingAverage" in used:
      unused[n] = "the raw value: its exponential moving average is imported (the reference evaluates with it)"
    elif "/head/dense/" in n:
      unused[n] = "the classifier (the tower ends at the pooled features)"
    else:
      unused[n] = "not part of the tower (optimizer state, step counters)"
  return Tower("image", _fields(variant, normalization), {}, None, tensors, unused,
               {"format": "tf_efficientnet", "path": str(path), "variant": variant, "ema": str(ema)})


def read_timm(path: str, normalization: str = "imagenet") -> Tower:
  """timm's tf_efficientnet_* directory (config.json's architecture names the variant)."""
  architecture = timm_config(path).get("architecture", "")
  m = re.fullmatch(r"tf_efficientnet_(b\d|l2)", architecture)
  if not m:
    raise CheckpointError(f"{path}/config.json: architecture {architecture!r} is not one of timm's "
                          "tf_efficientnet_b0..b7, l2 (TF's SAME padding: what mural's EfficientNet computes)")
  variant = m.group(1)
  reader = Safetensors(path)
  names = set(reader.names())
  tensor = mapper(reader, path)

  def conv(ours, theirs):
    return tensor(ours, theirs, "[out, in, kh, kw] -> [kh, kw, in, out]", oihw_to_hwio)

  def bn(ours, theirs):
    keys = ("weight", "bias", "running_mean", "running_var")
    return [tensor(f"{c}/image_tower/{ours}/{mine}", f"{theirs}.{key}") for (mine, c), key in zip(_BN, keys)]

  t = "params/image_tower"
  tensors = [conv(f"{t}/stem_conv/kernel", "conv_stem.weight")] + bn("stem_bn", "bn1")
  for i, s, r, expand in _blocks(variant):
    b, k = f"block_{i}", f"blocks.{s}.{r}"
    if expand:  # timm's InvertedResidual: conv_pw, bn1, conv_dw, bn2, se, conv_pwl, bn3.
      tensors += [conv(f"{t}/{b}/expand_conv/kernel", f"{k}.conv_pw.weight")] + bn(f"{b}/expand_bn", f"{k}.bn1")
      dw_bn, project, project_bn = f"{k}.bn2", f"{k}.conv_pwl.weight", f"{k}.bn3"
    else:  # DepthwiseSeparableConv: conv_dw, bn1, se, conv_pw, bn2.
      dw_bn, project, project_bn = f"{k}.bn1", f"{k}.conv_pw.weight", f"{k}.bn2"
    tensors.append(tensor(f"{t}/{b}/depthwise_conv/kernel", f"{k}.conv_dw.weight",
                          "[C, 1, k, k] -> [k, k, 1, C]", oihw_to_hwio))
    tensors += bn(f"{b}/depthwise_bn", dw_bn)
    for part, theirs in (("se_reduce", "se.conv_reduce"), ("se_expand", "se.conv_expand")):
      tensors += [conv(f"{t}/{b}/{part}/kernel", f"{k}.{theirs}.weight"),
                  tensor(f"{t}/{b}/{part}/bias", f"{k}.{theirs}.bias")]
    tensors += [conv(f"{t}/{b}/project_conv/kernel", project)] + bn(f"{b}/project_bn", project_bn)
  tensors += [conv(f"{t}/head_conv/kernel", "conv_head.weight")] + bn("head_bn", "bn2")
  used = {m.source for m in tensors}
  unused = {n: ("the classifier (the tower ends at the pooled features)" if n.startswith("classifier.")
                else "batch norm's step counter" if n.endswith("num_batches_tracked")
                else "not part of the tower") for n in sorted(names - used)}
  return Tower("image", _fields(variant, normalization), {}, None, tensors, unused,
               {"format": "timm_efficientnet", "path": str(path), "variant": variant})
