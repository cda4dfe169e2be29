"""A write that fails because its file system is full, as one line a user can act on.

Every writer of mural (checkpoints, exports, embedding shards, indexes, the converter's
TFRecords, metrics and eval files) wraps its writes in `writing(what, path)`: a failure for want of
space, however deep it was raised (Python's OSError, tensorstore's RESOURCE_EXHAUSTED under
orbax, TensorFlow's file writer, faiss), becomes `DiskFull`, whose message says what could not be
written, where, how much space is free there now, and what is whole (`resume`). The entry points
print it as their one error line.
"""

import contextlib
import errno
import os
import shutil
from typing import Iterator, Optional

from etils import epath

# ENOSPC and EDQUOT, and how the C++ libraries word them in their messages (strerror's text;
# tensorstore's os_error_code).
_FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT)
_FULL_TEXTS = ("No space left on device", "Disk quota exceeded", "os_error_code='28'",
               "os_error_code='122'")


def is_disk_full(exc: Optional[BaseException]) -> bool:
  """Whether `exc`, or an exception it chains to, says a file system is full."""
  seen = set()
  while exc is not None and id(exc) not in seen:
    seen.add(id(exc))
    if isinstance(exc, DiskFull):
      return True
    if isinstance(exc, OSError) and exc.errno in _FULL_ERRNOS:
      return True
    if any(text.lower() in str(exc).lower() for text in _FULL_TEXTS):
      return True
    exc = exc.__cause__ or exc.__context__
  return False


def _existing(path: str) -> str:
  """`path` or the nearest folder above it that exists (the file system it is written on)."""
  path = os.path.abspath(path)
  while not os.path.exists(path) and os.path.dirname(path) != path:
    path = os.path.dirname(path)
  return path


def free_text(path: str) -> str:
  """'12.3 MB free' on `path`'s file system ('unknown free space' when it cannot be asked)."""
  try:
    free = shutil.disk_usage(_existing(path)).free
  except OSError:
    return "unknown free space"
  for unit, size in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
    if free >= size:
      return f"{free / size:.1f} {unit} free"
  return f"{free} bytes free"


class DiskFull(OSError):
  """Writing `what` to `path` failed for want of space; `resume` says what is whole."""

  def __init__(self, what: str, path: str, resume: str = ""):
    self.what, self.path, self.resume = what, str(path), resume
    self.free = free_text(self.path)
    super().__init__(errno.ENOSPC, str(self))

  def __str__(self) -> str:
    line = f"no space left on device writing {self.what} to {self.path} ({self.free} there now)"
    return f"{line}; {self.resume}" if self.resume else line

  def __reduce__(self):
    return DiskFull, (self.what, self.path, self.resume)

  def resuming(self, resume: str) -> "DiskFull":
    """The same failure, with what a rerun continues from."""
    return DiskFull(self.what, self.path, resume)


@contextlib.contextmanager
def writing(what: str, path, resume: str = "", partial=None) -> Iterator[None]:
  """Turns a full-disk failure in the block into DiskFull(what, path, resume), after removing
  `partial` (a file or folder the block was writing, or None): half a file would be taken for a
  whole one, or hold the space a rerun needs."""
  try:
    yield
  except DiskFull:
    remove(partial)
    raise
  except Exception as e:  # pylint: disable=broad-except  (only a full disk is turned; others re-raised)
    if not is_disk_full(e):
      raise
    remove(partial)
    raise DiskFull(what, str(path), resume) from e


def write_file(path, data, what: str) -> None:
  """Writes `data` (bytes or str) to `path` whole, then renames it into place: a reader (or a
  resumed run) never sees part of one; a full disk leaves the old file, if any, as it was.
  Local or remote (epath: a gs:// workdir)."""
  path = epath.Path(path)
  tmp = epath.Path(f"{path}.tmp")
  with writing(what, path, partial=tmp):
    tmp.write_bytes(data.encode("utf-8") if isinstance(data, str) else data)
    tmp.replace(path)


def append_line(path, line: str, what: str) -> None:
  """Appends `line` and a newline to `path`; a full disk truncates a local file back to what it
  held, so no half line is left for a reader to trip on."""
  path = epath.Path(path)
  local = os.path.exists(str(path))
  size = os.path.getsize(str(path)) if local else 0
  try:
    with writing(what, path):
      with path.open("a") as f:
        f.write(line + "\n")
  except DiskFull:
    if local:
      try:
        os.truncate(str(path), size)
      except OSError:
        pass
    raise


def remove(partial) -> None:
  """Deletes file or folder `partial` if it exists (None: nothing); never raises."""
  if partial is None:
    return
  partial = str(partial)
  try:
    if os.path.isdir(partial):
      shutil.rmtree(partial, ignore_errors=True)
    elif os.path.exists(partial):
      os.remove(partial)
  except OSError:
    pass
