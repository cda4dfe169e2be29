"""SMALR (Burns et al. 2020) at the paper's sizes, on the built-in data.

    python -m mural.main --config=configs/smalr.py:pretrain --workdir=/tmp/smalr_lv
    python -m mural.main --config=configs/smalr.py --workdir=/tmp/smalr \
        --config.model.text.latent_workdir=/tmp/smalr_lv \
        --config.data.word_vocab_path=/tmp/smalr_lv/words.json
    python -m mural.main --config=configs/smalr.py --mode=describe

Hybrid Embedding Model: K = 5000 language-specific words per language (50-d
-> per-language FC -> 512), the rest on a 40k-token shared latent vocabulary
(50-d -> shared FC -> 512); LSTM 1024 -> FC 512; images: frozen features ->
FC 2048 -> BN -> ReLU -> FC 512; batch 450; L = L_mm (1.5 on sentence->image)
+ 1e-4 L_mask + 1e-6 L_adv + 5e-2 L_nc (mural/systems/smalr.py). The argument
after ':' is one of mural.systems.smalr.ABLATIONS ('smalr' by default; 'hem',
'full_vocab', 'pretrain'). Sized for an accelerator: configs/smalr_demo.py is
the CPU version. FastText vectors: --config.model.text.embeddings_path.
"""

from mural import systems
from mural.systems.defaults import smalr


def get_config(ablation: str = "smalr"):
  c = systems.base_config("smalr")
  c.model.text.max_len = 32
  c.data.synthetic.eval_scenes = 1000  # Multi30K's test split has 1k images.
  c.clc.validation_images = 500
  c.total_steps = 20_000
  c.optim.warmup_steps = 500
  c.eval_every_steps = 2_000
  c.checkpoint_every_steps = 2_000
  c.eval_batch_size = 500
  return smalr.apply_ablation(c, ablation)
