"""Command line: `python -m mural.main --config=FILE --workdir=DIR [--mode=train|eval|describe|export|plan]`.

  --config=configs/demo.py --config.total_steps=100   overrides any field (locked: typos fail)
                    without --config, every mode uses --workdir's config.json, the resolved
                    config --mode=train records there
  --mode=train      train (resuming from DIR's latest checkpoint) and evaluate
  --mode=eval       evaluate DIR's latest checkpoint
  --mode=describe   print the model's parameter counts as JSON
  --mode=export     write DIR's latest (or --step) checkpoint as a self-contained export
                    (--export_dir, default DIR/export/step_<N>; mural/export.py)
  --mode=plan       compile the train step for --devices=N (fake CPU devices) and print the
                    memory per device and FLOPs, last line JSON (mural/plan.py); no workdir

Several processes (hosts): pass --coordinator_address=HOST:PORT,
--num_processes and --process_id to every process (launch/local_multiprocess.py
does this for CPU processes on one machine, with gloo collectives). GPU
clusters under SLURM/MPI and Cloud TPU pods need none of these: on a TPU VM
pod JAX finds its peers by itself (launch/tpu_pod.sh).

Exit codes: 0 done (also after SIGTERM or a first Ctrl-C in training: a
checkpoint, then the stop); 1 the run failed (a one-line reason on stderr:
missing data, non-finite loss, ...); 2 bad flags or config (one line naming
the field); 130 interrupted (Ctrl-C anywhere else, or a second one).
"""

import json
import logging as std_logging
import os
import signal
import sys
import time
import traceback

_START = time.monotonic()  # The run's wall time is reported from here (imports included).

from mural import data  # pylint: disable=g-import-not-at-top  (light: no TensorFlow yet)

data.set_tensorflow_env_defaults()  # Before anything loads TensorFlow.

from absl import app
from absl import flags
from absl import logging
from etils import epath
from ml_collections import config_flags

# Only light modules here: flags and the config (and their mistakes) come
# before TensorFlow and JAX load (see main()).
from mural import config_lib
from mural import disk_space
from mural import host_memory
from mural import systems

_CONFIG = config_flags.DEFINE_config_file("config", None, "Config file (see configs/).", lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "Checkpoints, metrics.jsonl, TensorBoard, eval/.")
_MODE = flags.DEFINE_enum("mode", "train", ["train", "eval", "describe", "export", "plan"], "What to do.")
_DEVICES = flags.DEFINE_integer("devices", None, "--mode=plan: plan for this many (fake CPU) devices.")
_EXPORT_DIR = flags.DEFINE_string("export_dir", None, "--mode=export: where (default DIR/export/step_<N>).")
_STEP = flags.DEFINE_integer("step", None, "--mode=eval|export: the checkpoint step (default: the best "
                             "step of an early-stopping run, else the latest).")
_COORDINATOR = flags.DEFINE_string("coordinator_address", None,
                                   "host:port of process 0, for multi-process runs.")
_NUM_PROCESSES = flags.DEFINE_integer("num_processes", None, "Processes in a multi-process run.")
_PROCESS_ID = flags.DEFINE_integer("process_id", None, "This process's index in [0, num_processes).")
_DISTRIBUTED_TIMEOUT = flags.DEFINE_integer(
    "distributed_timeout_s", 600, "Seconds processes wait for each other to connect at start-up.")
_HEARTBEAT_TIMEOUT = flags.DEFINE_integer(
    "heartbeat_timeout_s", 30, "Seconds without a heartbeat after which a peer process counts as dead.")
_CONFIG_PATH = None  # The --config file, for error messages (set when flags are parsed).
_DISTRIBUTED = False  # jax.distributed is up (see _fail).
_TRAINING = False  # --mode=train has started (see _fail).


class _QuietOrbax(std_logging.Filter):
  """orbax logs a dozen INFO lines per checkpoint; keep its warnings and errors only."""

  def filter(self, record):
    return record.levelno >= std_logging.WARNING or "/orbax/" not in record.pathname


