"""A pytest plugin: the CPU seconds of each test (its process and the children it waited for).

Wall times under `-n 2` mostly say which tests ran beside the two-process test;
CPU seconds say what each test costs. One tab-separated line per test
(cpu_s, wall_s, node id) is appended to $MURAL_TEST_CPU_LOG:

  PYTHONPATH=benchmarks MURAL_TEST_CPU_LOG=/tmp/cpu.tsv MURAL_TEST_JAX_CACHE=$(mktemp -d) \\
    .venv/bin/python -m pytest -p pytest_cpu -q -n 2 --dist loadfile --no-loadscope-reorder tests
  awk -F'\\t' '{split($3, a, "::"); s[a[1]] += $1} END {for (f in s) print s[f], f}' /tmp/cpu.tsv | sort -rn
"""

import os
import resource
import time

import pytest


def _cpu_seconds() -> float:
  own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
  return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def pytest_configure(config):
  del config
  if not os.environ.get("MURAL_TEST_CPU_LOG"):
    raise pytest.UsageError("pytest_cpu: set MURAL_TEST_CPU_LOG to the file to append to")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
  del nextitem
  cpu, wall = _cpu_seconds(), time.time()
  yield
  with open(os.environ["MURAL_TEST_CPU_LOG"], "a", encoding="utf-8") as f:
    f.write(f"{_cpu_seconds() - cpu:.1f}\t{time.time() - wall:.1f}\t{item.nodeid}\n")
