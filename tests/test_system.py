"""A new system is one file plus one table entry: a toy system defined here trains through
the public trainer with no change to mural/.

The toy system has a new head kind (LayerNorm + Dense) read by a new task (a
SigLIP-style sigmoid image-text loss on the built-in data), MURAL's own
text-pair task reused as is, a retrieval evaluator on the new head, and a
per-step task chooser (one task per step with p = 0.5, as Kádár et al. do),
so it also shows that the chooser stays one compiled step and that the task
not chosen neither moves the parameters nor its optimizer state.
"""

import json
import types

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from conftest import tiny_config
from mural import evaluate
from mural import losses
from mural import models
from mural import system
from mural import systems
from mural import train
from mural.data import eval_data
from mural.data import inputs
from mural.models.dual_encoder import DualEncoder
from mural.systems import mural
from mural.systems.defaults import mural as mural_defaults


class NormedHead(nn.Module):
  """LayerNorm then Dense: a head kind mural does not have."""
  features: int

  @nn.compact
  def __call__(self, x):
    x = nn.LayerNorm(name="norm", scale_init=nn.with_logical_partitioning(nn.initializers.ones, ("norm",)),
                     bias_init=nn.with_logical_partitioning(nn.initializers.zeros, ("norm",)))(x)
    return nn.Dense(self.features, name="dense",
                    kernel_init=nn.with_logical_partitioning(nn.initializers.lecun_normal(), ("embed", "proj")),
                    bias_init=nn.with_logical_partitioning(nn.initializers.zeros, ("proj",)))(x)


def sigmoid_loss(image, text, temperature, bias, valid):
  """SigLIP: every pair is a binary problem, positives on the diagonal."""
  sim = losses.l2_normalize(image) @ losses.l2_normalize(text).T / temperature + bias
  labels = 2.0 * jnp.eye(sim.shape[0]) - 1.0
  pair_valid = valid[:, None] & valid[None, :]
  per_pair = -jax.nn.log_sigmoid(labels * sim)
  return jnp.sum(jnp.where(pair_valid, per_pair, 0.0)) / jnp.maximum(jnp.sum(valid), 1)


def sigmoid_task(config):
  bias = config.tasks.sig.bias

  def forward(model, batch, train_):
    return {"image": model.embed_images(batch["image"], None, train_),
            "text": model.embed_texts(batch["text_ids"], batch["text_mask"], "toy", train_),
            "temperature": model.temperature()}

  def loss(out, batch):
    value = sigmoid_loss(out["image"], out["text"], out["temperature"], bias, batch["valid"])
    return value, {"loss/sigmoid": value}

  return system.task_from_config(config, "sig", input=inputs.IMAGE_TEXT, forward=forward, loss=loss,
                                 heads=("toy",))


def toy_config():
  c = mural_defaults.get_config()
  c.system = "toy"
  c.tasks.sig = mural_defaults.image_text_config(learning_rate=1e-2, bias=-2.0)
  del c.tasks["i2t"]
  return c


def build_model(config, tasks):
  text = models.tower("text", config.model.text, jnp.float32, jnp.float32)
  image = models.tower("image", config.model.image, jnp.float32, jnp.float32)
  heads = {"toy": NormedHead(image.output_dim, name="toy_head"),
           "t2t": NormedHead(image.output_dim, name="t2t_head")}
  return DualEncoder(image_tower=image, text_tower=text, heads={h: heads[h] for t in tasks for h in t.heads},
                     init_temperature=0.1)


def evaluators(config, tasks, tokenizer):
  retrieval, _ = eval_data.build_eval_sets(config, tokenizer)
  return [evaluate.Retrieval(retrieval, text_head="toy")]


TOY = system.System(
    name="toy", get_config=toy_config,
    tasks=lambda config: (sigmoid_task(config), mural.text_pair_task(config)),
    build_model=build_model, evaluators=evaluators,
    choose_task=lambda rng, tasks: jax.random.bernoulli(rng, 0.5).astype(jnp.int32))


def _toy(vocab_path):
  c = toy_config()
  tiny = tiny_config(vocab_path)
  for section in ("model", "data"):
    c[section] = tiny[section]
  for field in ("total_steps", "log_every_steps", "checkpoint_every_steps", "eval_every_steps", "eval_batch_size"):
    c[field] = tiny[field]
  c.optim.warmup_steps = 1
  c.total_steps, c.eval_every_steps = 8, 0
  c.tasks.sig.batch_size = c.tasks.t2t.batch_size = 8
  return c


