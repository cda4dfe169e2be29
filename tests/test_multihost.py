"""Two processes x 4 CPU devices (jax.distributed + gloo) on one 2x2x2 mesh train like 1 device.

launch/local_multiprocess.py starts this file as a worker in 2 processes on
127.0.0.1; the reference runs after them in the test's own process, on its one
CPU device. Both runs read the same global batches: each worker takes the
1-process stream and keeps its own half of every batch (the real pipeline
shards by process, which would give the two runs different data). What is
tested is the trainer across hosts and across every mesh axis at once (data x
fsdp x model, the tiny model's small tensors sharded too): jax.distributed
set-up, batches built with make_array_from_process_local_data, collectives
over gloo, losses and global batch-norm statistics equal to 1 device's, where
each parameter and moment lives and what a device holds, orbax checkpoints
written by both processes (with both processes' input state), and evaluation
embedding on a mesh that spans processes. (One run for both concerns: a
separate 8-device single-process run compiled the same partitioned step
again; pure data parallelism over 8 devices is in tests/test_ring_loss.py.)
"""

import argparse
import json
import os
import subprocess
import sys
import time

import numpy as np
import pytest

# ml_collections only: no JAX.
from conftest import ROOT, HookedIterator, collect_garbage_less, tiny_config
# No persistent compilation cache in the workers: a process that loads an
# executable compiled for another process layout (a 1 x 4 run has the same HLO)
# runs different collectives than its peer, and gloo fails with a size mismatch.
NO_CACHE = dict(JAX_ENABLE_COMPILATION_CACHE="false")
STEPS = 10  # configs/tiny.py's total_steps.


def tiny(vocab_path, devices=8):
  config = tiny_config(vocab_path, languages=("en", "de"),
                       eval_every_steps=0,  # Only the final evaluation.
                       checkpoint_every_steps=5)  # One checkpoint mid-run, one at the end.
  assert config.total_steps == STEPS
  if devices > 1:
    config.mesh.data, config.mesh.fsdp, config.mesh.model = 2, 2, 2  # Every axis, across processes.
    config.shard_min_size = 0  # Shard even the tiny model's small tensors.
  return config


def sharding_facts(state):
  """Where each parameter and optimizer-state leaf lives, the bytes of this process's first
  device against the whole, and the first batch-norm statistics."""
  import jax  # pylint: disable=g-import-not-at-top
  from mural import sharding  # pylint: disable=g-import-not-at-top
  device0 = jax.local_devices()[0]
  on_device0 = lambda tree: sum(s.data.nbytes for x in jax.tree.leaves(tree) for s in x.addressable_shards
                                if s.device == device0)
  return dict(
      params=sharding.describe(jax.tree.map(lambda x: x.sharding, state.params)),
      opt_state=sharding.describe(jax.tree.map(lambda x: x.sharding, state.opt_state)),
      batch_stats=[sharding.to_host(s).ravel()[:8].tolist() for s in jax.tree.leaves(state.batch_stats)[:6]],
      bytes=dict(params=sum(x.nbytes for x in jax.tree.leaves(state.params)),
                 params_device0=on_device0(state.params),
                 opt_state=sum(x.nbytes for x in jax.tree.leaves(state.opt_state)),
                 opt_state_device0=on_device0(state.opt_state)))


def process_slice(inner, index, count):
  """This process's consecutive rows of every batch of a 1-process iterator."""

  def rows(batch):
    n = lambda v: v.shape[0] // count
    return {task: {k: v[index * n(v):(index + 1) * n(v)] for k, v in arrays.items()}
            for task, arrays in batch.items()}

  return HookedIterator(inner, None, rows)


