"""img2dataset's `output_format=files` as a map from each downloaded url to its image file.

An evaluation set that names its images by url (WIT) finds them in the folder img2dataset wrote
(mural.data.img2dataset reads its tar and TFRecord outputs for training). Per shard NNNNN/, a
downloaded sample is <key>.<encode_format> with <key>.json beside it holding its `url` (and
<key>.txt, its caption); a failed download is only in NNNNN.parquet, so it has no file here.
JPEG and PNG are read (encode_format jpg, the default, or png): the model decodes only those.
"""

import json
import os
from typing import Dict

IMAGE_EXTENSIONS = ("jpg", "png")  # encode_format's names for what the model decodes.


def files_by_url(folder: str) -> Dict[str, str]:
  """url -> image file of every downloaded sample under `folder`; ValueError (one line) when the
  folder does not exist, holds no sample in this layout, or a sample's metadata has no url."""
  if not os.path.isdir(folder):
    raise ValueError(f"img2dataset output {folder} does not exist")
  out = {}
  for shard in sorted(os.listdir(folder)):
    shard_dir = os.path.join(folder, shard)
    if not os.path.isdir(shard_dir):
      continue  # NNNNN.parquet, NNNNN_stats.json.
    names = set(os.listdir(shard_dir))
    for name in sorted(names):
      key, ext = os.path.splitext(name)
      image = next((f"{key}.{e}" for e in IMAGE_EXTENSIONS if f"{key}.{e}" in names), None)
      if ext != ".json" or image is None:
        continue
      meta = os.path.join(shard_dir, name)
      try:
        with open(meta, encoding="utf-8") as f:
          url = json.load(f)["url"]
      except (OSError, ValueError, KeyError, TypeError) as e:
        raise ValueError(f"{meta}: not img2dataset's sample metadata (a JSON object with 'url'): {e!r}") from None
      if not isinstance(url, str):
        raise ValueError(f"{meta}: its 'url' is {url!r}, not a string")
      out[url] = os.path.join(shard_dir, image)
  if not out:
    raise ValueError(f"{folder}: no downloaded image in img2dataset's files layout (<shard>/<key>.jpg or .png "
                     "with <key>.json naming its url; download with --output_format=files)")
  return out
