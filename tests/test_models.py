"""Towers, heads and the dual encoder on tiny configs (CPU), checked by hand.

Initialising on CPU is compile-bound (~0.1 s per random initializer), so one
tiny model is initialised per module and shapes are read with jax.eval_shape
wherever values are not needed.
"""

import functools
import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import special

from conftest import load_config, set_fields
from mural import config_lib
from mural import models
from mural import systems
from mural.models import bert
from mural.models import efficientnet
from mural.models import heads

LOGICAL_NAMES = {"vocab", "token_embed", "embed", "mlp", "heads", "kv", "position", "proj",
                 "conv_in", "conv_out", "norm", None}




def _count(tree):
  return sum(math.prod(x.shape) for x in jax.tree.leaves(tree))


def run(module, variables, *args, **kwargs):
  """module.apply under jit: eager apply compiles op by op, far slower on CPU."""
  return jax.jit(functools.partial(module.apply, **kwargs))(variables, *args)


def init(module, *args, **kwargs):
  return jax.jit(functools.partial(module.init, **kwargs))(jax.random.key(0), *args)


def _batch(config, b=3, seed=0):
  rng = np.random.default_rng(seed)
  size, length = config.data.image_size, config.model.text.max_len
  lengths = rng.integers(2, length + 1, size=(3, b))

  def text(lens):
    mask = (np.arange(length)[None] < lens[:, None]).astype(np.int32)
    ids = rng.integers(5, config.model.text.vocab_size, size=(b, length)) * mask
    return jnp.asarray(ids, jnp.int32), jnp.asarray(mask)

  batch = {"image": jnp.asarray(rng.normal(size=(b, size, size, 3)), jnp.float32)}
  batch["text_ids"], batch["text_mask"] = text(lengths[0])
  batch["left_ids"], batch["left_mask"] = text(lengths[1])
  batch["right_ids"], batch["right_mask"] = text(lengths[2])
  return batch


def embed_all(module, batch, image_head=None):
  """Every embedding MURAL's tasks compute (a model method for init/apply)."""
  return {"image_emb": module.embed_images(batch["image"], image_head),
          "text_emb": module.embed_texts(batch["text_ids"], batch["text_mask"], "i2t"),
          "left_emb": module.embed_texts(batch["left_ids"], batch["left_mask"], "t2t"),
          "right_emb": module.embed_texts(batch["right_ids"], batch["right_mask"], "t2t"),
          "temperature": module.temperature()}


@pytest.fixture(scope="module")
def tiny():
  """(config, model, variables, batch, eval outputs) of configs/tiny.py, made once."""
  config = load_config("tiny")
  systems.validate(config)
  model = models.build_model(config.model, ["i2t", "t2t"])
  batch = _batch(config)
  variables = init(model, batch, method=embed_all)
  return config, model, variables, batch, run(model, variables, batch, method=embed_all)


# ---- EfficientNet --------------------------------------------------------

def test_round_filters_and_repeats_match_the_reference():
  assert [efficientnet.round_filters(320, w) for w in (1.0, 1.6, 2.0, 4.3)] == [320, 512, 640, 1376]
  assert efficientnet.round_filters(40, 0.25) == 16  # 8 would round down by > 10%.
  assert efficientnet.round_filters(32, 0.1) == 8  # Never below the divisor.
  assert [efficientnet.round_repeats(r, 3.1) for r in (1, 2, 3, 4)] == [4, 7, 10, 13]
  b7 = efficientnet.EfficientNet(2.0, 3.1, 0.5)
  assert len(b7.blocks()) == 55 and b7.output_dim == 640


