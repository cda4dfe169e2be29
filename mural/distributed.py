"""jax.distributed for several processes, with an exit that does not abort.

jax.distributed.shutdown (also run at exit) shuts the coordination client
down, which waits at a barrier for every process, and then, in process 0,
stops the coordination service. The service's gRPC server re-arms a handler
after each RPC it answers, among them the barrier's own answers and the
peers' cancelled long polls; when that re-arming races the server's shutdown,
gRPC aborts the process (`server.cc: Check failed: queue.Pop() == nullptr`,
signal 6) after all of the job's work is done. Seen once in CI on a two-process
CPU run (jax 0.10.2). Here process 0 waits a moment between the two steps, so
the server stops once nothing is in flight.
"""

import atexit
import time

import jax

# Long enough for the peers' last RPCs (answers to the shutdown barrier, cancelled polls) to
# be handled; short against a job's exit.
_SERVICE_SHUTDOWN_DELAY_S = 1.0


def initialize(coordinator_address: str, num_processes: int, process_id: int, **kwargs) -> None:
  """jax.distributed.initialize with gloo CPU collectives and the ordered shutdown below.

  kwargs go to jax.distributed.initialize (initialization_timeout,
  heartbeat_timeout_seconds, ...).
  """
  # CPU processes exchange collectives over gloo (TCP); ignored on GPU/TPU.
  jax.config.update("jax_cpu_collectives_implementation", "gloo")
  jax.distributed.initialize(coordinator_address, num_processes, process_id, **kwargs)
  atexit.register(shutdown)  # Runs before jax's own atexit shutdown (registered at its import).


def shutdown() -> None:
  """jax.distributed.shutdown, with process 0's service stopped a moment after its client."""
  from jax._src import distributed  # pylint: disable=g-import-not-at-top
  state = distributed.global_state
  service = getattr(state, "service", None)
  if service is None or not hasattr(state, "client"):  # Not the coordinator, or another jax.
    jax.distributed.shutdown()
    return
  state.service = None  # jax.distributed.shutdown below stops the client (and preemption sync).
  try:
    jax.distributed.shutdown()
  finally:
    time.sleep(_SERVICE_SHUTDOWN_DELAY_S)
    service.shutdown()
