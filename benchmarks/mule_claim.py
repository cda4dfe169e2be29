"""MULE's claim on one machine: one shared language branch beats separate branches on a scarce language.

    python benchmarks/mule_claim.py --workdir=/tmp/mule_claim [--steps=N] [--backbone_workdir=DIR]

Runs of configs/mule_demo.py on the built-in data (Swahili scarce: 300
image-caption pairs and 300 en-sw sentence pairs; 20k for every other
language), identical but for the model (mural/systems/defaults/mule.py ABLATIONS):

  parallel_embn  PARALLEL-EmbN: each language its own LSTM and FC (Gella et al.);
  embn           MULE's single shared branch, triplet loss only;
  embn_nc_lc     the shared branch with the neighbourhood constraints and the
                 adversarial language classifier (MULE without pre-training);
  full           (with --variants=...,full) embn_nc_lc warm-started from a
                 'pretrain' run (NC alone on the sentence pairs, --pretrain_steps):
                 EmbN+NC+LC+LP.

The paper (Table 2): the shared branch with NC+LC gains most on the scarce
languages (Multi30K Czech +6.3 mR over PARALLEL-EmbN, French +3.5) while the
rich ones stay within a point or two. All runs read the same frozen image
features: the image tower of a MURAL demo run (--backbone_workdir, or one
trained here first with configs/demo.py, --backbone_steps steps), as the
paper's ImageNet ResNet. One word vocabulary, learned by the first run, serves
all. Prints the per-language mR of the runs and the differences; workdirs
stay under --workdir.

Measured (2 shared CPU cores, backbone: a configs/demo.py run, 1000 steps):
  seed 0: sw  PARALLEL-EmbN 17.5, EmbN 31.7, EmbN+NC+LC 50.6, +LP 53.2;
          rich mean 78.0, 77.2, 78.3, 78.5;
  seed 1: sw  22.2, 27.7, 43.1; rich mean 78.0, 77.6, 78.5.
Parameters (describe): MULE 227,720, PARALLEL-EmbN 976,704 (8 languages).
"""

import argparse
import json
import pathlib
import shutil
import sys

import claim_runs  # benchmarks/claim_runs.py

ROOT = pathlib.Path(__file__).resolve().parents[1]
VARIANTS = ("embn_nc_lc", "embn", "parallel_embn")  # The first learns the word vocabulary.


def train(name, workdir, args, log_dir):
  return claim_runs.train("mule_claim", name, workdir, args, log_dir)


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--workdir", default="/tmp/mule_claim")
  parser.add_argument("--steps", type=int, default=None, help="default: configs/mule_demo.py's")
  parser.add_argument("--backbone_workdir", default="", help="a trained MURAL demo run (default: train one)")
  parser.add_argument("--backbone_steps", type=int, default=None, help="default: configs/demo.py's")
  parser.add_argument("--seed", type=int, default=0)
  parser.add_argument("--variants", default=",".join(VARIANTS), help=f"of {VARIANTS + ('full',)}")
  parser.add_argument("--pretrain_steps", type=int, default=None, help="LP's; default: half of --steps")
  args = parser.parse_args()

  sys.path.insert(0, str(ROOT))
  from mural import config_lib  # pylint: disable=g-import-not-at-top
  demo = config_lib.from_file(ROOT / "configs" / "mule_demo.py")
  steps = args.steps or demo.total_steps
  scarce = [l for l, n in demo.data.synthetic.pairs_per_language.items()][0]
  workdir = pathlib.Path(args.workdir)
  workdir.mkdir(parents=True, exist_ok=True)

  backbone = args.backbone_workdir
  if not backbone:
    backbone = str(workdir / "backbone")
    extra = [f"--config.total_steps={args.backbone_steps}"] if args.backbone_steps else []
    train("backbone (MURAL demo)", pathlib.Path(backbone), ["--config=configs/demo.py", *extra], workdir)

  results, words = {}, None
  variants = [v for v in args.variants.split(",") if v]
  for name in variants:
    out = workdir / name
    if words and not (out / "words.json").exists():
      out.mkdir(parents=True, exist_ok=True)
      shutil.copy(words, out / "words.json")
    common = [f"--config.model.image.backbone_workdir={backbone}", f"--config.seed={args.seed}"]
    if name == "full":  # LP: NC alone first, then the full objective from its text tower.
      pre = workdir / "pretrain"
      pre.mkdir(parents=True, exist_ok=True)
      if words and not (pre / "words.json").exists():
        shutil.copy(words, pre / "words.json")
      train("pretrain", pre, ["--config=configs/mule_demo.py:pretrain",
                              f"--config.total_steps={args.pretrain_steps or steps // 2}", *common], workdir)
      common += [f"--config.init_from={pre}", f"--config.data.word_vocab_path={pre / 'words.json'}"]
    config = "embn_nc_lc" if name == "full" else name
    results[name] = train(name, out, [f"--config=configs/mule_demo.py:{config}", f"--config.total_steps={steps}",
                                      *common], workdir)
    words = words or out / "words.json"

  languages = sorted(demo.data.languages)
  base = "parallel_embn" if "parallel_embn" in results else variants[-1]
  print(f"\nmR on held-out scenes after {steps} steps ({scarce}: 300 image-caption and 300 en-{scarce} "
        f"sentence pairs, others {demo.data.synthetic.default_pairs}); seed {args.seed}:")
  others = [v for v in variants if v != base]
  print(f"{'lang':<6}" + "".join(f"{v:>15}" for v in variants) + "".join(f"{v + '-' + base:>28}" for v in others))
  for lang in languages:
    mr = {v: results[v][f"{lang}/mR"] for v in variants}
    print(f"{lang:<6}" + "".join(f"{mr[v]:15.1f}" for v in variants)
          + "".join(f"{mr[v] - mr[base]:+28.1f}" for v in others) + ("  <- scarce" if lang == scarce else ""))
  rich = [l for l in languages if l != scarce]
  mean = lambda v: sum(results[v][f"{l}/mR"] for l in rich) / len(rich)
  print(f"{'rich':<6}" + "".join(f"{mean(v):15.1f}" for v in variants)
        + "".join(f"{mean(v) - mean(base):+28.1f}" for v in others))
  print(json.dumps({"steps": steps, "seed": args.seed, "scarce": scarce,
                    "mR": {v: {l: round(results[v][f"{l}/mR"], 2) for l in languages} for v in variants}}))


if __name__ == "__main__":
  main()
