"""MULE (Kim et al., AAAI 2020): one shared language branch for many languages.

Model (mural/models/word_lstm.py, feature_tower.py, multilingual.py):
  text:  per-language word vectors (300) -> the language's own FC -> MULE
         features (512); u = their mean; LSTM (1024) over them, last hidden
         state -> FC -> s (512). One LSTM and FC for all languages ('shared');
         PARALLEL-EmbN gives each language its own ('per_language').
  image: fixed features of a frozen mural image tower -> FC 2048 -> BN ->
         ReLU -> FC 512 (EmbN's image branch).
  an adversarial language classifier: one FC on u through gradient reversal.

Tasks (each with the trainer's per-task optimizer; weights are the paper's lambdas):
  mm (image-text records with language ids): lambda_3 * image-sentence
      triplet loss both ways over the K = 10 most violated constraints
      (Eq. 3), plus classifier_weight (lambda_2 = 1e-6) * the language
      classifier's cross-entropy on u (Eq. 2). Adversarial by gradient
      reversal, not alternating updates: the classifier descends lambda_2 L_LC
      and every language-specific parameter ascends it in the same step, which
      is Eq. 4 exactly, stays one compiled step and one optimizer update per
      task (alternating updates would need a second step per batch). With
      Adam the classifier learns at full speed despite lambda_2 = 1e-6 (Adam
      is scale-free per parameter); the reversed gradient reaching the
      language-specific parameters stays 1e-6 of its size, as in the paper.
  nc (text pairs: captions of one scene in two languages, i.e. sentences of
      the same image across languages): lambda_1 * the multi-layer
      neighbourhood constraints (Eq. 1): the same top-K triplet form on s and
      on u. On the built-in data the image-caption records of a batch never
      share an image, so the paired sentences come from the text-pair source.

Ablations and baselines of the paper (Table 2) are config values (ABLATIONS and
`apply_ablation` in mural/systems/defaults/mule.py): PARALLEL-EmbN, EmbN,
EmbN+NC, EmbN+NC+LC, and LP (MULE's pre-training on paired sentences:
'pretrain', then a warm start from it).

Loss weights across tasks: each task has its own Adam state (mural/optim.py),
which normalises that task's gradient, so lambda_1 (tasks.nc.weight) and
lambda_3 (tasks.mm.weight) only scale a task against the terms inside it;
how strongly NC pulls against the triplet loss is set by the two tasks'
learning rates (equal here, as lambda_1 = lambda_3 = 1 in the paper).

Choices where the paper is silent: margin m = 0.05 (EmbN's and SMALR's);
AdamW without weight decay and a linear schedule (mural's optimizer; the
paper: Adam 1e-4, exponential decay, L2 5e-7 on word vectors); the
language-specific FC is linear.
"""

import json
from typing import Sequence

from absl import logging
from etils import epath
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
from mural.systems.defaults import mule as defaults

eval_data = lazy_import.module("mural.data.eval_data")  # TensorFlow: loaded when evaluating.


_require = config_lib.require
_positive_int = config_lib.positive_int


def validate(config) -> None:
  """MULE's own fields; one-line ConfigErrors naming the field."""
  t, im = config.model.text, config.model.image
  _positive_int(t, "words_per_language", "model.text", minimum=3)
  for name in ("word_dim", "mule_dim", "lstm_dim", "output_dim"):
    _positive_int(t, name, "model.text")
  _require(t.branches in word_lstm.BRANCHES, "model.text.branches", f"{t.branches!r} not in {word_lstm.BRANCHES}")
  if im.name == "features":
    feature_tower.validate(im, min_hidden_dim=1)
    _require(t.output_dim == im.output_dim, "model.text.output_dim",
             f"texts embed to {t.output_dim}, images to {im.output_dim} (model.image.output_dim); they must match")
  _require(config.data.get("tokenizer") == "words", "data.tokenizer",
           f"must be 'words' (per-language word vocabularies) for MULE, got {config.data.get('tokenizer')!r}")
  _positive_int(config.data, "word_min_count", "data")
  _require(isinstance(config.data.word_vocab_path, str), "data.word_vocab_path",
           f"must be a path string ('' to learn one), got {config.data.word_vocab_path!r}")
  _require(isinstance(t.embeddings_path, str), "model.text.embeddings_path",
           f"must be a path string ('' for random vectors), got {t.embeddings_path!r}")
  _require(not t.embeddings_path or config.data.word_vocab_path, "model.text.embeddings_path",
           "needs config.data.word_vocab_path, the words whose rows the vectors fill (learn one with "
           "`python -m mural.learn_words CONFIG OUT_DIR`)")
  for name in ("mm", "nc"):
    section, field = config.tasks[name], f"tasks.{name}"
    _require(0 <= section.margin <= 2, f"{field}.margin", f"must be in [0, 2] (cosine distance), got {section.margin}")
    _positive_int(section, "top_k", field)
  _require(config.tasks.mm.classifier_weight >= 0, "tasks.mm.classifier_weight",
           f"must be >= 0, got {config.tasks.mm.classifier_weight}")


