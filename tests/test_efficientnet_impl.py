"""EfficientNet conv implementations ('xla', 'fast', 'native', 'auto') are one function.

Outputs and gradients (w.r.t. params and inputs) of 'fast' are compared with
'xla' (lax.conv_general_dilated, as nn.Conv), to 1e-5 in float32, on every
depthwise kernel size and stride of the B0 table with odd, even and 1-pixel
sizes, and on the pointwise, squeeze-excite and stem convs; then the whole
tiny EfficientNet in training mode (batch stats), 'native' too. 'auto' is 'native' on the CPU:
its programs are checked to be the same. The param trees are the same, and
the same as nn.Conv's, so a checkpoint of one implementation loads into the
other. Everything is compiled as few times as possible: CPU compiles dominate.
"""

import functools
import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from conftest import jit_vjp
from mural import config_lib
from mural import kernels
from mural.models import conv_ops
from mural.models import efficientnet
from mural.models import image_layers
from mural.models import native_ops
from mural.models import norm_ops
from mural.models import op_impls


def assert_close(actual, expected, tol, floor=0.0, what=""):
  """|a - e| <= tol * (|e| + max |e|) + floor, elementwise (relative to the array's scale)."""
  actual, expected = np.asarray(actual, np.float64), np.asarray(expected, np.float64)
  assert actual.shape == expected.shape, what
  scale = np.abs(expected).max() if expected.size else 0.0
  np.testing.assert_allclose(actual, expected, rtol=tol, atol=tol * scale + floor, err_msg=what)


def assert_trees_close(actual, expected, tol, floor=0.0):
  assert jax.tree.structure(actual) == jax.tree.structure(expected)
  for (path, a), e in zip(jax.tree_util.tree_leaves_with_path(actual), jax.tree.leaves(expected)):
    assert_close(a, e, tol, floor, what=jax.tree_util.keystr(path))


def shapes_and_names(variables):
  """{path: (shape, dtype, logical names)} of a (boxed) variable tree."""
  leaves = jax.tree_util.tree_leaves_with_path(
      variables, is_leaf=lambda x: isinstance(x, nn.LogicallyPartitioned))
  return {jax.tree_util.keystr(path): (x.value.shape, x.value.dtype, x.names)
          if isinstance(x, nn.LogicallyPartitioned) else (x.shape, x.dtype, None)
          for path, x in leaves}


def test_auto_is_native_on_cpu_and_bad_values_name_the_config_field(monkeypatch):
  assert jax.default_backend() == "cpu"
  # This project's machines have a C++ compiler: the kernels must build (tests/test_kernels.py).
  assert op_impls.resolve_conv_impl("auto") == "native", kernels.unavailable_reason()
  impls = ("xla", "fast", "native")
  assert [op_impls.resolve_conv_impl(i) for i in impls] == list(impls)
  with monkeypatch.context() as m:  # Without the kernels: 'auto' is 'fast', 'native' an error.
    m.setattr(kernels, "_load", lambda: "no C++ compiler")
    assert op_impls.resolve_conv_impl("auto") == "fast"
    with pytest.raises(config_lib.ConfigError, match=r"'native' .*\(no C\+\+ compiler\)"):
      op_impls.resolve_conv_impl("native")
  for bad in ("XLA", "onednn", None):
    with pytest.raises(config_lib.ConfigError, match=r"^config\.model\.image\.conv_impl: "):
      op_impls.check_conv_impl(bad)
  fields = config_lib.base_config().model.image.to_dict()
  fields.pop("conv_impl", None)  # Configs from before the fields: 'auto'.
  fields.pop("norm_impl", None)
  section = ml_collections.ConfigDict(fields)
  net = efficientnet.from_config(section, jnp.float32, jnp.float32)
  assert (net.conv_impl, net.norm_impl) == ("auto", "auto")
  section.conv_impl = "xla"
  assert efficientnet.from_config(section, jnp.float32, jnp.float32).conv_impl == "xla"
  section.conv_impl = "cudnn"
  with pytest.raises(config_lib.ConfigError, match=r"^config\.model\.image\.conv_impl: 'cudnn'"):
    efficientnet.from_config(section, jnp.float32, jnp.float32)
  net = efficientnet.EfficientNet(0.25, 0.25, 0.2, conv_impl="cudnn")
  with pytest.raises(config_lib.ConfigError, match=r"conv_impl"):
    jax.eval_shape(lambda: net.init(jax.random.key(0), jnp.zeros((1, 32, 32, 3)), train=False))
  assert op_impls.resolve_norm_impl("auto") == "fused"
  section.conv_impl, section.norm_impl = "xla", "batchnorm"
  with pytest.raises(config_lib.ConfigError, match=r"^config\.model\.image\.norm_impl: 'batchnorm'"):
    efficientnet.from_config(section, jnp.float32, jnp.float32)
  net = efficientnet.EfficientNet(0.25, 0.25, 0.2, norm_impl="cudnn")
  with pytest.raises(config_lib.ConfigError, match=r"norm_impl"):
    jax.eval_shape(lambda: net.init(jax.random.key(0), jnp.zeros((1, 32, 32, 3)), train=False))


