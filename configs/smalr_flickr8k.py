"""SMALR on real data: Flickr8k photos with captions in six languages, Multi30k sentence pairs.

    python -m mural.main --config=configs/smalr_flickr8k.py:pretrain --workdir=/tmp/smalr_f8k_lv
    python -m mural.main --config=configs/smalr_flickr8k.py --workdir=/tmp/smalr_f8k \
        --config.model.text.latent_workdir=/tmp/smalr_f8k_lv \
        --config.data.word_vocab_path=/tmp/smalr_f8k_lv/words.json \
        --config.model.image.backbone_workdir=/tmp/mural_flickr8k

  mm: Flickr8k's train split (en, zh, ar, de, fr, cs), L_mm on sentences and masked
      sentences + LC;
  pairs, latent: Multi30k task 1 translations between en, de, fr, cs (sentences of the
      same Flickr30k images; Multi30K is the paper's own dataset);
  eval: Flickr8k's dev split (113 images): mR per language; CLC-C trains on the first
      50 images, the plain query, CLC-A and CLC-C are compared on the other 63. A
      language without a caption of an image gives its query's own score there.
The frozen backbone is configs/flickr8k.py's image tower (train it first, as
for configs/mule_flickr8k.py). K = 1000 specific words per language of 8000
rows, 4000 latent tokens. About 750 training images: this checks the whole
path on real photos and text, it gives no paper numbers. Measured (2-core
AVX-512 EPYC): phase 1 learns all six languages' words (zh 509, ar 783),
runs its 1000 steps at about 3 steps/s ("Done" 6 min 04 s), leaves its early
collapse at step 300 (latent/sentence_cosine 0.98 -> 0.52; 0.39 at the end)
and keeps 1731 latent tokens in use. Phase 2 on it at --config.total_steps=1000
(about 0.33 steps/s, 53 min): mean mR 6.9, 6.3, 7.1, 7.3 at steps 250-1000 (chance 4.7;
docs/systems.md, "On real data: Flickr8k"), as on the phase 1 of before (3000 steps at 3e-4, which
never left the collapse: 26 tokens in use; 6.7, 6.3, 7.4, 7.5 at 250-1000).
"""

from mural import config_lib
from mural import systems
from mural.systems.defaults import smalr


def get_config(ablation: str = "smalr"):
  c = systems.base_config("smalr")
  flickr8k = config_lib.sibling(__file__, "flickr8k.py")  # Its frozen tower's run; the same data.
  config_lib.backbone_from(c, flickr8k)
  c.model.image.hidden_dim = 1024
  c.model.image.output_dim = 256
  t = c.model.text
  t.words_per_language = 8000
  t.specific_words = 1000
  t.latent_tokens = 4000
  t.hem_dim = 256
  t.lstm_dim = 512
  t.output_dim = 256
  t.max_len = 48

  c.tasks.mm.sources = flickr8k.tasks.i2t.sources
  pairs = flickr8k.tasks.t2t.sources
  for name in ("mm", "pairs", "latent"):
    c.tasks[name].batch_size = 128
    c.tasks[name].learning_rate = 3e-4
  c.tasks.pairs.sources = pairs
  c.tasks.latent.sources = pairs
  # Phase 1 at Adam 1e-2: at 3e-4 it sat in its early collapse for all of 3000 steps
  # (latent/sentence_cosine 0.94 at the end, mural/models/hem.py); at 1e-2 it leaves it by step 250-300.
  c.tasks.latent.learning_rate = 1e-2
  c.optim.warmup_steps = 200
  c.total_steps = 1000 if ablation == "pretrain" else 3000

  c.data.word_min_count = 2
  for field in ("languages", "shuffle_buffer", "eval_source", "eval_translations"):
    c.data[field] = flickr8k.data[field]
  c.clc.validation_images = 50

  c.log_every_steps = 50
  c.eval_every_steps = 500
  c.checkpoint_every_steps = 500
  c.eval_batch_size = 128
  return smalr.apply_ablation(c, ablation)
