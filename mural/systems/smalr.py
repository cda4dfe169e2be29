"""SMALR (Burns et al., ECCV 2020): few parameters for many languages.

Model (mural/models/hem.py, feature_tower.py, word_lstm.py):
  text:  the Hybrid Embedding Model: each language's top K words (and its
         unknown word) keep a language-specific vector (50-d) -> the language's
         FC -> 512; every other word takes its token of a shared latent
         vocabulary (50-d features) -> one shared FC -> 512. u = the mean of
         those word features, s = LSTM (1024) over them -> FC 512.
  image: MULE's: fixed features of a frozen mural image tower -> FC 2048 ->
         BN -> ReLU -> FC 512.
  the adversarial language classifier on u (gradient reversal, as MULE) and
  MCLM's two shared FCs (one on the mean u, one on the LSTM s).

Phases (like MULE's LP pre-training -> warm start):
  1. 'pretrain' (ablation): the latent vocabulary alone (model.text.name =
     'latent_vocab', task 'latent'): paired sentences of one image, each the
     mean of its words' latent features, top-K triplet (margin 0.05, K = 10),
     with the exploration rule (p = 0.2 among the top 20).
  2. the full model with config.model.text.latent_workdir = the phase-1
     workdir and config.data.word_vocab_path = its words.json: the frozen
     argmax assignment, the used tokens' features as the initial (fine-tuned)
     latent features, unused tokens dropped (mural/models/hem.py says where
     the assignment lives and why). Without latent_workdir the assignment is
     a seeded hash of the word ids onto the latent tokens (no pre-training:
     a baseline, and the cheap path of the tests).

Tasks (per-task Adam, as MULE; the weights are the paper's lambdas, Eq. 4):
  mm (images + captions with language ids): L_mm = triplet(I, Q+, Q-) +
      1.5 triplet(Q, I+, I-) over the K = 10 most violated constraints, on
      the sentences and again on their masked versions (20% of words masked),
      + 1e-6 L_adv (the language classifier on u, through gradient reversal).
  pairs (captions of one scene in two languages, every language pair):
      5e-2 L_nc (top-K triplet between the two sentences on s and on u) +
      1e-4 L_mask: both sentences masked, each representation (u and s) of
      the two concatenated into the shared FC predicting what is missing from
      each, ||l2(S^m + S') - l2(S)|| per sentence (Eq. 2).
  latent (phase 1 only): the top-K triplet loss between the two sentences as means
      of their tokens' features and as means of their words' FC points, + the
      quantisation term of the nearest-token choice (hem.py).
  L_mm needs images and L_mask needs two captions of one image: on the
  built-in data an image-caption batch never holds two captions of an image,
  so L_mask and L_nc read the text-pair source, as MULE's NC does; and since
  each task has its own Adam state, lambda_2 and lambda_4 weigh L_mask
  against L_nc inside the pairs task, not against L_mm (the two tasks' learning
  rates do that; equal here).

Masking: each real word independently with probability tasks.<t>.mask_rate
(a Bernoulli draw per word from the step's dropout key; the paper: "20% of
words"), the mean leaving masked words out, the LSTM reading [MASK] for them.

Evaluators: image<->sentence retrieval per language (the plain query),
cross-lingual consistency (mural/clc.py: the single-language query, CLC-A
and CLC-C on the same test images; CLC-C trained on the first
clc.validation_images images), translation retrieval.

Choices where the paper is silent: the latent features are 50-d like the
specific ones, with one shared FC to 512 (the paper's total of < 20M
parameters leaves no room for 40k x 512 latent rows); without FastText, the
specific vectors and the pre-training's word features are learned; the
straight-through gradient of the hard assignment (hem.py); margin 0.05 and
K = 10 everywhere; Adam 1e-3 for the HEM (the paper's "1e-3 for the HEM and
LA models").
"""

import functools
import json
from typing import Sequence

from absl import logging
from etils import epath
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from mural import clc
from mural import config_lib
from mural import evaluate
from mural import lazy_import
from mural import losses
from mural import metric_log
from mural import models
from mural import saved_variables
from mural import system
from mural.data import inputs
from mural.models import feature_tower
from mural.models import hem
from mural.models import multilingual
from mural.models import word_lstm
from mural.systems import mule
from mural.systems.defaults import smalr as defaults

eval_data = lazy_import.module("mural.data.eval_data")  # TensorFlow: loaded when evaluating.


_require = config_lib.require
_positive_int = config_lib.positive_int


