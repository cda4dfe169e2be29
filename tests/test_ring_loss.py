"""The ring (blockwise) in-batch softmax equals the full one, on 8 CPU devices (mural/ring_loss.py).

One subprocess with 8 host devices runs every check and prints one JSON line;
the tests read it. Values (relative to the logit scale 1/T) and gradients in x
and y are compared on three meshes, with and without the margin, with padding
rows, to 1e-5 (the losses compute in float32); the temperature's gradient, a
sum of B^2 terms of size 1/T^2 that mostly cancel, against a float64 NumPy
central difference, which both implementations must meet. XLA's memory
analysis shows what the ring is for: at a fixed per-device batch the full
loss's temporaries grow with the number of devices, the ring's do not. The
same subprocess checks the CPU's depthwise conv on a sharded batch.
"""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from conftest import ROOT, xla_flags  # ml_collections only: imports no JAX.

MESHES = ((8, 1, 1), (2, 4, 1), (2, 2, 2))
CASES = ((0.07, 0.0), (0.01, 0.3))  # (temperature, margin): ALIGN's loss, MURAL's t2t loss.


def _compare(mesh_shape, temperature, margin, dtype):
  """Max relative differences ring vs full: loss values and gradients in x, y, temperature."""
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  from jax.sharding import NamedSharding, PartitionSpec as P  # pylint: disable=g-import-not-at-top
  from mural import ring_loss, sharding  # pylint: disable=g-import-not-at-top
  mesh = sharding.make_mesh(dict(zip(sharding.MESH_AXES, mesh_shape)))
  rng = np.random.default_rng(0)
  x = rng.normal(size=(32, 16))
  y = x + 0.5 * rng.normal(size=(32, 16))
  valid = np.ones(32, bool)
  valid[[3, 17, 30]] = False  # Padding rows on three different devices.
  on_batch = NamedSharding(mesh, P(("data", "fsdp")))
  x, y, valid = (jax.device_put(np.asarray(a, dtype if a.dtype != bool else bool), on_batch)
                 for a in (x, y, valid))

  def run(axes):
    def loss(x, y, t):
      with jax.sharding.use_abstract_mesh(mesh.abstract_mesh):
        a, b = ring_loss.softmax_xent_both_ways(x, y, t, margin, valid, axes)
      return a + 0.7 * b, (a, b)
    return jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True))(
        x, y, jnp.asarray(temperature, dtype))

  (ring_total, ring_parts), ring_grads = run(("data", "fsdp"))
  (full_total, full_parts), full_grads = run(())  # No batch axes: the full matrix.
  dloss_dt = (_numpy_loss(x, y, valid, temperature * (1 + 1e-6), margin)
              - _numpy_loss(x, y, valid, temperature * (1 - 1e-6), margin)) / (2e-6 * temperature)
  rel = lambda a, b: float(np.max(np.abs(np.asarray(a) - np.asarray(b))) / np.max(np.abs(np.asarray(b))))
  # A loss value is log-sum-exp minus the positive's logit: two numbers of size up to 1/T
  # whose difference can be far smaller (0.018 here at T = 0.07), so float32 round-off is
  # relative to 1/T, not to the loss (seen: 2.2e-5 of the loss on one CPU, 1.6e-8 of 1/T).
  rel_value = lambda a, b: float(abs(float(a) - float(b)) / max(abs(float(b)), 1.0 / temperature))
  return dict(values=max(rel_value(a, b) for a, b in zip((ring_total, *ring_parts), (full_total, *full_parts))),
              grad_x=rel(ring_grads[0], full_grads[0]), grad_y=rel(ring_grads[1], full_grads[1]),
              grad_t_ring=rel(ring_grads[2], dloss_dt), grad_t_full=rel(full_grads[2], dloss_dt),
              loss=float(full_total))


def _numpy_loss(x, y, valid, temperature, margin):
  """x2y + 0.7 y2x in float64 NumPy (the reference of tests/test_losses.py, both directions)."""
  x, y, valid = (np.asarray(a, np.float64 if a.dtype != bool else bool) for a in (x, y, valid))
  x = x / np.linalg.norm(x, axis=1, keepdims=True)
  y = y / np.linalg.norm(y, axis=1, keepdims=True)
  logits = (x @ y.T - margin * np.eye(len(x))) / temperature

  def xent(l):
    l = np.where(valid[None, :], l, -np.inf)
    lse = np.log(np.sum(np.exp(l - l.max(1, keepdims=True)), 1)) + l.max(1)
    return np.mean((lse - np.diag(l))[valid])

  return xent(logits) + 0.7 * xent(logits.T)


