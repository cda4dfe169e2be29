"""Feature-input image tower: fixed image features through EmbN's two FC layers (MULE, SMALR).

  images -> a frozen backbone (any IMAGE_TOWERS entry, eval mode) -> features,
         scaled to unit root-mean-square -> FC hidden_dim -> batch norm -> ReLU
         -> FC output_dim.
MULE (after Wang et al. 2019): "We also kept image representation fixed, and
only the two fully connected layers after the CNN were trained" (ResNet-152
features, 2048 -> 2048 -> 512).

The frozen backbone is not a parameter of this model: its variables are
constants of the tower (`backbone_variables`), read from the image tower of
a trained mural run (config.model.image.backbone_workdir: a workdir, its best
or newest checkpoint, or an export) or initialised from
config.model.image.backbone_seed. So they are never in the optimizer, never
decayed, never checkpointed (they are re-read from the same place on resume;
an export carries a copy: `frozen_inputs`), and describe counts only what
trains.
Its output also passes a stop_gradient, so no gradient is ever computed
through it.

hidden_dim = 0 gives one linear layer instead (Kádár et al., after VSE++:
"a trained linear layer W_I in R^{2048 x 1024}" over fixed ResNet-50 features).

Why run the backbone every step instead of precomputing features: the
built-in data renders fresh scenes every step (there is no finite image set
to precompute), and the small backbone at 32 px costs far less than the step
on CPU. A precomputed-feature source would serve a fixed image set with a
large backbone.
"""

import contextlib
import contextvars
from typing import Any, Optional

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from mural import config_lib
from mural import saved_variables


def _named(init, names):
  return nn.with_logical_partitioning(init, names)


class FeatureTower(nn.Module):
  """Returns (embedding [B, output_dim], {'features': the frozen features})."""
  features: "FrozenBackbone"  # images -> [B, F]; no parameters of this module.
  hidden_dim: int = 2048  # 0: one linear layer to output_dim.
  output_dim: int = 512
  bn_momentum: float = 0.9
  dtype: Any = jnp.float32
  param_dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, images, train: bool = False):
    kw = dict(dtype=self.dtype, param_dtype=self.param_dtype)
    feats = jax.lax.stop_gradient(self.features(images)).astype(jnp.float32)
    # Unit root-mean-square per dimension: a frozen tower's features come at any scale (a
    # seeded EfficientNet's are ~1e-6, below batch norm's epsilon after the first FC).
    feats = feats * jax.lax.rsqrt(jnp.maximum(jnp.mean(feats * feats, -1, keepdims=True), 1e-30))
    feats = feats.astype(self.dtype)
    if not self.hidden_dim:  # One linear layer (Kádár et al.).
      x = nn.Dense(self.output_dim, name="fc_out", kernel_init=_named(nn.initializers.lecun_normal(),
                   ("embed", "proj")), bias_init=_named(nn.initializers.zeros, ("proj",)), **kw)(feats)
      return x, {"features": feats}
    x = nn.Dense(self.hidden_dim, name="fc_hidden", kernel_init=_named(nn.initializers.lecun_normal(),
                 ("embed", "mlp")), bias_init=_named(nn.initializers.zeros, ("mlp",)), **kw)(feats)
    x = nn.BatchNorm(use_running_average=not train, momentum=self.bn_momentum, name="bn",
                     scale_init=_named(nn.initializers.ones, ("norm",)),
                     bias_init=_named(nn.initializers.zeros, ("norm",)), **kw)(x)
    x = nn.relu(x)
    x = nn.Dense(self.output_dim, name="fc_out", kernel_init=_named(nn.initializers.lecun_normal(),
                 ("mlp", "proj")), bias_init=_named(nn.initializers.zeros, ("proj",)), **kw)(x)
    return x, {"features": feats}


_SHAPES_ONLY = contextvars.ContextVar("frozen_backbone_shapes_only", default=False)


