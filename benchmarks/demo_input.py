"""The demo's input on its own: wall and CPU milliseconds per batch of each task.

  .venv/bin/python benchmarks/demo_input.py                 # configs/demo.py as it is
  .venv/bin/python benchmarks/demo_input.py --py_calls=2    # the synthetic sources' py calls in parallel

Builds configs/demo.py's train iterator as training does (a vocab learned into
a temporary directory first), pulls --warmup batches of a task, then times
--batches more, --repeats times, one task after the other; prints the median
wall and process CPU (all threads: tf.data's and the renderer's) per batch.
The demo's step shares the machine's cores with this CPU.
"""

import argparse
import os
import resource
import statistics
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

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
  a = p.parse_args(argv)
  synthetic._PY_CALLS = a.py_calls  # pylint: disable=protected-access
  config = demo.get_config()
  tasks = system.active_tasks(systems.get(config), config)
  start = time.time()
  tok = vocab.tokenizer(config, tasks, tempfile.mkdtemp())
  print(f"vocab learned in {time.time() - start:.1f} s")
  it = pipeline.build_train_iterator(config, tasks, tok)
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


if __name__ == "__main__":
  main()
