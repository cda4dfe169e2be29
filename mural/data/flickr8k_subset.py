"""A Flickr8k folder in the release's layout with the first N photos outside the official test split.

    python -m mural.data.flickr8k_subset --source=/data/flickr8k --out=/data/flickr8k_875 --photos=875

--source is a Flickr8k folder as released (mural/data/flickr8k.py says what it
holds), or one with the photos in images/ and the text files in text/. --out
gets Flicker8k_Dataset/ with the chosen photos (symbolic links to the
source's; --copy copies them) and the release's text files, as they are,
beside it: the same files, so the captions of the chosen photos are read as
from the release. The photos are the first N names in sorted order that the
test list does not hold; N = 875 gives the subset that mural's tests and real-
data benchmarks read, and 0 every photo.
"""

import os
import shutil
import sys
from typing import List

from absl import app
from absl import flags

from mural.data import flickr8k

TEXT_FILES = (flickr8k.TOKENS, *flickr8k.SPLIT_FILES.values(), flickr8k.CHINESE, flickr8k.ARABIC)


def _source_photos(source: str) -> str:
  """images/ where the folder has one (the shared subset), else the release's photo folder."""
  if os.path.isdir(os.path.join(source, "images")):
    return os.path.join(source, "images")
  return flickr8k.photo_dir(source)


def _source_text(source: str, name: str):
  """A text file where the release puts it (flickr8k.text_file), else in text/."""
  f = flickr8k.text_file(source, name)
  if f is None and os.path.exists(os.path.join(source, "text", name)):
    f = os.path.join(source, "text", name)
  return f


def write(source: str, out: str, photos: int = 875, copy: bool = False) -> List[str]:
  """Writes the subset into `out` (which must not exist yet); returns the chosen photo names."""
  if os.path.exists(out):
    raise ValueError(f"--out {out} exists; name a new folder")
  source_photos = _source_photos(source)
  if _source_text(source, flickr8k.TOKENS) is None:
    raise ValueError(f"{source}: no {flickr8k.TOKENS} (Flickr8k_text.zip), here, in {flickr8k.TEXT_DIR}/ or text/")
  test_list = _source_text(source, flickr8k.SPLIT_FILES["test"])
  test = set()
  if test_list:
    with open(test_list, encoding="utf-8") as f:
      test = {line.strip() for line in f}
  names = sorted(n for n in os.listdir(source_photos) if n.endswith(".jpg") and n not in test)
  chosen = names[:photos] if photos else names
  if photos and len(chosen) < photos:
    raise ValueError(f"{source_photos}: {len(names)} photos outside the test split, fewer than --photos={photos}")
  photo_out = os.path.join(out, flickr8k.PHOTO_DIRS[0])
  os.makedirs(photo_out)
  for name in chosen:
    src = os.path.abspath(os.path.join(source_photos, name))
    if copy:
      shutil.copyfile(src, os.path.join(photo_out, name))
    else:
      os.symlink(src, os.path.join(photo_out, name))
  for name in TEXT_FILES:
    f = _source_text(source, name)
    if f is not None:
      shutil.copyfile(f, os.path.join(out, name))
  return chosen


def _define_flags():
  """Defined when run as a command only: importing this module (tests) defines no absl flag."""
  flags.DEFINE_string("source", None, "A Flickr8k folder as released (or images/ + text/).")
  flags.DEFINE_string("out", None, "The new folder to write.")
  flags.DEFINE_integer("photos", 875, "How many photos (0: every one outside the test split).")
  flags.DEFINE_bool("copy", False, "Copy the photos instead of linking them.")


def main(argv):
  del argv
  f = flags.FLAGS
  if not f.source or not f.out:
    sys.exit("flickr8k_subset: --source and --out are required")
  try:
    chosen = write(f.source, f.out, f.photos, f.copy)
  except (ValueError, OSError) as e:
    sys.exit(f"flickr8k_subset: error: {e}")
  print(f"{f.out}: {len(chosen)} photos ({chosen[0]} .. {chosen[-1]}) in the release's layout")


if __name__ == "__main__":
  _define_flags()
  app.run(main)
