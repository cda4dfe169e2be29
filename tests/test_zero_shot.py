"""Zero-shot classification sets, with a fake model (fixed vectors, no JAX): the folder set reads
ImageNet's layout and CLIP_benchmark's files, bad input is one line naming the file, and acc1/acc5/
mean_per_class_recall equal a NumPy float64 brute force of CLIP's recipe, ties included; the
built-in set's classes, languages, prompts and images. (tests/test_export.py scores an export.)"""

import io
import json
import os

import numpy as np
import pytest
from PIL import Image

from mural import public_sets
from mural.data import synthetic_grammars
from mural.public_sets import builtin
from mural.public_sets import imagenet_folder
from mural.public_sets import parts as set_parts
from mural.public_sets import report
from mural.public_sets import zero_shot

SUBFOLDERS = ("n03", "n01", "n02", "n05", "n04", "n06")  # Made out of order: labels follow the sorted names.
EN = ["cat", "dog", "cat", "bird", "fish", "frog"]  # 'cat' twice: classes 0 and 2 tie on every image.


class _Model:
  """embed_texts / embed_images from fixed vectors: a text's by its string, an image's by its file name."""

  def __init__(self, texts: dict, images: dict):
    self.texts, self.images, self.image_calls = texts, images, 0

  def embed_texts(self, texts, langs):
    assert len(langs) == len(texts)
    return np.stack([self.texts[t] for t in texts]).astype(np.float32)

  def embed_images(self, paths):
    self.image_calls += 1
    return np.stack([self.images[os.path.basename(p)] for p in paths]).astype(np.float32)


def _folder(root, classes=SUBFOLDERS, per_class=(3, 1, 2, 2, 3, 1)):
  """ImageNet's layout: one subfolder per class, its images (one a level deeper), a stray file."""
  images = {}
  for name, n in zip(classes, per_class):
    for i in range(n):
      path = root / name / ("deeper" if i == 2 else "") / f"{name}_{i}.JPEG"
      path.parent.mkdir(parents=True, exist_ok=True)
      path.write_bytes(b"x")
      images[path.name] = sorted(classes).index(name)
  (root / classes[0] / "notes.txt").write_text("not an image")
  (root / ".ipynb_checkpoints").mkdir()
  return images


def _write(path, value):
  path.write_text(json.dumps(value, ensure_ascii=False), encoding="utf-8")


def _brute_force(model, part) -> dict:
  """CLIP's recipe in float64 with explicit loops: ranks count every other class scoring >= the
  true one (ties against the model)."""
  vectors = []
  for prompts in part.prompts:
    units = [np.float32(model.texts[p]).astype(np.float64) for p in prompts]
    mean = np.mean([u / np.linalg.norm(u) for u in units], axis=0)
    vectors.append(mean / np.linalg.norm(mean))
  ranks = []
  for path, label in zip(part.images, part.labels):
    x = np.float32(model.images[os.path.basename(path)]).astype(np.float64)
    scores = [float(x @ v) / np.linalg.norm(x) for v in vectors]
    ranks.append(sum(scores[j] >= scores[label] for j in range(len(vectors)) if j != label))
  ranks, labels = np.array(ranks), np.asarray(part.labels)
  out = {"acc1": np.mean(ranks == 0)}
  if len(vectors) >= 5:
    out["acc5"] = np.mean(ranks < 5)
  out["mean_per_class_recall"] = np.mean([np.mean(ranks[labels == c] == 0) for c in sorted(set(labels))])
  return out


def test_the_folder_set_reads_imagenets_layout_and_clip_benchmarks_files(tmp_path):
  truth = _folder(tmp_path)
  _write(tmp_path / "en_classnames.json", {"flowers": ["a", "b"], "imagenet1k": EN})
  _write(tmp_path / "en_zeroshot_classification_templates.json", {"imagenet1k": ["a photo of a {c}.", "art of the {}."]})
  _write(tmp_path / "jp_classnames.json", {"mine": {s: f"{s}の名前" for s in SUBFOLDERS}})  # A dict by subfolder.
  _write(tmp_path / "jp_zeroshot_classification_templates.json", {"mine": {f"{s}の名前": [f"{s}の写真", f"{s}の絵"]
                                                                          for s in SUBFOLDERS}})  # CuPL's.
  lines = []
  parts = public_sets.SETS["imagenet_folder"].read(str(tmp_path), None, lines.append)
  assert [(p.split, p.language) for p in parts] == [("test", "en"), ("test", "ja")]  # CLIP_benchmark's jp is ja.
  en, ja = parts
  assert en.classes == EN and en.prompts[3] == ["a photo of a bird.", "art of the bird."]
  assert ja.classes == [f"{s}の名前" for s in sorted(SUBFOLDERS)] and ja.prompts[0] == ["n01の写真", "n01の絵"]
  assert len(en.images) == 12 and [truth[os.path.basename(p)] for p in en.images] == list(en.labels)
  assert list(en.labels) == sorted(en.labels)  # ImageFolder's order: class by class.
  assert any(p.endswith(os.path.join("n03", "deeper", "n03_2.JPEG")) for p in en.images)
  assert any("1 files without an image extension skipped" in line for line in lines)


