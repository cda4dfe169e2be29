"""Crisscrossed Captions on its release's layout, built here: what the reader makes of the CSVs and
Karpathy's split file, every metric against a float64 brute force (ranks with ties) and SciPy's
Spearman, the printed table, and bad input as one line naming the file."""

import csv
import json

import numpy as np
import pytest
from scipy import stats

from mural import metrics
from mural import public_sets
from mural.public_sets import cxc
from mural.public_sets import parts as set_parts
from mural.public_sets import report

IMAGES, PER_IMAGE = 6, 3


def _name(i):
  return f"COCO_val2014_{500 + i:012d}.jpg"


def _sentid(i, j):
  return 7000 + 10 * i + j  # Not the caption's index: the reader must map it.


def _cid(i, j):
  return f"COCO_val2014:sentid:{_sentid(i, j)}"


# (image, caption) pairs of each file, with their ratings; captions are (image, j).
STS = [((0, 0), (0, 1), 4.2), ((0, 0), (1, 2), 3.0), ((1, 0), (1, 1), 2.9), ((2, 1), (3, 0), 3.5),
       ((3, 2), (3, 0), 1.0), ((4, 0), (5, 1), 4.2), ((5, 2), (5, 0), 0.0), ((0, 0), (2, 2), 2.0)]
SIS = [(0, 1, 2.5), (0, 2, 1.0), (2, 3, 4.0), (4, 5, 2.4), (5, 0, 3.3), (1, 4, 0.0), (3, 1, 2.5)]
SITS = [((0, 0), 0, 4.8), ((0, 1), 3, 3.0), ((1, 2), 4, 2.9), ((2, 0), 2, 2.0), ((3, 1), 5, 4.0),
        ((4, 2), 1, 3.1), ((5, 0), 5, 5.0), ((2, 2), 0, 1.0)]


def _write(path, header, rows):
  with open(path, "w", newline="", encoding="utf-8") as f:
    writer = csv.writer(f)
    writer.writerow(header)
    writer.writerows(rows)


def _release(root):
  """CxC's repository layout (data/*_test.csv) with Karpathy's dataset_coco.json beside data/, and
  the COCO images folder (val2014/)."""
  (root / "cxc" / "data").mkdir(parents=True)
  coco = root / "coco" / "val2014"
  coco.mkdir(parents=True)
  records = [{"filepath": "val2014", "filename": "COCO_val2014_000000000001.jpg", "split": "train",
              "sentences": [{"raw": "a training caption", "sentid": 1}]}]
  for i in range(IMAGES):
    (coco / _name(i)).write_bytes(b"\xff\xd8\xff")
    records.append({"filepath": "val2014", "filename": _name(i), "split": "test",
                    "sentences": [{"raw": f" image {i} caption {j} ", "sentid": _sentid(i, j)}
                                  for j in range(PER_IMAGE)]})
  records.append({"filepath": "val2014", "filename": "COCO_val2014_000000000002.jpg", "split": "val",
                  "sentences": [{"raw": "a val caption", "sentid": 2}]})
  (root / "cxc" / "dataset_coco.json").write_text(json.dumps({"images": records}))
  data = root / "cxc" / "data"
  _write(data / "sts_test.csv", cxc.COLUMNS["sts"], [[_cid(*a), _cid(*b), s, "c2c_isim"] for a, b, s in STS])
  _write(data / "sis_test.csv", cxc.COLUMNS["sis"], [[_name(a), _name(b), s, "i2i_csim"] for a, b, s in SIS])
  _write(data / "sits_test.csv", cxc.COLUMNS["sits"], [[_cid(*c), _name(i), s, "c2i_intrasim"] for c, i, s in SITS])
  return str(root / "cxc"), str(root / "coco")


