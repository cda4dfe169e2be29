"""mural.optim: schedule values, weight-decay masks, LAMB against NumPy, per-task rates."""

import types

import jax
import jax.numpy as jnp
import flax.linen as nn
import numpy as np
import optax
import pytest

from conftest import load_config, set_fields
from mural import config_lib
from mural import optim
from mural import system
from mural import systems


def optim_config(**overrides):
  c = load_config("tiny").optim
  for k, v in overrides.items():
    c[k] = v
  return c


# ---- NumPy LAMB (float64), the reference -------------------------------------


def numpy_lamb(params, grads_per_step, lrs, b1=0.9, b2=0.999, eps=1e-6, wd=0.0, decay=None, clip=None,
               trust_ratio=True):
  """LAMB: adam -> +wd*p -> trust ratio -> -lr; decay and trust ratio only where decay[k].
  trust_ratio=False: AdamW."""
  p = {k: np.asarray(v, np.float64) for k, v in params.items()}
  m = {k: np.zeros_like(v) for k, v in p.items()}
  v2 = {k: np.zeros_like(v) for k, v in p.items()}
  for t, (g, lr) in enumerate(zip(grads_per_step, lrs), start=1):
    g = {k: np.asarray(x, np.float64) for k, x in g.items()}
    if clip is not None:
      norm = np.sqrt(sum(np.sum(x * x) for x in g.values()))
      g = {k: x * min(1.0, clip / norm) for k, x in g.items()}
    for k in p:
      m[k] = b1 * m[k] + (1 - b1) * g[k]
      v2[k] = b2 * v2[k] + (1 - b2) * g[k] ** 2
      u = (m[k] / (1 - b1 ** t)) / (np.sqrt(v2[k] / (1 - b2 ** t)) + eps)
      ratio = 1.0
      if decay is None or decay[k]:
        u = u + wd * p[k]
        pn, un = np.linalg.norm(p[k]), np.linalg.norm(u)
        ratio = pn / un if pn > 0 and un > 0 and trust_ratio else 1.0
      p[k] = p[k] - lr * ratio * u
  return p


def run_optax(tx, params, grads_per_step):
  state = tx.init(params)
  for g in grads_per_step:
    updates, state = tx.update(g, state, params)
    params = optax.apply_updates(params, updates)
  return params


RNG = np.random.default_rng(0)
PARAMS = {"kernel": RNG.normal(size=(3, 4)).astype(np.float32),
          "bias": RNG.normal(size=(4,)).astype(np.float32)}
GRADS = [{k: RNG.normal(size=v.shape).astype(np.float32) * s for k, v in PARAMS.items()}
         for s in (10.0, 0.5, 2.0)]


# ---- Schedule -----------------------------------------------------------------


def test_schedule_hand_values():
  f = optim.learning_rate_schedule(1e-3, warmup_steps=10, total_steps=110)
  expected = {0: 0.0, 1: 1e-4, 5: 5e-4, 10: 1e-3, 35: 7.5e-4, 60: 5e-4, 109: 1e-5, 110: 0.0, 500: 0.0}
  for step, lr in expected.items():
    assert float(f(step)) == pytest.approx(lr, abs=1e-9), step


def test_schedule_without_warmup_starts_at_peak():
  f = optim.learning_rate_schedule(2.0, warmup_steps=0, total_steps=4)
  assert [float(f(s)) for s in range(6)] == pytest.approx([2.0, 1.5, 1.0, 0.5, 0.0, 0.0])


def test_schedule_without_decay_holds_the_peak():
  f = optim.learning_rate_schedule(2.0, warmup_steps=4, total_steps=8, decay=False)
  assert [float(f(s)) for s in (0, 2, 4, 7, 8, 1000)] == pytest.approx([0.0, 1.0, 2.0, 2.0, 2.0, 2.0])
  f = optim.learning_rate_schedule(2.0, warmup_steps=0, total_steps=4, decay=False)
  assert [float(f(s)) for s in range(6)] == pytest.approx([2.0] * 6)


def test_decay_config_error_is_one_line():
  c = set_fields(load_config("tiny"), optim__decay=None)  # A typed field: only None gets past ConfigDict.
  with pytest.raises(config_lib.ConfigError, match=r"^config\.optim\.decay: must be True or False"):
    systems.validate(c)


# ---- Weight decay mask and LAMB ---------------------------------------------------


def _model(config):
  """(model, abstract unboxed variables, active tasks) of config's system."""
  tasks = system.active_tasks(systems.get(config), config)
  model = systems.get(config).build_model(config, tasks)
  v = nn.unbox(jax.eval_shape(lambda: system.init_variables(model, tasks, config, jax.random.PRNGKey(0))))
  return model, v, tasks


