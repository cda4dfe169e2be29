"""Globetrotter's claim on one machine: alignment through vision beats the text-only model.

    python benchmarks/globetrotter_claim.py --workdir=/tmp/globetrotter_claim [--steps=N] [--seed=S]

Two runs of configs/globetrotter_demo.py on the built-in data (8 languages,
no parallel text: each caption's language is its image's only one), the same
text model in both (mural/systems/defaults/globetrotter.py VARIANTS):

  full       L_t + 0.2 L_v + 0.2 L_x + 0.2 L_c (images, two SimCLR views);
  text_only  the paper's text-only baseline: L_c alone, no image.

Both are scored by translation by retrieval as the paper scores it (200
held-out scenes captioned in all M = 8 languages; each of the 1600 queries
has M - 1 = 7 translations; the share of them among its top 7 of the other
1599 sentences; chance 0.44%). The text-only model has no text head (nothing
trains one), so it is scored on the text tower's [CLS] output and on the mean
of its token outputs, and the better of the two is the baseline; the full
model on its text head (the paper's), [CLS] and mean pool too. Also printed:
the share of each query's top M - 1 in its own language (the paper's A.4:
without vision the sentences cluster by language) and word translation over
the token table (nearest neighbour, and Procrustes on mutual-nearest-neighbour
anchors; gold words found in the aligned eval captions). One wordpiece vocabulary,
learned by the first run, serves both. Prints the table and the ratio
(Globetrotter's claim here: >= 2x the text-only baseline); workdirs stay
under --workdir (--report_only prints their table again).

Measured (2 idle cores, Intel Xeon avx512f; mean over languages, %):
  seed 0 (5 min 12 s): Globetrotter 25.7, text only 0.0 ([CLS] and mean pool;
         100% of each query's top 7 in its own language); word translation
         10.5 / 10.5 (NN / Procrustes) vs 2.4 / 8.4;
  seed 1 (5 min 15 s): 11.8 vs 0.0; word translation 11.4 / 14.7 vs 5.6 / 12.0.
"""

import argparse
import json
import pathlib
import sys

import claim_runs  # benchmarks/claim_runs.py

ROOT = pathlib.Path(__file__).resolve().parents[1]
VARIANTS = ("full", "text_only")


def train(name, workdir, args, log_dir):
  return claim_runs.train("globetrotter_claim", name, workdir, args, log_dir, timed=True)


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--workdir", default="/tmp/globetrotter_claim")
  parser.add_argument("--steps", type=int, default=None, help="default: configs/globetrotter_demo.py's")
  parser.add_argument("--seed", type=int, default=0)
  parser.add_argument("--report_only", action="store_true",
                      help="print the table of the runs already in --workdir (no training)")
  args = parser.parse_args()

  workdir = pathlib.Path(args.workdir)
  workdir.mkdir(parents=True, exist_ok=True)
  results, vocab = {}, ""
  for variant in VARIANTS:
    flags = [f"--config=configs/globetrotter_demo.py:{variant}", f"--config.seed={args.seed}"]
    if args.steps:
      flags.append(f"--config.total_steps={args.steps}")
    if vocab:
      flags.append(f"--config.data.vocab_path={vocab}")
    run = workdir / f"{variant}_seed{args.seed}"
    if args.report_only:
      evals = sorted((run / "eval").glob("step_*.json"), key=lambda p: int(p.stem.split("_")[1]))
      if not evals:
        sys.exit(f"globetrotter_claim: --report_only, but {run} holds no evaluation")
      results[variant] = json.loads(evals[-1].read_text())
      continue
    results[variant], seconds = train(variant, run, flags, workdir)
    print(f"{variant}: {seconds:.0f} s", flush=True)
    vocab = vocab or str(run / "vocab.txt")

  full, text = results["full"], results["text_only"]
  langs = sorted(k.split("/")[1] for k in full if k.startswith("translation_retrieval/")
                 and k.split("/")[1] not in ("mean", "same_language"))
  rows = [("Globetrotter, text head", full, "translation_retrieval"),
          ("Globetrotter, [CLS]", full, "translation_retrieval_tower"),
          ("Globetrotter, mean pool", full, "translation_retrieval_mean_pool"),
          ("text only (L_c), [CLS]", text, "translation_retrieval_tower"),
          ("text only (L_c), mean pool", text, "translation_retrieval_mean_pool")]
  print("\nTranslation by retrieval (% of the M - 1 translations in the top M - 1; chance "
        f"{100 * (len(langs) - 1) / (200 * len(langs) - 1):.2f}; 'same' = % of the top M - 1 in the "
        "query's own language):")
  print(f"{'model':<28}" + "".join(f"{l:>6}" for l in langs) + f"{'mean':>7}{'same':>7}")
  for name, r, key in rows:
    print(f"{name:<28}" + "".join(f"{r[f'{key}/{l}']:>6.1f}" for l in langs)
          + f"{r[f'{key}/mean']:>7.1f}{r[f'{key}/same_language']:>7.1f}")
  best_text = max(text["translation_retrieval_tower/mean"], text["translation_retrieval_mean_pool/mean"])
  ratio = full["translation_retrieval/mean"] / best_text if best_text else float("inf")
  shown = f"{ratio:.1f}x" if best_text else f"{full['translation_retrieval/mean']:.1f} vs 0.0"
  print(f"\nGlobetrotter (text head) / text only (its better pooling): {shown} (claim: >= 2x)")
  for key in ("word_translation/nn", "word_translation/procrustes"):
    print(f"{key}: Globetrotter {full.get(key, float('nan')):.1f}, text only {text.get(key, float('nan')):.1f}")
  if "mean/mR" in full:
    print(f"Globetrotter image<->text retrieval, mean mR: {full['mean/mR']:.1f}")
  print(json.dumps({"seed": args.seed, "ratio": ratio,
                    **{f"{n}": r[f"{k}/mean"] for n, r, k in rows}}))


if __name__ == "__main__":
  main()
