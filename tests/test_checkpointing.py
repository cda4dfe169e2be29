"""Unreadable checkpoints: moved aside with one warning, the previous step restored, or one error.

One reference run (10 steps, checkpoints at 2, 4, ..., 10) and one run stopped
by SIGTERM at step 4 (checkpoints 2 and 4); each test corrupts a copy of the
stopped run. Every run has the same config, so the train step compiles once
(JAX's persistent cache makes the later compiles a lookup); it is test_train's
program too (10 steps: the same learning-rate schedule), so with test_train
run first (tests/conftest.py orders the files) it compiles nothing.
"""

import json
import logging
import os
import pathlib
import shutil
import subprocess
import sys

import jax
import numpy as np
import pytest

from conftest import ROOT, HookedIterator, sigterm, tiny_config
from mural import checkpointing
from mural import train

STEPS = dict(total_steps=10, checkpoint_every_steps=2, keep_checkpoints=5, eval_every_steps=0,
             log_every_steps=1)


def read_jsonl(path):
  return [json.loads(l) for l in pathlib.Path(path).read_text().splitlines()]


def steps(workdir):
  return sorted(int(p.name) for p in (workdir / "checkpoints").iterdir() if p.name.isdigit())


def moved(workdir, step):
  return sorted(p for p in (workdir / "checkpoints").iterdir()
                if p.name.startswith(f"{step}{checkpointing.CORRUPT_MARK}"))


def snapshot(directory):
  """{relative path: bytes} of every file under `directory`."""
  return {str(p.relative_to(directory)): p.read_bytes() for p in directory.rglob("*") if p.is_file()}


@pytest.fixture(scope="module")
def config(tiny_vocab):
  return tiny_config(tiny_vocab, **STEPS)


@pytest.fixture(scope="module")
def setup(config):
  """train.build(config): the abstract state and shardings the quick tests restore into; every
  run here is given it (one trace and compile of the step for the module)."""
  return train.build(config)


@pytest.fixture(scope="module")
def reference(config, setup, tmp_path_factory):
  """10 steps without a stop: (workdir, result)."""
  workdir = tmp_path_factory.mktemp("reference")
  return workdir, train.train_and_evaluate(config, str(workdir), evaluators=[], setup=setup)


@pytest.fixture(scope="module")
def stopped(config, setup, tmp_path_factory):
  """The same run stopped by SIGTERM at step 4: checkpoints 2 and 4, metrics of steps 1-4."""
  workdir = tmp_path_factory.mktemp("stopped")
  inner = train.input_pipeline(config, setup, str(workdir))[1]
  result = train.train_and_evaluate(config, str(workdir), train_iter=HookedIterator(inner, 4, sigterm), evaluators=[],
                                    setup=setup)
  assert result["preempted"] and result["step"] == 4
  assert steps(workdir) == [2, 4]
  return workdir


def largest_state_file(step_dir):
  return max((p for p in (step_dir / "state").rglob("*") if p.is_file()), key=lambda p: p.stat().st_size)