def _temp_bytes(devices: int, axes, per_device: int = 256, dim: int = 64) -> int:
  """XLA's temporary bytes per device of loss + gradients at a fixed per-device batch."""
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  from jax.sharding import NamedSharding, PartitionSpec as P  # pylint: disable=g-import-not-at-top
  from mural import ring_loss, sharding  # pylint: disable=g-import-not-at-top
  mesh = sharding.make_mesh(dict(data=devices, fsdp=1, model=1), jax.devices()[:devices])
  on_batch = NamedSharding(mesh, P("data"))
  shape = jax.ShapeDtypeStruct((devices * per_device, dim), jnp.float32, sharding=on_batch)
  valid = jax.ShapeDtypeStruct((devices * per_device,), bool, sharding=on_batch)

  def loss(x, y, valid):
    with jax.sharding.use_abstract_mesh(mesh.abstract_mesh):
      a, b = ring_loss.softmax_xent_both_ways(x, y, 0.05, 0.0, valid, axes)
    return a + b

  compiled = jax.jit(jax.grad(loss, argnums=(0, 1))).lower(shape, shape, valid).compile()
  return int(compiled.memory_analysis().temp_size_in_bytes)


def _sharded_depthwise():
  """The CPU's 'fast' depthwise conv (configs/tiny.py trains with XLA's, so the trainer's
  multi-device tests no longer run it) on a batch split over 8 devices, traced under the mesh
  as the trainer traces its step: the largest relative differences of its input and kernel
  gradients from lax's conv, and whether the compiled gradient gathers anything (its kernel
  gradient's loop must take the same examples from every device: conv_ops._batch_chunk)."""
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  from jax.sharding import NamedSharding, PartitionSpec as P  # pylint: disable=g-import-not-at-top
  from mural.models import conv_ops  # pylint: disable=g-import-not-at-top
  mesh = jax.make_mesh((8,), ("data",))
  rng = np.random.default_rng(0)
  x, kernel = rng.normal(size=(16, 12, 12, 8)), rng.normal(size=(3, 3, 1, 8))
  x, kernel, cotangent = (a.astype(np.float32) for a in (x, kernel, rng.normal(size=(16, 6, 6, 8))))
  grad = lambda impl: jax.grad(lambda x, k: jnp.sum(conv_ops.conv2d(x, k, 2, 8, impl) * cotangent),
                               argnums=(0, 1))
  sharded_x = jax.device_put(x, NamedSharding(mesh, P("data")))
  with jax.sharding.use_abstract_mesh(mesh.abstract_mesh):
    compiled = jax.jit(grad("fast")).lower(sharded_x, kernel).compile()
  got, want = compiled(sharded_x, kernel), jax.jit(grad("xla"))(x, kernel)
  return {"grad_x": float(np.max(np.abs(got[0] - want[0])) / np.max(np.abs(want[0]))),
          "grad_kernel": float(np.max(np.abs(got[1] - want[1])) / np.max(np.abs(want[1]))),
          "all_gather": "all-gather" in compiled.as_text()}


def _worker():
  import jax  # pylint: disable=g-import-not-at-top
  out = {"devices": jax.device_count(), "compare": {}, "temp_bytes": {}, "depthwise": _sharded_depthwise()}
  for mesh in MESHES:
    for t, m in CASES:
      out["compare"][f"{'x'.join(map(str, mesh))} T={t} m={m}"] = _compare(mesh, t, m, np.float32)
  for impl, axes in (("ring", ("data",)), ("full", ())):
    out["temp_bytes"][impl] = {n: _temp_bytes(n, axes) for n in (1, 2, 4, 8)}
  print("RESULT " + json.dumps(out), flush=True)


@pytest.fixture(scope="module")
def results():
  env = dict(os.environ, JAX_PLATFORMS="cpu", TF_CPP_MIN_LOG_LEVEL="3",
             XLA_FLAGS=xla_flags("--xla_force_host_platform_device_count=8"))
  proc = subprocess.run([sys.executable, __file__], cwd=ROOT, env=env, capture_output=True, text=True,
                        timeout=1800)
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
  line = [l for l in proc.stdout.splitlines() if l.startswith("RESULT ")][-1]
  return json.loads(line[len("RESULT "):])


def test_ring_equals_full_values_and_gradients(results):
  assert results["devices"] == 8
  assert len(results["compare"]) == len(MESHES) * len(CASES)
  for key, r in results["compare"].items():
    assert r["loss"] > 0.01, (key, r)  # Not a degenerate case.
    assert max(r["values"], r["grad_x"], r["grad_y"]) < 1e-5, (key, r)
    assert r["grad_t_ring"] < 1e-3 and r["grad_t_full"] < 1e-3, (key, r)


def test_ring_temporaries_stay_flat_as_devices_grow(results):
  """Per device: b = 256 rows, D = 64; from 2 to 8 devices (on 1 the ring is the full loss)."""
  ring, full = ({int(n): b for n, b in results["temp_bytes"][impl].items()} for impl in ("ring", "full"))
  # The full loss holds [b, B] logits per device (and their gradient): ~linear in devices.
  assert full[8] > 3 * full[2], full
  # The ring holds one [b, b] block at a time; what grows is the scan's saved carries, the
  # visiting embeddings (B x D floats, 0.5 MB at 8 devices here).
  assert ring[8] < 1.5 * ring[2], ring
  assert ring[8] < full[8] / 3, (ring, full)


def test_fast_depthwise_conv_on_a_sharded_batch(results):
  r = results["depthwise"]
  assert r["grad_x"] < 1e-5 and r["grad_kernel"] < 1e-5, r
  assert not r["all_gather"], r


if __name__ == "__main__":
  _worker()
