"""orbax's logs and debris that mural reports itself, dropped: one error line instead of hundreds.

orbax reads and writes every array of a step at once on a private asyncio loop; when one fails
(a truncated file, a full disk) the others' callbacks, coroutines and futures fail after it and
are reported by asyncio, by Python's unraisable hook and by orbax's own error logs, some at exit,
long after mural has raised the error once (checkpointing.py). These filters drop exactly that
debris; `listing` quiets orbax's complaints about a step's timestamps file while it lists steps.
"""

import contextlib
import logging as std_logging
import os
import sys
from typing import Optional

from etils import epath

from mural import disk_space


def in_orbax(filename: str) -> bool:
  return "orbax" in filename.split(os.sep)


def raised_in_orbax(exc: Optional[BaseException]) -> bool:
  """Whether `exc` or an exception it chains to was raised in orbax's code."""
  seen = set()
  while exc is not None and id(exc) not in seen:
    seen.add(id(exc))
    tb = exc.__traceback__
    while tb is not None:
      if in_orbax(tb.tb_frame.f_code.co_filename):
        return True
      tb = tb.tb_next
    exc = exc.__cause__ or exc.__context__
  return False


_reads: set = set()  # Step directories read (or being read) here: their debris is dropped.


def _about_a_read(exc: Optional[BaseException], text: str = "") -> bool:
  """Whether `exc` (or `text`) comes from an orbax read of one of `_reads`."""
  if exc is not None:
    text += str(exc)
  return raised_in_orbax(exc) or any(path in text for path in _reads)


def _is_abandoned_read(unraisable) -> bool:
  """Debris of an orbax read that failed part-way.

  orbax reads every array in one asyncio.gather on a private event loop; when
  one read fails it closes the loop with the others in flight. Their
  tensorstore callbacks then hit 'Event loop is closed', and their coroutines
  and futures are collected with exceptions nobody retrieved: dozens of
  tracebacks, some at interpreter exit, long after the error was handled.
  """
  exc = unraisable.exc_value
  if isinstance(exc, RuntimeError) and str(exc) == "Event loop is closed":
    return True
  code = getattr(unraisable.object, "cr_code", None)
  return (code is not None and in_orbax(code.co_filename)) or _about_a_read(exc)


class _AbandonedTaskLogs(std_logging.Filter):
  """asyncio's '... exception was never retrieved' for the tasks and futures of a failed read."""

  def filter(self, record):
    exc = record.exc_info[1] if record.exc_info else None
    return not (os.sep + "orbax" + os.sep in record.getMessage()
                or _about_a_read(exc, record.getMessage()))


class _StepMetadataLogs(std_logging.Filter):
  """orbax's complaints about a step's _CHECKPOINT_METADATA (a missing file, its whole text when
  it does not parse) while it lists steps or reads one item of a step (which has none of its
  own). That file holds only timestamps: a step that is really broken gets its own one-line
  warning when it is restored."""

  def filter(self, record):
    return not record.pathname.endswith(os.path.join("orbax", "checkpoint", "_src", "metadata",
                                                     "checkpoint.py"))


class _DiskFullLogs(std_logging.Filter):
  """orbax's own error logs (with tracebacks, one per thread of its async save: four or five) of
  a save that failed for want of space: Checkpoints raises it as one DiskFull line instead."""

  def filter(self, record):
    if not in_orbax(record.pathname):
      return True
    return not disk_space.is_disk_full(record.exc_info[1] if record.exc_info else None) and \
        not disk_space.is_disk_full(Exception(record.getMessage()))


@contextlib.contextmanager
def listing():
  logger, quiet = std_logging.getLogger("absl"), _StepMetadataLogs()
  logger.addFilter(quiet)
  try:
    yield
  finally:
    logger.removeFilter(quiet)


_failed_reads = 0  # In this process: once one failed, its debris may show up until exit.


def _drop_abandoned_reads(hook):
  def quiet(unraisable):
    if not _is_abandoned_read(unraisable):
      hook(unraisable)
  quiet.mural_quiet = True
  return quiet


def _quiet_asyncio_debris() -> None:
  asyncio_logger = std_logging.getLogger("asyncio")
  if not any(isinstance(f, _AbandonedTaskLogs) for f in asyncio_logger.filters):
    asyncio_logger.addFilter(_AbandonedTaskLogs())


def quiet_failed_saves() -> None:
  """For the rest of the process: drops the debris of an orbax save that fails part-way (a full
  disk), and orbax's own error logs of a save that failed for want of space. Like a failed
  read's (_is_abandoned_read), the debris comes before the error reaches the caller, from every
  array's write at once (hundreds of tracebacks, some at exit); Checkpoints raises the error
  itself, once."""
  if not getattr(sys.unraisablehook, "mural_quiet", False):
    sys.unraisablehook = _drop_abandoned_reads(sys.unraisablehook)
  _quiet_asyncio_debris()
  absl_logger = std_logging.getLogger("absl")
  if not any(isinstance(f, _DiskFullLogs) for f in absl_logger.filters):
    absl_logger.addFilter(_DiskFullLogs())


@contextlib.contextmanager
def quiet_failed_read(path: epath.Path, before_any_read=()):
  """Around a read of step directory `path`: drops the debris of a failed read (see
  _is_abandoned_read). An exception of the types `before_any_read` is raised before any array
  is read, so it leaves none.

  The filters go up before the read (debris can come while orbax shuts its
  event loop down, before the error reaches us) and stay for the rest of the
  process once a read has failed (more comes as the coroutines and futures
  are collected, some at exit).
  """
  global _failed_reads
  _reads.add(str(path))
  previous, quiet = sys.unraisablehook, None
  if not getattr(previous, "mural_quiet", False):
    quiet = sys.unraisablehook = _drop_abandoned_reads(previous)
  _quiet_asyncio_debris()
  try:
    yield
  except before_any_read:
    _reads.discard(str(path))  # No array read: no debris.
    raise
  except Exception:
    _failed_reads += 1
    raise
  else:
    _reads.discard(str(path))
  finally:
    if quiet is not None and not _failed_reads and sys.unraisablehook is quiet:
      sys.unraisablehook = previous