def truncate_largest_file(step_dir):
  path = largest_state_file(step_dir)
  with open(path, "r+b") as f:
    f.truncate(path.stat().st_size // 2)


def delete_largest_file(step_dir):
  largest_state_file(step_dir).unlink()


def empty_step_directory(step_dir):
  for p in step_dir.iterdir():
    shutil.rmtree(p) if p.is_dir() else p.unlink()


def copy_of(stopped, tmp_path):
  workdir = tmp_path / "run"
  shutil.copytree(stopped, workdir)
  return workdir


def unreadable_warnings(caplog):
  return [r.getMessage() for r in caplog.records if "cannot be read" in r.getMessage()]


def test_unreadable_newest_step_is_moved_aside_and_the_run_resumes_from_the_one_before(
    config, setup, reference, stopped, tmp_path, caplog, capfd):
  """Half of step 4's largest file gone: the run warns once, resumes from step 2 and ends as if
  it had never stopped. (Other damage: the quick test below.)"""
  reference_dir, full = reference
  workdir = copy_of(stopped, tmp_path)
  truncate_largest_file(workdir / "checkpoints" / "4")
  corrupted = snapshot(workdir / "checkpoints" / "4")

  with caplog.at_level(logging.WARNING):
    resumed = train.train_and_evaluate(config, str(workdir), evaluators=[], setup=setup)

  (warning,) = unreadable_warnings(caplog)
  assert warning.startswith("Checkpoint 4 cannot be read (") and "\n" not in warning, warning
  (aside,) = moved(workdir, 4)
  assert str(aside) in warning
  assert snapshot(aside) == corrupted  # Moved, not deleted: every byte still there.
  assert steps(workdir) == [2, 4, 6, 8, 10]  # 4 saved again by the resumed run.
  err = capfd.readouterr().err
  assert "Traceback" not in err and "Event loop is closed" not in err, err[-3000:]

  assert resumed["step"] == 10
  got, want = read_jsonl(workdir / "metrics.jsonl"), read_jsonl(reference_dir / "metrics.jsonl")
  assert [l["step"] for l in got] == list(range(1, 11))
  assert [l["loss"] for l in got] == [l["loss"] for l in want]
  jax.tree.map(np.testing.assert_array_equal, jax.device_get(resumed["state"].params),
               jax.device_get(full["state"].params))
  jax.tree.map(np.testing.assert_array_equal, jax.device_get(resumed["state"].opt_state),
               jax.device_get(full["state"].opt_state))


def truncate(relative):
  def corrupt(step_dir):
    path = step_dir / relative
    path.write_bytes(path.read_bytes()[:path.stat().st_size // 2])
  corrupt.__name__ = f"truncate_{relative.replace('/', '_')}"
  return corrupt


@pytest.mark.parametrize("corrupt,part", [
    (truncate_largest_file, "state arrays: ValueError: "),
    (delete_largest_file, "state arrays: ValueError: "),
    (empty_step_directory, "state metadata: FileNotFoundError: "),
    (truncate("state/_METADATA"), "state metadata: JSONDecodeError: "),
    (truncate("data/metadata"), "input state: JSONDecodeError: ")])
def test_restore_latest_names_the_part_that_did_not_read_and_restores_the_step_before(
    corrupt, part, setup, stopped, tmp_path, caplog):
  """The same without training (quick): every kind of damage, and a run that resumes where the
  stopped run's step 2 left off."""
  workdir = copy_of(stopped, tmp_path)
  corrupt(workdir / "checkpoints" / "4")
  corrupted = snapshot(workdir / "checkpoints" / "4")
  checkpoints = checkpointing.Checkpoints(str(workdir), 5)
  with caplog.at_level(logging.WARNING):
    step, state, data = checkpoints.restore_latest(setup.abstract_state, setup.state_shardings)
  assert checkpoints.latest_step() == 2  # The manager no longer lists the step moved aside.
  checkpoints.close()
  (warning,) = unreadable_warnings(caplog)
  assert warning.startswith(f"Checkpoint 4 cannot be read ({part}") and "\n" not in warning, warning
  (aside,) = moved(workdir, 4)
  assert snapshot(aside) == corrupted and steps(workdir) == [2]
  assert step == 2 and int(state.step) == 2 and data is not None


def test_if_any_process_cannot_read_a_step_all_fall_back(setup, stopped, tmp_path, caplog, monkeypatch):
  """A second process (simulated in the all-gather) cannot read step 4: this one read it, but
  takes step 2 as well, and moves step 4 aside (it is process 0)."""
  def allgather_json(obj):
    if isinstance(obj, dict) and "kind" in obj:  # A read's report.
      other = {"kind": "unreadable", "message": "OSError: simulated"} if len(seen) == 0 else obj
      seen.append(obj["kind"])
      return [obj, other]
    return [obj, obj]
  seen = []
  monkeypatch.setattr(checkpointing.sharding, "allgather_json", allgather_json)
  workdir = copy_of(stopped, tmp_path)
  checkpoints = checkpointing.Checkpoints(str(workdir), 5)
  with caplog.at_level(logging.WARNING):
    step, state, _ = checkpoints.restore_latest(setup.abstract_state, setup.state_shardings)
  checkpoints.close()
  assert seen == ["ok", "ok"] and step == 2 and int(state.step) == 2
  (warning,) = unreadable_warnings(caplog)
  assert warning.startswith("Checkpoint 4 cannot be read (process 1: OSError: simulated): moved it aside")
  assert len(moved(workdir, 4)) == 1 and steps(workdir) == [2]


def test_evaluation_reads_the_step_before_and_moves_nothing(setup, stopped, tmp_path, caplog):
  workdir = copy_of(stopped, tmp_path)
  truncate_largest_file(workdir / "checkpoints" / "4")
  checkpoints = checkpointing.Checkpoints(str(workdir), 5)
  with caplog.at_level(logging.WARNING):
    step, _, _ = checkpoints.restore_latest(setup.abstract_state, setup.state_shardings,
                                            move_aside=False)
  checkpoints.close()
  assert step == 2 and steps(workdir) == [2, 4] and not moved(workdir, 4)
  (warning,) = unreadable_warnings(caplog)
  assert warning.startswith("Checkpoint 4 cannot be read (state arrays: ") and "moved" not in warning


def test_restore_params_reads_the_step_before_an_unreadable_one_and_moves_nothing(
    stopped, tmp_path, caplog):
  workdir = copy_of(stopped, tmp_path)
  with caplog.at_level(logging.INFO):
    expected = checkpointing.restore_params(str(workdir), step=2)
  assert not [r for r in caplog.records if r.levelno >= logging.WARNING], caplog.text  # A good read says nothing.
  caplog.clear()
  for path in (workdir / "checkpoints" / "4" / "state").rglob("*"):  # Params are in one of them:
    if path.is_file():  # the largest alone may hold only optimizer state, which this never reads.
      with open(path, "r+b") as f:
        f.truncate(path.stat().st_size // 2)
  with caplog.at_level(logging.WARNING):
    restored = checkpointing.restore_params(str(workdir))
  jax.tree.map(np.testing.assert_array_equal, restored, expected)
  assert steps(workdir) == [2, 4] and not moved(workdir, 4)
  (warning,) = unreadable_warnings(caplog)
  assert warning.startswith("Checkpoint 4 (") and warning.endswith("reading the one before.")
  with pytest.raises(FileNotFoundError, match=r"^no readable checkpoint .*: 4 \("):
    checkpointing.restore_params(str(workdir), step=4)
  with pytest.raises(FileNotFoundError, match=r"^no checkpoint 3 in "):
    checkpointing.restore_params(str(workdir), step=3)


def test_a_checkpoint_of_another_model_is_a_config_error_and_moves_nothing(tiny_vocab, stopped, tmp_path):
  workdir = copy_of(stopped, tmp_path)
  setup = train.build(tiny_config(tiny_vocab, **STEPS, **{"model.text.mlp_dim": 256}))
  checkpoints = checkpointing.Checkpoints(str(workdir), 5)
  with pytest.raises(ValueError, match=r"^checkpoint 4 in .* was written for another model or optimizer: "
                     r"\S+: stored shape \([\d, ]+\), this config \([\d, ]+\) \(and \d+ more\); "):
    checkpoints.restore_latest(setup.abstract_state, setup.state_shardings)
  checkpoints.close()
  assert steps(workdir) == [2, 4] and not moved(workdir, 4)


def _tiny_config_file(tmp_path, vocab) -> pathlib.Path:
  path = tmp_path / "tiny_checkpoints.py"
  path.write_text(f"""import sys
sys.path.insert(0, {str(ROOT / 'tests')!r})
import conftest

def get_config():
  return conftest.tiny_config({vocab!r}, **{STEPS!r})
""")
  return path


def test_no_readable_step_left_is_one_error_line_and_stays_one(tiny_vocab, setup, stopped, tmp_path):
  """Through mural.main: one warning per step, then one `mural: error:` line and no traceback
  (none at exit either, where the debris of failed reads would show); a rerun gives the same
  error rather than starting from step 0."""
  workdir = copy_of(stopped, tmp_path)
  for step in (2, 4):
    truncate_largest_file(workdir / "checkpoints" / str(step))
  env = dict(os.environ, JAX_PLATFORMS="cpu", TF_CPP_MIN_LOG_LEVEL="3")
  command = [sys.executable, "-m", "mural.main", f"--config={_tiny_config_file(tmp_path, tiny_vocab)}",
             f"--workdir={workdir}"]

  r = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
  assert r.returncode == 1, r.stderr[-3000:]
  lines = r.stderr.strip().splitlines()
  assert lines[-1].startswith(f"mural: error: FileNotFoundError: no readable checkpoint in "
                              f"{workdir / 'checkpoints'} (moved aside as unreadable: 4.corrupt-"), lines[-1]
  assert [l.split("] ", 1)[-1].split(" (")[0] for l in lines if "cannot be read" in l] == [
      "Checkpoint 4 cannot be read", "Checkpoint 2 cannot be read"]
  assert "Traceback" not in r.stderr and "Event loop is closed" not in r.stderr, r.stderr[-3000:]
  assert len(moved(workdir, 4)) == 1 and len(moved(workdir, 2)) == 1 and steps(workdir) == []

  # Rerun: the same error, not a fresh start from step 0.
  checkpoints = checkpointing.Checkpoints(str(workdir), 5)
  with pytest.raises(FileNotFoundError, match=r"\(moved aside as unreadable: 4\.corrupt-\S+, 2\.corrupt-"):
    checkpoints.restore_latest(setup.abstract_state, setup.state_shardings)
  checkpoints.close()
