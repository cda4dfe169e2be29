"""Export for retrieval (issue 12), on one short training shared by every test here.

The trained model's own embeddings (the evaluator's Embedder on the trained
state) are the reference: mural.export.load, the SavedModel in a process that
cannot import mural or JAX, and embed -> index -> search must reproduce them
(and the evaluator's recalls); a warm-started run's first loss must be the
trained model's loss on that batch.
"""

import json
import logging
import os
import pathlib
import re
import subprocess
import sys
import types

import jax
import numpy as np
import pytest

from conftest import ROOT, TINY_FEATURES, HookedIterator, sigterm, tiny_config, xla_flags
from mural import config_lib
from mural import disk_space
from mural import embed
from mural import export
from mural import index as index_lib
from mural import search
from mural import svcca
from mural import system as system_lib
from mural import train
from mural import warm_start
from mural.data import vocab

# 100 cheap steps at rates of 1e-2 and the demo's temperature; batch-norm statistics that follow the
# training within them (momentum 0.9), so eval-mode images no longer embed alike.
OVERRIDES = dict(total_steps=100, eval_every_steps=0, checkpoint_every_steps=100, log_every_steps=50,
                 optim__warmup_steps=10, model__init_temperature=0.05, tasks__i2t__learning_rate=1e-2,
                 tasks__t2t__learning_rate=1e-2, model__image__bn_momentum=0.9)
TEXTS = ["a red circle", "ein roter Kreis", "красный круг", "लाल वृत्त", "ቀይ ክብ", "赤い円", "",
         "mduara mwekundu " * 40, "  ", "x"]


@pytest.fixture(scope="module")
def trained(tiny_vocab, tmp_path_factory):
  """The tiny model trained 100 steps and evaluated once, its export, and the evaluator's embeddings
  of the held-out scenes and of TEXTS."""
  from mural.data import eval_data  # pylint: disable=g-import-not-at-top
  from mural.data import synthetic  # pylint: disable=g-import-not-at-top
  from mural.data import tokenizer  # pylint: disable=g-import-not-at-top
  workdir = tmp_path_factory.mktemp("trained")
  config = tiny_config(tiny_vocab, **OVERRIDES)
  result = train.train_and_evaluate(config, str(workdir))
  absl_level = logging.getLogger("absl").level
  export_dir = export.export(config, str(workdir))
  # TensorFlow's SavedModel writer sets absl's logger to WARNING; the export puts it back.
  assert logging.getLogger("absl").level == absl_level
  setup = result["setup"]
  heads = setup.system.retrieval_heads(config, setup.tasks)
  embedder = setup.embedder(config.eval_batch_size)
  variables = result["state"].variables()
  scenes = synthetic.build_eval_data(config)
  tok = tokenizer.Tokenizer(tiny_vocab, config.model.text.max_len)
  ids, mask = (a.numpy() for a in tok.tokenize(TEXTS))
  return types.SimpleNamespace(
      config=config, workdir=workdir, result=result, export_dir=export_dir, setup=setup,
      scenes=scenes, texts=embedder.texts(variables, ids, mask, heads["text"]),
      images=embedder.images(variables, eval_data.eval_images(scenes.images, config.data), heads["image"]))


def _png_files(images, directory) -> list:
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  directory.mkdir(parents=True, exist_ok=True)
  paths = []
  for i, im in enumerate(images):
    paths.append(directory / f"scene_{i:03d}.png")
    paths[-1].write_bytes(tf.io.encode_png(im).numpy())
  return paths


def test_export_dir_and_load_match_the_evaluator(trained, tmp_path):
  d = pathlib.Path(trained.export_dir)
  assert d == trained.workdir / "export" / "step_100"
  manifest = json.loads((d / "manifest.json").read_text())
  assert manifest["system"] == "mural" and manifest["step"] == 100 and manifest["embed_dim"] == TINY_FEATURES
  assert manifest["heads"] == {"image": "", "text": "i2t"}
  assert manifest["image"]["size"] == 32 and manifest["image"]["resize"] == 36
  assert manifest["text"]["max_len"] == 16 and manifest["languages"] == ["en", "de", "sw"]
  assert (d / "vocab.txt").read_text() == pathlib.Path(trained.config.data.vocab_path).read_text()
  assert not list(d.rglob("*.pkl")) and not list(d.rglob("*.pickle"))

  model = export.load(str(d), batch_size=3)  # Batches of 3: padded tails on both inputs.
  texts = model.embed_texts(TEXTS)
  assert texts.dtype == np.float32 and texts.shape == (len(TEXTS), TINY_FEATURES)
  np.testing.assert_allclose(np.linalg.norm(texts, axis=1), 1.0, atol=1e-6)
  np.testing.assert_allclose(texts, trained.texts, atol=1e-5)
  np.testing.assert_array_equal(model.embed_texts(TEXTS, "es"), texts)  # One vocabulary: no language.
  raw = trained.scenes.images
  half = len(raw) // 2
  items = [str(p) for p in _png_files(raw[:half], tmp_path / "png")] + list(raw[half:])
  np.testing.assert_allclose(model.embed_images(items), trained.images, atol=1e-5)
  assert model.embed_texts([]).shape == (0, TINY_FEATURES)

  # Bad input: one line, no traceback from deep inside.
  (tmp_path / "bad.jpg").write_bytes(b"not an image")
  for bad, message in [(str(tmp_path / "bad.jpg"), "cannot be read or decoded"),
                       (str(tmp_path / "missing.png"), "cannot be read or decoded"),
                       (np.zeros((4, 4), np.uint8), r"must be uint8 \[H, W, 3\]")]:
    with pytest.raises(ValueError, match=message) as e:
      model.embed_images([bad])
    assert "\n" not in str(e.value)
  with pytest.raises(FileNotFoundError, match="not an export directory"):
    export.load(str(tmp_path / "nowhere"))


