"""Training and evaluation loops: `train_and_evaluate(config, workdir)`, `evaluate(config, workdir)`.

`train_and_evaluate` reads top to bottom, one banner per stage:
  mesh -> input pipeline -> model and optimizer -> shapes and shardings ->
  update step -> restore or init -> evaluators -> loop.
Everything it needs from the config is built by `_build` (shared with
`evaluate`), so the two modes can never disagree on shapes or shardings.

Sharding: one jax.jit over global arrays (sharding.py): the in-batch softmax
of each loss sees the global batch and batch-norm statistics are moments of
the global batch, on any mesh and any number of processes.

Resume: a run started in a workdir holding checkpoints continues from the
latest one: train state (step, params, per-task optimizer states, batch-norm
statistics, rng) plus every process's input-pipeline state. Per-step
randomness is `fold_in(state.rng, step)`, the input pipeline resumes exactly,
so a run interrupted after checkpoint k and resumed ends with the same losses
and params as one that never stopped (tests/test_train.py). SIGTERM (a TPU
preemption, a cluster eviction) saves a checkpoint at the next step boundary
and returns; multi-process runs agree on that step through JAX's preemption
sync point.
"""

import dataclasses
import json
import math
import signal
import threading
import time
from typing import Any, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import orbax.checkpoint as ocp
from absl import flags as absl_flags
from absl import logging
from etils import epath
from jax.experimental import multihost_utils
from jax.sharding import NamedSharding, PartitionSpec as P

from mural import config_lib
from mural import evaluate as evaluate_lib
from mural import losses
from mural import models
from mural import optim
from mural import sharding
from mural.data import eval_data
from mural.data import pipeline
from mural.data import sources
from mural.data import synthetic
from mural.data import tokenizer as tokenizer_lib

# Batch keys each task feeds the model and the loss ('lang' stays on the host).
TASK_KEYS = {
    "i2t": ("image", "text_ids", "text_mask", "image_text_valid"),
    "t2t": ("left_ids", "left_mask", "right_ids", "right_mask", "pair_valid"),
}


class TrainingError(RuntimeError):
  """The run cannot go on; the message names the step and what to try."""


@flax.struct.dataclass
class TrainState:
  """Everything a step reads and writes, as one pytree (checkpointed whole)."""
  step: jax.Array  # int32 scalar: updates done.
  params: Any
  opt_state: Dict[str, Any]  # Task -> that task's LAMB state (optim.py).
  batch_stats: Any  # Batch-norm running statistics of the image tower.
  rng: jax.Array  # Base key; step s uses fold_in(rng, s).


def active_tasks(config) -> Tuple[str, ...]:
  """('i2t',) for ALIGN; ('i2t', 't2t') when the t2t loss has weight and data."""
  if config.loss.t2t_weight > 0 and len(config.data.t2t_sources) > 0:
    return ("i2t", "t2t")
  return ("i2t",)


def batch_shapes(config, tasks, global_batch: bool = True) -> Dict[str, jax.ShapeDtypeStruct]:
  """Shapes of the device batch (global sizes; tiny ones for tracing)."""
  b = config.batch_size if global_batch else 2
  b2 = config.t2t_batch_size if global_batch else 2
  s, l = config.data.image_size, config.model.text.max_len
  shapes = {
      "image": ((b, s, s, 3), jnp.float32), "text_ids": ((b, l), jnp.int32),
      "text_mask": ((b, l), jnp.int32), "image_text_valid": ((b,), jnp.bool_),
      "left_ids": ((b2, l), jnp.int32), "left_mask": ((b2, l), jnp.int32),
      "right_ids": ((b2, l), jnp.int32), "right_mask": ((b2, l), jnp.int32),
      "pair_valid": ((b2,), jnp.bool_),
  }
  return {k: jax.ShapeDtypeStruct(*shapes[k]) for t in tasks for k in TASK_KEYS[t]}


def _apply_losses(model, loss_config, params, batch_stats, batch, rng):
  """Forward in train mode -> ({task: weighted loss}, (new batch_stats, metrics))."""
  outputs, mutated = model.apply({"params": params, "batch_stats": batch_stats}, batch, train=True,
                                 rngs={"dropout": rng}, mutable=["batch_stats"])
  task_loss, metrics = losses.task_losses(outputs, batch, loss_config)
  return task_loss, (mutated.get("batch_stats", batch_stats), metrics)