class _NoTpuProbe(std_logging.Filter):
  """JAX tries every backend it has a plugin for, and where libtpu is not installed logs
  "Unable to initialize backend 'tpu': INTERNAL: Failed to open libtpu.so ..." at INFO on
  every run. Other backends' failures (a GPU's CUDA) stay: they say why a device is unused."""

  def filter(self, record):
    return not (record.levelno < std_logging.WARNING and "backend 'tpu'" in record.getMessage()
                and "libtpu.so: cannot open shared object file" in record.getMessage())


def _fail(code: int, message: str, at_once: bool = False):
  print(f"mural: error: {message}", file=sys.stderr)
  if at_once or _DISTRIBUTED or _TRAINING:
    # sys.exit would wait at jax.distributed's shutdown barrier for peers that
    # may be stuck in a collective with this process, or for the train step
    # still compiling in its thread (train.compile_train_step_in_background): leave
    # now, and let the launcher (or the coordination service's heartbeat) stop the others.
    sys.stderr.flush()
    sys.stdout.flush()
    os._exit(code)
  sys.exit(code)


def _multi_process() -> bool:
  """Whether the multi-process flags are given (all of them, or an error)."""
  given = [f.value is not None for f in (_COORDINATOR, _NUM_PROCESSES, _PROCESS_ID)]
  if any(given) and not all(given):
    _fail(2, "--coordinator_address, --num_processes and --process_id go together")
  return all(given)


def _init_distributed(config, workdir: str):
  """jax.distributed.initialize when the multi-process flags are given.

  The slow per-process start-up happens first: process 0 learns the
  vocabulary (if the run needs one) before it connects, so no peer waits on
  it inside a collective (gloo gives up on a collective after 30 s), and
  jax.distributed.initialize waits up to --distributed_timeout_s for all.
  A peer that stops sending heartbeats for --heartbeat_timeout_s is
  reported by the coordination service and the others stop.
  """
  if not _multi_process():
    return
  from mural import distributed  # pylint: disable=g-import-not-at-top
  from mural import system  # pylint: disable=g-import-not-at-top
  from mural.data import vocab  # pylint: disable=g-import-not-at-top
  if _PROCESS_ID.value == 0 and _MODE.value == "train" and not config.data.vocab_path:
    vocab.learn(config, system.vocabulary_tasks(systems.get(config), config), workdir)
  distributed.initialize(_COORDINATOR.value, _NUM_PROCESSES.value, _PROCESS_ID.value,
                         initialization_timeout=_DISTRIBUTED_TIMEOUT.value,
                         heartbeat_timeout_seconds=_HEARTBEAT_TIMEOUT.value)
  global _DISTRIBUTED
  _DISTRIBUTED = True


def _start_backend() -> None:
  """Starts JAX's backend (after jax.distributed, which must come first): a platform this host
  lacks (JAX_PLATFORMS=tpu or cuda without one) is one line, not a traceback from the first
  JAX call deep in the trainer."""
  import jax  # pylint: disable=g-import-not-at-top
  try:
    devices = jax.devices()
  except RuntimeError as e:
    _fail(2, f"JAX cannot start a backend here: {_one_line(str(e))}")
  logging.info("JAX's backend: %s, %d devices (%s) over %d processes.", jax.default_backend(), len(devices),
               devices[0].device_kind, jax.process_count())


def _config_error(e: BaseException) -> str:
  """A config file that failed to load, as '--config: FILE:LINE: Error: message'."""
  if isinstance(e, SyntaxError) and e.filename:
    return f"--config: {e.filename}:{e.lineno}: SyntaxError: {e.msg}"
  path = _CONFIG_PATH or ""
  frames = [f for f in traceback.extract_tb(e.__traceback__) if path and f.filename == os.path.abspath(path)]
  where = f"{frames[-1].filename}:{frames[-1].lineno}: " if frames else ""
  return f"--config: {where}{type(e).__name__}: {_one_line(str(e))}"


