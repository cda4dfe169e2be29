"""Tasks and systems as values: what the trainer, optimizer, pipeline and evaluator loop over.

A *task* is one objective: its name (its config section `config.tasks.<name>`),
the record kind it reads (mural/data/inputs.py: the batch layout and how its
records are checked and batched), its sources, its global batch size, a
forward (bound model, its batch, train) -> outputs, a pure loss (outputs,
batch) -> (loss, metrics), its weight, its peak learning rate (each task has
its own optimizer state and schedule, mural/optim.py), and whether the batch
statistics its forward computes are kept.

A *system* is a model (towers + named heads), its tasks, its evaluators, and
optionally a per-step task chooser (one task trained per step, drawn inside
the one compiled step). Systems live in mural/systems/ (their config
defaults in mural/systems/defaults/), in one table (mural/systems/__init__.py)
chosen by `config.system`.

Nothing here names a task or a system: the functions below turn a system and
a config into what the trainer needs (active tasks, batch shapes, init, the
per-task losses).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Dict, Mapping, Optional, Sequence, Tuple

import jax
import jax.numpy as jnp

from mural import config_lib

Outputs = Dict[str, "jax.Array"]


@dataclasses.dataclass(frozen=True)
class Task:
  """One objective (see the module docstring)."""
  name: str
  input: Any  # mural.data.inputs.RecordKind.
  forward: Callable[[Any, Mapping[str, jax.Array], bool], Outputs]  # (bound model, batch, train).
  loss: Callable[[Outputs, Mapping[str, jax.Array]], Tuple[jax.Array, Outputs]]  # Unweighted.
  heads: Tuple[str, ...] = ()  # Heads its forward reads (the model creates them).
  weight: float = 1.0
  learning_rate: float = 0.0
  batch_size: int = 0  # Global.
  sources: Tuple[Mapping[str, Any], ...] = ()
  updates_batch_stats: bool = True
  # True: each batch comes whole from one of the sources (drawn by source weight per batch), e.g.
  # one source per language for batches of one language; False: sources mixed per record.
  one_source_per_batch: bool = False
  draw_weight: float = 1.0  # Relative chance that `draw_by_weight` (a task chooser) picks this task.

  def shapes(self, config, batch_size: Optional[int] = None) -> Dict[str, jax.ShapeDtypeStruct]:
    """The device batch of this task (the host-only 'lang' key excluded)."""
    shapes = self.input.shapes(self.batch_size if batch_size is None else batch_size, config)
    return {k: v for k, v in shapes.items() if k != "lang"}


def task_from_config(config, name: str, **fields) -> Task:
  """A Task with weight, learning_rate, batch_size and sources from config.tasks.<name>."""
  section = config.tasks[name]
  return Task(name=name, weight=float(section.weight), learning_rate=float(section.learning_rate),
              batch_size=int(section.batch_size), sources=tuple(dict(s) for s in section.sources),
              **fields)


@dataclasses.dataclass(frozen=True)
class System:
  """A model, its tasks and evaluators (see the module docstring)."""
  name: str
  get_config: Callable[[], Any]  # base_config() + this system's defaults (tasks sections, heads).
  tasks: Callable[[Any], Sequence[Task]]  # config -> every task of the system, configured.
  build_model: Callable[[Any, Sequence[Task]], Any]  # (config, active tasks) -> unbound model.
  evaluators: Callable[[Any, Sequence[Task], Any], Sequence[Any]]  # (config, tasks, tokenizer).
  # (rng, active tasks) -> int32 index of the one task this step trains; None: all of them.
  choose_task: Optional[Callable[[jax.Array, Sequence[Task]], jax.Array]] = None
  # (config, active tasks) -> {'image': head, 'text': head}: the heads its image-text retrieval
  # evaluator embeds with ('' : the tower output); export and search embed with these.
  # None: the system cannot be exported (mural/export.py says so).
  retrieval_heads: Optional[Callable[[Any, Sequence[Task]], Mapping[str, str]]] = None
  # Config fields naming files that build_model reads only to initialise parameters (FastText
  # vectors): a trained model's parameters replace what they gave, so an export clears them.
  initialisers: Tuple[str, ...] = ()
  # config -> {config field: variables, {'params', 'batch_stats'}}: what build_model reads from
  # another run beside the towers' own (models.FROZEN_INPUTS), for an export to carry.
  frozen_inputs: Optional[Callable[[Any], Mapping[str, Any]]] = None


def towers_embed(config, active) -> Mapping[str, str]:
  """System.retrieval_heads of a model whose towers give the shared-space embeddings (no heads:
  MULE, Kádár et al.)."""
  del config, active
  return {"image": "", "text": ""}


def draw_by_weight(rng, tasks: Sequence[Task]):
  """A per-step task chooser (System.choose_task): task i with probability draw_weight_i / sum."""
  weights = jnp.asarray([t.draw_weight for t in tasks], jnp.float32)
  return jax.random.categorical(rng, jnp.log(weights)).astype(jnp.int32)


def active_tasks(system: System, config) -> Tuple[Task, ...]:
  """The tasks that run: weight > 0 and at least one source (ALIGN = MURAL with t2t off)."""
  tasks = tuple(t for t in system.tasks(config) if t.weight > 0 and t.sources)
  if not tasks:
    raise config_lib.ConfigError(
        f"config.tasks: no task of system {system.name!r} has weight > 0 and sources")
  names = [t.name for t in tasks]
  if len(set(names)) != len(names):
    raise ValueError(f"system {system.name!r}: task names {names} repeat")
  return tasks


def vocabulary_tasks(system: System, config) -> Tuple[Task, ...]:
  """The tasks whose training text a vocabulary is learned from: the active ones, then the
  system's other tasks with sources (weight 0). A wordpiece vocabulary reads only the active ones;
  a per-language word vocabulary reads all, so that a pre-training phase's words (SMALR's latent
  phase, MULE's LP), which the later phase reuses, hold the caption languages too."""
  tasks = active_tasks(system, config)
  names = {t.name for t in tasks}
  return tasks + tuple(t for t in system.tasks(config) if t.sources and t.name not in names)


