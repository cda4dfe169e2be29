"""WIT's evaluation splits from TSVs in the release's layout (gzipped, WIT's 17-column header),
written here: the rule (deterministic whatever the file order or split into files, images disjoint,
sizes), the 'wit' set reading them with an img2dataset files output, and bad input as one line."""

import csv
import gzip
import hashlib
import json
import os
import random

import numpy as np
import pytest

from mural import public_sets
from mural.data import img2dataset_files
from mural.data import wit_splits
from mural.public_sets import parts as set_parts
from mural.public_sets import report

SIZES = (8, 4, 2)  # The rule's sizes scaled down: 5000/3000/1000 need tens of thousands of rows.


def _row(lang, url, caption):
  row = dict.fromkeys(wit_splits.COLUMNS, "")
  row.update(language=lang, page_url=f"https://{lang}.wikipedia.org/wiki/P", image_url=url,
             caption_reference_description=caption, mime_type="image/jpeg", original_height="10",
             original_width="10", is_main_image="false", attribution_passes_lang_id="true",
             page_changed_recently="true", context_page_description="A page,\twith a tab and \"quotes\".")
  return [row[c] for c in wit_splits.COLUMNS]


def _rows():
  """en: 40 images (some captioned twice, on two pages), one only without a reference
  description; war: 9; ga: 3 (too few); and a language not asked for."""
  rows = []
  for i in range(40):
    rows.append(_row("en", f"https://upload.wikimedia.org/en/{i}.jpg", f"English caption {i}"))
    if i % 3 == 0:
      rows.append(_row("en", f"https://upload.wikimedia.org/en/{i}.jpg", f"Another caption {i}"))
  rows.append(_row("en", "https://upload.wikimedia.org/en/uncaptioned.jpg", "  "))
  rows += [_row("war", f"https://upload.wikimedia.org/war/{i}.jpg", f"Waray {i}") for i in range(9)]
  rows += [_row("ga", f"https://upload.wikimedia.org/ga/{i}.jpg", f"Gaeilge {i}") for i in range(3)]
  rows += [_row("xx", f"https://upload.wikimedia.org/xx/{i}.jpg", f"xx {i}") for i in range(20)]
  return rows


def _tsv(path, rows, header=wit_splits.COLUMNS):
  with gzip.open(path, "wt", encoding="utf-8", newline="") as f:
    writer = csv.writer(f, delimiter="\t", lineterminator="\n")
    writer.writerow(header)
    writer.writerows(rows)
  return str(path)


def _sha(text):
  return hashlib.sha256(text.encode()).hexdigest()


def _write(tmp_path, name="splits", files=2, processes=1, seed=0):
  rows = _rows()
  random.Random(seed).shuffle(rows)
  tsv = [_tsv(tmp_path / f"{name}-{k:05d}-of-{files:05d}.tsv.gz", rows[k::files]) for k in range(files)]
  out = str(tmp_path / name)
  manifest = wit_splits.write(tsv, out, ["en", "war", "ga"], SIZES, processes, log=lambda line: None)
  return out, manifest


def test_the_rule_ranks_images_by_sha256_of_the_url_whatever_the_files(tmp_path):
  out, manifest = _write(tmp_path)
  assert manifest["languages"] == {"en": {"images": 40, "size": 8}, "war": {"images": 9, "size": 2}}
  assert "ga" in manifest["skipped"]  # 3 images: fewer than 4 x 2.
  splits = {s: wit_splits.read_split(out, s) for s in ("test", "val")}
  en_urls = sorted((f"https://upload.wikimedia.org/en/{i}.jpg" for i in range(40)), key=_sha)
  assert [u for u, _ in splits["test"]["en"]] == en_urls[:8]
  assert [u for u, _ in splits["val"]["en"]] == en_urls[8:16]
  for url, caption in splits["test"]["en"] + splits["val"]["en"]:
    i = int(os.path.basename(url).split(".")[0])
    candidates = [f"English caption {i}"] + ([f"Another caption {i}"] if i % 3 == 0 else [])
    assert caption == min(candidates, key=_sha)  # One pair per image: its lowest-sha256 caption.
  for lang in ("en", "war"):
    test, val = ({u for u, _ in splits[s][lang]} for s in ("test", "val"))
    assert not test & val and len(test) == len(val) == manifest["languages"][lang]["size"]
  with open(os.path.join(out, wit_splits.TEST_URLS), encoding="utf-8") as f:
    assert f.read().split() == [u for lang in ("en", "war") for u, _ in splits["test"][lang]]
  # Another order of rows, over three files read by two processes: the same split, byte for byte.
  again, _ = _write(tmp_path, "again", files=3, processes=2, seed=1)
  for name in ("en.test.jsonl", "en.val.jsonl", "war.test.jsonl", wit_splits.TEST_URLS):
    with open(os.path.join(out, name), "rb") as f, open(os.path.join(again, name), "rb") as g:
      assert f.read() == g.read(), name


