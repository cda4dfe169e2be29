"""mural's C++ kernels (mural/kernels) build, load and compute their op.

native_norm_act_depthwise_conv is checked against the composition it replaces
(XLA's depthwise conv of swish(batch norm of x), autodiff'd through the batch
mean and variance) computed in float64: outputs and the gradients w.r.t. x,
scale, bias and kernel, to 1e-5 of each array's scale, at the kernel sizes and
strides of the B0 table, odd and even sizes and channel counts that are not a
multiple of the vector width. native_norm_act_squeeze_excite likewise, against
swish(batch norm) then squeeze-excite, with the gradients w.r.t. its four
squeeze-excite parameters too. The build: its cache, and clear errors.
"""

import functools
from concurrent import futures

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from conftest import imports_in_threads, jit_vjp
from mural import kernels
from mural.models import conv_ops
from mural.models import native_ops


def test_kernels_build_and_load_here():
  """This project's machines have a C++ compiler, so the kernels must load: a failure here is
  a broken build, not a missing tool (the reason names the compiler's error)."""
  assert kernels.available(), kernels.unavailable_reason()


def _vjp64(f, args, ct):
  """f(*args) and its gradients at cotangent ct, in float64."""
  with jax.enable_x64(True):
    return jit_vjp(f, [jnp.asarray(a) for a in args], jnp.asarray(ct))


def _float32(arrays):
  return [jnp.asarray(a, jnp.float32) for a in arrays]


def _reference(x, scale, bias, kernel, stride):
  mean, var = jnp.mean(x, (0, 1, 2)), jnp.var(x, (0, 1, 2))
  y = jax.nn.swish((x - mean) / jnp.sqrt(var + 1e-3) * scale + bias)
  return conv_ops.xla_conv(y, kernel, stride, x.shape[-1])


@pytest.mark.parametrize("shape,k,stride", [
    ((2, 8, 8, 20), 3, 1), ((2, 7, 9, 20), 3, 2), ((3, 9, 6, 24), 5, 2), ((2, 5, 7, 16), 5, 1),
    ((4, 1, 1, 32), 3, 1), ((2, 2, 3, 8), 5, 2),
    ((2, 6, 5, 91), 3, 2),  # Chunks of 4 registers, of 1, of 8 lanes (AVX-512), of 1 channel.
    ((2 * kernels.BATCH_PARTS + 6, 3, 4, 16), 3, 1)])  # 2-3 images per part of the batch.
