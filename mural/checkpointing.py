"""Checkpoints of a run (orbax), the SIGTERM stop request, and params for export / warm start.

`Checkpoints` keeps workdir/checkpoints/<step>/ with two items: 'state' (the
whole TrainState, sharded arrays written by every process) and 'data' (every
process's input-pipeline state, as JSON). `StopRequest` turns SIGTERM (and Ctrl-C) into a
checkpoint at the next step boundary. `restore_params(workdir)` reads the
model variables of a checkpoint without the config that wrote it.

A checkpoint that cannot be read (a file truncated or missing, a step
directory emptied) does not end the run: `Checkpoints.restore_latest` moves
the step aside to checkpoints/<step>.corrupt-<UTC time> (a name orbax does
not list; nothing is deleted), logs one warning line with the step and the
first line of the error, and restores the step before it, until one reads.
With none left it raises FileNotFoundError, and keeps doing so while moved
steps sit there and no readable one exists: a run never silently starts over
from step 0. Not corrupt, so nothing is moved: a step that reads but does not
fit the config (ValueError naming the first difference), and a restore that
fails on the device or host rather than on a file (out of memory:
TrainingError). Every process tries the step, they compare outcomes, and all
fall back if any could not read it; only process 0 renames. Evaluation
(`move_aside=False`) falls back the same way but leaves the workdir as is.

Best checkpoint (early stopping, config.early_stopping): `Checkpoints(...,
track_best=True)` saves each step with `EarlyStopping.metrics` (orbax's
per-checkpoint metrics) and keeps, besides the newest `keep` steps, the one
whose evaluation scored best (orbax BestN under AnyPreservationPolicy;
`best_step()` is orbax's). `read_params` / `restore_params` (export, warm
starts, backbones) read that step by default when a run recorded one.
"""

import contextlib
import gc
import signal
import threading
import time
from typing import Any, List, Optional, Tuple

import jax
import numpy as np
import orbax.checkpoint as ocp
from absl import flags as absl_flags
from absl import logging
from etils import epath
from jax.experimental import multihost_utils

from mural import disk_space
from mural import orbax_quiet
from mural import sharding
from mural.state import TrainingError, TrainState


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


CORRUPT_MARK = ".corrupt-"  # checkpoints/<step>.corrupt-<time>: a step moved aside.


class _Unfit(ValueError):
  """The checkpoint reads but was written for another model or optimizer."""


class _ReadError(Exception):
  """Reading one part of a step failed: `what` names the part, the cause says how."""

  def __init__(self, what: str):
    super().__init__(what)
    self.what = what


@contextlib.contextmanager
def _reading(what: str):
  try:
    yield
  except _Unfit:
    raise
  except Exception as e:  # pylint: disable=broad-exception-caught
    raise _ReadError(what) from e


def _one_line(e: BaseException) -> str:
  """'[part: ]Type: first line' of the innermost cause (orbax wraps tensorstore's error in a spec dump)."""
  prefix = f"{e.what}: " if isinstance(e, _ReadError) else ""
  while e.__cause__ is not None:
    e = e.__cause__
  lines = str(e).strip().splitlines()
  text = lines[0] if lines else ""
  text = text.split(" [tensorstore_spec", 1)[0]
  if len(text) > 400:
    text = text[:200] + " ... " + text[-195:]
  return prefix + (f"{type(e).__name__}: {text}" if text else type(e).__name__)


def _not_the_checkpoint_files(e: BaseException) -> bool:
  """Whether a failed restore failed on the device or host (out of memory, ...), not on a file."""
  seen = set()
  while e is not None and id(e) not in seen:
    seen.add(id(e))
    if isinstance(e, (MemoryError, jax.errors.JaxRuntimeError)):
      return True
    e = e.__cause__ or e.__context__
  return False


def _flat(tree) -> dict:
  return {"/".join(sharding.path_keys(path)): leaf
          for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]}


def _misfit(stored_tree, target) -> Optional[str]:
  """How the checkpoint's arrays differ from the config's (None: same names and shapes)."""
  stored, wanted = _flat(stored_tree), _flat(target)
  problems = [f"{k}: stored shape {tuple(stored[k].shape)}, this config {tuple(wanted[k].shape)}"
              for k in wanted if k in stored and tuple(stored[k].shape) != tuple(wanted[k].shape)]
  problems += [f"{k}: not in the checkpoint" for k in wanted if k not in stored]
  problems += [f"{k}: in the checkpoint, not in this config" for k in stored if k not in wanted]
  if not problems:
    return None
  more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
  return problems[0] + more


