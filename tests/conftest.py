"""Shared pytest helpers: config loading, the tiny training config, one vocab per session,
real data directories (skip when absent), quiet TF, a garbage collector tuned for tracing.

Subprocess workers (test_multihost, test_ring_loss, test_export) import this file as a
module too (`import conftest`: their directory is on sys.path).
"""

import contextlib
import gc
import logging
import os
import pathlib
import shutil
import subprocess
import sys

from mural import data as _data  # pylint: disable=g-import-not-at-top  (light: no TensorFlow)

_data.set_tensorflow_env_defaults()  # As mural's commands run TensorFlow; before anything loads it.

# Three XLA CPU flags for the tests (set before anything imports JAX; subprocesses
# inherit them through `xla_flags`). The tests' programs are tiny and their time
# goes to compiling, not running. LLVM -O0 cuts the CPU time of compiling the
# tiny train step by a third (39 -> 25 CPU-s) and of jit(init) by two thirds;
# the legacy loop emitters instead of the fusion emitters cut it by another
# ~40% (27.9 -> 16.6 CPU-s on an AMD EPYC, 20.1 -> 11.5 on an Intel Xeon). One
# LLVM module per program, not XLA's split of it into parts compiled in parallel
# (which two busy cores cannot use): the tiny step's compile 1.9 -> 1.6 CPU-s,
# test_models + test_locked + test_system 58.4 -> 52.7 CPU-s (Intel Xeon).
# None changes the HLO (the same fusions, the same maths; only the machine
# code of the fused loops). Set a flag yourself to test with another value.
_TEST_XLA_FLAGS = {"--xla_backend_optimization_level": "0", "--xla_cpu_use_fusion_emitters": "false",
                   "--xla_cpu_parallel_codegen_split_count": "1"}
for _flag, _value in _TEST_XLA_FLAGS.items():
  if _flag not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {_flag}={_value}".strip()


# JAX's persistent compilation cache for every test process and every subprocess
# they start (keyed by the program, so safe): a program several tests compile (the
# tiny train step, its evaluation) compiles once per run. MURAL_TEST_JAX_CACHE
# names a fresh directory to time the suite cold.
os.environ.setdefault("JAX_COMPILATION_CACHE_DIR",
                      os.environ.get("MURAL_TEST_JAX_CACHE", "/tmp/mural_test_jax_cache"))
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")


# No Python frames in the lowered programs' locations (JAX's default keeps up to 100 per
# op, which XLA carries as metadata through every pass): the same programs, and the same
# cache keys (JAX leaves debug info out of them), ~10% less CPU to compile the tiny train
# step and ~7% less over test_models + test_efficientnet_impl (benchmarks/pytest_cpu.py). Python tracebacks of the tests are untouched; set it yourself to
# see source lines in an XLA dump or a profile.
os.environ.setdefault("JAX_TRACEBACK_IN_LOCATIONS_LIMIT", "0")


def xla_flags(*extra: str) -> str:
  """XLA_FLAGS for a test's subprocess: the tests' flags above plus `extra`."""
  return " ".join([os.environ["XLA_FLAGS"], *extra])

import pytest  # pylint: disable=g-import-not-at-top

from mural import config_lib  # pylint: disable=g-import-not-at-top  (ml_collections only: no JAX)

ROOT = pathlib.Path(__file__).resolve().parents[1]


def load_benchmark(name: str):
  """benchmarks/<name>.py as a module (benchmarks/ is scripts, not a package)."""
  import importlib.util  # pylint: disable=g-import-not-at-top
  spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def load_config(name: str = "tiny"):
  """configs/<name>.py's get_config()."""
  return config_lib.from_file(ROOT / "configs" / f"{name}.py")


def set_fields(config, **overrides):
  """config with 'a.b.c'-named fields set (keyword names use '__' for '.')."""
  for key, value in overrides.items():
    config_lib.set_field(config, key.replace("__", "."), value)
  return config


# The image tower of the training tests (and the frozen backbone of the MULE, SMALR and Kádár et
# al. ones): B0's first stage only (stem, one MBConv block, head conv). What those tests check (the
# trainer, resume, checkpoints, sharding, hosts, export, the systems) does not depend on depth, and
# each stage costs compile time: the two-process test's partitioned step compiles in 9.7 s per
# process instead of 14.2 s with 3 stages (B0's first 3: one block of each kind, 64 parameter
# tensors) and 7 stages cost ~40% more than 3. The tower's own tests (test_models.py,
# test_efficientnet_impl.py) keep tiny.py's 7 stages, every kind of block.
TINY_STAGES = 1
TINY_FEATURES = 8  # Its pooled width: round_filters(16, 0.25).


