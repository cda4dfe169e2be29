"""The public-checkpoint recipe's cost: importing, the first LiT steps, the export; time and memory.

    python benchmarks/import_cost.py --work=/tmp/import_cost [--steps=6] [--record]

Writes checkpoints of public shapes with random weights where the recipe takes real ones (none
can be downloaded here): a Hugging Face bert-base-multilingual-cased (119,547 wordpieces, 12
layers of 768: 178M values), a BERT-Large (30,522 x 1024, 24 layers: 335M) and a
keras.applications EfficientNetB0 file, each by a child process (this one imports no framework:
a child's peak RSS, from wait4, starts at its parent's RSS when it forks), kept in --work for a
rerun. Then runs, each as its own process (wall time and its peak RSS):
  import       mBERT + B0 into one directory (python -m mural.import_weights)
  import large BERT-Large alone: the peak against the checkpoint's size
  import L2    EfficientNet-L2 (480M values) from a checkpoint in the TF reference's layout (the
               noisy-student L2's): the peak against the checkpoint's size
  train        configs/lit.py on a converted TSV of 64 random photos (128 px, batch 8), --steps steps;
               the steady step time from metrics.jsonl
  export       --mode=export of the run
--record appends the figures to benchmarks/results.jsonl.
"""

import argparse
import json
import os
import pathlib
import shutil
import subprocess
import sys

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "benchmarks"))
import process_cost  # pylint: disable=g-import-not-at-top,wrong-import-position

MBERT = dict(vocab_size=119_547, hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
             intermediate_size=3072, max_position_embeddings=512)
BERT_LARGE = dict(vocab_size=30_522, hidden_size=1024, num_hidden_layers=24, num_attention_heads=16,
                  intermediate_size=4096, max_position_embeddings=512)


def _child(code: str, *args) -> None:
  """Runs `code` in a fresh Python with the tests' fixtures importable."""
  subprocess.run([sys.executable, "-c", code, *map(str, args)], check=True, capture_output=True,
                 env=dict(os.environ, PYTHONPATH=str(ROOT / "tests")))


def _write_bert(root: pathlib.Path, shape: dict) -> int:
  """A Hugging Face BERT directory of `shape` with random weights; its checkpoint's size."""
  if not (root / "model.safetensors").exists():
    _child("import json, pathlib, sys, pretrained_fixtures\n"
           "shape = json.loads(sys.argv[2])\n"
           "n = shape.pop('vocab_size')\n"
           "specials = ['[PAD]'] + [f'[unused{i}]' for i in range(1, 100)] + ['[UNK]', '[CLS]', '[SEP]', '[MASK]']\n"
           "vocab = (specials + [f'w{i}' for i in range(n)])[:n]\n"
           "pretrained_fixtures.write_hf_bert(pathlib.Path(sys.argv[1]), vocab, False, **shape)\n",
           root, json.dumps(shape))
  return (root / "model.safetensors").stat().st_size


def _write_b0(path: pathlib.Path) -> None:
  if not path.exists():
    _child("import sys, keras, pretrained_fixtures\n"
           "m = keras.applications.EfficientNetB0(weights=None, include_top=False, input_shape=(224, 224, 3))\n"
           "pretrained_fixtures.randomize_keras(m)\n"
           "pretrained_fixtures.write_keras_h5(m, sys.argv[1])\n", path)


def _write_l2(root: pathlib.Path) -> int:
  """EfficientNet-L2 with random weights, as the TF reference's checkpoint names it (a Keras
  EfficientNet at L2's coefficients, written in that layout); the checkpoint's size in bytes.
  In a child process, so its memory is not this one's."""
  if not (root / "model.ckpt.index").exists():
    root.mkdir(parents=True, exist_ok=True)
    _child("import sys, keras, pretrained_fixtures\n"
           "from keras.src.applications import efficientnet\n"
           "m = efficientnet.EfficientNet(4.3, 5.3, 800, 0.5, name='l2', include_top=False, weights=None,"
           " input_shape=(64, 64, 3))\n"
           "pretrained_fixtures.write_tf_reference_efficientnet(m, sys.argv[1], 'l2')\n", root / "model.ckpt")
  return sum(f.stat().st_size for f in root.glob("model.ckpt*"))


