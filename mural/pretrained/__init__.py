"""Public checkpoints into mural's towers (`python -m mural.import_weights`).

FORMATS maps each checkpoint format to its reader: the reader gives a `source.Tower` (config
fields, tensors read on demand, what is left out), and `writer.write` checks every tensor
against the tower mural builds from those fields and writes a directory `config.init_from`
takes (config_lib.towers_from sets a config's towers to it).
"""

from mural.pretrained import bert
from mural.pretrained import efficientnet_checkpoints
from mural.pretrained import keras_applications
from mural.pretrained import timm_resnet
from mural.pretrained.source import CheckpointError

# format -> (kind of tower, reader(path, **options) -> Tower, what the path is).
FORMATS = {
    "hf_bert": ("text", bert.read_hf, "a Hugging Face BERT directory (config.json, model.safetensors, vocab.txt)"),
    "tf_bert": ("text", bert.read_tf, "Google's TensorFlow BERT directory (bert_config.json, bert_model.ckpt.*, vocab.txt)"),
    "keras_efficientnet": ("image", keras_applications.read_efficientnet,
                           "a keras.applications EfficientNetB0-B7 HDF5 weights file"),
    "keras_resnet": ("image", keras_applications.read_resnet,
                     "a keras.applications ResNet50/101/152 HDF5 weights file"),
    "tf_efficientnet": ("image", efficientnet_checkpoints.read_tf,
                        "a TF reference EfficientNet checkpoint (efficientnet-b0..b7, noisy-student l2)"),
    "timm_efficientnet": ("image", efficientnet_checkpoints.read_timm,
                          "a timm tf_efficientnet_* directory (config.json, model.safetensors)"),
    "timm_resnet": ("image", timm_resnet.read, "a timm resnet18..152 directory (config.json, model.safetensors)"),
}


def read(spec: str, **options):
  """'FORMAT:PATH' -> the Tower that FORMAT's reader makes of PATH (options: the reader's own)."""
  name, sep, path = spec.partition(":")
  if not sep or name not in FORMATS:
    known = "; ".join(f"{k}: {v[2]}" for k, v in FORMATS.items())
    raise CheckpointError(f"{spec!r}: not FORMAT:PATH with a known format ({known})")
  return FORMATS[name][1](path, **options)


__all__ = ["FORMATS", "read", "CheckpointError"]
