"""Model construction: one table of constructors per tower kind, and build_model.

A tower is a Linen module with an `output_dim` property that returns
`(embedding, aux_dict)`: image towers take `(images [B,H,W,3], train)`, text
towers `(ids int32 [B,L], mask int32 [B,L], train)`. A new system adds its
tower in a new file and one entry in IMAGE_TOWERS or TEXT_TOWERS; each entry
maps (config section, dtype, param_dtype) to an unbound module.

Logical axis names of the parameters (rules in config.sharding_rules):
  conv kernel            (None, None, 'conv_in', 'conv_out')
  depthwise conv kernel  (None, None, None, 'conv_out')
  conv / classifier bias ('conv_out',); classifier kernel ('conv_in', 'conv_out')
  batch/layer norm scale, bias  ('norm',)
  token table            ('vocab', 'token_embed') if factorised, else ('vocab', 'embed')
  token projection       ('token_embed', 'embed'), bias ('embed',)
  position table         ('position', 'embed')
  attention q/k/v        ('embed', 'heads', 'kv'), bias ('heads', 'kv')
  attention output       ('heads', 'kv', 'embed'), bias ('embed',)
  MLP                    ('embed', 'mlp') / ('mlp', 'embed'), biases by output axis
  heads                  ('embed', 'proj') [mlp head: ('embed','mlp'), ('mlp','proj')]
  log_temperature        ()
"""

import jax
import jax.numpy as jnp

from mural import config_lib
from mural.models import bert
from mural.models import efficientnet
from mural.models import heads
from mural.models.dual_encoder import DualEncoder

IMAGE_TOWERS = {
    "efficientnet": efficientnet.from_config,
}

TEXT_TOWERS = {
    "bert": bert.from_config,
}


def _tower(table, section, field, dtype, param_dtype):
  if section.name not in table:
    raise config_lib.ConfigError(f"config.{field}.name: {section.name!r} not in {sorted(table)}")
  return table[section.name](section, dtype, param_dtype)


def build_model(model_config, init_temperature: float = 1.0,
                learn_temperature: bool = True) -> DualEncoder:
  """config.model (+ config.loss temperature fields) -> an unbound DualEncoder."""
  dtype, param_dtype = jnp.dtype(model_config.dtype), jnp.dtype(model_config.param_dtype)
  image = _tower(IMAGE_TOWERS, model_config.image, "model.image", dtype, param_dtype)
  text = _tower(TEXT_TOWERS, model_config.text, "model.text", dtype, param_dtype)
  h = model_config.heads
  new_head = lambda: heads.from_config(h, dtype, param_dtype)
  if not h.image and image.output_dim != h.embed_dim:
    raise config_lib.ConfigError(
        f"config.model.heads.embed_dim: {h.embed_dim} differs from the image tower's output "
        f"size {image.output_dim} (set it to {image.output_dim} or set model.heads.image)")
  if not h.i2t and text.output_dim != h.embed_dim:
    raise config_lib.ConfigError(
        f"config.model.heads.i2t: without an i2t head the text tower's output size "
        f"{text.output_dim} must equal model.heads.embed_dim {h.embed_dim}")
  return DualEncoder(
      image_tower=image, text_tower=text,
      i2t_head=new_head() if h.i2t else None,
      t2t_head=new_head() if h.t2t else None,
      image_head=new_head() if h.image else None,
      init_temperature=init_temperature, learn_temperature=learn_temperature)


def init_batch(model_config, image_size: int, batch_size: int = 1) -> dict:
  """Zero inputs with every batch key, so `init` creates every parameter."""
  ids = jnp.zeros((batch_size, model_config.text.max_len), jnp.int32)
  return {
      "image": jnp.zeros((batch_size, image_size, image_size, 3), jnp.float32),
      "text_ids": ids, "text_mask": ids, "left_ids": ids, "left_mask": ids,
      "right_ids": ids, "right_mask": ids,
  }


def init_batch_shapes(model_config, image_size: int, batch_size: int = 1) -> dict:
  """init_batch as jax.ShapeDtypeStruct, for jax.eval_shape (allocates nothing)."""
  return jax.eval_shape(lambda: init_batch(model_config, image_size, batch_size))
