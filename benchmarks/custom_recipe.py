"""The README's "Train on your own data" recipe, run as written, with Flickr8k and Multi30k as the user's files.

    python benchmarks/custom_recipe.py --work=/tmp/recipe [--record]

Writes the files a user brings, from the releases' folders ($MURAL_FLICKR8K_DIR,
$MURAL_MULTI30K_DIR; docs/data.md): train.tsv (image path, caption, lang: every
caption of Flickr8k's train split), heldout.tsv (the dev split) and my_pairs.tsv
(left, right, left_lang, right_lang: Multi30k task 1's train translations, en
with each of de, fr, cs). Then runs the recipe's commands (README.md, docs/data.md),
each in a fresh process in --work, and prints each one's wall time, the largest
peak memory of them, and the evaluation's table; --record appends them to results.jsonl.
"""

import argparse
import csv
import json
import os
import pathlib
import resource
import shlex
import subprocess
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
# The recipe, as the README gives it, with the folders in --work.
STEPS = (
    ("convert train", "python -m mural.data.convert --input=train.tsv --output_dir={data} --num_shards=8 --prefix=train"),
    ("convert heldout", "python -m mural.data.convert --input=heldout.tsv --output_dir={data} --num_shards=1 --prefix=heldout"),
    ("pairs", "cp my_pairs.tsv {data}/pairs.tsv"),
    ("train", "python -m mural.main --config={root}/configs/custom.py:{data} --workdir={run}"),
    ("eval", "python -m mural.main --workdir={run} --mode=eval"),
    ("export", "python -m mural.main --workdir={run} --mode=export"),
)


def write_user_files(work: pathlib.Path) -> dict:
  """train.tsv, heldout.tsv and my_pairs.tsv in `work`; their row counts."""
  sys.path.insert(0, str(ROOT))
  from mural.data import flickr8k  # pylint: disable=g-import-not-at-top  (after the path)
  from mural.data import multi30k  # pylint: disable=g-import-not-at-top
  rows = flickr8k.read_captions()
  photos = flickr8k.photo_dir(flickr8k.data_dir())
  counts = {}
  for name, split in (("train.tsv", "train"), ("heldout.tsv", "dev")):
    chosen = flickr8k.select(rows, split)
    with open(work / name, "w", encoding="utf-8", newline="") as f:
      out = csv.writer(f, delimiter="\t", lineterminator="\n")
      out.writerow(["image_path", "caption", "lang"])
      out.writerows([os.path.join(photos, r.image), r.caption, r.lang] for r in chosen)
    counts[name] = len(chosen)
  task1 = multi30k.task1("train", ("en", "de", "fr", "cs"))
  with open(work / "my_pairs.tsv", "w", encoding="utf-8", newline="") as f:
    out = csv.writer(f, delimiter="\t", lineterminator="\n")
    out.writerow(["left", "right", "left_lang", "right_lang"])
    n = 0
    for other in ("de", "fr", "cs"):
      for en, text in zip(task1.captions["en"], task1.captions[other]):
        out.writerow([en.strip(), text.strip(), "en", other])
        n += 1
  counts["my_pairs.tsv"] = n
  return counts


def run(command: str, cwd: pathlib.Path, log: pathlib.Path):
  """(seconds, exit code); the command's output goes to `log`."""
  argv = shlex.split(command)
  if argv[0] == "python":
    argv[0] = sys.executable
  start = time.perf_counter()
  with open(log, "w") as out:
    code = subprocess.run(argv, cwd=cwd, stdout=out, stderr=subprocess.STDOUT).returncode
  return time.perf_counter() - start, code


def main():
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--work", default="/tmp/mural_recipe", help="a new folder for the files, data and run")
  p.add_argument("--record", action="store_true", help="append the figures to benchmarks/results.jsonl")
  args = p.parse_args()
  work = pathlib.Path(args.work)
  work.mkdir(parents=True, exist_ok=False)
  counts = write_user_files(work)
  print("user's files:", ", ".join(f"{k} {v} rows" for k, v in counts.items()))
  folders = dict(data=work / "mine", run=work / "run", root=ROOT)
  figures = {}
  for name, template in STEPS:
    command = template.format(**folders)
    seconds, code = run(command, work, work / f"{name.replace(' ', '_')}.log")
    print(f"{name:>16}: {seconds:7.1f} s, exit {code}   {command}")
    if code != 0:
      sys.exit(f"{name} failed (exit {code}); its output is in {work}")
    figures[f"{name} s"] = round(seconds, 1)
  table = (work / "eval.log").read_text().split("Evaluation at step")[-1]
  print("Evaluation at step" + table)
  results = sorted((folders["run"] / "eval").glob("step_*.json"), key=lambda f: int(f.stem[5:]))
  final = json.loads(results[-1].read_text())
  figures["mean mR"] = round(final["mean/mR"], 1)
  figures["peak RSS GiB (largest step)"] = round(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 2**20, 2)
  pairs = [v for k, v in final.items() if k.endswith("/acc") and k.startswith("pairs:")]
  if pairs:
    figures["translation acc (mean over pairs)"] = round(sum(pairs) / len(pairs), 1)
  print(figures)
  if args.record:
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from results import record  # pylint: disable=g-import-not-at-top  (benchmarks/results.py)
    record("custom_recipe", figures, config=f"{counts['train.tsv']} train captions, "
           f"{counts['heldout.tsv']} held-out, {counts['my_pairs.tsv']} pairs")


if __name__ == "__main__":
  main()
