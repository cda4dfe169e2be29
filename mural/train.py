"""The training loop: `train_and_evaluate(config, workdir)`, and `evaluate(config, workdir)`.

It knows no task and no system by name: `config.system` picks a system
(mural/systems/), whose active tasks (mural/system.py) give the batch layout,
the losses, the optimizers and the input, and whose evaluators score it.
`train_and_evaluate` reads top to bottom, one banner per stage:
  system and mesh -> model and optimizer -> shapes and shardings -> input ->
  update step -> restore or init -> evaluators -> loop.
Everything it needs from the config is built by `build` (shared with
`evaluate`), so the two modes can never disagree on shapes or shardings.

Sharding: one jax.jit over global arrays (sharding.py): each task's in-batch
softmax sees the global batch and batch-norm statistics are moments of the
global batch, on any mesh and any number of processes.

Resume: a run started in a workdir holding checkpoints continues from the
latest one (checkpointing.py): train state plus every process's input state.
Per-step randomness is `fold_in(state.rng, step)` and the input pipeline
resumes exactly, so an interrupted and resumed run ends with the same losses
and params as one that never stopped (tests/test_train.py). SIGTERM saves a
checkpoint at the next step boundary and returns.

The update step itself is mural/step.py. TensorFlow (the input pipeline, the vocab, clu's
TensorBoard writer) is imported where the loop first needs it (`lazy_import`), not with this module: `build`
and the step run without it (benchmarks, export, a GPU host that lacks it).
"""

import collections
import copy
import dataclasses
from concurrent import futures
from typing import Any, Dict, Iterator, Optional, Sequence, Tuple

import flax.linen as nn
import jax
import jax.numpy as jnp
from absl import logging
from etils import epath
from jax.sharding import NamedSharding

from mural import checkpointing
from mural import config_lib
from mural import device_memory
from mural import disk_space
from mural import evaluate as evaluate_lib
from mural import host_memory
from mural import lazy_import
from mural import metric_log
from mural import optim
from mural import sharding
from mural import step as step_lib
from mural import system as system_lib
from mural import systems
from mural import warm_start
from mural.state import TrainState

pipeline = lazy_import.module("mural.data.pipeline")  # TensorFlow: loaded when the loop reads data.
vocab = lazy_import.module("mural.data.vocab")


# ---------------------------------------------------------------------------
# The update step (mural/step.py), jitted once per Setup.


def jit_train_step(setup: "Setup"):
  """The jitted step with the state and batch shardings and the donation training uses.

  One per Setup (kept on it): a second run on the same Setup neither traces nor compiles."""
  if setup.jitted_train_step is None:
    config = setup.config
    batch_shardings = {t.name: {k: setup.data_sharding for k in t.shapes(config)} for t in setup.tasks}
    setup.jitted_train_step = jax.jit(
        step_lib.make_train_step(setup, config.optim.grad_accum_steps, config.optim.grad_accum_mode),
        in_shardings=(setup.state_shardings, batch_shardings),
        out_shardings=(setup.state_shardings, sharding.replicated(setup.mesh)), donate_argnums=(0,))
  return setup.jitted_train_step


def compile_train_step_in_background(setup: "Setup") -> futures.Future:
  """Traces and lowers jit_train_step(setup) here, then compiles it in a thread.

  The caller meanwhile learns the vocab, builds the input pipeline and initialises the state
  (work that mostly waits on Python, TensorFlow or another compile: XLA's compile, the long part,
  runs beside it). The step's first call with arrays of these layouts then finds the executable
  in jit's caches. `.result()` waits for it and re-raises its error.

  Only XLA's compile runs in the thread, never the trace: tracing executes JAX's import
  statements inside functions, and a module imported meanwhile in the caller's thread may swap
  `builtins.__import__` for the whole process (`etils.epy.lazy_imports`, as tensorflow_datasets
  does), which hands the tracing thread lazy stand-ins for JAX's own modules.
  tests/test_train.py checks that the thread runs no import statement.
  """
  config = setup.config
  state = jax.tree.map(lambda s, sh: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh),
                       setup.abstract_state, setup.state_shardings)
  batch = {t.name: {k: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=setup.data_sharding)
                    for k, s in t.shapes(config).items()} for t in setup.tasks}
  lowered = jit_train_step(setup).lower(state, batch)
  pool = futures.ThreadPoolExecutor(1, thread_name_prefix="mural-compile")
  compiled = pool.submit(lowered.compile)
  pool.shutdown(wait=False)  # Its one thread ends with the job.
  return compiled


# ---------------------------------------------------------------------------
# Everything built from the config before any data or checkpoint is read.


