"""One process's wall time and peak RSS, for the benchmarks that time commands.

A child's peak RSS (from wait4) starts at its parent's RSS when it forks, so the parent should be a
light process (no JAX, no TensorFlow). Standard library only.
"""

import os
import subprocess
import time


def run(name: str, argv, cwd) -> dict:
  """Runs argv in cwd; {"wall s", "peak RSS MiB", "output"} of that process alone (SystemExit with
  its output's tail when it fails)."""
  start = time.time()
  process = subprocess.Popen(argv, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
  output = process.stdout.read()
  _, status, usage = os.wait4(process.pid, 0)
  wall = time.time() - start
  if status:
    print(output[-4000:])
    raise SystemExit(f"{name}: {' '.join(map(str, argv))} failed")
  print(f"{name}: {wall:.1f} s, peak RSS {usage.ru_maxrss / 1024:.0f} MiB", flush=True)
  return {"wall s": round(wall, 1), "peak RSS MiB": round(usage.ru_maxrss / 1024), "output": output}