def validate(config) -> None:
  """SMALR's own fields; one-line ConfigErrors naming the field."""
  t, im = config.model.text, config.model.image
  _require(t.name in ("hem_lstm", "latent_vocab"), "model.text.name",
           f"{t.name!r} not in ['hem_lstm', 'latent_vocab'] (SMALR's towers)")
  _positive_int(t, "words_per_language", "model.text", minimum=3)
  _require(isinstance(t.specific_words, int) and 0 <= t.specific_words <= t.words_per_language - 2,
           "model.text.specific_words",
           f"must be an int in [0, words_per_language - 2 = {t.words_per_language - 2}], got {t.specific_words!r}")
  _require(isinstance(t.latent_tokens, int) and t.latent_tokens >= 0, "model.text.latent_tokens",
           f"must be an int >= 0, got {t.latent_tokens!r}")
  _require(t.latent_tokens > 0 or t.specific_words == t.words_per_language - 2, "model.text.latent_tokens",
           f"0 (no latent vocabulary) needs every word language-specific (specific_words = "
           f"{t.words_per_language - 2}), got specific_words = {t.specific_words}")
  for name in ("specific_dim", "latent_dim", "hem_dim", "lstm_dim", "output_dim", "word_dim"):
    _positive_int(t, name, "model.text")
  _require(isinstance(t.explore_p, (int, float)) and 0 <= t.explore_p <= 1, "model.text.explore_p",
           f"must be a probability in [0, 1], got {t.explore_p!r}")
  _positive_int(t, "explore_top", "model.text")
  _require(t.name != "latent_vocab" or t.latent_tokens > 0, "model.text.latent_tokens",
           "the latent-vocabulary pre-training needs latent tokens (> 0)")
  for name in ("latent_workdir", "embeddings_path"):
    _require(isinstance(t[name], str), f"model.text.{name}", f"must be a path string ('' for none), got {t[name]!r}")
  _require(not (t.latent_workdir or t.embeddings_path) or config.data.word_vocab_path, "model.text.latent_workdir"
           if t.latent_workdir else "model.text.embeddings_path",
           "needs config.data.word_vocab_path (the pre-training run's words.json: the words the rows belong to)")
  if im.name == "features":
    feature_tower.validate(im, min_hidden_dim=1)
  _require(t.name != "hem_lstm" or t.output_dim == im.output_dim, "model.text.output_dim",
           f"texts embed to {t.output_dim}, images to {im.output_dim} (model.image.output_dim); they must match")
  _require(config.model.image.name in models.IMAGE_TOWERS, "model.image.name",
           f"{config.model.image.name!r} not in {sorted(models.IMAGE_TOWERS)}")
  _require(config.data.get("tokenizer") == "words", "data.tokenizer",
           f"must be 'words' (per-language word vocabularies) for SMALR, got {config.data.get('tokenizer')!r}")
  _positive_int(config.data, "word_min_count", "data")
  _require(isinstance(config.data.word_vocab_path, str), "data.word_vocab_path",
           f"must be a path string ('' to learn one), got {config.data.word_vocab_path!r}")
  for name in ("mm", "pairs", "latent"):
    section, field = config.tasks[name], f"tasks.{name}"
    _require(0 <= section.margin <= 2, f"{field}.margin", f"must be in [0, 2] (cosine distance), got {section.margin}")
    _positive_int(section, "top_k", field)
  for name, field in (("mm", "sentence_weight"), ("mm", "classifier_weight"), ("pairs", "nc_weight"),
                      ("pairs", "mask_weight")):
    v = config.tasks[name][field]
    _require(isinstance(v, (int, float)) and v >= 0, f"tasks.{name}.{field}", f"must be >= 0, got {v!r}")
  for name in ("mm", "pairs"):
    v = config.tasks[name].mask_rate
    _require(isinstance(v, (int, float)) and 0 <= v < 1, f"tasks.{name}.mask_rate", f"must be in [0, 1), got {v!r}")
  clc = config.clc
  _require(isinstance(clc.validation_images, int) and clc.validation_images >= 0, "clc.validation_images",
           f"must be an int >= 0 (0: no CLC evaluator), got {clc.validation_images!r}")
  for name in ("hidden_dim", "iterations"):
    _positive_int(clc, name, "clc")
  _require(clc.learning_rate > 0, "clc.learning_rate", f"must be > 0, got {clc.learning_rate}")


def _word_mask(model, mask, rate: float):
  """bool [B, T]: each real word masked with probability `rate` (the step's dropout key)."""
  return jax.random.bernoulli(model.make_rng("dropout"), rate, mask.shape) & (mask > 0)


