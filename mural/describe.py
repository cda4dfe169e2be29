"""Parameter counts of a config's model, from shapes only (nothing allocated).

    python -m mural.main --config=configs/mural_base.py --mode=describe

Groups: image_tower; token_embeddings (text-tower params under `token_*`: the
token table and its factorised projection); text_encoder (the rest of the
text tower: position table, layers, norms); heads (every projection head the
system's active tasks read); total (everything, the learned temperature
included).
"""

import math

import jax

from mural import system as system_lib
from mural import systems
from mural.models import feature_tower


def _count(tree) -> int:
  return sum(math.prod(x.shape) for x in jax.tree.leaves(tree))


def param_shapes(config):
  """The params pytree of config's model as ShapeDtypeStructs (via eval_shape)."""
  systems.validate(config)
  system = systems.get(config)
  tasks = system_lib.active_tasks(system, config)
  with feature_tower.frozen_backbones_as_shapes():  # Not a parameter: no need to build it.
    model = system.build_model(config, tasks)
  rng = jax.ShapeDtypeStruct((2,), jax.numpy.uint32)
  variables = jax.eval_shape(lambda r: system_lib.init_variables(model, tasks, config, r), rng)
  return variables["params"]


def describe(config) -> dict:
  """{'image_tower', 'token_embeddings', 'text_encoder', 'heads', 'total'} counts."""
  params = param_shapes(config)
  text = params["text_tower"]
  tokens = sum(_count(v) for k, v in text.items() if k.startswith("token_"))
  return {
      "image_tower": _count(params.get("image_tower", {})),  # None in text-only pre-training.
      "token_embeddings": tokens,
      "text_encoder": _count(text) - tokens,
      "heads": sum(_count(v) for k, v in params.items() if k.endswith("_head")),
      "total": _count(params),
  }