@pytest.mark.parametrize("variant,expected,tolerance", [
    ("b0", 5_288_548, 0.02),  # Reference trainable count, 5.3M.
    ("b7", 66_347_960, 0.03),  # Reference trainable count, 66M.
])
def test_efficientnet_with_head_and_classifier_param_count(variant, expected, tolerance):
  config = config_lib.base_config().model.image
  config.variant, config.include_head, config.num_classes = variant, True, 1000
  net = efficientnet.from_config(config, jnp.float32, jnp.float32)
  shapes = jax.eval_shape(lambda: net.init(jax.random.key(0), jnp.zeros((1, 64, 64, 3)),
                                           train=False))
  count = _count(shapes["params"])
  assert abs(count - expected) <= tolerance * expected
  assert count == expected  # Same blocks as the TF reference, to the parameter.


def test_efficientnet_head_and_classifier_shapes():
  net = efficientnet.EfficientNet(0.25, 0.25, 0.2, include_head=True, num_classes=7)
  variables = jax.eval_shape(lambda: net.init(jax.random.key(0), jnp.zeros((2, 32, 32, 3)),
                                              train=False))
  features, aux = jax.eval_shape(lambda v: net.apply(v, jnp.zeros((2, 32, 32, 3)), train=False),
                                 variables)
  assert features.shape == (2, 320) and net.output_dim == 320  # round_filters(1280, 0.25).
  assert aux["logits"].shape == (2, 7) and aux["logits"].dtype == jnp.float32


def test_num_stages_keeps_the_first_stages_of_the_block_table():
  """num_stages=3 is the 7-stage net cut after stage 3: the same blocks and parameter shapes up
  to there (drop-connect grows over the shorter net), pooled at stage 3's width
  (round_filters(40, 0.25) = 16)."""
  full = efficientnet.EfficientNet(0.25, 0.25, 0.2, stochastic_depth_rate=0.3)
  cut = full.clone(num_stages=3)
  without_rate = lambda blocks: [{k: v for k, v in b.items() if k != "drop_connect_rate"} for b in blocks]
  assert without_rate(cut.blocks()) == without_rate(full.blocks()[:3]) and cut.output_dim == 16
  np.testing.assert_allclose([b["drop_connect_rate"] for b in cut.blocks()], [0.0, 0.1, 0.2])
  x = jnp.zeros((2, 32, 32, 3))
  variables = lambda net: jax.eval_shape(lambda: net.init(jax.random.key(0), x, train=False))
  kept = ("stem_conv", "stem_bn", "block_0", "block_1", "block_2")
  shapes = lambda tree: jax.tree.map(lambda a: a.shape, tree)
  for collection in ("params", "batch_stats"):
    assert shapes(variables(cut)[collection]) == shapes(
        {k: v for k, v in variables(full)[collection].items() if k in kept})
  features, _ = jax.eval_shape(lambda v: cut.apply(v, x, train=False), variables(cut))
  assert features.shape == (2, 16)


def test_efficientnet_shapes_and_batch_norm_train_vs_eval(tiny):
  config, model, variables, batch, _ = tiny
  tower = model.image_tower.clone(stochastic_depth_rate=0.0)
  v = {"params": variables["params"]["image_tower"],
       "batch_stats": variables["batch_stats"]["image_tower"]}
  images = np.asarray(batch["image"])
  # Two programs for every call below (eval; train keeping the stem's output), each compiled once.
  evaluate = jax.jit(functools.partial(tower.apply, train=False))
  train = jax.jit(functools.partial(tower.apply, train=True, mutable=["batch_stats", "intermediates"],
                                    capture_intermediates=lambda mdl, _: mdl.name == "stem_conv"))

  eval_out, aux = evaluate(v, images)
  assert eval_out.shape == (3, config.model.heads.embed_dim) and eval_out.dtype == jnp.float32
  assert aux == {}

  (train_out, _), state = train(v, images)
  # Training normalises with the batch's statistics, so outputs differ from eval.
  assert not np.allclose(train_out, eval_out, atol=1e-3)
  # Running stats move with momentum 0.99 toward the batch statistics.
  stem = np.asarray(state["intermediates"]["stem_conv"]["__call__"][0], np.float64)
  new = state["batch_stats"]["stem_bn"]
  np.testing.assert_allclose(new["mean"], 0.01 * stem.mean(axis=(0, 1, 2)), rtol=1e-4, atol=1e-6)
  np.testing.assert_allclose(new["var"], 0.99 + 0.01 * stem.var(axis=(0, 1, 2)), rtol=1e-4)
  # Eval uses the running stats: each example is independent of the rest of the batch...
  others = images.copy()
  others[1:] = 0.5 - 2.0 * images[1:]
  np.testing.assert_allclose(evaluate(v, others)[0][:1], eval_out[:1], rtol=1e-5, atol=1e-5)
  # ... while in training it is not.
  assert not np.allclose(train(v, others)[0][0][:1], train_out[:1], atol=1e-3)
  # And eval reads the updated running stats.
  updated = {"params": v["params"], "batch_stats": state["batch_stats"]}
  assert not np.allclose(evaluate(updated, images)[0], eval_out, atol=1e-4)
  assert evaluate._cache_size() == 1 and train._cache_size() == 1


