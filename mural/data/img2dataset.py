"""img2dataset output as image-text data: webdataset `.tar` shards and TFRecords.

img2dataset (the tool most CLIP-style datasets are downloaded with) writes,
per shard NNNNN, the data plus `NNNNN.parquet` and `NNNNN_stats.json` beside
it (globs must match only the data files). Samples that failed to download
are only in the parquet.

`output_format=webdataset` -> `NNNNN.tar`, read by 'webdataset' here. A sample
is a run of consecutive members sharing a key (webdataset's rule: the member
path up to the first '.' of its base name; the rest is the extension):
  <key>.jpg   the image, named by encode_format (jpg | png | webp)
  <key>.txt   the caption, UTF-8 (absent when written without captions)
  <key>.json  metadata: url, caption, key, status, width, height, ... plus the
              `save_additional_columns` columns (e.g. a 'language' column)

`output_format=tfrecord` -> `NNNNN.tfrecord`, one tf.train.Example per sample:
bytes features `key`, `jpg` (named by encode_format), `txt`, and one feature
per metadata column (strings as bytes, None as b'', ints as int64). The
'tfrecord' source reads them as they are, with
  image_field='jpg' (or 'png' / 'webp'), caption_field='txt',
  lang='<code>' or lang_field='<column>'
(missing features give '', as for any TFRecord); there is no code for it here.
WebP is not converted there: with encode_format=webp every record counts as
not_an_image (use the tar output, or encode_format jpg / png).

Bad records ('webdataset'): a sample without an image member or with an
empty one gives image '' (missing_image); a payload that is not JPEG/PNG
passes unchanged (not_an_image) except WebP, converted to PNG; no or an empty
<key>.txt gives caption '' (empty_text); a language that is absent, null or
not a string gives lang '' (unknown_language). A tar that is damaged part way
(a truncated copy, a corrupt header or compressed stream) ends there with a
warning naming it; the sample being read comes with what was read, later
samples of that file are lost, the run goes on.
"""

import io
import itertools
import json
import logging
import re
import tarfile
import zlib
from typing import Dict, Iterator, Sequence

from PIL import Image
import tensorflow as tf

from mural.data import records

IMAGE_EXTENSIONS = ("jpg", "jpeg", "png", "webp")  # The first present is the sample's image.
_MEMBER = re.compile(r"^((?:.*/|)[^.]+)[.]([^/]*)$")  # webdataset's base_plus_ext: key, extension.
_DAMAGE = (tarfile.TarError, OSError, EOFError, zlib.error)  # What a truncated / corrupt tar raises.
_PROBE_SAMPLES = 16  # Samples of the first file checked for the configured members.


def read_samples(path: str, partial: bool = True) -> Iterator[Dict[str, bytes]]:
  """{extension (lower case): bytes} per sample of a (possibly compressed) tar, in file order.

  Damage (a truncated copy, a corrupt header or compressed stream) ends the
  file with a warning naming it; the sample being read comes with the members
  read so far (unless not `partial`), the rest of the file is lost.
  """
  sample, key, count = {}, None, 0
  try:
    with tf.io.gfile.GFile(path, "rb") as f, tarfile.open(fileobj=f, mode="r|*") as tar:
      for member in tar:
        match = _MEMBER.match(member.name)
        if not member.isfile() or not match:
          continue
        if match.group(1) != key:
          if sample:
            yield sample
            count += 1
          sample, key = {}, match.group(1)
        sample[match.group(2).lower()] = tar.extractfile(member).read()
  except _DAMAGE as e:
    logging.warning("webdataset %s: unreadable after %d samples (%s: %s); the rest of the file is skipped",
                    path, count, type(e).__name__, e)
    sample = sample if partial else {}
  if sample:
    yield sample


def _webp_to_png(data: bytes) -> bytes:
  """WebP -> PNG (the pipeline decodes JPEG/PNG only); bytes Pillow cannot read pass unchanged."""
  try:
    with Image.open(io.BytesIO(data)) as image:
      out = io.BytesIO()
      image.convert("RGB").save(out, "PNG", compress_level=1)
    return out.getvalue()
  except Exception:  # pylint: disable=broad-except  (Pillow raises many kinds for bad bytes)
    return data  # Not JPEG/PNG: the pipeline counts it as not_an_image.


def _meta_string(raw, key: str) -> str:
  """json(raw)[key] when it is a string; '' when absent, null, not a string or bad JSON."""
  try:
    value = json.loads(raw)[key]
  except (TypeError, ValueError, KeyError, IndexError):
    return ""
  return value if isinstance(value, str) else ""