def tiny_config(vocab_path: str = "", languages=("en", "de", "sw"), **overrides):
  """configs/tiny.py on the built-in data in `languages`, 16 held-out scenes, a given vocab, and
  shallower towers (TINY_STAGES; one text layer): what the training tests check (resume,
  checkpoints, sharding, hosts, export, the systems) does not depend on depth, and the second text
  layer costs a fifth of the tiny step's compile (11.0 -> 8.6 CPU-s). The towers' own tests
  (test_models.py) keep tiny.py's sizes."""
  c = load_config("tiny")
  c.model.text.num_layers = 1
  c.model.image.num_stages = TINY_STAGES
  c.model.heads.embed_dim = TINY_FEATURES  # MURAL embeds images as pooled, without a head.
  c.data.vocab_path = vocab_path
  c.data.synthetic.eval_scenes = 16
  c.data.synthetic.languages = list(languages)
  c.data.languages = list(languages)
  return set_fields(c, **overrides)


def tiny_word_system(c, languages=("en", "de", "sw")):
  """`c` (MULE's, SMALR's or Kádár et al.'s defaults) at the toy sizes their tests share: B0's
  first stage at width/depth 0.25 as the frozen backbone (TINY_STAGES) on 32 px, the built-in data
  in `languages` with 16 held-out scenes, 4 steps logged every step and checkpointed every 2."""
  c.model.image.variant = "b0"
  c.model.image.width_coefficient = 0.25
  c.model.image.depth_coefficient = 0.25
  c.model.image.num_stages = TINY_STAGES
  c.data.image_size = 32
  c.data.eval_resize = 36
  c.data.autotune = False  # As configs/tiny.py: a used iterator's deletion can otherwise wait.
  c.data.synthetic.languages = list(languages)
  c.data.languages = list(languages)
  c.data.synthetic.eval_scenes = 16
  c.eval_batch_size = 16
  c.total_steps = 4
  c.log_every_steps = 1
  c.eval_every_steps = 0
  c.checkpoint_every_steps = 2
  c.keep_checkpoints = 3
  return c


def workdir_with_words(tmp_path_factory, name: str, words_file: str):
  """A new workdir holding a copy of `words_file` as its word vocabulary (learned once per module)."""
  from mural.data import word_vocab  # pylint: disable=g-import-not-at-top  (TensorFlow)
  workdir = tmp_path_factory.mktemp(name)
  shutil.copy(words_file, workdir / word_vocab.FILE_NAME)
  return workdir


@contextlib.contextmanager
def records_per_source(n: int):
  """Vocabularies learned inside read n records per training source (training_text)."""
  from mural.data import training_text  # pylint: disable=g-import-not-at-top
  with pytest.MonkeyPatch.context() as patch:
    patch.setattr(training_text, "RECORDS_PER_SOURCE", n)
    yield


def learn_vocab(workdir) -> str:
  """A wordpiece vocab learned from the tiny config's training text (1000 records per source)."""
  from mural import system, systems  # pylint: disable=g-import-not-at-top
  from mural.data import vocab  # pylint: disable=g-import-not-at-top
  config = tiny_config()
  with records_per_source(1000):
    tasks = system.active_tasks(systems.get(config), config)
    return vocab.tokenizer(config, tasks, str(workdir)).vocab_path


def jit_vjp(f, args, cotangent, has_aux: bool = False):
  """[f(*args), *its gradients w.r.t. args at `cotangent`, *f's aux outputs (has_aux: f returns
  (out, aux))] as one jitted program. A function or its pullback run op by op (eager, with
  jax.vjp) compiles each of its ~100 ops of each shape alone, ~20 ms apiece; jitted, the same
  composition is one compile. (Under jax.enable_x64(True), float64 arrays in, float64 out.)"""
  import jax  # pylint: disable=g-import-not-at-top

  def outputs_and_grads(args, cotangent):
    if has_aux:
      out, pull, aux = jax.vjp(f, *args, has_aux=True)
      return [out, *pull(cotangent), *aux]
    out, pull = jax.vjp(f, *args)
    return [out, *pull(cotangent)]

  return jax.jit(outputs_and_grads)(list(args), cotangent)


