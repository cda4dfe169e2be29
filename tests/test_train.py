"""mural.train end to end on configs/tiny.py: outputs, resume, ALIGN equivalence, accumulation, failures.

Every run uses the real input pipeline on the built-in synthetic data and a
vocab learned once per session. Runs are a few steps of the tiny model; the
compile of the train step dominates (~15-30 s per distinct step function).
"""

import functools
import json
import logging
import os
import pathlib
import re
import signal
import subprocess
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from conftest import ROOT, HookedIterator, imports_in_threads, sigterm, spy_on_tensorflow, tiny_config, train_step_lowerings
from mural import checkpointing
from mural import config_lib
from mural import disk_space
from mural import describe
from mural import device_memory
from mural import evaluate as evaluate_lib
from mural import metric_log
from mural import optim
from mural import system
from mural import systems
from mural import step as step_lib
from mural import train
from mural.state import TrainingError


def read_jsonl(path):
  return [json.loads(l) for l in pathlib.Path(path).read_text().splitlines()]


def _pipeline(config, workdir, setup=None):
  return train.input_pipeline(config, setup or train.build(config), str(workdir))[1]


# ---- End to end + resume -------------------------------------------------------


@pytest.fixture(scope="module")
def uninterrupted(tiny_vocab, tmp_path_factory):
  """10 steps, eval and checkpoint every 5, steps 3-4 profiled: the reference run; its Setup,
  which the runs and evaluations of the same config below reuse (nothing traced or compiled
  again)."""
  workdir = tmp_path_factory.mktemp("full")
  config = tiny_config(tiny_vocab, **{"profile.start_step": 3, "profile.num_steps": 2})
  setup = train.build(config)
  # The step is compiled in a thread before the loop, and the loop's first call must find it.
  with train_step_lowerings() as lowerings, imports_in_threads() as thread_imports:
    result = train.train_and_evaluate(config, str(workdir), setup=setup)
  result["step_lowerings"], result["thread_imports"] = len(lowerings), thread_imports
  return config, workdir, result, setup


def test_end_to_end_outputs(uninterrupted):
  config, workdir, result, setup = uninterrupted
  lines = read_jsonl(workdir / "metrics.jsonl")
  assert [l["step"] for l in lines] == list(range(1, 11))
  for key in ("loss", "loss/i2t", "loss/t2i", "loss/l2r", "loss/r2l", "temperature", "lr/i2t",
              "lr/t2t", "grad_norm/i2t", "grad_norm/t2t", "examples_per_sec", "step_time_sec",
              "i2t/undecodable_image"):
    assert key in lines[-1], key
  assert all(np.isfinite(l["loss"]) for l in lines)
  assert lines[-1]["lr/i2t"] == pytest.approx(float(
      optim.learning_rate_schedule(config.tasks.i2t.learning_rate, 2, 10)(9)))
  for step in (5, 10):
    assert (workdir / "checkpoints" / str(step) / "state").is_dir()
    scores = json.loads((workdir / "eval" / f"step_{step}.json").read_text())
    assert scores["step"] == step
    for lang in ("en", "de", "sw"):
      assert 0.0 <= scores[f"{lang}/mR"] <= 100.0
    assert "en-de/acc" in scores and "en-sw/acc" in scores
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  tags = {(e.step, v.tag) for f in workdir.glob("events.out.tfevents.*")
          for e in tf.compat.v1.train.summary_iterator(str(f)) for v in e.summary.value}
  assert {(10, "train/loss"), (10, "train/lr/t2t"), (10, "eval/en/mR"), (5, "eval/en-de/acc")} <= tags
  from tensorboard.plugins.hparams import plugin_data_pb2  # pylint: disable=g-import-not-at-top
  starts = [plugin_data_pb2.HParamsPluginData.FromString(v.metadata.plugin_data.content).session_start_info
            for f in workdir.glob("events.out.tfevents.*") for e in tf.compat.v1.train.summary_iterator(str(f))
            for v in e.summary.value if v.tag == "_hparams_/session_start_info"]
  assert len(starts) == 1
  hparams = starts[0].hparams
  assert hparams["total_steps"].number_value == 10 and hparams["system"].string_value == "mural"
  assert hparams["optim.layer_adaptation"].bool_value is True
  assert json.loads(hparams["data.languages"].string_value) == list(config.data.languages)
  assert len(hparams) == len(config_lib.flat(config))
  assert result["step"] == 10 and not result["preempted"]
  assert result["step_lowerings"] == 1  # Before the loop; the loop's calls reuse it.
  # The step compiled in its thread while this thread built the input (and imported TensorFlow):
  # the compile thread ran no import statement, so a module that swaps builtins.__import__
  # meanwhile (etils.epy.lazy_imports) cannot reach it. Tracing there ran dozens.
  assert result["thread_imports"] == []
  assert [j._cache_size() for j in setup.jitted_inits.values()] == [0]  # The init program, needed once, was freed.
  assert result["eval"]["en/mR"] == scores["en/mR"]
  assert (workdir / "vocab.txt").exists() is False  # vocab_path given: nothing learned here.
  traces = list(workdir.glob("plugins/profile/*/*.xplane.pb"))  # Where TensorBoard looks.
  assert len(traces) == 1
  events = [e.name for p in jax.profiler.ProfileData.from_file(str(traces[0])).planes
            for l in p.lines for e in l.events]
  assert sum("train_step" in name for name in events) >= 2, sorted(set(events))[:50]