def _writable_workdir(workdir: str) -> None:
  """Creates workdir and checks it takes a file, so a bad path fails now in one line."""
  try:
    path = epath.Path(workdir)
    path.mkdir(parents=True, exist_ok=True)
    probe = path / f".mural_write_test.{os.getpid()}"
    probe.write_text("")
    probe.unlink()
  except OSError as e:
    _fail(2, f"--workdir: {workdir} is not a writable directory ({e.strerror or _one_line(str(e))})")


def _recorded_config():
  """Without --config, the config WORKDIR/config.json records (written by --mode=train)."""
  if not _WORKDIR.value:
    _fail(2, f"--config is required (or --workdir, for the {config_lib.RECORD} a --mode=train run "
          "recorded there)")
  try:
    config = systems.recorded(_WORKDIR.value)
  except config_lib.ConfigError as e:
    _fail(2, f"no --config, and {e}")
  logging.info("Config: %s (recorded by the run that trained it).", config_lib.record_path(_WORKDIR.value))
  return config


def _interrupted(signum, frame):
  """Ctrl-C outside the training loop's stop request (checkpointing.StopRequest), or a second one
  in it: one line, exit 130, at once. Not a KeyboardInterrupt: one raised in a garbage-collector
  callback (jax's) is ignored, and a normal exit under XLA's compiling threads crashed."""
  del signum, frame
  _fail(130, f"interrupted (Ctrl-C) in --mode={_MODE.value}" + (
      "; the same command resumes from the last checkpoint saved, if any" if _TRAINING else ""),
        at_once=True)


def main(argv):
  global _TRAINING
  if len(argv) > 1:
    _fail(2, f"unexpected arguments {argv[1:]}")
  if signal.getsignal(signal.SIGINT) is signal.default_int_handler:  # Not when started ignoring it.
    signal.signal(signal.SIGINT, _interrupted)
  std_logging.getLogger("absl").addFilter(_QuietOrbax())
  std_logging.getLogger("jax._src.xla_bridge").addFilter(_NoTpuProbe())
  try:
    config = _CONFIG.value
    if config is None:
      config = _recorded_config()
    config.keys()  # config_flags loads lazily: a bad file fails here.
  except OSError as e:
    _fail(2, "--config: " + _one_line(str(e)))
  except Exception as e:  # pylint: disable=broad-except  (any error of the config file's own code)
    _fail(2, _config_error(e))
  # Flag and config mistakes are reported here, before TensorFlow and JAX load.
  try:
    systems.validate(config)
    if _MODE.value not in ("describe", "plan"):
      if not _WORKDIR.value:
        _fail(2, "--workdir is required for --mode=" + _MODE.value)
      _writable_workdir(_WORKDIR.value)
  except config_lib.ConfigError as e:
    _fail(2, str(e))

  if _DEVICES.value is not None:
    if _MODE.value != "plan":
      _fail(2, "--devices: only for --mode=plan")
    _use_fake_cpu_devices(_DEVICES.value)
  if _MODE.value not in ("describe", "plan"):  # These build the model and step alone: no TensorFlow.
    from mural import kernels  # pylint: disable=g-import-not-at-top
    impl = config.model.image.conv_impl
    if impl == "native" or (impl == "auto" and kernels.cpu_backend_expected()):
      kernels.build_in_background()  # The C++ compiler, if it must run, runs beside TensorFlow's import.
    data.hide_accelerators_from_tensorflow()  # First thing once TensorFlow loads.
    data.set_tensorflow_intra_op_threads(config.data.tf_intra_op_threads)
  from mural import describe  # pylint: disable=g-import-not-at-top
  from mural import train  # pylint: disable=g-import-not-at-top
  from mural.state import TrainingError  # pylint: disable=g-import-not-at-top
  try:
    if _MODE.value == "describe":
      print(json.dumps(describe.describe(config)))
      return
    if _MODE.value == "plan":
      from mural import plan  # pylint: disable=g-import-not-at-top
      result = plan.plan(config)
      print(plan.table(result))
      print(json.dumps(result))
      return
    if _MODE.value == "export" and _multi_process():
      _fail(2, "--mode=export runs as one process (it reads a checkpoint of any process count)")
    _init_distributed(config, _WORKDIR.value)
    _start_backend()
    if _MODE.value == "train":
      _TRAINING = True
      train.train_and_evaluate(config, _WORKDIR.value)
    elif _MODE.value == "export":
      from mural import export  # pylint: disable=g-import-not-at-top
      print(export.export(config, _WORKDIR.value, _EXPORT_DIR.value, _STEP.value))
    else:
      train.evaluate(config, _WORKDIR.value, step=_STEP.value)
    minutes, seconds = divmod(round(time.monotonic() - _START), 60)
    logging.info("Done: --mode=%s in %d min %02d s of wall time (start-up, vocabulary and "
                 "compilation included).", _MODE.value, minutes, seconds)
  except config_lib.ConfigError as e:
    _fail(2, str(e))
  except disk_space.DiskFull as e:  # What, where, the space free, and what a rerun resumes from.
    logging.debug("Run failed", exc_info=True)
    _fail(1, str(e))
  except (FileNotFoundError, ValueError, TrainingError) as e:
    # Missing data, unusable sources, a non-finite loss: the message says it
    # all; the traceback is in the log with --verbosity=1.
    logging.debug("Run failed", exc_info=True)
    _fail(1, f"{type(e).__name__}: {e}")