def test_drop_connect_drops_whole_residual_branches():
  block = efficientnet.MBConv(8, 8, kernel=3, stride=1, expand_ratio=2, se_ratio=0.25,
                              drop_connect_rate=0.5)
  x = jax.random.normal(jax.random.key(1), (64, 4, 4, 8))
  v = init(block, x, train=False)
  out, _ = run(block, v, x, train=True, rngs={"dropout": jax.random.key(2)},
                       mutable=["batch_stats"])
  full, _ = run(block.clone(drop_connect_rate=0.0), v, x, train=True, mutable=["batch_stats"])
  assert np.abs(full - x).max() > 1e-3
  # Each example either keeps its whole branch (scaled by 1 / keep) or drops it.
  kept = np.all(np.isclose(out - x, 2 * (full - x), atol=1e-5), axis=(1, 2, 3))
  dropped = np.all(np.isclose(out, x, atol=1e-6), axis=(1, 2, 3))
  assert np.all(kept ^ dropped) and 10 < kept.sum() < 54


def test_drop_connect_rate_grows_with_block_index():
  rates = [b["drop_connect_rate"] for b in efficientnet.EfficientNet(1.0, 1.0, 0.2, 0.2).blocks()]
  np.testing.assert_allclose(rates, [0.2 * i / 16 for i in range(16)])


# ---- BERT ----------------------------------------------------------------

def test_bert_param_count_matches_hand_formula():
  vocab, e, h, layers, mlp, max_len = 50, 8, 16, 3, 24, 10
  net = bert.Bert(vocab, e, h, layers, 4, mlp, max_len)
  ids = jnp.zeros((1, max_len), jnp.int32)
  params = nn.unbox(jax.eval_shape(lambda: net.init(jax.random.key(0), ids, ids,
                                                    train=False))["params"])
  embeddings = vocab * e + (e * h + h) + max_len * h + 2 * h  # Table, projection, positions, LN.
  layer = 4 * (h * h + h) + (h * mlp + mlp) + (mlp * h + h) + 2 * 2 * h
  assert _count(params) == embeddings + layers * layer
  assert params["token_embed"]["embedding"].shape == (vocab, e)


def test_bert_shapes_and_padding_does_not_change_cls(tiny):
  config, model, variables, batch, _ = tiny
  tower = model.text_tower
  v = {"params": variables["params"]["text_tower"]}
  ids, mask = batch["text_ids"][:, :10], batch["text_mask"][:, :10]
  cls, aux = run(tower, v, ids, mask, train=False)
  assert cls.shape == (3, 64) and cls.dtype == jnp.float32
  assert aux["sequence"].shape == (3, 10, 64)
  # Append 6 pad positions holding arbitrary ids with mask 0.
  pad_ids = jnp.concatenate([ids, jnp.full((3, 6), 7, jnp.int32)], axis=1)
  pad_mask = jnp.concatenate([mask, jnp.zeros((3, 6), jnp.int32)], axis=1)
  np.testing.assert_allclose(run(tower, v, pad_ids, pad_mask, train=False)[0], cls,
                             rtol=1e-5, atol=1e-5)
  # The same ids with the mask on do change [CLS]: the mask is what keeps them out.
  assert not np.allclose(run(tower, v, pad_ids, jnp.ones_like(pad_mask), train=False)[0],
                         cls, atol=1e-4)
  with pytest.raises(ValueError, match="max_len"):
    run(tower, v, jnp.zeros((1, 17), jnp.int32), jnp.ones((1, 17), jnp.int32), train=False)


