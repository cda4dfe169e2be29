"""Your data: MURAL on the folder the converter wrote, evaluated on your held-out data.

    python -m mural.data.convert --input=train.tsv --output_dir=/data/mine --num_shards=8 --prefix=train
    python -m mural.data.convert --input=heldout.tsv --output_dir=/data/mine --num_shards=1 --prefix=heldout  # optional
    cp my_pairs.tsv /data/mine/pairs.tsv                  # optional: left, right, left_lang, right_lang
    python -m mural.main --config=configs/custom.py:/data/mine --workdir=/tmp/mine

The folder (the argument after ':') holds what this config reads:
  train-*.tfrecord, train.stats.json   the converter's output; data.languages are the languages
                                       its stats counted (any with records), most first
  heldout-*.tfrecord                   optional: the eval set (image<->text retrieval per
                                       language); without it 5% of train's images are held out
                                       of training for it (the source's `holdout`: split by
                                       image, the same split on every resume)
  pairs.tsv (or pairs-*.tsv)           optional: translation pairs for the text-text task; without
                                       them the run is ALIGN (image-text only)
  heldout_pairs.tsv                    optional: held-out pairs for translation retrieval; without
                                       it 5% of pairs.tsv is held out
Everything else is configs/flickr8k.py's recipe, measured on real photos on 2 CPU cores
(docs/systems.md, "On real data: Flickr8k"): 64 px, a B0 tower at half width and depth, a
4-layer BERT of width 256 with an 8000-wordpiece vocabulary learned from your text, batch 64 per
task, 1500 steps. That schedule is for about a thousand photos; with more data, train longer
(--config.total_steps: an epoch of the image-text task is records / 64 steps) and at a larger
image size (--config.data.image_size=128 --config.data.eval_resize=146). On a GPU box or a pod,
raise the batches (--config.tasks.i2t.batch_size, --config.tasks.t2t.batch_size) and check the
memory first with --mode=plan (docs/scale.md).
"""

import json
import pathlib

from mural import config_lib

HOLDOUT = 0.05  # The fraction held out for evaluation when the folder has no held-out file.


def _languages(folder: pathlib.Path):
  stats = folder / "train.stats.json"
  if not stats.exists():
    raise config_lib.ConfigError(f"configs/custom.py: {stats} does not exist: convert your training "
                                 "TSV into the folder with --prefix=train (python -m mural.data.convert)")
  per_lang = json.loads(stats.read_text()).get("per_lang", {})
  languages = tuple(lang for lang, n in sorted(per_lang.items(), key=lambda kv: (-kv[1], kv[0])) if n)
  if not languages:
    raise config_lib.ConfigError(f"configs/custom.py: {stats} counts no written record")
  return languages


def _first(folder: pathlib.Path, *patterns: str) -> str:
  """The first of the glob patterns that matches a file in the folder, as a path glob ('' if none)."""
  return next((str(folder / p) for p in patterns if any(folder.glob(p))), "")


def get_config(folder: str = ""):
  if not folder:
    raise config_lib.ConfigError("your data folder goes after ':', e.g. --config=configs/custom.py:/data/mine "
                                 "(configs/custom.py's docstring says what it holds)")
  folder = pathlib.Path(folder).expanduser().resolve()
  c = config_lib.from_file(pathlib.Path(__file__).with_name("flickr8k.py"))
  c.data.languages = _languages(folder)

  train = dict(name="tfrecord", files=str(folder / "train-*.tfrecord"))
  heldout = _first(folder, "heldout-*.tfrecord")
  if not heldout:
    train["holdout"] = HOLDOUT
  c.tasks.i2t.sources = [train]
  c.data.eval_source = dict(name="records", source=dict(name="tfrecord", files=heldout) if heldout else train)

  pairs = _first(folder, "pairs.tsv", "pairs-*.tsv")
  heldout_pairs = _first(folder, "heldout_pairs.tsv")
  if pairs:
    pair_source = dict(name="pairs_tsv", files=pairs)
    if not heldout_pairs:
      pair_source["holdout"] = HOLDOUT
    c.tasks.t2t.sources = [pair_source]
    c.data.eval_translations = dict(name="records", source=(
        dict(name="pairs_tsv", files=heldout_pairs) if heldout_pairs else pair_source))
  else:  # ALIGN: the image-text task alone.
    c.tasks.t2t.sources = []
    c.tasks.t2t.weight = 0.0
    c.data.eval_translations = dict(name="")
  c.data.shuffle_buffer = 20_000
  return c
