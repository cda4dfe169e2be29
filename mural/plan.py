"""--mode=plan: the memory a config needs per device on N devices, before paying for them.

`python -m mural.main --config=configs/mural_base.py --mode=plan --devices=128`
builds the real train step (mural/train.py: `build` + `jit_train_step`, the
shardings and donation training uses) and compiles it for a mesh of N
devices from abstract shapes: no weight is allocated. With --devices it runs
on N fake CPU devices (XLA's --xla_force_host_platform_device_count, set by
mural/main.py before JAX loads), so a laptop plans a pod. It prints a table
and, as the last line, one JSON object (`PLAN_KEYS` and more).

What the figures are:
  params / opt_state / batch_stats bytes   the shards one device holds (from the shardings);
  argument / output / alias / temp bytes   XLA's memory analysis of the compiled step on one
                                           device (alias: outputs written over donated inputs);
  constant_bytes_per_device                a frozen backbone's variables (MULE, SMALR, Kadar et
                                           al.): constants of the step's program, not
                                           arguments, so a copy on every device;
  total_bytes_per_device                   argument + output - alias + temp + constant: the
                                           step's peak;
  flops_per_step                           XLA's cost analysis of one device's program times
                                           the devices; it counts a loop's body once (the
                                           micro-batch scans of grad_accum_steps, the ring
                                           loss's steps), so it is a lower bound.
The compile is XLA's CPU compile of the SPMD-partitioned step: fusion and
layouts differ from a TPU or GPU compile, so read the figures as a plan
(within tens of percent), not as the accelerator's allocator.

Training checks its own compiled step the same way before the first step
(`check_fits`, on the devices it runs on, so with their own compile).
"""

import math
import os
from typing import Any, Dict, Optional

import jax
from absl import logging
import numpy as np

from mural import models
from mural import sharding
from mural import system as system_lib
from mural import train
from mural.state import TrainingError

PLAN_KEYS = (  # At least these in the JSON line (scripts read them).
    "devices", "mesh", "global_batch", "dtype", "params_bytes_per_device",
             "opt_state_bytes_per_device", "temp_bytes_per_device", "total_bytes_per_device",
             "flops_per_step")
# Memory per device of the accelerators a plan is read against (bytes).
ACCELERATORS = {"TPU v3 (16 GiB)": 16 * 2**30, "TPU v4 (32 GiB)": 32 * 2**30, "H100 (80 GB)": 80 * 10**9}


def _bytes_per_device(abstract_tree: Any, shardings: Any) -> int:
  """Bytes of the shards of `abstract_tree` on one device (the largest shard of each array)."""
  def shard_bytes(x, s):
    return math.prod(s.shard_shape(x.shape)) * x.dtype.itemsize
  return int(sum(jax.tree.leaves(jax.tree.map(shard_bytes, abstract_tree, shardings))))


def step_bytes(memory) -> int:
  """A compiled program's peak on one device from XLA's memory analysis: arguments + outputs -
  outputs written over donated arguments + temporaries."""
  return int(memory.argument_size_in_bytes + memory.output_size_in_bytes
             - memory.alias_size_in_bytes + memory.temp_size_in_bytes)


def device_memory_bytes() -> Optional[int]:
  """The memory one local device has: its allocator's limit on a GPU or TPU; on the CPU, the
  host's RAM (or its cgroup's limit, if lower) shared by the local CPU devices. None if unknown."""
  device = jax.local_devices()[0]
  limit = (device.memory_stats() or {}).get("bytes_limit")
  if limit:
    return int(limit)
  if device.platform != "cpu":
    return None
  try:
    ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
  except (ValueError, OSError, AttributeError):
    return None
  try:
    with open("/sys/fs/cgroup/memory.max") as f:
      ram = min(ram, int(f.read()))  # 'max' (no limit) is not an int.
  except (OSError, ValueError):
    pass
  return ram // jax.local_device_count()


def constant_bytes(config, model) -> int:
  """A frozen backbone's variables (MULE, SMALR, Kadar et al.): constants of the step's program,
  a copy on every device, which XLA's memory analysis leaves out."""
  leaves = jax.tree.leaves(models.frozen_inputs(config, model))
  return int(sum(math.prod(x.shape) * np.dtype(x.dtype).itemsize for x in leaves))  # No fetch.


