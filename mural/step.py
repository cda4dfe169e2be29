"""The update step: (state, batch) -> (state, metrics), for any system's tasks.

Each task's gradient is taken on its own weighted loss and goes through its own optimizer
(optim.MultiTaskOptimizer), the updates summed; `optim.grad_accum_steps` > 1 accumulates over
micro-batches (GradCache by default, so a contrastive loss keeps the global batch's
negatives); a system's task chooser runs one task per step. Nothing here names a task or a
system: they come in as values (mural/system.py), with the model, the optimizer and the mesh
of a `train.Setup`. train.py jits the step with the state's shardings and runs the loop.
"""

import functools
from typing import Sequence

import jax
import jax.numpy as jnp
import optax
from jax.sharding import NamedSharding, PartitionSpec as P

from mural import config_lib
from mural import sharding
from mural import system as system_lib
from mural.state import TrainState

# Salt of the per-step key that a system's task chooser draws from.
_CHOOSER_SALT = 0x6d75


def _split_micro_batches(batch, k: int, spec: P, mesh):
  """[B, ...] -> [k, B/k, ...]; micro-batch j holds rows j, j+k, ... so every
  device keeps its own rows (no data moves) and each micro-batch stays sharded."""

  def split(x):
    x = x.reshape((x.shape[0] // k, k) + x.shape[1:]).swapaxes(0, 1)
    return jax.lax.with_sharding_constraint(x, NamedSharding(mesh, P(None, *spec)))

  return jax.tree.map(split, batch)


def _merge_micro_batches(x, spec: P, mesh):
  """Inverse of _split_micro_batches for one array: [k, b, ...] -> [k * b, ...], original row order."""
  x = x.swapaxes(0, 1).reshape((x.shape[0] * x.shape[1],) + x.shape[2:])
  return jax.lax.with_sharding_constraint(x, NamedSharding(mesh, spec))


# How optim.grad_accum_steps = k > 1 accumulates (config_lib.GRAD_ACCUM_MODES):
#   cached: GradCache (Gao et al. 2021): embed the k micro-batches without gradients, compute
#           every task's loss on the whole batch's outputs (global-batch negatives: the same
#           loss as k = 1), then re-run each micro-batch's forward with gradients against the
#           cached outputs' cotangents. One extra forward; activations of one micro-batch.
#   independent: each micro-batch is its own loss (its own in-batch negatives); gradients
#           averaged. Cheaper, but a contrastive loss sees batch_size / k negatives.


def make_grad_fn(model, tasks: Sequence[system_lib.Task], accum_steps: int, mesh, rules,
                 accum_mode: str = "cached"):
  """(params, batch_stats, batch, rng[, chosen]) -> ({task: grads}, batch_stats, metrics).

  Each task's gradient is jax.grad of that task's weighted loss alone. Tasks
  read disjoint parts of the batch, so XLA removes the other tasks' branches
  from each gradient and merges the common forward: the cost is one forward
  and one backward per task. (One jax.vjp pulled back with a cotangent per
  task back-propagates zeros through the other branches: ~15% slower per
  step on the demo model.) `chosen` (int32, from a system's task chooser):
  only that task's forward and gradient run, inside a lax.switch; the others
  get zero gradients.

  With accum_steps = k the batch is split into k micro-batches of rows j, j+k, ...
  (micro-batch j uses rng fold_in(rng, j); batch-norm statistics are moments of
  one micro-batch and are updated micro-batch by micro-batch), accumulated as
  `accum_mode` says (the modes above).
  """
  spec = sharding.batch_spec(rules)

  def whole_batch(run, params, batch_stats, batch, rng):
    """Gradients of the tasks in `run` (a subset of `tasks`), zeros for the rest."""
    grads, metrics, new_stats, total = {}, {}, batch_stats, 0.0
    for task in tasks:
      if task not in run:
        grads[task.name] = jax.tree.map(jnp.zeros_like, params)
        continue
      def task_loss(p, name=task.name):
        losses, aux = system_lib.task_losses(model, run, p, batch_stats, batch, rng)
        return losses[name], aux
      # Traced under the mesh, forward and backward: a loss may run blockwise over the devices
      # (mural/ring_loss.py), a gradient loop must split evenly (conv_ops._batch_chunk).
      with jax.sharding.use_abstract_mesh(mesh.abstract_mesh):
        (loss, (new_stats, task_metrics)), grads[task.name] = jax.value_and_grad(task_loss, has_aux=True)(params)
      total = total + loss
      metrics.update(task_metrics)
    return grads, new_stats, {**metrics, "loss": total}

  def cached(run, params, batch_stats, batch, rng):
    """GradCache: whole_batch's gradients (up to batch-norm moments and dropout draws), in
    micro-batches."""
    micro = _split_micro_batches(batch, accum_steps, spec, mesh)
    steps = jnp.arange(accum_steps)

    def outputs_of(p, stats, mb, i):
      with jax.sharding.use_abstract_mesh(mesh.abstract_mesh):
        return system_lib.task_outputs(model, run, p, stats, mb, jax.random.fold_in(rng, i))

    def embed(stats, xs):
      outputs, stats = outputs_of(params, stats, *xs)
      return stats, outputs

    new_stats, stacked = jax.lax.scan(embed, batch_stats, (micro, steps))  # Leaves [k, ...].
    # Outputs with a row per example are joined into the whole batch; the others (a
    # temperature) depend on the parameters alone and are the same in every micro-batch.
    whole = jax.eval_shape(lambda: system_lib.task_outputs(model, run, params, batch_stats, batch, rng)[0])
    per_row = jax.tree.map(lambda s, w: _rows_or_shared(s.shape[1:], w.shape), stacked, whole)
    outputs = jax.tree.map(lambda x, rows: _merge_micro_batches(x, spec, mesh) if rows else x[0],
                           stacked, per_row)

    def loss_of(name):
      def loss(outs):
        with jax.sharding.use_abstract_mesh(mesh.abstract_mesh):
          losses, metrics = system_lib.weighted_losses(run, outs, batch)
        return losses[name], (losses, metrics)
      return loss

    cotangents = {}
    for task in run:
      d_outputs, (losses, metrics) = jax.grad(loss_of(task.name), has_aux=True)(outputs)
      # A shared output's cotangent is split evenly over the k forwards that each produce it.
      cotangents[task.name] = jax.tree.map(
          lambda c, rows: _split_micro_batches(c, accum_steps, spec, mesh) if rows
          else jnp.broadcast_to(c / accum_steps, (accum_steps,) + c.shape), d_outputs[task.name],
          per_row[task.name])
    total = sum(losses.values())

    def backward(acc, xs):
      mb, cot, i = xs
      new = {}
      for task in tasks:
        if task not in run:
          new[task.name] = acc[task.name]
          continue
        def surrogate(p, name=task.name):
          outs = outputs_of(p, batch_stats, mb, i)[0][name]
          return sum(jnp.sum(o.astype(jnp.float32) * c.astype(jnp.float32))
                     for o, c in zip(jax.tree.leaves(outs), jax.tree.leaves(cot[name])))
        new[task.name] = jax.tree.map(jnp.add, acc[task.name], jax.grad(surrogate)(params))
      return new, None

    zeros = {t.name: jax.tree.map(jnp.zeros_like, params) for t in tasks}
    grads, _ = jax.lax.scan(backward, zeros, (micro, cotangents, steps))
    return grads, new_stats, {**metrics, "loss": total}

  def grads_of(grads_for, params, batch_stats, batch, rng, chosen=None):
    if chosen is None:
      return grads_for(tasks, params, batch_stats, batch, rng)
    # One task per step: every branch returns every task's metrics (zeros when not run). Their
    # shapes from the forwards and losses alone (no gradient traced for them).
    def forward_metrics():
      losses, (_, metrics) = system_lib.task_losses(model, tasks, params, batch_stats, batch, rng)
      return {**metrics, "loss": sum(losses.values())}
    shapes = jax.eval_shape(forward_metrics)

    def branch(task):
      def run(params, batch_stats, batch, rng):
        grads, stats, metrics = grads_for((task,), params, batch_stats, batch, rng)
        return grads, stats, {k: metrics.get(k, jnp.zeros(s.shape, s.dtype)) for k, s in shapes.items()}
      return run

    return jax.lax.switch(chosen, [branch(t) for t in tasks], params, batch_stats, batch, rng)

  if accum_steps == 1:
    return functools.partial(grads_of, whole_batch)
  if accum_mode == "cached":
    return functools.partial(grads_of, cached)
  if accum_mode != "independent":
    raise ValueError(f"accum_mode {accum_mode!r} not in {config_lib.GRAD_ACCUM_MODES}")

  def independent(params, batch_stats, batch, rng, chosen=None):
    micro = _split_micro_batches(batch, accum_steps, spec, mesh)

    def body(carry, xs):
      acc, stats = carry
      mb, i = xs
      g, stats, m = grads_of(whole_batch, params, stats, mb, jax.random.fold_in(rng, i), chosen)
      return (jax.tree.map(jnp.add, acc, g), stats), m

    zeros = {t.name: jax.tree.map(jnp.zeros_like, params) for t in tasks}
    (acc, batch_stats), ms = jax.lax.scan(body, (zeros, batch_stats), (micro, jnp.arange(accum_steps)))
    grads = jax.tree.map(lambda g: g / accum_steps, acc)
    return grads, batch_stats, jax.tree.map(lambda m: jnp.mean(m, axis=0), ms)

  return independent


def _rows_or_shared(micro_shape, whole_shape) -> bool:
  """True: an output with a row per example ([b, ...] in a micro-batch, [k b, ...] whole)."""
  if tuple(micro_shape) == tuple(whole_shape):
    return False
  if micro_shape and whole_shape and micro_shape[1:] == whole_shape[1:]:
    return True
  raise ValueError(f"a task output of shape {micro_shape} per micro-batch and {whole_shape} for the "
                   "whole batch is neither per example nor shared: grad_accum_mode='cached' cannot join it")


def make_train_step(setup, accum_steps: int, accum_mode: str = "cached"):
  """(state, batch) -> (state, metrics): per-task gradients, per-task LAMB, summed updates.
  setup: a train.Setup (its tasks, system, model, optimizer, mesh and rules)."""
  tasks, choose = setup.tasks, setup.system.choose_task
  grad_fn = make_grad_fn(setup.model, tasks, accum_steps, setup.mesh, setup.rules, accum_mode)
  optimizer = setup.optimizer

  def train_step(state: TrainState, batch):
    rng = jax.random.fold_in(state.rng, state.step)
    chosen = active = None
    if choose is not None:
      chosen = jnp.asarray(choose(jax.random.fold_in(rng, _CHOOSER_SALT), tasks), jnp.int32)
      active = jnp.arange(len(tasks)) == chosen
    grads, batch_stats, metrics = grad_fn(state.params, state.batch_stats, batch, rng, chosen)
    updates, opt_state = optimizer.update(grads, state.opt_state, state.params, active)
    params = optax.apply_updates(state.params, updates)
    for task in tasks:
      metrics[f"grad_norm/{task.name}"] = optax.tree.norm(grads[task.name])
      metrics[f"lr/{task.name}"] = optimizer.schedules[task.name](state.step)
    if chosen is not None:
      metrics["task_index"] = chosen
    metrics["param_norm"] = optax.tree.norm(params)
    new_state = state.replace(step=state.step + 1, params=params, opt_state=opt_state,
                              batch_stats=batch_stats)
    return new_state, metrics

  return train_step
