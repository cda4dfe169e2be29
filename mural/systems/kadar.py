"""Kádár et al., "Lessons learned in multilingual grounded language learning" (CoNLL 2018).

Model (mural/models/word_lstm.py, feature_tower.py, multilingual.py):
  text:  ONE word-embedding table for the union of every language's words
         (data.word_vocab_union; words seen fewer than data.word_min_count = 4
         times are UNK) -> a GRU (1024), its final state at the sentence's last
         word is the embedding (no FC after it).
  image: fixed features of a frozen mural image tower -> one linear layer
         (1024); the paper: ImageNet ResNet-50 features, 2048 -> 1024.
  Both L2-normalised in the loss; similarity = cosine.

Tasks, sharing every parameter, ONE trained per step (System.choose_task =
system.draw_by_weight over tasks.<name>.draw_weight, 0.5 each: the paper's
p = 0.5), inside one compiled step:
  c2i: captions and their images. With tasks.c2i.one_language_per_batch each
       source is split into one source per language (a 'synthetic' source's
       `languages` field) and each batch comes whole from one of them
       (Task.one_source_per_batch): "a language is sampled at random followed
       by sampling a random batch".
  c2c: two captions of one image in two languages; every cross-language pair
       of the data is one data set (the built-in data: translation pairs for
       every pair of languages, data.synthetic.translation_pair_list).
  Loss of both: VSE++'s max of hinges (losses.max_hinge_loss, margin alpha).

Adam 2e-4 (AdamW without decay), early stopping on the sum of R@1/5/10 both
ways ('mean/rsum', averaged over the languages), patience 10 evaluations,
every 500 steps (config.early_stopping, a trainer feature).

Choices where the paper is silent: margin 0.2 and batch 128 (VSE++'s defaults,
whose code the paper builds on); the early-stopping sum is averaged over the
evaluated languages; each task has its own Adam state (mural's per-task
optimizers; the paper: one Adam over both tasks' steps). The rate is constant
(optim.decay = False: the paper's code, built on VSE++'s, never lowers it);
mural's default linear decay to 0 at total_steps starved a short run's late
steps (docs/systems.md, "Kádár et al.").
"""

import dataclasses
from typing import Sequence

import jax.numpy as jnp
import ml_collections

from mural import config_lib
from mural import evaluate
from mural import lazy_import
from mural import losses
from mural import models
from mural import system
from mural.data import inputs
from mural.models import feature_tower
from mural.models import multilingual
from mural.models import word_lstm
from mural.systems.defaults import kadar as defaults

eval_data = lazy_import.module("mural.data.eval_data")  # TensorFlow: loaded when evaluating.


_require = config_lib.require
_positive_int = config_lib.positive_int


def validate(config) -> None:
  """Kádár et al.'s own fields; one-line ConfigErrors naming the field."""
  t, im = config.model.text, config.model.image
  _positive_int(t, "words_per_language", "model.text", minimum=3)
  for name in ("word_dim", "lstm_dim", "output_dim", "max_len"):
    _positive_int(t, name, "model.text")
  _require(t.cell in word_lstm.CELLS, "model.text.cell", f"{t.cell!r} not in {word_lstm.CELLS}")
  _require(t.lang_fc is False, "model.text.lang_fc", f"must be False (one union table, no per-language FC), got {t.lang_fc!r}")
  _require(t.output_fc or t.output_dim == t.lstm_dim, "model.text.output_dim",
           f"{t.output_dim}, but the GRU's state is the embedding (output_fc=False): it must equal lstm_dim {t.lstm_dim}")
  if im.name == "features":
    feature_tower.validate(im)
    _require(t.output_dim == im.output_dim, "model.image.output_dim",
             f"images embed to {im.output_dim}, texts to {t.output_dim} (model.text.output_dim); they must match")
  _require(config.data.get("tokenizer") == "words", "data.tokenizer",
           f"must be 'words' (a word vocabulary) for Kádár et al., got {config.data.get('tokenizer')!r}")
  _require(config.data.get("word_vocab_union") is True, "data.word_vocab_union",
           f"must be True (one embedding table for every language), got {config.data.get('word_vocab_union')!r}")
  _positive_int(config.data, "word_min_count", "data")
  _require(isinstance(config.data.word_vocab_path, str), "data.word_vocab_path",
           f"must be a path string ('' to learn one), got {config.data.word_vocab_path!r}")
  for name in ("c2i", "c2c"):
    section, field = config.tasks[name], f"tasks.{name}"
    _require(0 <= section.margin <= 2, f"{field}.margin", f"must be in [0, 2] (cosine), got {section.margin}")
    _require(section.draw_weight > 0, f"{field}.draw_weight", f"must be > 0, got {section.draw_weight}")
  _require(isinstance(config.tasks.c2i.one_language_per_batch, bool), "tasks.c2i.one_language_per_batch",
           f"must be True or False, got {config.tasks.c2i.one_language_per_batch!r}")


