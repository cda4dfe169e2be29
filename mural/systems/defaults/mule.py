"""MULE's config defaults and the paper's ablations as field overrides.

Config files import this module: it imports no JAX or TensorFlow, so a
config mistake is reported in under a second. The system itself (tasks,
model, evaluators) is mural/systems/mule.py.
"""

import ml_collections

from mural import config_lib


SYNTHETIC = dict(name="synthetic", weight=1.0)

# Field overrides of the paper's compared models (Table 2 / supplementary).
ABLATIONS = {
    "parallel_embn": {"model.text.branches": "per_language", "tasks.nc.weight": 0.0,
                      "tasks.mm.classifier_weight": 0.0},
    "embn": {"tasks.nc.weight": 0.0, "tasks.mm.classifier_weight": 0.0},
    "embn_nc": {"tasks.mm.classifier_weight": 0.0},
    "embn_nc_lc": {},
    "embn_lc": {"tasks.nc.weight": 0.0},
    # LP, MULE's pre-training: the neighbourhood constraints alone on paired sentences. The full
    # model (EmbN+NC+LC+LP) is 'embn_nc_lc' warm-started from it: config.init_from = its workdir,
    # config.data.word_vocab_path = its words.json (configs/mule_demo.py shows the two commands).
    "pretrain": {"tasks.mm.weight": 0.0},
}


def apply_ablation(config, name: str):
  """config with ABLATIONS[name]'s fields set."""
  if name not in ABLATIONS:
    raise config_lib.ConfigError(f"MULE ablation {name!r} not in {sorted(ABLATIONS)}")
  for key, value in ABLATIONS[name].items():
    config_lib.set_field(config, key, value)
  return config


def get_config() -> ml_collections.ConfigDict:
  c = config_lib.base_config()
  c.system = "mule"
  # Image: a frozen mural tower's pooled features -> FC -> BN -> ReLU -> FC.
  c.model.image.name = "features"
  c.model.image.backbone = "efficientnet"  # IMAGE_TOWERS key, built from this section's fields.
  c.model.image.backbone_workdir = ""  # A trained mural run (workdir or export) whose image tower is the backbone; "": seeded init.
  c.model.image.backbone_seed = 0
  c.model.image.hidden_dim = 2048
  c.model.image.output_dim = 512
  # Text: per-language words -> per-language FC -> LSTM -> FC.
  c.model.text.name = "word_lstm"
  c.model.text.words_per_language = 20_000  # Id rows per language (2 reserved: padding, unknown).
  c.model.text.word_dim = 300
  c.model.text.mule_dim = 512
  c.model.text.lstm_dim = 1024
  c.model.text.output_dim = 512
  c.model.text.branches = "shared"  # shared (MULE) | per_language (PARALLEL-EmbN).
  # FastText .vec text files, '{lang}' standing for the language code (e.g. '/data/cc.{lang}.300.vec'):
  # the first word vectors of the words in data.word_vocab_path (needed then); "": random.
  c.model.text.embeddings_path = ""
  c.data.tokenizer = "words"  # Per-language word vocabularies (mural/data/word_vocab.py).
  c.data.word_min_count = 1  # Rarer words are the language's unknown word.
  c.data.word_vocab_path = ""  # A words.json to use; "": learned into workdir/words.json.
  c.data.languages = list(c.data.synthetic.languages)

  c.tasks.mm = ml_collections.ConfigDict(dict(
      weight=1.0,  # lambda_3.
      learning_rate=1e-4,  # Adam 1e-4 (paper).
      batch_size=450,  # Images per batch (paper).
      sources=[SYNTHETIC],  # Image-text sources.
      margin=0.05,
      top_k=10,  # Most violated constraints per anchor.
      classifier_weight=1e-6,  # lambda_2; 0 turns the language classifier off.
  ))
  c.tasks.nc = ml_collections.ConfigDict(dict(
      weight=1.0,  # lambda_1; 0 turns the neighbourhood constraints off.
      learning_rate=1e-4,
      batch_size=450,
      sources=[SYNTHETIC],  # Text-pair sources: sentences of one image in two languages.
      margin=0.05,
      top_k=10,
  ))
  c.optim.layer_adaptation = False  # Adam(W), as the paper (Adam).
  c.optim.weight_decay = 0.0
  # PyTorch's Adam epsilon: the classifier's gradient is lambda_2 = 1e-6 times its cross-entropy's,
  # which an epsilon of 1e-6 would shrink to almost no step.
  c.optim.eps = 1e-8
  c.optim.warmup_steps = 100
  return c
