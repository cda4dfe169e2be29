"""A trained workdir through the user's path: export -> embed the held-out scenes -> index -> search.

  .venv/bin/python benchmarks/export_roundtrip.py --config=configs/demo.py --workdir=/tmp/mural_demo
  .venv/bin/python benchmarks/export_roundtrip.py --config=configs/mule_demo.py --workdir=DIR

Exports the newest checkpoint (python -m mural.main --mode=export, as a
user would), writes the built-in held-out scenes as PNG files and their
captions as a TSV, embeds both with python -m mural.embed, builds a flat and
an HNSW index with python -m mural.index, and computes image<->text R@1/5/10
per language from index searches alone. Prints them beside the evaluator's
numbers for that step (workdir/eval/step_<N>.json) and the time of each stage.
An export whose texts need their language (MULE, SMALR: a word vocabulary per
language) embeds each language's captions with --lang into its own directory
and index (image->text ranks are within a language either way).
"""

import argparse
import json
import os
import pathlib
import subprocess
import sys
import tempfile
import time

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _run(*args) -> float:
  start = time.perf_counter()
  subprocess.run([sys.executable, "-m", *args], check=True, cwd=ROOT,
                 env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}, stdout=subprocess.DEVNULL)
  return time.perf_counter() - start


def recalls(text_sets, image_index, image_ids, images):
  """{'<lang>/<i2t|t2i>_R@k'} from searches: captions 'lang/<scene>', images '.../scene_<n>.png';
  text_sets[lang] = (the index that holds lang's captions, its ids, its vectors)."""
  scene_of_image = [int(pathlib.Path(i).stem.split("_")[1]) for i in image_ids]
  out = {}
  for lang, (text_index, text_ids, texts) in text_sets.items():
    rows = [r for r, i in enumerate(text_ids) if i.startswith(lang + "/")]
    scene = {text_ids[r]: int(text_ids[r].split("/")[1]) for r in rows}
    _, hits = image_index.search(texts[rows], len(image_ids))
    t2i = [[int(pathlib.Path(h).stem.split("_")[1]) for h in row].index(scene[text_ids[r]])
           for r, row in zip(rows, hits)]
    _, hits = text_index.search(images, len(text_ids))
    i2t = [[h for h in row if h in scene].index(next(h for h in row if scene.get(h) == n))
           for n, row in zip(scene_of_image, hits)]
    for k in (1, 5, 10):
      out[f"{lang}/i2t_R@{k}"] = 100.0 * float(np.mean(np.array(i2t) < k))
      out[f"{lang}/t2i_R@{k}"] = 100.0 * float(np.mean(np.array(t2i) < k))
  return out


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--config", required=True)
  p.add_argument("--workdir", required=True)
  p.add_argument("--out", default=None, help="Scratch directory (default: a new temporary one).")
  args = p.parse_args(argv)
  from mural import config_lib, embed, index  # pylint: disable=g-import-not-at-top
  from mural.data import synthetic  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  out = pathlib.Path(args.out or tempfile.mkdtemp(prefix="mural_roundtrip_"))
  config = config_lib.from_file(args.config)
  times = {"export": _run("mural.main", f"--config={args.config}", f"--workdir={args.workdir}",
                          "--mode=export", f"--export_dir={out / 'export'}")}
  manifest = json.loads((out / "export" / "manifest.json").read_text())
  scenes = synthetic.build_eval_data(config)
  (out / "images").mkdir(exist_ok=True)
  for n, im in enumerate(scenes.images):
    (out / "images" / f"scene_{n:04d}.png").write_bytes(tf.io.encode_png(im).numpy())
  langs = [l for l in scenes.languages if l in config.data.languages]
  tsv = lambda ls: "".join(f"{l}/{k}\t{c}\n" for l in ls for k, c in enumerate(scenes.languages[l].captions))
  embed_args = [f"--export={out / 'export'}", "--dtype=float32"]
  times["embed images"] = _run("mural.embed", *embed_args, f"--images={out / 'images' / '*.png'}",
                               f"--output={out / 'emb'}")
  # One text directory for every language, or one per language with its --lang.
  groups = {l: [l] for l in langs} if manifest["text"].get("needs_language") else {"all": langs}
  for name, group in groups.items():
    (out / f"texts_{name}.tsv").write_text(tsv(group))
    lang_arg = [f"--lang={name}"] if name != "all" else []
    times[f"embed texts {name}"] = _run("mural.embed", *embed_args, *lang_arg,
                                        f"--texts={out / f'texts_{name}.tsv'}", f"--output={out / f'emb_{name}'}")
  found = {}
  for kind in ("flat", "hnsw"):
    dirs = {"images": out / "emb", **{f"texts_{n}": out / f"emb_{n}" for n in groups}}
    for what, directory in dirs.items():
      times[f"index {kind} {what}"] = _run("mural.index", f"--embeddings={directory}",
                                           f"--kind={what.split('_')[0]}", f"--index={out / f'{what}_{kind}'}",
                                           f"--type={kind}")
    images, image_ids = embed.load_embeddings(str(out / "emb" / "images"))
    text_sets = {}
    for name, group in groups.items():
      vectors, ids = embed.load_embeddings(str(out / f"emb_{name}" / "texts"))
      for l in group:
        text_sets[l] = (index.Index(str(out / f"texts_{name}_{kind}")), ids, vectors)
    start = time.perf_counter()
    found[kind] = recalls(text_sets, index.Index(str(out / f"images_{kind}")), image_ids, images)
    times[f"search {kind}"] = time.perf_counter() - start
  want = json.loads((pathlib.Path(args.workdir) / "eval" / f"step_{manifest['step']}.json").read_text())
  print(f"step {manifest['step']}, {len(scenes.images)} held-out scenes, "
        f"{sum(len(scenes.languages[l].captions) for l in langs)} captions, "
        f"embedding size {manifest['embed_dim']}")
  print(f"{'metric':<14}{'evaluator':>10}{'flat':>8}{'hnsw':>8}")
  worst = {"flat": 0.0, "hnsw": 0.0}
  for key in sorted(found["flat"]):
    print(f"{key:<14}{want[key]:>10.2f}{found['flat'][key]:>8.2f}{found['hnsw'][key]:>8.2f}")
    for kind in worst:
      worst[kind] = max(worst[kind], abs(found[kind][key] - want[key]))
  print(f"largest difference from the evaluator: flat {worst['flat']:.2f}, hnsw {worst['hnsw']:.2f} points")
  print("seconds: " + ", ".join(f"{k} {v:.1f}" for k, v in times.items()))


if __name__ == "__main__":
  main()
