"""Locked towers (LiT) and per-tower learning rates: a locked tower keeps its names, passes no
gradient, holds no optimizer state and ends training bit-identical; a rate scale scales the update."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from conftest import assert_resumes_bit_exactly, tiny_config
from mural import config_lib
from mural import models
from mural import optim
from mural import systems
from mural import train


def _leaves(tree):
  return {jax.tree_util.keystr(p): np.asarray(x) for p, x in jax.tree_util.tree_leaves_with_path(tree)}


def test_a_locked_tower_keeps_its_names_runs_in_inference_mode_and_passes_no_gradient(tiny_vocab):
  config = tiny_config(tiny_vocab)
  images = jax.random.uniform(jax.random.PRNGKey(1), (2, config.data.image_size, config.data.image_size, 3))
  built = {}
  for locked in (False, True):
    config.model.image.locked = locked
    built[locked] = models.build_model(config.model, ["i2t"])
  variables = built[False].init(jax.random.PRNGKey(0), images, method=built[False].embed_images)
  assert _leaves(built[True].init(jax.random.PRNGKey(0), images, method=built[True].embed_images)).keys() == \
      _leaves(variables).keys()  # The same parameter names: checkpoints and imports fit both.
  embed = lambda model, p, train: model.apply({**variables, "params": p}, images, None, train,
                                              method=model.embed_images, mutable=["batch_stats"])[0]
  np.testing.assert_array_equal(embed(built[True], variables["params"], True),  # Train mode asked,
                                embed(built[False], variables["params"], False))  # inference mode run.
  grads = jax.grad(lambda p: jnp.sum(embed(built[True], p, True) ** 2))(variables["params"])
  assert all(not np.any(g) for g in _leaves(grads["image_tower"]).values())
  assert built[True].image_tower.output_dim == built[False].image_tower.output_dim


@pytest.fixture(scope="module")
def locked_run(tiny_vocab, tmp_path_factory):
  config = tiny_config(tiny_vocab, total_steps=4)
  config.model.image.locked = True
  workdir = tmp_path_factory.mktemp("locked")
  return config, train.train_and_evaluate(config, str(workdir), evaluators=[])


def test_a_locked_tower_trains_not_at_all_and_holds_no_optimizer_state(locked_run):
  config, result = locked_run
  state, init = result["state"], result["setup"].init_state(jax.random.PRNGKey(config.seed))
  for collection in ("params", "batch_stats"):
    before = _leaves(getattr(init, collection)["image_tower"])
    after = _leaves(getattr(state, collection)["image_tower"])
    assert before.keys() == after.keys() and all(np.array_equal(before[k], after[k]) for k in before)
  text_before, text_after = _leaves(init.params["text_tower"]), _leaves(state.params["text_tower"])
  assert any(not np.array_equal(text_before[k], text_after[k]) for k in text_before)  # The rest trains.
  image_shapes = {x.shape for x in jax.tree.leaves(state.params["image_tower"]) if x.ndim >= 3}  # Conv kernels.
  assert image_shapes and not any(x.shape in image_shapes for x in jax.tree.leaves(state.opt_state))


def test_a_locked_run_resumes_bit_exactly(locked_run, tmp_path):
  config, result = locked_run
  assert_resumes_bit_exactly(config, tmp_path, result)


def test_a_rate_scale_scales_that_subtree_s_update_only():
  params = {"image_tower": {"w": jnp.ones((2, 3))}, "text_tower": {"w": jnp.ones((3,))}, "log_t": jnp.ones(())}
  grads = jax.tree.map(lambda p: p * 0.5, params)
  plain = optax.sgd(0.1)
  scaled = optax.chain(plain, optim.scale_subtrees({"image_tower": 0.25}))
  u_plain, _ = plain.update(grads, plain.init(params), params)
  u_scaled, _ = scaled.update(grads, scaled.init(params), params)
  np.testing.assert_allclose(u_scaled["image_tower"]["w"], 0.25 * np.asarray(u_plain["image_tower"]["w"]))
  np.testing.assert_array_equal(u_scaled["text_tower"]["w"], u_plain["text_tower"]["w"])
  np.testing.assert_array_equal(u_scaled["log_t"], u_plain["log_t"])


@pytest.mark.parametrize("fields, message", [
    ({"model.text.learning_rate_scale": -0.1}, r"^config\.model\.text\.learning_rate_scale: must be a number >= 0"),
    ({"model.image.locked": True, "model.image.learning_rate_scale": 0.1},
     r"^config\.model\.image\.learning_rate_scale: is 0\.1, but model\.image\.locked is True"),
])
def test_bad_lock_or_rate_fields_are_one_line(fields, message):
  c = systems.base_config("mural")
  for field, value in fields.items():
    config_lib.set_field(c, field, value)
  with pytest.raises(config_lib.ConfigError, match=message):
    config_lib.validate(c)
