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
(`device_memory.check_fits`, on the devices it runs on, so with their own compile).
"""

import math
from typing import Any, Dict

import jax
from absl import logging

from mural import device_memory
from mural import sharding
from mural import system as system_lib
from mural import train

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
      constant_bytes_per_device=device_memory.constant_bytes(config, setup.model),
      flops_per_step=float(cost.get("flops", 0.0)) * devices,
  )
  out["total_bytes_per_device"] = device_memory.step_bytes(memory) + out["constant_bytes_per_device"]
  out["fits"] = {name: out["total_bytes_per_device"] <= size for name, size in ACCELERATORS.items()}
  return out


def table(p: Dict[str, Any]) -> str:
  """The plan for people (the JSON line follows it)."""
  gib = lambda b: f"{device_memory.gib(b):>12}"
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