@dataclasses.dataclass(eq=False)
class Setup:
  """What `build` makes of a config. Its jitted functions are made once and kept on it, so
  runs given the same Setup (`train_and_evaluate(..., setup=)`: a resumed run in the same
  process, evaluation after training, a notebook) trace and compile nothing again."""
  config: Any  # A copy of the config it was built from.
  system: system_lib.System
  tasks: Tuple[system_lib.Task, ...]
  mesh: Any
  rules: Any
  model: Any
  optimizer: optim.MultiTaskOptimizer
  init: Any  # rng -> TrainState (unjitted).
  abstract_state: TrainState
  state_shardings: TrainState
  data_sharding: NamedSharding
  jitted_train_step: Any = None  # jit_train_step's.
  jitted_inits: Dict[frozenset, Any] = dataclasses.field(default_factory=dict)  # init_state's, by what a warm start fills.
  embedders: Dict[int, Any] = dataclasses.field(default_factory=dict)  # embedder's, by batch size.

  def init_state(self, rng, warm: Optional[warm_start.WarmStart] = None) -> TrainState:
    """init(rng), jitted into the state's shardings (system.init_compiler_options says how), then
    `warm`'s arrays placed. What `warm` fills is left out of the program (WarmStart.leaving_out):
    the other values are the same as without it, and an imported tower costs no initialisation."""
    filled = frozenset(warm.arrays) if warm is not None else frozenset()
    if filled not in self.jitted_inits:
      init, shardings = self.init, self.state_shardings
      if filled:
        scalar = lambda leaf: jnp.zeros((), leaf.dtype)
        init = lambda r: warm.state_leaving_out(self.init(r), scalar)
        shardings = warm.state_leaving_out(shardings, lambda _: sharding.replicated(self.mesh))
      self.jitted_inits[filled] = jax.jit(init, out_shardings=shardings,
                                          compiler_options=system_lib.init_compiler_options())
    state = self.jitted_inits[filled](rng)
    if not filled:
      return state
    like = jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
                        self.abstract_state, self.state_shardings)
    return warm.apply(state, like)

  def release_init_program(self) -> None:
    """Frees init_state's compiled programs and their traces, which a run needs once.

    Left alone they stay resident for the whole run (bench_step.py's towers: 170 MB, 4% of its
    peak RSS). A later init_state compiles the program again (or reads JAX's persistent cache)."""
    for jitted in self.jitted_inits.values():
      jitted.clear_cache()

  def embedder(self, batch_size: int) -> evaluate_lib.Embedder:
    if batch_size not in self.embedders:
      self.embedders[batch_size] = evaluate_lib.Embedder(self.model, self.mesh, self.rules, batch_size)
    return self.embedders[batch_size]



def build(config) -> Setup:
  """The system's active tasks, mesh, model, optimizer, abstract state and shardings."""
  systems.validate(config)
  config = copy.deepcopy(config)  # The Setup's own: later changes to the caller's do not reach it.
  # ---- System and mesh -------------------------------------------------------
  system = systems.get(config)
  tasks = system_lib.active_tasks(system, config)
  mesh = sharding.make_mesh(config.mesh)
  rules = sharding.rules_from_config(config)
  system_lib.check_batch_sizes(tasks, sharding.batch_shards(mesh, rules), config.optim.grad_accum_steps,
                               mesh.shape)

  # ---- Model and optimizer ----------------------------------------------------
  model = system.build_model(config, tasks)
  rng0 = jax.random.PRNGKey(config.seed)
  boxed = jax.eval_shape(lambda r: system_lib.init_variables(model, tasks, config, r), rng0)
  variables = nn.unbox(boxed)
  batch_stats = variables.get("batch_stats", {})
  trainable = optim.params_read_by(
      lambda p, bs, b, r: system_lib.task_losses(model, tasks, p, bs, b, r)[0],
      variables["params"], batch_stats, system_lib.batch_shapes(tasks, config, batch_size=2), rng0)
  optimizer = optim.build(tasks, trainable, config.optim, config.total_steps, rate_scales={
      f"{kind}_tower": config.model[kind].get("learning_rate_scale", 1.0) for kind in ("image", "text")})

  def state_of(v, state_rng) -> TrainState:
    return TrainState(step=jnp.zeros((), jnp.int32), params=v["params"],
                      opt_state=optimizer.init(v["params"]), batch_stats=v.get("batch_stats", {}),
                      rng=state_rng)

  def init(rng) -> TrainState:
    params_rng, state_rng = system_lib.init_rngs(rng)
    return state_of(nn.unbox(system_lib.init_variables(model, tasks, config, params_rng)), state_rng)

  # ---- Shapes and shardings ---------------------------------------------------
  # From the variables' shapes above: eval_shape(init) would trace the model again (with the
  # single trace in params_read_by, build() on mural_large: 14.4 -> 12.2 CPU-s).
  abstract_state = jax.eval_shape(state_of, variables, rng0)
  rep = sharding.replicated(mesh)
  param_shardings = sharding.logical_shardings(boxed["params"], mesh, rules, config.shard_min_size)
  state_shardings = TrainState(
      step=rep, params=param_shardings,
      opt_state=sharding.like_params(abstract_state.opt_state, abstract_state.params,
                                     param_shardings, mesh),
      batch_stats=jax.tree.map(lambda _: rep, abstract_state.batch_stats), rng=rep)
  return Setup(config, system, tasks, mesh, rules, model, optimizer, init, abstract_state, state_shardings,
               sharding.batch_sharding(mesh, rules))


