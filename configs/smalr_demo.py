"""SMALR on the built-in data at CPU scale: minutes on 2 cores.

    python -m mural.main --config=configs/smalr_demo.py:pretrain --workdir=/tmp/smalr_lv
    python -m mural.main --config=configs/smalr_demo.py --workdir=/tmp/smalr_demo \
        --config.model.text.latent_workdir=/tmp/smalr_lv \
        --config.data.word_vocab_path=/tmp/smalr_lv/words.json \
        --config.model.image.backbone_workdir=<a configs/demo.py workdir>

The first run pre-trains the latent vocabulary (phase 1), the second trains
SMALR on its frozen assignment. The argument after ':' is one of
mural.systems.smalr.ABLATIONS: 'smalr' (default), 'hem' (no MCLM),
'full_vocab' (every word language-specific: the full per-language
vocabularies), 'pretrain'. The paper's architecture at demo widths: the
built-in grammars use 30-60 words per language, so K = 8 specific words
per language (of 64 rows) and 64 latent tokens stand for the paper's 5000
and 40k (phase 1: 3000 steps at Adam 1e-2, of which it spends the first
900-1100 in its early collapse; it ends with 51-54 tokens in use, most
words of one shape or colour on one token, and SMALR ends 2.7-7.5 mR
ahead of the full vocabularies: docs/systems.md, "SMALR"); vectors 16-d (paper 50), HEM 64 (512), LSTM 128 (1024), embeddings
64 (512), image FC 256 (2048), over the frozen features of the demo's tiny
EfficientNet: as for configs/mule_demo.py, pass a trained one
(model.image.backbone_workdir), or retrieval stays near chance. The first 100
of the 200 eval scenes train CLC-C; every CLC figure is on the other 100.
"""

from mural import config_lib
from mural import systems
from mural.systems.defaults import smalr


def get_config(ablation: str = "smalr"):
  c = systems.base_config("smalr")
  config_lib.backbone_from(c, config_lib.sibling(__file__, "demo.py"))  # Its frozen tower's run.
  c.model.image.hidden_dim = 256
  c.model.image.output_dim = 64
  t = c.model.text
  t.words_per_language = 64
  t.specific_words = 8
  t.latent_tokens = 64
  t.specific_dim = t.latent_dim = 16
  t.word_dim = 32  # The pre-training's learned word vectors (no FastText here).
  t.hem_dim = 64
  t.lstm_dim = 128
  t.output_dim = 64
  t.max_len = 24

  c.data.autotune = False  # Closing the pipeline is immediate (config_lib.py says why).
  c.data.synthetic.eval_scenes = 200
  c.clc.validation_images = 100

  for name in ("mm", "pairs", "latent"):
    c.tasks[name].batch_size = 64
  c.tasks.latent.learning_rate = 1e-2
  c.optim.warmup_steps = 50
  # Phase 1 collapses within 50 steps (every sentence one point, its loss at the margin) and leaves
  # the collapse after 900-1100 steps at this rate (1700 at 3e-3; measured, mural/models/hem.py).
  c.total_steps = 3000 if ablation == "pretrain" else 1000

  c.log_every_steps = 100
  c.eval_every_steps = 0
  c.checkpoint_every_steps = 500
  c.keep_checkpoints = 1
  c.eval_batch_size = 200
  return smalr.apply_ablation(c, ablation)
