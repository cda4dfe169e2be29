"""Kádár et al. on the built-in data at CPU scale: a few minutes on 2 cores.

    python -m mural.main --config=configs/kadar_demo.py --workdir=/tmp/kadar_demo \
        --config.model.image.backbone_workdir=<a configs/demo.py workdir>

The paper's model at an eighth of its widths (words 300 -> 64, GRU and
embeddings 1024 -> 128) over the frozen features of the demo's tiny
EfficientNet (B0 at width/depth 0.25, 32 px; the paper used ImageNet
ResNet-50 features). Pass --config.model.image.backbone_workdir=<a
configs/demo.py workdir>: with a seeded, untrained backbone the features
carry too little (as MULE's demo found). Four languages, as the paper (en,
de, fr, cs), with every cross-language pair for c2c. Departures for minutes
on a CPU: learning rate 3e-3 (measured, mean mR: 8 after 600 steps at 2e-4
with both tasks; c2i alone after 400 steps, 21 at 1e-3 and 37 at 3e-3), batch
64, evaluation every 100 steps with patience 5 (the paper: 500 and 10), at
most 1500 steps. The rate is constant (configs/kadar.py: optim.decay = False);
the rates above were measured with the linear decay to 0 at total_steps, then
the only schedule.
"""

from mural import config_lib
from mural import systems

LANGUAGES = ["en", "de", "fr", "cs"]


def get_config():
  c = systems.base_config("kadar")
  config_lib.backbone_from(c, config_lib.sibling(__file__, "demo.py"))  # Its frozen tower's run.
  c.model.image.output_dim = 128
  c.model.text.words_per_language = 512  # The built-in grammars use 30-60 words per language.
  c.model.text.word_dim = 64
  c.model.text.lstm_dim = 128
  c.model.text.output_dim = 128
  c.model.text.max_len = 24

  c.data.autotune = False  # Closing the pipeline is immediate (config_lib.py says why).
  c.data.synthetic.languages = list(LANGUAGES)
  c.data.languages = list(LANGUAGES)
  c.data.synthetic.translation_pair_list = [f"{a}-{b}" for i, a in enumerate(LANGUAGES) for b in LANGUAGES[i + 1:]]
  c.data.synthetic.default_pairs = 5_000
  c.data.synthetic.translation_pairs = 2_000
  c.data.synthetic.eval_scenes = 200

  c.tasks.c2i.batch_size = 64
  c.tasks.c2c.batch_size = 64
  c.tasks.c2i.learning_rate = 3e-3
  c.tasks.c2c.learning_rate = 3e-3
  c.total_steps = 1500

  c.log_every_steps = 100
  c.eval_every_steps = 100
  c.checkpoint_every_steps = 100
  c.early_stopping.patience = 5
  c.keep_checkpoints = 1
  c.eval_batch_size = 200
  return c