def _setup_for(config, setup: Optional[Setup]) -> Setup:
  """`setup` if it was built from `config` (a ValueError if from another), else build(config). The
  eval data is no part of a Setup: one evaluates other eval data as well."""
  if setup is None:
    return build(config)
  without_eval = lambda c: config_lib.with_eval_data(c, dict(name=""), dict(name="")).to_json_best_effort(
      sort_keys=True)
  if without_eval(config) != without_eval(setup.config):
    raise ValueError("setup= was built from another config; build it from this one (train.build)")
  return setup


def input_pipeline(config, setup: Setup, workdir: str, sources=None):
  """(tokenizer, this process's training iterator), from `sources` if opened already
  (pipeline.open_train_sources)."""
  tokenizer = vocab.tokenizer(config, system_lib.vocabulary_tasks(setup.system, config), workdir)
  return tokenizer, pipeline.build_train_iterator(
      config, setup.tasks, tokenizer, process_index=jax.process_index(),
      process_count=jax.process_count(), sources=sources)


def _device_batch(local: Dict[str, Dict[str, Any]], shapes, data_sharding):
  """This process's {task: {key: rows}} -> global arrays of the layout's keys."""
  return {task: sharding.global_batch({k: local[task][k] for k in keys}, data_sharding)
          for task, keys in shapes.items()}


class DispatchAhead:
  """Keeps the host at most `steps` train steps ahead of the device.

  JAX returns from a step's call before the step runs. Unbounded, the loop ran on to the next
  metric flush (log_every_steps), so a stop request (SIGTERM, Ctrl-C) got its checkpoint only
  once the device had run every step queued: configs/mule_flickr8k.py stopped 8 steps and 34 s
  after a SIGTERM (2.5 min once), past a preempted VM's grace period. Four steps ahead keep the device busy
  while the host fetches and places the next batches (on 2 CPU cores, where the two share the
  cores, the demo ran 2 min 11-12 s unbounded, 2 min 13 s at four, 2 min 20-25 s at two)."""

  def __init__(self, steps: int = 4):
    self.steps, self.pending = steps, collections.deque()

  def add(self, outputs) -> None:
    self.pending.append(outputs)
    if len(self.pending) > self.steps:
      jax.block_until_ready(self.pending.popleft())


# ---------------------------------------------------------------------------
# The two entry points.


def _run_ended_at(config, checkpoints, step: Optional[int]) -> bool:
  """Whether checkpoint `step` ended the run (total_steps reached, or early stopping out of
  patience), so that resuming it trains nothing and need not compile the step."""
  if step is None:
    return False
  if step >= config.total_steps:
    return True
  es = config.early_stopping
  if not es.metric:
    return False
  try:
    record = checkpoints.metrics(step)
  except (OSError, ValueError):  # Unreadable: restore_latest deals with that step.
    return False
  stopper = checkpointing.EarlyStopping(es.metric, es.patience, es.mode)
  stopper.restore(record)
  return stopper.exhausted


