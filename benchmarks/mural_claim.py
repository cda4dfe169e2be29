"""MURAL's claim on one machine: translation pairs lift a language scarce in image-caption pairs.

    python benchmarks/mural_claim.py --workdir=/tmp/mural_claim [--steps=N] [--scarce=sw]
        [--languages=en,de,sw] [--set=FIELD=VALUE ...]

Three runs of configs/demo.py on the built-in data, identical but for the
text-text task (mural/data/synthetic.py's docstring has the recipe):

  align     the scarce language has `--scarce_pairs` image-caption pairs (the
            others the default), no text-text task (tasks.t2t.weight = 0);
  mural     the same plus the en-x translation pairs of every language;
  control   mural without the en-<scarce> translation pairs only.

The scarce language shares no content word with English, so what it learns
beyond its few captions has to come through its bitext: MURAL should lift its
held-out retrieval over ALIGN, the rich languages should stay where they are,
and the control run should lose the lift. On this toy data the text-text task
lifts the rich languages too (it trains the shared text encoder), and single
runs vary by tens of mR points with when they leave the initial plateau, so
read the scarce language's gap to the rich mean within each run (last row). Prints the per-language mR of the
three runs and the differences; every run's workdir stays under --workdir
(metrics.jsonl, eval/step_<N>.json). One vocabulary, learned once from the
mural run's training text, serves all three so they see the same tokens.
"""

import argparse
import json
import pathlib
import subprocess
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]


def run(name, workdir, steps, extra, vocab):
  """Trains one variant with mural.main; returns its final eval dict."""
  out = workdir / name
  args = [sys.executable, "-m", "mural.main", "--config=configs/demo.py", f"--workdir={out}",
          f"--config.total_steps={steps}", "--config.eval_every_steps=0", *extra]
  if vocab:
    args.append(f"--config.data.vocab_path={vocab}")
  start = time.time()
  with open(workdir / f"{name}.log", "w") as log:
    rc = subprocess.run(args, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT).returncode
  if rc:
    sys.exit(f"mural_claim: run {name!r} failed (exit {rc}); see {workdir / f'{name}.log'}")
  print(f"{name}: {time.time() - start:.0f} s", flush=True)
  return json.loads((out / "eval" / f"step_{steps}.json").read_text())


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--workdir", default="/tmp/mural_claim")
  parser.add_argument("--steps", type=int, default=1200,
                      help="steps per run (the README's tables: 1200, the demo's length)")
  parser.add_argument("--scarce", default="sw", help="the language made scarce in image-caption pairs")
  parser.add_argument("--scarce_pairs", type=int, default=200)
  parser.add_argument("--pivot", default="en")
  parser.add_argument("--languages", default="",
                      help="comma-separated synthetic languages (default: the demo's 8); fewer give each "
                           "more image-caption pairs per step, so ALIGN converges sooner")
  parser.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                      help="a config override for all three runs, e.g. --set=tasks.i2t.learning_rate=5e-3")
  parser.add_argument("--seed", type=int, default=None, help="config.seed (model init and order); "
                      "default: the demo's. Runs vary a lot with it: compare several.")
  args = parser.parse_args()

  sys.path.insert(0, str(ROOT))
  from mural import config_lib  # pylint: disable=g-import-not-at-top
  demo = config_lib.from_file(ROOT / "configs" / "demo.py")
  steps = args.steps
  languages = ([l.strip() for l in args.languages.split(",")] if args.languages
               else list(demo.data.synthetic.languages))
  from mural.data import synthetic  # pylint: disable=g-import-not-at-top
  demo.data.synthetic.languages = tuple(languages)
  try:  # A bad --languages is one line here, not three failed runs.
    synthetic.Settings.from_config(demo)
  except config_lib.ConfigError as e:
    sys.exit(f"mural_claim: --languages: {e}")
  if args.scarce not in languages or args.pivot not in languages or args.scarce == args.pivot:
    sys.exit(f"mural_claim: --scarce and --pivot must be two of the languages {languages}")
  workdir = pathlib.Path(args.workdir)
  workdir.mkdir(parents=True, exist_ok=True)

  scarce = [f"--config.data.synthetic.pairs_per_language={{'{args.scarce}': {args.scarce_pairs}}}"]
  if args.seed is not None:
    scarce.append(f"--config.seed={args.seed}")
  if args.languages:
    scarce.append(f"--config.data.synthetic.languages={tuple(languages)!r}")
  scarce += [f"--config.{field_value}" for field_value in args.set]
  variants = {
      "mural": scarce,
      "align": scarce + ["--config.tasks.t2t.weight=0"],
      "control": scarce + [f"--config.data.synthetic.translation_pairs_per_pair="
                           f"{{'{args.pivot}-{args.scarce}': 0}}"],
  }
  results, vocab = {}, None
  for name, extra in variants.items():  # mural first: it learns the vocab the others reuse.
    results[name] = run(name, workdir, steps, extra, vocab)
    vocab = vocab or str(workdir / "mural" / "vocab.txt")

  order = ("align", "mural", "control")
  print(f"\nmR on held-out scenes after {steps} steps ({args.scarce}: {args.scarce_pairs} image-caption "
        f"pairs, others {demo.data.synthetic.default_pairs}{'; ' + ', '.join(args.set) if args.set else ''}):")
  print(f"{'lang':<6}" + "".join(f"{n:>9}" for n in order) + f"{'mural-align':>13}{'control-align':>15}")
  for lang in sorted(languages):
    mr = {n: results[n][f"{lang}/mR"] for n in order}
    mark = "  <- scarce" if lang == args.scarce else ""
    print(f"{lang:<6}" + "".join(f"{mr[n]:9.1f}" for n in order)
          + f"{mr['mural'] - mr['align']:+13.1f}{mr['control'] - mr['align']:+15.1f}{mark}")
  rich = [l for l in languages if l != args.scarce]
  mean = lambda n: sum(results[n][f"{l}/mR"] for l in rich) / len(rich)
  print(f"{'rich':<6}" + "".join(f"{mean(n):9.1f}" for n in order)
        + f"{mean('mural') - mean('align'):+13.1f}{mean('control') - mean('align'):+15.1f}")
  gap = lambda n: results[n][f"{args.scarce}/mR"] - mean(n)
  print(f"{'gap':<6}" + "".join(f"{gap(n):9.1f}" for n in order)
        + f"   ({args.scarce} minus the rich mean: the bitext should close it)")
  lift = lambda n: results[n][f"{args.scarce}/mR"] - results["align"][f"{args.scarce}/mR"]
  print(f"\nissue 9's targets: {args.scarce} lift over ALIGN {lift('mural'):+.1f} (>= +10: "
        f"{'met' if lift('mural') >= 10 else 'missed'}); rich languages MURAL - ALIGN "
        f"{mean('mural') - mean('align'):+.1f} (within 1: "
        f"{'met' if abs(mean('mural') - mean('align')) <= 1 else 'missed'}); the control keeps "
        f"{lift('control'):+.1f} of the lift")
  summary = {n: {l: round(results[n][f"{l}/mR"], 2) for l in languages} for n in order}
  print(json.dumps({"steps": steps, "scarce": args.scarce, "mR": summary}))


if __name__ == "__main__":
  main()
