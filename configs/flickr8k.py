"""Real data: Flickr8k photos with captions in six languages + Multi30k translation pairs.

    python -m mural.main --config=configs/flickr8k.py --workdir=/tmp/mural_flickr8k

Data (read in place, never copied; see ../shared/data/README.md):
  image-text: flickr8k_1k train split, captions in en, zh, ar, de, fr, cs
              ($MURAL_FLICKR8K_DIR or <repo>/../shared/data/flickr8k_1k);
  text-text:  Multi30k task 1 translations, every pair of en, de, fr, cs
              ($MURAL_MULTI30K_DIR or <repo>/../shared/data/multi30k);
  eval:       flickr8k_1k dev split (113 images), i2t/t2i R@1/5/10 and mR per language.
About 750 training images: a small model trained from scratch learns the
task but overfits soon; this config is for checking the whole path on real
photos and multilingual text (and for fine-tuning experiments), not for
paper numbers. On a GPU it runs in minutes (launch/gpu_local.sh); on 2 CPU
cores expect ~1 s per step.
"""

from mural import systems

LANGUAGES = ["en", "zh", "ar", "de", "fr", "cs"]


def get_config():
  c = systems.base_config("mural")

  # A B0-shaped EfficientNet at half width/depth on 128 px photos, a 4-layer BERT.
  c.model.image.variant = "b0"
  c.model.image.width_coefficient = 0.5
  c.model.image.depth_coefficient = 0.5
  c.model.image.stochastic_depth_rate = 0.1
  c.model.text.vocab_size = 8000  # Learned from the training captions and pairs into the workdir.
  c.model.text.token_embed_dim = 128
  c.model.text.hidden_dim = 256
  c.model.text.num_layers = 4
  c.model.text.num_heads = 4
  c.model.text.mlp_dim = 1024
  c.model.text.max_len = 48
  c.model.heads.embed_dim = 160  # The tower's pooled width: round_filters(320, 0.5).

  c.tasks.i2t.learning_rate = 3e-3
  c.tasks.i2t.batch_size = 64
  c.tasks.i2t.sources = [dict(name="flickr8k", weight=1.0, languages=LANGUAGES)]
  c.tasks.t2t.weight = 0.1  # MURAL.
  c.tasks.t2t.learning_rate = 3e-4  # MURAL's 10:1.
  c.tasks.t2t.batch_size = 64
  c.tasks.t2t.sources = [dict(name="multi30k", weight=1.0, kinds=["translation"],
                              languages=["en", "de", "fr", "cs"])]
  c.optim.warmup_steps = 200
  c.total_steps = 3000

  c.data.languages = LANGUAGES
  c.data.image_size = 128
  c.data.eval_resize = 146  # ALIGN's 289/346 crop ratio.
  c.data.shuffle_buffer = 20_000  # All of flickr8k_1k's train captions.
  c.data.eval_source = dict(name="flickr8k", split="dev")

  c.log_every_steps = 50
  c.eval_every_steps = 500
  c.checkpoint_every_steps = 500
  c.eval_batch_size = 128
  return c
