"""The public sets' readers on their releases' layouts, built here: what they read, and bad input
as one line naming the file (nothing scored on part of a set); the scoring's figures against a
NumPy float64 brute force with ties. (tests/test_export.py scores an export end to end.)"""

import gzip

import numpy as np
import pytest

from mural import public_sets
from mural.public_sets import mscoco
from mural.public_sets import parts as set_parts
from mural.data import xtd


def _xtd_release(root, n=6, langs=("en", "jp")):
  (root / "XTD10").mkdir(parents=True)
  (root / "STAIR").mkdir()
  names = [f"COCO_train2014_{i:012d}.jpg" for i in range(n)]
  (root / "XTD10" / "test_image_names.txt").write_text("".join(f"{m}\n" for m in names))
  for lang in langs:
    folder = "STAIR" if lang == "jp" else "XTD10"
    (root / folder / f"test_1kcaptions_{lang}.txt").write_text("".join(f"{lang} caption {i}\n" for i in range(n)))
  coco = root / "coco" / "train2014"
  coco.mkdir(parents=True)
  for m in names:
    (coco / m).write_bytes(b"\xff\xd8\xff")
  return names


def test_xtd_reads_the_release_and_says_what_is_missing(tmp_path):
  names = _xtd_release(tmp_path)
  data = xtd.read(str(tmp_path), str(tmp_path / "coco"))
  assert sorted(data.captions) == ["en", "ja"]  # The release's 'jp' is Japanese.
  assert data.images == [str(tmp_path / "coco" / "train2014" / m) for m in names]
  assert data.captions["ja"][2] == "jp caption 2"
  flat = tmp_path / "flat"  # COCO's images all in one folder.
  flat.mkdir()
  for m in names:
    (tmp_path / "coco" / "train2014" / m).rename(flat / m)
  assert xtd.read(str(tmp_path), str(flat)).images == [str(flat / m) for m in names]
  for m in names:
    (flat / m).rename(tmp_path / "coco" / "train2014" / m)
  (tmp_path / "coco" / "train2014" / names[3]).unlink()
  with pytest.raises(ValueError, match=rf"^XTD10: 1 of its 6 images are not in .*e\.g\. {names[3]}"):
    xtd.read(str(tmp_path), str(tmp_path / "coco"))
  (tmp_path / "XTD10" / "test_1kcaptions_en.txt").write_text("one\ntwo\n")
  with pytest.raises(ValueError, match=r"test_1kcaptions_en.txt has 2 captions for the 6 images"):
    xtd.read(str(tmp_path), str(tmp_path / "coco"))
  with pytest.raises(ValueError, match=r"no test_image_names.txt under"):
    xtd.read(str(tmp_path / "coco"), str(tmp_path / "coco"))
  with pytest.raises(ValueError, match=r"needs the COCO 2014 images folder"):
    public_sets.SETS["xtd10"].read(str(tmp_path), None, print)


def test_multi30k_reads_every_released_test_split_it_finds(tmp_path):
  root = tmp_path / "multi30k"
  (root / "task1" / "image_splits").mkdir(parents=True)
  (root / "task1" / "raw").mkdir()
  for split, langs in (("test_2016_flickr", ("en", "de", "fr", "cs")), ("test_2017_mscoco", ("en", "de", "fr"))):
    (root / "task1" / "image_splits" / f"{split}.txt").write_text("a.jpg\nb.jpg\n")
    for lang in langs:
      with gzip.open(root / "task1" / "raw" / f"{split}.{lang}.gz", "wt") as f:
        f.write(f"{lang} one\n{lang} two\n")
  lines = []
  parts = public_sets.SETS["multi30k"].read(str(root), None, lines.append)
  assert [(p.split, p.right_language) for p in parts] == [
      ("test_2016_flickr", "de"), ("test_2016_flickr", "fr"), ("test_2016_flickr", "cs"),
      ("test_2017_mscoco", "de"), ("test_2017_mscoco", "fr")]
  assert any("test_2017_flickr: not in" in line for line in lines)
  images = tmp_path / "flickr"
  images.mkdir()
  (images / "a.jpg").write_bytes(b"x")
  (images / "b.jpg").write_bytes(b"x")
  parts = public_sets.SETS["multi30k"].read(str(root), str(images), lines.append)
  retrieval = [p for p in parts if isinstance(p, set_parts.Retrieval)]
  assert [(p.split, p.language) for p in retrieval] == [("test_2016_flickr", l) for l in ("en", "de", "fr", "cs")] + [
      ("test_2017_mscoco", l) for l in ("en", "de", "fr")]
  (images / "b.jpg").unlink()
  lines.clear()
  parts = public_sets.SETS["multi30k"].read(str(root), str(images), lines.append)
  assert not any(isinstance(p, set_parts.Retrieval) for p in parts)
  assert any("image-text retrieval skipped" in line and "1 of its 2 image files are missing" in line
             for line in lines)


