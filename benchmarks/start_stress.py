"""Starts every shipped config's training, to its first step, many times, each from nothing.

    python benchmarks/start_stress.py --rounds=5
    python benchmarks/start_stress.py --rounds=20 --configs=flickr8k,demo

Each start is `python -m mural.main --mode=train` in a fresh process, a new workdir and an empty
kernel cache (MURAL_KERNEL_CACHE: the C++ kernels compile again beside the step's compile), the
way a new user's first run starts; it passes when the run logs its first step
(metrics.jsonl's first line) and is then killed. The start-up runs several threads at once (the
kernels' build, the step's compile, TensorFlow's input), so a fault that depends on their
timing shows as a failed start here. Configs at the papers' sizes start at CPU scale
(PAPER_SIZE: batch 8, 64 px); the others as shipped. Prints one line per start and a
table; exits 1 when any start failed. --record appends the counts to benchmarks/results.jsonl
(results.py).
"""

import argparse
import collections
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
# `recorded.py` reads a workdir's record and `custom.py` a user's data folder: neither is a config
# of its own.
NOT_STARTABLE = ("custom", "recorded")
# Configs at the papers' sizes, which a 2-core machine cannot start as shipped (batches of 128-4096
# at 112-800 px): their own towers and tasks at a batch and image size that fit.
PAPER_SIZE = ("align_base", "align_l2", "globetrotter", "kadar", "mule", "mural_base", "mural_large",
              "smalr")
PAPER_SIZE_OVERRIDES = ("--config.data.image_size=64", "--config.eval_batch_size=8")
PAPER_SIZE_BATCH = 8


def shipped_configs():
  return sorted(p.stem for p in (ROOT / "configs").glob("*.py") if p.stem not in NOT_STARTABLE)


def command(name: str, workdir: str):
  args = [sys.executable, "-m", "mural.main", f"--config=configs/{name}.py", f"--workdir={workdir}",
          "--config.log_every_steps=1"]
  if name in PAPER_SIZE:
    sys.path.insert(0, str(ROOT))
    from mural import config_lib  # pylint: disable=g-import-not-at-top  (ml_collections only)
    tasks = config_lib.from_file(ROOT / "configs" / f"{name}.py").tasks
    args += PAPER_SIZE_OVERRIDES
    args += [f"--config.tasks.{task}.batch_size={PAPER_SIZE_BATCH}" for task in tasks
             if "batch_size" in tasks[task]]
  return args


def start(name: str, timeout: float):
  """(passed, seconds to the first step or to the failure, the log's last lines)."""
  scratch = pathlib.Path(tempfile.mkdtemp(prefix=f"mural_start_{name}_"))
  workdir, log = scratch / "workdir", scratch / "log.txt"
  env = dict(os.environ, MURAL_KERNEL_CACHE=str(scratch / "kernels"), JAX_PLATFORMS="cpu")
  began = time.monotonic()
  with open(log, "w") as out:
    process = subprocess.Popen(command(name, str(workdir)), cwd=ROOT, env=env, stdout=out,
                               stderr=subprocess.STDOUT, start_new_session=True)
    metrics = workdir / "metrics.jsonl"
    try:
      while True:
        if metrics.exists() and metrics.read_text().strip():
          return True, time.monotonic() - began, ""
        if process.poll() is not None or time.monotonic() - began > timeout:
          break
        time.sleep(0.5)
    finally:
      if process.poll() is None:
        os.killpg(process.pid, signal.SIGKILL)
      process.wait()
      tail = "\n".join(log.read_text(errors="replace").splitlines()[-25:])
      shutil.rmtree(scratch, ignore_errors=True)
  why = "timed out" if process.returncode in (-signal.SIGKILL,) else f"exit {process.returncode}"
  return False, time.monotonic() - began, f"{why}\n{tail}"


def main():
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--rounds", type=int, default=5, help="starts per config")
  p.add_argument("--configs", default="", help="comma-separated config names (default: every shipped one)")
  p.add_argument("--timeout", type=float, default=900, help="seconds a start may take")
  p.add_argument("--record", action="store_true", help="append the counts to benchmarks/results.jsonl")
  args = p.parse_args()
  names = args.configs.split(",") if args.configs else shipped_configs()
  results = collections.defaultdict(list)
  for r in range(args.rounds):
    for name in names:
      passed, seconds, why = start(name, args.timeout)
      results[name].append((passed, seconds))
      print(f"round {r + 1}/{args.rounds} {name}: {'ok' if passed else 'FAILED'} in {seconds:.0f} s",
            flush=True)
      if not passed:
        print(why, flush=True)
  print(f"\n{'config':<18} starts  passed  median s to step 1")
  for name in names:
    times = sorted(s for _, s in results[name])
    print(f"{name:<18} {len(times):>6}  {sum(ok for ok, _ in results[name]):>6}  {times[len(times) // 2]:>8.0f}")
  failed = sum(not ok for runs in results.values() for ok, _ in runs)
  starts = sum(map(len, results.values()))
  print(f"{starts} starts, {failed} failed")
  if args.record:
    from results import record  # pylint: disable=g-import-not-at-top  (benchmarks/results.py)
    record("start_stress", {"starts": starts, "failed": failed, "configs": len(names),
                            "rounds": args.rounds},
           config="every shipped config" if not args.configs else ",".join(names))
  sys.exit(1 if failed else 0)


if __name__ == "__main__":
  main()
