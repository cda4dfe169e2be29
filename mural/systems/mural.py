"""MURAL (Jain et al. 2021): an image-text task and a text-text task on one text tower.

  i2t: in-batch softmax between images and captions, both directions, with
       the model's learned temperature (ALIGN's loss); text head 'i2t'.
  t2t: additive-margin softmax between translation pairs, both directions,
       fixed temperature 0.01 and margin 0.3; its own text head 't2t'.
The total is w_i2t (L_i2t + L_t2i) + w_t2t (L_l2r + L_r2l) with weights
1 : 0.1, each task at its own learning rate (1e-3 / 1e-4) with its own LAMB
state. Evaluated by image<->text retrieval per language and translation
retrieval per language pair. ALIGN is this system without the t2t task
(mural/systems/align.py).

The image-text and text-pair tasks are built by `image_text_task` /
`text_pair_task`, which other systems reuse.

Its config defaults are mural/systems/defaults/mural.py.
"""

import functools
from typing import Sequence

import jax.numpy as jnp

from mural import config_lib
from mural import evaluate
from mural import lazy_import
from mural import models
from mural import ring_loss
from mural import sharding
from mural import system
from mural.data import inputs
from mural.systems.defaults import mural as defaults

eval_data = lazy_import.module("mural.data.eval_data")  # TensorFlow: loaded when evaluating.


_require = config_lib.require



def _softmax_both_ways(config, name: str):
  """(x, y, temperature, margin, valid) -> (x2y, y2x) as config.tasks.<name>.loss_impl says."""
  impl = config.tasks[name].get("loss_impl", "ring")
  _require(impl in defaults.LOSS_IMPLS, f"tasks.{name}.loss_impl", f"{impl!r} not in {defaults.LOSS_IMPLS}")
  axes = ()
  if impl == "ring":
    axes = sharding.batch_spec(sharding.rules_from_config(config))[0] or ()
    axes = (axes,) if isinstance(axes, str) else tuple(axes)
  return functools.partial(ring_loss.softmax_xent_both_ways, batch_axes=axes)


def image_text_task(config, name: str = "i2t") -> system.Task:
  """Images and captions, contrastive both ways at the model's temperature."""
  c = config.tasks[name]
  text_head, image_head = c.text_head, c.image_head
  softmax = _softmax_both_ways(config, name)

  def forward(model, batch, train):
    return {"image": model.embed_images(batch["image"], image_head, train),
            "text": model.embed_texts(batch["text_ids"], batch["text_mask"], text_head, train),
            "temperature": model.temperature()}

  def loss(out, batch):
    i2t, t2i = softmax(out["image"], out["text"], out["temperature"], 0.0, batch["valid"])
    return i2t + t2i, {"loss/i2t": i2t, "loss/t2i": t2i, "temperature": out["temperature"]}

  return system.task_from_config(config, name, input=inputs.IMAGE_TEXT, forward=forward, loss=loss,
                                 heads=(text_head, image_head))


def text_pair_task(config, name: str = "t2t") -> system.Task:
  """Translation pairs, additive-margin softmax both ways at a fixed temperature."""
  c = config.tasks[name]
  _require(c.temperature > 0, f"tasks.{name}.temperature", f"must be positive, got {c.temperature}")
  _require(0 <= c.margin < 2, f"tasks.{name}.margin", f"must be in [0, 2), got {c.margin}")
  head, temperature, margin = c.head, float(c.temperature), float(c.margin)
  softmax = _softmax_both_ways(config, name)

  def forward(model, batch, train):
    # Both sides through the tower as one batch, so the program holds the tower once, not twice
    # (XLA's CPU compile time grows faster than the program). Rows interleave (left 0, right 0,
    # left 1, ...): a device's batch shard stays on that device.
    n = batch["left_ids"].shape[0]
    rows = lambda left, right: jnp.stack([left, right], axis=1).reshape((2 * n,) + left.shape[1:])
    both = model.embed_texts(rows(batch["left_ids"], batch["right_ids"]),
                             rows(batch["left_mask"], batch["right_mask"]), head, train)
    both = both.reshape((n, 2) + both.shape[1:])
    return {"left": both[:, 0], "right": both[:, 1]}

  def loss(out, batch):
    l2r, r2l = softmax(out["left"], out["right"], temperature, margin, batch["valid"])
    return l2r + r2l, {"loss/l2r": l2r, "loss/r2l": r2l}

  return system.task_from_config(config, name, input=inputs.TEXT_PAIR, forward=forward, loss=loss,
                                 heads=(head,), updates_batch_stats=False)


def tasks(config) -> Sequence[system.Task]:
  return (image_text_task(config), text_pair_task(config))


def build_model(config, active: Sequence[system.Task]):
  """Towers from config.model, one head per name the tasks read; embedding sizes checked."""
  model = models.build_model(config.model, [h for t in active for h in t.heads])
  embed_dim = config.model.heads.embed_dim
  c = config.tasks.i2t
  image_dim = embed_dim if c.image_head else model.image_tower.output_dim
  text_dim = embed_dim if c.text_head else model.text_tower.output_dim
  if image_dim != text_dim:
    raise config_lib.ConfigError(
        f"config.model.heads.embed_dim: images embed to {image_dim} (tasks.i2t.image_head="
        f"{c.image_head!r}), texts to {text_dim} (tasks.i2t.text_head={c.text_head!r}); set "
        f"model.heads.embed_dim to {model.image_tower.output_dim} or give the image side a head")
  return model


def retrieval_heads(config, active: Sequence[system.Task]):
  """The i2t task's heads: what image-text retrieval (the evaluator, export, search) embeds with."""
  del active
  return {"image": config.tasks.i2t.image_head, "text": config.tasks.i2t.text_head}


def evaluators(config, active: Sequence[system.Task], tokenizer):
  """Retrieval per language with the i2t heads; translation retrieval with the t2t head
  (the i2t text head when the t2t task is off, as for ALIGN)."""
  retrieval, translation = eval_data.build_eval_sets(config, tokenizer)
  i2t = config.tasks.i2t
  t2t_on = any(t.name == "t2t" for t in active)
  pair_head = config.tasks.t2t.head if t2t_on else i2t.text_head
  out = []
  if retrieval:
    heads = retrieval_heads(config, active)
    out.append(evaluate.Retrieval(retrieval, text_head=heads["text"], image_head=heads["image"]))
  if translation:
    out.append(evaluate.Translation(translation, head=pair_head))
  return out


SYSTEM = system.System(name="mural", get_config=defaults.get_config, tasks=tasks, build_model=build_model,
                       evaluators=evaluators, retrieval_heads=retrieval_heads)