def image_sentence_task(config) -> system.Task:
  """Images and sentences (with language ids): top-K triplet both ways, + the adversarial classifier."""
  validate(config)
  c = config.tasks.mm
  margin, k, classifier_weight = float(c.margin), int(c.top_k), float(c.classifier_weight)

  def forward(model, batch, train):
    s, aux = model.text_features(batch["text_ids"], batch["text_mask"], train)
    out = {"image": model.embed_images(batch["image"], None, train), "text": s}
    if classifier_weight > 0:
      out["lang_logits"] = model.classify_language(aux["mule"])
    return out

  def loss(out, batch):
    total, parts = losses.top_k_triplet_loss(out["image"], out["text"], margin, k, batch["valid"])
    metrics = {"loss/i2s": parts["x2y"], "loss/s2i": parts["y2x"]}
    lc, lc_metrics = language_classifier_term(out, batch)
    return total + classifier_weight * lc, {**metrics, **lc_metrics}

  return system.task_from_config(config, "mm", input=inputs.IMAGE_TEXT_LANG, forward=forward, loss=loss)


def language_classifier_term(out, batch):
  """(L_adv, its metrics) of the adversarial language classifier when the forward ran it (out has
  'lang_logits'), else (0, {}): MULE's term of the image-sentence loss, and SMALR's."""
  if "lang_logits" not in out:
    return 0.0, {}
  lc, lc_metrics = losses.language_classifier_loss(out["lang_logits"], batch["lang_id"], batch["valid"])
  return lc, {"loss/language": lc, "language_accuracy": lc_metrics["accuracy"]}


def neighbourhood_task(config) -> system.Task:
  """Sentences of one image in two languages: top-K triplet on s (multimodal) and on u (MULE)."""
  validate(config)
  c = config.tasks.nc
  margin, k = float(c.margin), int(c.top_k)

  def forward(model, batch, train):
    s_left, left = model.text_features(batch["left_ids"], batch["left_mask"], train)
    s_right, right = model.text_features(batch["right_ids"], batch["right_mask"], train)
    return {"s_left": s_left, "s_right": s_right, "u_left": left["mule"], "u_right": right["mule"]}

  def loss(out, batch):
    on_s, _ = losses.top_k_triplet_loss(out["s_left"], out["s_right"], margin, k, batch["valid"])
    on_u, _ = losses.top_k_triplet_loss(out["u_left"], out["u_right"], margin, k, batch["valid"])
    return on_s + on_u, {"loss/nc_multimodal": on_s, "loss/nc_mule": on_u}

  return system.task_from_config(config, "nc", input=inputs.TEXT_PAIR_LANG, forward=forward, loss=loss,
                                 updates_batch_stats=False)


def tasks(config) -> Sequence[system.Task]:
  return (image_sentence_task(config), neighbourhood_task(config))


def build_model(config, active: Sequence[system.Task]):
  """The two towers from config.model and, when the mm task uses it, the language classifier."""
  validate(config)
  dtype, param_dtype = jnp.dtype(config.model.dtype), jnp.dtype(config.model.param_dtype)
  image = models.tower("image", config.model.image, dtype, param_dtype)
  text_section = ml_collections.ConfigDict(config.model.text.to_dict())
  text_section.num_languages = len(config.data.languages)  # The word vocabulary's blocks.
  text = models.tower("text", text_section, dtype, param_dtype)
  if config.model.text.get("embeddings_path", ""):
    text = text.clone(word_init=_fasttext_table(config))
  if image.output_dim != text.output_dim:
    raise config_lib.ConfigError(
        f"config.model.text.output_dim: texts embed to {text.output_dim}, images to {image.output_dim} "
        f"(model.image.output_dim); they must match")
  uses_classifier = any(t.name == "mm" for t in active) and config.tasks.mm.classifier_weight > 0
  classifier = (multilingual.LanguageClassifier(len(config.data.languages), dtype=dtype, param_dtype=param_dtype)
                if uses_classifier else None)
  return multilingual.MultilingualDualEncoder(image_tower=image, text_tower=text, language_classifier=classifier)


def _fasttext_table(config):
  """The word table with FastText vectors where the .vec files have the vocabulary's words."""
  t = config.model.text
  words = json.loads(epath.Path(config.data.word_vocab_path).read_text())["words"]
  table, found = word_lstm.load_fasttext(t.embeddings_path, list(config.data.languages), words,
                                         t.words_per_language, t.word_dim, seed=config.seed)
  logging.info("FastText vectors found per language: %s (of %s words).", found,
               {l: len(w) for l, w in words.items()})
  return table


def evaluators(config, active: Sequence[system.Task], tokenizer):
  """Image<->sentence retrieval per language (when images are trained: not in LP's pre-training)
  and translation retrieval, both with s."""
  retrieval, translation = eval_data.build_eval_sets(config, tokenizer)
  out = []
  if retrieval and any(t.name == "mm" for t in active):
    out.append(evaluate.Retrieval(retrieval, text_head=None, image_head=None))
  if translation:
    out.append(evaluate.Translation(translation, head=None))
  return out


SYSTEM = system.System(name="mule", get_config=defaults.get_config, tasks=tasks, build_model=build_model,
                       evaluators=evaluators, retrieval_heads=system.towers_embed,
                       initialisers=("model.text.embeddings_path",))
