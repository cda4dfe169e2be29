"""Examples/s of the image-text training input, end to end (NumPy batches out).

  .venv/bin/python benchmarks/bench_pipeline.py                # synthetic, 64 px, max_len 32, batch 64
  .venv/bin/python benchmarks/bench_pipeline.py --source=flickr8k --image_size=128   # real JPEG decode

Builds the pipeline exactly as training does (build_train_iterator; text-text
task off unless --t2t), pulls --warmup batches, then --repeats timed runs of
--batches batches each, and prints the median examples/s (and every run).
"""

import argparse
import os
import statistics
import sys
import tempfile
import time

from mural import data  # pylint: disable=g-import-not-at-top

data.set_tensorflow_env_defaults()  # As mural's commands run TensorFlow: before it loads.

import tensorflow as tf  # pylint: disable=g-import-not-at-top

from mural import system  # pylint: disable=g-import-not-at-top
from mural import systems  # pylint: disable=g-import-not-at-top
from mural.data import pipeline  # pylint: disable=g-import-not-at-top
from mural.data import synthetic  # pylint: disable=g-import-not-at-top
from mural.data import tokenizer as tokenizer_lib  # pylint: disable=g-import-not-at-top


def _vocab(config, path: str) -> None:
  """A small wordpiece vocab from synthetic translation-pair text (all languages)."""
  settings = synthetic.Settings.from_config(config)
  texts = []
  for column in synthetic.text_pair_batch(settings, "train", range(2000))[:2]:
    texts += [t.decode() for t in column]
  tokenizer_lib.build_vocab(texts, 2000, path)


def main(argv=None) -> None:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--source", default="synthetic", choices=["synthetic", "flickr8k"])
  p.add_argument("--image_size", type=int, default=64)
  p.add_argument("--max_len", type=int, default=32)
  p.add_argument("--batch_size", type=int, default=64)
  p.add_argument("--batches", type=int, default=30, help="batches per timed run")
  p.add_argument("--repeats", type=int, default=5)
  p.add_argument("--warmup", type=int, default=5)
  p.add_argument("--t2t", action="store_true", help="also produce the text-text batch each step")
  p.add_argument("--num_parallel_calls", type=int, default=-1)
  args = p.parse_args(argv)

  c = systems.base_config("mural")
  c.tasks.i2t.batch_size = c.tasks.t2t.batch_size = args.batch_size
  c.model.text.max_len = args.max_len
  c.data.image_size = args.image_size
  c.data.eval_resize = int(round(args.image_size * 346 / 289))
  c.data.synthetic.render_size = args.image_size
  c.data.num_parallel_calls = args.num_parallel_calls
  c.tasks.i2t.sources = [dict(name=args.source, weight=1.0)]
  if not args.t2t:
    c.tasks.t2t.sources = []
  systems.validate(c)
  data.set_tensorflow_intra_op_threads(c.data.tf_intra_op_threads)  # As mural.main does.

  with tempfile.TemporaryDirectory() as tmp:
    vocab = os.path.join(tmp, "vocab.txt")
    _vocab(c, vocab)
    tok = tokenizer_lib.Tokenizer(vocab, args.max_len)
    t0 = time.perf_counter()
    tasks = system.active_tasks(systems.get(c), c)
    it = pipeline.build_train_iterator(c, tasks, tok, process_index=0, process_count=1, seed=0)
    for _ in range(args.warmup):
      next(it)
    print(f"build + {args.warmup} warm-up batches: {time.perf_counter() - t0:.1f} s")
    rates = []
    for _ in range(args.repeats):
      t0 = time.perf_counter()
      for _ in range(args.batches):
        next(it)
      rates.append(args.batches * args.batch_size / (time.perf_counter() - t0))
  shapes = {task: {k: v.shape for k, v in b.items()} for task, b in next(it).items()}
  print(f"source={args.source} image={args.image_size}px max_len={args.max_len} batch={args.batch_size} "
        f"t2t={args.t2t} cpus={os.cpu_count()} tf={tf.__version__}")
  print(f"batch shapes: {shapes}")
  print(f"runs (examples/s): {', '.join(f'{r:.0f}' for r in rates)}")
  print(f"median examples/s: {statistics.median(rates):.0f}")
  print(f"skip counts: {it.skip_counts()}")


if __name__ == "__main__":
  main(sys.argv[1:])