def test_sigterm_checkpoints_and_resume_matches_uninterrupted(uninterrupted, tmp_path):
  """SIGTERM before step 7's batch -> checkpoint 7 and stop; a rerun resumes and
  ends with the same losses and parameters as the run that never stopped."""
  config, full_dir, full, setup = uninterrupted
  workdir = tmp_path / "interrupted"
  on_disk_when_logged = []

  class SeeCheckpoints(logging.Handler):
    def emit(self, record):
      if record.getMessage().startswith("Stopped at step"):
        on_disk_when_logged.append(sorted(p.name for p in (workdir / "checkpoints").iterdir()))

  watcher = SeeCheckpoints()
  logging.getLogger("absl").addHandler(watcher)
  try:
    stopped = train.train_and_evaluate(
        config, str(workdir), train_iter=HookedIterator(_pipeline(config, workdir, setup), 7, sigterm), setup=setup)
  finally:
    logging.getLogger("absl").removeHandler(watcher)
  assert stopped["preempted"] and stopped["step"] == 7
  # "checkpoint saved" is logged once the save is done (an async save leaves a tmp directory before).
  assert [[n for n in names if n.startswith("7")] for names in on_disk_when_logged] == [["7"]]
  assert sorted(int(p.name) for p in (workdir / "checkpoints").iterdir() if p.name.isdigit()) == [5, 7]
  assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # Handler restored.

  resumed = train.train_and_evaluate(config, str(workdir), setup=setup)
  assert resumed["step"] == 10
  got, want = read_jsonl(workdir / "metrics.jsonl"), read_jsonl(full_dir / "metrics.jsonl")
  assert [l["step"] for l in got] == list(range(1, 11))  # Each step logged once.
  for g, w in zip(got, want):
    assert g["loss"] == w["loss"], g["step"]
    assert g["loss/l2r"] == w["loss/l2r"], g["step"]
  jax.tree.map(np.testing.assert_array_equal, jax.device_get(resumed["state"].params),
               jax.device_get(full["state"].params))
  jax.tree.map(np.testing.assert_array_equal, jax.device_get(resumed["state"].opt_state),
               jax.device_get(full["state"].opt_state))
  assert resumed["eval"] == full["eval"]
  assert train.jit_train_step(setup)._cache_size() == 1  # Three runs, one trace of the step.


def test_a_full_disk_at_a_checkpoint_is_one_error_and_the_same_command_resumes(uninterrupted, small_disk,
                                                                              caplog):
  """The disk fills after checkpoint 5 is on it, with room left for metrics but not checkpoint 10:
  one DiskFull naming both steps; orbax's own error logs and the half-written step 10 are gone;
  with space back, the same run resumes from 5 and ends where the uninterrupted one did."""
  config, _, full, setup = uninterrupted
  workdir = small_disk.path / "run"

  def fill_after_checkpoint_5(batch):
    deadline = time.monotonic() + 120
    while not (workdir / "checkpoints" / "5").is_dir() and time.monotonic() < deadline:
      time.sleep(0.05)  # The async save's rename to "5" marks it whole.
    small_disk.fill(leave=200_000)

  with pytest.raises(disk_space.DiskFull) as full_disk:
    train.train_and_evaluate(config, str(workdir), setup=setup, evaluators=[], train_iter=HookedIterator(
        _pipeline(config, workdir, setup), 7, fill_after_checkpoint_5))
  assert re.fullmatch(rf"no space left on device writing checkpoint 10 to {workdir}/checkpoints \(.* free "
                      r"there now\); checkpoint 5 is whole: the same command resumes from it once there is "
                      r"space", str(full_disk.value)), str(full_disk.value)
  assert sorted(p.name for p in (workdir / "checkpoints").iterdir()) == ["5"]  # No partial step 10.
  assert not [r for r in caplog.records if "orbax" in r.pathname and r.levelno >= logging.WARNING]
  assert [l["step"] for l in read_jsonl(workdir / "metrics.jsonl")] == list(range(1, 11))

  small_disk.empty()
  resumed = train.train_and_evaluate(config, str(workdir), setup=setup, evaluators=[])
  assert resumed["step"] == 10
  jax.tree.map(np.testing.assert_array_equal, jax.device_get(resumed["state"].params),
               jax.device_get(full["state"].params))