def _per_language(sources, languages):
  """Each source once per language (its own `languages`, else data.languages), one language each."""
  out = []
  for s in sources:
    for lang in (s.get("languages") or languages):
      out.append({**dict(s), "languages": [lang]})
  return out


def caption_image_task(config) -> system.Task:
  """c2i: captions against their images, max of hinges both ways."""
  validate(config)
  c = config.tasks.c2i
  margin = float(c.margin)

  def forward(model, batch, train):
    return {"text": model.embed_texts(batch["text_ids"], batch["text_mask"], None, train),
            "image": model.embed_images(batch["image"], None, train)}

  def loss(out, batch):
    total, parts = losses.max_hinge_loss(out["text"], out["image"], margin, batch["valid"])
    return total, {"loss/c2i": total, "loss/c2i_t2i": parts["x2y"], "loss/c2i_i2t": parts["y2x"]}

  task = system.task_from_config(config, "c2i", input=inputs.IMAGE_TEXT, forward=forward, loss=loss,
                                 draw_weight=float(c.draw_weight), one_source_per_batch=c.one_language_per_batch)
  if c.one_language_per_batch:
    task = dataclasses.replace(task, sources=tuple(_per_language(task.sources, config.data.languages)))
  return task


def caption_caption_task(config) -> system.Task:
  """c2c: two captions of one image in two languages, max of hinges both ways."""
  validate(config)
  c = config.tasks.c2c
  margin = float(c.margin)

  def forward(model, batch, train):
    return {"left": model.embed_texts(batch["left_ids"], batch["left_mask"], None, train),
            "right": model.embed_texts(batch["right_ids"], batch["right_mask"], None, train)}

  def loss(out, batch):
    total, _ = losses.max_hinge_loss(out["left"], out["right"], margin, batch["valid"])
    return total, {"loss/c2c": total}

  return system.task_from_config(config, "c2c", input=inputs.TEXT_PAIR, forward=forward, loss=loss,
                                 draw_weight=float(c.draw_weight), updates_batch_stats=False)


def tasks(config) -> Sequence[system.Task]:
  return (caption_image_task(config), caption_caption_task(config))


def build_model(config, active: Sequence[system.Task]):
  """The frozen-feature image tower (one linear layer) and the union-table GRU text tower."""
  del active
  validate(config)
  dtype, param_dtype = jnp.dtype(config.model.dtype), jnp.dtype(config.model.param_dtype)
  image = models.tower("image", config.model.image, dtype, param_dtype)
  text_section = ml_collections.ConfigDict(config.model.text.to_dict())
  text_section.num_languages = 1  # The union vocabulary is one block.
  text = models.tower("text", text_section, dtype, param_dtype)
  return multilingual.MultilingualDualEncoder(image_tower=image, text_tower=text)


class RsumRetrieval:
  """Image<->caption retrieval per language (evaluate.Retrieval) plus '<lang>/rsum', the sum of
  R@1/5/10 both ways (VSE++'s and the paper's model-selection score), and 'mean/rsum'."""

  def __init__(self, retrieval):
    self.retrieval = retrieval

  def run(self, embedder, variables):
    results = self.retrieval.run(embedder, variables)
    sums = {}
    for s in self.retrieval.sets:
      sums[s.name] = sum(results[f"{s.name}/{d}_R@{k}"] for d in ("i2t", "t2i") for k in (1, 5, 10))
      results[f"{s.name}/rsum"] = sums[s.name]
    if sums:
      results["mean/rsum"] = sum(sums.values()) / len(sums)
    return results


def evaluators(config, active: Sequence[system.Task], tokenizer):
  """Image<->caption retrieval per language (with rsum) and caption translation retrieval."""
  del active
  retrieval, translation = eval_data.build_eval_sets(config, tokenizer)
  out = []
  if retrieval:
    out.append(RsumRetrieval(evaluate.Retrieval(retrieval, text_head=None, image_head=None)))
  if translation:
    out.append(evaluate.Translation(translation, head=None))
  return out


SYSTEM = system.System(name="kadar", get_config=defaults.get_config, tasks=tasks, build_model=build_model,
                       evaluators=evaluators, choose_task=system.draw_by_weight,
                       retrieval_heads=system.towers_embed)
