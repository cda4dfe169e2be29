"""What every source and every task input shares: source-config fields, process
checks, the reasons a record is skipped, and the tf.data options of a run's datasets.

The ground floor of mural/data: it imports nothing of mural's, so the format
files (flickr8k.py, multi30k.py, img2dataset.py, synthetic.py), the sources
table, the task inputs and the pipeline can all import it without a cycle.
"""

from typing import Any, Dict, List, Mapping, Sequence, Tuple

from mural import lazy_import

tf = lazy_import.module("tensorflow")  # Its constants are read where TensorFlow is not needed (inputs.py).

# Keys of a source config that the pipeline reads; every source accepts them.
COMMON_FIELDS = ("name", "weight", "holdout")

# Why a record was skipped; a record gets the first reason that applies.
SKIP_REASONS = ("unknown_language", "empty_text", "long_text", "missing_image",
                "not_an_image", "undecodable_image")
OK = 0  # Status 0: usable; status i >= 1: SKIP_REASONS[i - 1].
STATUS = {r: i + 1 for i, r in enumerate(SKIP_REASONS)}


def source_fields(source_config: Any, source: str, defaults: Mapping[str, Any]) -> Dict[str, Any]:
  """defaults updated by source_config; unknown keys are a ValueError naming them."""
  if hasattr(source_config, "to_dict"):
    source_config = source_config.to_dict()
  cfg = dict(source_config or {})
  unknown = sorted(set(cfg) - set(defaults) - set(COMMON_FIELDS))
  if unknown:
    raise ValueError(f"data source {source!r}: unknown field(s) {unknown}; "
                     f"known: {sorted(set(defaults) | set(COMMON_FIELDS))}")
  out = dict(defaults)
  out.update({k: v for k, v in cfg.items() if k not in COMMON_FIELDS})
  return out


# A source's `holdout` (a fraction): its records whose key hashes into the first fraction of
# HOLDOUT_BUCKETS are held out of training (the pipeline, the vocabulary) for evaluation
# (eval_data's 'records' with the same source dict). The key is the image's bytes, so an image's
# captions are all on one side, or a pair's left text, so a sentence's translations are; the hash
# (Fingerprint64) is the same on every machine and run, so a resumed run splits as the first did.
HOLDOUT_BUCKETS = 1_000_000


def holdout_fraction(source_config: Any, where: str) -> float:
  """The source's `holdout` field (0.0 when absent); a ValueError naming `where` when it is not a
  fraction in [0, 1)."""
  if hasattr(source_config, "to_dict"):
    source_config = source_config.to_dict()
  value = dict(source_config or {}).get("holdout", 0.0)
  if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < 1:
    raise ValueError(f"{where}.holdout: the fraction of the source's records held out for evaluation, "
                     f"in [0, 1) (0: none), got {value!r}")
  return float(value)


def holdout_key(has_image: bool) -> str:
  return "image" if has_image else "left"


def holdout_side(ds: "tf.data.Dataset", key: str, fraction: float, held_out: bool) -> "tf.data.Dataset":
  """The records of `ds` on one side of the source's held-out split (see HOLDOUT_BUCKETS):
  the held-out ones, or the training ones; `ds` itself when fraction is 0 and training is asked."""
  if not fraction and not held_out:
    return ds
  threshold = int(round(fraction * HOLDOUT_BUCKETS))

  def side(record):
    bucket = tf.strings.to_hash_bucket_fast(record[key], HOLDOUT_BUCKETS)
    return tf.less(bucket, threshold) if held_out else tf.greater_equal(bucket, threshold)

  return ds.filter(side)


def run_options(data_config) -> "tf.data.Options":
  """The tf.data options of every dataset a run iterates (the training stream, the vocab's
  reader, the language counts): a deterministic order, and autotune as data.autotune. With it
  off, deleting a used iterator is immediate; with it on, TF 2.21's autotune thread holds the
  deletion until its next optimisation tick, up to 60 s (config_lib.py): the vocab's reader
  of configs/demo.py's 10,000 image-caption records waited 4.0 s for it, against 0.3 s."""
  options = tf.data.Options()
  options.deterministic = True
  options.autotune.enabled = bool(data_config.autotune)
  return options


def check_process(process_index: int, process_count: int) -> None:
  if not (isinstance(process_count, int) and process_count >= 1):
    raise ValueError(f"process_count must be a positive int, got {process_count!r}")
  if not (isinstance(process_index, int) and 0 <= process_index < process_count):
    raise ValueError(f"process_index {process_index!r} is not in [0, {process_count})")


def list_files(patterns: Any, split: str, source: str) -> List[str]:
  """Sorted files matching glob(s); '{split}' in a pattern is replaced by split.

  `patterns`: one glob, a comma-separated string of globs, or a list. A glob
  matching nothing is a ValueError naming it.
  """
  if isinstance(patterns, str):
    patterns = [p for p in patterns.split(",") if p.strip()]
  if not patterns:
    raise ValueError(f"data source {source!r}: field 'files' is empty (a glob of input files)")
  files = set()
  for pattern in patterns:
    pattern = pattern.strip().replace("{split}", split)
    matched = tf.io.gfile.glob(pattern)
    if not matched:
      raise ValueError(f"data source {source!r}: no file matches {pattern!r}")
    files.update(matched)
  return sorted(files)


def shard_files(files: Sequence[str], process_index: int, process_count: int) -> Tuple[List[str], bool]:
  """(files of this process, whether elements must still be sharded).

  >= process_count files: disjoint files per process (file i goes to process
  i % process_count). Fewer: every process reads all files and keeps every
  process_count-th element (`ds.shard`).
  """
  check_process(process_index, process_count)
  if len(files) >= process_count:
    return list(files[process_index::process_count]), False
  return list(files), process_count > 1
