"""What starting mural loads and prints: TensorFlow only where the input side needs it, and its
CUDA probe on a machine without CUDA prints nothing through mural's entry points."""

import os
import subprocess
import sys

from conftest import ROOT
from mural import data


def test_cuda_probe_lines_are_dropped_and_other_lines_kept(capfd):
  with data._without_cuda_probe_lines():  # pylint: disable=protected-access
    os.write(2, b"I0000 cudart_stub.cc:31] Could not find cuda drivers\nkept line\n"
                b"E0000 cuda_platform.cc:52] failed call to cuInit: UNKNOWN ERROR (303)\n")
    print("also kept", file=sys.stderr)
  # (Under capfd, sys.stderr is pytest's own stream, not fd 2: the order between the two may vary.)
  assert sorted(capfd.readouterr().err.splitlines()) == ["also kept", "kept line"]


def test_tensorflow_started_as_mural_starts_it_prints_no_cuda_nor_onednn_lines():
  """TensorFlow's CUDA probe (filtered) and its oneDNN rewrites (off by mural's default) write
  lines at import that no log level reaches."""
  env = {k: v for k, v in os.environ.items() if k not in ("TF_CPP_MIN_LOG_LEVEL", "TF_ENABLE_ONEDNN_OPTS")}
  code = "from mural import data; data.set_tensorflow_env_defaults(); data.hide_accelerators_from_tensorflow()"
  r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
  assert r.returncode == 0, r.stderr[-2000:]
  for mark in ("cudart_stub", "cuda_platform", "cuInit", "InitializeLog", "oneDNN"):
    assert mark not in r.stderr, r.stderr


def test_building_the_model_and_step_loads_no_tensorflow():
  """A benchmark, an export or a GPU host without TensorFlow builds the towers and step without it."""
  code = ("import sys; sys.path.insert(0, 'tests'); import conftest; from mural import train, export; "
          "setup = train.build(conftest.tiny_config()); train.jit_train_step(setup); "
          "print(sorted(t.name for t in setup.tasks), [m for m in ('tensorflow', 'clu') if m in sys.modules])")
  r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
  assert r.returncode == 0, r.stderr[-2000:]
  assert r.stdout.split("\n")[-2] == "['i2t', 't2t'] []", r.stdout
