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
  position table         ('position', 'embed'); token-type table (None, 'embed')
  BERT pooler            ('embed', 'proj'), bias ('proj',)
  attention q/k/v        ('embed', 'heads', 'kv'), bias ('heads', 'kv')
  attention output       ('heads', 'kv', 'embed'), bias ('embed',)
  MLP                    ('embed', 'mlp') / ('mlp', 'embed'), biases by output axis
  heads                  ('embed', 'proj') [mlp head: ('embed','mlp'), ('mlp','proj')]
  log_temperature        ()
  word table (word_lstm) ('vocab', 'token_embed'): every language's rows in one table
  per-language stacks    ('lang', ...) / ('branch', ...) on the leading axis (no rule: replicated)
"""

import functools
from typing import Sequence

import jax.numpy as jnp

from mural import config_lib
from mural.models import bert
from mural.models import efficientnet
from mural.models import feature_tower
from mural.models import heads
from mural.models import hem
from mural.models import resnet
from mural.models import word_lstm
from mural.models.dual_encoder import DualEncoder
from mural.models.locked import Locked

_BACKBONES = {"efficientnet": efficientnet.from_config}
IMAGE_TOWERS = {
    "efficientnet": efficientnet.from_config,
    "resnet": resnet.from_config,  # ResNet-18/50 (Globetrotter): config.model.image.depth, width.
    # Frozen backbone (one of the above) + two trained FC layers (MULE, SMALR).
    "features": functools.partial(feature_tower.from_config, backbones=_BACKBONES),
}

TEXT_TOWERS = {
    "bert": bert.from_config,
    "word_lstm": word_lstm.from_config,  # Per-language words -> per-language FC -> LSTM (MULE).
    "hem_lstm": hem.from_config,  # Hybrid embedding (specific + latent words) -> LSTM (SMALR).
    "latent_vocab": hem.pretrain_from_config,  # SMALR's latent-vocabulary pre-training.
}


# Towers that read a trained run's variables when they are built (not parameters: a frozen
# backbone): built tower -> {field of its config section that names the run: the variables,
# {'params', 'batch_stats'}, a run there would hold for it}.
FROZEN_INPUTS = {"features": feature_tower.frozen_inputs}


def frozen_inputs(config, model) -> dict:
  """{'model.<image|text>.<field>': variables} of the towers of `model` (built from config) that
  read a trained run when they were built (FROZEN_INPUTS): what an export writes beside its
  parameters."""
  out = {}
  for kind, tower in (("image", model.image_tower), ("text", model.text_tower)):
    name = config.model[kind].name
    if name in FROZEN_INPUTS:
      out.update({f"model.{kind}.{field}": v for field, v in FROZEN_INPUTS[name](tower).items()})
  return out


def tower(kind: str, section, dtype, param_dtype):
  """An unbound tower of `kind` ('image' | 'text') from its config section (config.model.<kind>,
  or a copy a system completed); a clear ConfigError for a name not in the table."""
  table = {"image": IMAGE_TOWERS, "text": TEXT_TOWERS}[kind]
  if section.name not in table:
    raise config_lib.ConfigError(f"config.model.{kind}.name: {section.name!r} not in {sorted(table)}")
  built = table[section.name](section, dtype, param_dtype)
  return Locked(built) if section.get("locked", False) else built


def build_model(model_config, head_names: Sequence[str] = ()) -> DualEncoder:
  """config.model -> an unbound DualEncoder with one head (`<name>_head`) per name."""
  dtype, param_dtype = jnp.dtype(model_config.dtype), jnp.dtype(model_config.param_dtype)
  image = tower("image", model_config.image, dtype, param_dtype)
  text = tower("text", model_config.text, dtype, param_dtype)
  named = {name: heads.from_config(model_config.heads, dtype, param_dtype).clone(name=f"{name}_head")
           for name in dict.fromkeys(head_names) if name}
  return DualEncoder(image_tower=image, text_tower=text, heads=named,
                     init_temperature=model_config.init_temperature,
                     learn_temperature=model_config.learn_temperature)
