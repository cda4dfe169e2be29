"""Raw data sources by name: ONE table per kind, each entry a constructor.

Every constructor is `fn(source_config, split, process_index, process_count,
config=None) -> tf.data.Dataset` of raw elements, finite (no repeat, no
shuffle: the pipeline does both), deterministic order, holding only this
process's part; or, for the built-in synthetic data, an `Endless` source
(indexable, so the pipeline opens it at any record). `config` is the run's
config, read only by sources it defines (synthetic):

  image-text: {'image': tf.string encoded JPEG/PNG (or uint8 [H,W,3]),
               'caption': tf.string, 'lang': tf.string}
  text-pair:  {'left', 'right', 'left_lang', 'right_lang': tf.string}

Missing or unusable values inside one record come through as '' so the
pipeline can skip and count them. A source that is unusable as a whole (no
file matches, a file that is not TFRecord, a configured field that the first
records never hold, a misspelt config field) raises ValueError naming the
path/field when it is constructed, before any training step.

`source_config` is one entry of config.tasks.<task>.sources: 'name' and 'weight'
are the pipeline's, the other keys belong to the source (see each
constructor's docstring for its fields and defaults).

The pipeline builds its datasets with AutoGraph off (pipeline._open_sources
says why), so the functions a source or a record kind (inputs.py) hands to
tf.data are graph code: tf.cond or tf.where, not a Python `if` on a tensor,
which raises OperatorNotAllowedInGraphError when the pipeline is built.
"""

import dataclasses
import gzip
import logging
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence

import tensorflow as tf

from mural import lazy_import
from mural.data import flickr8k
from mural.data import img2dataset
from mural.data import karpathy
from mural.data import multi30k
from mural.data import synthetic
from mural.data.records import check_process, list_files, shard_files, source_fields

tfds = lazy_import.module("tensorflow_datasets")  # A slow import: loaded by the tfds source only.

_AUTOTUNE = tf.data.AUTOTUNE
_SCHEMA_PROBE_RECORDS = 16  # Records of the first file checked for the configured fields.


# ---- Sharding helpers ----------------------------------------------------------


def _interleave(files: Sequence[str], reader, cycle_length: int) -> tf.data.Dataset:
  ds = tf.data.Dataset.from_tensor_slices(list(files))
  return ds.interleave(reader, cycle_length=max(1, min(cycle_length, len(files))), block_length=1,
                       num_parallel_calls=_AUTOTUNE, deterministic=True)


# ---- TFRecord (image-text and text pairs) ------------------------------------


def _first_records(path: str, n: int) -> List[bytes]:
  """Up to n records of a TFRecord file; ValueError naming it when it is not one."""
  try:
    return [r.numpy() for r in tf.data.TFRecordDataset(path).take(n)]
  except tf.errors.OpError as e:
    raise ValueError(f"{path} is not a readable TFRecord file ({e.message.split('[Op:')[0].strip()})") from None


def check_tfrecord_schema(files: Sequence[str], fields: Mapping[str, str]) -> None:
  """Reads the first record of every file and more records of the first non-empty one.

  Raises ValueError when a file is not TFRecord, a record is not a
  tf.train.Example, a configured field (feature name) is absent from all of
  the first `_SCHEMA_PROBE_RECORDS` records, or holds a non-bytes feature.
  Single records missing a field are fine (they flow on with '').
  """
  probe = None  # The first file holding records: its first records are checked.
  for path in files:
    records = _first_records(path, _SCHEMA_PROBE_RECORDS if probe is None else 1)
    if probe is None and records:
      probe = {"path": path, "records": records}
  if probe is None:
    logging.warning("TFRecord files %s... hold no records", list(files[:3]))
    return
  path, seen = probe["path"], set()
  for j, raw in enumerate(probe["records"]):
    try:
      example = tf.train.Example.FromString(raw)
    except Exception:  # protobuf DecodeError; its class moves between versions.
      raise ValueError(f"{path}: record {j} is not a tf.train.Example") from None
    for key, feature in example.features.feature.items():
      seen.add(key)
      if key in fields.values():
        kind = feature.WhichOneof("kind")
        if kind not in (None, "bytes_list"):
          raise ValueError(f"{path}: field {key!r} holds {kind} in record {j}, expected bytes_list")
  for out_key, name in fields.items():
    if name not in seen:
      raise ValueError(f"{path}: field {name!r} (for {out_key!r}) is in none of the first "
                       f"{len(probe['records'])} records; they hold {sorted(seen)}")