class _Norm(nn.Module):
  impl: str
  swish: bool

  @nn.compact
  def __call__(self, x, train):
    return efficientnet._norm(train, 0.9, "bn", self.swish, self.impl)(x)  # pylint: disable=protected-access


@pytest.mark.parametrize("swish", [True, False])
def test_fused_batch_norm_is_nn_batch_norm(swish):
  """FusedBatchNorm (+ swish) against nn.BatchNorm (+ nn.swish): the same variables; in
  training the same output, running averages and gradients w.r.t. scale, bias and x (its
  custom VJP against autodiff, through the batch mean and variance); in eval the same output."""
  x = jax.random.normal(jax.random.key(0), (6, 5, 7, 12)) * 3 + 1
  weights = jax.random.normal(jax.random.key(4), x.shape)
  models = {impl: _Norm(impl, swish) for impl in ("flax", "fused")}
  shapes = {impl: shapes_and_names(jax.eval_shape(lambda m=m: m.init(jax.random.key(1), x, True)))
            for impl, m in models.items()}
  assert shapes["fused"] == shapes["flax"]
  params = {"bn": {"scale": 1 + 0.3 * jax.random.normal(jax.random.key(2), (12,)),
                   "bias": jax.random.normal(jax.random.key(3), (12,))}}
  stats = {"bn": {"mean": jnp.full((12,), 0.5), "var": jnp.full((12,), 2.0)}}

  def run(model):
    def loss(params, x):
      y, state = model.apply({"params": params, "batch_stats": stats}, x, True, mutable=["batch_stats"])
      return jnp.sum(y * weights), (y, state["batch_stats"])
    (value, (y, new_stats)), grads = jax.value_and_grad(loss, argnums=(0, 1), has_aux=True)(params, x)
    return value, y, new_stats, grads, model.apply({"params": params, "batch_stats": new_stats}, x, False)

  expected, got = (jax.jit(functools.partial(run, models[impl]))() for impl in ("flax", "fused"))
  assert not np.allclose(expected[2]["bn"]["mean"], stats["bn"]["mean"])  # The running mean moved.
  assert_trees_close(got, expected, 1e-5)


# (height, width, channels, features, kernel, stride, groups, bias): every depthwise
# kernel/stride of the B0 table on even, odd and mixed sizes, 1 and 2 pixels (taps
# that see only padding), pointwise convs (squeeze-excite: 1 x 1 pixel, with a
# bias), the dense 3x3 / 2 stem conv on even and odd sizes.
CASES = [(h, w, 8, 8, k, s, 8, False) for k in (3, 5) for s in (1, 2)
         for h, w in ((8, 8), (7, 7), (9, 6))]
