"""SMALR's config defaults and the paper's ablations as field overrides.

Config files import this module: it imports no JAX or TensorFlow, so a
config mistake is reported in under a second. The system itself (tasks,
model, evaluators) is mural/systems/smalr.py.
"""

import itertools
from typing import Sequence

import ml_collections

from mural import config_lib
from mural.systems.defaults import mule


SYNTHETIC = dict(name="synthetic", weight=1.0)

ABLATIONS = {
    "smalr": {},  # HEM + MCLM (+ NC, LC); CLC is an evaluator.
    "hem": {"tasks.mm.mask_rate": 0.0, "tasks.pairs.mask_weight": 0.0},  # Without MCLM.
    # Every word of every language language-specific (no latent vocabulary): the full per-language
    # vocabularies SMALR is compared with; specific_words is raised to the vocabulary in apply_ablation.
    "full_vocab": {"model.text.latent_tokens": 0},
    # Phase 1: the latent vocabulary alone on paired sentences.
    "pretrain": {"model.text.name": "latent_vocab", "tasks.latent.weight": 1.0, "tasks.mm.weight": 0.0,
                 "tasks.pairs.weight": 0.0},
}


def apply_ablation(config, name: str):
  """config with ABLATIONS[name]'s fields set."""
  if name not in ABLATIONS:
    raise config_lib.ConfigError(f"SMALR ablation {name!r} not in {sorted(ABLATIONS)}")
  for key, value in ABLATIONS[name].items():
    config_lib.set_field(config, key, value)
  if name == "full_vocab":
    config.model.text.specific_words = config.model.text.words_per_language - 2
  return config


def all_pairs(languages: Sequence[str]):
  """'a-b' for every unordered pair of languages (MCLM: "all unique pairs of languages")."""
  return [f"{a}-{b}" for a, b in itertools.combinations(languages, 2)]


def get_config() -> ml_collections.ConfigDict:
  c = mule.get_config()  # MULE's image side, word vocabularies and optimizer.
  c.system = "smalr"
  t = c.model.text
  for name in ("word_dim", "mule_dim", "branches", "embeddings_path"):
    del t[name]
  t.name = "hem_lstm"
  t.words_per_language = 25_000  # Id rows per language (2 reserved: padding, unknown).
  t.specific_words = 5_000  # K: language-specific words per language.
  t.specific_dim = 50  # FastText 300 -> PCA 50.
  t.latent_tokens = 40_000  # T: the shared latent vocabulary (before unused tokens are dropped).
  t.latent_dim = 50
  t.hem_dim = 512  # The universal embedding (HEM output).
  t.lstm_dim = 1024
  t.output_dim = 512
  # FastText .vec files, '{lang}' for the code: 300-d vectors of the vocabulary's words (needs
  # data.word_vocab_path); PCA'd to specific_dim for the specific words, the pre-training's input.
  t.embeddings_path = ""
  t.word_dim = 300  # The .vec files' width; the pre-training's learned word vectors without them.
  t.latent_workdir = ""  # A 'pretrain' run: its frozen assignment and latent features; "": hashed.
  t.explore_p = 0.2
  t.explore_top = 20
  c.data.synthetic.translation_pair_list = all_pairs(c.data.synthetic.languages)

  c.tasks = ml_collections.ConfigDict()
  c.tasks.mm = ml_collections.ConfigDict(dict(
      weight=1.0, learning_rate=1e-3, batch_size=450, sources=[SYNTHETIC],
      margin=0.05, top_k=10,
      sentence_weight=1.5,  # lambda_1: the sentence->image direction.
      mask_rate=0.2,  # L_mm on masked sentences too; 0: off.
      classifier_weight=1e-6,  # lambda_3 (L_adv); 0: no classifier.
  ))
  c.tasks.pairs = ml_collections.ConfigDict(dict(
      weight=1.0, learning_rate=1e-3, batch_size=450, sources=[SYNTHETIC],  # Text pairs.
      margin=0.05, top_k=10,
      nc_weight=5e-2,  # lambda_4 (L_nc).
      mask_weight=1e-4,  # lambda_2 (L_mask); 0: no MCLM.
      mask_rate=0.2,
  ))
  c.tasks.latent = ml_collections.ConfigDict(dict(
      weight=0.0,  # Phase 1 only (the 'pretrain' ablation).
      learning_rate=1e-3, batch_size=450, sources=[SYNTHETIC], margin=0.05, top_k=10,
  ))
  # Cross-lingual consistency (evaluator): the first validation_images eval images train CLC-C.
  c.clc = ml_collections.ConfigDict(dict(validation_images=500, hidden_dim=32, iterations=30,
                                         learning_rate=1e-2))
  return c
