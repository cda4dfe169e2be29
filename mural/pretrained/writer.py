"""Writes imported towers as a directory `config.init_from` takes: the files of an export
(saved_variables: manifest.json, config.json, vocab.txt, params.msgpack) without a SavedModel.

The tensors stream into params.msgpack one at a time (each read, checked against the shape
mural's tower declares, written, dropped), so an import holds about one tensor of the
checkpoint in memory, not the checkpoint. The manifest says which source tensor became which
variable and how its layout changed, and lists every source tensor left out with the reason.
"""

import json
import os
import shutil
import struct
import time
from typing import Dict, Sequence, Tuple

import jax
import jax.numpy as jnp
import msgpack
import numpy as np
from etils import epath
from flax import serialization
from flax import traverse_util
from flax.core import meta

from mural import config_lib
from mural import disk_space
from mural import models
from mural import saved_variables
from mural.pretrained.source import CheckpointError, Tower

FORMAT = 1  # manifest['format'], as an export's.
TOWER_GROUP = {"image": "image_tower", "text": "text_tower"}


def config_with(towers: Sequence[Tower]):
  """The base config with each tower's model and data fields set (the fields config.json keeps)."""
  config = config_lib.base_config()
  with config.unlocked():
    for tower in towers:
      for field, value in tower.fields.items():
        config.model[tower.kind][field] = value
      for field, value in tower.data_fields.items():
        config.data[field] = value
  return config


def expected_shapes(config, kind: str) -> Tuple[Dict[str, tuple], int]:
  """({'params/<kind>_tower/...': shape}, embedding size) of the tower config declares (abstract:
  nothing allocated)."""
  section = config.model[kind].copy_and_resolve_references()
  with section.unlocked():  # The plainest maths: the same variables, traced in a fraction of the time.
    for field, plain in (("conv_impl", "xla"), ("norm_impl", "flax")):
      if field in section:
        section[field] = plain
  tower = models.tower(kind, section, jnp.float32, jnp.float32)
  if kind == "image":
    inputs = (jnp.zeros((1, 64, 64, 3), jnp.float32),)
  else:
    inputs = (jnp.zeros((1, 8), jnp.int32), jnp.ones((1, 8), jnp.int32))
  rngs = {"params": jax.random.PRNGKey(0), "dropout": jax.random.PRNGKey(1)}
  variables = meta.unbox(jax.eval_shape(lambda: tower.init(rngs, *inputs, train=False)))
  out = {}
  for collection, tree in variables.items():
    for name, leaf in saved_variables.flat(tree).items():
      out[f"{collection}/{TOWER_GROUP[kind]}/{name}"] = tuple(leaf.shape)
  return out, int(tower.output_dim)


def _stream(f, tree, packer, shapes, on_tensor) -> None:
  """msgpack of a nested dict whose leaves are Mapped, written as flax.serialization writes a
  variables dict (msgpack_restore reads it back), one tensor at a time."""
  f.write(packer.pack_map_header(len(tree)))
  for key, node in tree.items():
    f.write(packer.pack(key))
    if isinstance(node, dict):
      _stream(f, node, packer, shapes, on_tensor)
      continue
    value = np.ascontiguousarray(node.load(), np.float32)
    if value.shape != shapes[node.target]:
      raise CheckpointError(f"{node.source} -> {node.target}: shape {value.shape} does not fit "
                            f"this tower's {shapes[node.target]}")
    on_tensor(node, value)
    _write_array(f, value, packer)


def _write_array(f, value: np.ndarray, packer) -> None:
  """value as flax.serialization.msgpack_serialize encodes an ndarray (msgpack ext type 1 holding
  [shape, dtype name, raw bytes]), its bytes written from the array itself: no copy of a large
  tensor (a 367 MB token table was otherwise held four times over). Arrays over flax's chunk
  size go through flax, which splits them."""
  if value.nbytes > serialization.MAX_CHUNK_SIZE:
    f.write(serialization.msgpack_serialize(value))
    return
  head = packer.pack_array_header(3) + packer.pack(tuple(value.shape)) + packer.pack(value.dtype.name)
  head += struct.pack(">BI", 0xC6, value.nbytes)  # bin 32
  f.write(struct.pack(">BIb", 0xC9, len(head) + value.nbytes, 1))  # ext 32, flax's ndarray type
  f.write(head)
  f.write(memoryview(value).cast("B"))


def plan(towers: Sequence[Tower]):
  """({variable: shape} of the towers mural builds from their fields, {variable: Mapped},
  {kind: embedding size}), checked to name the same variables: a variable no source tensor fills, or a tensor mapped to
  no variable, is one line."""
  kinds = [t.kind for t in towers]
  if not towers or len(set(kinds)) != len(kinds):
    raise CheckpointError(f"an import holds one image tower, one text tower or both, got {kinds}")
  config = config_with(towers)
  shapes, mapped, dims = {}, {}, {}
  for tower in towers:
    tower_shapes, dims[tower.kind] = expected_shapes(config, tower.kind)
    shapes.update(tower_shapes)
    mapped.update({m.target: m for m in tower.tensors})
  missing = [n for n in shapes if n not in mapped]
  if missing:
    raise CheckpointError(f"no source tensor for {missing[0]} ({len(missing)} of this tower's "
                          f"{len(shapes)} variables have none)")
  extra = [n for n in mapped if n not in shapes]
  if extra:
    raise CheckpointError(f"{mapped[extra[0]].source} -> {extra[0]}: no such variable in this tower")
  return shapes, mapped, dims


def write(out_dir: str, towers: Sequence[Tower], log=print) -> dict:
  """Writes `towers` (at most one image and one text tower) into out_dir; returns the manifest."""
  shapes, mapped, dims = plan(towers)
  out = epath.Path(out_dir)
  tmp = epath.Path(f"{out_dir}.tmp-{os.getpid()}")
  shutil.rmtree(tmp, ignore_errors=True)
  tmp.mkdir(parents=True)
  start, count, values = time.time(), [0], [0]

  def on_tensor(node, value):
    count[0] += 1
    values[0] += value.size
    if count[0] % 100 == 0 or count[0] == len(mapped):
      log(f"  {count[0]}/{len(mapped)} tensors, {values[0] / 1e6:.1f}M values ({time.time() - start:.0f} s)")

  try:
    with disk_space.writing("the import", out_dir, partial=str(tmp)):
      with open(tmp / saved_variables.PARAMS, "wb") as f:
        _stream(f, traverse_util.unflatten_dict(mapped, sep="/"), msgpack.Packer(), shapes, on_tensor)
      text = next((t for t in towers if t.kind == "text"), None)
      if text is not None and text.vocab:
        shutil.copyfile(text.vocab, tmp / saved_variables.VOCAB)
      record = {"system": "", "model": {t.kind: dict(t.fields) for t in towers},
                "data": {k: v for t in towers for k, v in t.data_fields.items()}}
      (tmp / saved_variables.CONFIG).write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")
      manifest = {
          "format": FORMAT, "kind": "import", "step": 0, "system": "",
          "towers": {t.kind: {"source": t.source, "output_dim": dims[t.kind], "fields": dict(t.fields),
                              "data": dict(t.data_fields),
                              "tensors": [{"variable": m.target, "source": m.source, "transform": m.transform}
                                          for m in t.tensors],
                              "not_imported": t.unused} for t in towers},
          "values": int(values[0]),
      }
      (tmp / saved_variables.MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
    if out.exists():
      shutil.rmtree(out)
    tmp.rename(out)
  finally:
    shutil.rmtree(tmp, ignore_errors=True)
  return manifest
