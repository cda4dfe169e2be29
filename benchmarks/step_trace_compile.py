"""How a config's train step splits between tracing (Python) and XLA's compile.

    python benchmarks/step_trace_compile.py --config=configs/demo.py
    python benchmarks/step_trace_compile.py --config=configs/flickr8k.py --record

train.compile_train_step_in_background traces and lowers the step in the caller's thread (a
trace runs import statements, which must not run beside another thread's imports) and runs only
XLA's compile in its thread: the trace is what start-up waits for before the overlap begins.
Prints the seconds of each (wall, one process, kernels already built); --record appends them
to benchmarks/results.jsonl.
"""

import argparse
import time

import jax

from mural import config_lib
from mural import train


def main():
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--config", default="configs/demo.py")
  p.add_argument("--record", action="store_true", help="append the figures to benchmarks/results.jsonl")
  args = p.parse_args()
  setup = train.build(config_lib.from_file(args.config))
  state = jax.tree.map(lambda s, sh: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh),
                       setup.abstract_state, setup.state_shardings)
  batch = {t.name: {k: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=setup.data_sharding)
                    for k, s in t.shapes(setup.config).items()} for t in setup.tasks}
  start = time.perf_counter()
  lowered = train.jit_train_step(setup).lower(state, batch)
  traced = time.perf_counter() - start
  start = time.perf_counter()
  lowered.compile()
  compiled = time.perf_counter() - start
  print(f"{args.config}: trace and lower {traced:.1f} s (caller's thread), XLA compile {compiled:.1f} s "
        f"(background thread)")
  if args.record:
    from results import record  # pylint: disable=g-import-not-at-top  (benchmarks/results.py)
    record("step_trace_compile", {"trace s": round(traced, 1), "compile s": round(compiled, 1)},
           config=args.config)


if __name__ == "__main__":
  main()