def check_fits(compiled, constants: int = 0, have: Optional[int] = None) -> None:
  """A train step that needs more memory than a device has is a clear error before its first
  step, not XLA's RESOURCE_EXHAUSTED after it (or, on a CPU host, the kernel's OOM killer).

  `constants`: the program's constant bytes (constant_bytes); `have`: the device's bytes
  (default device_memory_bytes()); nothing is checked when unknown."""
  have = device_memory_bytes() if have is None else have
  memory = compiled.memory_analysis()
  if not have or memory is None or step_bytes(memory) + constants <= have:
    return
  frozen = f"; {_gib(constants)} a frozen backbone's constants" if constants else ""
  raise TrainingError(
      f"the train step needs {_gib(step_bytes(memory) + constants)} per device "
      f"({_gib(memory.argument_size_in_bytes)} state and batch, {_gib(memory.temp_size_in_bytes)} "
      f"temporaries: XLA's memory analysis{frozen}), "
      f"more than the {_gib(have)} a {jax.local_devices()[0].platform} device has here: lower the "
      "batch size, image size or model.text.max_len, set model.image.remat / model.text.remat, or "
      "split the batch (optim.grad_accum_steps); --mode=plan prints these figures for any config "
      "and device count")


def _gib(n: int) -> str:
  return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.2f} MiB"


def plan(config) -> Dict[str, Any]:
  """Compiles config's train step for the devices JAX sees; the figures above, as a dict."""
  devices = jax.devices()  # The backend first: the line below says the plan has begun.
  logging.info("Planning for %d %s devices: the model, then its train step's compile (minutes at "
               "paper sizes).", len(devices), devices[0].platform)
  setup = train.build(config)
  state = sharding.with_shardings(setup.abstract_state, setup.state_shardings)
  batch = {task: {k: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=setup.data_sharding)
                  for k, s in shapes.items()}
           for task, shapes in system_lib.batch_shapes(setup.tasks, config).items()}
  compiled = train.jit_train_step(setup).lower(state, batch).compile()
  memory = compiled.memory_analysis()
  cost = compiled.cost_analysis()
  cost = cost[0] if isinstance(cost, (list, tuple)) else cost
  devices = jax.device_count()
  out = dict(
      devices=devices, mesh=dict(setup.mesh.shape),
      global_batch={t.name: t.batch_size for t in setup.tasks},
      dtype=config.model.dtype,
      remat={"image": config.model.image.get("remat", "none"), "text": config.model.text.get("remat", "none")},
      loss_impl={t.name: config.tasks[t.name].get("loss_impl", "") for t in setup.tasks},
      params_bytes_per_device=_bytes_per_device(setup.abstract_state.params, setup.state_shardings.params),
      opt_state_bytes_per_device=_bytes_per_device(setup.abstract_state.opt_state,
                                                   setup.state_shardings.opt_state),
      batch_stats_bytes_per_device=_bytes_per_device(setup.abstract_state.batch_stats,
                                                     setup.state_shardings.batch_stats),
      argument_bytes_per_device=int(memory.argument_size_in_bytes),
      output_bytes_per_device=int(memory.output_size_in_bytes),
      alias_bytes_per_device=int(memory.alias_size_in_bytes),
      temp_bytes_per_device=int(memory.temp_size_in_bytes),
      constant_bytes_per_device=constant_bytes(config, setup.model),
      flops_per_step=float(cost.get("flops", 0.0)) * devices,
  )
  out["total_bytes_per_device"] = step_bytes(memory) + out["constant_bytes_per_device"]
  out["fits"] = {name: out["total_bytes_per_device"] <= size for name, size in ACCELERATORS.items()}
  return out


def table(p: Dict[str, Any]) -> str:
  """The plan for people (the JSON line follows it)."""
  gib = lambda b: f"{_gib(b):>12}"
  rows = [
      f"Plan: {p['devices']} devices, mesh {p['mesh']}, global batch {p['global_batch']}, "
      f"dtype {p['dtype']}, remat {p['remat']}, loss {p['loss_impl']}",
      f"  params          {gib(p['params_bytes_per_device'])} per device",
      f"  optimizer state {gib(p['opt_state_bytes_per_device'])}",
      f"  step arguments  {gib(p['argument_bytes_per_device'])} (state + batch), outputs "
      f"{gib(p['output_bytes_per_device'])}, of which {gib(p['alias_bytes_per_device'])} reuse donated inputs",
      f"  temporaries     {gib(p['temp_bytes_per_device'])}",
      *([f"  frozen constants{gib(p['constant_bytes_per_device'])} (a frozen backbone's variables, "
         "in the program: a copy on every device)"] if p["constant_bytes_per_device"] else []),
      f"  total           {gib(p['total_bytes_per_device'])}  "
      + ", ".join(f"{name}: {'fits' if ok else 'does not fit'}" for name, ok in p["fits"].items()),
      f"  FLOPs per step  {p['flops_per_step']:.3e} (XLA's cost analysis, all devices; loop bodies counted once)",
  ]
  return "\n".join(rows)
