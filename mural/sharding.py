"""The device mesh, and where every array of a run lives on it.

Three mesh axes (config.mesh): 'data' (pure data parallel: params
replicated), 'fsdp' (data parallel with params and optimizer state sharded,
gathered per layer by XLA) and 'model' (tensor parallel: vocab, mlp, heads).
Batches are split over ('data', 'fsdp') (the 'batch' rule).

Parameters name their dims with logical axes (nn.with_logical_partitioning:
'embed', 'mlp', 'vocab', ...); config.sharding_rules map those names to mesh
axes, first match wins, each mesh axis used at most once per array (flax's
nn.logical_to_mesh_axes). With the default rules FSDP lands on each kernel's
'embed' / 'token_embed' / 'conv_out' dim (the large one; 'mlp' and 'vocab' go
to 'model'), norms are replicated. Then three adjustments (`fit_spec`), so an
awkward size costs memory, never a failed run:
  * a dim whose size is not divisible by the product of its mesh axes is
    replicated along that dim (e.g. a 1000-row vocab on a 16-way model axis);
  * if that drops the dim the rules gave to 'fsdp', FSDP moves to the
    largest free dim it divides (so the parameter stays sharded);
  * arrays with fewer than config.shard_min_size elements are replicated:
    gathering a bias on every step costs more than the bytes it saves.
Leaves without logical names (optimizer counters, step, rng, batch-norm
statistics) are replicated; optimizer moments take their parameter's
sharding by matching tree paths (see `like_params`).

Everything else is XLA's job: the train step is one jax.jit over global
arrays with these shardings, so the in-batch softmax sees the global batch
and batch-norm statistics are global-batch moments, whatever the mesh.
"""

import json
import math
from typing import Any, List, Mapping, Optional, Sequence, Tuple

import flax.linen as nn
import jax
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec as P

from mural import config_lib

MESH_AXES = config_lib.MESH_AXES

Rules = Tuple[Tuple[str, Any], ...]


def mesh_shape(mesh_config, num_devices: int) -> Tuple[int, int, int]:
  """Sizes of (data, fsdp, model); the one -1 axis takes the remaining devices."""
  sizes = [mesh_config[a] for a in MESH_AXES]
  free = [i for i, s in enumerate(sizes) if s == -1]
  fixed = math.prod(s for s in sizes if s != -1)
  if len(free) > 1:
    raise config_lib.ConfigError(f"config.mesh: at most one axis may be -1, got {dict(zip(MESH_AXES, sizes))}")
  if num_devices % fixed:
    raise config_lib.ConfigError(
        f"config.mesh: {dict(zip(MESH_AXES, sizes))} needs a multiple of {fixed} devices, "
        f"this run has {num_devices}")
  if free:
    sizes[free[0]] = num_devices // fixed
  elif fixed != num_devices:
    raise config_lib.ConfigError(
        f"config.mesh: {dict(zip(MESH_AXES, sizes))} uses {fixed} devices, this run has "
        f"{num_devices} (set one axis to -1 to take the rest)")
  return tuple(sizes)


def make_mesh(mesh_config, devices: Optional[Sequence[jax.Device]] = None) -> Mesh:
  """The ('data', 'fsdp', 'model') mesh over all devices of all processes."""
  devices = list(jax.devices() if devices is None else devices)
  shape = mesh_shape(mesh_config, len(devices))
  # Auto axes: classic jit semantics (shardings are hints XLA propagates),
  # not the sharding-in-types mode jax.make_mesh defaults to.
  return jax.make_mesh(shape, MESH_AXES, axis_types=(AxisType.Auto,) * len(MESH_AXES),
                       devices=devices)


def rules_from_config(config) -> Rules:
  """config.sharding_rules as hashable tuples (config lists become tuples)."""
  rules = []
  for rule in config.sharding_rules:
    name, axes = rule
    if isinstance(axes, (list, tuple)):
      axes = tuple(axes)
    rules.append((name, axes))
  return tuple(rules)


def batch_spec(rules: Rules) -> P:
  """PartitionSpec of a batch's leading dim (the 'batch' rule)."""
  return nn.logical_to_mesh_axes(("batch",), rules)


def batch_sharding(mesh: Mesh, rules: Rules) -> NamedSharding:
  return NamedSharding(mesh, batch_spec(rules))


def batch_shards(mesh: Mesh, rules: Rules) -> int:
  """How many pieces a batch is split into (the product of its mesh axes)."""
  return _axis_size(mesh, batch_spec(rules)[0])


def replicated(mesh: Mesh) -> NamedSharding:
  return NamedSharding(mesh, P())


def _axis_size(mesh: Mesh, axes) -> int:
  if axes is None:
    return 1
  names = axes if isinstance(axes, tuple) else (axes,)
  return math.prod(mesh.shape[a] for a in names)


def _uses(spec_dims, axis: str) -> bool:
  return any(axis == d or (isinstance(d, tuple) and axis in d) for d in spec_dims)