def _use_fake_cpu_devices(n: int) -> None:
  """N CPU devices for --mode=plan (before JAX loads: XLA reads its flags once)."""
  if n < 1:
    _fail(2, f"--devices: must be >= 1, got {n}")
  if "jax" in sys.modules:
    _fail(2, "--devices: JAX is already loaded; run --mode=plan in a fresh process")
  os.environ["JAX_PLATFORMS"] = "cpu"
  os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count={n}".strip()


def _one_line(message: str) -> str:
  message = message.replace("\\n", "\n").replace("\\'", "'")  # KeyError reprs escape both.
  return " ".join(part.strip() for part in message.splitlines() if part.strip())


def _parse_flags(argv):
  """absl flag parsing with usage errors as one line and exit code 2."""
  global _CONFIG_PATH
  _CONFIG_PATH = next((a.split("=", 1)[1] for a in argv if a.startswith("--config=")), None)
  try:
    return flags.FLAGS(argv)
  except SyntaxError as e:  # The config file does not parse.
    _fail(2, _config_error(e))
  except (flags.Error, ValueError) as e:  # ValueError: an override path config_flags cannot parse.
    _fail(2, _flag_error(str(e)))
  except (AttributeError, KeyError) as e:  # config_flags: an override names no config field.
    if _raised_in_config_file(e):
      _fail(2, _config_error(e))
    name, _, hint = _one_line(str(e)).replace("'", "").partition(" ")
    _fail(2, f"--config override: no field {name}" + (f" ({hint})" if hint else ""))
  except Exception as e:  # pylint: disable=broad-except  (the config file's own code failed)
    _fail(2, _config_error(e))


def _flag_error(message: str) -> str:
  """A flag error in one line. config_flags puts the traceback of a config file's get_config that
  raised (configs/recorded.py:WORKDIR without a record) in its message: the flag and the error."""
  flag, found, rest = message.partition(": Error whilst parsing config file:")
  if not found or "Traceback (most recent call last)" not in rest:
    return _one_line(message)
  error = rest.strip().splitlines()[-1]
  kind, _, text = error.partition(": ")
  return f"{flag.removeprefix('flag ')}: " + (text if kind.endswith("ConfigError") else
                                              f"{kind.rsplit('.', 1)[-1]}: {text}")


def _raised_in_config_file(e: BaseException) -> bool:
  path = os.path.abspath(_CONFIG_PATH) if _CONFIG_PATH else None
  return any(f.filename == path for f in traceback.extract_tb(e.__traceback__))


def run():
  """Console-script entry point (setup.py: mural=mural.main:run)."""
  host_memory.prefer_memory_saving_schedule()  # XLA's CPU temporaries: fewer live at once,
  host_memory.reexec()  # and on huge pages (mural/host_memory.py); once.
  app.run(main, flags_parser=_parse_flags)


if __name__ == "__main__":
  run()
