"""The optimizer: one LAMB per task, each with its own learning rate.

MURAL trains the image-text task at 1e-3 and the text-text task at 1e-4 while
both share the text encoder (paper 3.2). A single optimizer over the weighted
loss sum cannot express that: LAMB normalises each layer's update, so scaling
one task's loss does not scale its step. The design here, for any system:

  * the train step differentiates each task's loss term separately (one
    jax.grad per task; step.make_grad_fn);
  * each task's gradient goes through its own LAMB (`lamb`: optax's LAMB
    chain), with its own Adam moments and its own warm-up/decay schedule
    peaking at that task's rate (`Task.learning_rate`);
  * the updates are summed and applied once.

Each task's LAMB only sees the parameters its loss reads (`params_read_by`
traces the loss and walks its jaxpr): MURAL's text-text optimizer never
touches the image tower and the image-text one never touches the t2t head.
Without that mask a zero gradient still gets weight decay, and LAMB's trust
ratio (||param|| / ||update||) blows that decay up to a full-size step that
shrinks the untouched tower by `lr` every step. The mask also keeps Adam
moments of the image tower out of the text-text state.

A task that does not run (weight 0, no sources) has no optimizer: MURAL
without its t2t task is ALIGN. With a task's learning rate 0 its schedule is
0 everywhere and its update exactly zero (tests/test_optim.py,
tests/test_train.py). With a per-step task chooser, only the chosen task's
optimizer steps (`update(..., active=)`); the others keep their state.

Weight decay (1e-5, applied inside LAMB before the trust ratio) skips biases
and norm scales/offsets (by their Flax names 'bias'/'scale', since attention
biases are 2-D) and every parameter of rank < 2 (the log-temperature); those
tensors also skip LAMB's trust ratio (see `lamb`).
"""

import dataclasses
from typing import Any, Callable, Dict, Mapping, Optional, Sequence

import jax
import jax.numpy as jnp
import optax
from jax.extend import core as jex_core

# Primitives through which no gradient flows: a parameter read only through
# them is not trained by that loss (e.g. a frozen temperature).
_NO_GRADIENT_PRIMITIVES = ("stop_gradient",)


def learning_rate_schedule(peak: float, warmup_steps: int, total_steps: int,
                           decay: bool = True) -> optax.Schedule:
  """Linear 0 -> peak over warmup_steps, then linear peak -> 0 at total_steps (decay=False: the
  peak from warmup_steps on, a constant rate such as Kádár et al.'s code trains with)."""
  warmup = optax.linear_schedule(0.0, peak, max(warmup_steps, 1))
  after = (optax.linear_schedule(peak, 0.0, max(total_steps - warmup_steps, 1)) if decay
           else optax.constant_schedule(peak))
  return optax.join_schedules([warmup, after], [warmup_steps])


# Flax names of bias and norm parameters: never decayed, whatever their rank
# (attention q/k/v biases are [heads, kv]).
_NO_DECAY_NAMES = ("bias", "scale")


def weight_decay_mask(params: Any) -> Any:
  """True for kernels and tables; False for biases, norm scales/offsets and scalars."""

  def decayed(path, p):
    name = getattr(path[-1], "key", getattr(path[-1], "name", None)) if path else None
    return jnp.ndim(p) > 1 and name not in _NO_DECAY_NAMES

  return jax.tree_util.tree_map_with_path(decayed, params)