def numeric_grad(f, x, eps: float = 1e-6):
  """The gradient of scalar f at array x by central differences, one element at a time: the
  reference the losses' autodiff gradients are checked against (pass float64 x)."""
  import numpy as np  # pylint: disable=g-import-not-at-top

  g = np.zeros_like(x)
  for idx in np.ndindex(*x.shape):
    step = np.zeros_like(x)
    step[idx] = eps
    g[idx] = (f(x + step) - f(x - step)) / (2 * eps)
  return g


class HookedIterator:
  """Wraps a training iterator; `hook(batch)` runs on batch number `at` (1-based; None: every
  batch) and may replace it."""

  def __init__(self, inner, at, hook):
    self.inner, self.at, self.hook, self.count = inner, at, hook, 0

  def __iter__(self):
    return self

  def __next__(self):
    self.count += 1
    batch = next(self.inner)
    if self.at is None or self.count == self.at:
      batch = self.hook(batch) or batch
    return batch

  def get_state(self):
    return self.inner.get_state()

  def set_state(self, state):
    self.inner.set_state(state)

  def skip_counts(self):
    return self.inner.skip_counts()


@contextlib.contextmanager
def train_step_lowerings():
  """Yields a list that ends up holding one entry per lowering of a jitted train_step in the block
  (JAX logs each at DEBUG; lowering comes before compiling or reading the persistent cache)."""
  pxla, lowerings = logging.getLogger("jax._src.interpreters.pxla"), []
  handler, level = logging.Handler(logging.DEBUG), pxla.level
  step = lambda r: r.getMessage().startswith("Compiling jit(train_step)")
  handler.emit = lambda r: lowerings.append(r) if step(r) else None
  pxla.addHandler(handler)
  pxla.setLevel(logging.DEBUG)
  try:
    yield lowerings
  finally:
    pxla.removeHandler(handler)
    pxla.setLevel(level)


@contextlib.contextmanager
def imports_in_threads(prefix: str = "mural-"):
  """Yields a list that ends up holding (thread name, module) for each import statement run in the
  block by a thread whose name starts with `prefix`. mural's own threads must run none: while one
  runs, a module imported in another thread may swap builtins.__import__ for the whole process
  (etils.epy.lazy_imports) and hand it lazy stand-ins (mural/lazy_import.py says more)."""
  import builtins  # pylint: disable=g-import-not-at-top
  import threading  # pylint: disable=g-import-not-at-top
  original, seen = builtins.__import__, []

  def recording(name, *args, **kwargs):
    thread = threading.current_thread().name
    if thread.startswith(prefix):
      seen.append((thread, name))
    return original(name, *args, **kwargs)

  builtins.__import__ = recording
  try:
    yield seen
  finally:
    builtins.__import__ = original


class SmallDisk:
  """A folder on a tmpfs of its own, which `fill` makes full: the real ENOSPC of every writer
  (Python's, tensorstore's under orbax, TensorFlow's, faiss's), which no mock gives."""

  def __init__(self, path: pathlib.Path):
    self.path, self._filler = path, path / ".filler"

  def free_bytes(self) -> int:
    return shutil.disk_usage(self.path).free

  def fill(self, leave: int = 0) -> None:
    """Leaves about `leave` bytes free (tmpfs counts whole pages)."""
    with open(self._filler, "ab") as f:
      f.write(b"\0" * max(self.free_bytes() - leave, 0))

  def empty(self) -> None:
    self._filler.unlink(missing_ok=True)

  def files(self):
    """Every file and folder on it but the filler, relative paths, sorted."""
    return sorted(str(p.relative_to(self.path)) for p in self.path.rglob("*") if p != self._filler)


@pytest.fixture
def small_disk(tmp_path):
  """A 32 MB tmpfs mounted for the test (needs root: skipped, saying so, where mounting fails)."""
  mount = tmp_path / "small_disk"
  mount.mkdir()
  try:
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=32m", "tmpfs", str(mount)],
                       capture_output=True, text=True, timeout=30)
    error = r.stderr.strip() if r.returncode else ""
  except OSError as e:  # No mount command.
    error = str(e)
  if error:
    pytest.skip(f"a full disk needs a tmpfs of its own, and mounting one failed: {error}")
  try:
    yield SmallDisk(mount)
  finally:
    subprocess.run(["umount", "-l", str(mount)], capture_output=True)