def fit_spec(spec: P, shape: Sequence[int], mesh: Mesh, min_size: int = 0,
             fsdp_fallback: bool = False) -> P:
  """`spec` made legal and useful for an array of `shape` on `mesh`.

  * Arrays smaller than `min_size` elements are replicated altogether.
  * A dim whose mesh axes do not divide its size is replicated along that dim.
  * fsdp_fallback: when the rules put 'fsdp' (size > 1) on a dim it does not
    divide, it moves to the largest free dim it divides, so the parameter is
    still FSDP-sharded. Arrays the rules keep off 'fsdp' (norms) stay so.
  """
  if math.prod(shape) < min_size:
    return P()
  dims = tuple(spec) + (None,) * (len(shape) - len(tuple(spec)))
  fitted = [axes if size % _axis_size(mesh, axes) == 0 else None for size, axes in zip(shape, dims)]
  fsdp = mesh.shape.get("fsdp", 1)
  if fsdp_fallback and fsdp > 1 and _uses(dims, "fsdp") and not _uses(fitted, "fsdp"):
    free = [i for i, (size, axes) in enumerate(zip(shape, fitted)) if axes is None and size % fsdp == 0]
    if free:
      fitted[max(free, key=lambda i: shape[i])] = "fsdp"
  while fitted and fitted[-1] is None:
    fitted.pop()
  return P(*fitted)


def logical_shardings(boxed_tree: Any, mesh: Mesh, rules: Rules, min_size: int = 0) -> Any:
  """NamedSharding per leaf of an (abstract) tree of nn.LogicallyPartitioned boxes.

  The result has the structure of `nn.unbox(boxed_tree)`. Leaves without
  logical names are replicated; named ones follow the rules, then `fit_spec`.
  """
  is_box = lambda x: isinstance(x, nn.LogicallyPartitioned)

  def place(x):
    if not is_box(x):
      return NamedSharding(mesh, P())
    spec = nn.logical_to_mesh_axes(tuple(x.names), rules)
    return NamedSharding(mesh, fit_spec(spec, x.value.shape, mesh, min_size, fsdp_fallback=True))

  return jax.tree.map(place, boxed_tree, is_leaf=is_box)


def path_keys(path) -> Tuple[str, ...]:
  keys = []
  for k in path:
    for attr in ("key", "name", "idx"):
      if hasattr(k, attr):
        keys.append(str(getattr(k, attr)))
        break
  return tuple(keys)


def like_params(tree: Any, params: Any, param_shardings: Any, mesh: Mesh) -> Any:
  """Shardings for a tree holding copies of params (optimizer moments etc.).

  A leaf whose tree path ends with a parameter's path and has that
  parameter's shape takes the parameter's sharding (so an FSDP-sharded
  kernel's Adam moments are sharded the same way); every other leaf
  (counters, scalars) is replicated. Works for any optax state without
  knowing its classes. (optax.tree.map_params would be the principled way,
  but it cannot see through optax.multi_transform's label trees, which the
  per-task optimizers use; see optim.py.)
  """
  by_path = {}
  for (path, x), s in zip(jax.tree_util.tree_flatten_with_path(params)[0],
                          jax.tree.leaves(param_shardings)):
    by_path[path_keys(path)] = (tuple(x.shape), s)
  rep = replicated(mesh)

  def pick(path, x):
    keys = path_keys(path)
    for start in range(len(keys)):
      hit = by_path.get(keys[start:])
      if hit is not None and hit[0] == tuple(x.shape):
        return hit[1]
    return rep

  return jax.tree_util.tree_map_with_path(pick, tree)


def with_shardings(abstract_tree: Any, shardings: Any) -> Any:
  """ShapeDtypeStructs carrying shardings: the target orbax restores against."""
  return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
                      abstract_tree, shardings)


def global_batch(local: Mapping[str, np.ndarray], sharding: NamedSharding) -> dict:
  """This process's rows of a batch -> global jax.Arrays sharded over the batch axes.

  Every process passes its own consecutive slice of the global batch (the
  input pipeline shards by process); the global leading dim is the sum.
  """
  return {k: jax.make_array_from_process_local_data(sharding, np.asarray(v))
          for k, v in local.items()}


def from_full(x: np.ndarray, sharding: NamedSharding) -> jax.Array:
  """An array every process holds in full (eval data) -> a global sharded array."""
  return jax.make_array_from_callback(x.shape, sharding, lambda idx: x[idx])


def to_host(x: jax.Array) -> np.ndarray:
  """A replicated (or fully addressable) global array as NumPy, on any process."""
  if x.is_fully_addressable:
    return np.asarray(x)
  if not x.sharding.is_fully_replicated:
    raise ValueError(f"to_host needs a replicated array, got {x.sharding}")
  return np.asarray(x.addressable_data(0))


def allgather_json(obj) -> List[Any]:
  """Every process's `obj` (JSON-able), in process order, on every process."""
  if jax.process_count() == 1:
    return [obj]
  data = np.frombuffer(json.dumps(obj).encode(), np.uint8)
  sizes = multihost_utils.process_allgather(np.array([data.size], np.int32))
  padded = np.zeros(int(np.max(sizes)), np.uint8)
  padded[:data.size] = data
  rows = multihost_utils.process_allgather(padded)
  return [json.loads(bytes(r[:int(n)]).decode()) for r, n in zip(rows, np.ravel(sizes))]


def describe(shardings: Any) -> dict:
  """{'path/to/param': 'P(...)'} for logs and tests."""
  out = {}
  for path, s in jax.tree_util.tree_flatten_with_path(shardings)[0]:
    out["/".join(path_keys(path))] = str(s.spec)
  return out