def _score(metrics) -> float:
  """orbax's best_fn: an evaluated step's score (higher is better), -inf for the others."""
  return float(metrics["score"]) if metrics and metrics.get("evaluated") else -float("inf")


class EarlyStopping:
  """Stops after `patience` evaluations in a row without a better `metric` (mode max or min).

  Its state travels with every checkpoint as orbax metrics (`metrics()`, `restore`), so a
  resumed run counts on exactly where it stopped; 'score' is the value signed so higher is
  better, 'evaluated' says whether that step was evaluated.
  """

  def __init__(self, metric: str, patience: int, mode: str):
    self.metric, self.patience, self.sign = metric, patience, 1.0 if mode == "max" else -1.0
    self.best, self.best_step, self.since_best, self.score = None, None, 0, None

  def update(self, step: int, results) -> bool:
    """Takes an evaluation's results; True when the run should stop."""
    if self.metric not in results:
      raise ValueError(f"config.early_stopping.metric: {self.metric!r} is not among the evaluation's "
                       f"results {sorted(results)}")
    self.score = self.sign * float(results[self.metric])
    if self.best is None or self.score > self.best:
      self.best, self.best_step, self.since_best = self.score, step, 0
    else:
      self.since_best += 1
    return self.exhausted

  @property
  def exhausted(self) -> bool:
    return self.since_best >= self.patience

  def metrics(self) -> dict:
    """What the checkpoint at this step records (then forgets this step's score)."""
    out = {"evaluated": int(self.score is not None), "score": self.score or 0.0,
           "best": self.best if self.best is not None else 0.0,
           "best_step": self.best_step if self.best_step is not None else -1, "since_best": self.since_best}
    self.score = None
    return out

  def restore(self, metrics) -> None:
    if metrics and metrics.get("best_step", -1) >= 0:
      self.best, self.best_step = float(metrics["best"]), int(metrics["best_step"])
      self.since_best = int(metrics["since_best"])