SAVED_MODEL_SCRIPT = r'''
import json, sys
class Blocked:
  def find_spec(self, name, path=None, target=None):
    if name.split(".")[0] in ("jax", "jaxlib", "flax", "orbax", "mural"):
      raise ImportError("blocked: " + name)
sys.meta_path.insert(0, Blocked())
import numpy as np
import tensorflow as tf
import tensorflow_text  # Registers the tokenizer's ops.
model = tf.saved_model.load(sys.argv[1])
texts = json.load(open(sys.argv[2]))
files = [open(p, "rb").read() for p in json.load(open(sys.argv[3]))]
pixels = np.load(sys.argv[4]).astype(np.float32)
out = {
    "text": model.signatures["embed_text"](text=tf.constant(texts))["embedding"].numpy(),
    "image": model.signatures["embed_image"](image_bytes=tf.constant(files))["embedding"].numpy(),
    "pixels": model.signatures["embed_image_pixels"](pixels=tf.constant(pixels))["embedding"].numpy(),
}
np.savez(sys.argv[5], **out)
print(json.dumps(sorted(m for m in sys.modules if m.split(".")[0] in ("jax", "mural", "flax"))))
'''


def test_saved_model_loads_without_mural_or_jax(trained, tmp_path):
  raw = trained.scenes.images
  (tmp_path / "texts.json").write_text(json.dumps(TEXTS))
  (tmp_path / "files.json").write_text(json.dumps([str(p) for p in _png_files(raw, tmp_path / "png")]))
  np.save(tmp_path / "pixels.npy", raw[:5])
  script = tmp_path / "load.py"
  script.write_text(SAVED_MODEL_SCRIPT)
  run = subprocess.run(
      [sys.executable, str(script), str(pathlib.Path(trained.export_dir) / "saved_model"),
       str(tmp_path / "texts.json"), str(tmp_path / "files.json"), str(tmp_path / "pixels.npy"),
       str(tmp_path / "out.npz")],
      cwd=tmp_path, capture_output=True, text=True, timeout=300,
      env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONPATH": ""})
  assert run.returncode == 0, run.stderr[-3000:]
  assert json.loads(run.stdout.strip().splitlines()[-1]) == []
  out = np.load(tmp_path / "out.npz")
  np.testing.assert_allclose(out["text"], trained.texts, atol=1e-5)
  np.testing.assert_allclose(out["image"], trained.images, atol=1e-5)
  np.testing.assert_allclose(out["pixels"], trained.images[:5], atol=1e-5)


def _recalls(text_index, image_index, texts, images, text_ids, langs):
  """Evaluator-style R@1/5/10 per language, from searches of the two indexes (all hits)."""
  out = {}
  for lang in langs:
    mine = [i for i in text_ids if i.startswith(lang + "/")]
    rows = np.array([text_ids.index(i) for i in mine])
    scene = {i: int(i.split("/")[1]) for i in mine}
    # text -> image: where each caption's scene comes in its hit list.
    _, hits = image_index.search(texts[rows], len(images))
    t2i = np.array([[int(pathlib.Path(h).stem.split("_")[1]) for h in row].index(scene[i])
                    for row, i in zip(hits, mine)])
    # image -> text: where the scene's first caption of this language comes.
    _, hits = text_index.search(images, len(text_ids))
    i2t = np.array([[h for h in row if h in scene].index(next(h for h in row if scene.get(h) == n))
                    for n, row in enumerate(hits)])
    for k in (1, 5, 10):
      out[f"{lang}/i2t_R@{k}"] = 100.0 * float(np.mean(i2t < k))
      out[f"{lang}/t2i_R@{k}"] = 100.0 * float(np.mean(t2i < k))
  return out


def test_embed_index_search_reproduce_the_evaluators_recalls(trained, tmp_path, capsys, monkeypatch):
  config, scenes = trained.config, trained.scenes
  images = tmp_path / "images"
  _png_files(scenes.images, images)
  (images / "scene_999_broken.png").write_bytes(b"\x89PNG but not really")
  lines = [f"{lang}/{k}\t{c}" for lang, d in scenes.languages.items() for k, c in enumerate(d.captions)]
  (tmp_path / "texts.tsv").write_bytes("\n".join(lines[:5] + ["empty/0\t ", "no tab here", "latin1/0\tgr\udcfcn"]
                                                 + lines[5:]).encode("utf-8", "surrogateescape") + b"\n")
  out = tmp_path / "out"
  args = ["--export", trained.export_dir, "--images", str(images / "*.png"), "--texts",
          str(tmp_path / "texts.tsv"), "--output", str(out), "--dtype", "float32", "--shard_size", "7"]
  assert embed.main(args) == 0
  meta = [json.loads(p.read_text()) for p in sorted((out / "texts").glob("*.json"))]
  assert [s["first"] for s in meta] == list(range(0, len(lines) + 3, 7))
  assert [k for s in meta for k in s["skipped"]] == [
      ["empty/0", "empty text"], ["line 7", "no TAB (id<TAB>text)"], ["line 8", "not UTF-8 (byte 12)"]]
  image_meta = [json.loads(p.read_text()) for p in sorted((out / "images").glob("*.json"))]
  assert [k for s in image_meta for k, _ in s["skipped"]] == [str(images / "scene_999_broken.png")]

  # Resume: shards from 1 on are lost (a kill); the rerun writes them again, the same.
  before = {p.name: p.read_bytes() for p in (out / "texts").iterdir()}
  for p in (out / "texts").glob("shard-0000[1-9].*"):
    p.unlink()
  assert embed.main(args) == 0
  assert "resuming after 1 done shards (7 inputs)" in capsys.readouterr().err
  assert {p.name: p.read_bytes() for p in (out / "texts").iterdir()} == before
  # Ctrl-C while shard 1 is written: one line, exit 130; the same command goes on from there.
  save = embed._save_shard
  def interrupted(directory, index, *rest):
    if index == 1:
      raise KeyboardInterrupt
    return save(directory, index, *rest)
  for p in (out / "texts").glob("shard-0000[1-9].*"):
    p.unlink()
  monkeypatch.setattr(embed, "_save_shard", interrupted)
  with pytest.raises(SystemExit) as stopped:
    embed.main(args)
  assert stopped.value.code == 130
  assert capsys.readouterr().err.splitlines()[-1] == (
      f"mural.embed: error: interrupted (Ctrl-C): the same command goes on after the done shards in {out}")
  monkeypatch.setattr(embed, "_save_shard", save)
  assert embed.main(args) == 0
  assert {p.name: p.read_bytes() for p in (out / "texts").iterdir()} == before

  texts, text_ids = embed.load_embeddings(str(out / "texts"))
  vectors, image_ids = embed.load_embeddings(str(out / "images"))
  # A third column is the line's language, which a shared-vocabulary export ignores: not text.
  (tmp_path / "with_lang.tsv").write_text(f"x\t{lines[0].split(chr(9))[1]}\tde\n")
  assert embed.main(["--export", trained.export_dir, "--texts", str(tmp_path / "with_lang.tsv"),
                     "--output", str(tmp_path / "with_lang"), "--dtype", "float32"]) == 0
  np.testing.assert_array_equal(embed.load_embeddings(str(tmp_path / "with_lang" / "texts"))[0],
                                texts[text_ids.index(lines[0].split("\t")[0])][None])

  # TFRecord input: ids from the id feature, or '<file>:<record>' without one; float16 output.
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  record = lambda i, key: tf.train.Example(features=tf.train.Features(feature={
      "image/encoded": tf.train.Feature(bytes_list=tf.train.BytesList(
          value=[(images / f"scene_{i:03d}.png").read_bytes()])),
      **({"image/id": tf.train.Feature(bytes_list=tf.train.BytesList(value=[key]))} if key else {}),
  })).SerializeToString()
  with tf.io.TFRecordWriter(str(tmp_path / "scenes.tfrecord")) as w:
    for i, key in [(0, b"first"), (1, b""), (2, b"third")]:
      w.write(record(i, key))
  assert embed.main(["--export", trained.export_dir, "--images", str(tmp_path / "*.tfrecord"),
                     "--output", str(tmp_path / "out16")]) == 0
  got, got_ids = embed.load_embeddings(str(tmp_path / "out16" / "images"))
  assert got_ids == ["first", f"{tmp_path / 'scenes.tfrecord'}:1", "third"]
  assert np.load(tmp_path / "out16" / "images" / "shard-00000.npy").dtype == np.float16
  np.testing.assert_allclose(got, trained.images[:3], atol=2e-3)
  assert image_ids == [str(images / f"scene_{i:03d}.png") for i in range(len(scenes.images))]
  np.testing.assert_allclose(vectors, trained.images, atol=1e-5)
  for kind in ("images", "texts"):
    for t in ("flat", "hnsw"):
      assert index_lib.main(["--embeddings", str(out), "--kind", kind, "--index",
                             str(tmp_path / f"{kind}_{t}"), "--type", t]) == 0
  langs = list(config.data.languages)
  want = {k: v for k, v in trained.result["eval"].items()
          if k.split("/")[0] in langs and "R@" in k}
  flat = _recalls(index_lib.Index(str(tmp_path / "texts_flat")), index_lib.Index(str(tmp_path / "images_flat")),
                  texts, vectors, text_ids, langs)
  assert flat == want
  # Not the degenerate model whose texts (or images) all embed alike: its recalls are exactly
  # k/16 everywhere (3 values), whatever the ids. Here ranks differ by language and direction.
  assert len(set(want.values())) > 3, want
  ann = _recalls(index_lib.Index(str(tmp_path / "texts_hnsw")), index_lib.Index(str(tmp_path / "images_hnsw")),
                 texts, vectors, text_ids, langs)
  assert all(abs(ann[k] - want[k]) <= 1.0 for k in want)

  # The command line: text -> images, image -> texts.
  capsys.readouterr()
  caption = scenes.languages["de"].captions[3]
  assert search.main(["--export", trained.export_dir, "--index", str(tmp_path / "images_flat"),
                      "--query", caption, "-k", "3"]) == 0
  printed = [l.split("\t") for l in capsys.readouterr().out.splitlines()]
  query = export.load(trained.export_dir).embed_texts([caption])
  scores, hits = index_lib.Index(str(tmp_path / "images_flat")).search(query, 3)
  assert [p[2] for p in printed] == hits[0] and [p[0] for p in printed] == ["1", "2", "3"]
  np.testing.assert_allclose([float(p[1]) for p in printed], scores[0], atol=1e-4)
  assert search.main(["--export", trained.export_dir, "--index", str(tmp_path / "texts_flat"),
                      "--image", str(images / "scene_003.png"), "-k", "2"]) == 0
  assert len(capsys.readouterr().out.splitlines()) == 2
  assert search.main(["--export", trained.export_dir, "--index", str(tmp_path / "nowhere"),
                      "--query", "x"]) == 1
  assert capsys.readouterr().err.strip().count("\n") == 0


def test_a_full_disk_in_export_embed_and_index_is_one_line_and_leaves_no_part(trained, small_disk,
                                                                              tmp_path, capsys, monkeypatch):
  """Each writer meets a real ENOSPC: one line (what, where, the space free, what is whole), no
  partial file or folder left, and the same command finishes once there is space."""
  target = small_disk.path / "export"
  first = export.export(trained.config, str(trained.workdir), str(target), saved_model=False)
  small_disk.fill(leave=0)
  with pytest.raises(disk_space.DiskFull) as full:
    export.export(trained.config, str(trained.workdir), str(target), saved_model=False)
  assert re.fullmatch(rf"no space left on device writing the export of step 100 to {target} \(.* free "
                      r"there now\); checkpoint 100 is untouched: the same command exports it once there "
                      r"is space", str(full.value)), str(full.value)
  assert not [f for f in small_disk.files() if ".tmp" in f]  # The earlier export stays whole.
  np.testing.assert_array_equal(export.load(first).embed_texts(TEXTS[:2]),
                                export.load(trained.export_dir).embed_texts(TEXTS[:2]))

  # mural.embed: shard 1 meets the full disk; shard 0 stays, shard 1 leaves nothing.
  small_disk.empty()
  (tmp_path / "texts.tsv").write_text("".join(f"t{i}\t{t}\n" for i, t in enumerate(TEXTS[:6])))
  out = small_disk.path / "embeddings"
  args = ["--export", first, "--texts", str(tmp_path / "texts.tsv"), "--output", str(out),
          "--shard_size", "3", "--dtype", "float32"]
  save = embed._save_shard
  def fill_before_shard_1(directory, index, *rest):
    if index == 1:
      small_disk.fill(leave=0)
    return save(directory, index, *rest)
  monkeypatch.setattr(embed, "_save_shard", fill_before_shard_1)
  with pytest.raises(SystemExit) as stopped:
    embed.main(args)
  err = capsys.readouterr().err.strip().splitlines()[-1]
  assert stopped.value.code == 1 and re.fullmatch(
      rf"mural.embed: error: no space left on device writing embedding shard 1 to {out}/texts/shard-00001"
      r"\.npy \(.* free there now\); shard 0 is whole: the same command goes on from shard 1 once there "
      r"is space", err), err
  assert sorted(f for f in small_disk.files() if f.startswith("embeddings/texts/")) == [
      "embeddings/texts/shard-00000.ids", "embeddings/texts/shard-00000.json",
      "embeddings/texts/shard-00000.npy"]
  monkeypatch.setattr(embed, "_save_shard", save)
  small_disk.empty()
  assert embed.main(args) == 0
  assert "resuming after 1 done shards (3 inputs)" in capsys.readouterr().err
  assert embed.load_embeddings(str(out / "texts"))[1] == [f"t{i}" for i in range(6)]

  # mural.index: the folder is written beside its place; a full disk leaves neither.
  small_disk.fill(leave=0)
  assert index_lib.main(["--embeddings", str(out), "--kind", "texts", "--index", str(small_disk.path / "ix")]) == 1
  err = capsys.readouterr().err.strip().splitlines()[-1]
  assert err.startswith(f"mural.index: error: no space left on device writing the index to {small_disk.path}/ix (")
  assert not [f for f in small_disk.files() if f.startswith("ix")]
  small_disk.empty()
  assert index_lib.main(["--embeddings", str(out), "--kind", "texts", "--index", str(small_disk.path / "ix")]) == 0


def test_svcca_compares_the_exports_languages_on_parallel_sentences(trained, capsys, tmp_path):
  """python -m mural.svcca: every pair of the export's languages, in [0, 1]; the same sentences
  in two languages score above the same embeddings with one side's rows shuffled."""
  matrix = svcca.main(["--export", trained.export_dir, "--scenes=120"])
  langs = list(trained.config.data.synthetic.languages)
  assert list(matrix) == langs and all(0.0 <= matrix[a][b] <= 1.0 for a in langs for b in langs)
  assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["svcca"] == matrix
  texts = svcca.synthetic_parallel(trained.export_dir, 120)
  model = export.load(trained.export_dir)
  en, de = (model.embed_texts(texts[lang]) for lang in ("en", "de"))
  shuffled = de[np.random.default_rng(0).permutation(len(de))]
  assert matrix["en"]["de"] == pytest.approx(svcca.svcca(en, de), abs=1e-6)
  assert svcca.svcca(en, shuffled) < matrix["en"]["de"] - 0.1
  # The same sentences from a TSV (a header of language codes): the same score.
  tsv = tmp_path / "parallel.tsv"
  tsv.write_text("de\ten\n" + "".join(f"{d}\t{e}\n" for d, e in zip(texts["de"], texts["en"])))
  from_tsv = svcca.main(["--export", trained.export_dir, "--texts", str(tsv)])
  assert list(from_tsv) == ["de", "en"] and from_tsv["en"]["de"] == pytest.approx(matrix["en"]["de"], abs=1e-6)


def test_warm_start_first_loss_is_the_trained_models(trained, tmp_path, monkeypatch):
  """A run started from the export (all parts) computes, at step 1, the trained model's loss on
  its batch; a towers-only start loads the towers and leaves the heads as initialised, and an
  'image_tower' start the image tower alone."""
  config = tiny_config(trained.config.data.vocab_path, **OVERRIDES, init_from=trained.export_dir,
                       init_from_parts="all")
  setup = trained.setup
  batches = []
  pipeline = train.input_pipeline(config, setup, str(tmp_path))[1]
  hooked = HookedIterator(pipeline, 1, lambda b: (batches.append(b), sigterm(b))[1])
  run = train.train_and_evaluate(config, str(tmp_path / "warm"), train_iter=hooked, evaluators=[])
  assert run["step"] == 1
  first = json.loads((tmp_path / "warm" / "metrics.jsonl").read_text().splitlines()[0])["loss"]

  batch = {t.name: {k: batches[0][t.name][k] for k in t.shapes(config)} for t in setup.tasks}
  loss_fn = jax.jit(lambda v, r: sum(system_lib.task_losses(
      setup.model, setup.tasks, v["params"], v["batch_stats"], batch, r)[0].values()))
  trained_state = trained.result["state"]
  rng = jax.random.fold_in(trained_state.rng, 0)
  want = float(loss_fn(jax.device_get(trained_state.variables()), rng))
  # The trained run's own first step: the same batch (the pipeline is deterministic), untrained.
  untrained = json.loads((trained.workdir / "metrics.jsonl").read_text().splitlines()[0])["loss"]
  assert first == pytest.approx(want, rel=1e-5, abs=1e-5)
  assert abs(first - untrained) > 0.05

  # Towers only, into a state of zeros: towers come from the export, the rest stays zero.
  config.init_from_parts = "towers"
  fresh = jax.tree.map(np.zeros_like, jax.device_get(trained_state))
  state, report = warm_start.load_into(jax.device_put(fresh), config)
  assert report["loaded"] and all(n.split("/")[1] in ("image_tower", "text_tower") for n in report["loaded"])
  assert {n.split("/")[1] for n in report["initialised"]} == {"i2t_head", "t2t_head", "log_temperature"}
  got = export.flat(jax.device_get(state.params))
  source = export.flat(export.read_variables(trained.export_dir)[0]["params"])
  initial = export.flat(fresh.params)
  for name, value in got.items():
    np.testing.assert_array_equal(value, source[name] if name.endswith("_tower") or "_tower/" in name
                                  else initial[name])
  # The trainer's init with that warm start leaves the towers out of its program: their values
  # come from the export, and every other value (heads, optimizer state, rng) is what the init
  # without a warm start draws, bit for bit.
  warm = warm_start.match(setup.abstract_state, config, trained.config.data.vocab_path)
  key = jax.random.PRNGKey(3)
  started, plain = jax.device_get(setup.init_state(key, warm)), jax.device_get(setup.init_state(key))
  for collection in ("params", "batch_stats"):
    from_export = export.flat(export.read_variables(trained.export_dir)[0][collection])
    fresh_values = export.flat(getattr(plain, collection))
    for name, value in export.flat(getattr(started, collection)).items():
      want = from_export[name] if name.split("/")[0].endswith("_tower") else fresh_values[name]
      np.testing.assert_array_equal(value, want, err_msg=f"{collection}/{name}")
  jax.tree.map(np.testing.assert_array_equal, (started.opt_state, started.rng, started.step),
               (plain.opt_state, plain.rng, plain.step))
  # The token table goes with its vocabulary: another is an error; the source's (here the file
  # the export copied) loads.
  lines = pathlib.Path(trained.config.data.vocab_path).read_text().splitlines()
  other = tmp_path / "other_vocab.txt"
  other.write_text("\n".join(lines[:-2] + [lines[-1], lines[-2]]) + "\n")  # Two tokens swapped.
  with pytest.raises(ValueError, match=r"vocabulary .*vocab\.txt differs from this run's .*other_vocab"):
    warm_start.load_into(jax.device_put(fresh), config, str(other))
  assert warm_start.load_into(jax.device_put(fresh), config, trained.config.data.vocab_path)[1]["loaded"]
  # A training run with that vocabulary fails before it compiles its step (seconds, not minutes).
  compiles = []
  monkeypatch.setattr(train, "compile_train_step_in_background", compiles.append)
  with pytest.raises(ValueError, match=r"vocabulary .*differs from this run's .*other_vocab"):
    train.train_and_evaluate(tiny_config(str(other), **OVERRIDES, init_from=trained.export_dir),
                             str(tmp_path / "other"), evaluators=[])
  assert not compiles
  # A run that takes the text tower and names no vocabulary uses the source's: an export's
  # vocab.txt, or the vocab_path a workdir's config.json records.
  assert config_lib.source_vocab(str(trained.workdir)) == trained.config.data.vocab_path
  (tmp_path / "new").mkdir()
  copied = vocab.learn(tiny_config("", init_from=trained.export_dir), [], str(tmp_path / "new"))
  assert pathlib.Path(copied).read_bytes() == pathlib.Path(trained.config.data.vocab_path).read_bytes()
  assert [config_lib.takes_text_tower(tiny_config("", init_from="x", init_from_parts=p))
          for p in ("towers", "all", "image_tower, text_tower", "image_tower")] == [True, True, True, False]
  # One named tower: the image tower from the export, the text tower as it was.
  config.init_from_parts = "image_tower"
  state, report = warm_start.load_into(jax.device_put(fresh), config)
  assert report["loaded"] and {n.split("/")[1] for n in report["loaded"]} == {"image_tower"}
  got = export.flat(jax.device_get(state.params))
  for name, value in got.items():
    np.testing.assert_array_equal(value, source[name] if name.startswith("image_tower/")
                                  else initial[name])
  config.init_from_parts = "image_tower,vision_tower"
  with pytest.raises(ValueError, match=r"\['vision_tower'\] not among this model's parameter groups"):
    warm_start.load_into(state, config)
  config.init_from_parts = "towers"
  config.init_from = str(tmp_path / "nowhere")
  with pytest.raises(FileNotFoundError, match="neither an export directory"):
    warm_start.load_into(state, config)


EIGHT_DEVICES = r'''
import sys
sys.path.insert(0, sys.argv[3])
import flax.linen as nn, jax, jax.numpy as jnp, numpy as np
from conftest import tiny_config
from mural import checkpointing, export, sharding, system
from mural.state import TrainState
config = tiny_config(sys.argv[2], mesh__fsdp=8, mesh__data=1, shard_min_size=0)
model, _, tasks = export.model_and_heads(config)
mesh, rules = sharding.make_mesh(config.mesh), sharding.rules_from_config(config)
init = lambda r: system.init_variables(model, tasks, config, r)
boxed = jax.eval_shape(init, jax.random.PRNGKey(0))
out = {"params": sharding.logical_shardings(boxed["params"], mesh, rules, 0),
       "batch_stats": jax.tree.map(lambda _: sharding.replicated(mesh), nn.unbox(boxed["batch_stats"]))}
v = jax.jit(lambda r: nn.unbox(init(r)), out_shardings=out)(jax.random.PRNGKey(3))
sharded = [x for x in jax.tree.leaves(v["params"]) if not x.sharding.is_fully_replicated]
assert jax.device_count() == 8 and sharded, "nothing sharded over 8 devices"
state = TrainState(step=jnp.int32(7), params=v["params"], opt_state={"none": jnp.zeros(())},
                   batch_stats=v["batch_stats"], rng=jax.random.PRNGKey(0))
ckpt = checkpointing.Checkpoints(sys.argv[1], 2)
ckpt.save(7, state, {"k": 0})
ckpt.wait(); ckpt.close()
np.savez(sys.argv[1] + "/params.npz", **export.flat(jax.device_get(state.params)))
# The embedding batches split over the 8 devices (5 rows: padded to 8).
model = export.load(export.export(config, sys.argv[1], sys.argv[1] + "/export8", saved_model=False), 5)
assert model.batch_size == 8 and len(model._rows.mesh.devices.flat) == 8
np.save(sys.argv[1] + "/texts8.npy", model.embed_texts(["hello", "", "ein roter Kreis", "赤い円", "x"]))
'''


def test_checkpoint_of_8_devices_exports_on_1(trained, tmp_path):
  vocab = trained.config.data.vocab_path
  run = subprocess.run([sys.executable, "-c", EIGHT_DEVICES, str(tmp_path), vocab, str(ROOT / "tests")],
                       capture_output=True, text=True, timeout=300, cwd=ROOT,
                       env={**os.environ, "XLA_FLAGS": xla_flags("--xla_force_host_platform_device_count=8"),
                            "JAX_PLATFORMS": "cpu", "TF_CPP_MIN_LOG_LEVEL": "2"})
  assert run.returncode == 0, run.stderr[-3000:]
  assert jax.device_count() == 1
  config = tiny_config(vocab)
  d = export.export(config, str(tmp_path), saved_model=False)
  assert d.endswith("step_7") and not (pathlib.Path(d) / "saved_model").exists()
  want = np.load(tmp_path / "params.npz")
  got = export.flat(export.read_variables(d)[0]["params"])
  assert sorted(got) == sorted(want.files)
  for name in want.files:
    np.testing.assert_array_equal(got[name], want[name])
  np.testing.assert_allclose(export.load(d).embed_texts(["hello", "", "ein roter Kreis", "赤い円", "x"]),
                             np.load(tmp_path / "texts8.npy"), atol=1e-5)


def test_export_command_line_errors_are_one_line(tmp_path):
  """Without --config: the config the workdir records (here tiny.py's), which reaches the export."""
  config_lib.write_record(config_lib.from_file(ROOT / "configs" / "tiny.py"), str(tmp_path))
  run = subprocess.run([sys.executable, "-m", "mural.main", f"--workdir={tmp_path}", "--mode=export"],
                       capture_output=True, text=True, timeout=300, cwd=ROOT,
                       env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"})
  assert run.returncode == 1
  errors = [l for l in run.stderr.splitlines() if l.startswith("mural: error:")]
  assert errors and "no checkpoint" in errors[0], run.stderr[-2000:]


def test_index_settings_are_checked_before_faiss(tmp_path):
  """faiss aborts the process on HNSW's M = 0 and raises deep in C++ on an ivfpq it cannot train:
  each is one ValueError naming the flag, and the command line's error is one line."""
  vectors = np.random.default_rng(0).normal(size=(300, 16)).astype(np.float32)
  vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
  for kwargs, message in [
      (dict(kind="hnsw", hnsw_m=0), "--hnsw_m must be an int >= 2, got 0"),
      (dict(kind="hnsw", ef_search=0), "--ef_search must be an int >= 1"),
      (dict(kind="ivfpq", nprobe=0), "--nprobe must be an int >= 1"),
      (dict(flat_max=-1), "--flat_max must be an int >= 0"),
      (dict(kind="ivfpq", pq_m=5), "--pq_m 5 does not divide the vectors' dimension 16"),
      (dict(kind="ivfpq", nlist=301), "--nlist 301: more inverted lists than the 300 vectors"),
  ]:
    with pytest.raises(ValueError, match=re.escape(message)):
      index_lib.build(vectors, **kwargs)
  with pytest.raises(ValueError, match="--type=ivfpq: 255 vectors"):
    index_lib.build(vectors[:255], "ivfpq")
  index, params = index_lib.build(vectors, "ivfpq", pq_m=8)  # The least it trains from.
  assert params["pq_m"] == 8 and params["nlist"] == 7
  index_lib.save(index, params, [str(i) for i in range(300)], str(tmp_path / "ivfpq"), {})
  saved = index_lib.Index(str(tmp_path / "ivfpq"))
  _, hits = saved.search(vectors[:5], 1)
  assert hits == [["0"], ["1"], ["2"], ["3"], ["4"]]  # Re-ranked exactly: each finds itself.
  with pytest.raises(ValueError, match="k must be an int >= 1, got 0"):
    saved.search(vectors[:1], 0)
  assert search.main(["--export", str(tmp_path), "--index", str(tmp_path / "ivfpq"), "--query", "x",
                      "-k", "0"]) == 2


@pytest.mark.parametrize("flag", ["--shard_size", "--batch_size"])
def test_embed_sizes_below_one_are_one_line(flag, tmp_path, capsys):
  """Checked before the export loads (--batch_size=0 ended in "range() arg 3 must not be zero")."""
  with pytest.raises(SystemExit) as exit_info:
    embed.main(["--export", str(tmp_path), "--texts", str(tmp_path / "t.tsv"), "--output", str(tmp_path / "o"),
                flag, "0"])
  assert exit_info.value.code == 1
  assert capsys.readouterr().err.strip() == f"mural.embed: error: {flag} must be >= 1"


def _brute_force_recalls(texts, images):
  """One caption per image, caption i of image i: Recall@1/5/10 both ways in float64, ties
  counted against the model, by explicit comparison of every candidate."""
  sim = np.asarray(texts, np.float64) @ np.asarray(images, np.float64).T
  n = sim.shape[0]
  t2i = [sum(sim[i, j] >= sim[i, i] for j in range(n) if j != i) for i in range(n)]
  i2t = [sum(sim[j, i] >= sim[i, i] for j in range(n) if j != i) for i in range(n)]
  out = {}
  for k in (1, 5, 10):
    out[f"image_retrieval_recall@{k}"] = float(np.mean(np.array(t2i) < k))
    out[f"text_retrieval_recall@{k}"] = float(np.mean(np.array(i2t) < k))
  out["mean_recall"] = float(np.mean(list(out.values())))
  return out


def test_public_sets_score_an_export_as_their_releases_lay_them_out(trained, tmp_path, capsys):
  """XTD10 and Multi30k in their releases' layouts (the held-out scenes as the images, their
  captions as the texts): `python -m mural.evaluate_public` scores the export, every figure equal
  to a float64 brute force over the same embeddings, with CLIP_benchmark's names, the paper's
  figures printed beside them."""
  import gzip  # pylint: disable=g-import-not-at-top
  from mural import evaluate_public  # pylint: disable=g-import-not-at-top
  scenes = trained.scenes
  n = len(scenes.images)
  names = [f"COCO_val2014_{i:012d}.jpg" for i in range(n)]
  coco = tmp_path / "coco"
  for i, (name, png) in enumerate(zip(names, _png_files(scenes.images, tmp_path / "png"))):
    folder = coco / ("train2014" if i % 2 else "val2014")
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_bytes(png.read_bytes())
  first = {lang: scenes.languages[lang].captions[::len(scenes.languages[lang].captions) // n] for lang in ("en", "de")}
  (tmp_path / "xtd" / "XTD10").mkdir(parents=True)
  (tmp_path / "xtd" / "MIC").mkdir()
  (tmp_path / "xtd" / "XTD10" / "test_image_names.txt").write_text("".join(f"{m}\n" for m in names))
  (tmp_path / "xtd" / "XTD10" / "test_1kcaptions_en.txt").write_text("".join(f"{c}\n" for c in first["en"]))
  (tmp_path / "xtd" / "MIC" / "test_1kcaptions_de.txt").write_text("".join(f"{c}\n" for c in first["de"]))
  m30k = tmp_path / "multi30k"
  (m30k / "task1" / "image_splits").mkdir(parents=True)
  (m30k / "task1" / "raw").mkdir()
  (m30k / "task1" / "image_splits" / "test_2016_flickr.txt").write_text("".join(f"{m}\n" for m in names))
  for lang in ("en", "de"):
    with gzip.open(m30k / "task1" / "raw" / f"test_2016_flickr.{lang}.gz", "wt", encoding="utf-8") as f:
      f.write("".join(f"{c}\n" for c in first[lang]))
  output = tmp_path / "public.jsonl"
  assert evaluate_public.main([f"--export={trained.export_dir}", f"--set=xtd10:{tmp_path / 'xtd'}",
                               f"--images=xtd10:{coco}", f"--set=multi30k:{m30k}",
                               f"--images=multi30k:{coco / 'val2014'}", f"--output={output}"]) == 0
  printed = capsys.readouterr().out
  rows = [json.loads(line) for line in output.read_text().splitlines()]
  model = export.load(trained.export_dir)
  paths = [str(coco / ("train2014" if i % 2 else "val2014") / m) for i, m in enumerate(names)]
  images = model.embed_images(paths)
  for lang in ("en", "de"):
    expected = _brute_force_recalls(model.embed_texts(first[lang]), images)
    got = {r["metric"]: r["value"] for r in rows if r["dataset"] == "xtd10" and r["language"] == lang}
    assert got.keys() == expected.keys()
    for metric, value in expected.items():
      assert got[metric] == pytest.approx(value, abs=1e-9), (lang, metric)
  pairs = {r["metric"]: r["value"] for r in rows if r["dataset"] == "multi30k" and r["language"] == "en-de"}
  sim = model.embed_texts(first["en"]).astype(np.float64) @ model.embed_texts(first["de"]).astype(np.float64).T
  l2r = np.mean([all(sim[i, j] < sim[i, i] for j in range(n) if j != i) for i in range(n)])
  r2l = np.mean([all(sim[j, i] < sim[i, i] for j in range(n) if j != i) for i in range(n)])
  assert pairs["translation_accuracy_l2r"] == pytest.approx(l2r) and pairs["translation_accuracy_r2l"] == pytest.approx(r2l)
  assert all(r["model"] == os.path.abspath(trained.export_dir) and r["split"] in ("test", "test_2016_flickr")
             for r in rows)
  # Half the images are not in the folder given for Multi30k: its retrieval is skipped, and said.
  assert not any(r["dataset"] == "multi30k" and r["task"] == "zeroshot_retrieval" for r in rows)
  assert "image-text retrieval skipped: " in printed and f"{n - n // 2} of its {n} image files are missing" in printed
  assert "MURAL-BASE (paper)" in printed and "xtd10 test" in printed and "multi30k test_2016_flickr" in printed
  # The built-in zero-shot set on the export: its rendered PNG bytes embed as files do, and every
  # figure is CLIP's recipe over the export's own embeddings (float64, ties against the model).
  from mural.public_sets import builtin, parts as set_parts, report  # pylint: disable=g-import-not-at-top
  read = builtin.read("en,de", None, print)
  rows = set_parts.score("builtin", read, model, print)
  part = next(p for p in read if (p.split, p.language) == ("colour", "de"))
  images = model.embed_images(part.images).astype(np.float64)
  vectors = []
  for prompts in part.prompts:
    t = model.embed_texts(prompts, ["de"] * len(prompts)).astype(np.float64)
    mean = (t / np.linalg.norm(t, axis=1, keepdims=True)).mean(0)
    vectors.append(mean / np.linalg.norm(mean))
  sim = (images / np.linalg.norm(images, axis=1, keepdims=True)) @ np.array(vectors).T
  rank = np.array([sum(sim[i, j] >= sim[i, c] for j in range(len(vectors)) if j != c) for i, c in enumerate(part.labels)])
  got = {r["metric"]: r["value"] for r in rows if (r["split"], r["language"]) == ("colour", "de")}
  assert got == pytest.approx({"acc1": np.mean(rank == 0), "acc5": np.mean(rank < 5), "mean_per_class_recall": np.mean(
      [np.mean(rank[part.labels == c] == 0) for c in range(len(vectors))])}, abs=1e-9)
  assert {(r["split"], r["language"]) for r in rows} == {(s, l) for s in ("shape", "colour") for l in ("en", "de")}
  assert "builtin shape" in report.table("builtin", builtin.SET, rows)
