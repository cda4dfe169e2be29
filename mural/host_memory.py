"""Host memory for XLA on the CPU: temporaries on huge pages, compile memory handed back.

Why: XLA's CPU runtime mallocs each run's temporary buffer (the demo's train
step: 87 MB; benchmarks/bench_step.py's: 4.2 GiB) and frees it after the run.
glibc serves a block that large with a fresh mmap, so every step faults in and
zeroes each 4 KiB page again: the demo's step took 21k page faults, a third of
its CPU time in the kernel. With `glibc.malloc.hugetlb=1` glibc madvises its
mmaps for transparent huge pages, 2 MiB per fault (measured on a 2-core AMD
EPYC: the demo's step 0.104 -> 0.072 s, the demo 5 min 03 s -> 4 min 28 s,
bench_step.py 14.4 -> 20.9 samples/s).

glibc reads GLIBC_TUNABLES only when a process starts, so the entry points
(`mural.main`, the benchmarks) call `reexec()` first: it starts the same
command line again in the same process (os.execve: same pid and file
descriptors) with the tunable added, once, before JAX or TensorFlow load. It
does nothing where it cannot help: not Linux with glibc >= 2.35, or the
kernel's THP mode is not `madvise` (`always` already gives huge pages,
`never` refuses them), or GLIBC_TUNABLES already names the tunable: set
`GLIBC_TUNABLES=glibc.malloc.hugetlb=0` to keep glibc's default.

`release_freed_memory()` (the trainer, once its step is compiled) returns the
compile's freed heap to the OS: peak memory, not speed.

`prefer_memory_saving_schedule()` (the same entry points, before JAX loads)
turns off XLA's concurrency-optimised CPU scheduler, which orders a program's
ops for parallel execution and keeps more buffers live at once; XLA's default
scheduler orders them for the least live memory. bench_step.py on a 2-core AMD
EPYC: temporaries 4.24 -> 3.28 GiB, peak RSS 5.72 -> 4.73 GiB, for perhaps 5%
of speed (median samples/s 19.3 against 20.2, within this machine's spread;
the demo 4 min 15 s against 4 min 13 s). XLA_FLAGS=--xla_cpu_enable_concurrency_optimized_scheduler=true
keeps XLA's choice.
"""

import ctypes
import os
import platform
import sys
from typing import Dict, Optional

TUNABLE = "glibc.malloc.hugetlb"
SCHEDULER_FLAG = "--xla_cpu_enable_concurrency_optimized_scheduler"
_THP_MODE = "/sys/kernel/mm/transparent_hugepage/enabled"


def thp_mode(path: str = _THP_MODE) -> str:
  """The kernel's transparent-huge-page mode ('always' | 'madvise' | 'never'), '' if unknown."""
  try:
    with open(path) as f:
      text = f.read()
  except OSError:
    return ""
  return text[text.find("[") + 1:text.find("]")] if "[" in text else ""


def glibc_version() -> tuple:
  """(major, minor) of the C library if it is glibc, else ()."""
  name, version = platform.libc_ver()
  if name != "glibc":
    return ()
  try:
    return tuple(int(x) for x in version.split(".")[:2])
  except ValueError:
    return ()


def environment_with_huge_pages(environ: Dict[str, str], glibc: tuple,
                                thp: str) -> Optional[Dict[str, str]]:
  """`environ` with the tunable added to GLIBC_TUNABLES, or None where it would not help."""
  tunables = environ.get("GLIBC_TUNABLES", "")
  if glibc < (2, 35) or thp != "madvise" or TUNABLE in tunables:
    return None
  return dict(environ, GLIBC_TUNABLES=":".join(t for t in (tunables, f"{TUNABLE}=1") if t))


def reexec() -> None:
  """Restarts this command with the tunable set, where it helps (see the module docstring)."""
  if sys.platform != "linux" or not sys.executable or not getattr(sys, "orig_argv", None):
    return
  env = environment_with_huge_pages(dict(os.environ), glibc_version(), thp_mode())
  if env is not None:
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, sys.orig_argv, env)


def release_freed_memory() -> None:
  """Hands back to the OS the heap memory malloc holds free (glibc's malloc_trim(0)).

  Why: compiling the train step takes ~1 GiB of heap (LLVM, XLA) that is freed after but stays
  in the process (glibc trims another thread's arena only when its top is free), and the
  step's temporaries, above the mmap threshold, never reuse it. The trainer calls this once
  its step is compiled (bench_step.py: peak RSS 7.35 -> 6.38 GiB, the same speed)."""
  if glibc_version():
    ctypes.CDLL(None).malloc_trim(0)


def with_memory_saving_schedule(xla_flags: str) -> str:
  """`xla_flags` with SCHEDULER_FLAG=false added, unless it names that flag already."""
  if SCHEDULER_FLAG in xla_flags:
    return xla_flags
  return f"{xla_flags} {SCHEDULER_FLAG}=false".strip()


def prefer_memory_saving_schedule() -> None:
  """XLA's CPU programs scheduled for the least live memory (see the module docstring); call
  before JAX loads (XLA reads XLA_FLAGS once)."""
  os.environ["XLA_FLAGS"] = with_memory_saving_schedule(os.environ.get("XLA_FLAGS", ""))