def test_weight_decay_mask_on_the_model():
  params = _model(load_config("tiny"))[1]["params"]
  mask = optim.weight_decay_mask(params)
  flat = {"/".join(str(k.key) for k in path): m for path, m in jax.tree_util.tree_flatten_with_path(mask)[0]}
  assert not flat["log_temperature"]
  for name, decayed in flat.items():
    leaf = name.rsplit("/", 1)[-1]
    if leaf in ("bias", "scale", "log_temperature"):
      assert not decayed, name
    if leaf in ("kernel", "embedding") or name.endswith("position_embed"):
      assert decayed, name
  assert any(flat.values()) and not all(flat.values())


def test_lamb_matches_numpy_with_masked_decay():
  c = optim_config(weight_decay=0.1, warmup_steps=1)
  tx = optim.task_lamb(c, peak_learning_rate=0.01, total_steps=5)
  got = run_optax(tx, {k: jnp.asarray(v) for k, v in PARAMS.items()}, GRADS)
  lr = optim.learning_rate_schedule(0.01, 1, 5)
  want = numpy_lamb(PARAMS, GRADS, [float(lr(s)) for s in range(3)], wd=0.1,
                    decay={"kernel": True, "bias": False})
  for k in PARAMS:
    np.testing.assert_allclose(got[k], want[k], rtol=2e-5, atol=1e-7)
  # The bias got neither decay nor trust ratio: LAMB on everything differs there.
  all_decay = numpy_lamb(PARAMS, GRADS, [float(lr(s)) for s in range(3)], wd=0.1)
  assert not np.allclose(all_decay["bias"], want["bias"])


def test_without_layer_adaptation_it_is_adamw_with_the_same_mask():
  c = optim_config(weight_decay=0.1, warmup_steps=1, layer_adaptation=False)
  tx = optim.task_lamb(c, peak_learning_rate=0.01, total_steps=5)
  got = run_optax(tx, {k: jnp.asarray(v) for k, v in PARAMS.items()}, GRADS)
  lr = optim.learning_rate_schedule(0.01, 1, 5)
  want = numpy_lamb(PARAMS, GRADS, [float(lr(s)) for s in range(3)], wd=0.1,
                    decay={"kernel": True, "bias": False}, trust_ratio=False)
  for k in PARAMS:
    np.testing.assert_allclose(got[k], want[k], rtol=2e-5, atol=1e-7)
  lamb = run_optax(optim.task_lamb(optim_config(weight_decay=0.1, warmup_steps=1), 0.01, 5),
                   {k: jnp.asarray(v) for k, v in PARAMS.items()}, GRADS)
  assert not np.allclose(lamb["kernel"], want["kernel"])