def train_and_evaluate(config, workdir: str, *, train_iter: Optional[Iterator] = None,
                       evaluators: Optional[Sequence[Any]] = None,
                       setup: Optional[Setup] = None) -> Dict[str, Any]:
  """Trains config.total_steps steps (resuming from workdir), evaluating as configured.

  `train_iter` / `evaluators` replace the configured input pipeline and the
  system's evaluators (tests pass a process-count-independent stream, or no
  evaluators); train_iter must offer the pipeline's interface (next,
  get_state, set_state, skip_counts). `setup`: `build(config)` made earlier,
  whose traced and compiled step is reused (another run of the same config in
  this process). Returns {'step', 'train': last logged metrics, 'eval': last
  eval results, 'preempted': bool, 'state': the final TrainState, 'setup': the
  Setup it ran (to give the next run of this config)}.
  """
  epath.Path(workdir).mkdir(parents=True, exist_ok=True)

  # ---- System, mesh, model, optimizer, shapes, shardings (see build) ---------
  setup = _setup_for(config, setup)
  if jax.process_index() == 0:  # What made this workdir: --mode=eval|export read it back.
    try:
      changed = systems.record_changes(config, workdir)
    except config_lib.ConfigError as e:  # Replaced below.
      changed = None
      logging.warning("The workdir's earlier config record is unreadable (%s).", e)
    if changed:
      logging.warning("The config differs from the one %s recorded, in: %s.", workdir, ", ".join(changed))
    config_lib.write_record(config, workdir)
  logging.info("System %r: tasks %s; mesh %s over %d devices, %d processes.", setup.system.name,
               [t.name for t in setup.tasks], dict(setup.mesh.shape), jax.device_count(),
               jax.process_count())

  # ---- Update step: compiled in a thread while the input and the state are made ----
  es = config.early_stopping
  stopper = checkpointing.EarlyStopping(es.metric, es.patience, es.mode) if es.metric else None
  checkpoints = checkpointing.Checkpoints(workdir, config.keep_checkpoints, track_best=stopper is not None)
  ended = _run_ended_at(config, checkpoints, checkpoints.latest_step())
  # A warm start's source and the data sources are read and checked first: a bad one fails in
  # seconds, before the step is traced and compiled.
  warm = None
  if config.init_from and checkpoints.latest_step() is None:
    warm = warm_start.match(setup.abstract_state, config, vocab.wordpiece_path(config, workdir))
  sources = None if train_iter is not None else pipeline.open_train_sources(
      config, setup.tasks, process_index=jax.process_index(), process_count=jax.process_count())
  compiling = None if ended else compile_train_step_in_background(setup)
  train_step = jit_train_step(setup)

  # ---- Input pipeline -------------------------------------------------------
  tokenizer = None
  if train_iter is None:
    tokenizer, train_iter = input_pipeline(config, setup, workdir, sources)
  if evaluators is None:
    tokenizer = tokenizer or vocab.tokenizer(
        config, system_lib.vocabulary_tasks(setup.system, config), workdir)
    evaluators = evaluate_lib.evaluators_for(setup.system, config, setup.tasks, tokenizer)
  shapes = {t.name: tuple(t.shapes(config)) for t in setup.tasks}

  # ---- Restore or initialise ----------------------------------------------
  latest, state, data_state = checkpoints.restore_latest(setup.abstract_state, setup.state_shardings)
  if latest is not None:
    if data_state is not None:
      train_iter.set_state(data_state)
    if stopper is not None:  # Counts on from the checkpoint's record.
      stopper.restore(checkpoints.metrics(latest))
    logging.info("Resumed from %s (step %d).", checkpoints.directory, latest)
  else:
    state = setup.init_state(jax.random.PRNGKey(config.seed), warm)
    setup.release_init_program()
    logging.info("Initialised %d parameters.", sum(x.size for x in jax.tree.leaves(state.params)))
  start_step = int(sharding.to_host(state.step))

  # ---- Evaluators and logs ------------------------------------------------------
  embedder = setup.embedder(config.eval_batch_size)
  writer = metric_log.writer(workdir)
  writer.write_hparams(metric_log.hparams(config))  # TensorBoard's HParams tab compares runs.
  log = metric_log.MetricsLog(workdir, writer, config.total_steps,
                              sum(t.batch_size for t in setup.tasks), start_step)
  eval_results: Dict[str, float] = {}

  def run_eval(step):
    nonlocal eval_results
    if evaluators:
      eval_results = evaluate_lib.run_all(evaluators, embedder, state.variables())
      evaluate_lib.report(eval_results, step, evaluate_lib.training_directory(workdir), writer)

  def flush(step):
    log.check_finite(checkpoints.latest_step())
    if log.pending:
      log.write(step, train_iter.skip_counts())

  # ---- Loop -----------------------------------------------------------------
  trace = metric_log.StepTrace(config.profile, workdir)
  if compiling is not None:
    device_memory.check_fits(compiling.result(), device_memory.constant_bytes(config, setup.model))
  host_memory.release_freed_memory()  # The compile's freed heap (~1 GiB at bench_step's size).
  total = config.total_steps
  preempted = trained = False
  early_stopped = stopper is not None and stopper.exhausted
  try:
    if start_step >= total or early_stopped:
      logging.info("Step %d%s: nothing to train; evaluating.", start_step,
                   " (stopped early)" if early_stopped else f" >= total_steps {total}")
      run_eval(start_step)
    with checkpointing.StopRequest() as stop_requested:
      ahead = DispatchAhead()
      for step in range(start_step + 1, total + 1 if not early_stopped else 0):
        batch = _device_batch(next(train_iter), shapes, setup.data_sharding)
        trace.before(step)
        state, metrics = train_step(state, batch)
        ahead.add(metrics)
        trace.after(step, metrics)
        log.add(step, metrics)
        preempted = stop_requested(step)
        evaluating = not preempted and (
            step == total or bool(config.eval_every_steps and step % config.eval_every_steps == 0))
        scored = evaluating and stopper is not None and bool(evaluators)
        if scored:  # Early stopping: evaluate first, its score goes with this step's checkpoint.
          run_eval(step)
          early_stopped = stopper.update(step, eval_results)
        last = step == total or preempted or early_stopped
        if step % config.log_every_steps == 0 or last:
          flush(step)
        if step % config.checkpoint_every_steps == 0 or last or scored:
          log.check_finite(checkpoints.latest_step())  # Never checkpoint a NaN state.
          checkpoints.save(step, state, train_iter.get_state(), stopper and stopper.metrics())
        if preempted:
          checkpoints.wait()  # "Saved" means on disk: a Ctrl-C after this line loses nothing.
          logging.warning("Stopped at step %d on %s; checkpoint saved (the same command resumes).",
                          step, stop_requested.reason)
          break
        if evaluating and not scored:
          run_eval(step)
        if early_stopped:
          logging.info("Stopped early at step %d: %s did not improve in %d evaluations; the best, step "
                       "%d, is kept (checkpoints.best_step).", step, stopper.metric, stopper.patience,
                       stopper.best_step)
          break
    trained = True
  except disk_space.DiskFull as e:  # Metrics or eval files: say what the same command resumes from.
    if e.resume:
      raise
    raise e.resuming(checkpoints.resume_note()) from e.__cause__
  finally:
    trace.stop()  # A run that ends inside the traced steps still writes their trace.
    try:
      checkpoints.wait()  # Let an in-flight async save finish, even on an error.
    except disk_space.DiskFull:
      if trained:  # Else the run's own error is on its way, and is the one to report.
        raise
    finally:
      checkpoints.close()
      try:
        writer.close()
      except disk_space.DiskFull:
        if trained:
          raise
  return {"step": int(sharding.to_host(state.step)), "train": log.last, "eval": eval_results,
          "early_stopped": early_stopped, "best_step": stopper.best_step if stopper else None,
          "preempted": preempted, "state": state, "setup": setup}