class FakeModel:
  """Fixed random vectors per caption and per image file, coarse enough for ties."""

  def __init__(self, seed=0):
    self.rng, self.vectors = np.random.default_rng(seed), {}

  def _vector(self, key):
    if key not in self.vectors:
      self.vectors[key] = self.rng.normal(size=4).round(1)
    return self.vectors[key]

  def embed_texts(self, texts, langs):
    assert set(langs) == {"en"}
    return np.stack([self._vector(("text", t)) for t in texts])

  def embed_images(self, paths):
    return np.stack([self._vector(("image", p)) for p in paths])


def _ranks(sim, positives, same):
  """Brute force: for each query with a positive, how many non-positive candidates (not itself)
  score at least its best positive."""
  out = []
  for q in range(sim.shape[0]):
    mine = {c for c in positives.get(q, ()) if not (same and c == q)}
    if mine:
      best = max(sim[q, c] for c in mine)
      out.append(sum(1 for c in range(sim.shape[1])
                     if c not in mine and not (same and c == q) and sim[q, c] >= best))
  return np.array(out)


def _check(got, prefix, ranks):
  for k in (1, 5, 10):
    assert got[f"{prefix}_recall@{k}"] == pytest.approx(np.mean(ranks < k))
  assert got[f"{prefix}_mean_rank"] == pytest.approx(np.mean(ranks + 1.0))


def test_reads_the_release_and_scores_every_metric_as_a_brute_force(tmp_path, monkeypatch):
  monkeypatch.setattr(metrics, "BLOCK_ELEMENTS", 40)  # Retrieval over blocks of a few queries.
  folder, images = _release(tmp_path)
  parts = public_sets.SETS["cxc"].read(folder, images, print)
  assert [p.split for p in parts] == ["test/image-text", "test/text-text", "test/image-image", "test/similarity"]
  caption = lambda i, j: PER_IMAGE * i + j  # Karpathy's order: image by image.
  assert parts[0].images == [f"{images}/val2014/{_name(i)}" for i in range(IMAGES)]
  assert parts[0].captions[caption(2, 1)] == "image 2 caption 1"
  model = FakeModel()
  rows = set_parts.score("cxc", parts, model, lambda line: None)
  got = {}
  for r in rows:
    assert r["language"] == "en"
    got.setdefault(r["split"], {})[r["metric"]] = r["value"]
  texts = model.embed_texts(parts[0].captions, ["en"] * len(parts[0].captions)).astype(np.float64)
  pics = model.embed_images(parts[0].images).astype(np.float64)

  # image<->text: each caption's own image, and SITS pairs rated at least 3.
  t2i = {caption(i, j): {i} for i in range(IMAGES) for j in range(PER_IMAGE)}
  for (i, j), image, s in SITS:
    if s >= 3:
      t2i[caption(i, j)].add(image)
  i2t = {}
  for c, found in t2i.items():
    for image in found:
      i2t.setdefault(image, set()).add(c)
  _check(got["test/image-text"], "image_retrieval", _ranks(texts @ pics.T, t2i, False))
  _check(got["test/image-text"], "text_retrieval", _ranks(pics @ texts.T, i2t, False))

  # text->text: STS pairs rated at least 3, both ways; image->image: SIS pairs at least 2.5.
  t2t, i2i = {}, {}
  for a, b, s in STS:
    if s >= 3:
      t2t.setdefault(caption(*a), set()).add(caption(*b))
      t2t.setdefault(caption(*b), set()).add(caption(*a))
  for a, b, s in SIS:
    if s >= 2.5:
      i2i.setdefault(a, set()).add(b)
      i2i.setdefault(b, set()).add(a)
  _check(got["test/text-text"], "text_to_text", _ranks(texts @ texts.T, t2t, True))
  _check(got["test/image-image"], "image_to_image", _ranks(pics @ pics.T, i2i, True))

  # Correlations: SciPy's Spearman over all pairs, and over each resample of one pair per item.
  files = {"sts": ([texts[caption(*a)] @ texts[caption(*b)] for a, b, _ in STS], [s for *_, s in STS],
                   [caption(*a) for a, _, _ in STS]),
           "sis": ([pics[a] @ pics[b] for a, b, _ in SIS], [s for *_, s in SIS], [a for a, _, _ in SIS]),
           "sits": ([texts[caption(*c)] @ pics[i] for c, i, _ in SITS], [s for *_, s in SITS],
                    [i for _, i, _ in SITS])}
  similarity = got["test/similarity"]
  for kind, (model_scores, human, groups) in files.items():
    model_scores, human, groups = np.array(model_scores), np.array(human), np.array(groups)
    assert similarity[f"{kind}_spearman_all_pairs"] == pytest.approx(stats.spearmanr(model_scores, human)[0])
    draws = cxc.resample_draws(groups)
    assert draws.shape == (cxc.RESAMPLES, len(set(groups.tolist())))
    assert all(sorted(groups[d].tolist()) == sorted(set(groups.tolist())) for d in draws)  # One per item.
    rhos = [stats.spearmanr(model_scores[d], human[d])[0] for d in draws]
    assert similarity[f"{kind}_spearman"] == pytest.approx(np.mean(rhos))
    assert similarity[f"{kind}_spearman_std"] == pytest.approx(np.std(rhos))

  printed = report.table("cxc", public_sets.SETS["cxc"], rows)
  assert "cxc test/text-text" in printed and "t2t R@1" in printed and "STS std" in printed
  assert "MURAL-BASE fine-tuned (paper)" in printed and "beside the paper's" in printed