def test_imagenet_v2s_integer_folders_are_their_class_indices(tmp_path):
  """ImageNet-V2 names its folders 0..999 by class index: folder '10' is label 10 and takes the
  11th class name, not the 3rd its text order would give it."""
  folders = [str(k) for k in range(12)]  # In text order '10' and '11' would come before '2'.
  _folder(tmp_path, tuple(reversed(folders)), (1,) * 12)
  names = [f"class {k}" for k in range(12)]
  _write(tmp_path / "en_classnames.json", {"imagenet1k": names})
  part, = imagenet_folder.read(str(tmp_path), None, print)
  assert part.classes == names
  for path, label in zip(part.images, part.labels):
    assert os.path.basename(os.path.dirname(path)) == str(label), path


def test_scores_equal_clips_recipe_in_float64_with_ties(tmp_path):
  truth = _folder(tmp_path)
  _write(tmp_path / "en_classnames.json", {"imagenet1k": EN})
  _write(tmp_path / "en_zeroshot_classification_templates.json", {"imagenet1k": ["a {c}.", "the {c}!", "{c}?"]})
  rng = np.random.default_rng(0)
  parts = imagenet_folder.read(str(tmp_path), None, print)
  prompts = {p for ps in parts[0].prompts for p in ps}
  texts = {p: rng.normal(size=4) * rng.uniform(0.5, 2) for p in sorted(prompts)}  # Not unit: normalised inside.
  centre = {label: texts[parts[0].prompts[label][0]] for label in range(len(EN))}
  images = {name: centre[label] + rng.normal(size=4) for name, label in sorted(truth.items())}
  model = _Model(texts, images)
  rows = set_parts.score("imagenet_folder", parts, model, print)
  got = {r["metric"]: r["value"] for r in rows}
  expected = _brute_force(model, parts[0])
  assert got.keys() == expected.keys() == {"acc1", "acc5", "mean_per_class_recall"}
  for metric, value in expected.items():
    assert got[metric] == pytest.approx(value, abs=1e-12), metric
  assert 0 < got["acc1"] < got["acc5"] <= 1
  assert {r["task"] for r in rows} == {"zeroshot_classification"}
  # Classes 0 and 2 tie on every image, so neither is ever first: their recall is 0.
  ranks = zero_shot.class_ranks(model.embed_images(parts[0].images), parts[0].class_vectors(set_parts.Embedder(model)),
                                parts[0].labels)
  assert (ranks[parts[0].labels == 0] >= 1).all() and (ranks[parts[0].labels == 2] >= 1).all()
  table = report.table("imagenet_folder", public_sets.SETS["imagenet_folder"], rows)
  assert "top-1" in table and "top-5" in table and "per-class" in table


def test_fewer_than_five_classes_leave_acc5_out_and_no_files_fall_back_to_english(tmp_path):
  truth = _folder(tmp_path, ("golden_retriever", "tabby_cat", "zebra"), (2, 2, 1))
  lines = []
  part, = imagenet_folder.read(str(tmp_path), None, lines.append)
  assert part.language == "en" and part.classes == ["golden retriever", "tabby cat", "zebra"]
  assert part.prompts[1] == zero_shot.fill(imagenet_folder.DEFAULT_TEMPLATES, ["tabby cat"])[0]
  assert part.prompts[1][0] == "itap of a tabby cat."
  assert any("no en_classnames.json" in line for line in lines)
  assert any("no en_zeroshot_classification_templates.json" in line for line in lines)
  rng = np.random.default_rng(1)
  texts = {p: rng.normal(size=3) for ps in part.prompts for p in ps}
  model = _Model(texts, {name: rng.normal(size=3) for name in truth})
  _, task, values = part.evaluate(set_parts.Embedder(model))
  assert task == "zeroshot_classification" and sorted(values) == ["acc1", "mean_per_class_recall"]
  expected = _brute_force(model, part)
  assert values == pytest.approx(expected, abs=1e-12)
  # With a language's files, only the languages with files are scored (CLIP_benchmark's cn is zh).
  _write(tmp_path / "cn_classnames.json", {"imagenet1k": ["金毛寻回犬", "虎斑猫", "斑马"]})
  _write(tmp_path / "cn_zeroshot_classification_templates.json", {"imagenet1k": ["{c}的照片。"]})
  part, = imagenet_folder.read(str(tmp_path), None, print)
  assert part.language == "zh" and part.prompts == [["金毛寻回犬的照片。"], ["虎斑猫的照片。"], ["斑马的照片。"]]


def test_each_image_is_embedded_once_across_languages(tmp_path):
  truth = _folder(tmp_path)
  for lang in ("en", "de"):
    _write(tmp_path / f"{lang}_classnames.json", {"imagenet1k": [f"{lang} {c}" for c in EN]})
    _write(tmp_path / f"{lang}_zeroshot_classification_templates.json", {"imagenet1k": ["{c}"]})
  parts = imagenet_folder.read(str(tmp_path), None, print)
  model = _Model({f"{l} {c}": np.ones(2) for l in ("en", "de") for c in EN}, {n: np.ones(2) for n in truth})
  rows = set_parts.score("imagenet_folder", parts, model, print)
  assert model.image_calls == 1 and {r["language"] for r in rows} == {"en", "de"}
  assert all(r["value"] == 0 for r in rows if r["metric"] == "acc1")  # Every class ties: none is ever first.