def test_ctrl_c_stops_at_the_next_step_and_a_second_one_interrupts():
  """The trainer's stop request: a first SIGINT sets the flag as SIGTERM does (checkpoint, stop);
  a second raises KeyboardInterrupt; both handlers are put back after."""
  previous = signal.signal(signal.SIGINT, signal.default_int_handler)  # pytest-xdist may ignore it.
  try:
    with checkpointing.StopRequest() as stop_requested:
      assert not stop_requested(1)
      os.kill(os.getpid(), signal.SIGINT)
      assert stop_requested(2) and stop_requested.reason == "SIGINT"
      with pytest.raises(KeyboardInterrupt):
        os.kill(os.getpid(), signal.SIGINT)
        signal.sigtimedwait([], 1.0)  # Python runs the handler here at the latest.
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
    # A process that ignores SIGINT (started in the background) keeps ignoring it.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    with checkpointing.StopRequest():
      assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
  finally:
    signal.signal(signal.SIGINT, previous)


def test_a_setup_runs_only_the_config_it_was_built_from(uninterrupted, tmp_path):
  config, _, _, setup = uninterrupted
  other = tiny_config(config.data.vocab_path, total_steps=11)
  with pytest.raises(ValueError, match="built from another config"):
    train.train_and_evaluate(other, str(tmp_path), setup=setup)
  config.total_steps += 1  # The Setup keeps its own copy: the caller's later changes do not reach it.
  try:
    assert setup.config.total_steps == 10
    with pytest.raises(ValueError, match="built from another config"):
      train.evaluate(config, str(tmp_path), setup=setup)
  finally:
    config.total_steps -= 1


def test_a_step_the_device_cannot_hold_fails_before_the_first_step(uninterrupted, tmp_path, monkeypatch):
  """The trainer checks the compiled step's memory (mural/device_memory.py check_fits) before it runs it:
  here against a device of 1 MiB (the tiny step needs more)."""
  config, _, _, setup = uninterrupted
  monkeypatch.setattr(device_memory, "device_memory_bytes", lambda: 2**20)
  with pytest.raises(TrainingError, match=r"^the train step needs .* more than the 1\.00 MiB a cpu device"):
    train.train_and_evaluate(config, str(tmp_path), setup=setup, evaluators=[])
  assert not (tmp_path / "metrics.jsonl").exists() and not any((tmp_path / "checkpoints").iterdir())


def test_eval_mode_reads_the_latest_checkpoint_with_the_recorded_config(uninterrupted):
  """The workdir's config.json gives back the config that trained it: the same JSON (the
  Setup, which checks that, runs it), the same fields, locked."""
  config, workdir, result, setup = uninterrupted
  recorded = systems.recorded(str(workdir))
  assert config_lib.differences(recorded, config) == []
  with pytest.raises(AttributeError):
    recorded.total_stepz = 3
  scores = train.evaluate(recorded, str(workdir), setup=setup)
  assert scores == result["eval"]


def test_named_eval_sets_are_scored_beside_the_eval_data_each_in_a_table_of_its_own(uninterrupted):
  """config.data.eval_sets: more eval data in one run, its results '<name>.<set>/<metric>'. Entry
  'again' is the eval source itself, so its scores equal the unnamed ones key for key."""
  config, workdir, result, setup = uninterrupted
  named = systems.recorded(str(workdir))
  with named.unlocked():
    named.data.eval_sets = {"again": dict(source=config.data.eval_source.to_dict())}
  config_lib.validate(named)
  scores = train.evaluate(named, str(workdir), setup=setup)
  assert {k: v for k, v in scores.items() if not k.startswith("again.")} == result["eval"]
  assert {k.removeprefix("again."): v for k, v in scores.items() if k.startswith("again.")} == result["eval"]
  table = evaluate_lib.format_table(scores)
  assert table == evaluate_lib.format_table(result["eval"]) + "\nagain:\n" + evaluate_lib.format_table(result["eval"])
  stopper = checkpointing.EarlyStopping("again.mean/mR", 2, "max")
  assert stopper.update(10, scores) is False  # Early stopping reads a named set's score.
  written = list(workdir.glob("eval/*/step_10.json"))
  assert len(written) == 1 and json.loads(written[0].read_text())["again.mean/mR"] == scores["mean/mR"]


@pytest.mark.parametrize("eval_sets, message", [
    ({"a/b": {"source": {"name": "synthetic"}}}, r"^config\.data\.eval_sets\.a/b: a name of letters"),
    ({"x": {"sauce": {"name": "synthetic"}}}, r"^config\.data\.eval_sets\.x: must be a dict with 'source'"),
    ({"x": {"source": {"split": "dev"}}}, r"^config\.data\.eval_sets\.x\.source: needs a 'name'"),
])
def test_a_malformed_eval_set_is_one_line_naming_it(eval_sets, message):
  c = systems.base_config("mural")
  c.data.eval_sets = eval_sets
  with pytest.raises(config_lib.ConfigError, match=message):
    config_lib.validate(c)


