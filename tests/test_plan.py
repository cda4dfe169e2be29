"""--mode=plan: the compiled train step's memory per device on N fake CPU devices (mural/plan.py)."""

import json
import os
import subprocess
import sys

from conftest import ROOT, TINY_FEATURES, TINY_STAGES, load_config, set_fields  # No JAX imported.

# The interface scripts read (issue 13), at least these keys.
KEYS = ("devices", "mesh", "global_batch", "dtype", "params_bytes_per_device", "opt_state_bytes_per_device",
        "temp_bytes_per_device", "total_bytes_per_device", "flops_per_step")
# configs/tiny.py with the training tests' shallower towers (conftest.tiny_config): the plan's
# figures do not depend on depth, and its 8-device step compiles in less.
SHALLOW = {"model.image.num_stages": TINY_STAGES, "model.text.num_layers": 1,
           "model.heads.embed_dim": TINY_FEATURES}


def _main(*args, timeout=900):
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
  return subprocess.run([sys.executable, "-m", "mural.main", "--config=configs/tiny.py", *args],
                        cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)


def test_plan_on_eight_fake_devices_prints_a_table_and_json():
  # 2-way data x 4-way FSDP, every tensor sharded where its axes allow.
  proc = _main("--mode=plan", "--devices=8", "--config.mesh.data=2", "--config.mesh.fsdp=4",
               "--config.shard_min_size=0", *(f"--config.{k}={v}" for k, v in SHALLOW.items()))
  assert proc.returncode == 0, proc.stderr[-3000:]
  lines = proc.stdout.strip().splitlines()
  assert lines[0].startswith("Plan: 8 devices, mesh {'data': 2, 'fsdp': 4, 'model': 1}"), lines[0]
  plan = json.loads(lines[-1])
  assert set(KEYS) <= set(plan)
  assert plan["devices"] == 8 and plan["mesh"] == {"data": 2, "fsdp": 4, "model": 1}
  assert plan["global_batch"] == {"i2t": 8, "t2t": 8} and plan["dtype"] == "float32"
  from mural import describe  # pylint: disable=g-import-not-at-top
  param_bytes = 4 * describe.describe(set_fields(load_config("tiny"), **SHALLOW))["total"]  # float32.
  # FSDP over 4 devices: each holds between a quarter (all sharded) and all of the parameters.
  assert param_bytes / 4 <= plan["params_bytes_per_device"] < 0.6 * param_bytes
  # Two LAMBs (Adam's two moments each, over the parameters each task trains), sharded alike.
  assert 2 * plan["params_bytes_per_device"] < plan["opt_state_bytes_per_device"] \
      <= 4 * plan["params_bytes_per_device"] + 1024
  # The step's arguments are the sharded state plus this device's batch rows.
  state = (plan["params_bytes_per_device"] + plan["opt_state_bytes_per_device"]
           + plan["batch_stats_bytes_per_device"])
  assert state < plan["argument_bytes_per_device"] < state + 100_000
  assert plan["total_bytes_per_device"] == (plan["argument_bytes_per_device"] + plan["output_bytes_per_device"]
                                            - plan["alias_bytes_per_device"] + plan["temp_bytes_per_device"])
  assert plan["alias_bytes_per_device"] > 0.9 * state  # The donated state is updated in place.
  # XLA's count for this step is 5.3e7 (the one text layer runs [CLS] alone): not 0, not a unit off.
  assert 2e7 < plan["flops_per_step"] < 2e8 and all(plan["fits"].values())


def test_devices_flag_errors_are_one_line():
  for args, message in ((("--mode=describe", "--devices=8"), "--devices: only for --mode=plan"),
                        (("--mode=plan", "--devices=0"), "--devices: must be >= 1, got 0")):
    proc = _main(*args, timeout=120)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert proc.stderr.strip().splitlines()[-1].endswith(message), proc.stderr[-2000:]


def test_a_step_bigger_than_the_device_is_refused_with_its_figures():
  """device_memory.check_fits: XLA's memory analysis of the compiled program (arguments + outputs - aliased +
  temporaries) and a frozen backbone's constants against what the device has; on the CPU the
  host's RAM over its devices."""
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  import pytest  # pylint: disable=g-import-not-at-top
  from mural import device_memory  # pylint: disable=g-import-not-at-top
  from mural.state import TrainingError  # pylint: disable=g-import-not-at-top
  x = jax.ShapeDtypeStruct((512, 1024), jnp.float32)  # 2 MiB.
  compiled = jax.jit(lambda a, b: jnp.sin(a @ b.T) @ b).lower(x, x).compile()
  memory = compiled.memory_analysis()
  assert memory.argument_size_in_bytes == 2 * 2**21 and memory.output_size_in_bytes == 2**21
  need = device_memory.step_bytes(memory)
  assert need == 3 * 2**21 - memory.alias_size_in_bytes + memory.temp_size_in_bytes
  assert memory.temp_size_in_bytes >= 2**20  # The [512, 512] product.
  device_memory.check_fits(compiled, have=need)
  mib = f"{need / 2**20:.2f} MiB"
  with pytest.raises(TrainingError, match=rf"^the train step needs {mib} per device \(4\.00 MiB state and "
                     rf"batch, .* more than the {mib} a cpu device has here: lower"):
    device_memory.check_fits(compiled, have=need - 1)
  with pytest.raises(TrainingError, match=r"XLA's memory analysis; 1\.00 MiB a frozen backbone's constants\)"):
    device_memory.check_fits(compiled, constants=2**20, have=need + 2**20 - 1)  # Constants: not in the analysis.
  device_memory.check_fits(compiled, constants=2**20, have=need + 2**20)
  ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
  assert 0 < device_memory.device_memory_bytes() <= ram // jax.local_device_count()


def test_ctrl_c_while_planning_is_one_line_and_exit_130():
  """Ctrl-C while a paper-size plan compiles: one line and exit 130 at once (a normal interpreter
  exit under XLA's compiling threads crashed with SIGSEGV)."""
  import signal  # pylint: disable=g-import-not-at-top
  import time  # pylint: disable=g-import-not-at-top
  # The child inherits SIGINT ignored if this process ignores it; a Python handler here is
  # the default there (no preexec_fn: a fork of this multithreaded JAX process may deadlock).
  previous = signal.signal(signal.SIGINT, signal.default_int_handler)
  try:
    proc = subprocess.Popen([sys.executable, "-m", "mural.main", "--config=configs/mule.py", "--mode=plan"],
                            cwd=ROOT, env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
  finally:
    signal.signal(signal.SIGINT, previous)
  try:
    start, lines = time.time(), []
    while time.time() - start < 30:  # The plan's line once JAX is up, then ~40 s of compile.
      lines.append(proc.stderr.readline())
      if "Planning for " in lines[-1] or not lines[-1]:
        break
    time.sleep(1)
    assert proc.poll() is None, "".join(lines)[-2000:]
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
  finally:
    proc.kill()
  assert proc.returncode == 130, err[-2000:]
  assert err.strip().splitlines()[-1] == "mural: error: interrupted (Ctrl-C) in --mode=plan"
