"""A classification set in ImageNet's folder layout, classified zero-shot in each language given.

The folder holds one subfolder of images per class, as ImageNet's val set is laid out for
torchvision's ImageFolder: the sorted subfolder names are the classes and their order the label
ids; images are found at any depth below them. Subfolders named by integers, as ImageNet-V2's
0..999 (each its class index), sort by value: in text order '10' would take label 2. Beside the
subfolders, per language, CLIP_benchmark's own files (clip_benchmark/datasets/), keyed by dataset
name:

  <lang>_classnames.json                       {"imagenet1k": [name of label 0, name of label 1, ...]}
  <lang>_zeroshot_classification_templates.json  {"imagenet1k": ["a photo of a {c}.", ...]}

An entry is "imagenet1k", or a file's only one. Class names may also be a dict of subfolder name ->
class name (a subset of classes, as ImageNet-R's 200); templates, a dict of class name -> its own
prompts (CuPL, as CLIP_benchmark reads them). CLIP_benchmark's cn and jp are zh and ja here. With
no such file, English is scored: the subfolder names as class names, CLIP's 7 templates; English
with one of its two files takes the other's default.
"""

import json
import os
import re
from typing import Optional

import numpy as np

from mural.public_sets.parts import PublicSet
from mural.public_sets.zero_shot import Classification, fill, PLACEHOLDER

SPLIT = "test"
ENTRY = "imagenet1k"  # The entry read from a file of several datasets' (as CLIP_benchmark's own).
NAMES, TEMPLATES = "_classnames.json", "_zeroshot_classification_templates.json"
LANGUAGE_CODES = {"cn": "zh", "jp": "ja"}  # CLIP_benchmark's file prefix -> the code mural uses.
_CODE = re.compile(r"[a-z]{2,3}(-[a-z0-9]+)*")  # ISO 639, with a region or script after a hyphen.
EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".webp")  # ImageFolder's that the model decodes.
# CLIP's 7-template ensemble for ImageNet (its Prompt_Engineering_for_ImageNet notebook): English
# without a templates file.
DEFAULT_TEMPLATES = ("itap of a {c}.", "a bad photo of the {c}.", "a origami {c}.", "a photo of the large {c}.",
                     "a {c} in a video game.", "art of the {c}.", "a photo of the small {c}.")


def _class_order(names) -> list:
  """ImageFolder's order (sorted names), except all-integer names (ImageNet-V2's), by value."""
  names = list(names)
  return sorted(names, key=int) if names and all(n.isdecimal() for n in names) else sorted(names)


def _images(folder: str, log):
  """(class subfolder names, image paths, labels) as ImageFolder reads them; names starting with
  '.' are skipped (a notebook's checkpoints folder is no class)."""
  if not os.path.isdir(folder):
    raise ValueError(f"imagenet_folder: {folder!r} is not a folder (expected one subfolder of images per class)")
  classes = _class_order(e.name for e in os.scandir(folder) if e.is_dir() and not e.name.startswith("."))
  if not classes:
    raise ValueError(f"imagenet_folder: {folder} has no class subfolders (expected one subfolder of images "
                     "per class, as ImageNet's val set)")
  paths, labels, other = [], [], []
  for label, name in enumerate(classes):
    found = 0
    for root, _, files in sorted(os.walk(os.path.join(folder, name), followlinks=True)):
      for f in sorted(files):
        if f.startswith("."):
          continue
        if f.lower().endswith(EXTENSIONS):
          paths.append(os.path.join(root, f))
          labels.append(label)
          found += 1
        else:
          other.append(os.path.join(root, f))
    if not found:
      raise ValueError(f"imagenet_folder: {os.path.join(folder, name)} holds no image ({', '.join(EXTENSIONS)}): "
                       "every class subfolder needs its images")
  if other:
    log(f"imagenet_folder: {len(other)} files without an image extension skipped, e.g. {other[0]}")
  return classes, paths, np.asarray(labels, np.int64)


def _language(path: str, suffix: str) -> str:
  prefix = os.path.basename(path)[:-len(suffix)]
  code = LANGUAGE_CODES.get(prefix, prefix)
  if not _CODE.fullmatch(code):
    raise ValueError(f"{path}: {prefix!r} is not a language code (expected <lang>{suffix} with <lang> a "
                     f"lower-case ISO 639 code such as en, or CLIP_benchmark's cn or jp)")
  return code