def test_an_eval_set_the_data_layer_refuses_names_its_entry(tiny_vocab):
  config = tiny_config(tiny_vocab)
  config.data.eval_source = dict(name="")  # None: the evaluators need no tokenizer before the entry.
  config.data.eval_sets = {"mine": {"source": {"name": "nope"}}}
  with pytest.raises(ValueError, match=r"^config\.data\.eval_sets\.mine \(read as .*'nope' not in"):
    evaluate_lib.evaluators_for(systems.get(config), config, (), None)


def test_evaluating_another_config_writes_beside_trainings_evaluations(tiny_vocab, tmp_path):
  """--mode=eval of the recorded config writes WORKDIR/eval/step_<N>.json (training's); of another
  (other eval data), a directory named after what differs, with that config's record."""
  config = tiny_config(tiny_vocab)
  workdir = str(tmp_path)
  where = lambda c: evaluate_lib.directory_for(c, workdir, systems.record_changes(c, workdir))
  assert systems.record_changes(config, workdir) is None and where(config) == str(tmp_path / "eval")
  config_lib.write_record(config, workdir)
  assert where(systems.recorded(workdir)) == str(tmp_path / "eval")
  other = tiny_config(tiny_vocab, **{"data.synthetic.eval_scenes": 40, "eval_batch_size": 24})
  directory = where(other)
  assert directory == str(tmp_path / "eval" / "data.synthetic.eval_scenes=40,eval_batch_size=24")
  assert systems.recorded(directory).data.synthetic.eval_scenes == 40
  assert systems.record_changes(config, workdir) == []  # The workdir's record is untouched.
  many = tiny_config(tiny_vocab, **{"data.synthetic.languages": ("en", "de"), "data.languages": ("en", "de"),
                                    "data.synthetic.eval_captions_per_scene": 2, "eval_batch_size": 24})
  assert re.fullmatch(r"config-[0-9a-f]{10}", pathlib.Path(where(many)).name)
  # A record written before a field existed: the field is no change (read on today's defaults).
  record = json.loads((tmp_path / "config.json").read_text())
  del record["profile"]
  (tmp_path / "config.json").write_text(json.dumps(record))
  assert where(config) == str(tmp_path / "eval")


def test_profile_fields_are_checked(tiny_vocab):
  with pytest.raises(config_lib.ConfigError, match=r"^config\.profile\.num_steps: must be an int >= 0"):
    systems.validate(tiny_config(tiny_vocab, **{"profile.num_steps": -1}))
  with pytest.raises(config_lib.ConfigError, match=r"^config\.profile\.start_step: must be an int >= 1"):
    systems.validate(tiny_config(tiny_vocab, **{"profile.start_step": 0}))


def test_a_profile_that_cannot_start_warns_and_training_goes_on(tmp_path, caplog):
  profile = tiny_config("", **{"profile.start_step": 2, "profile.num_steps": 1}).profile
  jax.profiler.start_trace(str(tmp_path / "other"))  # Someone else's trace: only one at a time.
  try:
    trace = metric_log.StepTrace(profile, str(tmp_path))
    trace.before(1)
    assert not trace.tracing
    trace.before(2)
    assert not trace.tracing and "config.profile: no trace (" in caplog.text
    trace.after(2, None)
    trace.stop()
  finally:
    jax.profiler.stop_trace()
  assert not (tmp_path / "plugins").exists()


def test_a_run_records_its_config_and_names_what_a_resume_changed(tiny_vocab, tmp_path):
  config = tiny_config(tiny_vocab)
  config_lib.write_record(config, str(tmp_path))
  changed = tiny_config(tiny_vocab, total_steps=11, **{"tasks.i2t.batch_size": 4})
  assert systems.record_changes(changed, str(tmp_path)) == ["tasks.i2t.batch_size", "total_steps"]
  config_lib.write_record(changed, str(tmp_path))
  assert systems.recorded(str(tmp_path)).total_steps == 11
  record = json.loads((tmp_path / "config.json").read_text())

  def edited(**fields):  # The record with `fields` (a__b for a.b) replaced (None: deleted), read back.
    values = json.loads(json.dumps(record))
    for name, value in fields.items():
      *parents, key = name.split("__")
      section = functools.reduce(lambda d, k: d[k], parents, values)
      if value is None:
        del section[key]
      else:
        section[key] = value
    (tmp_path / "config.json").write_text(json.dumps(values))
    return systems.recorded(str(tmp_path))

  # A field the record lacks (added to mural after the run) keeps its default; the types are the
  # defaults' (tuples, typed None), as a config file's.
  back = edited(profile=None, model__image__width_coefficient=None)
  assert back.profile.num_steps == systems.base_config("mural").profile.num_steps
  assert back.total_steps == 11 and isinstance(back.data.languages, tuple)
  with back.unlocked():
    back.model.image.width_coefficient = 0.5  # Typed float, as in the config file.
    with pytest.raises(TypeError):
      back.model.image.width_coefficient = "wide"
  with pytest.raises(AttributeError):
    back.total_stepz = 3  # Locked.
  with pytest.raises(config_lib.ConfigError, match=r"config\.json: config\.total_steps: 'ten' is not a int$"):
    edited(total_steps="ten")
  with pytest.raises(config_lib.ConfigError, match=r"config\.json: config\.model\.text\.num_layers: 2\.5 is not a int$"):
    edited(model__text__num_layers=2.5)
  with pytest.raises(config_lib.ConfigError, match=r"^config\.total_stepz: not a field of system 'mural'"):
    systems.get(edited(total_stepz=3))
  for text in ("{", "[1]", "{}"):
    (tmp_path / "config.json").write_text(text)
    with pytest.raises(config_lib.ConfigError, match=r"config\.json: not a config record"):
      systems.recorded(str(tmp_path))


