"""Where Kádár et al.'s demo models start: the max-of-hinges plateau, measured.

    python benchmarks/kadar_collapse.py --workdir=/tmp/kadar_collapse --backbone_workdir=<a configs/demo.py workdir>

Trains benchmarks/kadar_claim.py's multi-c2c model (c2i on en, de, fr, cs; no
c2c) for --steps steps, checkpointing every --every, and prints for one
training batch, at the start and at each checkpoint: the mean cosine between
different captions, between different images, between captions and images,
and the mean over captions of (score of its image - score of its hardest
negative image). Every score equal (the captions' embeddings collapsed to one
direction) puts the max of hinges at 2 x margin = 0.4. Extra `key=value`
arguments override config fields (e.g. optim.warmup_steps=300).
"""

import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import kadar_claim  # noqa: E402


def main():
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--workdir", required=True)
  p.add_argument("--backbone_workdir", required=True)
  p.add_argument("--steps", type=int, default=200)
  p.add_argument("--every", type=int, default=40)
  p.add_argument("--seed", type=int, default=0)
  p.add_argument("overrides", nargs="*", help="config field=python value")
  args = p.parse_args()
  import jax  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  from mural import checkpointing, system, systems, train  # pylint: disable=g-import-not-at-top
  from mural.data import pipeline, training_text, vocab, word_vocab  # pylint: disable=g-import-not-at-top
  training_text.RECORDS_PER_SOURCE = 2000
  claim_args = argparse.Namespace(seed=args.seed, backbone_workdir=args.backbone_workdir, rich=1000, scarce=200,
                                  rich_pairs=1000, steps=args.steps, eval_every=args.steps, patience=1)
  os.makedirs(args.workdir, exist_ok=True)
  vocab_config = kadar_claim.model_config(claim_args, *kadar_claim.MODELS["multi"])  # All four languages' words.
  words = word_vocab.learn(vocab_config, system.vocabulary_tasks(systems.get(vocab_config), vocab_config), args.workdir)
  c = kadar_claim.model_config(claim_args, *kadar_claim.MODELS["multi-c2c"])
  c.data.word_vocab_path = words
  c.checkpoint_every_steps = args.every
  c.log_every_steps = args.every
  c.keep_checkpoints = args.steps // args.every + 1
  for kv in args.overrides:
    key, value = kv.split("=", 1)
    node = c
    *parents, leaf = key.split(".")
    for name in parents:
      node = node[name]
    node[leaf] = eval(value)  # pylint: disable=eval-used
  systems.validate(c)
  workdir = os.path.join(args.workdir, "run")
  train.train_and_evaluate(c, workdir)

  setup = train.build(c)
  tok = vocab.tokenizer(c, setup.tasks, workdir)
  it = pipeline.build_train_iterator(c, setup.tasks, tok)
  batch = next(it)["c2i"]
  it.close()
  unit = lambda x: x / np.linalg.norm(x, axis=-1, keepdims=True)
  off = lambda s: (s.sum() - np.trace(s)) / (s.shape[0] * (s.shape[0] - 1))
  steps = sorted(int(s) for s in os.listdir(os.path.join(workdir, "checkpoints")) if s.isdigit())
  print("step  caption-caption  image-image  caption-image  positive - hardest negative")
  for step in [0] + steps:
    if step == 0:
      state = setup.init(jax.random.PRNGKey(c.seed))
      variables = {"params": state.params, "batch_stats": state.batch_stats}
    else:
      _, v = checkpointing.read_params(workdir, step)
      variables = {"params": v["params"], "batch_stats": v.get("batch_stats", {})}
    t = unit(np.asarray(setup.model.apply(variables, batch["text_ids"], batch["text_mask"], None,
                                          method="embed_texts")))
    i = unit(np.asarray(setup.model.apply(variables, batch["image"], None, method="embed_images")))
    s = t @ i.T
    gap = np.mean(s.diagonal() - np.max(s - 9 * np.eye(len(s)), 1))
    print(f"{step:>4}  {off(t @ t.T):>15.3f}  {off(i @ i.T):>11.3f}  {s.mean():>13.3f}  {gap:>26.3f}", flush=True)


if __name__ == "__main__":
  main()
