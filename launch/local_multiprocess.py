#!/usr/bin/env python3
"""N mural processes on this machine, standing in for N hosts of a pod (CPU, gloo).

    python launch/local_multiprocess.py --num_processes=2 --devices_per_process=2 -- \
        --config=configs/demo.py --workdir=/tmp/mural_mp

Each process gets JAX_PLATFORMS=cpu, --xla_force_host_platform_device_count=D added to XLA_FLAGS
(D CPU "devices" per process) and mural.main's --coordinator_address=127.0.0.1:PORT
--num_processes=N --process_id=i; main then calls jax.distributed.initialize with
gloo CPU collectives. Arguments after `--` go to every process. Output lines
are prefixed with [i]. If one process fails or dies, one line names it and
the others get SIGTERM, then SIGKILL after --grace_s seconds (default 10; a
survivor cannot go on without its peer, and one blocked in a collective may
not answer SIGTERM); the exit
code is the first failure's (128 + N for a process killed by signal N). SIGTERM or Ctrl-C to the launcher is passed on to every process as
SIGTERM: they agree on a step, checkpoint and exit; rerunning resumes.

`--script=PATH` runs a Python file with the same flags instead of mural.main
(tests/test_multihost.py uses it).
"""

import argparse
import os
import signal
import socket
import subprocess
import sys
import threading
import time


def free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def _pump(stream, prefix: str, out):
  for line in iter(stream.readline, b""):
    out.write(prefix + line.decode(errors="replace"))
    out.flush()


def _exit_code(rc: int) -> int:
  """A child's return code as a shell exit code (killed by signal N: 128 + N)."""
  return 128 - rc if rc < 0 else rc


def launch(num_processes: int, devices_per_process: int, args, script=None, port: int = 0,
           env=None, grace_s: float = 10.0) -> int:
  """Starts the processes, streams their output, returns the first non-zero exit code (or 0).

  Runs `python -m mural.main ARGS` (or `python SCRIPT ARGS`) plus the
  multi-process flags in each process. When one fails or dies, one line
  names it and the others get SIGTERM and `grace_s` seconds before SIGKILL
  (without their peer they cannot finish a step, nor a checkpoint).
  """
  port = port or free_port()
  procs, pumps = [], []

  def forward(signum, frame):  # SIGTERM / Ctrl-C: every process checkpoints and stops.
    del frame
    for p in procs:
      if p.poll() is None:
        p.send_signal(signal.SIGTERM if signum == signal.SIGINT else signum)

  previous = {}
  if threading.current_thread() is threading.main_thread():
    previous = {s: signal.signal(s, forward) for s in (signal.SIGTERM, signal.SIGINT)}
  code, deadline = 0, None
  try:
    for i in range(num_processes):
      proc_env = dict(os.environ if env is None else env)
      # The caller's other XLA flags are kept; the device count is this launcher's.
      xla_flags = [f for f in proc_env.get("XLA_FLAGS", "").split()
                   if not f.startswith("--xla_force_host_platform_device_count")]
      proc_env.update(
          JAX_PLATFORMS="cpu",
          JAX_CPU_COLLECTIVES_IMPLEMENTATION="gloo",
          XLA_FLAGS=" ".join(xla_flags + [f"--xla_force_host_platform_device_count={devices_per_process}"]))
      program = [script] if script else ["-m", "mural.main"]
      cmd = [sys.executable, *program, *args, f"--coordinator_address=127.0.0.1:{port}",
             f"--num_processes={num_processes}", f"--process_id={i}"]
      # A terminal's Ctrl-C goes to the whole process group: the processes ignore it and stop on
      # the SIGTERM `forward` sends them (a KeyboardInterrupt would end them without a checkpoint).
      p = subprocess.Popen(cmd, env=proc_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
      t = threading.Thread(target=_pump, args=(p.stdout, f"[{i}] ", sys.stdout), daemon=True)
      t.start()
      procs.append(p)
      pumps.append(t)
    pending = list(procs)
    while pending:
      if deadline is not None and time.time() > deadline:
        break  # The finally kills what is left.
      for p in list(pending):
        try:
          rc = p.wait(timeout=0.5)
        except subprocess.TimeoutExpired:
          continue
        pending.remove(p)
        if rc != 0 and code == 0:
          code, deadline = _exit_code(rc), time.time() + grace_s
          how = f"was killed by signal {-rc}" if rc < 0 else f"exited with code {rc}"
          print(f"local_multiprocess: process {procs.index(p)} {how}; stopping the other "
                f"{len(pending)} process(es).", file=sys.stderr, flush=True)
          for other in pending:  # Only our own children, by handle.
            other.terminate()
  finally:
    for p in procs:
      if p.poll() is None:
        p.kill()
    for t in pumps:
      t.join(timeout=5)
    for s, handler in previous.items():
      signal.signal(s, handler)
  return code


def main():
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--num_processes", type=int, default=2)
  parser.add_argument("--devices_per_process", type=int, default=2)
  parser.add_argument("--port", type=int, default=0, help="Coordinator port; 0: a free one.")
  parser.add_argument("--script", default=None, help="A Python file to run instead of mural.main.")
  parser.add_argument("--grace_s", type=float, default=10.0,
                      help="When one process fails: seconds the others get after SIGTERM before SIGKILL.")
  parser.add_argument("args", nargs=argparse.REMAINDER, help="-- then the arguments of every process")
  a = parser.parse_args()
  args = a.args[1:] if a.args[:1] == ["--"] else a.args
  if a.grace_s < 0:
    parser.error(f"--grace_s: must be >= 0, got {a.grace_s}")
  sys.exit(launch(a.num_processes, a.devices_per_process, args, a.script, a.port, grace_s=a.grace_s))


if __name__ == "__main__":
  main()