def test_restore_params_reads_a_checkpoint_without_its_config(uninterrupted):
  _, workdir, result, _ = uninterrupted
  restored = checkpointing.restore_params(str(workdir))
  assert set(restored) == {"params", "batch_stats"}
  jax.tree.map(np.testing.assert_array_equal, restored["params"], jax.device_get(result["state"].params))
  jax.tree.map(np.testing.assert_array_equal, restored["batch_stats"],
               jax.device_get(result["state"].batch_stats))
  early = checkpointing.restore_params(str(workdir), step=5)
  assert not np.array_equal(early["params"]["log_temperature"], restored["params"]["log_temperature"])


# ---- ALIGN equivalence ------------------------------------------------------------------


def _params_without_t2t_head(state):
  params = dict(jax.device_get(state.params))
  params.pop("t2t_head", None)
  return params


def test_t2t_weight_zero_or_rate_zero_is_align(tiny_vocab, tmp_path):
  steps = dict(total_steps=4, checkpoint_every_steps=4, eval_every_steps=0, log_every_steps=4)
  align = tiny_config(tiny_vocab, **steps, system="align")
  del align.tasks["t2t"]
  runs = {
      "align": align,
      "weight0": tiny_config(tiny_vocab, **steps, **{"tasks.t2t.weight": 0.0}),
      "rate0": tiny_config(tiny_vocab, **steps, **{"tasks.t2t.learning_rate": 0.0}),
  }
  # No evaluators: nothing below reads an evaluation (saves compiling the embedding calls).
  out = {name: train.train_and_evaluate(c, str(tmp_path / name), evaluators=[]) for name, c in runs.items()}
  assert set(out["align"]["state"].opt_state) == {"i2t"}
  assert set(out["weight0"]["state"].opt_state) == {"i2t"}  # The t2t task does not run.
  assert set(out["rate0"]["state"].opt_state) == {"i2t", "t2t"}
  reference = _params_without_t2t_head(out["align"]["state"])
  assert "t2t_head" not in out["weight0"]["state"].params
  jax.tree.map(np.testing.assert_array_equal, _params_without_t2t_head(out["weight0"]["state"]), reference)
  # rate 0: exactly-zero t2t updates, so the same params up to float round-off
  # (XLA fuses the two programs differently; a bias that feeds a batch norm
  # gets only round-off gradients, which Adam scales up to ~1e-5 steps).
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5),
               _params_without_t2t_head(out["rate0"]["state"]), reference)
  # ... and the t2t head was never moved.
  moved = jax.device_get(out["rate0"]["state"].params["t2t_head"])
  init = jax.device_get(out["rate0"]["setup"].init_state(jax.random.PRNGKey(0)).params["t2t_head"])
  jax.tree.map(np.testing.assert_array_equal, moved, init)
  assert out["rate0"]["train"]["loss/i2t"] == pytest.approx(out["align"]["train"]["loss/i2t"], rel=1e-6)


# ---- Gradient accumulation -------------------------------------------------------------


def _random_batch(shapes, seed=0):
  rng = np.random.default_rng(seed)
  batch = {}
  for k, s in shapes.items():
    if s.dtype == jnp.float32:
      batch[k] = rng.normal(size=s.shape).astype(np.float32)
    elif s.dtype == jnp.bool_:
      batch[k] = np.ones(s.shape, bool)
    elif k.endswith("mask"):
      batch[k] = (np.arange(s.shape[1]) < rng.integers(3, s.shape[1], size=(s.shape[0], 1))).astype(np.int32)
    else:
      batch[k] = rng.integers(5, 200, size=s.shape).astype(np.int32)
  return batch