def _parse_examples(fields: Mapping[str, str], constants: Mapping[str, str]):
  """record -> {out_key: tf.string}; a missing or multi-valued feature gives ''."""
  spec = {name: tf.io.VarLenFeature(tf.string) for name in set(fields.values())}

  def parse(record):
    ex = tf.io.parse_single_example(record, spec)
    out = {}
    for key, name in fields.items():
      values = ex[name].values
      out[key] = tf.where(tf.size(values) == 1, tf.concat([values, [""]], 0)[0], "")
    for key, value in constants.items():
      out[key] = tf.constant(value, tf.string)
    return out

  return parse


def _tfrecord_source(cfg: Mapping[str, Any], source: str, split: str, fields: Dict[str, str],
                     constants: Dict[str, str], process_index: int, process_count: int) -> tf.data.Dataset:
  files = list_files(cfg["files"], split, source)
  mine, element_shard = shard_files(files, process_index, process_count)
  if cfg["verify_files"]:
    check_tfrecord_schema(mine, fields)
  ds = _interleave(mine, tf.data.TFRecordDataset, cfg["cycle_length"])
  if element_shard:
    ds = ds.shard(process_count, process_index)
  return ds.map(_parse_examples(fields, constants), num_parallel_calls=_AUTOTUNE, deterministic=True)


def _split_fields(cfg, names: Sequence[str], constant_keys: Sequence[str]):
  """Which output keys come from features and which are constants from the config."""
  fields, constants = {}, {}
  for key in names:
    if key in constant_keys and cfg.get(key):
      constants[key] = cfg[key]
    else:
      fields[key] = cfg[f"{key}_field"]
  return fields, constants


def tfrecord_image_text(source_config, split: str, process_index: int, process_count: int,
                        config=None) -> tf.data.Dataset:
  """'tfrecord': tf.train.Example records of one image + one caption.

  Fields: files (glob / comma-separated globs / list; '{split}' is replaced),
  image_field ('image/encoded'), caption_field ('caption'), lang_field
  ('lang'), lang (a constant language code; overrides lang_field),
  verify_files (True: read each file's first record when constructed),
  cycle_length (16 files read in parallel).
  """
  cfg = source_fields(source_config, "tfrecord", dict(
      files=None, image_field="image/encoded", caption_field="caption", lang_field="lang", lang="",
      verify_files=True, cycle_length=16))
  fields, constants = _split_fields(cfg, ("image", "caption", "lang"), ("lang",))
  return _tfrecord_source(cfg, "tfrecord", split, fields, constants, process_index, process_count)


def tfrecord_text_pairs(source_config, split: str, process_index: int, process_count: int,
                        config=None) -> tf.data.Dataset:
  """'pairs_tfrecord': tf.train.Example records of one text pair.

  Fields: files, left_field ('left'), right_field ('right'), left_lang_field
  ('left_lang'), right_lang_field ('right_lang'), left_lang / right_lang
  (constants overriding the lang fields), verify_files, cycle_length.
  """
  cfg = source_fields(source_config, "pairs_tfrecord", dict(
      files=None, left_field="left", right_field="right", left_lang_field="left_lang",
      right_lang_field="right_lang", left_lang="", right_lang="", verify_files=True, cycle_length=16))
  fields, constants = _split_fields(cfg, ("left", "right", "left_lang", "right_lang"), ("left_lang", "right_lang"))
  return _tfrecord_source(cfg, "pairs_tfrecord", split, fields, constants, process_index, process_count)


# ---- TSV text pairs -----------------------------------------------------------

PAIR_KEYS = ("left", "right", "left_lang", "right_lang")


def _first_line(path: str, compression: str) -> str:
  if compression == "GZIP":
    with tf.io.gfile.GFile(path, "rb") as raw, gzip.open(raw, "rt", encoding="utf-8") as f:
      return f.readline().rstrip("\r\n")
  with tf.io.gfile.GFile(path, "r") as f:
    return f.readline().rstrip("\r\n")


