"""What an importer gives the writer, and the checkpoint files it reads, one tensor at a time.

An importer maps a public checkpoint onto one of mural's towers: the config fields that make
the tower the checkpoint's architecture, and one `Mapped` per variable of that tower, each
reading its source tensor only when the writer asks (so an import holds one tensor, not the
checkpoint, in memory), plus every source tensor it leaves out and why.
"""

import json
import os
from typing import Callable, Dict, List, NamedTuple, Optional

import h5py
import numpy as np
from etils import epath

from mural import lazy_import

safetensors_numpy = lazy_import.module("safetensors.numpy")
safetensors = lazy_import.module("safetensors")
tf = lazy_import.module("tensorflow")


class CheckpointError(ValueError):
  """A checkpoint that does not fit: one line naming the file or tensor and what was expected."""


class Mapped(NamedTuple):
  target: str  # 'params/<tower>/...' or 'batch_stats/<tower>/...', as in an export.
  source: str  # The tensor's name in the checkpoint.
  transform: str  # How its layout changes ('' for none), for the manifest.
  load: Callable[[], np.ndarray]  # Reads and transforms it.


class Tower(NamedTuple):
  kind: str  # 'image' | 'text'.
  fields: Dict[str, object]  # config.model.<kind> fields that make the checkpoint's tower.
  data_fields: Dict[str, object]  # config.data fields that go with it (text normalisation).
  vocab: Optional[str]  # The vocabulary file a text tower's token table goes with.
  tensors: List[Mapped]
  unused: Dict[str, str]  # Source tensor -> why it is not imported.
  source: Dict[str, str]  # {'format', 'path'} for the manifest.


def as_float32(x: np.ndarray) -> np.ndarray:
  return np.asarray(x, np.float32)


def oihw_to_hwio(x: np.ndarray) -> np.ndarray:
  """PyTorch's conv weight [out, in, kh, kw] -> mural's (and TF's) [kh, kw, in, out]."""
  return x.transpose(2, 3, 1, 0)


def mapper(reader, path: str):
  """tensor(ours, theirs, transform='', fn=None) -> the Mapped that reads `theirs` (then fn) for
  variable `ours`; a tensor the checkpoint lacks is one line naming both."""
  names = set(reader.names())

  def tensor(ours: str, theirs: str, transform: str = "", fn=None) -> Mapped:
    if theirs not in names:
      raise CheckpointError(f"{path}: no tensor {theirs} (for {ours})")
    return Mapped(ours, theirs, transform, (lambda: fn(reader.get(theirs))) if fn else (lambda: reader.get(theirs)))

  return tensor


def read_json(path, layout: str, required: bool = True) -> dict:
  """A checkpoint's JSON file as a dict ({} for an absent one that is not `required`); a missing
  or malformed file is one line saying what the checkpoint's directory should hold (`layout`)."""
  path = epath.Path(path)
  if not path.exists():
    if required:
      raise CheckpointError(f"{path.parent}: no {path.name} ({layout})")
    return {}
  try:
    value = json.loads(path.read_text())
  except ValueError as e:
    raise CheckpointError(f"{path}: not JSON ({e})") from None
  if not isinstance(value, dict):
    raise CheckpointError(f"{path}: not a JSON object")
  return value


def timm_config(path: str) -> dict:
  """A timm model directory's config.json (its `architecture`, `pretrained_cfg`)."""
  return read_json(epath.Path(path) / "config.json", "a timm model directory has config.json and model.safetensors")


class Safetensors:
  """A Hugging Face model's `model.safetensors`, or its shards through
  `model.safetensors.index.json`; tensors read one at a time (NumPy, no framework)."""

  def __init__(self, directory: str):
    root = epath.Path(directory)
    index = root / "model.safetensors.index.json"
    if index.exists():
      weight_map = json.loads(index.read_text())["weight_map"]
      self._file = {name: str(root / f) for name, f in weight_map.items()}
    elif (root / "model.safetensors").exists():
      path = str(root / "model.safetensors")
      with safetensors.safe_open(path, framework="numpy") as f:
        self._file = {name: path for name in f.keys()}
    else:
      raise CheckpointError(f"{directory}: no model.safetensors (nor model.safetensors.index.json); "
                         "a PyTorch .bin is a pickle and is not read")

  def names(self):
    return self._file.keys()

  def get(self, name: str) -> np.ndarray:
    with safetensors.safe_open(self._file[name], framework="numpy") as f:
      return as_float32(f.get_tensor(name))


class KerasH5:
  """A Keras weights file in the HDF5 layout keras.applications publishes ('layer_names',
  each layer's 'weight_names'): tensors named '<layer>/<weight>' ('stem_conv/kernel')."""

  def __init__(self, path: str):
    if not os.path.exists(path):
      raise CheckpointError(f"{path}: no such file")
    try:
      self._h5 = h5py.File(path, "r")
    except OSError as e:
      raise CheckpointError(f"{path}: not an HDF5 file ({e})") from None
    root = self._h5["model_weights"] if "model_weights" in self._h5 else self._h5
    if "layer_names" not in root.attrs:
      raise CheckpointError(f"{path}: not a Keras HDF5 weights file (no 'layer_names'; a Keras 3 "
                         "'.weights.h5' is not this layout: save with the HDF5 format)")
    self._paths = {}
    for layer in root.attrs["layer_names"]:
      layer = layer.decode() if isinstance(layer, bytes) else layer
      if layer not in root or "weight_names" not in root[layer].attrs:
        raise CheckpointError(f"{path}: layer {layer!r} is listed but has no group with 'weight_names'")
      for weight in root[layer].attrs["weight_names"]:
        weight = weight.decode() if isinstance(weight, bytes) else weight
        self._paths[f"{layer}/{weight.rsplit('/', 1)[-1].removesuffix(':0')}"] = (layer, weight)
    self._root = root

  def names(self):
    return self._paths.keys()

  def get(self, name: str) -> np.ndarray:
    layer, weight = self._paths[name]
    return as_float32(self._root[layer][weight][()])


class TfCheckpoint:
  """A TensorFlow checkpoint (a prefix such as 'bert_model.ckpt', or a directory with one)."""

  def __init__(self, path: str):
    prefix = tf.train.latest_checkpoint(path) if os.path.isdir(path) else path
    if not prefix or not tf.io.gfile.exists(prefix + ".index"):
      raise CheckpointError(f"{path}: no TensorFlow checkpoint (no '<prefix>.index' there)")
    try:
      self._reader = tf.train.load_checkpoint(prefix)
    except tf.errors.OpError as e:
      raise CheckpointError(f"{prefix}: unreadable TensorFlow checkpoint ({e.message.splitlines()[0]})") from None
    self.prefix = prefix

  def names(self):
    return list(self._reader.get_variable_to_shape_map())

  def get(self, name: str) -> np.ndarray:
    return as_float32(self._reader.get_tensor(name))
