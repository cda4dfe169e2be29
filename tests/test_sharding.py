"""mural.sharding: mesh sizes, the divisibility fallback, the rules' validation.

Training on a real mesh (2 processes x 4 CPU devices as one 2x2x2 data x fsdp x
model mesh) equals 1 device, with each parameter's placement and the bytes a
device holds checked: tests/test_multihost.py. Pure data parallelism over 8
devices: tests/test_ring_loss.py; a checkpoint of 8 devices restored on 1:
tests/test_export.py.
"""

import pytest

from conftest import load_config  # ml_collections only: imports no JAX.


# ---- Pure parts ------------------------------------------------------------------


def test_mesh_shape_fills_the_free_axis():
  from mural import sharding
  m = lambda d, f, mo: dict(data=d, fsdp=f, model=mo)
  assert sharding.mesh_shape(m(-1, 1, 1), 8) == (8, 1, 1)
  assert sharding.mesh_shape(m(2, -1, 1), 8) == (2, 4, 1)
  assert sharding.mesh_shape(m(-1, 2, 2), 8) == (2, 2, 2)
  assert sharding.mesh_shape(m(2, 2, 2), 8) == (2, 2, 2)


@pytest.mark.parametrize("mesh,message", [
    ((-1, -1, 1), "at most one axis"), ((3, -1, 1), "multiple of 3"), ((2, 2, 1), "uses 4 devices")])
def test_mesh_shape_errors_name_config_mesh(mesh, message):
  from mural import config_lib
  from mural import sharding
  with pytest.raises(config_lib.ConfigError, match=rf"^config\.mesh: .*{message}"):
    sharding.mesh_shape(dict(zip(sharding.MESH_AXES, mesh)), 8)


class _FakeMesh:  # fit_spec only reads mesh.shape.
  shape = {"data": 2, "fsdp": 4, "model": 2}


def test_fit_spec_replicates_dims_the_mesh_does_not_divide():
  from jax.sharding import PartitionSpec as P
  from mural import sharding
  mesh = _FakeMesh()
  assert sharding.fit_spec(P("fsdp", "model"), (8, 6), mesh) == P("fsdp", "model")
  assert sharding.fit_spec(P("fsdp", "model"), (6, 8), mesh) == P(None, "model")
  assert sharding.fit_spec(P("model", "fsdp"), (1000, 10), mesh) == P("model")
  assert sharding.fit_spec(P(("data", "fsdp")), (12,), mesh) == P()  # 12 % 8 != 0.
  assert sharding.fit_spec(P("fsdp", "model"), (8, 8), mesh, min_size=100) == P()


def test_fit_spec_moves_fsdp_to_the_largest_dim_it_divides():
  from jax.sharding import PartitionSpec as P
  from mural import sharding
  mesh = _FakeMesh()
  fit = lambda spec, shape: sharding.fit_spec(spec, shape, mesh, fsdp_fallback=True)
  assert fit(P(None, "fsdp"), (1000, 6)) == P("fsdp")  # 6 % 4: FSDP moves to the 1000 dim.
  assert fit(P(None, None, None, "fsdp"), (3, 3, 16, 6)) == P(None, None, "fsdp")
  assert fit(P("model", None), (6, 12)) == P("model")  # The rules keep it off fsdp.
  assert fit(P("fsdp", "model"), (6, 8)) == P(None, "model")  # No free dim it divides.
  assert fit(P("fsdp"), (8,)) == P("fsdp")  # Already used: unchanged.


def test_rules_validation_names_the_rule():
  from mural import config_lib
  from mural import systems
  c = load_config()
  c.sharding_rules = [("embed", "fsdp"), ("mlp", "tensor")]
  with pytest.raises(config_lib.ConfigError, match=r"^config\.sharding_rules\[1\]: mesh axis 'tensor'"):
    systems.validate(c)