def _worker():
  parser = argparse.ArgumentParser()
  parser.add_argument("workdir")
  parser.add_argument("vocab_path")
  parser.add_argument("--coordinator_address")
  parser.add_argument("--num_processes", type=int)
  parser.add_argument("--process_id", type=int)
  a = parser.parse_args()
  import jax
  from mural import distributed
  distributed.initialize(a.coordinator_address, a.num_processes, a.process_id)
  from mural import train
  from mural.data import pipeline
  from mural.data import vocab
  collect_garbage_less()
  config = tiny(a.vocab_path)
  tasks = train.build(config).tasks
  stream = pipeline.build_train_iterator(config, tasks, vocab.tokenizer(config, tasks, a.workdir),
                                         process_index=0, process_count=1)
  result = train.train_and_evaluate(
      config, a.workdir, train_iter=process_slice(stream, jax.process_index(), jax.process_count()))
  print("RESULT " + json.dumps(dict(process=jax.process_index(), processes=jax.process_count(),
                                    devices=jax.device_count(), local=jax.local_device_count(),
                                    eval=result["eval"], **sharding_facts(result["state"]))), flush=True)


def _losses(workdir):
  return [json.loads(l)["loss"] for l in (workdir / "metrics.jsonl").read_text().splitlines()]


def test_two_processes_match_one_process(tmp_path, tiny_vocab):
  vocab_path = tiny_vocab
  two = tmp_path / "two"
  with open(tmp_path / "two.log", "w") as out, open(tmp_path / "two.err", "w") as err:
    pair = subprocess.Popen([sys.executable, "launch/local_multiprocess.py", "--num_processes=2",
                             "--devices_per_process=4", f"--script={__file__}", "--", str(two), vocab_path],
                            cwd=ROOT, env=dict(os.environ, **NO_CACHE, TF_CPP_MIN_LOG_LEVEL="3"), stdout=out,
                            stderr=err, text=True)
  try:
    pair.wait(timeout=1200)  # A hang guard: ~2 min on 2 idle cores, far more on a shared machine.
  finally:
    if pair.poll() is None:
      pair.kill()
  # Reference, after the pair (the two cores are theirs meanwhile): one process, one device, the
  # same global batches.
  from mural import train  # pylint: disable=g-import-not-at-top
  one = tmp_path / "one"
  single = train.train_and_evaluate(tiny(vocab_path, devices=1), str(one))
  want_eval, want_stats = single["eval"], sharding_facts(single["state"])["batch_stats"]
  r = subprocess.CompletedProcess(pair.args, pair.returncode, (tmp_path / "two.log").read_text(),
                                  (tmp_path / "two.err").read_text())
  assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]
  results = [json.loads(l.split("RESULT ", 1)[1]) for l in r.stdout.splitlines() if "RESULT " in l]
  assert sorted(x["process"] for x in results) == [0, 1]
  assert all(x["processes"] == 2 and x["devices"] == 8 and x["local"] == 4 for x in results)

  # The in-batch softmax and batch-norm statistics are over the global batch whatever the mesh.
  got, want = np.asarray(_losses(two)), np.asarray(_losses(one))
  assert len(got) == STEPS and np.all(np.isfinite(got))
  rel = np.max(np.abs(got - want) / np.abs(want))
  print(f"2 processes x 4 devices (2x2x2) vs 1 x 1: max relative loss difference {rel:.2e}")
  assert rel < 1e-4, (got, want)
  for x in results:
    np.testing.assert_allclose(np.asarray(x["batch_stats"]), np.asarray(want_stats), rtol=1e-3, atol=1e-5)
  _assert_2x2x2_placement(results[0])
  # Both processes computed the same evaluation, equal to the 1-device one.
  for x in results:
    assert x["eval"].keys() == want_eval.keys()
    for k, v in want_eval.items():
      assert x["eval"][k] == pytest.approx(v, abs=1e-6), k
  # One checkpoint per save, written jointly, holding both processes' input state.
  assert sorted(int(p.name) for p in (two / "checkpoints").iterdir() if p.name.isdigit()) == [5, STEPS]
  data = json.loads((two / "checkpoints" / str(STEPS) / "data" / "metadata").read_text())
  assert data["process_count"] == 2 and len(data["processes"]) == 2
  assert data["processes"][0] == data["processes"][1]  # Both read the same 1-process stream.