def to_record(sample: Dict[str, bytes], lang: str, lang_field: str) -> Dict[str, object]:
  """One sample -> {'image', 'caption', 'lang'}; what is missing or unusable is ''."""
  ext = next((e for e in IMAGE_EXTENSIONS if e in sample), None)
  image = sample[ext] if ext else b""
  if ext == "webp" and image:
    image = _webp_to_png(image)
  caption = sample.get("txt", b"").decode("utf-8", "replace")
  return {"image": image, "caption": caption, "lang": lang or _meta_string(sample.get("json"), lang_field)}


def _check_files(files: Sequence[str], lang_field: str) -> None:
  """Every file starts like a tar (or is cut short before its first member: a warning, no records);
  the first whole samples hold an image, a .txt and lang_field."""
  nonempty = []
  for path in files:
    try:
      with tf.io.gfile.GFile(path, "rb") as f, tarfile.open(fileobj=f, mode="r|*") as tar:
        tar.next()
    except _DAMAGE as e:
      if not re.search(r"empty|truncated|end of", str(e)):  # tarfile's words for a file cut short.
        raise ValueError(f"{path} is not a readable tar file ({type(e).__name__}: {e})") from None
      logging.warning("webdataset %s: no whole first member (%s: %s)", path, type(e).__name__, e)
      continue
    nonempty.append(path)
  if not nonempty:
    return
  whole = itertools.chain.from_iterable(read_samples(path, partial=False) for path in nonempty)
  probe = list(itertools.islice(whole, _PROBE_SAMPLES))  # Damage in the first file: on to the next.
  extensions = set().union(*probe) if probe else set()
  where = f"{nonempty[0]}...: none of the first {len(probe)} samples has"
  if probe and not extensions & set(IMAGE_EXTENSIONS):
    raise ValueError(f"{where} an image member {IMAGE_EXTENSIONS}; they hold {sorted(extensions)}")
  if probe and "txt" not in extensions:
    raise ValueError(f"{where} a caption (<key>.txt); they hold {sorted(extensions)}")
  if probe and lang_field and not any(_has_key(s.get("json"), lang_field) for s in probe):
    raise ValueError(f"{where} lang_field {lang_field!r} in its <key>.json")


def _has_key(raw, key: str) -> bool:
  try:
    return key in json.loads(raw)
  except (TypeError, ValueError):
    return False


def image_text_source(source_config, split: str, process_index: int, process_count: int,
                      config=None) -> tf.data.Dataset:
  """'webdataset': tar shards as img2dataset writes them (see the module docstring).

  Fields: files (globs as for 'tfrecord'; '{split}' is replaced; '.tar.gz'
  works too), lang (a constant language code) or lang_field (a key of
  <key>.json, e.g. 'language'; a sample without it gets ''), verify_files
  (True: check each file's first header and the first samples of the first
  file when constructed), cycle_length (16 files read in parallel).

  Per sample: image = the first of <key>.jpg/.jpeg/.png/.webp ('' when none);
  WebP is converted to PNG with Pillow (lossless; one decode + a fast encode
  per image, since the pipeline decodes only JPEG/PNG), other payloads pass
  unchanged for the pipeline to count. caption = <key>.txt (invalid UTF-8
  replaced). Files are split over processes like every file source.
  """
  cfg = records.source_fields(source_config, "webdataset", dict(
      files=None, lang="", lang_field="", verify_files=True, cycle_length=16))
  if not cfg["lang"] and not cfg["lang_field"]:
    raise ValueError("data source 'webdataset': set 'lang' (a constant code) or 'lang_field' "
                     "(a key of the <key>.json metadata)")
  lang, lang_field = cfg["lang"], ("" if cfg["lang"] else cfg["lang_field"])
  files = records.list_files(cfg["files"], split, "webdataset")
  mine, element_shard = records.shard_files(files, process_index, process_count)
  if cfg["verify_files"]:
    _check_files(mine, lang_field)

  def generate(path):
    for sample in read_samples(path.decode("utf-8")):
      yield to_record(sample, lang, lang_field)

  signature = {k: tf.TensorSpec([], tf.string) for k in ("image", "caption", "lang")}
  ds = tf.data.Dataset.from_tensor_slices(mine).interleave(
      lambda path: tf.data.Dataset.from_generator(generate, output_signature=signature, args=(path,)),
      cycle_length=max(1, min(cfg["cycle_length"], len(mine))), block_length=1,
      num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
  return ds.shard(process_count, process_index) if element_shard else ds
