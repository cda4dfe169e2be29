"""What every source and every task input shares: source-config fields, process
checks, and the reasons a record is skipped.

The ground floor of mural/data: it imports nothing of mural's, so the format
files (flickr8k.py, multi30k.py, synthetic.py), the sources table, the task
inputs and the pipeline can all import it without a cycle.
"""

from typing import Any, Dict, Mapping

# Keys of a source config that the pipeline reads; every source accepts them.
COMMON_FIELDS = ("name", "weight")

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


def check_process(process_index: int, process_count: int) -> None:
  if not (isinstance(process_count, int) and process_count >= 1):
    raise ValueError(f"process_count must be a positive int, got {process_count!r}")
  if not (isinstance(process_index, int) and 0 <= process_index < process_count):
    raise ValueError(f"process_index {process_index!r} is not in [0, {process_count})")
