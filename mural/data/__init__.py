"""mural's input side: sources, record kinds, the tf.data pipeline, vocabulary, eval sets."""

import contextlib
import logging
import os
import sys
import tempfile

# What TensorFlow's C++ start-up writes to file descriptor 2 when it probes for
# CUDA on a machine without it (and the absl header it comes under). It is
# written before any logging is set up, so TF_CPP_MIN_LOG_LEVEL and absl's
# verbosity do not reach it.
_CUDA_PROBE_LINES = ("cudart_stub.cc", "cuda_platform.cc", "cuda_executor.cc", "failed call to cuInit",
                     "Unable to register cu", "TF-TRT Warning", "before absl::InitializeLog() is called")


def set_tensorflow_env_defaults() -> None:
  """What mural's commands ask of TensorFlow unless the environment says otherwise; call it
  before TensorFlow loads. TensorFlow runs only the input pipeline here: no INFO lines
  (TF_CPP_MIN_LOG_LEVEL 2), and its oneDNN graph rewrites off (TF_ENABLE_ONEDNN_OPTS 0),
  which the pipeline's ops do not gain from (benchmarks/bench_pipeline.py) and which write "oneDNN custom operations are on" twice at import and an
  E-level "oneDNN supports DT_INT64 only on platforms with AVX-512" at the first batch."""
  os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
  os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")


@contextlib.contextmanager
def _without_cuda_probe_lines():
  """Drops _CUDA_PROBE_LINES from what the block writes to fd 2; the rest comes through after it."""
  sys.stderr.flush()
  saved = os.dup(2)
  with tempfile.TemporaryFile() as captured:
    os.dup2(captured.fileno(), 2)
    try:
      yield
    finally:
      sys.stderr.flush()
      os.dup2(saved, 2)
      os.close(saved)
      captured.seek(0)
      kept = [line for line in captured.read().decode("utf-8", "replace").splitlines(keepends=True)
              if not any(mark in line for mark in _CUDA_PROBE_LINES)]
      sys.stderr.write("".join(kept))
      sys.stderr.flush()


def set_tensorflow_intra_op_threads(threads: int) -> None:
  """TensorFlow's threads inside one op (config.data.tf_intra_op_threads; 0: its default).

  TensorFlow runs only the input pipeline here, whose parallelism is tf.data's parallel
  calls. An op split over several threads leaves them polling the cores for work between
  records, CPU the train step needs on a small host: configs/demo.py's image-text input
  took 96 CPU-ms per batch with 1 thread, 111-138 with the default 2 (benchmarks/README.md).
  Call it before TensorFlow runs an op; later, a warning says it did nothing.
  """
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  if threads:
    try:
      tf.config.threading.set_intra_op_parallelism_threads(threads)
    except RuntimeError as e:  # TensorFlow has started.
      logging.warning("TensorFlow's intra-op threads stay at %d: %s",
                      tf.config.threading.get_intra_op_parallelism_threads(), e)


def hide_accelerators_from_tensorflow():
  """TensorFlow only runs the input pipeline: keep it off the GPUs/TPUs JAX uses.

  Without this, TF initialises CUDA and takes GPU memory beside JAX (big_vision
  does the same first thing). Every entry point calls it before TF makes its
  devices (mural.main, mural.data.convert). The CUDA probe's lines on a
  machine without CUDA are dropped: they say nothing about this run.
  """
  with _without_cuda_probe_lines():
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    failures = []
    for kind in ("GPU", "TPU"):
      try:
        tf.config.set_visible_devices([], kind)
      except (ValueError, RuntimeError) as e:  # A kind this build lacks; devices already made.
        failures.append((kind, e))
  for kind, e in failures:
    logging.warning("Could not hide %s devices from TensorFlow: %s", kind, e)