def test_cls_alone_through_the_last_layer_is_the_sequence_output_and_costs_less():
  """[CLS] takes its own path through the last layer (one query position): position 0 of
  the whole sequence, the same gradients, and a caller that reads only [CLS] compiles to a
  program without the last layer's other positions, with dropout in training too."""
  vocab, h, layers, mlp, length = 50, 16, 2, 32, 12
  ids = jax.random.randint(jax.random.key(1), (4, length), 1, vocab)
  mask = (jnp.arange(length)[None] < jnp.array([[12], [7], [3], [1]])).astype(jnp.int32)
  net = lambda rate: bert.Bert(vocab, h, h, layers, 4, mlp, length, dropout_rate=rate)
  # Jitted: op by op, this test compiled ~320 small programs. The rate changes no parameter.
  params = nn.unbox(jax.jit(lambda: net(0.0).init(jax.random.key(0), ids, mask, train=False))())["params"]
  for rate, train in ((0.0, True), (0.1, False), (0.1, True)):
    w = jax.random.normal(jax.random.key(2), (4, h))
    apply = lambda p: net(rate).apply({"params": p}, ids, mask, train=train, rngs={"dropout": jax.random.key(3)})

    def outputs_and_grads(p):  # One program for the four (each its own path; one compile, not 3).
      cls, aux = apply(p)
      return (cls, aux["sequence"][:, 0], jax.grad(lambda p: jnp.sum(apply(p)[0] * w))(p),
              jax.grad(lambda p: jnp.sum(apply(p)[1]["sequence"][:, 0] * w))(p))

    cls, seq0, g_cls, g_seq = jax.jit(outputs_and_grads)(params)
    np.testing.assert_array_equal(cls, seq0)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6), g_cls, g_seq)
    if train:  # The program of a caller that reads only [CLS] (a dual encoder's training step),
      # as JAX lowers it: unused outputs are dropped already (compiled by XLA: 0.58).
      flops = lambda f: jax.jit(f).lower(params).cost_analysis()["flops"]
      only_cls, whole = flops(lambda p: apply(p)[0]), flops(lambda p: apply(p)[1]["sequence"])
      assert only_cls < 0.75 * whole, (only_cls, whole)  # Measured: 0.55 (1.0 with one path).
  # The one-position path draws its own dropout masks in training: other keys, other outputs.
  layer = bert.EncoderLayer(4, mlp, 0.5)
  x = jax.random.normal(jax.random.key(5), (4, length, h))
  attention = nn.make_attention_mask(mask > 0, mask > 0)
  lv = jax.jit(lambda: layer.init(jax.random.key(0), x, attention, False))()
  run = jax.jit(lambda key: layer.apply(lv, x, attention, True, 1, rngs={"dropout": key}))
  assert run(jax.random.key(3)).shape == (4, 1, h)
  assert not np.allclose(run(jax.random.key(3)), run(jax.random.key(4)))