def _files(folder: str, suffix: str) -> dict:
  """language -> path of each <lang><suffix> in the folder."""
  out = {}
  for name in sorted(os.listdir(folder)):
    path = os.path.join(folder, name)
    if name.endswith(suffix) and os.path.isfile(path):
      code = _language(path, suffix)
      if code in out:
        raise ValueError(f"{path}: a second {suffix[1:]} file for {code!r} (beside {out[code]})")
      out[code] = path
  return out


def _entry(path: str):
  """The file's entry: "imagenet1k", or its only one."""
  try:
    with open(path, encoding="utf-8") as f:
      data = json.load(f)
  except ValueError as e:
    raise ValueError(f"{path}: not JSON: {e}") from None
  if not isinstance(data, dict) or not data:
    raise ValueError(f"{path}: expected CLIP_benchmark's layout, an object of dataset name -> entry")
  if ENTRY in data:
    return data[ENTRY]
  if len(data) == 1:
    return next(iter(data.values()))
  raise ValueError(f"{path}: entries {sorted(data)}: expected {ENTRY!r} or a single dataset's entry")


def _strings(value) -> bool:
  return isinstance(value, list) and all(isinstance(v, str) for v in value)


def _class_names(path: str, subfolders: list, folder: str) -> list:
  names = _entry(path)
  if isinstance(names, dict):
    missing = [s for s in subfolders if s not in names]
    if missing:
      raise ValueError(f"{path}: no class name for {len(missing)} of the {len(subfolders)} class subfolders of "
                       f"{folder}, e.g. {missing[0]!r} (expected subfolder name -> class name for each)")
    names = [names[s] for s in subfolders]
  if not _strings(names) or len(names) != len(subfolders):
    got = f"{len(names)} class names" if _strings(names) else f"a {type(names).__name__}"
    raise ValueError(f"{path}: {got} for the {len(subfolders)} class subfolders of {folder} (expected one "
                     "name per subfolder, in the subfolders' order, or a dict of subfolder -> name)")
  return names


def _prompts(path: str, classes: list) -> list:
  templates = _entry(path)
  if isinstance(templates, dict):  # Class-specific prompts.
    missing = [c for c in classes if not _strings(templates.get(c)) or not templates.get(c)]
    if missing:
      raise ValueError(f"{path}: no prompt list for {len(missing)} of the {len(classes)} classes, e.g. {missing[0]!r} "
                       "(expected class name -> prompts for each)")
    return [templates[c] for c in classes]
  bad = [t for t in templates if not PLACEHOLDER.search(t)] if _strings(templates) else [templates]
  if not templates or bad:
    raise ValueError(f"{path}: expected a non-empty list of templates, each with a {{c}} or {{}} for the class "
                     f"name; got {bad[0] if bad else templates!r}")
  return fill(templates, classes)


def read(folder: str, images: Optional[str], log) -> list:
  """One Classification per language with files in `folder`; English alone when there are none."""
  if images:
    raise ValueError("imagenet_folder: its images are the folder's own (--images is not used)")
  subfolders, paths, labels = _images(folder, log)
  names, templates = _files(folder, NAMES), _files(folder, TEMPLATES)
  parts = []
  for lang in sorted(set(names) | set(templates)) or ["en"]:
    if lang != "en" and lang not in names:
      raise ValueError(f"{templates[lang]}: no {lang}{NAMES} beside it (only English has default class names)")
    if lang != "en" and lang not in templates:
      raise ValueError(f"{names[lang]}: no {lang}{TEMPLATES} beside it (only English has default templates)")
    if lang in names:
      classes = _class_names(names[lang], subfolders, folder)
    else:
      classes = [s.replace("_", " ") for s in subfolders]
      log(f"imagenet_folder: no en{NAMES} in {folder}: the subfolder names are the English class names")
    if lang in templates:
      prompts = _prompts(templates[lang], classes)
    else:
      prompts = fill(DEFAULT_TEMPLATES, classes)
      log(f"imagenet_folder: no en{TEMPLATES} in {folder}: CLIP's {len(DEFAULT_TEMPLATES)} English templates")
    parts.append(Classification(SPLIT, lang, paths, labels, classes, prompts))
  log(f"imagenet_folder: {len(subfolders)} classes, {len(paths)} images; languages {[p.language for p in parts]}")
  return parts


SET = PublicSet(read, "acc1", {})  # No paper reports MURAL on these; CLIP_benchmark's tables are open_clip's.
