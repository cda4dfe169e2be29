"""mural/host_memory.py: when the entry points restart with glibc's huge-page tunable, and that
it does what it is for (fewer page faults for a large block malloc'd and freed again)."""

import json
import os
import subprocess
import sys

import pytest

from conftest import ROOT
from mural import host_memory

ON = "glibc.malloc.hugetlb=1"


@pytest.mark.parametrize("environ, glibc, thp, want", [
    ({}, (2, 36), "madvise", ON),
    ({"GLIBC_TUNABLES": "glibc.malloc.arena_max=2"}, (2, 36), "madvise", "glibc.malloc.arena_max=2:" + ON),
    ({"GLIBC_TUNABLES": "glibc.malloc.hugetlb=0"}, (2, 36), "madvise", None),  # The user's choice.
    ({"GLIBC_TUNABLES": ON}, (2, 36), "madvise", None),  # Already restarted: never twice.
    ({}, (2, 34), "madvise", None),  # Too old for the tunable.
    ({}, (), "madvise", None),  # Not glibc (musl, macOS).
    ({}, (2, 36), "always", None),  # Huge pages already.
    ({}, (2, 36), "never", None),  # Refused by the kernel.
    ({}, (2, 36), "", None),
])
def test_environment_with_huge_pages(environ, glibc, thp, want):
  got = host_memory.environment_with_huge_pages(dict(environ, PATH="/bin"), glibc, thp)
  if want is None:
    assert got is None
  else:
    assert got == dict(environ, PATH="/bin", GLIBC_TUNABLES=want)


def test_thp_mode_reads_the_bracketed_choice(tmp_path):
  path = tmp_path / "enabled"
  path.write_text("always [madvise] never\n")
  assert host_memory.thp_mode(str(path)) == "madvise"
  assert host_memory.thp_mode(str(tmp_path / "missing")) == ""


_PROBE = """
import resource, sys
sys.path.insert(0, {root!r})
from mural import host_memory
host_memory.reexec()
import ctypes, json, os
libc = ctypes.CDLL("libc.so.6")
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(5):  # 64 MiB: above glibc's largest mmap threshold; malloc'd, written, freed.
  block = libc.malloc(64 << 20)
  ctypes.memset(block, 1, 64 << 20)
  libc.free(block)
print(json.dumps([os.environ.get("GLIBC_TUNABLES", ""), os.getpid(),
                  resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before]))
"""


def _probe(**env):
  """(GLIBC_TUNABLES the probe ran with, its page faults); the restart keeps the process."""
  environ = {k: v for k, v in os.environ.items() if k != "GLIBC_TUNABLES"}
  proc = subprocess.Popen([sys.executable, "-c", _PROBE.format(root=str(ROOT))], env=dict(environ, **env),
                          stdout=subprocess.PIPE, text=True)
  out = proc.communicate(timeout=120)[0]
  assert proc.returncode == 0, out
  tunables, pid, faults = json.loads(out)
  assert pid == proc.pid  # Restarted in place (execve), not as a child.
  return tunables, faults


def test_reexec_sets_the_tunable_once_and_cuts_page_faults():
  if host_memory.environment_with_huge_pages({}, host_memory.glibc_version(), host_memory.thp_mode()) is None:
    pytest.skip(f"huge pages cannot help here (glibc {host_memory.glibc_version()}, "
                f"THP {host_memory.thp_mode()!r})")
  tunables, faults = _probe()
  assert tunables == ON
  off_tunables, off_faults = _probe(GLIBC_TUNABLES="glibc.malloc.hugetlb=0")
  assert off_tunables == "glibc.malloc.hugetlb=0"  # Left as the user set it.
  # 5 x 64 MiB: 16k faults per block in 4 KiB pages, 32 in 2 MiB ones (measured 82k vs 2.7k).
  assert faults < 0.1 * off_faults, (faults, off_faults)


_FREED = """
import ctypes, sys
sys.path.insert(0, {root!r})
from mural import host_memory
libc = ctypes.CDLL("libc.so.6")
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
rss = lambda: int(open("/proc/self/statm").read().split()[1]) * 4096
blocks = [libc.malloc(64 << 10) for _ in range(4096)]  # 256 MiB of heap, below the mmap threshold.
for b in blocks:
  ctypes.memset(b, 1, 64 << 10)
for b in blocks[:-1]:  # The last one keeps the heap's top in use: glibc cannot trim on free.
  libc.free(b)
held = rss()
host_memory.release_freed_memory()
print(held, rss())
"""


def test_release_freed_memory_hands_free_heap_back():
  if not host_memory.glibc_version():
    pytest.skip("malloc_trim is glibc's")
  out = subprocess.run([sys.executable, "-c", _FREED.format(root=str(ROOT))], capture_output=True, text=True,
                       timeout=120, check=True).stdout.split()
  held, after = int(out[0]), int(out[1])
  assert held - after > 200 << 20, (held, after)  # Most of the 256 MiB freed.


@pytest.mark.parametrize("flags, want", [
    ("", f"{host_memory.SCHEDULER_FLAG}=false"),
    ("--xla_dump_to=/tmp/d", f"--xla_dump_to=/tmp/d {host_memory.SCHEDULER_FLAG}=false"),
    (f"{host_memory.SCHEDULER_FLAG}=true", f"{host_memory.SCHEDULER_FLAG}=true"),  # The user's choice.
])
def test_with_memory_saving_schedule(flags, want):
  assert host_memory.with_memory_saving_schedule(flags) == want


_BRANCHES = """
import sys
import jax, jax.numpy as jnp
from mural import host_memory
if sys.argv[1] == "ours":
  host_memory.prefer_memory_saving_schedule()
def branch(x, ws):
  for w in ws:
    x = jnp.tanh(x @ w)
  return x
def loss(ws, x):  # Four independent chains: run together, their activations are live together.
  return sum(jnp.sum(branch(x[b], ws[b]) ** 2) for b in range(4))
grad = jax.jit(jax.grad(loss)).lower(jax.ShapeDtypeStruct((4, 6, 256, 256), jnp.float32),
                                     jax.ShapeDtypeStruct((4, 256, 256), jnp.float32)).compile()
print(grad.memory_analysis().temp_size_in_bytes)
"""


def test_memory_saving_schedule_holds_fewer_temporaries():
  temps = {}
  for which, flag in (("ours", ""), ("xla", f" {host_memory.SCHEDULER_FLAG}=true")):
    env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS=os.environ.get("XLA_FLAGS", "") + flag)
    r = subprocess.run([sys.executable, "-c", _BRANCHES, which], cwd=ROOT, env=env, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    temps[which] = int(r.stdout.split()[-1])
  assert temps["ours"] < temps["xla"], temps