CASES += [(1, 1, 8, 8, 5, 2, 8, False), (3, 2, 8, 8, 5, 2, 8, False),
          (8, 8, 16, 24, 1, 1, 1, False), (7, 5, 12, 40, 1, 1, 1, True),
          (1, 1, 24, 6, 1, 1, 1, True), (8, 8, 3, 16, 3, 2, 1, False),
          (9, 7, 3, 16, 3, 2, 1, False)]


def _conv(impl, case):
  _, _, _, features, kernel, stride, groups, bias = case
  init = nn.initializers.normal(1.0)  # Non-zero biases: their gradient is checked too.
  return image_layers.Conv(features, kernel, stride, groups, bias, kernel_init=init,
                            bias_init=init, impl=impl)


def _conv_inputs():
  """Per case: inputs, output cotangents and variables (NumPy: jax.random compiles per shape)."""
  rng = np.random.default_rng(0)
  normal = lambda *shape: jnp.asarray(rng.normal(size=shape), jnp.float32)
  xs, cts, variables = [], [], []
  for h, w, c, features, kernel, stride, groups, bias in CASES:
    xs.append(normal(3, h, w, c))
    cts.append(normal(3, -(-h // stride), -(-w // stride), features))
    params = {"kernel": normal(kernel, kernel, c // groups, features)}
    if bias:
      params["bias"] = normal(features)
    variables.append({"params": params})
  return xs, cts, variables


@jax.jit
def _conv_inits(x):
  """(nn.Conv's variables, ours per impl) from the same key, per kind of conv."""
  out = []
  for features, kernel, stride, groups, bias in ((8, 3, 1, 8, False), (8, 5, 2, 8, False),
                                                 (6, 1, 1, 1, True), (6, 3, 2, 1, True)):
    reference = nn.Conv(features, (kernel, kernel), strides=stride, padding="SAME",
                        feature_group_count=groups, use_bias=bias,
                        kernel_init=nn.initializers.normal(1.0),
                        bias_init=nn.initializers.normal(1.0))
    case = (None, None, None, features, kernel, stride, groups, bias)
    out.append((reference.init(jax.random.key(1), x),
                {impl: _conv(impl, case).init(jax.random.key(1), x)
                 for impl in op_impls.CONV_IMPLS}))
  return out


def _conv_vjps(impl, variables, xs, cts):
  """Per case: (y, (d<y, ct>/d variables, d<y, ct>/dx))."""
  out = []
  for case, v, x, ct in zip(CASES, variables, xs, cts):
    y, pull = jax.vjp(_conv(impl, case).apply, v, x)
    out.append((y, pull(ct)))
  return out


def test_conv_implementations_match_xla_and_nn_conv():
  # Same param names, shapes and init values as nn.Conv: old checkpoints load.
  for reference, ours in _conv_inits(jnp.ones((2, 7, 6, 8))):
    for impl in op_impls.CONV_IMPLS:
      jax.tree.map(np.testing.assert_array_equal, ours[impl], reference)
  xs, cts, variables = _conv_inputs()
  nn_conv = jax.jit(lambda vs, xs: [
      nn.Conv(c[3], (c[4], c[4]), strides=c[5], padding="SAME", feature_group_count=c[6],
              use_bias=c[7]).apply(v, x) for c, v, x in zip(CASES, vs, xs)])(variables, xs)
  vjps = jax.jit(_conv_vjps, static_argnums=0)
  expected, fast = vjps("xla", variables, xs, cts), vjps("fast", variables, xs, cts)
  for case, y, want, got in zip(CASES, nn_conv, expected, fast):
    assert_close(want[0], y, 1e-6, what=f"xla vs nn.Conv {case}")
    assert_trees_close(got, want, 1e-5)
  # 'auto' is 'fast' here: the same program.
  jaxpr = lambda impl: str(jax.make_jaxpr(functools.partial(_conv_vjps, impl))(
      variables, xs, cts))
  assert jaxpr("auto") == jaxpr("fast") != jaxpr("xla")


def test_fast_conv_keeps_bf16_and_sums_in_float32():
  x = jax.random.normal(jax.random.key(0), (2, 6, 6, 8), jnp.bfloat16)
  depthwise = jax.random.normal(jax.random.key(1), (3, 3, 1, 8), jnp.bfloat16)
  pointwise = jax.random.normal(jax.random.key(2), (1, 1, 8, 4), jnp.bfloat16)

  @jax.jit
  def both(x):
    exact = lambda a, k, s, g: conv_ops.xla_conv(
        a.astype(jnp.float32), k.astype(jnp.float32), s, g)
    return ((conv_ops.conv2d(x, depthwise, 2, 8, "fast"), exact(x, depthwise, 2, 8)),
            (conv_ops.conv2d(x, pointwise, 1, 1, "fast"), exact(x, pointwise, 1, 1)))

  for fast, exact in both(x):
    assert fast.dtype == jnp.bfloat16
    # Only the output is rounded to bf16 (8 bits): sums are float32, as XLA's.
    np.testing.assert_allclose(np.asarray(fast, np.float32), exact, rtol=2 ** -8, atol=1e-6)


def test_norm_act_depthwise_conv_is_the_composition_with_its_gradients():
  """norm_act_depthwise_conv = XLA's depthwise conv of swish(batch norm of x), with the
  gradients w.r.t. x, scale, bias and the kernel of autodiff through that composition
  (through the batch mean and variance), in float64; the strides and kernel sizes of the
  B0 table, odd and even sizes."""
  rng = np.random.default_rng(0)
  cases = [((2, 8, 8, 6), 3, 1), ((2, 7, 9, 6), 5, 2), ((3, 5, 4, 6), 3, 2)]
  with jax.enable_x64(True):
    for shape, k, stride in cases:
      x = jnp.asarray(rng.normal(size=shape) * 2 + 0.5)
      scale, bias = (jnp.asarray(rng.normal(size=shape[-1:])) for _ in range(2))
      kernel = jnp.asarray(rng.normal(size=(k, k, 1, shape[-1])))

      def reference(x, scale, bias, kernel, stride=stride):
        mean, var = jnp.mean(x, (0, 1, 2)), jnp.var(x, (0, 1, 2))
        y = jax.nn.swish((x - mean) / jnp.sqrt(var + 1e-3) * scale + bias)
        return conv_ops.xla_conv(y, kernel, stride, shape[-1])

      fused = functools.partial(norm_ops.norm_act_depthwise_conv, epsilon=1e-3, stride=stride,
                                dtype=jnp.dtype(jnp.float64))
      ct = jnp.asarray(rng.normal(size=jax.eval_shape(reference, x, scale, bias, kernel).shape))
      assert_trees_close(jit_vjp(fused, (x, scale, bias, kernel), ct),
                         jit_vjp(reference, (x, scale, bias, kernel), ct), 1e-10)


def test_a_pointwise_that_no_op_takes_is_computed_first():
  """MBConv hands its expand conv to the depthwise conv as a lazy Pointwise only where the
  native op takes it; anywhere else (another conv impl, a 1x1 conv, a norm in eval mode)
  it is x @ w computed first, the same result as the plain path."""
  rng = np.random.default_rng(3)
  x, w = (jnp.asarray(rng.normal(size=s), jnp.float32) for s in ((2, 6, 6, 4), (1, 1, 4, 8)))
  scale, bias = (jnp.asarray(rng.normal(size=8), jnp.float32) for _ in range(2))
  plain_y = conv_ops.pointwise_conv(x, w)
  lazy = image_layers.NormAct(native_ops.Pointwise(x, w), scale, bias, 1e-3, jnp.float32)
  plain = image_layers.NormAct(plain_y, scale, bias, 1e-3, jnp.float32)
  assert lazy.x.shape == plain_y.shape and lazy.x.dtype == plain_y.dtype
  for conv in (image_layers.Conv(8, 3, feature_group_count=8, impl="fast"),
               image_layers.Conv(5, 1, impl="native")):
    params = conv.init(jax.random.key(0), plain)
    np.testing.assert_allclose(conv.apply(params, lazy), conv.apply(params, plain), rtol=1e-6)
  norm = image_layers.FusedBatchNorm(use_running_average=True, swish=True)
  variables = norm.init(jax.random.key(0), plain_y)
  np.testing.assert_allclose(norm.apply(variables, native_ops.Pointwise(x, w)),
                             norm.apply(variables, plain_y), rtol=1e-6)
  # In training the statistics for the running averages come from x's Gram matrix.
  train = image_layers.FusedBatchNorm(use_running_average=False, swish=True, defer=True)
  _, got = train.apply(variables, native_ops.Pointwise(x, w), mutable=["batch_stats"])
  _, want = train.apply(variables, plain_y, mutable=["batch_stats"])
  assert_trees_close(got, want, 1e-5, 1e-6)


def _tiny(impl, dtype=jnp.float32, norm="flax"):
  """The B0 table at width/depth 0.25 with the head conv, no stochastic depth."""
  return efficientnet.EfficientNet(0.25, 0.25, 0.2, stochastic_depth_rate=0.0,
                                   include_head=True, conv_impl=impl, norm_impl=norm, dtype=dtype,
                                   param_dtype=dtype)


IMAGES = (16, 32, 32, 3)


@pytest.fixture(scope="module")
def tiny_variables():
  """Variables of the tiny net, filled from NumPy: random init would compile ~100
  RNG programs. He-scaled kernels; batch norm and biases near their init."""
  shapes = jax.eval_shape(lambda: _tiny("xla").init(jax.random.key(0), jnp.zeros(IMAGES),
                                                    train=False))
  rng = np.random.default_rng(0)

  def fill(path, leaf):
    name, shape = jax.tree_util.keystr(path[-1:]), leaf.shape
    if name == "['kernel']":
      value = rng.normal(size=shape) * math.sqrt(2 / math.prod(shape[:-1]))
    elif name in ("['scale']", "['var']"):
      value = 1 + 0.1 * np.abs(rng.normal(size=shape))
    else:  # Biases and running means.
      value = 0.1 * rng.normal(size=shape)
    return np.asarray(value, np.float32)

  return shapes, jax.tree_util.tree_map_with_path(fill, nn.unbox(shapes))


def test_param_trees_are_identical(tiny_variables):
  shapes, _ = tiny_variables
  expected = shapes_and_names(shapes)
  # One block per B0 stage at depth 0.25, each with its depthwise conv.
  assert sum(k.endswith("['depthwise_conv']['kernel']") for k in expected) == 7
  assert expected["['params']['block_1']['depthwise_conv']['kernel']"] == (
      (3, 3, 1, 48), jnp.float32, image_layers.DEPTHWISE)
  assert expected["['params']['stem_conv']['kernel']"][2] == image_layers.CONV
  for impl, norm, train in (("fast", "flax", False), ("auto", "auto", False),
                            ("xla", "fused", False), ("native", "fused", True)):
    # Trained 'native' blocks declare their squeeze-excite's params by ConvWeights.
    mine = jax.eval_shape(lambda impl=impl, norm=norm, train=train: _tiny(impl, norm=norm).init(
        jax.random.key(0), jnp.zeros(IMAGES), train=train))
    assert shapes_and_names(mine) == expected, (impl, norm)


def _train_step(model, variables, images, weights):
  """(loss, features, new batch stats) and d loss / d(params, images), train=True."""
  def loss(params, images):
    (features, _), state = model.apply(
        {"params": params, "batch_stats": variables["batch_stats"]}, images, train=True,
        mutable=["batch_stats"])
    return jnp.sum(jnp.tanh(features) * weights), (features, state["batch_stats"])
  return jax.value_and_grad(loss, argnums=(0, 1), has_aux=True)(variables["params"], images)


def test_tiny_efficientnet_train_step_matches_xla(tiny_variables, dtype=jnp.float32):
  """Loss, features, batch stats and gradients w.r.t. params and images, train=True.

  The same variables drive both implementations (a checkpoint of one loads in the
  other). Tolerance: this net's float32 gradients are themselves up to ~2e-5
  (relative to each array's largest entry) from float64 ones, whichever
  implementation computes them (batch norm over 16 numbers at the 1 x 1 stages
  amplifies rounding), so two float32 implementations agree to 5e-5, not 1e-5
  (in float64 they agree to ~3e-14; dtype=jnp.float64 under jax.enable_x64 runs
  that, 20 s more). A wiring bug (padding, stride, a transposed kernel) is off by
  1e-2 or more. The absolute floor covers gradients that are zero in exact
  arithmetic (a projection's batch-norm bias when the next batch norm removes the
  mean), where both carry only rounding noise (~1e-5 here).
  """
  _, variables = tiny_variables
  with jax.enable_x64(dtype == jnp.float64):
    variables = jax.tree.map(lambda a: jnp.asarray(a, dtype), variables)
    images = jax.random.normal(jax.random.key(1), IMAGES, dtype)
    weights = jax.random.normal(jax.random.key(2), (_tiny("xla").output_dim,), dtype)
    step = jax.jit(_train_step, static_argnums=0)
    # XLA's convs and nn.BatchNorm + nn.swish against the CPU's own ('auto' here).
    expected = step(_tiny("xla", dtype), variables, images, weights)
    got = step(_tiny("fast", dtype, norm="fused"), variables, images, weights)
    # Training mode: the batch statistics move.
    assert not np.allclose(expected[0][1][1]["stem_bn"]["mean"],
                           variables["batch_stats"]["stem_bn"]["mean"])
    tol, floor = (1e-5, 1e-10) if dtype == jnp.float64 else (5e-5, 1e-4)
    assert_trees_close(got, expected, tol, floor)
    jaxpr = lambda impl, norm: str(jax.make_jaxpr(functools.partial(
        _train_step, _tiny(impl, dtype, norm)))(variables, images, weights))
    if dtype == jnp.float32:  # The C++ kernels (float32 only) in the six blocks with an expand conv,
      native = jaxpr("native", "fused")
      # which compute it themselves where it has at most KERNEL_EXPAND_MAX_CHANNELS inputs
      # (else XLA's matmul): both kinds are here, so the step below checks both paths.
      own = sum(b["expand_ratio"] != 1 and
                b["in_filters"] <= native_ops.KERNEL_EXPAND_MAX_CHANNELS
                for b in _tiny("native").blocks())
      assert 0 < own < 6 and native.count("mural_expand_norm_act_depthwise_bwd") == own, native
      assert _depthwise_calls(native) == 6, native
      # And in all seven blocks, the depthwise norm + squeeze-excite.
      assert native.count("mural_excite_fwd") == 7, native
      assert_trees_close(step(_tiny("native", dtype, norm="fused"), variables, images, weights),
                         expected, tol, floor)
    # 'auto' is 'native' and 'fused' here: the same program.
    assert jaxpr("auto", "auto") == jaxpr("native", "fused")


def _depthwise_calls(jaxpr: str) -> int:
  """Forward calls of the C++ depthwise op in a jaxpr's text, with or without its expand conv."""
  return jaxpr.count("mural_norm_act_depthwise_fwd") + jaxpr.count("mural_expand_norm_act_depthwise_fwd")


def test_depthwise_grad_loop_takes_every_devices_share_per_step():
  """Under a mesh, a step of the kernel gradient's loop takes a multiple of the batch's shards:
  else XLA gathers the global batch onto every device to slice it (measured with --mode=plan:
  8 devices, 256 px tiny towers, 532 -> 308 MiB of temporaries, the 1-device figure)."""
  big = jax.ShapeDtypeStruct((64, 128, 128, 48), jnp.float32)  # 3 MiB per example: over the bytes.
  small = jax.ShapeDtypeStruct((64, 8, 8, 16), jnp.float32)
  assert conv_ops._batch_chunk(big) == 1 and conv_ops._batch_chunk(small) == 64
  for sizes, want_big in (((8, 1, 1), 8), ((2, 4, 1), 8), ((2, 1, 4), 8), ((3, 1, 1), 1)):
    mesh = jax.sharding.AbstractMesh(sizes, ("data", "fsdp", "model"))
    with jax.sharding.use_abstract_mesh(mesh):
      assert conv_ops._batch_chunk(big) == want_big, sizes  # 64 and 3 devices: gcd 1.
      chunk = conv_ops._batch_chunk(small)
      assert chunk % want_big == 0 and 64 % chunk == 0, (sizes, chunk)


def test_first_block_applies_the_stem_norm_when_it_has_no_residual():
  """B0's first block (32 -> 16 channels, no expand conv, no residual) applies the stem's
  norm + swish in its depthwise conv's op: the C++ kernel then runs in all 16 blocks. At
  width 0.5 (16 -> 8 channels; its first two stages) the same wiring gives XLA's convs +
  nn.BatchNorm's loss, features, batch stats and gradients."""
  b0 = efficientnet.EfficientNet(1.0, 1.0, 0.2, stochastic_depth_rate=0.0, conv_impl="native",
                                 norm_impl="fused")
  images = jnp.zeros((2, 32, 32, 3))
  variables = jax.eval_shape(lambda: b0.init(jax.random.key(0), images, train=False))
  jaxpr = str(jax.make_jaxpr(lambda v: b0.apply(v, images, train=True, mutable=["batch_stats"]))(
      variables))
  assert _depthwise_calls(jaxpr) == 16
  net = lambda impl, norm: efficientnet.EfficientNet(0.5, 0.25, 0.2, stochastic_depth_rate=0.0,
                                                     conv_impl=impl, norm_impl=norm,
                                                     num_stages=2)  # Block 0 and one after it.
  images = jax.random.normal(jax.random.key(1), (8, 32, 32, 3))
  # Jitted: one program instead of one per op of the init.
  variables = jax.jit(lambda key: net("xla", "flax").init(key, images, train=False))(
      jax.random.key(0))
  assert net("xla", "flax").blocks()[0]["in_filters"] != net("xla", "flax").blocks()[0]["out_filters"]
  weights = jax.random.normal(jax.random.key(2), (net("xla", "flax").output_dim,))
  step = jax.jit(_train_step, static_argnums=0)
  assert_trees_close(step(net("native", "fused"), variables, images, weights),
                     step(net("xla", "flax"), variables, images, weights), 5e-5, 1e-4)


def test_native_runs_the_xla_ops_under_a_mesh_of_several_devices_and_in_bf16():
  """A custom call cannot be split over a sharded batch, and the kernels take float32 only:
  there 'native' traces to the 'fast' ops (the same function)."""
  images = jnp.zeros((8, 32, 32, 3))

  def calls(dtype=jnp.float32, mesh=None):
    """How many of the depthwise op's and of the squeeze-excite op's forward calls."""
    net = _tiny("native", dtype, norm="fused")
    variables = jax.eval_shape(lambda: net.init(jax.random.key(0), images, train=False))
    train = lambda v: net.apply(v, images, train=True, mutable=["batch_stats"])
    if mesh is None:
      jaxpr = str(jax.make_jaxpr(train)(variables))
    else:
      with jax.sharding.use_abstract_mesh(mesh):
        jaxpr = str(jax.make_jaxpr(train)(variables))
    return _depthwise_calls(jaxpr), jaxpr.count("mural_excite_fwd")

  assert calls() == (6, 7)
  assert calls(mesh=jax.sharding.AbstractMesh((1, 1, 1), ("data", "fsdp", "model"))) == (6, 7)
  assert calls(mesh=jax.sharding.AbstractMesh((8, 1, 1), ("data", "fsdp", "model"))) == (0, 0)
  assert calls(jnp.bfloat16) == (0, 0)
