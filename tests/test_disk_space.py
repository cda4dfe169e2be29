"""mural.disk_space: a full disk as one line, and writes that leave no part of a file behind."""

import errno
import json

import pytest

from mural import disk_space


def test_full_disk_is_found_through_any_chain_of_errors():
  assert disk_space.is_disk_full(OSError(errno.ENOSPC, "No space left on device"))
  assert disk_space.is_disk_full(OSError(errno.EDQUOT, "Disk quota exceeded"))
  # tensorstore's error under orbax's, as raised: only the text says it.
  try:
    try:
      raise ValueError('RESOURCE_EXHAUSTED: Error writing local file "/w/15/_sharding": Failed to write '
                       "184590 bytes to file 5: No space left on device [os_error_code='28']")
    except ValueError as inner:
      raise RuntimeError("save failed") from inner
  except RuntimeError as outer:
    assert disk_space.is_disk_full(outer)
  assert not disk_space.is_disk_full(OSError(errno.EACCES, "Permission denied"))
  assert not disk_space.is_disk_full(ValueError("RESOURCE_EXHAUSTED: out of memory"))
  assert not disk_space.is_disk_full(None)


def test_the_line_says_what_where_free_and_what_is_whole(tmp_path):
  e = disk_space.DiskFull("checkpoint 15", str(tmp_path / "checkpoints" / "not yet"), "checkpoint 10 is whole")
  line = str(e)
  assert "\n" not in line and line.startswith(f"no space left on device writing checkpoint 15 to {tmp_path}")
  assert " free there now); checkpoint 10 is whole" in line  # Free space of the nearest folder that exists.
  assert e.errno == errno.ENOSPC and str(e.resuming("step 0")).endswith("; step 0")


def test_write_file_on_a_full_disk_keeps_the_old_file_and_no_part_of_the_new(small_disk):
  path = small_disk.path / "eval.json"
  disk_space.write_file(path, json.dumps({"step": 5}), "evaluation results")
  small_disk.fill(leave=0)
  with pytest.raises(disk_space.DiskFull, match=r"writing evaluation results to .*eval\.json \(.* free there now\)"):
    disk_space.write_file(path, "x" * 100_000, "evaluation results")
  assert json.loads(path.read_text()) == {"step": 5} and small_disk.files() == ["eval.json"]


def test_append_line_on_a_full_disk_leaves_no_half_line(small_disk):
  path = small_disk.path / "metrics.jsonl"
  disk_space.append_line(path, json.dumps({"step": 1}), "metrics")
  small_disk.fill(leave=2000)  # Part of the next line fits: the file is cut back to whole lines.
  with pytest.raises(disk_space.DiskFull, match="writing metrics"):
    disk_space.append_line(path, json.dumps({"step": 2, "pad": "x" * 100_000}), "metrics")
  assert path.read_text() == '{"step": 1}\n'
  small_disk.empty()
  disk_space.append_line(path, json.dumps({"step": 2}), "metrics")
  assert [json.loads(l)["step"] for l in path.read_text().splitlines()] == [1, 2]


def test_tensorboard_events_on_a_full_disk_are_disk_full(small_disk):
  from mural import metric_log  # pylint: disable=g-import-not-at-top  (TensorFlow)
  writer = metric_log.writer(str(small_disk.path))
  writer.write_scalars(1, {"loss": 1.0})
  writer.flush()
  small_disk.fill(leave=0)
  with pytest.raises(disk_space.DiskFull, match=f"writing TensorBoard events to {small_disk.path} "):
    writer.write_scalars(2, {"loss": 0.5, **{f"pad{i}": 0.0 for i in range(2000)}})
    writer.flush()