def test_toy_system_trains_through_the_public_trainer(monkeypatch, tiny_vocab, tmp_path):
  monkeypatch.setitem(systems.SYSTEMS, "toy", systems.Entry(toy_config, types.SimpleNamespace(SYSTEM=TOY)))
  config = _toy(tiny_vocab)
  result = train.train_and_evaluate(config, str(tmp_path))
  lines = [json.loads(l) for l in (tmp_path / "metrics.jsonl").read_text().splitlines()]
  assert [l["step"] for l in lines] == list(range(1, 9))
  chosen = [int(l["task_index"]) for l in lines]
  assert set(chosen) == {0, 1}, chosen  # Both tasks drawn in 8 steps (seeded: fixed).
  for l in lines:
    assert np.isfinite(l["loss"])
    if l["task_index"] == 0:
      assert l["loss"] == pytest.approx(l["loss/sigmoid"] * 1.0) and l["loss/l2r"] == 0.0
    else:
      assert l["loss"] == pytest.approx(0.1 * (l["loss/l2r"] + l["loss/r2l"])) and l["loss/sigmoid"] == 0.0
  state = result["state"]
  assert {"toy_head", "t2t_head", "image_tower", "text_tower"} <= set(state.params)
  assert "norm" in state.params["toy_head"] and "i2t_head" not in state.params
  # A task's optimizer stepped exactly on the steps that chose it.
  for index, name in enumerate(("sig", "t2t")):
    counts = {int(x) for x in jax.tree.leaves(jax.device_get(state.opt_state[name]))
              if np.ndim(x) == 0 and np.issubdtype(np.asarray(x).dtype, np.integer)}
    assert counts == {chosen.count(index)}, (name, counts, chosen)
  # Each task's own head moved (it was chosen at least once).
  init = jax.device_get(result["setup"].init_state(jax.random.PRNGKey(config.seed)))
  moved = lambda tree_a, tree_b: any(not np.array_equal(a, b) for a, b in
                                     zip(jax.tree.leaves(tree_a), jax.tree.leaves(tree_b)))
  assert moved(state.params["t2t_head"], init.params["t2t_head"]) == (1 in chosen)
  assert moved(state.params["toy_head"], init.params["toy_head"]) == (0 in chosen)
  assert 0.0 <= result["eval"]["en/mR"] <= 100.0 and "en-de/acc" not in result["eval"]
  # Choosing a task is data, not a Python branch: the 8 steps, both tasks among them, ran one
  # compiled step.
  assert train.jit_train_step(result["setup"])._cache_size() == 1


def test_sigmoid_loss_matches_numpy():
  rng = np.random.default_rng(0)
  x, y = rng.normal(size=(5, 3)), rng.normal(size=(5, 3))
  valid = np.array([True, True, True, True, False])
  n = lambda a: a / np.linalg.norm(a, axis=-1, keepdims=True)
  z = n(x) @ n(y).T / 0.5 - 2.0
  labels = 2 * np.eye(5) - 1
  want = sum(np.log1p(np.exp(-labels[i, j] * z[i, j])) for i in range(4) for j in range(4)) / 4
  got = sigmoid_loss(jnp.asarray(x, jnp.float32), jnp.asarray(y, jnp.float32), 0.5, -2.0, jnp.asarray(valid))
  np.testing.assert_allclose(float(got), want, rtol=1e-5)


def test_a_field_no_default_has_is_a_one_line_error():
  """A misspelt field set in a config file would be ignored: systems.get names it."""
  from mural import config_lib
  c = systems.base_config("mural")
  c.optim.warmup_step = 5
  with pytest.raises(config_lib.ConfigError,
                     match=r"^config\.optim\.warmup_step: not a field of system 'mural'; did you mean optim\.warmup_steps\?$"):
    systems.get(c)
  # Dicts keyed by data (languages) or by a source kind are free-form; the rest is checked.
  c = systems.base_config("mural")
  c.data.synthetic.pairs_per_language = {"sw": 10}
  c.data.eval_source = dict(name="flickr8k", split="dev")
  c.data.eval_translations = dict(name="multi30k", split="test")
  assert systems.get(c) is systems.SYSTEMS["mural"].system
  c.data.synthetic.pair_per_language = {"sw": 10}
  with pytest.raises(config_lib.ConfigError, match=r"^config\.data\.synthetic\.pair_per_language: "):
    systems.get(c)