@pytest.fixture(scope="module")
def accumulation(tiny_vocab):
  """The tiny model without dropout; a batch whose micro-batches of k = 2 (rows 0::2, 1::2)
  hold the same images, so batch-norm moments of a micro-batch equal the whole batch's and
  only the negatives tell the accumulation modes apart; the whole-batch gradient function."""
  config = tiny_config(tiny_vocab, **{"optim.grad_accum_steps": 2, "model.text.dropout_rate": 0.0,
                                      "model.image.dropout_rate": 0.0,
                                      "model.image.stochastic_depth_rate": 0.0})
  setup = train.build(config)
  state = jax.jit(setup.init)(jax.random.PRNGKey(0))
  batch = {name: _random_batch(shapes) for name, shapes in system.batch_shapes(setup.tasks, config).items()}
  batch["i2t"]["image"][1::2] = batch["i2t"]["image"][0::2]
  single = jax.jit(step_lib.make_grad_fn(setup.model, setup.tasks, 1, setup.mesh, setup.rules))
  grad_fn = lambda mode: jax.jit(step_lib.make_grad_fn(setup.model, setup.tasks, 2, setup.mesh, setup.rules, mode))
  return setup, state, batch, jax.random.PRNGKey(3), single, grad_fn


def test_independent_accumulation_averages_micro_batch_gradients(accumulation):
  """k=2 on a batch == mean of k=1 gradients on rows 0::2 and 1::2 (each its own softmax)."""
  setup, state, batch, key, single, grad_fn = accumulation
  rows = lambda b, r: jax.tree.map(lambda v: v[r::2], b)
  grads, stats, metrics = grad_fn("independent")(state.params, state.batch_stats, batch, key)
  g0, s0, m0 = single(state.params, state.batch_stats, rows(batch, 0), jax.random.fold_in(key, 0))
  g1, s1, m1 = single(state.params, s0, rows(batch, 1), jax.random.fold_in(key, 1))
  mean = jax.tree.map(lambda a, b: (np.asarray(a) + np.asarray(b)) / 2, g0, g1)  # NumPy: no op-by-op compiles.
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=2e-4, atol=1e-6), grads, mean)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6), stats, s1)
  assert float(metrics["loss"]) == pytest.approx((float(m0["loss"]) + float(m1["loss"])) / 2, rel=1e-5)


def test_cached_accumulation_equals_the_whole_batch_step(accumulation):
  """GradCache (the default mode): k=2 gives the k=1 losses and gradients, global negatives
  included; batch-norm statistics advance micro-batch by micro-batch as in the other mode."""
  setup, state, batch, key, single, grad_fn = accumulation
  assert setup.tasks and {t.name for t in setup.tasks} == {"i2t", "t2t"}
  grads, stats, metrics = grad_fn("cached")(state.params, state.batch_stats, batch, key)
  whole, _, whole_metrics = single(state.params, state.batch_stats, batch, key)
  for name in ("loss", "loss/i2t", "loss/t2i", "loss/l2r", "loss/r2l", "temperature"):
    assert float(metrics[name]) == pytest.approx(float(whole_metrics[name]), rel=1e-5), name
  flat = lambda g: np.concatenate([np.ravel(x) for x in jax.tree.leaves(g)])
  for task in ("i2t", "t2t"):
    got, want = flat(grads[task]), flat(whole[task])
    assert np.abs(want).max() > 1e-3, task  # Each task's gradient is not trivially zero.
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max(), err_msg=task)
  # The micro-batches' own negatives give another gradient: the comparison can fail.
  independent, independent_stats, _ = grad_fn("independent")(state.params, state.batch_stats, batch, key)
  assert np.abs(flat(independent["i2t"]) - flat(whole["i2t"])).max() > 1e-2 * np.abs(flat(whole["i2t"])).max()
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6), stats, independent_stats)


# ---- Failure paths -----------------------------------------------------------------------


def test_non_finite_loss_names_the_step(tiny_vocab, tmp_path):
  # The reference run's schedule (so its compiled step is reused); logs only at step 5.
  config = tiny_config(tiny_vocab, log_every_steps=5, checkpoint_every_steps=10, eval_every_steps=0)

  def poison(batch):
    batch = {k: dict(v) for k, v in batch.items()}
    batch["i2t"]["image"] = np.full_like(batch["i2t"]["image"], np.nan)
    return batch

  with pytest.raises(TrainingError, match=r"^step 3: the training loss is nan"):
    train.train_and_evaluate(config, str(tmp_path), train_iter=HookedIterator(_pipeline(config, tmp_path), 3, poison))


def _main(*args, timeout=120, **env):
  env = dict(os.environ, JAX_PLATFORMS="cpu", TF_CPP_MIN_LOG_LEVEL="3", **env)
  return subprocess.run([sys.executable, "-m", "mural.main", *args], cwd=ROOT, env=env,
                        capture_output=True, text=True, timeout=timeout)


def test_main_bad_config_value_is_one_line_exit_2(tmp_path):
  r = _main("--config=configs/tiny.py", "--config.optim.b1=1.5", f"--workdir={tmp_path}")
  assert r.returncode == 2, r.stderr[-2000:]
  assert r.stderr.strip().splitlines()[-1] == "mural: error: config.optim.b1: must be in [0, 1), got 1.5"
  assert "Traceback" not in r.stderr


def test_main_unknown_config_field_is_one_line_exit_2(tmp_path):
  r = _main("--config=configs/tiny.py", "--config.tasks.i2t.learning_rat=1e-3", f"--workdir={tmp_path}")
  assert r.returncode == 2, r.stderr[-2000:]
  last = r.stderr.strip().splitlines()[-1]
  assert last.startswith("mural: error:") and "learning_rat" in last
  assert "Traceback" not in r.stderr


