"""What the *_claim scripts share: one `python -m mural.main` training run, logged to a file.

    from claim_runs import train          # a script in benchmarks/ imports it by name
    scores = train("mule_claim", "embn", workdir, ["--config=configs/mule_demo.py:embn"], log_dir)
"""

import json
import pathlib
import subprocess
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]


def train(script: str, name: str, workdir, args, log_dir, timed: bool = False):
  """Runs `python -m mural.main --workdir=WORKDIR *args` from the repository root, its output in
  LOG_DIR/<name>.log; exits naming `script`, the run and its log when it fails. Returns the last
  eval/step_<N>.json of the run as a dict ({} without one), with the seconds it took when
  `timed`; prints them otherwise."""
  start, workdir, log_dir = time.time(), pathlib.Path(workdir), pathlib.Path(log_dir)
  with open(log_dir / f"{name}.log", "w") as log:
    rc = subprocess.run([sys.executable, "-m", "mural.main", f"--workdir={workdir}", *args], cwd=ROOT,
                        stdout=log, stderr=subprocess.STDOUT).returncode
  if rc:
    sys.exit(f"{script}: run {name!r} failed (exit {rc}); see {log_dir / f'{name}.log'}")
  seconds = time.time() - start
  if not timed:
    print(f"{name}: {seconds:.0f} s", flush=True)
  evals = sorted((workdir / "eval").glob("step_*.json"), key=lambda p: int(p.stem.split("_")[1]))
  scores = json.loads(evals[-1].read_text()) if evals else {}
  return (scores, seconds) if timed else scores