class Checkpoints:
  """ocp.CheckpointManager over workdir/checkpoints: items 'state' and 'data'."""

  def __init__(self, workdir: str, keep: int, track_best: bool = False):
    if jax.process_count() > 1:
      _use_distributed_barriers()
    self.directory = directory(workdir)
    if track_best:  # The newest `keep` steps and the best evaluated one.
      policy = ocp.checkpoint_managers.AnyPreservationPolicy([
          ocp.checkpoint_managers.LatestN(n=keep),
          ocp.checkpoint_managers.BestN(get_metric_fn=_score, n=1, keep_checkpoints_without_metrics=False)])
      options = ocp.CheckpointManagerOptions(create=True, enable_async_checkpointing=True, best_fn=_score,
                                             best_mode="max", preservation_policy=policy)
    else:
      options = ocp.CheckpointManagerOptions(max_to_keep=keep, create=True, enable_async_checkpointing=True)
    with orbax_quiet.listing():
      self._manager = ocp.CheckpointManager(self.directory, options=options)
    self._saving: Optional[int] = None  # The step of the save in flight (async), if any.
    orbax_quiet.quiet_failed_saves()

  def latest_step(self) -> Optional[int]:
    return self._manager.latest_step()

  def best_step(self) -> Optional[int]:
    """The evaluated step with the best early-stopping score (None: none recorded)."""
    return _best_step(self._manager)

  def metrics(self, step: int) -> Optional[dict]:
    return self._manager.metrics(step)

  def moved_aside(self) -> List[str]:
    """Names of the steps moved aside as unreadable, newest first."""
    if not self.directory.exists():
      return []
    names = [p.name for p in self.directory.iterdir() if CORRUPT_MARK in p.name]
    step = lambda name: int(name.split(".")[0]) if name.split(".")[0].isdigit() else -1
    return sorted(names, key=lambda name: (step(name), name), reverse=True)

  def restore_latest(self, abstract_state: TrainState, shardings: TrainState, *,
                     move_aside: bool = True, newest: Optional[int] = None
                     ) -> Tuple[Optional[int], Any, Optional[dict]]:
    """(step, state, this process's data state) of the newest step that reads (no later than
    `newest` when given); (None, None, None) when there is no checkpoint.

    A step that cannot be read is moved aside (only when `move_aside`:
    evaluation leaves the workdir as it is and just reads the step before),
    with one warning line, and the previous step is tried. Raises
    FileNotFoundError when steps were there but none reads, ValueError when
    a step reads but was written for another model or optimizer, and
    TrainingError when a restore fails for another reason than its files.
    """
    steps = sorted(sharding.allgather_json(list(self._manager.all_steps()))[0], reverse=True)
    if newest is not None:
      if newest not in steps:
        raise FileNotFoundError(f"no checkpoint {newest} in {self.directory} (steps: {sorted(steps)})")
      steps = [s for s in steps if s <= newest]
    failed = []
    for step in steps:
      report, state, data = self._try_restore(step, abstract_state, shardings)
      reports = sharding.allgather_json(report)  # Every process's outcome, on every process.
      found = lambda kind: [r["message"] for r in reports if r["kind"] == kind]
      if found("unfit"):
        raise ValueError(f"checkpoint {step} in {self.directory} was written for another model or "
                         f"optimizer: {found('unfit')[0]}; use the config that wrote it or a new "
                         "--workdir")
      if found("failed"):
        raise TrainingError(f"checkpoint {step} in {self.directory} could not be restored "
                            f"({found('failed')[0]}); its files are not the problem and it was left "
                            "in place")
      unreadable = [i for i, r in enumerate(reports) if r["kind"] == "unreadable"]
      if not unreadable:
        return step, state, self._this_process(step, data)
      del state, data  # Read by the processes that could: they fall back too.
      reason = reports[unreadable[0]]["message"]
      if len(reports) > 1:
        reason = f"process{'es' if len(unreadable) > 1 else ''} {', '.join(map(str, unreadable))}: {reason}"
      if move_aside:
        where = self._move_aside(step)
        logging.warning("Checkpoint %d cannot be read (%s): moved it aside to %s; trying the "
                        "previous one.", step, reason, where)
      else:
        logging.warning("Checkpoint %d cannot be read (%s); trying the previous one.", step, reason)
      failed.append(step)
    aside = self.moved_aside()
    if failed or aside:
      found = []
      if failed and not move_aside:
        found.append(f"step{'s' if len(failed) > 1 else ''} {', '.join(map(str, failed))} "
                     "cannot be read")
      if aside:
        found.append(f"moved aside as unreadable: {', '.join(aside)}")
      raise FileNotFoundError(
          f"no readable checkpoint in {self.directory} ({'; '.join(found)}); to start from "
          "step 0, move these out of the way or use a new --workdir")
    return None, None, None

  def _try_restore(self, step, abstract_state, shardings):
    """({'kind', 'message'}, state, data state) of one step; kind: 'ok', 'unfit' (another model),
    'unreadable' (its files), 'failed' (not its files: out of memory, ...)."""
    try:
      with orbax_quiet.quiet_failed_read(self.directory / str(step), before_any_read=_Unfit):
        state, data = self._read(step, abstract_state, shardings)
      return {"kind": "ok", "message": ""}, state, data
    except _Unfit as e:
      return {"kind": "unfit", "message": str(e)}, None, None
    except Exception as e:  # pylint: disable=broad-exception-caught
      logging.debug("Reading checkpoint %d failed", step, exc_info=True)
      kind = "failed" if _not_the_checkpoint_files(e) else "unreadable"
      report = {"kind": kind, "message": _one_line(e)}
    gc.collect()  # The failed read's coroutines go now (their debris is filtered), not at exit.
    return report, None, None

  def _move_aside(self, step: int) -> str:
    """Process 0 renames checkpoints/<step> to <step>.corrupt-<time>; every process gets the name."""
    name = None
    if jax.process_index() == 0:
      stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
      name = f"{step}{CORRUPT_MARK}{stamp}"
      n = 1
      while (self.directory / name).exists():
        n += 1
        name = f"{step}{CORRUPT_MARK}{stamp}-{n}"
      try:
        (self.directory / str(step)).rename(self.directory / name)
      except OSError as e:
        name = {"error": f"{type(e).__name__}: {e}"}
    name = sharding.allgather_json(name)[0]  # Also: nobody reads on before the rename is done.
    if isinstance(name, dict):
      raise TrainingError(f"checkpoint {step} in {self.directory} cannot be read and cannot be moved "
                          f"aside ({name['error']}); move it out of the way by hand")
    with orbax_quiet.listing():
      self._manager.reload()  # Its cached list of steps still has this one.
    return str(self.directory / name)

  def save(self, step: int, state: TrainState, data_state: dict, metrics: Optional[dict] = None):
    """Async: returns once arrays are copied off the device; writing goes on behind. A full disk
    (found here for the save before, or in `wait`) raises DiskFull."""
    processes = sharding.allgather_json(data_state)
    with self._disk_full():
      self._manager.wait_until_finished()  # The save before's error belongs to its own step.
      self._saving = step
      self._manager.save(step, force=True, metrics=metrics, args=ocp.args.Composite(
          state=ocp.args.StandardSave(state),
          data=ocp.args.JsonSave({"process_count": len(processes), "processes": processes})))

  def resume_note(self) -> str:
    """What the same command resumes from, said once a write failed: the newest step on disk
    once the save in flight, if any, has ended (it may fail for the same want of space)."""
    try:
      self.wait()
    except disk_space.DiskFull:
      pass
    latest = self.latest_step()
    if latest is None:
      return "no checkpoint is whole yet: the same command starts from step 0 once there is space"
    return (f"checkpoint {latest} is whole: the same command resumes from it once there is space")

  @contextlib.contextmanager
  def _disk_full(self):
    """A save that failed for want of space -> DiskFull naming its step and the whole checkpoint
    a rerun resumes from; the failed step's partial folder is removed (process 0), so it holds
    no space and no later listing meets it."""
    try:
      yield
    except Exception as e:  # pylint: disable=broad-except  (only a full disk is turned)
      if not disk_space.is_disk_full(e):
        raise
      step, self._saving = self._saving, None
      if jax.process_index() == 0 and step is not None and self.directory.exists():
        for partial in self.directory.glob(f"{step}.orbax-checkpoint-tmp*"):
          disk_space.remove(partial)
      with orbax_quiet.listing():
        self._manager.reload()
      what = f"checkpoint {step}" if step is not None else "a checkpoint"
      raise disk_space.DiskFull(what, str(self.directory), self.resume_note()) from e

  def _read(self, step: int, abstract_state: TrainState, shardings: TrainState):
    """(state placed by `shardings`, the 'data' item) of `step`, or an error.

    Raises _Unfit (a ValueError) when the step's arrays do not match the
    config's names and shapes, before reading any of them. Reads with the
    item handlers, not through the manager: the manager's restore ends in a
    barrier across processes, which a process whose read failed never reaches.
    """
    target = sharding.with_shardings(abstract_state, shardings)
    path = self.directory / str(step)
    handler = ocp.StandardCheckpointHandler()
    try:
      with _reading("state metadata"):
        stored = handler.metadata(path / "state").tree
      misfit = _misfit(stored, target)
      if misfit:
        raise _Unfit(misfit)
      with _reading("state arrays"):
        state = handler.restore(path / "state", args=ocp.args.StandardRestore(target))
    finally:
      handler.close()
    with _reading("input state"):
      data = ocp.JsonCheckpointHandler().restore(path / "data", args=ocp.args.JsonRestore())
      if len(data["processes"]) != data["process_count"]:
        raise ValueError(f"{len(data['processes'])} input states for {data['process_count']} processes")
    return state, data

  @staticmethod
  def _this_process(step: int, data: dict) -> Optional[dict]:
    """This process's input state in a step's 'data' item (None: written by another process count)."""
    if data["process_count"] != jax.process_count():
      logging.warning("Checkpoint %d was written by %d processes, this run has %d: the input "
                      "pipeline restarts from its beginning.", step, data["process_count"],
                      jax.process_count())
      return None
    return data["processes"][jax.process_index()]

  def wait(self):
    """Until the save in flight is on disk (DiskFull when it could not be written)."""
    with self._disk_full():
      self._manager.wait_until_finished()
    self._saving = None

  def close(self):
    self._manager.close()