def _assert_2x2x2_placement(facts):
  """FSDP 2 x model 2 holds a quarter of each matrix and of its moments on a device; biases,
  norms and the temperature stay whole (measured on the training tests' tiny towers: 26.1% of the
  parameters and 25.9% of the optimizer state, where FSDP 2 alone would be > 50%)."""
  b = facts["bytes"]
  for kind in ("params", "opt_state"):
    assert 0.25 * b[kind] < b[f"{kind}_device0"] < 0.4 * b[kind], b
  params = facts["params"]
  assert params["text_tower/layer_0/mlp_in/kernel"] == "P('fsdp', 'model')"
  assert params["text_tower/layer_0/mlp_out/kernel"] == "P('model', 'fsdp')"
  assert params["text_tower/layer_0/attention/query/kernel"] == "P('fsdp', 'model')"
  assert params["text_tower/token_embed/embedding"] == "P('model', 'fsdp')"
  assert params["i2t_head/dense/kernel"] == "P('fsdp',)"
  assert params["text_tower/embed_norm/scale"] == "P()"
  assert params["log_temperature"] == "P()"
  # Adam moments follow their parameter; counters are replicated.
  moments = {k: v for k, v in facts["opt_state"].items() if k.endswith("layer_0/mlp_in/kernel")}
  assert moments and set(moments.values()) == {"P('fsdp', 'model')"}
  counts = {k: v for k, v in facts["opt_state"].items() if k.endswith("count")}
  assert counts and set(counts.values()) == {"P()"}


if __name__ == "__main__":
  _worker()


_DYING_PEER = """
import argparse, os, sys, time
p = argparse.ArgumentParser()
p.add_argument("--coordinator_address"); p.add_argument("--num_processes", type=int)
p.add_argument("--process_id", type=int)
a = p.parse_args()
import jax
jax.config.update("jax_cpu_collectives_implementation", "gloo")
jax.distributed.initialize(a.coordinator_address, a.num_processes, a.process_id, heartbeat_timeout_seconds=30)
if a.process_id == 1:
  os._exit(3)  # Dies (no clean shutdown) before the collective its peer waits in.
from jax.experimental import multihost_utils
multihost_utils.sync_global_devices("never_met")
time.sleep(600)
"""


def test_launcher_names_a_dead_process_and_stops_the_rest(tmp_path):
  script = tmp_path / "dying_peer.py"
  script.write_text(_DYING_PEER)
  start = time.time()
  r = subprocess.run([sys.executable, "launch/local_multiprocess.py", "--num_processes=2",
                      "--devices_per_process=1", "--grace_s=1", f"--script={script}"], cwd=ROOT,
                     env=dict(os.environ, **NO_CACHE, TF_CPP_MIN_LOG_LEVEL="3"), capture_output=True,
                     text=True, timeout=300)
  elapsed = time.time() - start
  assert r.returncode == 3, r.stdout[-2000:] + r.stderr[-2000:]
  assert "local_multiprocess: process 1 exited with code 3; stopping the other 1 process(es)." in r.stderr
  assert elapsed < 60, elapsed


def test_launched_processes_leave_ctrl_c_to_the_launcher(tmp_path):
  """A terminal's Ctrl-C reaches the whole process group: the processes ignore SIGINT (Python then
  raises no KeyboardInterrupt) and stop on the SIGTERM the launcher forwards, after a checkpoint."""
  script = tmp_path / "report_sigint.py"
  script.write_text("import signal\nprint('SIGINT ignored:', signal.getsignal(signal.SIGINT) is signal.SIG_IGN)\n")
  r = subprocess.run([sys.executable, "launch/local_multiprocess.py", "--num_processes=2",
                      "--devices_per_process=1", f"--script={script}"], cwd=ROOT,
                     capture_output=True, text=True, timeout=120)
  assert r.returncode == 0, r.stderr[-2000:]
  assert sorted(l for l in r.stdout.splitlines() if "SIGINT" in l) == [
      "[0] SIGINT ignored: True", "[1] SIGINT ignored: True"], r.stdout
