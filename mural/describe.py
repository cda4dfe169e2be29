"""Parameter counts of a config's model, from shapes only (nothing allocated).

    python -m mural.describe --config=configs/mural_base.py

Groups: image_tower; token_embeddings (text-tower params under `token_*`: the
token table and its factorised projection); text_encoder (the rest of the
text tower: position table, layers, norms); heads (all projection heads);
total (everything, the learned temperature included).
"""

import json
import math

import jax

from mural import config_lib
from mural import models


def _count(tree) -> int:
  return sum(math.prod(x.shape) for x in jax.tree.leaves(tree))


def param_shapes(config):
  """The params pytree of config's model as ShapeDtypeStructs (via eval_shape)."""
  config_lib.validate(config)
  model = models.build_model(config.model)
  batch = models.init_batch_shapes(config.model, config.data.image_size)
  rng = jax.ShapeDtypeStruct((2,), jax.numpy.uint32)
  variables = jax.eval_shape(lambda r, b: model.init(r, b, train=False), rng, batch)
  return variables["params"]


def describe(config) -> dict:
  """{'image_tower', 'token_embeddings', 'text_encoder', 'heads', 'total'} counts."""
  params = param_shapes(config)
  text = params["text_tower"]
  tokens = sum(_count(v) for k, v in text.items() if k.startswith("token_"))
  return {
      "image_tower": _count(params["image_tower"]),
      "token_embeddings": tokens,
      "text_encoder": _count(text) - tokens,
      "heads": sum(_count(v) for k, v in params.items() if k.endswith("_head")),
      "total": _count(params),
  }


if __name__ == "__main__":
  # Flags are defined only here so that importing describe (main.py does)
  # cannot clash with the caller's own --config flag.
  from absl import app
  from ml_collections import config_flags
  _CONFIG = config_flags.DEFINE_config_file("config", None, "Config file.", lock_config=True)

  def _main(argv):
    del argv
    try:
      print(json.dumps(describe(_CONFIG.value), indent=2))
    except config_lib.ConfigError as e:
      raise SystemExit(f"error: {e}") from None

  app.run(_main)