def test_bert_attention_has_flax_attentions_parameters_outputs_and_gradients():
  """bert.Attention against flax's MultiHeadDotProductAttention: the same parameter tree
  (names, shapes, logical axes), and with flax's parameters the same outputs and gradients,
  self-attention and one query position against the whole sequence (the [CLS] path)."""
  h, heads, length = 16, 4, 6
  init = nn.with_logical_partitioning(nn.initializers.normal(0.5), ("embed", "heads", "kv"))
  out_init = nn.with_logical_partitioning(nn.initializers.normal(0.5), ("heads", "kv", "embed"))
  bias = lambda names: nn.with_logical_partitioning(nn.initializers.normal(0.5), names)
  kw = dict(num_heads=heads, dropout_rate=0.0, kernel_init=init, bias_init=bias(("heads", "kv")),
            out_kernel_init=out_init, out_bias_init=bias(("embed",)))
  ours = bert.Attention(**kw)
  flax_mha = nn.MultiHeadDotProductAttention(**kw, force_fp32_for_softmax=True, deterministic=True)
  x = jax.random.normal(jax.random.key(1), (3, length, h))
  mask = nn.make_attention_mask(jnp.arange(length)[None] < jnp.array([[6], [4], [1]]),
                                jnp.arange(length)[None] < jnp.array([[6], [4], [1]]))
  # Jitted: op by op, each of their ~200 small ops compiles alone.
  theirs = jax.jit(lambda key: flax_mha.init(key, x, x, mask=mask))(jax.random.key(0))["params"]
  mine = jax.jit(lambda key: ours.init(key, x, x, mask, True))(jax.random.key(0))["params"]
  described = lambda tree: jax.tree.map(lambda p: (p.value.shape, p.names), tree,
                                        is_leaf=lambda p: isinstance(p, nn.Partitioned))
  assert described(mine) == described(theirs)
  params = nn.unbox(theirs)
  for q, m in ((x, mask), (x[:, :1], mask[:, :, :1])):
    f_ours = lambda p, q: ours.apply({"params": p}, q, x, m, True)
    f_flax = lambda p, q: flax_mha.apply({"params": p}, q, x, mask=m)
    w = jax.random.normal(jax.random.key(2), q.shape)
    outputs = lambda f: jax.jit(f)(params, q)
    grads = lambda f: jax.jit(jax.grad(lambda p, q: jnp.sum(f(p, q) * w), argnums=(0, 1)))(params, q)
    np.testing.assert_allclose(outputs(f_ours), outputs(f_flax), rtol=1e-5, atol=1e-5)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5),
                 grads(f_ours), grads(f_flax))


def test_factorised_token_embedding_is_projected():
  config = load_config("tiny").model.text
  config.token_embed_dim = 16
  net = bert.from_config(config, jnp.float32, jnp.float32)
  ids = jnp.zeros((2, 16), jnp.int32)
  variables = jax.eval_shape(lambda: net.init(jax.random.key(0), ids, ids, train=False))
  params = nn.unbox(variables["params"])
  assert params["token_embed"]["embedding"].shape == (1000, 16)
  assert params["token_proj"]["kernel"].shape == (16, 64)
  assert nn.get_partition_spec(variables)["params"]["token_embed"]["embedding"] == \
      jax.sharding.PartitionSpec("vocab", "token_embed")


# ---- Heads ---------------------------------------------------------------

def test_dense_and_mlp_heads_against_numpy():
  config = config_lib.base_config().model.heads
  config.embed_dim, config.mlp_hidden_dim = 6, 10
  x = jax.random.normal(jax.random.key(0), (4, 8))
  dense = heads.from_config(config, jnp.float32, jnp.float32)
  v = init(dense, x)
  p = jax.tree.map(np.asarray, nn.unbox(v["params"]))
  assert _count(p) == 8 * 6 + 6
  np.testing.assert_allclose(run(dense, v, x), np.asarray(x) @ p["dense"]["kernel"]
                             + p["dense"]["bias"], rtol=1e-5, atol=1e-6)

  config.kind = "mlp"
  mlp = heads.from_config(config, jnp.float32, jnp.float32)
  v = init(mlp, x)
  p = jax.tree.map(lambda a: np.asarray(a, np.float64), nn.unbox(v["params"]))
  assert _count(p) == 8 * 10 + 10 + 10 * 6 + 6
  hidden = np.asarray(x, np.float64) @ p["hidden"]["kernel"] + p["hidden"]["bias"]
  hidden = 0.5 * hidden * (1 + special.erf(hidden / np.sqrt(2)))
  np.testing.assert_allclose(run(mlp, v, x), hidden @ p["out"]["kernel"] + p["out"]["bias"],
                             rtol=1e-5, atol=1e-5)

  config.kind = "deep"
  with pytest.raises(config_lib.ConfigError, match="model.heads.kind"):
    heads.from_config(config, jnp.float32, jnp.float32)