def params_read_by(fn: Callable[..., Mapping[str, jax.Array]], params: Any, *args) -> Dict[str, Any]:
  """For each output of `fn(params, *args)`, a bool tree: which params it depends on.

  Arguments may be ShapeDtypeStructs: the function is only traced, nothing
  is computed. The walk over the jaxpr is conservative for nested calls (an
  equation whose result is needed needs all its inputs), except that
  stop_gradient cuts the path: what gets no gradient is not trained.
  """
  closed, out_shapes = jax.make_jaxpr(fn, return_shape=True)(params, *args)  # One trace.
  jaxpr, out_tree = closed.jaxpr, jax.tree.structure(out_shapes)
  outs = jax.tree.unflatten(out_tree, jaxpr.outvars)
  param_tree = jax.tree.structure(params)
  param_vars = jaxpr.invars[:param_tree.num_leaves]
  masks = {}
  for name, out in outs.items():
    needed = set() if isinstance(out, jex_core.Literal) else {out}
    for eqn in reversed(jaxpr.eqns):
      if eqn.primitive.name in _NO_GRADIENT_PRIMITIVES:
        continue
      if any(v in needed for v in eqn.outvars):
        needed.update(v for v in eqn.invars if not isinstance(v, jex_core.Literal))
    masks[name] = jax.tree.unflatten(param_tree, [v in needed for v in param_vars])
  return masks


def scale_by_trust_ratio() -> optax.GradientTransformation:
  """optax.scale_by_trust_ratio(): each update times ||param|| / ||update|| (1 where either is 0).

  The same values, computed on all tensors at once: one sum of squares per tensor, then the
  square roots, ratios and zero tests on a vector of them. optax's version computes each norm
  twice (safe_norm) and gives each tensor's scalar ops their own small kernels: 416 of the
  2,878 XLA kernels of the demo's step, each of which costs compile time on the CPU
  (benchmarks/bench_step.py)."""

  def update_fn(updates, state, params=None):
    if params is None:
      raise ValueError("scale_by_trust_ratio needs the params: update(updates, state, params)")
    leaves, treedef = jax.tree.flatten(updates)
    if not leaves:
      return updates, state
    sum_sq = lambda x: jnp.sum(jnp.square(x.astype(jnp.float32)))
    param_norm = jnp.sqrt(jnp.stack([sum_sq(p) for p in treedef.flatten_up_to(params)]))
    update_norm = jnp.sqrt(jnp.stack([sum_sq(u) for u in leaves]))
    ratio = jnp.where((param_norm == 0) | (update_norm == 0), 1.0, param_norm / update_norm)
    return treedef.unflatten([u * ratio[i].astype(u.dtype) for i, u in enumerate(leaves)]), state

  return optax.GradientTransformation(optax.init_empty_state, update_fn)


def lamb(learning_rate, b1: float, b2: float, eps: float, weight_decay: float,
         mask=weight_decay_mask, layer_adaptation: bool = True) -> optax.GradientTransformation:
  """LAMB (You et al. 2020) with layer adaptation only where weight decay applies.

  optax.lamb is the same chain but scales every tensor by its trust ratio
  ||param|| / ||update||. For a tensor that starts at zero (biases, norm
  offsets, the log-temperature at init 1.0) that ratio is ~0 after the
  first step, so it never moves again: the learned temperature would stay
  at its initial value. BERT's and ALIGN's LAMB exclude such tensors from
  layer adaptation (exclude_from_layer_adaptation = the weight-decay
  exclusions); so does this one. The rest is optax.lamb's chain.

  layer_adaptation=False drops the trust ratio: AdamW (decoupled weight
  decay, the same mask), the optimizer of open_clip and most CLIP code, for
  like-for-like comparisons (benchmarks/bench_step.py --optimizer=adamw). On
  the demo it learned slower than LAMB (400-step probes: mR 5-11 vs 21).
  """
  return optax.chain(
      optax.scale_by_adam(b1=b1, b2=b2, eps=eps),
      optax.add_decayed_weights(weight_decay, mask),
      optax.masked(scale_by_trust_ratio(), mask) if layer_adaptation else optax.identity(),
      optax.scale_by_learning_rate(learning_rate))