_TENSORFLOW_SPY = """
import sys
import tensorflow as tf
original = tf.config.set_visible_devices
def spy(devices, device_type=None):
  print("SET_VISIBLE_DEVICES", (list(devices), device_type), flush=True)  # Before any os._exit.
  return original(devices, device_type)
tf.config.set_visible_devices = spy
original_threads = tf.config.threading.set_intra_op_parallelism_threads
def spy_threads(n):
  print("SET_INTRA_OP_THREADS", n, flush=True)
  return original_threads(n)
tf.config.threading.set_intra_op_parallelism_threads = spy_threads
module = __import__(sys.argv[1], fromlist=["main"])
sys.argv = sys.argv[1:]
if sys.argv[0] == "mural.main":
  module.run()
else:
  from absl import app
  module._define_flags()
  app.run(module.main)
"""


def spy_on_tensorflow(entry: str, *args: str, **env: str):
  """Runs entry point `entry` (`python -m entry args`, `env` added to the environment) in a
  subprocess with tf.config.set_visible_devices spied on, and checks it hid the GPUs from
  TensorFlow. Returns (exit code, stdout lines, stderr)."""
  env = dict(os.environ, JAX_PLATFORMS="cpu", TF_CPP_MIN_LOG_LEVEL="3", **env)
  r = subprocess.run([sys.executable, "-c", _TENSORFLOW_SPY, entry, *args], cwd=ROOT, env=env,
                     capture_output=True, text=True, timeout=120)
  lines = r.stdout.strip().splitlines()
  calls = [l for l in lines if l.startswith("SET_VISIBLE_DEVICES ")]
  assert "([], 'GPU')" in "".join(calls), r.stdout[-2000:] + r.stderr[-2000:]
  return r.returncode, [l for l in lines if l not in calls], r.stderr


def sigterm(batch):
  """A HookedIterator hook: SIGTERM this process (the trainer checkpoints and stops after the step)."""
  import signal  # pylint: disable=g-import-not-at-top
  os.kill(os.getpid(), signal.SIGTERM)
  return batch


def assert_resumes_bit_exactly(config, workdir, reference, stop_at: int = 2):
  """Trains `config` in `workdir`, SIGTERM at step `stop_at`, resumes to config.total_steps:
  the final params equal those of `reference` (an uninterrupted run's result) bit for bit.
  Both runs reuse the reference's Setup (one trace and compile of the step)."""
  import jax  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  from mural import train  # pylint: disable=g-import-not-at-top
  setup, reference_params = reference["setup"], reference["state"].params
  inner = train.input_pipeline(config, setup, str(workdir))[1]
  stopped = train.train_and_evaluate(config, str(workdir), train_iter=HookedIterator(inner, stop_at, sigterm),
                                     evaluators=[], setup=setup)
  assert stopped["preempted"] and stopped["step"] == stop_at
  resumed = train.train_and_evaluate(config, str(workdir), evaluators=[], setup=setup)
  assert resumed["step"] == config.total_steps
  for a, b in zip(jax.tree.leaves(jax.device_get(resumed["state"].params)),
                  jax.tree.leaves(jax.device_get(reference_params))):
    np.testing.assert_array_equal(a, b)


@pytest.fixture(scope="session")
def tiny_vocab(tmp_path_factory) -> str:
  """One vocab for every test that trains the tiny model (learning it is the slow part of set-up).

  Under pytest-xdist the workers share it: the first to need it learns it into
  the run's common temp dir while holding a lock, the others read its path."""
  if not os.environ.get("PYTEST_XDIST_WORKER"):
    return learn_vocab(tmp_path_factory.mktemp("vocab"))
  import fcntl  # pylint: disable=g-import-not-at-top
  shared = tmp_path_factory.getbasetemp().parent / "tiny_vocab"  # Common to this run's workers.
  shared.mkdir(exist_ok=True)
  with open(shared / "lock", "w") as lock:
    fcntl.flock(lock, fcntl.LOCK_EX)
    done = shared / "vocab_path"
    if not done.exists():
      done.write_text(learn_vocab(shared / "vocab"))
    return done.read_text()


# The real data the tests read (the project's shared data folder, or $MURAL_TEST_DATA): Multi30k's
# release folder and the 875-photo Flickr8k subset (flickr8k_1k: its photos in images/, the release's
# text files in text/), which the flickr8k_dir fixture writes into the release's layout.
TEST_DATA = pathlib.Path(os.environ.get("MURAL_TEST_DATA", ROOT.parent / "shared" / "data"))
if not os.environ.get("MURAL_MULTI30K_DIR") and (TEST_DATA / "multi30k" / "task1").is_dir():
  os.environ["MURAL_MULTI30K_DIR"] = str(TEST_DATA / "multi30k")  # As a user sets it; subprocesses too.


