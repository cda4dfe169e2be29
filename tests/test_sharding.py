"""mural.sharding: mesh sizes, the divisibility fallback, and sharded training == 1 device.

The equivalence test runs the tiny model for 10 steps on 8 forced CPU devices
as one 2x2x2 mesh (data x fsdp x model: every axis at once, one compile) in a
subprocess (the device count is fixed at JAX start-up), then on 1 CPU device in
the test's own process. Losses must agree to 1e-4
relative: the in-batch softmax and batch-norm statistics are over the global
batch whatever the mesh. The 1-device run is test_train's tiny program (same
model, optimizer, total_steps and shardings), so under the persistent
compilation cache it compiles nothing.
"""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from conftest import ROOT, load_config, tiny_config, xla_flags  # ml_collections only: imports no JAX.
MESHES = {"2x2x2": (2, 2, 2)}  # Pure data parallelism over 8: tests/test_ring_loss.py.


def tiny(vocab_path):
  return tiny_config(vocab_path, languages=("en", "de"), eval_every_steps=0, checkpoint_every_steps=10,
                     shard_min_size=0)  # Shard even the tiny model's small tensors.


# ---- Pure parts ------------------------------------------------------------------


def test_mesh_shape_fills_the_free_axis():
  from mural import sharding
  m = lambda d, f, mo: dict(data=d, fsdp=f, model=mo)
  assert sharding.mesh_shape(m(-1, 1, 1), 8) == (8, 1, 1)
  assert sharding.mesh_shape(m(2, -1, 1), 8) == (2, 4, 1)
  assert sharding.mesh_shape(m(-1, 2, 2), 8) == (2, 2, 2)
  assert sharding.mesh_shape(m(2, 2, 2), 8) == (2, 2, 2)


@pytest.mark.parametrize("mesh,message", [
    ((-1, -1, 1), "at most one axis"), ((3, -1, 1), "multiple of 3"), ((2, 2, 1), "uses 4 devices")])
def test_mesh_shape_errors_name_config_mesh(mesh, message):
  from mural import config_lib
  from mural import sharding
  with pytest.raises(config_lib.ConfigError, match=rf"^config\.mesh: .*{message}"):
    sharding.mesh_shape(dict(zip(sharding.MESH_AXES, mesh)), 8)


class _FakeMesh:  # fit_spec only reads mesh.shape.
  shape = {"data": 2, "fsdp": 4, "model": 2}


def test_fit_spec_replicates_dims_the_mesh_does_not_divide():
  from jax.sharding import PartitionSpec as P
  from mural import sharding
  mesh = _FakeMesh()
  assert sharding.fit_spec(P("fsdp", "model"), (8, 6), mesh) == P("fsdp", "model")
  assert sharding.fit_spec(P("fsdp", "model"), (6, 8), mesh) == P(None, "model")
  assert sharding.fit_spec(P("model", "fsdp"), (1000, 10), mesh) == P("model")
  assert sharding.fit_spec(P(("data", "fsdp")), (12,), mesh) == P()  # 12 % 8 != 0.
  assert sharding.fit_spec(P("fsdp", "model"), (8, 8), mesh, min_size=100) == P()


def test_fit_spec_moves_fsdp_to_the_largest_dim_it_divides():
  from jax.sharding import PartitionSpec as P
  from mural import sharding
  mesh = _FakeMesh()
  fit = lambda spec, shape: sharding.fit_spec(spec, shape, mesh, fsdp_fallback=True)
  assert fit(P(None, "fsdp"), (1000, 6)) == P("fsdp")  # 6 % 4: FSDP moves to the 1000 dim.
  assert fit(P(None, None, None, "fsdp"), (3, 3, 16, 6)) == P(None, None, "fsdp")
  assert fit(P("model", None), (6, 12)) == P("model")  # The rules keep it off fsdp.
  assert fit(P("fsdp", "model"), (6, 8)) == P(None, "model")  # No free dim it divides.
  assert fit(P("fsdp"), (8,)) == P("fsdp")  # Already used: unchanged.


def test_rules_validation_names_the_rule():
  from mural import config_lib
  c = load_config()
  c.sharding_rules = [("embed", "fsdp"), ("mlp", "tensor")]
  with pytest.raises(config_lib.ConfigError, match=r"^config\.sharding_rules\[1\]: mesh axis 'tensor'"):
    config_lib.validate(c)


# ---- Sharded training equals single-device training ------------------------------


def _train_on_mesh(workdir: str, vocab_path: str, name: str) -> dict:
  """Trains on one mesh: its losses, shardings, first batch-norm statistics and bytes."""
  import jax
  from mural import sharding
  from mural import train
  config = tiny(vocab_path)
  if name in MESHES:
    config.mesh.data, config.mesh.fsdp, config.mesh.model = MESHES[name]
  else:  # 1 device: nothing to shard; the default shard_min_size makes it test_train's program.
    config.mesh.data, config.mesh.fsdp, config.mesh.model = (1, 1, 1)
    config.shard_min_size = load_config().shard_min_size
  result = train.train_and_evaluate(config, os.path.join(workdir, name), evaluators=[])
  state = result["state"]
  losses = [json.loads(l)["loss"] for l in open(os.path.join(workdir, name, "metrics.jsonl"))]
  params = sharding.describe(jax.tree.map(lambda x: x.sharding, state.params))
  mu = sharding.describe(jax.tree.map(lambda x: x.sharding, state.opt_state))
  stats = jax.tree.leaves(jax.device_get(state.batch_stats))
  device0 = jax.devices()[0]
  on_device0 = lambda tree: sum(s.data.nbytes for x in jax.tree.leaves(tree) for s in x.addressable_shards
                                if s.device == device0)
  return dict(
      mesh=name, devices=jax.device_count(), losses=losses, params=params, opt_state=mu,
      batch_stats=[np.asarray(s).ravel()[:8].tolist() for s in stats[:6]],
      bytes=dict(params=sum(x.nbytes for x in jax.tree.leaves(state.params)),
                 params_device0=on_device0(state.params),
                 opt_state=sum(x.nbytes for x in jax.tree.leaves(state.opt_state)),
                 opt_state_device0=on_device0(state.opt_state)))


