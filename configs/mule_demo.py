"""MULE on the built-in data at CPU scale: minutes on 2 cores, one scarce language.

    python -m mural.main --config=configs/mule_demo.py --workdir=/tmp/mule_demo
    python -m mural.main --config=configs/mule_demo.py:parallel_embn --workdir=/tmp/parallel

The full model (EmbN+NC+LC+LP): pre-train on paired sentences, then warm-start:

    python -m mural.main --config=configs/mule_demo.py:pretrain --workdir=/tmp/mule_lp
    python -m mural.main --config=configs/mule_demo.py --workdir=/tmp/mule_full \
        --config.init_from=/tmp/mule_lp --config.data.word_vocab_path=/tmp/mule_lp/words.json

The argument after ':' is one of mural.systems.mule.ABLATIONS (default
'embn_nc_lc', MULE without pre-training): 'parallel_embn', 'embn', 'embn_nc',
'embn_lc', 'embn_nc_lc', 'pretrain'. The paper's architecture at a tenth of its widths
(words 300 -> 32, MULE 512 -> 64, LSTM 1024 -> 128, embeddings 512 -> 64,
image FC 2048 -> 256) over the frozen features of the demo's tiny
EfficientNet (B0 at width/depth 0.25, 32 px). Pass
--config.model.image.backbone_workdir=<a configs/demo.py workdir> (the paper
used ImageNet features): with the seeded, untrained tower the features carry
too little, the triplet losses sit at the margin with every sentence on one
point, and retrieval stays at chance (measured: mR 2-4 per language after 300 steps;
with the demo's trained tower 52.0 after 400, 74.8 after 1000). Swahili is scarce (300 image-caption pairs and 300 en-sw
sentence pairs against 20k for every other language), as French and Czech
are in Multi30K (a fifth of the captions).
"""

from mural import config_lib
from mural import systems
from mural.systems.defaults import mule

SCARCE = "sw"


def get_config(ablation: str = "embn_nc_lc"):
  c = systems.base_config("mule")
  config_lib.backbone_from(c, config_lib.sibling(__file__, "demo.py"))  # Its frozen tower's run.
  c.model.image.hidden_dim = 256
  c.model.image.output_dim = 64
  c.model.text.words_per_language = 256  # The built-in grammars use 30-60 words per language.
  c.model.text.word_dim = 32
  c.model.text.mule_dim = 64
  c.model.text.lstm_dim = 128
  c.model.text.output_dim = 64
  c.model.text.max_len = 24

  c.data.autotune = False  # Closing the pipeline is immediate (config_lib.py says why).
  c.data.synthetic.pairs_per_language = {SCARCE: 300}
  c.data.synthetic.translation_pairs_per_pair = {f"en-{SCARCE}": 300}
  c.data.synthetic.eval_scenes = 200

  c.tasks.mm.batch_size = 64
  c.tasks.nc.batch_size = 64
  c.tasks.mm.learning_rate = 1e-3
  c.tasks.nc.learning_rate = 1e-3
  c.optim.warmup_steps = 50
  c.total_steps = 1000

  c.log_every_steps = 100
  c.eval_every_steps = 0
  c.checkpoint_every_steps = 500
  c.keep_checkpoints = 1
  c.eval_batch_size = 200
  return mule.apply_ablation(c, ablation)
