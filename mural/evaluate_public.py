"""The field's evaluation sets on a trained run or an export, as released, one command.

  python -m mural.evaluate_public --export=DIR --set=xtd10:/data/XTD10 --images=xtd10:/data/coco2014 \\
      --set=multi30k:/data/multi30k --images=multi30k:/data/flickr30k-images --output=public.jsonl
  python -m mural.evaluate_public --workdir=RUN [--step=N] --set=...

--set=NAME:FOLDER names a set (mural.public_sets.SETS) and its release's folder; --images=NAME:DIR
the folder of its images where it scores image retrieval. --workdir exports the run's checkpoint
(the best or newest, or --step) to a temporary directory first. Prints one table per set and
split with the paper's published figures beside this model's, and appends one JSON line per
(set, split, language, metric) to --output, with CLIP_benchmark's metric names (fractions).
"""

import argparse
import json
import os
import sys
import tempfile
import time

from mural import public_sets
from mural.public_sets import parts as set_parts
from mural.public_sets import report


def _pairs(values, flag: str) -> dict:
  out = {}
  for value in values or ():
    name, sep, path = value.partition(":")
    if not sep or name not in public_sets.SETS:
      raise ValueError(f"--{flag}={value}: not NAME:PATH with NAME one of {sorted(public_sets.SETS)}")
    out[name] = path
  return out


def _model(args, tmp: str):
  """(mural.export.Model, what it is) of --export, or of --workdir's checkpoint exported to tmp."""
  from mural import export  # pylint: disable=g-import-not-at-top  (JAX and TensorFlow: after the flags)
  if args.export:
    return export.load(args.export), os.path.abspath(args.export)
  from mural import systems  # pylint: disable=g-import-not-at-top
  config = systems.recorded(args.workdir)
  path = export.export(config, args.workdir, os.path.join(tmp, "export"), args.step, saved_model=False)
  with open(os.path.join(path, "manifest.json"), encoding="utf-8") as f:
    step = json.load(f)["step"]
  return export.load(path), f"{os.path.abspath(args.workdir)}@{step}"


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(prog="python -m mural.evaluate_public", description=__doc__.split("\n")[0])
  which = parser.add_mutually_exclusive_group(required=True)
  which.add_argument("--export", help="an export directory (--mode=export)")
  which.add_argument("--workdir", help="a trained run's workdir")
  parser.add_argument("--step", type=int, default=None, help="--workdir: the checkpoint (default: best or newest)")
  parser.add_argument("--set", action="append", required=True, help="NAME:FOLDER of a set's release")
  parser.add_argument("--images", action="append", help="NAME:DIR of a set's images")
  parser.add_argument("--output", default="", help="JSON lines to append the results to")
  args = parser.parse_args(argv)
  start = time.time()
  try:
    sets, images = _pairs(args.set, "set"), _pairs(args.images, "images")
    unknown = sorted(set(images) - set(sets))
    if unknown:
      raise ValueError(f"--images for {unknown}, which no --set names")
    log = lambda line: print(line, flush=True)
    parts = {name: public_sets.SETS[name].read(folder, images.get(name), log) for name, folder in sets.items()}
    with tempfile.TemporaryDirectory() as tmp:
      model, which = _model(args, tmp)
      for name, read in parts.items():
        rows = set_parts.score(name, read, model, log)
        print(report.table(name, public_sets.SETS[name], rows), flush=True)
        if args.output:
          with open(args.output, "a", encoding="utf-8") as f:
            f.writelines(json.dumps(dict(row, model=which)) + "\n" for row in rows)
  except (ValueError, FileNotFoundError) as e:
    print(f"mural.evaluate_public: error: {e}", file=sys.stderr)
    return 1
  print(f"Done in {time.time() - start:.0f} s" + (f"; results appended to {args.output}" if args.output else ""))
  return 0


if __name__ == "__main__":
  sys.exit(main())
