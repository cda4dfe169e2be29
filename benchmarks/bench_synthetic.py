"""Examples/s of the synthetic data generator on ONE CPU core.

  .venv/bin/python benchmarks/bench_synthetic.py [--size 64] [--n 2000] [--repeats 5]

Pins the process to one core (sched_setaffinity, like `taskset -c 0`) and
gives TensorFlow one thread, then times, as the median over repeats:
  numpy image-text: image_text_batch (scene, render, caption) on fresh indices;
  tf.data image-text: image_text_source end to end (numpy_function chunks);
  tf.data text pairs: text_pair_source.
"""

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # Run from a checkout.
from mural import data as _data  # pylint: disable=g-import-not-at-top,wrong-import-position

_data.set_tensorflow_env_defaults()  # As mural's commands run TensorFlow: before it loads.


def _median_rate(fn, n: int, repeats: int) -> float:
  rates = []
  for r in range(repeats):
    start = time.perf_counter()
    fn(r)
    rates.append(n / (time.perf_counter() - start))
  return statistics.median(rates)


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--size", type=int, default=64, help="render_size in pixels")
  parser.add_argument("--n", type=int, default=2000, help="examples per repeat")
  parser.add_argument("--repeats", type=int, default=5)
  parser.add_argument("--core", type=int, default=min(os.sched_getaffinity(0)))
  args = parser.parse_args()
  os.sched_setaffinity(0, {args.core})

  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  tf.config.threading.set_inter_op_parallelism_threads(1)
  tf.config.threading.set_intra_op_parallelism_threads(1)
  from mural import config_lib  # pylint: disable=g-import-not-at-top
  from mural.data import synthetic  # pylint: disable=g-import-not-at-top

  config = config_lib.base_config()
  config.data.synthetic.render_size = args.size
  settings = synthetic.Settings.from_config(config)
  n = args.n
  options = tf.data.Options()
  options.threading.private_threadpool_size = 1
  options.threading.max_intra_op_parallelism = 1

  def numpy_run(r):  # Fresh indices every repeat: nothing cached.
    synthetic.image_text_batch(settings, "train", range(r * n, (r + 1) * n))

  def tf_run(make):
    def run(r):
      ds = make(config, "train", 0, 1, start_index=r * n).take(n).with_options(options)
      for _ in ds:
        pass
    return run

  print(f"synthetic data, {args.size}x{args.size} px, 1 core (cpu {args.core}), "
        f"median of {args.repeats} x {n} examples")
  print(f"  numpy image-text   {_median_rate(numpy_run, n, args.repeats):8.0f} examples/s")
  print(f"  tf.data image-text {_median_rate(tf_run(synthetic.image_text_source), n, args.repeats):8.0f} examples/s")
  print(f"  tf.data text pairs {_median_rate(tf_run(synthetic.text_pair_source), n, args.repeats):8.0f} examples/s")


if __name__ == "__main__":
  main()