@pytest.mark.parametrize("case, message", [
    ("empty", r"has no class subfolders \(expected one subfolder of images per class"),
    ("no images", r"n04 holds no image \(\.jpg.*every class subfolder needs its images"),
    ("missing names", r"en_classnames.json: 5 class names for the 6 class subfolders of .* \(expected one name per "),
    ("missing in dict", r"en_classnames.json: no class name for 1 of the 6 class subfolders of .*, e.g. 'n06'"),
    ("unknown language", r"imagenet_classnames.json: 'imagenet' is not a language code \(expected <lang>_classnames"),
    ("no templates", r"de_classnames.json: no de_zeroshot_classification_templates.json beside it"),
    ("no placeholder", r"en_zeroshot_classification_templates.json: expected a non-empty list of templates, each "
                       r"with a \{c\} or \{\} for the class name; got 'a photo'"),
    ("entries", r"en_classnames.json: entries \['a', 'b'\]: expected 'imagenet1k' or a single dataset's entry"),
    ("not json", r"en_classnames.json: not JSON: "),
    ("images flag", r"imagenet_folder: its images are the folder's own \(--images is not used\)"),
])
def test_bad_input_is_one_line_naming_the_file(tmp_path, case, message):
  folder = tmp_path / "val"
  if case == "empty":
    folder.mkdir()
  else:
    _folder(folder)
  names = tmp_path / "val" / "en_classnames.json"
  if case == "no images":
    for f in (folder / "n04").rglob("*.JPEG"):
      f.unlink()
  elif case == "missing names":
    _write(names, {"imagenet1k": EN[:5]})
  elif case == "missing in dict":
    _write(names, {"imagenet1k": {s: s for s in SUBFOLDERS[:5]}})
  elif case == "unknown language":
    _write(tmp_path / "val" / "imagenet_classnames.json", {"imagenet1k": EN})
  elif case == "no templates":
    _write(tmp_path / "val" / "de_classnames.json", {"imagenet1k": EN})
  elif case == "no placeholder":
    _write(tmp_path / "val" / "en_zeroshot_classification_templates.json", {"imagenet1k": ["a photo", "{c}"]})
  elif case == "entries":
    _write(names, {"a": EN, "b": EN})
  elif case == "not json":
    names.write_text("{")
  with pytest.raises(ValueError, match=message) as e:
    imagenet_folder.read(str(folder), str(tmp_path) if case == "images flag" else None, print)
  assert "\n" not in str(e.value)


def test_the_builtin_set_classifies_shape_and_colour_in_every_grammars_words():
  parts = public_sets.SETS["builtin"].read("", None, print)
  langs = list(synthetic_grammars.LANGUAGES)
  assert [(p.split, p.language) for p in parts] == [(s, l) for s in ("shape", "colour") for l in langs]
  shape = {p.language: p for p in parts if p.split == "shape"}
  colour = {p.language: p for p in parts if p.split == "colour"}
  assert shape["en"].classes == ["circle", "square", "triangle", "star", "heart", "cross"]
  assert colour["en"].classes == ["red", "green", "blue", "yellow", "white", "black", "purple", "orange"]
  # Each class's prompts: the grammar's captions of its one-object scenes, other attributes varied.
  assert len(shape["en"].prompts[0]) == 8 * 2 * 2 and len(colour["en"].prompts[0]) == 6 * 2 * 2
  assert "a small red circle" in shape["en"].prompts[0] and "There is a large blue star." in colour["en"].prompts[2]
  assert all("circle" in p for p in shape["en"].prompts[0]) and all("red" in p for p in colour["en"].prompts[0])
  assert "ein kleiner roter Kreis" in shape["de"].prompts[0] and "Il y a une petite étoile verte." in colour["fr"].prompts[1]
  for p in parts:  # No prompt names two classes.
    flat = [t for ps in p.prompts for t in ps]
    assert len(flat) == len(set(flat)), (p.split, p.language)
  images, labels = shape["en"].images, shape["en"].labels
  assert len(images) == 96 * builtin.RENDERS and all(p.images is images for p in parts)
  assert np.bincount(labels).tolist() == [32] * 6 and np.bincount(colour["en"].labels).tolist() == [24] * 8
  first = np.asarray(Image.open(io.BytesIO(images[0])))
  assert first.shape == (64, 64, 3) and not np.array_equal(first, np.asarray(Image.open(io.BytesIO(images[1]))))
  assert [p.language for p in builtin.read(" en, de ", None, print)] == ["en", "de", "en", "de"]
  with pytest.raises(ValueError, match=r"^builtin: 'xx' is not a language of the built-in grammars: expected '' "
                                       r"\(all\) or a comma-separated list of en, de,"):
    builtin.read("en,xx", None, print)
  with pytest.raises(ValueError, match=r"builtin: renders its own images"):
    builtin.read("", "/data", print)