def check_batch_sizes(tasks: Sequence[Task], shards: int, accum_steps: int, mesh_shape) -> None:
  """Every task's batch splits into `shards` pieces of a multiple of accum_steps rows."""
  for t in tasks:
    per_shard, rest = divmod(t.batch_size, shards)
    if rest or per_shard % accum_steps:
      raise config_lib.ConfigError(
          f"config.tasks.{t.name}.batch_size: {t.batch_size} must split into {shards} batch shards "
          f"(mesh {dict(mesh_shape)}) of a multiple of optim.grad_accum_steps={accum_steps} rows")


def batch_shapes(tasks: Sequence[Task], config, batch_size: Optional[int] = None):
  """{task: {key: ShapeDtypeStruct}}: the device batch of a step (global sizes by default)."""
  return {t.name: t.shapes(config, batch_size) for t in tasks}


def init_variables(model, tasks: Sequence[Task], config, rng):
  """Model variables holding exactly what the tasks' forwards read (their heads, no others)."""
  batch = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), batch_shapes(tasks, config, batch_size=1))
  return model.init({"params": rng, "dropout": rng}, batch, method=_forward_all(tasks, train=False))


def init_rngs(rng) -> Tuple[jax.Array, jax.Array]:
  """(the key the variables are initialised from, the train state's own key) of a run seeded
  with `rng`: one rule, so that an export before any step holds the variables a run starts from."""
  variables_rng, state_rng = jax.random.split(rng)
  return variables_rng, state_rng


def init_compiler_options() -> Optional[Dict[str, Any]]:
  """XLA options for a program that initialises variables: on the CPU its LLVM code is compiled
  unoptimised. Such a program runs once, and optimising its hundreds of inlined random-number
  kernels costs more than it saves (the demo on an AVX2 EPYC: compile 18 s -> 6 s). Values may
  differ from an optimised program's in the last bit, so every initialisation uses these."""
  return {"xla_backend_optimization_level": 0} if jax.default_backend() == "cpu" else None


def _forward_all(tasks: Sequence[Task], train: bool):
  """One model method running every task's forward, in task order (one dropout stream)."""
  def forward(module, batch):
    return {t.name: t.forward(module, batch[t.name], train) for t in tasks}
  return forward


def task_outputs(model, tasks: Sequence[Task], params, batch_stats, batch, rng):
  """Train-mode forward of `tasks` -> ({task: outputs}, batch_stats).

  One apply runs every task's forward (so XLA shares what they share). Batch
  statistics come back updated when any of the tasks keeps them.
  """
  outputs, mutated = model.apply(
      {"params": params, "batch_stats": batch_stats}, batch, rngs={"dropout": rng},
      mutable=["batch_stats"], method=_forward_all(tasks, train=True))
  keep_stats = any(t.updates_batch_stats for t in tasks)
  return outputs, (mutated.get("batch_stats", batch_stats) if keep_stats else batch_stats)


def weighted_losses(tasks: Sequence[Task], outputs, batch):
  """({task: outputs}, batch) -> ({task: weight * loss}, metrics); each loss kept separate so
  the trainer can differentiate it alone."""
  losses, metrics = {}, {}
  for t in tasks:
    loss, task_metrics = t.loss(outputs[t.name], batch[t.name])
    clash = set(task_metrics) & set(metrics)
    if clash:
      raise ValueError(f"task {t.name!r}: metric names {sorted(clash)} are already used by another task")
    losses[t.name] = t.weight * loss
    metrics.update(task_metrics)
  return losses, metrics


def task_losses(model, tasks: Sequence[Task], params, batch_stats, batch, rng):
  """Train-mode forward and losses of `tasks` -> ({task: weight * loss}, (batch_stats, metrics))."""
  outputs, new_stats = task_outputs(model, tasks, params, batch_stats, batch, rng)
  losses, metrics = weighted_losses(tasks, outputs, batch)
  return losses, (new_stats, metrics)