@pytest.fixture(scope="session")
def multi30k_dir() -> str:
  """The Multi30k release folder ($MURAL_MULTI30K_DIR); skips if absent."""
  from mural.data import multi30k  # pylint: disable=g-import-not-at-top
  try:
    return multi30k.data_dir()
  except ValueError as e:
    pytest.skip(f"Multi30k data not available: {e}")


@pytest.fixture(scope="session")
def flickr8k_dir(tmp_path_factory, multi30k_dir) -> str:
  """A Flickr8k folder in the release's layout: the 875 photos of TEST_DATA/flickr8k_1k, written so
  by mural.data.flickr8k_subset; skips if absent. Its de, fr and cs captions come from Multi30k."""
  from mural.data import flickr8k_subset  # pylint: disable=g-import-not-at-top
  source = TEST_DATA / "flickr8k_1k"
  if not (source / "images").is_dir():
    pytest.skip(f"Flickr8k data not available: no {source}/images (set MURAL_TEST_DATA or MURAL_FLICKR8K_DIR)")
  out = tmp_path_factory.mktemp("flickr8k") / "flickr8k"
  flickr8k_subset.write(str(source), str(out), photos=875)
  os.environ["MURAL_FLICKR8K_DIR"] = str(out)  # For the commands the tests run.
  return str(out)


# ---- Scheduling under pytest-xdist (`make test`: -n 2 --dist loadfile --no-loadscope-reorder) ----
# Each file runs whole on one worker (its module fixtures are built once), in
# the order below, longest first (each file's CPU seconds in a cold run), so the
# two workers stay busy to the end; in a file, its longest test first. The two
# end-to-end files start together: test_multihost's two processes (8 devices)
# keep one worker's share of the cores while the other compiles test_train's
# program, which test_checkpointing and the multihost reference read later from
# the persistent cache. (Not --dist loadgroup: with pytest 9 its xdist_group
# marks do not group.)
HEAVY_FIRST = (
    "test_train.py",
    "test_multihost.py::test_two_processes_match_one_process",
    "test_multihost.py",
    "test_models.py",
    "test_export.py",
    "test_pretrained.py::test_the_lit_recipe_starts_at_the_reference_and_keeps_the_locked_tower",
    "test_pretrained.py",
    "test_pipeline.py",
    "test_kadar.py",
    "test_globetrotter.py",
    "test_checkpointing.py",
    "test_smalr.py",
    "test_efficientnet_impl.py",
    "test_mule.py",
    "test_tokenizer.py",
    "test_kernels.py",
    "test_describe.py",
    "test_locked.py",
    "test_bench_step.py",
    "test_system.py::test_toy_system_trains_through_the_public_trainer",
    "test_system.py",
    "test_plan.py",
    "test_sources.py",
    "test_ring_loss.py",
    "test_convert.py",
    "test_flickr8k.py",
)


def _rank(item) -> int:
  for name in (f"{item.path.name}::{item.originalname}", item.path.name):
    if name in HEAVY_FIRST:
      return HEAVY_FIRST.index(name)
  return len(HEAVY_FIRST)


def pytest_collection_modifyitems(config, items):
  del config
  order = {item: i for i, item in enumerate(items)}
  items.sort(key=lambda item: (_rank(item), order[item]))


def collect_garbage_less() -> None:
  """Tunes Python's cyclic garbage collector for a test process, once its imports are done.

  Building a JAX program allocates millions of short-lived objects, and each full collection
  walks the whole heap (~700k objects once JAX, Flax and TensorFlow are imported). Freezing
  what the imports made and collecting generation 0 every 10,000 allocations instead of 700
  cut the collector's share of building the tiny train step from 1.2 s to 0.3 s (of 8.5 s).
  Tests only: in mural.main the demo showed no difference beyond run-to-run noise."""
  gc.collect()
  gc.freeze()
  gc.set_threshold(10_000, 10, 10)


def pytest_collection_finish(session):
  """Every test file (JAX, Flax, TensorFlow) is imported by now."""
  del session
  collect_garbage_less()


def pytest_configure(config):
  """Starts the C++ kernels' build (mural/kernels) in this test process's background, so the
  compiler runs beside test collection, where JAX, Flax and TensorFlow load (a new machine:
  15-20 s of g++ the first tests would otherwise wait for). Not in xdist's controller, which
  runs no test; the workers share one build through the cache folder's lock."""
  if os.environ.get("PYTEST_XDIST_WORKER") or not config.getoption("numprocesses", None):
    from mural import kernels  # pylint: disable=g-import-not-at-top
    kernels.build_in_background()