def _mm_loss(image, text, c, valid):
  _, parts = losses.top_k_triplet_loss(image, text, float(c.margin), int(c.top_k), valid)
  return parts["x2y"] + float(c.sentence_weight) * parts["y2x"], parts


def image_sentence_task(config) -> system.Task:
  """L_mm on sentences (and masked sentences) + lambda_3 L_adv."""
  validate(config)
  c = config.tasks.mm
  rate, classifier_weight = float(c.mask_rate), float(c.classifier_weight)

  def forward(model, batch, train):
    s, aux = model.text_features(batch["text_ids"], batch["text_mask"], train)
    out = {"image": model.embed_images(batch["image"], None, train), "text": s}
    if rate > 0:
      out["text_masked"] = model.text_features(batch["text_ids"], batch["text_mask"], train,
                                               word_mask=_word_mask(model, batch["text_mask"], rate))[0]
    if classifier_weight > 0:
      out["lang_logits"] = model.classify_language(aux["mean"])
    return out

  def loss(out, batch):
    total, parts = _mm_loss(out["image"], out["text"], c, batch["valid"])
    metrics = {"loss/i2s": parts["x2y"], "loss/s2i": parts["y2x"]}
    if "text_masked" in out:
      masked, parts = _mm_loss(out["image"], out["text_masked"], c, batch["valid"])
      total = total + masked
      metrics.update({"loss/i2s_masked": parts["x2y"], "loss/s2i_masked": parts["y2x"]})
    lc, lc_metrics = mule.language_classifier_term(out, batch)
    return total + classifier_weight * lc, {**metrics, **lc_metrics}

  return system.task_from_config(config, "mm", input=inputs.IMAGE_TEXT_LANG, forward=forward, loss=loss)


def pairs_task(config) -> system.Task:
  """Captions of one scene in two languages: lambda_4 L_nc (on s and u) + lambda_2 L_mask."""
  validate(config)
  c = config.tasks.pairs
  margin, k, rate = float(c.margin), int(c.top_k), float(c.mask_rate)
  nc_weight, mask_weight = float(c.nc_weight), float(c.mask_weight)

  def forward(model, batch, train):
    out, masked = {}, {}
    for side in ("left", "right"):
      ids, mask = batch[f"{side}_ids"], batch[f"{side}_mask"]
      out[f"s_{side}"], aux = model.text_features(ids, mask, train)
      out[f"u_{side}"] = aux["mean"]
      if mask_weight > 0:
        s_m, aux_m = model.text_features(ids, mask, train, word_mask=_word_mask(model, mask, rate))
        masked[side] = {"sentence": s_m, "mean": aux_m["mean"]}
    if mask_weight > 0:
      for which, key in (("mean", "u"), ("sentence", "s")):
        left, right = model.predict_missing(which, masked["left"][which], masked["right"][which])
        out.update({f"{key}m_left": masked["left"][which], f"{key}m_right": masked["right"][which],
                    f"{key}p_left": left, f"{key}p_right": right})
    return out

  def loss(out, batch):
    valid = batch["valid"]
    on_s, _ = losses.top_k_triplet_loss(out["s_left"], out["s_right"], margin, k, valid)
    on_u, _ = losses.top_k_triplet_loss(out["u_left"], out["u_right"], margin, k, valid)
    total, metrics = nc_weight * (on_s + on_u), {"loss/nc_sentence": on_s, "loss/nc_mean": on_u}
    if mask_weight > 0:
      for key, name in (("u", "mean"), ("s", "sentence")):
        term = sum(losses.masked_reconstruction_loss(out[f"{key}m_{side}"], out[f"{key}p_{side}"],
                                                     out[f"{key}_{side}"], valid) for side in ("left", "right"))
        total = total + mask_weight * term
        metrics[f"loss/mask_{name}"] = term
    return total, metrics

  return system.task_from_config(config, "pairs", input=inputs.TEXT_PAIR_LANG, forward=forward, loss=loss,
                                 updates_batch_stats=False)