# ---- DualEncoder ---------------------------------------------------------

def test_dual_encoder_embeds_through_named_heads(tiny):
  config, model, variables, batch, out = tiny
  d = config.model.heads.embed_dim
  for key in ("image_emb", "text_emb", "left_emb", "right_emb"):
    assert out[key].shape == (3, d) and out[key].dtype == jnp.float32
  assert out["temperature"].shape == () and np.isclose(out["temperature"], 1.0)
  assert set(variables["params"]) == {"image_tower", "text_tower", "i2t_head", "t2t_head", "log_temperature"}
  apply = lambda *args, **kw: run(model, variables, *args, **kw)
  # The two text heads differ; no head gives the tower's own output.
  i2t_of_left = apply(batch["left_ids"], batch["left_mask"], head="i2t", method="embed_texts")
  assert not np.allclose(i2t_of_left, out["left_emb"], atol=1e-3)
  raw = apply(batch["left_ids"], batch["left_mask"], head=None, method="embed_texts")
  assert raw.shape == (3, config.model.text.hidden_dim)
  head = variables["params"]["t2t_head"]["dense"]
  np.testing.assert_allclose(raw @ head["kernel"].value + head["bias"].value, out["left_emb"],
                             rtol=1e-5, atol=1e-5)
  with pytest.raises(KeyError, match="no head 'image'"):
    apply(batch["image"], head="image", method="embed_images")