def test_native_norm_act_depthwise_conv_is_the_composition(shape, k, stride):
  rng = np.random.default_rng(sum(shape) + k + stride)
  c = shape[-1]
  args = [rng.normal(size=shape) * 2 + 0.5, rng.normal(size=c) + 1, rng.normal(size=c),
          rng.normal(size=(k, k, 1, c))]
  ct = rng.normal(size=(shape[0], -(-shape[1] // stride), -(-shape[2] // stride), c))
  want = _vjp64(functools.partial(_reference, stride=stride), args, ct)
  op = _with_stats_as_aux(functools.partial(native_ops.native_norm_act_depthwise_conv, epsilon=1e-3,
                                            stride=stride))
  got = jit_vjp(op, _float32(args), jnp.asarray(ct, jnp.float32), has_aux=True)
  y = np.asarray(want[0], np.float64)
  want = [*want, y.mean((0, 1, 2)), y.var((0, 1, 2))]  # The output's statistics.
  for name, g, w in zip(("y", "dx", "d_scale", "d_bias", "d_kernel", "mean", "var"), got, want):
    g, w = np.asarray(g, np.float64), np.asarray(w)
    assert g.shape == w.shape and g.dtype == np.float64, name
    np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5 * np.abs(w).max(), err_msg=name)


def _with_stats_as_aux(op):
  """op returning a WithStats -> returning (y, (mean, var)), for jax.vjp(has_aux=True)."""

  def f(*args):
    out = op(*args)
    return out.y, (out.mean, out.var)

  return f


def _expand_reference(x, w, scale, bias, kernel, stride):
  return _reference(jnp.einsum("bhwk,kn->bhwn", x, w[0, 0]), scale, bias, kernel, stride)


@pytest.mark.parametrize("shape,features,k,stride", [
    ((2, 8, 8, 6), 20, 3, 1), ((3, 9, 7, 8), 24, 5, 2), ((6, 1, 1, 4), 16, 3, 1),
    ((2 * kernels.BATCH_PARTS + 6, 3, 4, 4), 16, 3, 2),
    ((2, 20, 5, 8), 24, 3, 1),  # Rows of 5 pixels: bands of 13 and 7 rows in the backward.
    ((2, 6, 5, 8), 91, 5, 1)])  # 91 channels: every width of chunk.
@pytest.mark.parametrize("expand_in_kernel", [True, False])
def test_native_expand_norm_act_depthwise_is_the_composition(shape, features, k, stride,
                                                             expand_in_kernel, monkeypatch):
  """The expand conv + norm + swish + depthwise op, with its statistics from x's Gram
  matrix and its backward folded into the conv's gradients, against float64 autodiff:
  with x @ w computed by the C++ op (odd pixel and channel counts reach its loops'
  remainders) and by XLA."""
  monkeypatch.setattr(native_ops, "KERNEL_EXPAND_MAX_CHANNELS",
                      shape[-1] if expand_in_kernel else shape[-1] - 1)
  rng = np.random.default_rng(sum(shape) + features + k + stride)
  args = [rng.normal(size=shape) + 0.5, rng.normal(size=(1, 1, shape[-1], features)),
          rng.normal(size=features) + 1, rng.normal(size=features),
          rng.normal(size=(k, k, 1, features))]
  ct = rng.normal(size=(shape[0], -(-shape[1] // stride), -(-shape[2] // stride), features))
  want = _vjp64(functools.partial(_expand_reference, stride=stride), args, ct)
  y = np.einsum("bhwk,kn->bhwn", args[0], args[1][0, 0])
  want_stats = [y.mean((0, 1, 2)), y.var((0, 1, 2))]
  op = _with_stats_as_aux(functools.partial(native_ops.native_expand_norm_act_depthwise, epsilon=1e-3,
                                            stride=stride))
  got = jit_vjp(op, _float32(args), jnp.asarray(ct, jnp.float32), has_aux=True)
  out = np.asarray(want[0], np.float64)
  want_out_stats = [out.mean((0, 1, 2)), out.var((0, 1, 2))]  # The output's statistics.
  got_stats = jax.jit(native_ops.pointwise_batch_stats)(*_float32(args[:2]))
  for name, g, w in zip(("y", "dx", "dw", "d_scale", "d_bias", "d_kernel", "y_mean", "y_var",
                         "mean", "var"),
                        got + list(got_stats[:2]), want + want_out_stats + want_stats):
    g, w = np.asarray(g, np.float64), np.asarray(w)
    assert g.shape == w.shape, name
    np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5 * np.abs(w).max(), err_msg=name)


def _squeeze_excite_reference(y, scale, bias, w_reduce, b_reduce, w_expand, b_expand):
  mean, var = jnp.mean(y, (0, 1, 2)), jnp.var(y, (0, 1, 2))
  a = jax.nn.swish((y - mean) / jnp.sqrt(var + 1e-3) * scale + bias)
  s = jax.nn.swish(jnp.mean(a, (1, 2)) @ w_reduce[0, 0] + b_reduce)
  return a * jax.nn.sigmoid(s @ w_expand[0, 0] + b_expand)[:, None, None, :]


@pytest.mark.parametrize("shape,squeezed", [
    ((3, 5, 7, 20), 4), ((4, 1, 1, 32), 8), ((2, 8, 8, 40), 10), ((5, 4, 6, 16), 3)])
def test_native_norm_act_squeeze_excite_is_the_composition(shape, squeezed):
  rng = np.random.default_rng(sum(shape) + squeezed)
  c = shape[-1]
  args = [rng.normal(size=shape) * 2 + 0.5, rng.normal(size=c) + 1, rng.normal(size=c),
          rng.normal(size=(1, 1, c, squeezed)), rng.normal(size=squeezed),
          rng.normal(size=(1, 1, squeezed, c)), rng.normal(size=c)]
  ct = rng.normal(size=shape)
  want = _vjp64(_squeeze_excite_reference, args, ct)
  got = jit_vjp(functools.partial(native_ops.native_norm_act_squeeze_excite, epsilon=1e-3), _float32(args),
                jnp.asarray(ct, jnp.float32))
  names = ("out", "dy", "d_scale", "d_bias", "d_w_reduce", "d_b_reduce", "d_w_expand",
           "d_b_expand")
  for name, g, w in zip(names, got, want, strict=True):
    g, w = np.asarray(g, np.float64), np.asarray(w)
    assert g.shape == w.shape and g.dtype == np.float64, name
    np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5 * np.abs(w).max(), err_msg=name)


def test_native_op_propagates_nan():
  x = np.ones((2, 4, 4, 16), np.float32)
  x[1, 2, 3, 5] = np.nan
  c = jnp.ones(16)
  y = native_ops.native_norm_act_depthwise_conv(jnp.asarray(x), c, c, jnp.ones((3, 3, 1, 16)),
                                                1e-3, 1)
  for a in (y.y, y.mean, y.var):
    assert np.isnan(np.asarray(a)[..., 5]).all() and np.isfinite(np.asarray(a)[..., 4]).all()
  # Through the squeeze-excite: channel 5's batch statistics reach every image's pool,
  # and the squeeze's matmul every gate.
  w = jnp.ones((1, 1, 16, 16))
  y = native_ops.native_norm_act_squeeze_excite(jnp.asarray(x), c, c, w, c, w, c, 1e-3)
  assert np.isnan(np.asarray(y)).all()


def test_squeeze_excite_kernels_reject_mismatched_vectors():
  y, c = jnp.ones((2, 3, 3, 8)), jnp.ones(8)
  with pytest.raises(Exception, match=r"norm_act_squeeze: want y \[B, H, W, C\], mean, inv"):
    jax.block_until_ready(kernels.squeeze_forward(y, c, jnp.ones(7), c, c))


def test_build_caches_by_source_and_reports_compiler_errors(tmp_path):
  """On a one-line source: the kernels' own (~10 CPU-s to compile) is built once through the
  kernel cache, and test_kernels_build_and_load_here fails when it does not build."""
  source = tmp_path / "src" / "one.cc"
  source.parent.mkdir()
  source.write_text('extern "C" int mural_one() { return 1; }\n')
  first = kernels.build(source, directory=tmp_path)
  stamp = first.stat().st_mtime_ns
  assert kernels.build(source, directory=tmp_path) == first and first.stat().st_mtime_ns == stamp
  assert [p.name for p in tmp_path.iterdir() if p.is_file()] == [first.name]  # No partial files left.
  source.write_text('extern "C" int mural_one() { return 2; }\n')  # Another source, another library.
  second = kernels.build(source, directory=tmp_path)
  assert second != first and first.exists() and second.exists()
  with pytest.raises(RuntimeError, match="cannot run the C\\+\\+ compiler 'no-such-c\\+\\+'"):
    kernels.build(directory=tmp_path / "other", compiler="no-such-c++")
  broken = tmp_path / "broken.cc"
  broken.write_text("int main( {\n")
  with pytest.raises(RuntimeError, match=r"broken\.cc.*failed:\n.*error"):
    kernels.build(broken, directory=tmp_path)
  assert not list(tmp_path.rglob("*.tmp")), "a failed build left its partial file"


def test_builds_at_once_compile_once(tmp_path):
  """Two builders at once (a launcher's processes; here threads, each with its own lock
  descriptor): one compiles, the other waits for its library."""
  source = tmp_path / "one.cc"
  source.write_text('extern "C" int mural_one() { return 1; }\n')
  calls = tmp_path / "calls.txt"
  compiler = tmp_path / "slow-c++"  # Slow enough that both builders arrive while it runs.
  compiler.write_text(f'#!/bin/sh\necho run >> "{calls}"\nsleep 1\nexec c++ "$@"\n')
  compiler.chmod(0o755)
  with futures.ThreadPoolExecutor(2) as pool:
    built = list(pool.map(lambda _: kernels.build(source, tmp_path / "cache", str(compiler)), range(2)))
  assert built[0] == built[1] and built[0].exists()
  assert calls.read_text() == "run\n"


def test_build_in_background_runs_no_import_statement(tmp_path, monkeypatch):
  """Its thread runs beside the caller's imports, one of which may swap builtins.__import__ for
  the whole process (etils.epy.lazy_imports): a compile from scratch (lock, compiler found on
  PATH, library renamed into place) runs no import statement in it."""
  source = tmp_path / "one.cc"
  source.write_text('extern "C" int mural_one() { return 1; }\n')
  monkeypatch.setattr(kernels, "build", functools.partial(kernels.build, source, tmp_path / "cache"))
  with imports_in_threads() as seen:
    kernels.build_in_background().join()
  assert len(list((tmp_path / "cache").glob("one-*.so"))) == 1
  assert seen == []


def test_a_dead_builders_partial_file_is_removed_by_the_next_build(tmp_path):
  """build_in_background's thread dies with its process, and its compiler may leave the partial
  file: the next build (holding the lock, so no live builder writes one) removes it."""
  source = tmp_path / "one.cc"
  source.write_text('extern "C" int mural_one() { return 1; }\n')
  cache = tmp_path / "cache"
  cache.mkdir()
  (cache / "tmpdead.so.tmp").write_bytes(b"half a library")
  library = kernels.build(source, cache)
  assert library.exists() and sorted(p.name for p in cache.iterdir()) == [library.name]


@pytest.mark.parametrize("platforms, libtpu, plugins, expected", [
    ("", False, False, True),  # A CPU-only host: nothing but jaxlib.
    ("", True, False, False),  # A TPU VM: libtpu installed.
    ("", False, True, False),  # A GPU host: a PJRT plugin under jax_plugins.
    ("cpu", True, True, True),  # JAX_PLATFORMS decides, whatever is installed.
    ("cuda,cpu", False, False, False),
    ("tpu", False, False, False),
])
def test_cpu_backend_expected_without_starting_a_backend(monkeypatch, platforms, libtpu, plugins,
                                                         expected):
  """mural.main starts the kernels' build early only on hosts whose JAX will run on the CPU;
  a GPU or TPU host (conv_impl 'auto' runs XLA's convs there) compiles nothing."""
  monkeypatch.setenv("JAX_PLATFORMS", platforms)
  monkeypatch.delenv("TPU_LIBRARY_PATH", raising=False)
  real_find_spec = kernels.importlib.util.find_spec
  monkeypatch.setattr(kernels.importlib.util, "find_spec", lambda name: (
      object() if name == "libtpu" and libtpu else None if name in ("libtpu", "jax_plugins")
      else real_find_spec(name)))
  monkeypatch.setattr(kernels.importlib.metadata, "entry_points",
                      lambda group: ["jax_cuda12_plugin"] if plugins and group == "jax_plugins" else [])
  assert kernels.cpu_backend_expected() is expected


def test_mismatched_shapes_are_a_clear_error():
  """The kernels check their operands' shapes and say which, instead of reading past them."""
  x, w = jnp.ones((2, 4, 4, 3)), jnp.ones((3, 8))
  vec, kernel = jnp.ones(8), jnp.ones((3, 3, 8))
  forward = jax.jit(kernels.norm_act_depthwise_forward, static_argnums=6)
  with pytest.raises(Exception, match=r"want x \[B, H, W, K\], w \[K, C\]"):
    forward(x, vec, vec, vec, vec, kernel, 1, jnp.ones((4, 8))).block_until_ready()
  with pytest.raises(Exception, match=r"want mean, inv, scale, bias \[C\]"):
    forward(x, jnp.ones(7), vec, vec, vec, kernel, 1, w).block_until_ready()
  with pytest.raises(Exception, match=r"kernel \[K, K, C\]"):
    forward(x, vec, vec, vec, vec, jnp.ones((3, 3, 7)), 1, w).block_until_ready()
  y, moments = forward(x, vec, vec, vec, vec, kernel, 1, w)
  assert y.shape == (2, 4, 4, 8) and moments.shape == (2, 8)