def _user_folder(work: pathlib.Path, photos: int = 64) -> pathlib.Path:
  from PIL import Image  # pylint: disable=g-import-not-at-top
  rng = np.random.default_rng(0)
  rows = []
  (work / "photos").mkdir(exist_ok=True)
  for n in range(photos):
    path = work / "photos" / f"{n}.jpg"
    Image.fromarray(rng.integers(0, 255, (160, 200, 3), np.uint8)).save(path)
    rows += [f"{path}\tA photo number {n} of a thing\ten", f"{path}\tEin Foto Nummer {n}\tde"]
  (work / "train.tsv").write_text("\n".join(rows) + "\n")
  folder = work / "mine"
  subprocess.run([sys.executable, "-m", "mural.data.convert", f"--input={work / 'train.tsv'}",
                  f"--output_dir={folder}", "--num_shards=1", "--prefix=train", "--overwrite"],
                 cwd=ROOT, check=True, capture_output=True)
  (folder / "pairs.tsv").write_text("".join(f"A photo {n}\tEin Foto {n}\ten\tde\n" for n in range(photos)))
  return folder


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--work", default="/tmp/import_cost")
  parser.add_argument("--steps", type=int, default=6)
  parser.add_argument("--record", action="store_true")
  args = parser.parse_args()
  work = pathlib.Path(args.work)
  work.mkdir(parents=True, exist_ok=True)
  python = sys.executable
  mbert_bytes = _write_bert(work / "mbert", MBERT)
  large_bytes = _write_bert(work / "bert_large", BERT_LARGE)
  _write_b0(work / "b0.h5")
  l2_bytes = _write_l2(work / "l2")
  folder = _user_folder(work)
  imported, run = work / "imported", work / "run"
  figures = {"mBERT checkpoint MB": round(mbert_bytes / 1e6), "BERT-Large checkpoint MB": round(large_bytes / 1e6)}
  step = process_cost.run("import", [python, "-m", "mural.import_weights", f"--text=hf_bert:{work / 'mbert'}",
                         f"--image=keras_efficientnet:{work / 'b0.h5'}", f"--out={imported}"], ROOT)
  figures.update({"import mBERT+B0 s": step["wall s"], "import mBERT+B0 peak RSS MiB": step["peak RSS MiB"]})
  step = process_cost.run("import large", [python, "-m", "mural.import_weights", f"--text=hf_bert:{work / 'bert_large'}",
                               f"--out={work / 'imported_large'}"], ROOT)
  figures.update({"import BERT-Large s": step["wall s"], "import BERT-Large peak RSS MiB": step["peak RSS MiB"],
                  "import BERT-Large peak / checkpoint": round(step["peak RSS MiB"] * 2**20 / large_bytes, 2)})
  step = process_cost.run("import L2", [python, "-m", "mural.import_weights", f"--image=tf_efficientnet:{work / 'l2'}",
                            f"--out={work / 'imported_l2'}"], ROOT)
  figures.update({"L2 checkpoint MB": round(l2_bytes / 1e6), "import L2 s": step["wall s"],
                  "import L2 peak RSS MiB": step["peak RSS MiB"],
                  "import L2 peak / checkpoint": round(step["peak RSS MiB"] * 2**20 / l2_bytes, 2)})
  config = f"--config={ROOT / 'configs' / 'lit.py'}:{folder},{imported}"
  sizes = ["--config.data.image_size=128", "--config.data.eval_resize=146", "--config.tasks.i2t.batch_size=8",
           "--config.tasks.t2t.batch_size=8", f"--config.total_steps={args.steps}", "--config.optim.warmup_steps=2",
           "--config.log_every_steps=1", f"--config.eval_every_steps={args.steps}", "--config.data.shuffle_buffer=128"]
  shutil.rmtree(run, ignore_errors=True)
  step = process_cost.run("train", [python, "-m", "mural.main", config, f"--workdir={run}", *sizes], ROOT)
  lines = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
  steady = [line["step_time_sec"] for line in lines if "step_time_sec" in line][-1]
  figures.update({f"train {args.steps} steps s": step["wall s"], "train peak RSS MiB": step["peak RSS MiB"],
                  "LiT step s (batch 8+8, 128 px)": round(steady, 2)})
  step = process_cost.run("export", [python, "-m", "mural.main", f"--workdir={run}", "--mode=export"], ROOT)
  figures.update({"export s": step["wall s"], "export peak RSS MiB": step["peak RSS MiB"]})
  print(json.dumps(figures, indent=1))
  if args.record:
    import results  # pylint: disable=g-import-not-at-top
    results.record("import_cost", figures, config="mBERT-base + EfficientNetB0 (random weights), LiT")


if __name__ == "__main__":
  main()
