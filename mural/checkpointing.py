"""Checkpoints of a run (orbax), the SIGTERM stop request, and params for export / warm start.

`Checkpoints` keeps workdir/checkpoints/<step>/ with two items: 'state' (the
whole TrainState, sharded arrays written by every process) and 'data' (every
process's input-pipeline state, as JSON). `StopRequest` turns SIGTERM into a
checkpoint at the next step boundary. `restore_params(workdir)` reads the
model variables of a checkpoint without the config that wrote it.
"""

import signal
import threading
from typing import Any, Optional

import jax
import numpy as np
import orbax.checkpoint as ocp
from absl import flags as absl_flags
from absl import logging
from etils import epath
from jax.experimental import multihost_utils

from mural import sharding
from mural.state import TrainState


def _use_distributed_barriers():
  """Makes orbax sync hosts through the coordination service, not device collectives.

  orbax's default barrier is jax's sync_global_devices, a collective over all
  devices. Run from its async-commit thread, it can interleave with the train
  step's collectives in a different order on each host; on CPU (gloo) that
  fails with a size mismatch, elsewhere it can hang. The distributed-client
  barrier orbax offers behind this flag has no such race. Setting the flag
  here is what --experimental_orbax_use_distributed_barrier would do.
  """
  flag = absl_flags.FLAGS["experimental_orbax_use_distributed_barrier"]
  flag.value, flag.present = True, 1


def directory(workdir: str) -> epath.Path:
  return epath.Path(workdir) / "checkpoints"


class Checkpoints:
  """ocp.CheckpointManager over workdir/checkpoints: items 'state' and 'data'."""

  def __init__(self, workdir: str, keep: int):
    if jax.process_count() > 1:
      _use_distributed_barriers()
    self.directory = directory(workdir)
    self._manager = ocp.CheckpointManager(
        self.directory,
        options=ocp.CheckpointManagerOptions(max_to_keep=keep, create=True,
                                             enable_async_checkpointing=True))

  def latest_step(self) -> Optional[int]:
    return self._manager.latest_step()

  def save(self, step: int, state: TrainState, data_state: dict):
    """Async: returns once arrays are copied off the device; writing goes on behind."""
    processes = sharding.allgather_json(data_state)
    self._manager.save(step, force=True, args=ocp.args.Composite(
        state=ocp.args.StandardSave(state),
        data=ocp.args.JsonSave({"process_count": len(processes), "processes": processes})))

  def restore(self, step: int, abstract_state: TrainState, shardings: TrainState):
    """(state placed by `shardings`, this process's data state or None)."""
    target = sharding.with_shardings(abstract_state, shardings)
    restored = self._manager.restore(step, args=ocp.args.Composite(
        state=ocp.args.StandardRestore(target), data=ocp.args.JsonRestore()))
    data = restored.data
    if data["process_count"] != jax.process_count():
      logging.warning("Checkpoint %d was written by %d processes, this run has %d: the input "
                      "pipeline restarts from its beginning.", step, data["process_count"],
                      jax.process_count())
      return restored.state, None
    return restored.state, data["processes"][jax.process_index()]

  def wait(self):
    self._manager.wait_until_finished()

  def close(self):
    self._manager.close()


def restore_params(workdir: str, step: Optional[int] = None) -> dict:
  """{'params', 'batch_stats'} of checkpoint `step` (default: the latest) as host NumPy arrays.

  Needs no config: the tree comes from the checkpoint's own metadata, and
  only those two subtrees are read (not the optimizer state), so a
  checkpoint written on any mesh by any number of processes loads here
  (export and warm starts use it).
  """
  with ocp.CheckpointManager(directory(workdir),
                             options=ocp.CheckpointManagerOptions(create=False)) as manager:
    step = manager.latest_step() if step is None else step
    if step is None:
      raise FileNotFoundError(f"no checkpoint in {directory(workdir)}")
  path = directory(workdir) / str(step) / "state"
  checkpointer = ocp.PyTreeCheckpointer()
  tree = checkpointer.metadata(path).item_metadata.tree
  wanted = {k: tree[k] for k in ("params", "batch_stats")}
  restore_args = jax.tree.map(lambda _: ocp.RestoreArgs(restore_type=np.ndarray), wanted)
  return checkpointer.restore(path, args=ocp.args.PyTreeRestore(
      item=wanted, restore_args=restore_args, partial_restore=True))


class StopRequest:
  """SIGTERM -> stop at the next step boundary, after a checkpoint.

  One process: a Python signal handler sets a flag. Several processes: they
  must stop at the same step or the collectives hang, so JAX's preemption
  sync point (jax.distributed, fed by the coordination service's SIGTERM
  notice) decides.
  """

  def __init__(self):
    self._flag = threading.Event()
    self._previous = None

  def __enter__(self):
    if jax.process_count() == 1 and threading.current_thread() is threading.main_thread():
      self._previous = signal.signal(signal.SIGTERM, self._handle)
    return self

  def _handle(self, signum, frame):
    del signum, frame
    logging.warning("SIGTERM: saving a checkpoint at the next step boundary, then stopping.")
    self._flag.set()

  def __call__(self, step: int) -> bool:
    if jax.process_count() > 1:
      return multihost_utils.reached_preemption_sync_point(step)
    return self._flag.is_set()

  def __exit__(self, *exc):
    if self._previous is not None:
      signal.signal(signal.SIGTERM, self._previous)