def test_spearman_and_ranks_match_scipy_with_ties():
  rng = np.random.default_rng(1)
  x, y = rng.integers(0, 4, 50).astype(float), rng.normal(size=50).round(0)
  np.testing.assert_allclose(cxc.average_ranks(x), stats.rankdata(x))
  assert cxc.spearman(x, y) == pytest.approx(stats.spearmanr(x, y)[0])
  assert np.isnan(cxc.spearman(np.ones(5), np.arange(5.0)))


def test_bad_input_is_one_line_naming_the_file(tmp_path):
  folder, images = _release(tmp_path)
  read = public_sets.SETS["cxc"].read
  with pytest.raises(ValueError, match=r"needs the COCO 2014 images folder"):
    read(folder, None, print)
  data = tmp_path / "cxc" / "data"
  sts = (data / "sts_test.csv").read_text()
  (data / "sts_test.csv").write_text(sts + f"{_cid(0, 0)},COCO_val2014:sentid:99999,3.0,c2c_isim\n")
  with pytest.raises(ValueError, match=r"sts_test.csv line 10: caption2 'COCO_val2014:sentid:99999' is not a "
                                       r"caption .* of Karpathy's test split in .*dataset_coco.json"):
    read(folder, images, print)
  (data / "sts_test.csv").write_text(sts.replace("caption1", "first"))
  with pytest.raises(ValueError, match=r"sts_test.csv starts first,caption2.*expected the columns caption1,"):
    read(folder, images, print)
  (data / "sts_test.csv").write_text(sts)
  sis = (data / "sis_test.csv").read_text()
  (data / "sis_test.csv").write_text(sis + f"{_name(0)},COCO_val2014_000000000001.jpg,3.0,i2i_csim\n")
  with pytest.raises(ValueError, match=r"sis_test.csv line 9: image2 'COCO_val2014_000000000001.jpg' is not an "
                                       r"image filename"):
    read(folder, images, print)
  (data / "sis_test.csv").unlink()
  with pytest.raises(ValueError, match=r"^cxc: no .*data/sis_test.csv \(the release's data/sis_test.csv: "
                                       r"image1,image2,agg_score,sampling_method\)$"):
    read(folder, images, print)
  (data / "sis_test.csv").write_text(sis)
  (tmp_path / "coco" / "val2014" / _name(3)).unlink()
  with pytest.raises(ValueError, match=rf"1 of its {IMAGES} image files are missing .*{_name(3)}"):
    read(folder, images, print)
  (tmp_path / "cxc" / "dataset_coco.json").unlink()
  with pytest.raises(ValueError, match=r"no .*dataset_coco.json: Karpathy's dataset_coco.json is expected beside"):
    read(folder, images, print)
