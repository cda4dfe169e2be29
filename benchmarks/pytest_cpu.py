"""A pytest plugin: the CPU seconds of each test (its process and the children it waited for),
and the seconds its own process spent building JAX programs.

Wall times under `-n 2` mostly say which tests ran beside the two-process test;
CPU seconds say what each test costs, and the JAX columns how much of that is
tracing, lowering and XLA compilation (in the test's process, not its
subprocesses). One tab-separated line per test (cpu_s, wall_s, node id, trace_s,
lower_s, compile_s, compiles, xdist worker, start and end as Unix times) is appended to
$MURAL_TEST_CPU_LOG; the last three show how the two workers' loads line up:

  PYTHONPATH=benchmarks MURAL_TEST_CPU_LOG=/tmp/cpu.tsv MURAL_TEST_JAX_CACHE=$(mktemp -d) \\
    .venv/bin/python -m pytest -p pytest_cpu -q -n 2 --dist loadfile --no-loadscope-reorder tests
  awk -F'\\t' '{split($3, a, "::"); s[a[1]] += $1; c[a[1]] += $6} END {for (f in s) print s[f], c[f], f}' \\
    /tmp/cpu.tsv | sort -rn
"""

import collections
import os
import resource
import time

import pytest

# JAX's own duration events (jax/_src/dispatch.py): tracing, lowering to MLIR, XLA compilation.
_EVENTS = {"/jax/core/compile/jaxpr_trace_duration": "trace",
           "/jax/core/compile/jaxpr_to_mlir_module_duration": "lower",
           "/jax/core/compile/backend_compile_duration": "compile"}
_seconds = collections.Counter()
_listening = False


def _cpu_seconds() -> float:
  own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
  return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def _on_duration(event: str, seconds: float, **kwargs):
  del kwargs
  if event in _EVENTS:
    _seconds[_EVENTS[event]] += seconds
    _seconds["compiles"] += event.endswith("backend_compile_duration")


def _listen():
  """Registers the listener once, on the first test: importing JAX any earlier would read its
  environment (the compilation cache directory) before tests/conftest.py sets it."""
  global _listening
  if not _listening:
    import jax  # pylint: disable=g-import-not-at-top
    jax.monitoring.register_event_duration_secs_listener(_on_duration)
    _listening = True


def pytest_configure(config):
  del config
  if not os.environ.get("MURAL_TEST_CPU_LOG"):
    raise pytest.UsageError("pytest_cpu: set MURAL_TEST_CPU_LOG to the file to append to")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
  del nextitem
  _listen()
  _seconds.clear()
  cpu, wall = _cpu_seconds(), time.time()
  yield
  jax_s = "\t".join(f"{_seconds[k]:.1f}" for k in ("trace", "lower", "compile"))
  with open(os.environ["MURAL_TEST_CPU_LOG"], "a", encoding="utf-8") as f:
    f.write(f"{_cpu_seconds() - cpu:.1f}\t{time.time() - wall:.1f}\t{item.nodeid}\t{jax_s}\t"
            f"{_seconds['compiles']}\t{os.environ.get('PYTEST_XDIST_WORKER', '-')}\t{wall:.1f}\t{time.time():.1f}\n")