def tsv_text_pairs(source_config, split: str, process_index: int, process_count: int,
                        config=None) -> tf.data.Dataset:
  """'tsv' / 'pairs_tsv': delimited text files, one pair per line.

  Fields: files (globs as for 'tfrecord'; '.gz' files are read as gzip),
  columns (names of the columns in file order when there is no header;
  default left, right, left_lang, right_lang), header ('auto': the first line
  is a header when it holds 'left' and 'right'; True; False), delimiter
  ('\\t'; no quoting, captions may hold quotes), left_lang / right_lang
  (constants, for files without language columns). Lines with missing columns
  give '' for them.
  """
  cfg = source_fields(source_config, "pairs_tsv", dict(
      files=None, columns=list(PAIR_KEYS), header="auto", delimiter="\t", left_lang="", right_lang="",
      cycle_length=16))
  delim = cfg["delimiter"]
  if not isinstance(delim, str) or len(delim) != 1:
    raise ValueError(f"data source 'pairs_tsv': delimiter must be one character, got {delim!r}")
  if cfg["header"] not in ("auto", True, False):
    raise ValueError(f"data source 'pairs_tsv': header must be 'auto', True or False, got {cfg['header']!r}")
  files = list_files(cfg["files"], split, "pairs_tsv")
  mine, element_shard = shard_files(files, process_index, process_count)
  constants = {k: cfg[k] for k in ("left_lang", "right_lang") if cfg[k]}
  needed = [k for k in PAIR_KEYS if k not in constants]

  columns, has_header = None, False
  for path in mine:
    compression = "GZIP" if path.endswith(".gz") else ""
    names = _first_line(path, compression).split(delim)
    file_header = cfg["header"] is True or (cfg["header"] == "auto" and "left" in names and "right" in names)
    file_columns = names if file_header else list(cfg["columns"])
    missing = [k for k in needed if k not in file_columns]
    if missing:
      where = "header" if file_header else "field 'columns'"
      raise ValueError(f"{path}: the {where} {file_columns} lacks column(s) {missing}")
    if columns is not None and (file_columns, file_header) != (columns, has_header):
      raise ValueError(f"{path}: columns {file_columns} (header={file_header}) differ from "
                       f"{mine[0]}'s {columns} (header={has_header})")
    columns, has_header = file_columns, file_header
  index = {k: columns.index(k) for k in needed}
  width = len(columns)

  def read(path):
    compression = tf.where(tf.strings.regex_full_match(path, r".*\.gz"), "GZIP", "")
    return tf.data.TextLineDataset(path, compression_type=compression).skip(1 if has_header else 0)

  def parse(line):
    line = tf.strings.regex_replace(line, "\r$", "")
    parts = tf.concat([tf.strings.split(line, delim), tf.fill([width], "")], 0)
    out = {k: parts[i] for k, i in index.items()}
    out.update({k: tf.constant(v, tf.string) for k, v in constants.items()})
    return {k: out[k] for k in PAIR_KEYS}

  ds = _interleave(mine, read, cfg["cycle_length"])
  if element_shard:
    ds = ds.shard(process_count, process_index)
  return ds.map(parse, num_parallel_calls=_AUTOTUNE, deterministic=True)


# ---- TFDS ---------------------------------------------------------------------


def _get_path(tree, path: str, what: str, available: str):
  node = tree
  for part in path.split("/"):
    inner = getattr(node, "feature", None)  # tfds Sequence({...}) wraps a FeaturesDict.
    if inner is not None and hasattr(inner, "keys"):
      node = inner
    if not hasattr(node, "keys") or part not in node.keys():
      raise ValueError(f"data source 'tfds': {what} {path!r} is not a feature; features: {available}")
    node = node[part]
  return node


def _nested(path: str, value) -> dict:
  out = value
  for part in reversed(path.split("/")):
    out = {part: out}
  return out


