"""MULE on real data: Flickr8k photos with captions in six languages, Multi30k sentence pairs for NC.

    python -m mural.main --config=configs/mule_flickr8k.py --workdir=/tmp/mule_flickr8k \
        --config.model.image.backbone_workdir=/tmp/mural_flickr8k

  mm: flickr8k_1k train split (en, zh, ar, de, fr, cs), image-sentence triplet + LC;
  nc: Multi30k task 1 translations between en, de, fr, cs (Multi30K is the
      paper's own dataset: these are sentences of the same Flickr30k images);
  eval: flickr8k_1k dev split, mR per language.
The frozen backbone is configs/flickr8k.py's image tower (B0 at half
width/depth, 64 px): train that config first and pass its workdir, as the
paper uses ImageNet features; without it the features are a seeded,
untrained tower's. The argument after ':' picks one of
mural.systems.mule.ABLATIONS. About 750 training images: this checks the
whole path on real photos and text, it gives no paper numbers. Measured on
2 CPU cores (docs/systems.md, "On real data: Flickr8k"): about 0.46 steps/s; the first 1000 steps
as a schedule of their own end at mean mR 8.7 (chance 4.7).
"""

from mural import systems
from mural.systems import mule

LANGUAGES = ["en", "zh", "ar", "de", "fr", "cs"]


def get_config(ablation: str = "embn_nc_lc"):
  c = systems.base_config("mule")
  c.model.image.variant = "b0"
  c.model.image.width_coefficient = 0.5
  c.model.image.depth_coefficient = 0.5
  c.model.image.hidden_dim = 1024
  c.model.image.output_dim = 256
  c.model.text.words_per_language = 8000
  c.model.text.word_dim = 300
  c.model.text.mule_dim = 256
  c.model.text.lstm_dim = 512
  c.model.text.output_dim = 256
  c.model.text.max_len = 48

  c.tasks.mm.sources = [dict(name="flickr8k", weight=1.0, languages=LANGUAGES)]
  c.tasks.mm.batch_size = 128
  c.tasks.mm.learning_rate = 3e-4
  c.tasks.nc.sources = [dict(name="multi30k", weight=1.0, kinds=["translation"],
                             languages=["en", "de", "fr", "cs"])]
  c.tasks.nc.batch_size = 128
  c.tasks.nc.learning_rate = 3e-4
  c.optim.warmup_steps = 200
  c.total_steps = 3000

  c.data.languages = LANGUAGES
  c.data.word_min_count = 2
  c.data.image_size = 64  # The size configs/flickr8k.py trains the frozen backbone at.
  c.data.eval_resize = 73
  c.data.shuffle_buffer = 20_000
  c.data.eval_source = dict(name="flickr8k", split="dev")
  c.data.eval_translations = dict(name="multi30k", split="test_2016_flickr")  # As configs/flickr8k.py.

  c.log_every_steps = 50
  c.eval_every_steps = 500
  c.checkpoint_every_steps = 500
  c.eval_batch_size = 128
  return mule.apply_ablation(c, ablation)
