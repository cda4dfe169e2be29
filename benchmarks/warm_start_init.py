"""What a warm start saves when a run initialises: the init program with the loaded towers left out
against the whole one (train.Setup.init_state).

    python benchmarks/warm_start_init.py --config=configs/mural_base.py --work=/tmp/warm_init [--record]

Each case runs in its own process (peak RSS from wait4). 'plain' initialises every variable, as a
run from scratch does. 'warm' starts from a checkpoint of the same config with
init_from_parts=towers, as a run on pretrained towers does: the towers are loaded, and only the
heads and the temperature are drawn. A first process writes that checkpoint. Prints the init's
seconds (trace, compile and run, placing the loaded arrays included) and each process's peak RSS.
"""

import argparse
import json
import os
import shutil
import sys
import time

import process_cost

HERE = os.path.dirname(os.path.abspath(__file__))


def child(case: str, config_file: str, source: str) -> None:
  """One case, in this process: prints RESULT {json}."""
  import jax  # pylint: disable=g-import-not-at-top
  from mural import checkpointing  # pylint: disable=g-import-not-at-top
  from mural import config_lib  # pylint: disable=g-import-not-at-top
  from mural import train  # pylint: disable=g-import-not-at-top
  from mural import warm_start  # pylint: disable=g-import-not-at-top
  config = config_lib.from_file(config_file)
  if case == "warm":
    config.init_from, config.init_from_parts = source, "towers"
  setup = train.build(config)
  warm = warm_start.match(setup.abstract_state, config) if case == "warm" else None
  start = time.perf_counter()
  state = jax.block_until_ready(setup.init_state(jax.random.PRNGKey(config.seed), warm))
  seconds = time.perf_counter() - start
  if case == "source":
    os.makedirs(source, exist_ok=True)
    config_lib.write_record(config, source)  # What source_vocab reads.
    checkpoints = checkpointing.Checkpoints(source, 1)
    checkpoints.save(0, state, {})
    checkpoints.wait()
    checkpoints.close()
  loaded = len(warm.report["loaded"]) if warm is not None else 0
  print("RESULT " + json.dumps({"init s": round(seconds, 1), "arrays loaded": loaded}), flush=True)


def main():
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--config", default="configs/mural_base.py")
  p.add_argument("--work", default="/tmp/warm_start_init", help="where the source checkpoint is written (removed at the end)")
  p.add_argument("--record", action="store_true", help="append the figures to benchmarks/results.jsonl")
  p.add_argument("--case", choices=["source", "plain", "warm"], help=argparse.SUPPRESS)  # A child's.
  args = p.parse_args()
  if args.case:
    child(args.case, args.config, os.path.join(args.work, "source"))
    return
  root = os.path.dirname(HERE)
  figures = {}
  for case in ("source", "plain", "warm"):
    run = process_cost.run(case, [sys.executable, os.path.abspath(__file__), f"--config={args.config}",
                                  f"--work={args.work}", f"--case={case}"], root)
    result = json.loads(next(l for l in run["output"].splitlines() if l.startswith("RESULT "))[7:])
    print(f"{case}: init {result['init s']} s, {result['arrays loaded']} arrays loaded", flush=True)
    if case != "source":
      figures[f"{case}: init s"] = result["init s"]
      figures[f"{case}: peak RSS MiB"] = run["peak RSS MiB"]
  shutil.rmtree(args.work, ignore_errors=True)  # The source checkpoint (3.6 GB at mural_base's size).
  if args.record:
    from results import record  # pylint: disable=g-import-not-at-top
    record("warm_start_init", figures, config=args.config,
           note="init = trace + compile + run (+ placing the loaded towers); each case its own process")


if __name__ == "__main__":
  main()