def tfds_image_text(source_config, split: str, process_index: int, process_count: int,
                        config=None) -> tf.data.Dataset:
  """'tfds': an already prepared TFDS dataset (nothing is downloaded).

  Fields: dataset (TFDS name, 'name' or 'name:version'), data_dir (None: TFDS
  default), splits (map of our split name -> TFDS split, e.g. {'dev':
  'validation'}; default: the same name), image_field ('image'),
  caption_field ('caption'), lang_field (''), lang (constant code; one of
  lang/lang_field is needed). Nested features are 'a/b' paths; a caption
  feature that is a sequence (e.g. COCO's 'captions/text') gives one element
  per caption, with a lang sequence aligned to it or a scalar lang. Image
  features stay encoded (SkipDecoding). Processes get disjoint
  `tfds.even_splits` parts.
  """
  cfg = source_fields(source_config, "tfds", dict(
      dataset=None, data_dir=None, splits={}, image_field="image", caption_field="caption",
      lang_field="", lang=""))
  check_process(process_index, process_count)
  if not cfg["dataset"]:
    raise ValueError("data source 'tfds': field 'dataset' (a TFDS name) is required")
  if not cfg["lang"] and not cfg["lang_field"]:
    raise ValueError("data source 'tfds': set 'lang' (a constant code) or 'lang_field'")
  try:
    builder = tfds.builder(cfg["dataset"], data_dir=cfg["data_dir"])
  except Exception as e:  # DatasetNotFoundError and friends.
    raise ValueError(f"data source 'tfds': cannot load {cfg['dataset']!r} from data_dir "
                     f"{cfg['data_dir']!r}: {type(e).__name__}: {str(e).splitlines()[0]}") from None
  tfds_split = dict(cfg["splits"]).get(split, split)
  if not builder.info.splits or tfds_split not in builder.info.splits:
    raise ValueError(f"data source 'tfds': {cfg['dataset']!r} in {builder.data_dir} has no prepared split "
                     f"{tfds_split!r} (has {sorted(builder.info.splits.keys())}); it must be prepared "
                     "beforehand, nothing is downloaded")
  features = builder.info.features
  available = str(sorted(_flat_feature_names(features)))
  image_feature = _get_path(features, cfg["image_field"], "image_field", available)
  caption_path, lang_path = cfg["caption_field"], (None if cfg["lang"] else cfg["lang_field"])
  _get_path(features, caption_path, "caption_field", available)
  if lang_path:
    _get_path(features, lang_path, "lang_field", available)
  decoders = None
  if isinstance(image_feature, tfds.features.Image):
    decoders = _nested(cfg["image_field"], tfds.decode.SkipDecoding())
  part = tfds.even_splits(tfds_split, n=process_count, drop_remainder=False)[process_index]
  ds = builder.as_dataset(split=part, shuffle_files=False, decoders=decoders,
                          read_config=tfds.ReadConfig(shuffle_seed=None, interleave_cycle_length=1))

  spec = ds.element_spec
  caption_rank = _get_path(spec, caption_path, "caption_field", available).shape.rank
  lang_rank = _get_path(spec, lang_path, "lang_field", available).shape.rank if lang_path else 0
  if caption_rank not in (0, 1) or lang_rank not in (0, 1) or lang_rank > caption_rank:
    raise ValueError(f"data source 'tfds': caption_field rank {caption_rank} / lang_field rank {lang_rank} "
                     "unsupported (scalar, or a sequence with a scalar or aligned lang)")
  const_lang = tf.constant(cfg["lang"], tf.string)

  def pick(ex):
    image = _get_path(ex, cfg["image_field"], "image_field", available)
    caption = _get_path(ex, caption_path, "caption_field", available)
    lang = _get_path(ex, lang_path, "lang_field", available) if lang_path else const_lang
    return image, caption, lang

  if caption_rank == 0:
    return ds.map(lambda ex: dict(zip(("image", "caption", "lang"), pick(ex))), num_parallel_calls=_AUTOTUNE)

  def expand(ex):
    image, captions, lang = pick(ex)
    n = tf.shape(captions)[0]
    langs = lang if lang_rank == 1 else tf.fill([n], lang)
    images = tf.repeat(image[tf.newaxis], n, axis=0)
    return tf.data.Dataset.from_tensor_slices({"image": images, "caption": captions, "lang": langs})

  return ds.flat_map(expand)


def _flat_feature_names(features, prefix: str = "") -> List[str]:
  names = []
  for key in features.keys():
    sub = features[key]
    name = f"{prefix}{key}"
    names.append(name)
    if hasattr(sub, "keys"):
      names.extend(_flat_feature_names(sub, name + "/"))
    elif hasattr(sub, "feature") and hasattr(sub.feature, "keys"):  # Sequence({...}).
      names.extend(_flat_feature_names(sub.feature, name + "/"))
  return names


