"""Locked-image tuning (LiT) against tuning both towers: the train step's time and memory, in one run.

    python benchmarks/lit_step.py                         # configs/demo.py
    python benchmarks/lit_step.py --config=configs/flickr8k.py --steps=10 --record

Builds the production step (train.build, train.jit_train_step) twice from one config, as
shipped and with --config.model.image.locked=True, on random batches of its layout
(`random_batch`), and times them in alternating rounds of steps, so that both see the
same machine. Prints, for each: the median step time, XLA's temporary and argument bytes
(memory_analysis), the optimizer state's bytes and the trained parameters; and the ratios.
--record appends them to benchmarks/results.jsonl.
"""

import argparse
import statistics
import time

import jax
import numpy as np

from mural import config_lib
from mural import sharding
from mural import train


def _bytes(tree) -> int:
  return sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(tree))


def random_batch(setup, config, seed: int = 0):
  """A random batch of every task's layout: N(0, 1) pixels, token ids in the vocabulary, masks of
  a random length, every record valid."""
  rng = np.random.default_rng(seed)
  batch = {}
  for task in setup.tasks:
    local = {}
    for key, s in task.shapes(config).items():
      if s.dtype == np.bool_:
        local[key] = np.ones(s.shape, np.bool_)
      elif key.endswith("mask"):
        lengths = rng.integers(min(8, s.shape[-1]), s.shape[-1] + 1, (s.shape[0], 1))
        local[key] = (np.arange(s.shape[-1])[None] < lengths).astype(s.dtype)
      elif np.issubdtype(s.dtype, np.integer):
        local[key] = rng.integers(1, config.model.text.vocab_size, s.shape).astype(s.dtype)
      else:
        local[key] = rng.standard_normal(s.shape).astype(s.dtype)
    batch[task.name] = sharding.global_batch(local, setup.data_sharding)
  return batch


def build(config_file: str, locked: bool):
  config = config_lib.from_file(config_file)
  config.model.image.locked = locked
  setup = train.build(config)
  state = setup.init_state(jax.random.PRNGKey(config.seed))
  batch = random_batch(setup, config)
  compiled = train.jit_train_step(setup).lower(state, batch).compile()
  memory = compiled.memory_analysis()
  return dict(compiled=compiled, state=state, batch=batch, times=[],
              temp=memory.temp_size_in_bytes, args=memory.argument_size_in_bytes,
              opt_state=_bytes(state.opt_state), params=_bytes(state.params))


def main():
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--config", default="configs/demo.py")
  p.add_argument("--steps", type=int, default=20, help="timed steps of each, in rounds of 5")
  p.add_argument("--record", action="store_true", help="append the figures to benchmarks/results.jsonl")
  args = p.parse_args()
  runs = {name: build(args.config, locked) for name, locked in (("both towers", False), ("image locked", True))}
  for run in runs.values():  # Warm-up: the first steps allocate.
    for _ in range(2):
      run["state"], metrics = run["compiled"](run["state"], run["batch"])
      jax.block_until_ready(metrics)
  for _ in range(max(1, args.steps // 5)):
    for run in runs.values():
      for _ in range(5):
        start = time.perf_counter()
        run["state"], metrics = run["compiled"](run["state"], run["batch"])
        jax.block_until_ready((run["state"], metrics))
        run["times"].append(time.perf_counter() - start)
  figures = {}
  for name, run in runs.items():
    step = statistics.median(run["times"])
    figures[f"{name}: step s"] = round(step, 3)
    figures[f"{name}: XLA temp MiB"] = round(run["temp"] / 2**20, 1)
    figures[f"{name}: optimizer state MiB"] = round(run["opt_state"] / 2**20, 1)
    print(f"{name:>13}: step {step:.3f} s (median of {len(run['times'])}), XLA temporaries "
          f"{run['temp'] / 2**20:.1f} MiB, arguments {run['args'] / 2**20:.1f} MiB, optimizer state "
          f"{run['opt_state'] / 2**20:.1f} MiB, parameters {run['params'] / 2**20:.1f} MiB")
  both, lit = runs["both towers"], runs["image locked"]
  figures["step time ratio (locked / both)"] = round(statistics.median(lit["times"]) / statistics.median(both["times"]), 3)
  figures["optimizer state ratio"] = round(lit["opt_state"] / both["opt_state"], 3)
  print({k: v for k, v in figures.items() if "ratio" in k})
  if args.record:
    from results import record  # pylint: disable=g-import-not-at-top  (benchmarks/results.py)
    record("lit_step", figures, config=args.config)


if __name__ == "__main__":
  main()