def test_scores_equal_a_float64_brute_force_with_ties():
  rng = np.random.default_rng(0)
  texts = rng.normal(size=(9, 4)).round(1)  # Coarse values: ties happen.
  images = np.concatenate([rng.normal(size=(5, 4)).round(1), texts[:1]])  # A tie at the top too.
  t2i = rng.integers(0, images.shape[0], texts.shape[0])
  got = set_parts.retrieval_rows(texts, images, t2i)
  sim = texts @ images.T
  t2i_rank = [sum(sim[i, j] >= sim[i, t2i[i]] for j in range(6) if j != t2i[i]) for i in range(9)]
  i2t_rank = []
  for j in range(6):
    mine = [i for i in range(9) if t2i[i] == j]
    if mine:
      best = max(sim[i, j] for i in mine)
      i2t_rank.append(sum(sim[i, j] >= best for i in range(9) if t2i[i] != j))
  for k in (1, 5, 10):
    assert got[f"image_retrieval_recall@{k}"] == pytest.approx(np.mean(np.array(t2i_rank) < k))
    assert got[f"text_retrieval_recall@{k}"] == pytest.approx(np.mean(np.array(i2t_rank) < k))
  left, right = rng.normal(size=(7, 3)), rng.normal(size=(7, 3))
  got = set_parts.translation_rows(left, right)
  sim = left @ right.T
  assert got["translation_accuracy_l2r"] == pytest.approx(np.mean([np.argmax(sim[i]) == i for i in range(7)]))
  assert got["translation_accuracy_r2l"] == pytest.approx(np.mean([np.argmax(sim[:, i]) == i for i in range(7)]))


def test_mscoco_reads_karpathys_test_split_with_stair_and_scores_1k_as_the_mean_of_5_folds(tmp_path):
  """dataset_coco.json's test images (10 here: 5 folds of 2), 2 English captions each, STAIR's
  Japanese beside it; the 1k rows are the folds' means."""
  import json  # pylint: disable=g-import-not-at-top
  images, stair = [], {"annotations": []}
  coco = tmp_path / "coco" / "val2014"
  coco.mkdir(parents=True)
  for i in range(10):
    name = f"COCO_val2014_{1000 + i:012d}.jpg"
    (coco / name).write_bytes(b"x")
    images.append({"filepath": "val2014", "filename": name, "split": "test",
                   "sentences": [{"raw": f"image {i} caption {j}"} for j in range(2)]})
    stair["annotations"] += [{"image_id": 1000 + i, "caption": f"画像 {i}"}]
  images.append({"filepath": "val2014", "filename": "COCO_val2014_000000000001.jpg", "split": "train",
                 "sentences": [{"raw": "not a test image"}]})
  (tmp_path / "dataset_coco.json").write_text(json.dumps({"images": images}))
  (tmp_path / mscoco.STAIR_FILE).write_text(json.dumps(stair, ensure_ascii=False))
  parts = public_sets.SETS["mscoco"].read(str(tmp_path), str(tmp_path / "coco"), print)
  by = {(p.split, p.language): p for p in parts}
  assert sorted(by) == sorted([(s, l) for s in ["5k"] + [f"1k/fold{k}" for k in range(5)] for l in ("en", "ja")])
  assert len(by["5k", "en"].images) == 10 and len(by["5k", "en"].captions) == 20
  fold = by["1k/fold3", "en"]
  assert fold.captions == [f"image {i} caption {j}" for i in (6, 7) for j in range(2)]
  np.testing.assert_array_equal(fold.text_to_image, [0, 0, 1, 1])
  assert by["1k/fold3", "ja"].captions == ["画像 6", "画像 7"]
  rows = [dict(dataset="mscoco", split=f"1k/fold{k}", language="en", task="t", metric="m", value=float(k))
          for k in range(5)]
  assert set_parts.fold_means(rows) == [dict(dataset="mscoco", split="1k", language="en", task="t",
                                               metric="m", value=2.0)]
  (coco / images[4]["filename"]).unlink()
  with pytest.raises(ValueError, match=r"1 of its 10 image files are missing"):
    public_sets.SETS["mscoco"].read(str(tmp_path), str(tmp_path / "coco"), print)