def test_sizes_leave_half_of_a_language_for_training():
  assert wit_splits.size_for(10 ** 6) == 5000
  assert wit_splits.size_for(19_999) == 3000 and wit_splits.size_for(12_000) == 3000
  assert wit_splits.size_for(11_999) == 1000 and wit_splits.size_for(4000) == 1000
  assert wit_splits.size_for(3999) == 0


def test_bad_tsvs_are_one_line_naming_the_file(tmp_path):
  bad = _tsv(tmp_path / "header.tsv.gz", [], header=wit_splits.COLUMNS[:-1])
  with pytest.raises(ValueError, match=r"header.tsv.gz: its header is not WIT's 17 columns"):
    wit_splits.write([bad], str(tmp_path / "out"), sizes=SIZES)
  short = _tsv(tmp_path / "short.tsv.gz", [_row("en", f"u{i}", "c") for i in range(8)] + [_row("en", "v", "d")[:5]])
  lines = []
  manifest = wit_splits.write([short], str(tmp_path / "out"), ["en"], SIZES, log=lines.append)
  assert manifest["malformed_rows"] == {"short.tsv.gz": 1} and manifest["languages"]["en"]["images"] == 8
  assert any("short.tsv.gz: done" in line and "1 rows without 17 fields skipped" in line for line in lines)
  (tmp_path / "plain.tsv.gz").write_text("not gzip")
  with pytest.raises(ValueError, match=r"plain.tsv.gz: not a readable WIT TSV"):
    wit_splits.write([str(tmp_path / "plain.tsv.gz")], str(tmp_path / "out"), sizes=SIZES)
  with pytest.raises(ValueError, match=r"absent.tsv.gz does not exist"):
    wit_splits.write([str(tmp_path / "absent.tsv.gz")], str(tmp_path / "out"))
  assert wit_splits.main([f"--tsv={tmp_path}/absent-*.tsv.gz", f"--out={tmp_path}/out"]) == 1


def test_written_splits_are_checked_when_read(tmp_path):
  with pytest.raises(ValueError, match=r"no manifest.json in .*python -m mural.data.wit_splits"):
    wit_splits.read_split(str(tmp_path))
  out, _ = _write(tmp_path)
  path = os.path.join(out, "war.test.jsonl")
  with open(path, encoding="utf-8") as f:
    first = f.readline()
  with open(path, "w", encoding="utf-8") as f:
    f.write(first)
  with pytest.raises(ValueError, match=r"war.test.jsonl: 1 pairs of 1 images; manifest.json says 2 pairs"):
    wit_splits.read_split(out)
  os.remove(path)
  with pytest.raises(ValueError, match=r"war.test.jsonl is missing \(manifest.json lists war with 2 pairs\)"):
    wit_splits.read_split(out)


def _files_output(folder, urls):
  """img2dataset's --output_format=files layout: <shard>/<key>.jpg, .txt, .json; parquet and stats beside."""
  for shard in range(2):
    os.makedirs(os.path.join(folder, f"{shard:05d}"))
    with open(os.path.join(folder, f"{shard:05d}.parquet"), "wb") as f:
      f.write(b"PAR1")
    with open(os.path.join(folder, f"{shard:05d}_stats.json"), "w", encoding="utf-8") as f:
      json.dump({"count": len(urls)}, f)
  for n, url in enumerate(urls):
    stem = os.path.join(folder, f"{n % 2:05d}", f"{n:09d}")
    with open(stem + ".jpg", "wb") as f:
      f.write(b"\xff\xd8\xff")
    with open(stem + ".json", "w", encoding="utf-8") as f:
      json.dump({"url": url, "key": f"{n:09d}", "status": "success", "caption": None}, f)