# ---- The built-in synthetic data -------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Endless:
  """A source that is endless, shuffled and indexable (the synthetic one).

  The pipeline opens it at this process's k-th record directly (resuming
  costs nothing) and does not reshuffle it; its records per language
  ('en') or language pair ('en-de') are known without a counting pass.
  """
  open_at: Callable[[int], tf.data.Dataset]
  language_counts: Mapping[str, int]
  # The same records' text fields only, where leaving the rest out saves work (the vocab reads it).
  open_text_at: Optional[Callable[[int], tf.data.Dataset]] = None


def _synthetic(kind: str, source_config, split, process_index, process_count, config) -> Endless:
  # Settings come from config.data.synthetic; 'languages' keeps only some of its languages
  # (image-text) or the pairs within them (text pairs), e.g. one source per language.
  only = tuple(source_fields(source_config, "synthetic", dict(languages=[]))["languages"])
  if config is None:
    raise ValueError("data source 'synthetic' needs the run's config (config.data.synthetic)")
  check_process(process_index, process_count)
  settings = synthetic.Settings.from_config(config).restricted(only)
  if kind == "image_text":
    make, counts = synthetic.image_text_source, dict(zip(settings.languages, settings.image_caption_counts))
  else:
    make = synthetic.text_pair_source
    counts = {f"{a}-{b}": n for (a, b), n in zip(settings.translation_pairs, settings.translation_counts)}

  def open_at(k: int, **kw) -> tf.data.Dataset:
    return make(config, split, process_index, process_count, start_index=k * process_count, num_epochs=None,
                languages=only, **kw)

  if kind == "image_text":
    return Endless(open_at, counts, open_text_at=lambda k: open_at(k, with_images=False))
  return Endless(open_at, counts)


def synthetic_image_text(source_config, split: str, process_index: int = 0, process_count: int = 1,
                         config=None) -> Endless:
  """'synthetic': rendered scenes with captions (mural/data/synthetic.py), set by config.data.synthetic.

  Field: languages (default []: all of data.synthetic.languages): only these languages' captions
  (the same records as in the whole source)."""
  return _synthetic("image_text", source_config, split, process_index, process_count, config)


def synthetic_text_pairs(source_config, split: str, process_index: int = 0, process_count: int = 1,
                         config=None) -> Endless:
  """'synthetic': caption translation pairs of the built-in scenes, set by config.data.synthetic."""
  return _synthetic("text_pair", source_config, split, process_index, process_count, config)


# ---- The tables ----------------------------------------------------------------
# Every entry: fn(source_config, split, process_index, process_count, config=None)
# -> a finite tf.data.Dataset of raw records, or an `Endless` source. `config`
# is the run's config, for sources defined by it (synthetic); others ignore it.

IMAGE_TEXT_SOURCES = {
    "synthetic": synthetic_image_text,
    "tfrecord": tfrecord_image_text,
    "tfds": tfds_image_text,
    "flickr8k": flickr8k.image_text_source,
    "multi30k": multi30k.image_text_source,
    "karpathy": karpathy.image_text_source,
    "webdataset": img2dataset.image_text_source,
}

TEXT_PAIR_SOURCES = {
    "synthetic": synthetic_text_pairs,
    "tsv": tsv_text_pairs,
    "pairs_tsv": tsv_text_pairs,
    "pairs_tfrecord": tfrecord_text_pairs,
    "multi30k": multi30k.text_pair_source,
}


def image_text_source(source_config, split: str, process_index: int = 0, process_count: int = 1,
                      config=None):
  """Looks the source up by source_config['name'] in IMAGE_TEXT_SOURCES."""
  return _lookup(IMAGE_TEXT_SOURCES, "image-text", source_config)(
      source_config, split, process_index, process_count, config=config)


def text_pair_source(source_config, split: str, process_index: int = 0, process_count: int = 1,
                     config=None):
  """Looks the source up by source_config['name'] in TEXT_PAIR_SOURCES."""
  return _lookup(TEXT_PAIR_SOURCES, "text-pair", source_config)(
      source_config, split, process_index, process_count, config=config)


def _lookup(table, kind: str, source_config):
  name = (source_config or {}).get("name")
  if name not in table:
    raise ValueError(f"data source name {name!r} is not a {kind} source; known: {sorted(table)}")
  return table[name]