def evaluate(config, workdir: str, *, step: Optional[int] = None,
             evaluators: Optional[Sequence[Any]] = None, setup: Optional[Setup] = None) -> Dict[str, float]:
  """Evaluates checkpoint `step` of workdir (default: the best step an early-stopping run
  recorded, else the newest); writes eval/step_<N>.json like training does, or, for a config
  other than the one the workdir records, in a directory of its own (evaluate.directory_for).
  `setup` as in train_and_evaluate."""
  setup = _setup_for(config, setup)
  checkpoints = checkpointing.Checkpoints(workdir, config.keep_checkpoints,
                                          track_best=bool(config.early_stopping.metric))
  if step is None:
    step = checkpoints.best_step()
  latest, state, _ = checkpoints.restore_latest(setup.abstract_state, setup.state_shardings,
                                                move_aside=False,  # Eval leaves the workdir as is.
                                                newest=step)
  if latest is None:
    raise FileNotFoundError(f"no checkpoint in {checkpoints.directory}; train first (--mode=train)")
  checkpoints.close()
  if evaluators is None:
    tokenizer = vocab.tokenizer(config, system_lib.vocabulary_tasks(setup.system, config), workdir,
                                 learn_missing=False)
    evaluators = evaluate_lib.evaluators_for(setup.system, config, setup.tasks, tokenizer)
  if not evaluators:
    raise ValueError("config.data.eval_source: no evaluation sets to evaluate on")
  embedder = setup.embedder(config.eval_batch_size)
  directory = evaluate_lib.directory_for(config, workdir, systems.record_changes(config, workdir))
  writer = metric_log.writer(workdir if directory == evaluate_lib.training_directory(workdir) else directory)
  results = evaluate_lib.run_all(evaluators, embedder, state.variables())
  evaluate_lib.report(results, latest, directory, writer)
  writer.close()
  return results