# ---------------------------------------------------------------------------
# The update step.


def _split_micro_batches(batch, k: int, spec: P, mesh):
  """[B, ...] -> [k, B/k, ...]; micro-batch j holds rows j, j+k, ... so every
  device keeps its own rows (no data moves) and each micro-batch stays sharded."""

  def split(x):
    x = x.reshape((x.shape[0] // k, k) + x.shape[1:]).swapaxes(0, 1)
    return jax.lax.with_sharding_constraint(x, NamedSharding(mesh, P(None, *spec)))

  return jax.tree.map(split, batch)


def make_grad_fn(model, loss_config, tasks: Sequence[str], accum_steps: int, mesh, rules):
  """(params, batch_stats, batch, rng) -> ({task: grads}, batch_stats, metrics).

  Each task's gradient is jax.grad of that task's weighted loss alone. The
  two tasks read disjoint parts of the batch (image-caption rows, translation
  rows), so XLA removes the other task's branch from each gradient and merges
  the common forward: the cost is one forward and one backward per task.
  (The alternative, one jax.vjp pulled back with a cotangent per task,
  back-propagates zeros through the other branch: ~15% slower per step on
  the demo model.) With accum_steps = k the batch is split into k
  micro-batches scanned in sequence (micro-batch i uses rng fold_in(rng, i));
  gradients and metrics are averaged, batch-norm statistics updated
  micro-batch by micro-batch. Each micro-batch's softmax only has its own
  rows as negatives.
  """

  def grads_of(params, batch_stats, batch, rng):
    grads, metrics, new_stats, total = {}, {}, batch_stats, 0.0
    for task in tasks:
      def task_loss(p, task=task):
        task_losses, aux = _apply_losses(model, loss_config, p, batch_stats, batch, rng)
        return task_losses[task], aux
      (loss, (stats, task_metrics)), grads[task] = jax.value_and_grad(task_loss, has_aux=True)(params)
      total = total + loss
      metrics.update(task_metrics)
      if task == "i2t":  # Batch norm lives in the image tower: the i2t forward updates it.
        new_stats = stats
    return grads, new_stats, {**metrics, "loss": total}

  if accum_steps == 1:
    return grads_of

  def accumulated(params, batch_stats, batch, rng):
    micro = _split_micro_batches(batch, accum_steps, sharding.batch_spec(rules), mesh)

    def body(carry, xs):
      acc, stats = carry
      mb, i = xs
      g, stats, m = grads_of(params, stats, mb, jax.random.fold_in(rng, i))
      return (jax.tree.map(jnp.add, acc, g), stats), m

    zeros = {t: jax.tree.map(jnp.zeros_like, params) for t in tasks}
    (acc, batch_stats), ms = jax.lax.scan(body, (zeros, batch_stats), (micro, jnp.arange(accum_steps)))
    grads = jax.tree.map(lambda g: g / accum_steps, acc)
    return grads, batch_stats, jax.tree.map(lambda m: jnp.mean(m, axis=0), ms)

  return accumulated


def make_train_step(model, optimizer: optim.MultiTaskOptimizer, config, mesh, rules):
  """(state, batch) -> (state, metrics): per-task gradients, per-task LAMB, summed updates."""
  grad_fn = make_grad_fn(model, config.loss, optimizer.tasks, config.optim.grad_accum_steps, mesh, rules)

  def train_step(state: TrainState, batch):
    rng = jax.random.fold_in(state.rng, state.step)
    grads, batch_stats, metrics = grad_fn(state.params, state.batch_stats, batch, rng)
    updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    for task in optimizer.tasks:
      metrics[f"grad_norm/{task}"] = optax.tree.norm(grads[task])
      metrics[f"lr/{task}"] = optimizer.schedules[task](state.step)
    metrics["param_norm"] = optax.tree.norm(params)
    new_state = state.replace(step=state.step + 1, params=params, opt_state=opt_state,
                              batch_stats=batch_stats)
    return new_state, metrics

  return train_step


# ---------------------------------------------------------------------------
# Everything built from the config before any data or checkpoint is read.


@dataclasses.dataclass
class _Setup:
  mesh: Any
  rules: Any
  tasks: Tuple[str, ...]
  model: Any
  optimizer: optim.MultiTaskOptimizer
  init: Any  # rng -> TrainState (unjitted).
  abstract_state: TrainState
  state_shardings: TrainState
  data_sharding: NamedSharding


def _build(config) -> _Setup:
  # ---- Mesh ----------------------------------------------------------------
  mesh = sharding.make_mesh(config.mesh)
  rules = sharding.rules_from_config(config)
  data_sharding = sharding.batch_sharding(mesh, rules)
  shards = sharding.batch_shards(mesh, rules)
  tasks = active_tasks(config)
  for field in ("batch_size", "t2t_batch_size")[:len(tasks)]:
    per_shard, rest = divmod(config[field], shards)
    if rest or per_shard % config.optim.grad_accum_steps:
      raise config_lib.ConfigError(
          f"config.{field}: {config[field]} must split into {shards} batch shards (mesh "
          f"{dict(mesh.shape)}) of a multiple of optim.grad_accum_steps={config.optim.grad_accum_steps} rows")

  # ---- Model and optimizer ----------------------------------------------------
  model = models.build_model(config.model, init_temperature=config.loss.init_temperature,
                             learn_temperature=config.loss.learn_temperature)
  # Init sees only the active tasks' inputs: ALIGN gets no t2t head parameters.
  init_batch = {k: v for k, v in models.init_batch(config.model, config.data.image_size).items()
                if k in batch_shapes(config, tasks)}
  model_init = lambda rng: model.init({"params": rng, "dropout": rng}, init_batch, train=False)
  rng0 = jax.random.PRNGKey(config.seed)
  boxed = jax.eval_shape(model_init, rng0)
  variables = nn.unbox(boxed)
  batch_stats = variables.get("batch_stats", {})
  trainable = optim.params_read_by(
      lambda p, bs, b, r: _apply_losses(model, config.loss, p, bs, b, r)[0],
      variables["params"], batch_stats, batch_shapes(config, tasks, global_batch=False), rng0)
  optimizer = optim.build(config, tasks, trainable)

  def init(rng) -> TrainState:
    params_rng, state_rng = jax.random.split(rng)
    v = nn.unbox(model_init(params_rng))
    return TrainState(step=jnp.zeros((), jnp.int32), params=v["params"],
                      opt_state=optimizer.init(v["params"]), batch_stats=v.get("batch_stats", {}),
                      rng=state_rng)

  # ---- Shapes and shardings ---------------------------------------------------
  abstract_state = jax.eval_shape(init, rng0)
  rep = sharding.replicated(mesh)
  param_shardings = sharding.logical_shardings(boxed["params"], mesh, rules, config.shard_min_size)
  state_shardings = TrainState(
      step=rep, params=param_shardings,
      opt_state=sharding.like_params(abstract_state.opt_state, abstract_state.params,
                                     param_shardings, mesh),
      batch_stats=jax.tree.map(lambda _: rep, abstract_state.batch_stats), rng=rep)
  return _Setup(mesh, rules, tasks, model, optimizer, init, abstract_state, state_shardings,
                data_sharding)


# ---------------------------------------------------------------------------
# Checkpoints: orbax, train state + every process's input-pipeline state.


def _allgather_json(obj) -> List[Any]:
  """Every process's `obj` (JSON-able), in process order, on every process."""
  if jax.process_count() == 1:
    return [obj]
  data = np.frombuffer(json.dumps(obj).encode(), np.uint8)
  sizes = multihost_utils.process_allgather(np.array([data.size], np.int32))
  padded = np.zeros(int(np.max(sizes)), np.uint8)
  padded[:data.size] = data
  rows = multihost_utils.process_allgather(padded)
  return [json.loads(bytes(r[:int(n)]).decode()) for r, n in zip(rows, np.ravel(sizes))]


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


class Checkpoints:
  """ocp.CheckpointManager over workdir/checkpoints: items 'state' and 'data'."""

  def __init__(self, workdir: str, keep: int):
    if jax.process_count() > 1:
      _use_distributed_barriers()
    self.directory = epath.Path(workdir) / "checkpoints"
    self._manager = ocp.CheckpointManager(
        self.directory,
        options=ocp.CheckpointManagerOptions(max_to_keep=keep, create=True,
                                             enable_async_checkpointing=True))

  def latest_step(self) -> Optional[int]:
    return self._manager.latest_step()

  def save(self, step: int, state: TrainState, data_state: dict):
    """Async: returns once arrays are copied off the device; writing goes on behind."""
    processes = _allgather_json(data_state)
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


class _StopRequest:
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


# ---------------------------------------------------------------------------
# Logging: metrics.jsonl + TensorBoard + console.


class _MetricsLog:
  """Per-step device metrics held until a log step, then checked and written.

  Only log steps sync with the device; the non-finite check still covers
  every step in between, so the error names the first bad step.
  """

  def __init__(self, workdir: str, writer, config, start_step: int):
    self.path = epath.Path(workdir) / "metrics.jsonl"
    self.writer = writer
    self.config = config
    self.pending: List[Tuple[int, Dict[str, jax.Array]]] = []
    self.last: Dict[str, float] = {}
    self._mark = (start_step, time.time())
    if jax.process_index() == 0 and self.path.exists():
      # Lines past the restored step come from steps that will be redone.
      kept = [l for l in self.path.read_text().splitlines() if l and json.loads(l)["step"] <= start_step]
      self.path.write_text("".join(l + "\n" for l in kept))

  def add(self, step: int, metrics):
    self.pending.append((step, metrics))

  def check_finite(self, last_checkpoint: Optional[int]):
    """Raises TrainingError naming the first pending step with a non-finite loss."""
    if not self.pending:
      return
    for step, metrics in self.pending:
      v = float(evaluate_lib.to_host(metrics["loss"]))  # This process's replica.
      if not math.isfinite(v):
        raise TrainingError(
            f"step {step}: the training loss is {v}. Stopping; the last checkpoint is "
            f"{'step ' + str(last_checkpoint) if last_checkpoint is not None else 'none'}. "
            f"Try a lower learning rate, optim.grad_clip_norm, or model.dtype=float32.")

  def write(self, step: int, extra: Mapping[str, float]):
    """Logs step's metrics (the latest pending) with timing and `extra`."""
    _, metrics = self.pending[-1]
    scalars = {k: float(evaluate_lib.to_host(v)) for k, v in metrics.items()}
    first_step, first_time = self._mark
    now = time.time()
    steps = max(step - first_step, 1)
    step_time = (now - first_time) / steps
    scalars.update({
        "step_time_sec": step_time, "steps_per_sec": 1.0 / step_time,
        "examples_per_sec": self.config.batch_size / step_time, **extra})
    self._mark = (step, now)
    self.pending.clear()
    self.last = scalars
    eta = (self.config.total_steps - step) * step_time
    logging.info("step %d/%d  loss %.4f  %.2f steps/s  ETA %s", step, self.config.total_steps,
                 scalars["loss"], scalars["steps_per_sec"], _hms(eta))
    if jax.process_index() == 0:
      with self.path.open("a") as f:
        f.write(json.dumps({"step": step, **scalars}) + "\n")
    self.writer.write_scalars(step, {f"train/{k}": v for k, v in scalars.items()})
    return scalars


def _hms(seconds: float) -> str:
  seconds = int(seconds)
  return f"{seconds // 3600}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"


# ---------------------------------------------------------------------------
# Data: the tokenizer, the training stream, the eval sets.


# Records read per training source to learn a vocab when none is configured.
VOCAB_RECORDS_PER_SOURCE = 10_000


def _vocab_texts(config):
  """Captions and translation pairs of the configured training sources (data.vocab_sources)."""
  kinds = {
      "i2t": (config.data.i2t_sources, sources.image_text_source, synthetic.image_text_source, ("caption",)),
      "t2t": (config.data.t2t_sources, sources.text_pair_source, synthetic.text_pair_source, ("left", "right")),
  }
  for kind in config.data.vocab_sources:
    source_configs, open_source, open_synthetic, fields = kinds[kind]
    for sc in source_configs:
      if sc["name"] == "synthetic":  # Configured by config.data.synthetic (see pipeline.py).
        ds = open_synthetic(config, "train", 0, 1)
      else:
        ds = open_source(dict(sc), "train")
      for record in ds.take(VOCAB_RECORDS_PER_SOURCE).as_numpy_iterator():
        for f in fields:
          yield record[f].decode("utf-8", "replace")


def _tokenizer(config, workdir: str, learn: bool = True):
  """config.data.vocab_path, else workdir/vocab.txt (learned from the training text once)."""
  path = config.data.vocab_path
  if not path:
    path = str(epath.Path(workdir) / "vocab.txt")
    if not learn and not epath.Path(path).exists():
      raise FileNotFoundError(f"{path} does not exist: the vocab is learned by --mode=train "
                              f"(or set config.data.vocab_path)")
    if jax.process_index() == 0 and not epath.Path(path).exists():
      logging.info("Learning a %d-token wordpiece vocab into %s.", config.model.text.vocab_size, path)
      tokenizer_lib.build_vocab(list(_vocab_texts(config)), config.model.text.vocab_size, path)
    if jax.process_count() > 1:
      multihost_utils.sync_global_devices("mural_vocab")
  elif not epath.Path(path).exists():
    raise FileNotFoundError(f"config.data.vocab_path: {path} does not exist")
  tok = tokenizer_lib.Tokenizer(path, config.model.text.max_len)
  if tok.vocab_size > config.model.text.vocab_size:
    raise config_lib.ConfigError(
        f"config.model.text.vocab_size: {config.model.text.vocab_size} is smaller than the "
        f"vocab {path} ({tok.vocab_size} tokens)")
  return tok


def _input(config, workdir: str):
  tokenizer = _tokenizer(config, workdir)
  train_iter = pipeline.build_train_iterator(config, tokenizer, process_index=jax.process_index(),
                                             process_count=jax.process_count())
  return tokenizer, train_iter


def _eval_sets(config, tokenizer) -> list:
  retrieval, translation = eval_data.build_eval_sets(config, tokenizer)
  return list(retrieval) + list(translation)


def _variables(state: TrainState) -> dict:
  return {"params": state.params, "batch_stats": state.batch_stats}


# ---------------------------------------------------------------------------
# The two entry points.


def train_and_evaluate(config, workdir: str, *, train_iter: Optional[Iterator] = None,
                       eval_sets: Optional[Sequence[Any]] = None) -> Dict[str, Any]:
  """Trains config.total_steps steps (resuming from workdir), evaluating as configured.

  `train_iter` / `eval_sets` replace the configured input pipeline (tests
  that need a process-count-independent stream pass one); they must offer
  the pipeline's interface (next, get_state, set_state, skip_counts).
  Returns {'step', 'train': last logged metrics, 'eval': last eval results,
  'preempted': bool, 'state': the final TrainState}.
  """
  config_lib.validate(config)
  epath.Path(workdir).mkdir(parents=True, exist_ok=True)

  # ---- Mesh, model, optimizer, shapes, shardings (see _build) ---------------
  setup = _build(config)
  logging.info("Mesh %s over %d devices, %d processes; tasks %s.", dict(setup.mesh.shape),
               jax.device_count(), jax.process_count(), setup.tasks)

  # ---- Input pipeline -------------------------------------------------------
  tokenizer = None
  if train_iter is None:
    tokenizer, train_iter = _input(config, workdir)
  if eval_sets is None:
    eval_sets = _eval_sets(config, tokenizer or _tokenizer(config, workdir))
  logging.info("Input pipeline and %d eval sets ready.", len(eval_sets))
  keys = [k for t in setup.tasks for k in TASK_KEYS[t]]

  # ---- Update step ----------------------------------------------------------
  rep = sharding.replicated(setup.mesh)
  train_step = jax.jit(
      make_train_step(setup.model, setup.optimizer, config, setup.mesh, setup.rules),
      in_shardings=(setup.state_shardings, {k: setup.data_sharding for k in keys}),
      out_shardings=(setup.state_shardings, rep), donate_argnums=(0,))

  # ---- Restore or initialise ----------------------------------------------
  checkpoints = Checkpoints(workdir, config.keep_checkpoints)
  latest = checkpoints.latest_step()
  if latest is not None:
    state, data_state = checkpoints.restore(latest, setup.abstract_state, setup.state_shardings)
    if data_state is not None:
      train_iter.set_state(data_state)
    logging.info("Resumed from %s (step %d).", checkpoints.directory, latest)
  else:
    state = jax.jit(setup.init, out_shardings=setup.state_shardings)(jax.random.PRNGKey(config.seed))
    logging.info("Initialised %d parameters.", sum(x.size for x in jax.tree.leaves(state.params)))
  start_step = int(evaluate_lib.to_host(state.step))

  # ---- Evaluators -------------------------------------------------------------
  evaluator = evaluate_lib.Evaluator(
      setup.model, eval_sets or [], setup.mesh, setup.rules, config.eval_batch_size,
      translation_task="t2t" if "t2t" in setup.tasks else "i2t")
  writer = evaluate_lib.SummaryWriter(workdir)
  log = _MetricsLog(workdir, writer, config, start_step)
  eval_results: Dict[str, float] = {}

  def run_eval(step):
    nonlocal eval_results
    if evaluator.eval_sets:
      eval_results = evaluator.run(_variables(state))
      evaluate_lib.report(eval_results, step, workdir, writer)

  def flush(step):
    log.check_finite(checkpoints.latest_step())
    if log.pending:
      log.write(step, train_iter.skip_counts())

  # ---- Loop -----------------------------------------------------------------
  total = config.total_steps
  preempted = False
  try:
    if start_step >= total:
      logging.info("Step %d >= total_steps %d: nothing to train; evaluating.", start_step, total)
      run_eval(start_step)
    with _StopRequest() as stop_requested:
      for step in range(start_step + 1, total + 1):
        local = next(train_iter)
        batch = sharding.global_batch({k: local[k] for k in keys}, setup.data_sharding)
        state, metrics = train_step(state, batch)
        log.add(step, metrics)
        preempted = stop_requested(step)
        last = step == total or preempted
        if step % config.log_every_steps == 0 or last:
          flush(step)
        if step % config.checkpoint_every_steps == 0 or last:
          log.check_finite(checkpoints.latest_step())  # Never checkpoint a NaN state.
          checkpoints.save(step, state, train_iter.get_state())
        if preempted:
          logging.warning("Stopped at step %d on SIGTERM; checkpoint saved.", step)
          break
        if step == total or (config.eval_every_steps and step % config.eval_every_steps == 0):
          run_eval(step)
  finally:
    checkpoints.wait()  # Let an in-flight async save finish, even on an error.
    checkpoints.close()
    writer.close()
  return {"step": int(evaluate_lib.to_host(state.step)), "train": log.last, "eval": eval_results,
          "preempted": preempted, "state": state}


def evaluate(config, workdir: str, *, eval_sets: Optional[Sequence[Any]] = None) -> Dict[str, float]:
  """Evaluates the latest checkpoint in workdir; writes eval/step_<N>.json like training does."""
  config_lib.validate(config)
  setup = _build(config)
  checkpoints = Checkpoints(workdir, config.keep_checkpoints)
  latest = checkpoints.latest_step()
  if latest is None:
    raise FileNotFoundError(f"no checkpoint in {checkpoints.directory}; train first (--mode=train)")
  state, _ = checkpoints.restore(latest, setup.abstract_state, setup.state_shardings)
  checkpoints.close()
  if eval_sets is None:
    eval_sets = _eval_sets(config, _tokenizer(config, workdir, learn=False))
  if not eval_sets:
    raise ValueError("config.data.eval_source: no evaluation sets to evaluate on")
  evaluator = evaluate_lib.Evaluator(
      setup.model, eval_sets, setup.mesh, setup.rules, config.eval_batch_size,
      translation_task="t2t" if "t2t" in setup.tasks else "i2t")
  writer = evaluate_lib.SummaryWriter(workdir)
  results = evaluator.run(_variables(state))
  evaluate_lib.report(results, latest, workdir, writer)
  writer.close()
  return results
