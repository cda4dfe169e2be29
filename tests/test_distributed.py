"""mural/distributed.py: process 0 stops its coordination client, then, a moment later, the service.

One process (num_processes=1, a loopback port) in a subprocess, so this pytest
worker's JAX stays single-process. The client and service are wrapped to record
when jax.distributed.shutdown stops them; the process must exit 0 with both
stopped, in that order, the delay between them, and jax.distributed down.
"""

import json
import os
import subprocess
import sys

from conftest import ROOT

_PROBE = """
import json, socket, sys, time
sys.path.insert(0, {root!r})
with socket.socket() as s:
  s.bind(("127.0.0.1", 0))
  port = s.getsockname()[1]
from jax._src import distributed as jd
from mural import distributed
distributed.initialize(f"127.0.0.1:{{port}}", 1, 0)
events = []

class Recorded:
  def __init__(self, name, inner):
    self.name, self.inner = name, inner
  def shutdown(self):
    self.inner.shutdown()
    events.append((self.name, time.monotonic()))
  def __getattr__(self, attr):
    return getattr(self.inner, attr)

jd.global_state.client = Recorded("client", jd.global_state.client)
jd.global_state.service = Recorded("service", jd.global_state.service)
distributed.shutdown()
print(json.dumps(dict(events=events, client=jd.global_state.client is None,
                      service=jd.global_state.service is None,
                      delay=distributed._SERVICE_SHUTDOWN_DELAY_S)))
"""


def test_process_0_stops_the_service_after_its_client_and_exits_cleanly():
  env = dict(os.environ, JAX_PLATFORMS="cpu", TF_CPP_MIN_LOG_LEVEL="3")
  r = subprocess.run([sys.executable, "-c", _PROBE.format(root=str(ROOT))], env=env,
                     capture_output=True, text=True, timeout=300)
  assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
  out = json.loads(r.stdout.strip().splitlines()[-1])
  (first, t_client), (second, t_service) = out["events"]
  assert (first, second) == ("client", "service")
  assert t_service - t_client >= out["delay"] > 0
  assert out["client"] and out["service"]  # Down: jax's own atexit shutdown has nothing left.
