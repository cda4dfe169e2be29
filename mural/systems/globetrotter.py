"""Globetrotter (Surís et al., CVPR 2022): languages aligned through vision, no parallel text.

Model (mural/models/globetrotter.py): a ResNet image tower (ResNet-18 in the
paper), one BERT text tower for every language over one subword vocabulary
(4 layers, 4 heads, hidden 512), a prediction head on each to D = 128, and
BERT's masked-LM head on the text tower (tied to the token table).

One task, 'globetrotter', on image-text records with two SimCLR views of each
image (inputs.IMAGE_TEXT_VIEWS; crop, flip, colour distortion, grayscale,
blur in tf.data), every language mixed in one batch:
  L = lambda_t L_t + lambda_v L_v + lambda_x L_x + lambda_c L_c   (Eq. 5; 1, 0.2, 0.2, 0.2)
  L_v  NT-Xent between the two views (losses.nt_xent_loss);
  L_x  image-caption InfoNCE both ways, image = view 1 (losses.image_caption_loss);
  L_t  caption-caption softmax with the transitive soft targets
       alpha_ij = f(a^x_ii a^v_ij a^x_jj), margin m = 0.4, image = view 1
       (losses.transitive_text_loss): two captions are pulled together when
       their images look alike and each caption matches its image;
  L_c  token cloze on a masked copy of the captions (BERT's 15%, 80/10/10).
All similarities are cosines rescaled to [0, 1], over the temperature. One
Adam (1e-4) over the sum, as the paper: one task, so one optimizer state.
A lambda of 0 drops its term and what only it reads (lambda_t = lambda_v =
lambda_x = 0 is the paper's text-only baseline: L_c alone, no image).

Choices where the paper is silent: temperature 0.1 on the rescaled
similarities (SimCLR's), for every loss; alpha is a stop-gradient (targets:
L_t does not move the image side); L_t and L_x read the unmasked captions,
L_c a masked copy (two text passes); each loss is a mean over its anchors;
heads are Dense-GELU-Dense (SimCLR's projection MLP); a short warm-up then
mural's linear decay.

Evaluation (mural/translation_retrieval.py): translation by retrieval over
the eval scenes' captions in all M languages, scored as the paper does (each
query's M - 1 translations, the share of them in its top M - 1), with the
text head; and word translation by Procrustes over the token table with
anchors from k = 5 mutual nearest neighbours.
"""

from typing import Sequence

import jax
import jax.numpy as jnp

from mural import config_lib
from mural import evaluate
from mural import lazy_import
from mural import losses
from mural import models
from mural import system
from mural import translation_retrieval
from mural.data import inputs
from mural.data import tokenizer
from mural.models import globetrotter as model_lib
from mural.models import heads
from mural.systems.defaults import globetrotter as defaults

eval_data = lazy_import.module("mural.data.eval_data")  # TensorFlow: loaded when evaluating.


_require = config_lib.require


def validate(config) -> None:
  """Globetrotter's own fields; one-line ConfigErrors naming the field."""
  t, f = config.tasks[defaults.TASK], f"tasks.{defaults.TASK}"
  _require(t.temperature > 0, f"{f}.temperature", f"must be positive, got {t.temperature}")
  _require(0 <= t.margin < 1, f"{f}.margin", f"must be in [0, 1), got {t.margin}")
  for name in ("lambda_t", "lambda_v", "lambda_x", "lambda_c"):
    _require(t[name] >= 0, f"{f}.{name}", f"must be >= 0, got {t[name]}")
  _require(any(t[n] > 0 for n in ("lambda_t", "lambda_v", "lambda_x", "lambda_c")), f"{f}.lambda_t",
           "every lambda is 0: nothing to train")
  _require(0 < t.mask_rate < 1, f"{f}.mask_rate", f"must be in (0, 1), got {t.mask_rate}")
  _require(config.model.text.name == "bert", "model.text.name",
           f"must be 'bert' (the cloze reads its token table), got {config.model.text.name!r}")
  _require(config.model.text.token_embed_dim == config.model.text.hidden_dim, "model.text.token_embed_dim",
           f"{config.model.text.token_embed_dim} != hidden_dim {config.model.text.hidden_dim}: the cloze head "
           "ties to an unfactorised token table")
  v = config.data.views
  for name in ("colour_prob", "grayscale_prob", "blur_prob"):
    _require(0 <= v[name] <= 1, f"data.views.{name}", f"must be in [0, 1], got {v[name]}")
  _require(0 <= v.colour_strength <= 1.25, "data.views.colour_strength",
           f"must be in [0, 1.25] (contrast and saturation factors stay >= 0), got {v.colour_strength}")
  _require(config.data.synthetic.withhold_parallel_text, "data.synthetic.withhold_parallel_text",
           "must be True for Globetrotter: it learns with no parallel text")


def _mask_tokens(rng, ids, mask, rate: float):
  """BERT's cloze input: (masked ids, labels, weights). Of the word pieces (not [CLS], [SEP],
  padding), each is picked with probability `rate`; a picked one becomes [MASK] (80%), a random
  piece (10%) or stays (10%). weights is 1 on the picked positions.

  The random piece is a word piece drawn from the batch itself (their unigram distribution;
  BERT draws uniformly over its vocabulary): model.text.vocab_size is only an upper bound of
  the learned vocabulary, and rows past it are never read otherwise."""
  first = len(tokenizer.RESERVED_TOKENS)
  pick_rng, kind_rng, token_rng = jax.random.split(rng, 3)
  candidate = (mask > 0) & (ids >= first)
  picked = candidate & (jax.random.uniform(pick_rng, ids.shape) < rate)
  u = jax.random.uniform(kind_rng, ids.shape)
  where = jax.random.categorical(token_rng, jnp.where(candidate.ravel(), 0.0, -jnp.inf), shape=ids.shape)
  random_ids = ids.ravel()[where]  # With no word piece in the batch nothing is picked.
  new = jnp.where(u < 0.8, tokenizer.MASK_ID, jnp.where(u < 0.9, random_ids, ids))
  return jnp.where(picked, new, ids), ids, picked.astype(jnp.float32)