def test_trust_ratio_on_all_tensors_at_once_matches_optax_and_numpy():
  """optim.scale_by_trust_ratio is optax's, computed on stacked norms: the same updates, also
  where a param or an update is all zeros (ratio 1) and under optax.masked."""
  rng = np.random.default_rng(0)
  params = {"a": rng.normal(size=(3, 4)), "b": np.zeros((5,)), "c": rng.normal(size=(2, 3, 2)),
            "d": rng.normal(size=())}
  updates = {"a": rng.normal(size=(3, 4)), "b": rng.normal(size=(5,)), "c": np.zeros((2, 3, 2)),
             "d": rng.normal(size=())}
  params32, updates32 = (jax.tree.map(lambda x: jnp.asarray(x, jnp.float32), t) for t in (params, updates))
  got, _ = optim.scale_by_trust_ratio().update(updates32, optax.EmptyState(), params32)
  want, _ = optax.scale_by_trust_ratio().update(updates32, optax.EmptyState(), params32)
  for k in params:
    pn, un = np.linalg.norm(params[k]), np.linalg.norm(updates[k])
    ratio = pn / un if pn > 0 and un > 0 else 1.0
    np.testing.assert_allclose(got[k], updates[k] * ratio, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(got[k], want[k], rtol=1e-6, atol=0)
  mask = {"a": True, "b": False, "c": True, "d": False}
  tx = optax.masked(optim.scale_by_trust_ratio(), mask)
  got, _ = tx.update(updates32, tx.init(params32), params32)
  np.testing.assert_allclose(got["a"], want["a"], rtol=1e-6)
  np.testing.assert_array_equal(got["b"], updates32["b"])  # Unmasked: untouched.
  with pytest.raises(ValueError, match="needs the params"):
    optim.scale_by_trust_ratio().update(updates32, optax.EmptyState())


def test_zero_initialised_scalar_keeps_learning():
  """optax.lamb's trust ratio freezes a parameter that starts at 0 (ratio ~0
  after one step); the log-temperature must keep moving at ~lr per step."""
  tx = optim.task_lamb(optim_config(warmup_steps=0, weight_decay=1e-5), 0.01, total_steps=1000)
  params = {"log_temperature": jnp.zeros(())}
  params = run_optax(tx, params, [{"log_temperature": np.float32(1.0)}] * 10)
  assert float(params["log_temperature"]) == pytest.approx(-0.1, rel=0.02)
  frozen = run_optax(optax.lamb(0.01, weight_decay=1e-5), {"log_temperature": jnp.zeros(())},
                     [{"log_temperature": np.float32(1.0)}] * 10)
  assert abs(float(frozen["log_temperature"])) < 0.011  # optax.lamb: stuck after step 1.


def test_gradient_clipping_matches_numpy():
  c = optim_config(weight_decay=0.0, warmup_steps=1, grad_clip_norm=1.0)
  tx = optim.task_lamb(c, peak_learning_rate=0.01, total_steps=5)
  got = run_optax(tx, {k: jnp.asarray(v) for k, v in PARAMS.items()}, GRADS)
  lr = optim.learning_rate_schedule(0.01, 1, 5)
  lrs = [float(lr(s)) for s in range(3)]
  decay = {"kernel": True, "bias": False}
  want = numpy_lamb(PARAMS, GRADS, lrs, clip=1.0, decay=decay)
  unclipped = numpy_lamb(PARAMS, GRADS, lrs, decay=decay)
  for k in PARAMS:
    np.testing.assert_allclose(got[k], want[k], rtol=2e-5, atol=1e-7)
  assert not np.allclose(want["kernel"], unclipped["kernel"], rtol=1e-4)


# ---- Per-task optimizers ------------------------------------------------------------


def _tasks(i2t_rate=0.01, t2t_rate=0.001):
  return {"i2t": types.SimpleNamespace(name="i2t", learning_rate=i2t_rate),
          "t2t": types.SimpleNamespace(name="t2t", learning_rate=t2t_rate)}


def _two_task_setup(t2t_rate):
  config = optim_config(weight_decay=0.1, warmup_steps=1)
  tasks = _tasks(t2t_rate=t2t_rate)
  params = {"shared": jnp.asarray(PARAMS["kernel"]), "image": jnp.asarray(PARAMS["kernel"] * 2),
            "t2t_head": jnp.asarray(PARAMS["kernel"] * 3)}
  trainable = {"i2t": {"shared": True, "image": True, "t2t_head": False},
               "t2t": {"shared": True, "image": False, "t2t_head": True}}
  return (config, tasks), params, optim.build(tasks.values(), trainable, config, total_steps=5)


def test_per_task_rates_sum_of_two_lambs():
  config, params, opt = _two_task_setup(t2t_rate=0.001)
  g_i2t = {"shared": GRADS[0]["kernel"], "image": GRADS[1]["kernel"], "t2t_head": np.zeros((3, 4), np.float32)}
  g_t2t = {"shared": GRADS[2]["kernel"], "image": np.zeros((3, 4), np.float32), "t2t_head": GRADS[0]["kernel"]}
  state = opt.init(params)
  updates, state = opt.update({"i2t": g_i2t, "t2t": g_t2t}, state, params)
  new = optax.apply_updates(params, updates)
  lr = lambda peak: [float(optim.learning_rate_schedule(peak, 1, 5)(1))]
  # Step 0 has lr 0 (warm-up from 0): take the second step for non-zero numbers.
  updates, state = opt.update({"i2t": g_i2t, "t2t": g_t2t}, state, new)
  new2 = optax.apply_updates(new, updates)
  np.testing.assert_array_equal(new["shared"], params["shared"])  # lr(0) == 0.
  p0 = {k: np.asarray(v, np.float64) for k, v in params.items()}
  # Each task's LAMB on its own parameters; updates add up on the shared one.
  i2t = numpy_lamb({"shared": p0["shared"], "image": p0["image"]},
                   [{"shared": g_i2t["shared"], "image": g_i2t["image"]}] * 2, [0.0] + lr(0.01), wd=0.1)
  t2t = numpy_lamb({"shared": p0["shared"], "t2t_head": p0["t2t_head"]},
                   [{"shared": g_t2t["shared"], "t2t_head": g_t2t["t2t_head"]}] * 2, [0.0] + lr(0.001), wd=0.1)
  np.testing.assert_allclose(new2["image"], i2t["image"], rtol=2e-5)
  np.testing.assert_allclose(new2["t2t_head"], t2t["t2t_head"], rtol=2e-5)
  # Both steps' updates are computed at the same params here (params unchanged at step 0).
  np.testing.assert_allclose(new2["shared"], i2t["shared"] + t2t["shared"] - p0["shared"], rtol=2e-5)
  # Only the trained parameters have moments in each task's state.
  for task in ("i2t", "t2t"):  # mu and nu of two tensors each, not three.
    assert sum(x.shape == (3, 4) for x in jax.tree.leaves(state[task])) == 4


def _run(opt, params, grads, steps=3):
  state = opt.init(params)
  for _ in range(steps):
    updates, state = opt.update(grads, state, params)
    params = optax.apply_updates(params, updates)
  return params


def test_untouched_parameters_get_no_update_from_other_tasks():
  """A parameter outside a task's mask gets exactly zero from that task, even
  with weight decay (LAMB's trust ratio would blow decay up to a full step)."""
  (config, tasks), params, both = _two_task_setup(t2t_rate=0.001)
  zero = {k: np.zeros((3, 4), np.float32) for k in params}
  masks = {"i2t": {"shared": True, "image": True, "t2t_head": False},
           "t2t": {"shared": True, "image": False, "t2t_head": True}}
  got = _run(both, params, {"i2t": zero, "t2t": zero})
  only_i2t = _run(optim.build([tasks["i2t"]], masks, config, 5), params, {"i2t": zero})
  only_t2t = _run(optim.build([tasks["t2t"]], masks, config, 5), params, {"t2t": zero})
  np.testing.assert_array_equal(got["image"], only_i2t["image"])
  np.testing.assert_array_equal(got["t2t_head"], only_t2t["t2t_head"])
  np.testing.assert_array_equal(only_i2t["t2t_head"], params["t2t_head"])
  np.testing.assert_array_equal(only_t2t["image"], params["image"])
  assert not np.array_equal(got["image"], params["image"])  # Decay did act (owning task).


def test_zero_t2t_rate_gives_exactly_zero_t2t_updates():
  _, params, opt = _two_task_setup(t2t_rate=0.0)
  g = {k: np.ones((3, 4), np.float32) for k in params}
  state = opt.init(params)["t2t"]
  for _ in range(3):
    updates, state = opt.transforms["t2t"].update(g, state, params)
    for leaf in jax.tree.leaves(updates):
      np.testing.assert_array_equal(leaf, 0.0)


# ---- Which parameters each task trains ------------------------------------------------


def test_inactive_task_keeps_its_state_and_makes_no_update():
  """The per-step task chooser: a task marked inactive neither moves params nor its state."""
  _, params, opt = _two_task_setup(t2t_rate=0.001)
  g = {k: np.ones((3, 4), np.float32) for k in params}
  state = opt.init(params)
  updates, new_state = opt.update({"i2t": g, "t2t": g}, state, params, active=jnp.array([True, False]))
  jax.tree.map(np.testing.assert_array_equal, new_state["t2t"], state["t2t"])
  only_i2t, _ = opt.transforms["i2t"].update(g, state["i2t"], params)
  jax.tree.map(np.testing.assert_array_equal, updates, only_i2t)


def _model_masks(**fields):
  config = set_fields(load_config("tiny"), **fields)
  model, v, tasks = _model(config)
  shapes = system.batch_shapes(tasks, config, batch_size=2)
  masks = optim.params_read_by(
      lambda p, bs, b: system.task_losses(model, tasks, p, bs, b, jax.random.PRNGKey(0))[0],
      v["params"], v["batch_stats"], shapes)
  return {t: {k: sorted(set(jax.tree.leaves(sub))) for k, sub in m.items()} for t, m in masks.items()}


def test_params_read_by_splits_the_model_by_task():
  m = _model_masks()
  assert m["i2t"] == {"image_tower": [True], "text_tower": [True], "i2t_head": [True],
                      "t2t_head": [False], "log_temperature": [True]}
  assert m["t2t"] == {"image_tower": [False], "text_tower": [True], "i2t_head": [False],
                      "t2t_head": [True], "log_temperature": [False]}


def test_params_read_by_follows_the_model_variant():
  m = _model_masks(model__learn_temperature=False, tasks__t2t__head="i2t")
  assert m["i2t"]["log_temperature"] == [False]  # stop_gradient: not trained.
  assert "t2t_head" not in m["t2t"] and m["t2t"]["i2t_head"] == [True]  # A shared text head.