def test_main_missing_data_path_is_a_clear_error_and_tensorflow_sees_no_gpu(tmp_path):
  """One training start for both (each imports TensorFlow: ~8 CPU-s); mural.data.convert's
  hiding is checked by test_convert's CLI run."""
  missing = tmp_path / "no_such_dir"
  code, stdout, stderr = spy_on_tensorflow("mural.main", "--config=configs/flickr8k.py", f"--workdir={tmp_path / 'w'}",
                                           MURAL_FLICKR8K_DIR=str(missing), MURAL_MULTI30K_DIR=str(missing))
  assert code == 1, stderr[-2000:]
  assert "SET_INTRA_OP_THREADS 1" in stdout, stdout  # config.data.tf_intra_op_threads, before TF starts.
  assert "intra-op threads stay" not in stderr
  last = stderr.strip().splitlines()[-1]
  assert last.startswith("mural: error: ValueError: ") and str(missing) in last, last
  assert "Traceback" not in stderr


def test_main_unparsable_override_is_one_line_exit_2(tmp_path):
  r = _main("--config=configs/tiny.py", "--config.tasks.i2t.sources.0.path=/x", f"--workdir={tmp_path}")
  assert r.returncode == 2, r.stderr[-2000:]
  assert r.stderr.strip().splitlines()[-1].startswith("mural: error:")
  assert "Traceback" not in r.stderr


def test_mesh_that_does_not_fit_is_a_config_error(tiny_vocab):
  config = tiny_config(tiny_vocab, **{"mesh.data": 3})
  with pytest.raises(config_lib.ConfigError, match=r"config\.mesh"):
    train.build(config)


def test_init_from_parts_must_name_parameter_groups(tiny_vocab):
  systems.validate(tiny_config(tiny_vocab, init_from_parts="image_tower, text_tower"))
  with pytest.raises(config_lib.ConfigError, match=r"^config\.init_from_parts: 'image tower': "):
    systems.validate(tiny_config(tiny_vocab, init_from_parts="image tower"))


def test_batch_that_does_not_split_is_a_config_error(tiny_vocab):
  config = tiny_config(tiny_vocab, **{"tasks.t2t.batch_size": 6, "optim.grad_accum_steps": 4})
  with pytest.raises(config_lib.ConfigError, match=r"^config\.tasks\.(i2t|t2t)\.batch_size: "):
    train.build(config)


def test_main_describe_prints_json_without_loading_tensorflow(tmp_path):
  """Of a recorded config (configs/recorded.py:WORKDIR) with an override, as any config file's."""
  tiny = config_lib.from_file(ROOT / "configs" / "tiny.py")
  config_lib.write_record(tiny, str(tmp_path))
  r = subprocess.run([sys.executable, "-X", "importtime", "-m", "mural.main",
                      f"--config=configs/recorded.py:{tmp_path}", "--config.model.text.num_layers=3",
                      "--mode=describe"], cwd=ROOT, capture_output=True, text=True, timeout=120,
                     env=dict(os.environ, JAX_PLATFORMS="cpu"))
  assert r.returncode == 0, r.stderr[-2000:]
  counts = json.loads(r.stdout.strip().splitlines()[-1])
  assert counts["total"] > 0 and set(counts) >= {"image_tower", "text_encoder", "heads", "total"}
  tiny.model.text.num_layers = 3
  assert counts == describe.describe(tiny)
  loaded = re.findall(r"\| +(\S+)$", r.stderr, re.M)  # -X importtime: one line per module imported.
  assert "mural.describe" in loaded and "jax" in loaded and "tensorflow" not in loaded, loaded[-20:]


@pytest.mark.parametrize("config_text,expected", [
    ("def get_config(:\n  pass\n", r"^mural: error: --config: .*bad\.py:1: SyntaxError: "),
    ("from mural import systems\ndef get_config():\n  c = systems.base_config('mural')\n"
     "  c.model.text.num_layerz.x = 1\n  return c\n", r"^mural: error: --config: .*bad\.py:4: AttributeError: "),
])
def test_main_broken_config_file_is_one_line_with_file_and_line(tmp_path, config_text, expected):
  (tmp_path / "bad.py").write_text(config_text)
  r = _main(f"--config={tmp_path / 'bad.py'}", "--mode=describe")
  assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-2000:]
  assert re.match(expected, r.stderr.strip().splitlines()[-1]), r.stderr.strip().splitlines()[-1]


def test_main_unwritable_workdir_is_one_line(tmp_path):
  (tmp_path / "file").write_text("")
  r = _main("--config=configs/tiny.py", f"--workdir={tmp_path / 'file' / 'sub'}")
  assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-2000:]
  assert r.stderr.strip().splitlines()[-1].startswith(f"mural: error: --workdir: {tmp_path / 'file' / 'sub'} is not")