def task_lamb(optim_config, peak_learning_rate: float, total_steps: int) -> optax.GradientTransformation:
  """Clip (optional) + LAMB with masked weight decay and the task's schedule."""
  schedule = learning_rate_schedule(peak_learning_rate, optim_config.warmup_steps, total_steps,
                                    optim_config.get("decay", True))
  tx = lamb(schedule, b1=optim_config.b1, b2=optim_config.b2, eps=optim_config.eps,
            weight_decay=optim_config.weight_decay, layer_adaptation=optim_config.layer_adaptation)
  if optim_config.grad_clip_norm is not None:
    tx = optax.chain(optax.clip_by_global_norm(optim_config.grad_clip_norm), tx)
  return tx


def _only(tx: optax.GradientTransformation, trainable: Any) -> optax.GradientTransformation:
  """`tx` on the True leaves of `trainable`, exactly-zero updates (and no state) elsewhere."""
  labels = jax.tree.map(lambda t: "train" if t else "frozen", trainable)
  return optax.multi_transform({"train": tx, "frozen": optax.set_to_zero()}, labels)


@dataclasses.dataclass(frozen=True)
class MultiTaskOptimizer:
  """One GradientTransformation per task; `update` sums the tasks' updates."""
  transforms: Dict[str, optax.GradientTransformation]
  schedules: Dict[str, optax.Schedule]

  @property
  def tasks(self):
    return tuple(self.transforms)

  def init(self, params) -> Dict[str, Any]:
    return {task: tx.init(params) for task, tx in self.transforms.items()}

  def update(self, grads: Mapping[str, Any], state: Mapping[str, Any], params,
             active: Optional[jax.Array] = None):
    """grads[task] -> (summed updates, new state). Every task needs a gradient.

    active: optional bool [num tasks]; a task whose entry is False makes no
    update and keeps its state (the per-step task chooser).
    """
    if set(grads) != set(self.transforms):
      raise ValueError(f"gradients for {sorted(grads)}, optimizers for {sorted(self.transforms)}")
    total, new_state = None, {}
    for i, (task, tx) in enumerate(self.transforms.items()):
      if active is None:
        updates, new_state[task] = tx.update(grads[task], state[task], params)
      else:
        updates, new_state[task] = jax.lax.cond(
            active[i], lambda g, s, tx=tx: tx.update(g, s, params),
            lambda g, s: (jax.tree.map(jnp.zeros_like, g), s), grads[task], state[task])
      total = updates if total is None else jax.tree.map(jnp.add, total, updates)
    return total, new_state


def scale_subtrees(scales: Mapping[str, float]) -> optax.GradientTransformation:
  """The updates of the parameters under each top-level name in `scales` ('image_tower', ...) times
  its factor: a tower's own learning rate, relative to each task's (LAMB and AdamW end by scaling
  with the rate, so scaling their update is scaling the rate)."""

  def update_fn(updates, state, params=None):
    del params

    def scaled(path, u):
      key = getattr(path[0], "key", None) if path else None
      return u * jnp.asarray(scales[key], u.dtype) if key in scales else u

    return jax.tree_util.tree_map_with_path(scaled, updates), state

  return optax.GradientTransformation(optax.init_empty_state, update_fn)


def build(tasks: Sequence, trainable: Mapping[str, Any], optim_config, total_steps: int,
          rate_scales: Optional[Mapping[str, float]] = None) -> MultiTaskOptimizer:
  """One masked LAMB per task at task.learning_rate; trainable[task name] is its param mask;
  rate_scales: a factor on every task's rate per top-level parameter name (`scale_subtrees`)."""
  scales = {k: float(v) for k, v in (rate_scales or {}).items() if v != 1.0}
  transforms, schedules = {}, {}
  for task in tasks:
    tx = _only(task_lamb(optim_config, task.learning_rate, total_steps), trainable[task.name])
    transforms[task.name] = optax.chain(tx, scale_subtrees(scales)) if scales else tx
    schedules[task.name] = learning_rate_schedule(task.learning_rate, optim_config.warmup_steps,
                                                  total_steps, optim_config.get("decay", True))
  return MultiTaskOptimizer(transforms, schedules)
