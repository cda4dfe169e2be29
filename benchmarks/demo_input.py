"""The demo's input on its own: wall and CPU milliseconds per batch of each task.

  .venv/bin/python benchmarks/demo_input.py                 # configs/demo.py as it is
  .venv/bin/python benchmarks/demo_input.py --py_calls=2    # the synthetic sources' py calls in parallel
  git show REV:mural/data/pipeline.py > /tmp/old_pipeline.py
  .venv/bin/python benchmarks/demo_input.py --against=/tmp/old_pipeline.py   # A/B in one process

Builds configs/demo.py's train iterator as training does (a vocab learned into
a temporary directory first), pulls --warmup batches of a task, then times
--batches more, --repeats times, one task after the other; prints the median
wall and process CPU (all threads: tf.data's and the renderer's) per batch.
The demo's step shares the machine's cores with this CPU.

--against=FILE: another version of mural/data/pipeline.py; both build the same iterator
and are timed in one process, a round of --batches steps (both tasks) each in turn,
2 x --repeats rounds, so that the VM's changes of speed fall on both alike; prints the
median CPU-ms per step of each and their ratio.
"""

import argparse
import importlib.util
import os
import resource
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from mural import data  # pylint: disable=g-import-not-at-top,wrong-import-position

data.set_tensorflow_env_defaults()  # As mural's commands run TensorFlow: before it loads.

from configs import demo  # pylint: disable=g-import-not-at-top
from mural import system  # pylint: disable=g-import-not-at-top
from mural import systems  # pylint: disable=g-import-not-at-top
from mural.data import pipeline  # pylint: disable=g-import-not-at-top
from mural.data import synthetic  # pylint: disable=g-import-not-at-top
from mural.data import vocab  # pylint: disable=g-import-not-at-top


def _cpu() -> float:
  r = resource.getrusage(resource.RUSAGE_SELF)
  return r.ru_utime + r.ru_stime


def main(argv=None) -> None:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--py_calls", type=int, default=synthetic._PY_CALLS,  # pylint: disable=protected-access
                 help="the synthetic sources' py calls at a time")
  p.add_argument("--warmup", type=int, default=20)
  p.add_argument("--batches", type=int, default=50)
  p.add_argument("--repeats", type=int, default=3)
  p.add_argument("--against", help="another pipeline.py to time beside this checkout's (A/B)")
  a = p.parse_args(argv)
  synthetic._PY_CALLS = a.py_calls  # pylint: disable=protected-access
  config = demo.get_config()
  data.set_tensorflow_intra_op_threads(config.data.tf_intra_op_threads)  # As mural.main does.
  tasks = system.active_tasks(systems.get(config), config)
  start = time.time()
  tok = vocab.tokenizer(config, tasks, tempfile.mkdtemp())
  print(f"vocab learned in {time.time() - start:.1f} s")
  it = pipeline.build_train_iterator(config, tasks, tok)
  if a.against:
    _ab(a, it, config, tasks, tok)
    return
  for task in it._tasks:  # pylint: disable=protected-access
    for _ in range(a.warmup):
      task.next()
    wall, cpu = [], []
    for _ in range(a.repeats):
      c0, t0 = _cpu(), time.time()
      for _ in range(a.batches):
        task.next()
      wall.append((time.time() - t0) / a.batches * 1e3)
      cpu.append((_cpu() - c0) / a.batches * 1e3)
    print(f"{task.name}: batch {task.batch_size}, py_calls {a.py_calls}: median {statistics.median(wall):.1f} "
          f"ms wall, {statistics.median(cpu):.1f} CPU-ms per batch (runs: wall "
          f"{', '.join(f'{w:.1f}' for w in wall)}; CPU {', '.join(f'{c:.1f}' for c in cpu)})")
    task.close()


def _ab(a, it, config, tasks, tok) -> None:
  spec = importlib.util.spec_from_file_location("pipeline_against", a.against)
  other = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(other)
  iterators = {"this checkout": it, a.against: other.build_train_iterator(config, tasks, tok)}
  cpu = {name: [] for name in iterators}
  for iterator in iterators.values():
    for _ in range(a.warmup):
      next(iterator)
  order = list(iterators.items())
  for r in range(2 * a.repeats):
    for name, iterator in (order if r % 2 == 0 else order[::-1]):
      c0 = _cpu()
      for _ in range(a.batches):
        next(iterator)
      cpu[name].append((_cpu() - c0) / a.batches * 1e3)
  for name, c in cpu.items():
    print(f"{name}: median {statistics.median(c):.1f} CPU-ms per step, both tasks (rounds: "
          f"{', '.join(f'{x:.0f}' for x in c)})")
  mine, theirs = (statistics.median(c) for c in cpu.values())
  print(f"ratio this checkout / {a.against}: {mine / theirs:.3f}")


if __name__ == "__main__":
  main()