@contextlib.contextmanager
def frozen_backbones_as_shapes():
  """Towers built inside have no frozen backbone: their features are zeros of its output width.
  Enough to count what trains (describe, under jax.eval_shape) without compiling and running
  the backbone's init (21 s for MULE's B5), reading its checkpoint or even tracing it. Never for
  a run."""
  token = _SHAPES_ONLY.set(True)
  try:
    yield
  finally:
    _SHAPES_ONLY.reset(token)


class FrozenBackbone:
  """images -> the backbone's pooled features in eval mode, its variables constants (FeatureTower's
  `features`; `variables` is what an export carries)."""

  def __init__(self, backbone: nn.Module, variables: Optional[dict]):
    self.backbone, self.variables = backbone, variables

  def __call__(self, images):
    if self.variables is None:  # frozen_backbones_as_shapes.
      return jnp.zeros((images.shape[0], self.backbone.output_dim), jnp.float32)
    return self.backbone.apply(self.variables, images, train=False)[0]


def backbone_variables(backbone: nn.Module, image_config) -> dict:
  """{'params', 'batch_stats'} of the frozen backbone: a trained run's image tower, or a seeded
  init (None inside frozen_backbones_as_shapes)."""
  if _SHAPES_ONLY.get():
    return None
  init = lambda rng: nn.unbox(backbone.init(rng, jnp.zeros((1, 32, 32, 3)), train=False))
  shapes = jax.eval_shape(init, jax.random.PRNGKey(0))
  if image_config.backbone_workdir:
    try:  # A workdir's checkpoint (its best step, else the newest that reads) or an export's.
      saved, _ = saved_variables.read_variables(image_config.backbone_workdir)
    except FileNotFoundError as e:
      raise config_lib.ConfigError(f"config.model.image.backbone_workdir: {e}") from None
    variables = {k: saved.get(k, {}).get("image_tower", {}) for k in ("params", "batch_stats")}
    want = jax.tree.map(lambda s: s.shape, dict(shapes))
    got = jax.tree.map(np.shape, variables)
    if jax.tree.structure(want) != jax.tree.structure(got) or want != got:
      raise config_lib.ConfigError(
          f"config.model.image.backbone_workdir: the image tower saved in {image_config.backbone_workdir} "
          f"does not have the shapes config.model.image describes (variant, width/depth coefficients)")
  else:
    variables = jax.jit(init)(jax.random.PRNGKey(image_config.backbone_seed))
  return jax.tree.map(jnp.asarray, dict(variables))


def frozen_inputs(tower: FeatureTower) -> dict:
  """{'backbone_workdir': the variables a run there would hold for the built tower's backbone}
  (see models.frozen_inputs: what an export carries so that it needs no workdir). On the
  device, as the tower holds them: an export fetches them as it writes them."""
  return {"backbone_workdir": {k: {"image_tower": v} for k, v in tower.features.variables.items()}}


def validate(image_config, min_hidden_dim: int = 0) -> None:
  """A 'features' section's own fields, for the systems that use the tower: one-line
  ConfigErrors naming the field (min_hidden_dim 1: the system wants its two FC layers)."""
  im = image_config
  config_lib.positive_int(im, "hidden_dim", "model.image", minimum=min_hidden_dim)
  config_lib.positive_int(im, "output_dim", "model.image")
  config_lib.require(isinstance(im.backbone_workdir, str), "model.image.backbone_workdir",
                     f"must be a path string ('' for a seeded backbone), got {im.backbone_workdir!r}")


def from_config(image_config, dtype, param_dtype, backbones=None) -> FeatureTower:
  """config.model.image (name 'features'; backbone = an IMAGE_TOWERS key built from the same section)."""
  if image_config.backbone not in backbones:
    raise config_lib.ConfigError(
        f"config.model.image.backbone: {image_config.backbone!r} not in {sorted(backbones)}")
  backbone = backbones[image_config.backbone](image_config, dtype, param_dtype)
  variables = backbone_variables(backbone, image_config)
  return FeatureTower(features=FrozenBackbone(backbone, variables),
                      hidden_dim=int(image_config.hidden_dim), output_dim=int(image_config.output_dim),
                      dtype=dtype, param_dtype=param_dtype)