def test_text_pair_task_embeds_both_sides_as_one_batch(tiny):
  """MURAL's t2t forward sends left and right rows through the tower together (one tower in the
  program): the embeddings of separate calls, row for row."""
  from mural.systems import mural as mural_system  # pylint: disable=g-import-not-at-top
  config, model, variables, batch, out = tiny
  task = mural_system.text_pair_task(config)
  got = run(model, variables, batch, method=lambda module, b: task.forward(module, b, False))
  np.testing.assert_allclose(got["left"], out["left_emb"], rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(got["right"], out["right_emb"], rtol=1e-5, atol=1e-6)
  assert not np.allclose(got["left"], got["right"], atol=1e-3)


def test_adding_a_head_renames_and_reinitialises_nothing(tiny):
  """A model with only the i2t head (ALIGN) has exactly the other model's params for it."""
  config, _, variables, batch, out = tiny
  align = models.build_model(config.model, ["i2t"])
  only_i2t = lambda m, b: (m.embed_images(b["image"]), m.embed_texts(b["text_ids"], b["text_mask"], "i2t"))
  align_vars = init(align, batch, method=only_i2t)
  assert set(align_vars["params"]) == set(variables["params"]) - {"t2t_head"}
  jax.tree.map(np.testing.assert_array_equal, align_vars["params"],
               {k: v for k, v in variables["params"].items() if k != "t2t_head"})
  image, text = run(align, align_vars, batch, method=only_i2t)
  np.testing.assert_allclose(text, out["text_emb"], rtol=1e-6)
  np.testing.assert_allclose(image, out["image_emb"], rtol=1e-6)


def test_bf16_compute_with_fp32_params(tiny):
  _, _, variables, batch, reference = tiny
  config = load_config("tiny")
  config.model.dtype = "bfloat16"
  model16 = models.build_model(config.model, ["i2t", "t2t"])
  shapes = jax.eval_shape(lambda: model16.init(jax.random.key(0), batch, method=embed_all))
  assert {x.dtype for x in jax.tree.leaves(shapes)} == {jnp.dtype(jnp.float32)}
  out, state = run(
      model16, variables, batch, method=embed_all, mutable=["intermediates"],
      capture_intermediates=lambda mdl, name: mdl.name in ("image_tower", "text_tower"))
  inter = state["intermediates"]
  assert inter["image_tower"]["__call__"][0][0].dtype == jnp.bfloat16
  assert inter["text_tower"]["__call__"][0][0].dtype == jnp.bfloat16
  for key in ("image_emb", "text_emb", "left_emb", "right_emb", "temperature"):
    assert out[key].dtype == jnp.float32
  for key in ("image_emb", "text_emb", "left_emb"):
    a, b = np.asarray(out[key]), np.asarray(reference[key])
    cosine = np.sum(a * b, -1) / np.linalg.norm(a, axis=-1) / np.linalg.norm(b, axis=-1)
    assert np.all(cosine > 0.98), (key, cosine)


def test_temperature_param_and_learn_flag(tiny):
  config = tiny[0]
  config.model.init_temperature = 0.5
  for learn, expected_grad in ((True, 1.0), (False, 0.0)):
    config.model.learn_temperature = learn
    model = models.build_model(config.model)
    temperature = lambda m: m.temperature()
    params = model.init(jax.random.key(0), method=temperature)["params"]
    assert np.isclose(nn.unbox(params["log_temperature"]), math.log(0.5))
    grad = jax.grad(lambda p: jnp.log(run(model, {"params": p}, method=temperature)))(nn.unbox(params))
    assert np.isclose(grad["log_temperature"], expected_grad)


def test_every_param_has_logical_names():
  """On tiny.py with every optional part: the names do not depend on sizes or depth (tracing
  mural_large's B7 and BERT-Large for the same check took 7.5 CPU-s)."""
  config = load_config("tiny")
  config.model.text.token_embed_dim = 32  # Factorised, as mural_large's: the 'proj' names.
  config.model.image.include_head, config.model.image.num_classes = True, 10
  config.model.heads.kind = "mlp"
  model = models.build_model(config.model, ["i2t", "t2t", "image"])
  variables = jax.eval_shape(lambda: model.init(
      jax.random.key(0), _batch(config, b=1), image_head="image", method=embed_all))
  params = variables["params"]
  boxed = jax.tree.leaves(params, is_leaf=lambda x: isinstance(x, nn.LogicallyPartitioned))
  assert boxed and all(isinstance(x, nn.LogicallyPartitioned) for x in boxed)
  specs = jax.tree.leaves(nn.get_partition_spec(params),
                          is_leaf=lambda x: isinstance(x, jax.sharding.PartitionSpec))
  assert len(specs) == len(boxed)
  for box, spec in zip(boxed, specs):
    assert len(spec) == box.value.ndim and set(spec) <= LOGICAL_NAMES, (box.names, box.value.shape)
    nn.logical_to_mesh_axes(spec, config.sharding_rules)  # Every name resolves.
  assert {x for spec in specs for x in spec} == LOGICAL_NAMES


def test_build_model_config_errors():
  from mural import system  # pylint: disable=g-import-not-at-top
  from mural.systems import mural  # pylint: disable=g-import-not-at-top
  config = load_config("tiny")
  config.model.heads.embed_dim = 96
  tasks = mural.tasks(config)
  with pytest.raises(config_lib.ConfigError, match=r"^config\.model\.heads\.embed_dim: "):
    mural.build_model(config, tasks)
  config.tasks.i2t.image_head = "image"  # An image head maps 80 -> 96 instead.
  tasks = mural.tasks(config)
  model = mural.build_model(config, tasks)
  variables = jax.eval_shape(lambda: system.init_variables(model, tasks, config, jax.random.key(0)))
  assert {"image_head", "i2t_head", "t2t_head"} <= set(variables["params"])
  batch = _batch(config, b=1)
  shapes = jax.eval_shape(lambda v: run(model, v, batch, image_head="image", method=embed_all), variables)
  assert shapes["image_emb"].shape == (1, 96) and shapes["text_emb"].shape == (1, 96)
  for field, value in (("image.variant", "b9"), ("image.num_stages", 0), ("image.num_stages", 8),
                       ("image.name", "vit"), ("text.name", "t5")):
    config = load_config("tiny")
    section, name = field.split(".")
    config.model[section][name] = value
    with pytest.raises(config_lib.ConfigError, match=rf"^config\.model\.{field}: "):
      models.build_model(config.model)


@pytest.mark.parametrize("name", ["mule", "smalr", "kadar", "globetrotter"])
def test_each_system_names_an_image_tower_missing_from_the_table(name):
  config = systems.SYSTEMS[name].get_config()
  config.model.image.name = "vit"
  with pytest.raises(config_lib.ConfigError, match=r"^config\.model\.image\.name: 'vit' not in \["):
    systems.SYSTEMS[name].system.build_model(config, ())


def test_remat_changes_no_parameter_name_nor_gradient():
  """Every remat policy computes the same loss, gradients and batch statistics (train mode:
  dropout, drop-connect and batch norm included) from the same parameter tree. The tiny tower's
  first 2 stages (a block without and one with expansion; 8 x 8 at the last one), one text layer
  and batch 8. (The 7-stage tower is 1 x 1 at its last stages at 32 px, where batch norm over a
  handful of values per channel amplified round-off between two fusions of the same maths to 1e-3;
  this test ran at 64 px.)"""

  def shallow():  # Pooled width: round_filters(24, 0.25).
    return set_fields(load_config("tiny"), **{"model.image.num_stages": 2, "model.heads.embed_dim": 8,
                                              "model.text.num_layers": 1})

  batch = _batch(shallow(), b=8)
  variables = init(models.build_model(shallow().model, ["i2t", "t2t"]), batch, method=embed_all)

  def loss_and_grads(policy):
    c = shallow()
    c.model.image.remat = c.model.text.remat = policy
    model = models.build_model(c.model, ["i2t", "t2t"])
    assert jax.tree.structure(jax.eval_shape(lambda: init(model, batch, method=embed_all))) == \
        jax.tree.structure(variables)  # The same names: checkpoints load across policies.

    def loss(params):
      out, state = model.apply({"params": params, "batch_stats": variables["batch_stats"]}, batch,
                               method=_train_embed, mutable=["batch_stats"],
                               rngs={"dropout": jax.random.key(1)})
      return sum(jnp.sum(jnp.sin(v)) for v in out.values()), state["batch_stats"]

    return jax.jit(jax.value_and_grad(loss, has_aux=True))(variables["params"])

  (want, want_stats), want_grads = loss_and_grads("none")
  scale = max(float(np.max(np.abs(g))) for g in jax.tree.leaves(want_grads))
  for policy in ("full", "dots"):
    (got, got_stats), got_grads = loss_and_grads(policy)
    np.testing.assert_allclose(got, want, rtol=1e-6)
    for g, w in zip(jax.tree.leaves(got_grads), jax.tree.leaves(want_grads)):
      np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6 * scale)
    for g, w in zip(jax.tree.leaves(got_stats), jax.tree.leaves(want_stats)):
      np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)
  config = load_config("tiny")
  config.model.text.remat = "some"
  with pytest.raises(config_lib.ConfigError, match=r"^config\.model\.text\.remat: 'some' not in "):
    systems.validate(config)
  with pytest.raises(config_lib.ConfigError, match=r"^config\.model\.text\.remat: "):
    models.build_model(config.model)


def _train_embed(module, batch):
  """embed_all in train mode (dropout, drop-connect, batch statistics)."""
  return {"image_emb": module.embed_images(batch["image"], None, train=True),
          "text_emb": module.embed_texts(batch["text_ids"], batch["text_mask"], "i2t", train=True),
          "left_emb": module.embed_texts(batch["left_ids"], batch["left_mask"], "t2t", train=True)}
