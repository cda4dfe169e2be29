"""Whether a compiled train step fits the memory of the devices it runs on.

Training checks its step before the first one (`check_fits`: a clear error, not XLA's
RESOURCE_EXHAUSTED after it, nor a CPU host's OOM killer); --mode=plan (plan.py) reports the same
figures for any config and device count.
"""

import math
import os
from typing import Optional

import jax
import numpy as np

from mural import models
from mural.state import TrainingError


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
  frozen = f"; {gib(constants)} a frozen backbone's constants" if constants else ""
  raise TrainingError(
      f"the train step needs {gib(step_bytes(memory) + constants)} per device "
      f"({gib(memory.argument_size_in_bytes)} state and batch, {gib(memory.temp_size_in_bytes)} "
      f"temporaries: XLA's memory analysis{frozen}), "
      f"more than the {gib(have)} a {jax.local_devices()[0].platform} device has here: lower the "
      "batch size, image size or model.text.max_len, set model.image.remat / model.text.remat, or "
      "split the batch (optim.grad_accum_steps); --mode=plan prints these figures for any config "
      "and device count")


def gib(n: int) -> str:
  """n bytes in GiB, or MiB below one GiB."""
  return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.2f} MiB"