def restore_params(workdir: str, step: Optional[int] = None) -> dict:
  """{'params', 'batch_stats'} of checkpoint `step` (default: the newest that reads) as host
  NumPy arrays (see read_params)."""
  return read_params(workdir, step)[1]


def _best_step(manager) -> Optional[int]:
  best = manager.best_step() if manager.all_steps() else None
  return best if best is not None and _score(manager.metrics(best)) > -float("inf") else None


def best_step(workdir: str) -> Optional[int]:
  """The step an early-stopping run recorded as its best (None: none recorded)."""
  with orbax_quiet.listing(), ocp.CheckpointManager(directory(workdir), options=ocp.CheckpointManagerOptions(
      create=False, best_fn=_score, best_mode="max")) as manager:
    return _best_step(manager)


def read_params(workdir: str, step: Optional[int] = None) -> Tuple[int, dict]:
  """(step read, {'params', 'batch_stats'} of it as host NumPy arrays); default: the best step of
  an early-stopping run (best_step), else the newest, falling back to the newest others that read.

  Needs no config: the tree comes from the checkpoint's own metadata, and
  only those two subtrees are read (not the optimizer state), so a
  checkpoint written on any mesh by any number of processes loads here
  (export and warm starts use it). Like evaluation, it reads and moves
  nothing: an unreadable newest step gets one warning line and the step
  before it is read; a chosen `step` that does not read is an error.
  """
  with orbax_quiet.listing(), ocp.CheckpointManager(directory(workdir), options=ocp.CheckpointManagerOptions(
      create=False, best_fn=_score, best_mode="max")) as manager:
    steps = sorted(manager.all_steps(), reverse=True)
    best = _best_step(manager) if steps else None
  if best is not None:
    steps = [best] + [s for s in steps if s != best]
  if step is not None:
    if step not in steps:
      raise FileNotFoundError(f"no checkpoint {step} in {directory(workdir)} (steps: {sorted(steps)})")
    steps = [step]
  if not steps:
    raise FileNotFoundError(f"no checkpoint in {directory(workdir)}")
  failed = []
  for candidate in steps:
    path = directory(workdir) / str(candidate) / "state"
    try:
      # The item has no _CHECKPOINT_METADATA of its own.
      with orbax_quiet.quiet_failed_read(path.parent), orbax_quiet.listing():
        return candidate, _read_params(path)
    except Exception as e:  # pylint: disable=broad-exception-caught
      if _not_the_checkpoint_files(e):
        raise
      failed.append(f"{candidate} ({_one_line(e)})")
      if step is None and candidate != steps[-1]:
        logging.warning("Checkpoint %s cannot be read; reading the one before.", failed[-1])
  raise FileNotFoundError(f"no readable checkpoint in {directory(workdir)}: "
                          f"{'; '.join(failed)}")