class _Fake:
  """Captions and images embed as one-hot vectors of their index in the split: retrieval is perfect."""

  def embed_texts(self, texts, langs):
    del langs
    return np.stack([np.eye(64)[int(t.split()[-1]) % 64] for t in texts])

  def embed_images(self, paths):
    return np.stack([np.eye(64)[self.index[p] % 64] for p in paths])


def test_the_wit_set_scores_each_language_whole_on_its_downloaded_images(tmp_path):
  out, _ = _write(tmp_path)
  images = str(tmp_path / "images")
  with open(os.path.join(out, wit_splits.TEST_URLS), encoding="utf-8") as f:
    urls = f.read().split()
  _files_output(images, urls + ["https://upload.wikimedia.org/en/not-in-a-split.jpg"])
  lines = []
  parts = public_sets.SETS["wit"].read(out, images, lines.append)
  assert [(p.split, p.language, len(p.images)) for p in parts] == [("test", "en", 8), ("test", "war", 2)]
  by_url = img2dataset_files.files_by_url(images)
  test = wit_splits.read_split(out)
  assert parts[0].images == [by_url[u] for u, _ in test["en"]] and parts[0].captions == [c for _, c in test["en"]]
  np.testing.assert_array_equal(parts[1].text_to_image, [0, 1])
  assert any("no test split for" in line and "ga" in line for line in lines)
  model = _Fake()
  model.index = {by_url[u]: int(os.path.basename(u).split(".")[0]) for u in urls}
  rows = set_parts.score("wit", parts, model, log=lambda line: None)
  assert {(r["language"], r["value"]) for r in rows if r["metric"] == "mean_recall"} == {("en", 1.0), ("war", 1.0)}
  table = report.table("wit", public_sets.SETS["wit"], rows)
  assert "MURAL-LARGE zero-shot (paper)" in table and "MURAL-BASE fine-tuned (paper)" in table
  os.remove(by_url[test["en"][3][0]])
  with pytest.raises(ValueError, match=rf"^wit: test images not in {images} \(by url\): en 1 of 8, "
                                       rf"e\.g\. {test['en'][3][0]}; each language is scored on all"):
    public_sets.SETS["wit"].read(out, images, lines.append)
  with pytest.raises(ValueError, match=r"wit: needs its images \(--images=wit:DIR\)"):
    public_sets.SETS["wit"].read(out, None, lines.append)


def test_files_by_url_reads_what_img2datasets_writer_writes(tmp_path):
  os.environ.setdefault("NO_ALBUMENTATIONS_UPDATE", "1")
  writer = pytest.importorskip("img2dataset.writer", reason="img2dataset is in setup.py's 'test' extra")
  pa = pytest.importorskip("pyarrow")
  schema = pa.schema([("url", pa.string()), ("caption", pa.string()), ("key", pa.string()), ("status", pa.string())])
  shard = writer.FilesSampleWriter(0, str(tmp_path), True, 5, schema, "jpg")
  shard.write(b"\xff\xd8\xff", "000000000", "a", {"url": "https://a/x.jpg", "caption": "a", "key": "000000000",
                                                    "status": "success"})
  shard.write(None, "000000001", "b", {"url": "https://a/y.jpg", "caption": "b", "key": "000000001",
                                       "status": "failed_to_download"})
  shard.close()
  assert img2dataset_files.files_by_url(str(tmp_path)) == {"https://a/x.jpg": str(tmp_path / "00000" / "000000000.jpg")}
  with pytest.raises(ValueError, match=r"no downloaded image in img2dataset's files layout"):
    img2dataset_files.files_by_url(str(tmp_path / "00000"))
  with pytest.raises(ValueError, match=r"does not exist"):
    img2dataset_files.files_by_url(str(tmp_path / "absent"))
