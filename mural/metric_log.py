"""Training metrics: metrics.jsonl, TensorBoard (clu.metric_writers) and console progress.

`writer(workdir)` is the TensorBoard writer of a run (process 0 writes event
files; other processes get a writer that drops everything). `MetricsLog`
holds each step's device metrics until a log step, then checks them, adds
timing (steps/s, examples/s, ETA) and writes one JSON line per log step.
`hparams(config)` is the config as TensorBoard hparams; `StepTrace` the
profiler trace of the steps config.profile names.
"""

import json
import math
import time
from typing import Any, Dict, List, Mapping, Optional, Tuple

import jax
from absl import logging
from etils import epath

from mural import config_lib
from mural import disk_space
from mural import lazy_import
from mural import sharding
from mural.state import TrainingError

metric_writers = lazy_import.module("clu.metric_writers")  # With it TensorFlow: loaded by `writer`.


class _DiskFullChecked:
  """A clu MetricWriter whose calls turn a full disk (TensorFlow's event file writer raises
  ResourceExhaustedError) into disk_space.DiskFull."""

  def __init__(self, inner, workdir: str):
    self._inner, self._workdir = inner, workdir

  def __getattr__(self, name):
    method = getattr(self._inner, name)

    def checked(*args, **kwargs):
      with disk_space.writing("TensorBoard events", self._workdir):
        return method(*args, **kwargs)
    return checked


def writer(workdir: str):
  """A clu MetricWriter; clu (and with it TensorFlow) loads here, not at import."""
  if jax.process_index() == 0:
    return _DiskFullChecked(metric_writers.SummaryWriter(str(workdir)), str(workdir))
  return metric_writers.MultiWriter([])


def hparams(config) -> Dict[str, Any]:
  """Every config field as a TensorBoard hparam (bool, int, float or str: other values, such as
  tuples and None, as their JSON text)."""
  return {k: v if isinstance(v, (bool, int, float, str)) else json.dumps(v)
          for k, v in config_lib.flat(config).items()}


def last_value(workdir: str, key: str) -> Optional[float]:
  """The last value of `key` in a run's metrics.jsonl; None without the file or the key."""
  path = epath.Path(workdir) / "metrics.jsonl"
  if not path.exists():
    return None
  values = [row[key] for row in map(json.loads, path.read_text().splitlines()) if key in row]
  return values[-1] if values else None


def _hms(seconds: float) -> str:
  seconds = int(seconds)
  return f"{seconds // 3600}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"


class MetricsLog:
  """Per-step device metrics held until a log step, then checked and written.

  Only log steps sync with the device; the non-finite check still covers
  every step in between, so the error names the first bad step.
  """

  def __init__(self, workdir: str, writer_, total_steps: int, examples_per_step: int,
               start_step: int):
    self.path = epath.Path(workdir) / "metrics.jsonl"
    self.writer = writer_
    self.total_steps = total_steps
    self.examples_per_step = examples_per_step
    self.pending: List[Tuple[int, Dict[str, jax.Array]]] = []
    self.last: Dict[str, float] = {}
    self._mark = (start_step, time.time())
    if jax.process_index() == 0 and self.path.exists():
      # Lines past the restored step come from steps that will be redone.
      kept = [l for l in self.path.read_text().splitlines() if l and json.loads(l)["step"] <= start_step]
      disk_space.write_file(self.path, "".join(l + "\n" for l in kept), "metrics")

  def add(self, step: int, metrics):
    self.pending.append((step, metrics))

  def check_finite(self, last_checkpoint: Optional[int]):
    """Raises TrainingError naming the first pending step with a non-finite loss."""
    for step, metrics in self.pending:
      v = float(sharding.to_host(metrics["loss"]))  # This process's replica.
      if not math.isfinite(v):
        raise TrainingError(
            f"step {step}: the training loss is {v}. Stopping; the last checkpoint is "
            f"{'step ' + str(last_checkpoint) if last_checkpoint is not None else 'none'}. "
            f"Try a lower learning rate, optim.grad_clip_norm, or model.dtype=float32.")

  def write(self, step: int, extra: Mapping[str, float]) -> Dict[str, float]:
    """Logs step's metrics (the latest pending) with timing and `extra`."""
    _, metrics = self.pending[-1]
    scalars = {k: float(sharding.to_host(v)) for k, v in metrics.items()}
    first_step, first_time = self._mark
    now = time.time()
    step_time = (now - first_time) / max(step - first_step, 1)
    scalars.update({
        "step_time_sec": step_time, "steps_per_sec": 1.0 / step_time,
        "examples_per_sec": self.examples_per_step / step_time, **extra})
    self._mark = (step, now)
    self.pending.clear()
    self.last = scalars
    eta = (self.total_steps - step) * step_time
    logging.info("step %d/%d  loss %.4f  %.2f steps/s  ETA %s", step, self.total_steps,
                 scalars["loss"], scalars["steps_per_sec"], _hms(eta))
    if jax.process_index() == 0:
      disk_space.append_line(self.path, json.dumps({"step": step, **scalars}), "metrics")
    self.writer.write_scalars(step, {f"train/{k}": v for k, v in scalars.items()})
    self.writer.flush()
    return scalars


class StepTrace:
  """config.profile's jax.profiler trace of training steps, on process 0, into WORKDIR (jax
  writes WORKDIR/plugins/profile/<time>/, where TensorBoard's Profile tab looks)."""

  def __init__(self, profile, workdir: str):
    self.first, self.last = profile.start_step, profile.start_step + profile.num_steps - 1
    self.wanted = profile.num_steps > 0 and jax.process_index() == 0
    self.workdir, self.tracing, self.outputs = workdir, False, None

  def before(self, step: int):
    if self.wanted and step == self.first:
      try:
        jax.profiler.start_trace(self.workdir)
      except (RuntimeError, OSError) as e:  # A trace already running, a path it cannot write.
        logging.warning("config.profile: no trace (%s); training goes on.", e)
        return
      self.tracing = True

  def after(self, step: int, outputs):
    if self.tracing:
      self.outputs = outputs
      if step == self.last:
        self.stop()

  def stop(self):
    if self.tracing:
      jax.block_until_ready(self.outputs)  # The last traced step's work is in the trace.
      jax.profiler.stop_trace()
      self.tracing = self.wanted = False
      self.outputs = None
      logging.info("Traced training from step %d into %s/plugins/profile (TensorBoard's Profile "
                   "tab).", self.first, self.workdir)