def _read_params(path: epath.Path) -> dict:
  checkpointer = ocp.PyTreeCheckpointer()
  tree = checkpointer.metadata(path).item_metadata.tree
  wanted = {k: tree[k] for k in ("params", "batch_stats")}
  restore_args = jax.tree.map(lambda _: ocp.RestoreArgs(restore_type=np.ndarray), wanted)
  return checkpointer.restore(path, args=ocp.args.PyTreeRestore(
      item=wanted, restore_args=restore_args, partial_restore=True))


class StopRequest:
  """SIGTERM, or Ctrl-C (SIGINT) -> stop at the next step boundary, after a checkpoint.

  One process: a Python signal handler sets a flag (`reason` names the
  signal). A second Ctrl-C goes to the handler before it (Python's raises
  KeyboardInterrupt; mural.main's exits at once), without the checkpoint. Ctrl-C is left alone where Python's handler is not in place
  (started with SIGINT ignored, e.g. `cmd &` in a script). Several
  processes: they must stop at the same step or the collectives hang, so
  JAX's preemption sync point (jax.distributed, fed by the coordination
  service's SIGTERM notice) decides.
  """

  def __init__(self):
    self._flag = threading.Event()
    self._previous = {}
    self.reason = "a stop request"

  def __enter__(self):
    if jax.process_count() == 1 and threading.current_thread() is threading.main_thread():
      self._previous[signal.SIGTERM] = signal.signal(signal.SIGTERM, self._handle)
      if callable(signal.getsignal(signal.SIGINT)):  # Not SIG_IGN (started ignoring it).
        self._previous[signal.SIGINT] = signal.signal(signal.SIGINT, self._handle)
    return self

  def _handle(self, signum, frame):
    del frame
    self.reason = signal.Signals(signum).name
    if signum == signal.SIGINT:  # The next Ctrl-C interrupts.
      signal.signal(signal.SIGINT, self._previous[signal.SIGINT])
      logging.warning("Ctrl-C: saving a checkpoint at the next step boundary, then stopping (Ctrl-C "
                      "again to stop now, without it).")
    else:
      logging.warning("SIGTERM: saving a checkpoint at the next step boundary, then stopping.")
    self._flag.set()

  def __call__(self, step: int) -> bool:
    if jax.process_count() > 1:
      if multihost_utils.reached_preemption_sync_point(step):
        self.reason = "a preemption notice"
        return True
      return False
    return self._flag.is_set()

  def __exit__(self, *exc):
    for signum, previous in self._previous.items():
      signal.signal(signum, previous)
