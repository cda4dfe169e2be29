"""Kádár et al.'s config defaults (caption-image and caption-caption ranking).

Config files import this module: it imports no JAX or TensorFlow, so a
config mistake is reported in under a second. The system itself (tasks,
model, evaluators) is mural/systems/kadar.py.
"""

import ml_collections

from mural import config_lib


SYNTHETIC = dict(name="synthetic", weight=1.0)


def get_config() -> ml_collections.ConfigDict:
  c = config_lib.base_config()
  c.system = "kadar"
  # Image: a frozen mural tower's pooled features -> one linear layer.
  c.model.image.name = "features"
  c.model.image.backbone = "efficientnet"  # IMAGE_TOWERS key, built from this section's fields.
  c.model.image.backbone_workdir = ""  # A trained mural run (workdir or export) whose image tower gives the features; "": seeded.
  c.model.image.backbone_seed = 0
  c.model.image.hidden_dim = 0  # One linear layer (feature_tower: 0 = no hidden layer).
  c.model.image.output_dim = 1024
  # Text: union word table -> GRU; its last state is the embedding.
  c.model.text.name = "word_lstm"
  c.model.text.cell = "gru"
  c.model.text.lang_fc = False  # No per-language FC: the words feed the GRU.
  c.model.text.output_fc = False  # The GRU's final state is the sentence.
  c.model.text.branches = "shared"
  c.model.text.words_per_language = 20_000  # Rows of the one union table (2 reserved: padding, UNK).
  c.model.text.word_dim = 300
  c.model.text.mule_dim = 0  # Unused (no per-language FC).
  c.model.text.lstm_dim = 1024  # The GRU's units.
  c.model.text.output_dim = 1024  # = lstm_dim: the GRU state is the embedding.
  c.model.text.max_len = 32
  c.data.tokenizer = "words"
  c.data.word_vocab_union = True  # One table for the union of all languages' words.
  c.data.word_min_count = 4  # "words occurring fewer than four times" -> UNK.
  c.data.word_vocab_path = ""  # A words.json to use; "": learned into workdir/words.json.
  c.data.languages = list(c.data.synthetic.languages)
  # c2c: every pair of languages (the paper's "all possible <c_a, c_b> pairs"), both orders in one set.
  langs = list(c.data.synthetic.languages)
  c.data.synthetic.translation_pair_list = [f"{a}-{b}" for i, a in enumerate(langs) for b in langs[i + 1:]]
  c.data.synthetic.translation_pairs = 5_000  # Per pair (28 pairs for 8 languages).

  c.tasks.c2i = ml_collections.ConfigDict(dict(
      weight=1.0,
      learning_rate=2e-4,  # Adam 2e-4 (paper).
      batch_size=128,  # VSE++'s default.
      sources=[SYNTHETIC],  # Image-text sources ('synthetic': split by language, see below).
      margin=0.2,  # alpha (VSE++'s default).
      draw_weight=0.5,  # p of the task switch.
      one_language_per_batch=True,  # Each source split per data.languages; each batch one language.
  ))
  c.tasks.c2c = ml_collections.ConfigDict(dict(
      weight=1.0,  # 0 turns caption-caption ranking off (the "- c2c" models).
      learning_rate=2e-4,
      batch_size=128,
      sources=[SYNTHETIC],  # Text-pair sources: captions of one image in two languages.
      margin=0.2,
      draw_weight=0.5,
  ))
  c.optim.layer_adaptation = False  # Adam(W) ...
  c.optim.weight_decay = 0.0  # ... without decay: Adam.
  c.optim.eps = 1e-8  # PyTorch's (and the paper's "default parameters").
  c.optim.warmup_steps = 0
  c.optim.decay = False  # A constant rate (the paper's code); no decay to 0 at total_steps.
  c.total_steps = 100_000  # A ceiling: early stopping ends the run.
  c.eval_every_steps = 500  # "evaluated every 500 iterations".
  c.checkpoint_every_steps = 500
  c.early_stopping.metric = "mean/rsum"  # R@1 + R@5 + R@10, both ways, mean over languages.
  c.early_stopping.patience = 10
  c.early_stopping.mode = "max"
  return c