def globetrotter_task(config) -> system.Task:
  validate(config)
  c = config.tasks[defaults.TASK]
  t, m, rate = float(c.temperature), float(c.margin), float(c.mask_rate)
  lt, lv, lx, lc = float(c.lambda_t), float(c.lambda_v), float(c.lambda_x), float(c.lambda_c)
  uses_images, uses_text_head = lt > 0 or lv > 0 or lx > 0, lt > 0 or lx > 0

  def forward(model, batch, train):
    ids, mask = batch["text_ids"], batch["text_mask"]
    out = {}
    if uses_images:
      out["image"] = model.embed_images(batch["image"], "image", train)
      if lv > 0:
        out["image2"] = model.embed_images(batch["image2"], "image", train)
    if uses_text_head:
      out["text"] = model.embed_texts(ids, mask, "text", train)
    if lc > 0:
      masked, labels, weights = _mask_tokens(model.make_rng("dropout"), ids, mask, rate)
      out["mlm_logits"] = model.mlm_logits(model.text_sequence(masked, mask, train))
      out["mlm_labels"], out["mlm_weights"] = labels, weights
    return out

  def loss(out, batch):
    valid = batch["valid"]
    total, metrics = 0.0, {}
    if lt > 0:
      l, aux = losses.transitive_text_loss(out["text"], out["image"], t, m, valid)
      total, metrics["loss/text_text"], metrics["transitive_positive_mass"] = total + lt * l, l, aux["positive_mass"]
    if lv > 0:
      l, aux = losses.nt_xent_loss(out["image"], out["image2"], t, valid)
      total, metrics["loss/views"], metrics["views_accuracy"] = total + lv * l, l, aux["accuracy"]
    if lx > 0:
      l, _ = losses.image_caption_loss(out["image"], out["text"], t, valid)
      total, metrics["loss/image_caption"] = total + lx * l, l
    if lc > 0:
      weights = out["mlm_weights"] * valid[:, None]
      l, aux = losses.masked_lm_loss(out["mlm_logits"], out["mlm_labels"], weights)
      total, metrics["loss/cloze"], metrics["cloze_accuracy"] = total + lc * l, l, aux["accuracy"]
    return total, metrics

  return system.task_from_config(config, defaults.TASK, input=inputs.IMAGE_TEXT_VIEWS, forward=forward, loss=loss,
                                 updates_batch_stats=uses_images)


def tasks(config) -> Sequence[system.Task]:
  return (globetrotter_task(config),)


def build_model(config, active: Sequence[system.Task]):
  """ResNet + BERT from config.model, a head on each (model.heads), the tied cloze head."""
  del active
  validate(config)
  dtype, param_dtype = jnp.dtype(config.model.dtype), jnp.dtype(config.model.param_dtype)
  head = lambda name: heads.from_config(config.model.heads, dtype, param_dtype).clone(name=name)
  return model_lib.GlobetrotterModel(
      image_tower=models.tower("image", config.model.image, dtype, param_dtype),
      text_tower=models.tower("text", config.model.text, dtype, param_dtype),
      image_head=head("image_head"), text_head=head("text_head"),
      mlm_head=model_lib.MlmHead(config.model.text.vocab_size, dtype=dtype, param_dtype=param_dtype,
                                 name="mlm_head"))


def retrieval_heads(config, active):
  del config, active
  return {"image": "image", "text": "text"}


def evaluators(config, active: Sequence[system.Task], tokenizer):
  """Translation by retrieval over every eval language (the paper's metric): with the text head
  ('translation_retrieval/...', when a loss trains it), with the text tower's [CLS] output
  ('translation_retrieval_tower/...') and with the mean of its token outputs
  ('translation_retrieval_mean_pool/...': the text-only baseline has no head); image<->text retrieval
  per language when the images are trained; on the built-in data, word translation over the
  token table's rows (nearest neighbours, and Procrustes on mutual-nearest-neighbour anchors)."""
  del active
  retrieval, _ = eval_data.build_eval_sets(config, tokenizer)
  if not retrieval:
    return []
  c = config.tasks[defaults.TASK]
  out = []
  if c.lambda_t > 0 or c.lambda_x > 0:
    out.append(translation_retrieval.MultiwayTranslation(retrieval, head="text"))
  out.append(translation_retrieval.MultiwayTranslation(retrieval, head=None, name="translation_retrieval_tower"))
  out.append(translation_retrieval.MultiwayTranslation(retrieval, head=model_lib.MEAN_POOL,
                                                       name="translation_retrieval_mean_pool"))
  if c.lambda_x > 0:
    out.append(evaluate.Retrieval(retrieval, text_head="text", image_head="image"))
  if config.data.eval_source.get("name") == "synthetic":
    words = translation_retrieval.synthetic_word_translation(config, tokenizer, ("text_tower", "token_embed", "embedding"))
    out += [words] if words else []
  return out


SYSTEM = system.System(name="globetrotter", get_config=defaults.get_config, tasks=tasks, build_model=build_model,
                       evaluators=evaluators, retrieval_heads=retrieval_heads)