def _coco_cn_release(root, coco):
  """Karpathy's split file with 5 test images (val2014) and COCO-CN's release unpacked beside it:
  its test split of 3 images (train2014 and val2014), sentences keyed <id>#<k>, out of order."""
  import json  # pylint: disable=g-import-not-at-top
  images = []
  for i in range(5):
    name = f"COCO_val2014_{2000 + i:012d}.jpg"
    (coco / "val2014").mkdir(parents=True, exist_ok=True)
    (coco / "val2014" / name).write_bytes(b"x")
    images.append({"filepath": "val2014", "filename": name, "split": "test", "sentences": [{"raw": f"image {i}"}]})
  (root / "dataset_coco.json").write_text(json.dumps({"images": images}))
  release = root / "coco-cn-version1805v1.1"
  release.mkdir()
  ids = ["COCO_train2014_000000000009", "COCO_val2014_000000000007", "COCO_train2014_000000000008"]
  (release / "coco-cn_test.txt").write_text("".join(f"{i}\n" for i in ids))
  (release / "coco-cn_train.txt").write_text("COCO_train2014_000000000001\n")
  (release / "imageid.human-written-caption.txt").write_text(
      "COCO_train2014_000000000001#0\t训练图片\n"
      f"{ids[0]}#1\t第二句\n{ids[0]}#0\t第一句\n{ids[1]}#0\t一只猫\n{ids[2]}#0\t两只狗\n", encoding="utf-8")
  (coco / "train2014").mkdir()
  for i in ids:
    (coco / i.split("_")[1] / f"{i}.jpg").write_bytes(b"x")
  return release, ids


def test_mscoco_scores_chinese_on_coco_cns_own_test_split_when_its_release_is_beside(tmp_path):
  from mural.public_sets import report  # pylint: disable=g-import-not-at-top
  coco = tmp_path / "coco"
  lines = []
  release, ids = _coco_cn_release(tmp_path, coco)
  parts = public_sets.SETS["mscoco"].read(str(tmp_path), str(coco), lines.append)
  zh = [p for p in parts if p.language == "zh"]
  assert [p.split for p in zh] == ["coco-cn_test"]
  assert zh[0].images == [str(coco / i.split("_")[1] / f"{i}.jpg") for i in ids]
  assert zh[0].captions == ["第一句", "第二句", "一只猫", "两只狗"]  # Each image's sentences by <k>.
  np.testing.assert_array_equal(zh[0].text_to_image, [0, 0, 1, 2])
  rows = [dict(dataset="mscoco", split="coco-cn_test", language="zh", task="zeroshot_retrieval",
               metric="mean_recall", value=0.5)]
  assert "(paper)" not in report.table("mscoco", public_sets.SETS["mscoco"], rows)  # MURAL has no COCO-CN figure.
  captions = release / "imageid.human-written-caption.txt"
  text = captions.read_text(encoding="utf-8")
  captions.write_text(text.replace(f"{ids[1]}#0\t一只猫\n", ""), encoding="utf-8")
  with pytest.raises(ValueError, match=rf"human-written-caption.txt has no sentence for 1 of the 3 images of "
                                       rf".*coco-cn_test.txt, e\.g\. {ids[1]}"):
    public_sets.SETS["mscoco"].read(str(tmp_path), str(coco), lines.append)
  captions.write_text(text.replace("#0\t一只猫", " 一只猫"), encoding="utf-8")
  with pytest.raises(ValueError, match=r"human-written-caption.txt line 4 is not '<image id>#<k>\\t<sentence>'"):
    public_sets.SETS["mscoco"].read(str(tmp_path), str(coco), lines.append)
  captions.write_text(text, encoding="utf-8")
  (coco / "train2014" / f"{ids[2]}.jpg").unlink()
  with pytest.raises(ValueError, match=rf"COCO-CN .*split 'test': 1 of its 3 image files are missing, "
                                       rf"e\.g\. .*train2014/{ids[2]}\.jpg"):
    public_sets.SETS["mscoco"].read(str(tmp_path), str(coco), lines.append)
  captions.unlink()
  with pytest.raises(ValueError, match=r"COCO-CN: .*imageid.human-written-caption.txt does not exist"):
    public_sets.SETS["mscoco"].read(str(tmp_path), str(coco), lines.append)
  (release / "coco-cn_test.txt").unlink()
  parts = public_sets.SETS["mscoco"].read(str(tmp_path), str(coco), lines.append)
  assert not any(p.language == "zh" for p in parts)
  assert any("no coco-cn_test.txt in" in line and "no Chinese (COCO-CN)" in line for line in lines)
