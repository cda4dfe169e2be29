"""The variables of a trained model, read from an export directory or a workdir's checkpoint.

Below the models and the systems (a frozen backbone, a warm start and SMALR's latent phase read a
trained tower through it), above the checkpoint files: export.py writes the directories it reads.
"""

import json
from typing import Any, Dict, Tuple

import jax
from etils import epath
from flax import serialization

from mural import checkpointing

# An export directory's files (export.py writes them).
MANIFEST, CONFIG, VOCAB, PARAMS, SAVED_MODEL = (
    "manifest.json", "config.json", "vocab.txt", "params.msgpack", "saved_model")


def read_variables(path: str) -> Tuple[Dict[str, Any], int]:
  """({'params', 'batch_stats'} as NumPy, step) of an export directory or a workdir's checkpoint."""
  root = epath.Path(path)
  if (root / MANIFEST).exists():
    manifest = json.loads((root / MANIFEST).read_text())
    tree = serialization.msgpack_restore((root / PARAMS).read_bytes())
    return {"params": tree["params"], "batch_stats": tree.get("batch_stats", {})}, int(manifest["step"])
  if (root / "checkpoints").is_dir():
    step, variables = checkpointing.read_params(str(root))
    return variables, step
  raise FileNotFoundError(f"{path} is neither an export directory (no {MANIFEST}) nor a workdir "
                          "(no checkpoints/)")


def is_import(path: str) -> bool:
  """Whether `path` holds towers imported from public checkpoints (mural.import_weights)."""
  manifest = epath.Path(path) / MANIFEST
  return manifest.exists() and json.loads(manifest.read_text()).get("kind") == "import"


def flat(tree) -> Dict[str, Any]:
  """{'a/b/c': leaf} of a nested dict (names as in checkpoints and the export)."""
  out = {}
  for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
    out["/".join(str(getattr(k, "key", getattr(k, "name", k))) for k in path)] = leaf
  return out