def latent_task(config) -> system.Task:
  """Phase 1: paired sentences, each the mean of its latent features, top-K triplet."""
  validate(config)
  c = config.tasks.latent
  margin, k = float(c.margin), int(c.top_k)

  def forward(model, batch, train):
    out = {}
    for side in ("left", "right"):
      out[side], aux = model.text_features(batch[f"{side}_ids"], batch[f"{side}_mask"], train)
      out[f"vq_{side}"], out[f"continuous_{side}"] = aux["vq"], aux["continuous"]
    return out

  def loss(out, batch):
    total, parts = losses.top_k_triplet_loss(out["left"], out["right"], margin, k, batch["valid"])
    continuous, _ = losses.top_k_triplet_loss(out["continuous_left"], out["continuous_right"], margin, k,
                                              batch["valid"])
    vq = (out["vq_left"] + out["vq_right"]) / 2
    return total + continuous + vq, {"loss/latent_l2r": parts["x2y"], "loss/latent_r2l": parts["y2x"],
                                     "loss/latent_continuous": continuous, "loss/vq": vq,
                                     "latent/sentence_cosine": losses.mean_negative_cosine(
                                         out["continuous_left"], out["continuous_right"], batch["valid"])}

  return system.task_from_config(config, "latent", input=inputs.TEXT_PAIR_LANG, forward=forward, loss=loss,
                                 updates_batch_stats=False)


def tasks(config) -> Sequence[system.Task]:
  return (image_sentence_task(config), pairs_task(config), latent_task(config))


def words_of(config):
  """Per language of config.data.languages, its words in the word vocabulary (None: none given)."""
  if not config.data.word_vocab_path:
    return None
  words = json.loads(epath.Path(config.data.word_vocab_path).read_text())["words"]
  return [words.get(l, []) for l in config.data.languages]


def _fasttext(config):
  """[L * N, word_dim] FastText rows of the vocabulary's words (random where a word has none),
  read-only."""
  t = config.model.text
  return _read_fasttext(t.embeddings_path, tuple(config.data.languages), config.data.word_vocab_path,
                        t.words_per_language, t.word_dim, config.seed)


@functools.lru_cache(maxsize=1)
def _read_fasttext(path_pattern, languages, word_vocab_path, words_per_language, word_dim, seed):
  """The last table read, kept: an export reads it for the model's assignment and again for its
  copy of phase 1 (frozen_inputs), and a .vec file of FastText's 2M words takes minutes."""
  words = json.loads(epath.Path(word_vocab_path).read_text())["words"]
  table, found = word_lstm.load_fasttext(path_pattern, list(languages), words, words_per_language, word_dim,
                                         seed=seed)
  logging.info("FastText vectors found per language: %s.", found)
  table.flags.writeable = False  # Shared by every caller.
  return table


def hybrid_tables(config):
  """(assignment [L*N], U latent tokens kept, latent features [U, latent_dim] or None, specific
  vectors or None): the frozen hybrid vocabulary of config (see the module docstring, phase 2)."""
  t = config.model.text
  num_langs, n, k = len(config.data.languages), t.words_per_language, t.specific_words
  fasttext = _fasttext(config) if t.embeddings_path else None
  specific = None
  if fasttext is not None:  # Per language: PCA of its vocabulary rows, then its specific rows.
    blocks = [hem.pca_rows(fasttext[l * n:(l + 1) * n], t.specific_dim)[:k + 2] for l in range(num_langs)]
    specific = np.concatenate(blocks)
  rows = hem.latent_rows(num_langs, n, k, words_of(config))
  if not t.latent_tokens:
    return np.full(num_langs * n, -1, np.int32), 0, None, specific
  if t.latent_workdir:
    try:  # A workdir's checkpoint (its best step, else the newest that reads) or an export's copy.
      saved = saved_variables.read_variables(t.latent_workdir)[0]["params"]["text_tower"]
    except (FileNotFoundError, KeyError) as e:
      raise config_lib.ConfigError(f"config.model.text.latent_workdir: no latent-vocabulary pre-training "
                                   f"checkpoint in {t.latent_workdir} ({e})") from None
    latent = np.asarray(saved["token_latent"])
    if saved["token_embed"].shape != (num_langs * n, t.word_dim) or latent.shape[1] != t.latent_dim:
      raise config_lib.ConfigError(
          f"config.model.text.latent_workdir: {t.latent_workdir} was pre-trained with other sizes "
          f"(word table {saved['token_embed'].shape}, latent {latent.shape}) than model.text")
    tokens = hem.final_assignment(saved, fasttext)
    _warn_if_collapsed(t.latent_workdir)
  else:  # No pre-training: a seeded hash of the ids (every token kept: nothing says which are unused).
    tokens = np.random.default_rng(config.seed).integers(0, t.latent_tokens, num_langs * n)
    latent = None
  assignment, used = hem.compact_assignment(tokens, rows)
  if latent is None:
    assignment = np.where(rows, tokens, -1).astype(np.int32)
    used = np.arange(t.latent_tokens)
  return assignment, len(used), (latent[used] if latent is not None else None), specific


