"""MULE on real data: Flickr8k photos with captions in six languages, Multi30k sentence pairs for NC.

    python -m mural.main --config=configs/mule_flickr8k.py --workdir=/tmp/mule_flickr8k \
        --config.model.image.backbone_workdir=/tmp/mural_flickr8k

  mm: Flickr8k's train split (en, zh, ar, de, fr, cs), image-sentence triplet + LC;
  nc: Multi30k task 1 translations between en, de, fr, cs (Multi30K is the
      paper's own dataset: these are sentences of the same Flickr30k images);
  eval: Flickr8k's dev split, mR per language.
The frozen backbone is configs/flickr8k.py's image tower (B0 at half
width/depth, 64 px): train that config first and pass its workdir, as the
paper uses ImageNet features; without it the features are a seeded,
untrained tower's. The argument after ':' picks one of
mural.systems.mule.ABLATIONS. About 750 training images: this checks the
whole path on real photos and text, it gives no paper numbers. Measured on
2 CPU cores (docs/systems.md, "On real data: Flickr8k"): about 0.46 steps/s; the first 1000 steps
as a schedule of their own end at mean mR 8.7 (chance 4.7).
"""

from mural import config_lib
from mural import systems
from mural.systems.defaults import mule


def get_config(ablation: str = "embn_nc_lc"):
  c = systems.base_config("mule")
  flickr8k = config_lib.sibling(__file__, "flickr8k.py")  # Its frozen tower's run; the same data.
  config_lib.backbone_from(c, flickr8k)
  c.model.image.hidden_dim = 1024
  c.model.image.output_dim = 256
  c.model.text.words_per_language = 8000
  c.model.text.word_dim = 300
  c.model.text.mule_dim = 256
  c.model.text.lstm_dim = 512
  c.model.text.output_dim = 256
  c.model.text.max_len = 48

  c.tasks.mm.sources = flickr8k.tasks.i2t.sources
  c.tasks.mm.batch_size = 128
  c.tasks.mm.learning_rate = 3e-4
  c.tasks.nc.sources = flickr8k.tasks.t2t.sources
  c.tasks.nc.batch_size = 128
  c.tasks.nc.learning_rate = 3e-4
  c.optim.warmup_steps = 200
  c.total_steps = 3000

  c.data.word_min_count = 2
  for field in ("languages", "shuffle_buffer", "eval_source", "eval_translations"):
    c.data[field] = flickr8k.data[field]

  c.log_every_steps = 50
  c.eval_every_steps = 500
  c.checkpoint_every_steps = 500
  c.eval_batch_size = 128
  return mule.apply_ablation(c, ablation)