_LOADED = """
import sys
from mural import main
sys.argv = ["mural"] + sys.argv[1:]
try:
  main.run()
except SystemExit as e:
  print("EXIT", e.code, "tensorflow" in sys.modules, "jax" in sys.modules)
"""


@pytest.mark.parametrize("args", [
    ["--config=configs/tiny.py", "--config.optim.b1=1.5", "--workdir=/tmp/x"],  # A bad value.
    ["--config=configs/tiny.py", "--config.total_stepz=3"],  # A misspelt field.
    ["--config=configs/smalr_demo.py", "--config.total_stepz=3"],  # The same, in another system's file.
    ["--config=configs/tiny.py", "--config.system=clip", "--workdir=/tmp/x"],  # An unknown system.
    ["--config=configs/tiny.py", "--config.data.synthetic.translation_pairs_per_pair={'en-xx': 0}",
     "--workdir=/tmp/x"],  # A bad value of the built-in data.
    ["--mode=eval", "--workdir=/nonexistent/x"],  # No --config, and no config.json recorded.
    ["--config=configs/recorded.py:/nonexistent/x", "--mode=describe"],  # Nor here.
    ["--config=configs/recorded.py", "--mode=describe"],  # No workdir named.
    ["--mode=describe"],  # No --config, no --workdir.
])
def test_config_mistakes_are_reported_before_tensorflow_and_jax_load(args):
  r = subprocess.run([sys.executable, "-c", _LOADED, *args], cwd=ROOT, capture_output=True, text=True,
                     timeout=60)
  assert r.stdout.strip().splitlines()[-1] == "EXIT 2 False False", r.stdout[-1000:] + r.stderr[-1000:]
  assert r.stderr.strip().splitlines()[-1].startswith("mural: error: ")


def test_a_backend_this_host_lacks_is_one_line_exit_2(monkeypatch, capsys):
  """JAX_PLATFORMS naming a platform the host lacks (tpu, cuda): JAX raises a RuntimeError at its
  first call (checked by hand: `JAX_PLATFORMS=tpu python -m mural.main ...` exits 2 with the
  line below); mural.main starts the backend itself and says so in one line."""
  import jax  # pylint: disable=g-import-not-at-top
  from mural import main  # pylint: disable=g-import-not-at-top  (its absl flags: this test only)

  def no_tpu():
    raise RuntimeError("Unable to initialize backend 'tpu': INTERNAL: Failed to open libtpu.so\n"
                       "(set JAX_PLATFORMS='' to automatically choose an available backend)")

  monkeypatch.setattr(jax, "devices", no_tpu)
  with pytest.raises(SystemExit) as exit_info:
    main._start_backend()  # pylint: disable=protected-access
  assert exit_info.value.code == 2
  assert capsys.readouterr().err.strip().splitlines() == [
      "mural: error: JAX cannot start a backend here: Unable to initialize backend 'tpu': INTERNAL: "
      "Failed to open libtpu.so (set JAX_PLATFORMS='' to automatically choose an available backend)"]
  monkeypatch.undo()
  main._start_backend()  # pylint: disable=protected-access  (this host's CPU: nothing to say)


def test_jaxs_probe_of_a_tpu_without_libtpu_is_not_logged():
  """JAX's INFO line for the TPU plugin it cannot load, on every run of a host without libtpu, is
  dropped; a backend that failed otherwise (a GPU's CUDA) is still logged."""
  from mural import main  # pylint: disable=g-import-not-at-top  (its absl flags: this test only)

  def record(message, level=logging.INFO):
    return logging.LogRecord("jax._src.xla_bridge", level, "xla_bridge.py", 849, message, (), None)

  quiet = main._NoTpuProbe()  # pylint: disable=protected-access
  assert not quiet.filter(record("Unable to initialize backend 'tpu': INTERNAL: Failed to open libtpu.so: "
                                 "libtpu.so: cannot open shared object file: No such file or directory"))
  assert quiet.filter(record("Unable to initialize backend 'cuda': FAILED_PRECONDITION: No visible GPU devices."))
  assert quiet.filter(record("Unable to initialize backend 'tpu': INTERNAL: TPU is in use by process 42"))


def test_the_host_stays_at_most_four_steps_ahead_of_the_device():
  """JAX dispatches without waiting: the loop's DispatchAhead blocks on the step four back, so a
  stop request waits for at most four queued steps before its checkpoint."""
  step = jax.jit(lambda x: jnp.tanh(x @ x))  # A few ms each on a CPU core: the device is the slow side.
  x = step(jnp.full((600, 600), 1.0 / 600)).block_until_ready()
  ahead, outputs, ready_when_added = train.DispatchAhead(), [], []
  for _ in range(10):
    x = step(x)
    outputs.append(x)
    ahead.add(x)
    ready_when_added.append([o.is_ready() for o in outputs[:-5]])
  assert all(all(r) for r in ready_when_added), ready_when_added