# Phase 1's latent/sentence_cosine above this: it has not left its early collapse (hem.py).
# Measured: 0.94-0.996 in the collapse (configs/smalr_demo.py, configs/smalr_flickr8k.py),
# 0.37-0.52 after it (configs/smalr_demo.py).
COLLAPSED_SENTENCE_COSINE = 0.9


def _warn_if_collapsed(workdir: str) -> None:
  """A phase 1 stopped in its early collapse gives an assignment that says little about meaning:
  phase 2 trains on it (a baseline) with a warning that says so and what to do. Read from phase
  1's metrics.jsonl (an export's copy of phase 1 has none: no check)."""
  cosine = metric_log.last_value(workdir, "latent/sentence_cosine")
  if cosine is not None and cosine > COLLAPSED_SENTENCE_COSINE:
    logging.warning(
        "Phase 1 (%s) ended in its early collapse: its last latent/sentence_cosine is %.2f (every "
        "sentence nearly one point; after the collapse, 0.4-0.5 on the built-in data), so its "
        "assignment puts words on tokens almost regardless of meaning. Train phase 1 longer or at "
        "a higher tasks.latent.learning_rate (mural/models/hem.py).", workdir, cosine)


def frozen_inputs(config):
  """{'model.text.latent_workdir': phase 1's text tower} (System.frozen_inputs), with the
  FastText rows it read as its word table when there were any, so that the frozen assignment
  comes out the same without the .vec files (hybrid_tables; model.text.embeddings_path then only
  initialised the specific vectors). Without phase 1 the assignment is a hash of config.seed."""
  t = config.model.text
  if t.name != "hem_lstm" or not t.latent_workdir:
    return {}
  saved = dict(saved_variables.read_variables(t.latent_workdir)[0]["params"]["text_tower"])
  if t.embeddings_path:
    saved["token_embed"] = _fasttext(config)
  return {"model.text.latent_workdir": {"params": {"text_tower": saved}, "batch_stats": {}}}


def build_model(config, active: Sequence[system.Task]):
  """The towers from config.model, the classifier and MCLM predictors the active tasks read."""
  validate(config)
  dtype, param_dtype = jnp.dtype(config.model.dtype), jnp.dtype(config.model.param_dtype)
  t, num_langs = config.model.text, len(config.data.languages)
  image = models.tower("image", config.model.image, dtype, param_dtype)
  section = ml_collections.ConfigDict(t.to_dict())
  section.num_languages = num_langs
  if t.name == "latent_vocab":
    section.word_init = _fasttext(config) if t.embeddings_path else None
  else:
    section.assignment, section.num_latent, section.latent_init, section.specific_init = hybrid_tables(config)
  text = models.tower("text", section, dtype, param_dtype)
  names = {task.name for task in active}
  classifier = (multilingual.LanguageClassifier(num_langs, dtype=dtype, param_dtype=param_dtype)
                if "mm" in names and config.tasks.mm.classifier_weight > 0 else None)
  mclm = "pairs" in names and config.tasks.pairs.mask_weight > 0
  predictor = lambda dim: hem.MaskedPredictor(dim, dtype=dtype, param_dtype=param_dtype) if mclm else None
  return hem.SmalrDualEncoder(image_tower=image, text_tower=text, language_classifier=classifier,
                              mclm_mean=predictor(t.hem_dim), mclm_sentence=predictor(t.output_dim))


def evaluators(config, active: Sequence[system.Task], tokenizer):
  """Retrieval per language (the plain query), cross-lingual consistency (CLC-A, CLC-C) when images
  are trained; translation retrieval."""
  retrieval, translation = eval_data.build_eval_sets(config, tokenizer)
  out = []
  if retrieval and any(t.name == "mm" for t in active):
    out.append(evaluate.Retrieval(retrieval, text_head=None, image_head=None))
    c = config.clc
    if c.validation_images and len(retrieval) > 1:
      if c.validation_images >= len(retrieval[0].images):
        raise config_lib.ConfigError(
            f"config.clc.validation_images: {c.validation_images} leaves none of the "
            f"{len(retrieval[0].images)} eval images to test on")
      out.append(clc.CrossLingualConsistency(
          retrieval, c.validation_images, c.hidden_dim, c.iterations, c.learning_rate,
          config.tasks.mm.margin, config.tasks.mm.top_k, config.tasks.mm.sentence_weight, config.seed))
  if translation:
    out.append(evaluate.Translation(translation, head=None))
  return out


SYSTEM = system.System(name="smalr", get_config=defaults.get_config, tasks=tasks, build_model=build_model,
                       evaluators=evaluators, retrieval_heads=system.towers_embed,
                       initialisers=("model.text.embeddings_path",), frozen_inputs=frozen_inputs)