def _worker(workdir: str, vocab_path: str, meshes):
  """Runs in a subprocess: trains on each mesh, prints one JSON line per mesh."""
  for name in meshes:
    print("RESULT " + json.dumps(_train_on_mesh(workdir, vocab_path, name)), flush=True)


def _start_worker(workdir, vocab_path, devices, meshes):
  """Popen of the worker; output goes to files."""
  env = dict(os.environ, JAX_PLATFORMS="cpu", TF_CPP_MIN_LOG_LEVEL="3",
             XLA_FLAGS=xla_flags(f"--xla_force_host_platform_device_count={devices}"))
  workdir.mkdir(parents=True)
  out, err = open(workdir / "stdout.txt", "w"), open(workdir / "stderr.txt", "w")
  return workdir, subprocess.Popen([sys.executable, __file__, str(workdir), vocab_path, *meshes],
                                   cwd=ROOT, env=env, stdout=out, stderr=err)


def _results(worker):
  workdir, proc = worker
  try:
    proc.wait(timeout=1800)  # A hang guard: ~3 min on 2 idle cores, far more on a shared machine.
  finally:
    if proc.poll() is None:
      proc.kill()
  out, err = (workdir / "stdout.txt").read_text(), (workdir / "stderr.txt").read_text()
  assert proc.returncode == 0, out[-3000:] + err[-3000:]
  results = [json.loads(l[len("RESULT "):]) for l in out.splitlines() if l.startswith("RESULT ")]
  return {r["mesh"]: r for r in results}


def test_sharded_training_matches_one_device(tmp_path, tiny_vocab):
  eight = _start_worker(tmp_path / "eight", tiny_vocab, 8, list(MESHES))
  sharded = _results(eight)
  assert sorted(sharded) == sorted(MESHES)
  # The 1-device run, in this process (it has 1 CPU device), after the subprocess: by then
  # test_train has compiled its program into the persistent cache.
  single = _train_on_mesh(str(tmp_path / "one"), tiny_vocab, "1x1x1")
  assert single["devices"] == 1, single["devices"]
  want = np.asarray(single["losses"])
  assert len(want) == 10 and np.all(np.isfinite(want))
  for name, run in sharded.items():
    assert run["devices"] == 8
    got = np.asarray(run["losses"])
    rel = np.max(np.abs(got - want) / np.abs(want))
    print(f"{name}: max relative loss difference over 10 steps {rel:.2e}")
    assert rel < 1e-4, (name, got, want)
    # Batch-norm statistics are global-batch moments on every mesh.
    np.testing.assert_allclose(np.asarray(run["batch_stats"]), np.asarray(single["batch_stats"]),
                               rtol=1e-3, atol=1e-5)
    print(name, "bytes on device 0 / in all:", run["bytes"])
  # What the mesh saves: FSDP 2 x model 2 holds a quarter of each matrix and of its
  # moments on a device; biases, norms and the temperature stay whole (measured: 37%
  # of the parameters and 33% of the optimizer state, where FSDP 2 alone would be >50%).
  b, one = sharded["2x2x2"]["bytes"], single["bytes"]
  assert b["params"] == one["params"] and b["opt_state"] == one["opt_state"], (b, one)
  for kind in ("params", "opt_state"):
    assert 0.25 * b[kind] < b[f"{kind}_device0"] < 0.4 * b[kind], b

  params = sharded["2x2x2"]["params"]
  assert params["text_tower/layer_0/mlp_in/kernel"] == "P('fsdp', 'model')"
  assert params["text_tower/layer_0/mlp_out/kernel"] == "P('model', 'fsdp')"
  assert params["text_tower/layer_0/attention/query/kernel"] == "P('fsdp', 'model')"
  assert params["text_tower/token_embed/embedding"] == "P('model', 'fsdp')"
  assert params["i2t_head/dense/kernel"] == "P('fsdp',)"
  assert params["text_tower/embed_norm/scale"] == "P()"
  assert params["log_temperature"] == "P()"
  # Adam moments follow their parameter; counters are replicated.
  opt_state = sharded["2x2x2"]["opt_state"]
  moments = {k: v for k, v in opt_state.items() if k.endswith("layer_0/mlp_in/kernel")}
  assert moments and set(moments.values()) == {"P('fsdp', 'model')"}
  counts = {k: v for k, v in opt_state.items() if k.endswith("count")}
  assert counts and set(counts.values()) == {"P()"}

if __name__ == "__main__":
  _worker(sys.argv[1], sys.argv[2], sys.argv[3:])
