"""Warm start: a new run begins from the variables of an export directory or a workdir.

`config.init_from` names the source (mural/saved_variables.py reads either);
`config.init_from_parts` says what to take: 'towers' (the common case: a new
head on pretrained towers; every top-level parameter group named '*_tower',
with its batch statistics), 'all', or a comma-separated list of top-level
groups such as 'image_tower' (one pretrained tower, the other trained from
scratch) or 'text_tower,i2t_head'. An array is loaded when the source has
one of the same name and shape; everything else keeps its fresh
initialisation. The log says what was loaded and what was not, so a renamed
head or a resized table is never silently left untrained or dropped. The
optimizer state and the step start from zero.

A text tower's token table means something only with the vocabulary it was
trained on: a run that takes the text tower and sets no data.vocab_path uses
the source's (config_lib.source_vocab; mural/data/vocab.py copies it into the workdir),
and one whose vocabulary differs from the source's is an error.
"""

from typing import Any, Callable, Dict, List, NamedTuple, Optional, Tuple

import jax
import numpy as np
from absl import logging
from etils import epath

from mural import config_lib
from mural import saved_variables

_TOKEN_TABLE = "params/text_tower/token_embed/"  # mural/models/bert.py's token_* parameters.


def _taker(parts: str, groups) -> Callable[[str], bool]:
  """name -> whether `parts` takes it; a named group the model lacks is an error, not a no-op."""
  if parts == "all":
    return lambda name: True
  if parts == "towers":
    return lambda name: name.split("/", 1)[0].endswith("_tower")
  named = {p.strip() for p in parts.split(",")}
  if named - set(groups):
    raise ValueError(f"config.init_from_parts: {sorted(named - set(groups))} not among this "
                     f"model's parameter groups {sorted(groups)}")
  return lambda name: name.split("/", 1)[0] in named


def _check_vocab(config, vocab_path: Optional[str]):
  """A loaded token table with another vocabulary than the source's is an error, not a start."""
  source = config_lib.source_vocab(config.init_from)
  if source and vocab_path and not config.data.get("vocab_path") and not epath.Path(vocab_path).exists():
    return  # Not learned yet: mural/data/vocab.py will copy the source's there.
  if not vocab_path or not source or not epath.Path(vocab_path).exists():
    logging.warning("Warm start: the text tower's token table is loaded, and the vocabularies "
                    "cannot be compared (this run's: %s; the source's: %s).", vocab_path, source)
    return
  if epath.Path(vocab_path).read_bytes() != epath.Path(source).read_bytes():
    raise ValueError(f"config.init_from: the text tower's token table comes from {config.init_from}, "
                     f"whose vocabulary {source} differs from this run's {vocab_path}: its rows "
                     f"would stand for other tokens. Set config.data.vocab_path={source} (or leave "
                     f"it empty), or leave the text tower out (config.init_from_parts=image_tower)")


def _summary(names: List[str], limit: int = 8) -> str:
  if not names:
    return "none"
  more = f", ... ({len(names) - limit} more)" if len(names) > limit else ""
  return ", ".join(names[:limit]) + more


class WarmStart(NamedTuple):
  """What a warm start loads, matched against the state's shapes before any of it is placed."""
  arrays: Dict[str, np.ndarray]  # 'params/<name>' or 'batch_stats/<name>' -> the source's array.
  report: Dict[str, List[str]]  # {'loaded', 'initialised', 'unused'} array names.

  def filled(self, collection: str, tree, place=lambda value, leaf: value, like=None):
    """tree (a state's params or batch_stats) with the matched arrays, each in the dtype of its leaf
    in `like` (default: `tree`; abstract leaves where `tree` holds stand-ins, see `leaving_out`) and
    put in place by `place(value, that leaf)` (default: as a host array)."""
    def one(path, leaf, *model):
      value = self.arrays.get(f"{collection}/{_name(path)}")
      target = model[0] if model else leaf
      return leaf if value is None else place(np.asarray(value, target.dtype), target)
    return jax.tree_util.tree_map_with_path(one, tree, *([] if like is None else [like]))

  def leaving_out(self, collection: str, tree, stand_in: Callable[[Any], Any]):
    """tree with each leaf this warm start fills replaced by stand_in(leaf). An initialising program
    that returns stand-ins for them computes only the rest: XLA drops the initialisers of what it
    does not return, so an imported tower is neither compiled nor drawn at random."""
    return jax.tree_util.tree_map_with_path(
        lambda path, leaf: stand_in(leaf) if f"{collection}/{_name(path)}" in self.arrays else leaf, tree)

  def state_leaving_out(self, state, stand_in: Callable[[Any], Any]):
    """`leaving_out` on a TrainState's params and batch_stats (of values, or of their shardings)."""
    return state.replace(params=self.leaving_out("params", state.params, stand_in),
                         batch_stats=self.leaving_out("batch_stats", state.batch_stats, stand_in))

  def apply(self, state, like=None):
    """state with the matched arrays, each placed with the sharding of its leaf in `like` (default:
    state; an abstract state with shardings where `state` holds stand-ins), each process its shards."""
    like = state if like is None else like
    place = lambda value, leaf: jax.make_array_from_callback(leaf.shape, leaf.sharding, lambda index: value[index])
    return state.replace(params=self.filled("params", state.params, place, like.params),
                         batch_stats=self.filled("batch_stats", state.batch_stats, place, like.batch_stats))


def _name(path) -> str:
  return "/".join(str(getattr(k, "key", k)) for k in path)


def match(state, config, vocab_path: Optional[str] = None) -> WarmStart:
  """Reads config.init_from and matches its arrays to `state`'s by name and shape.

  `state` may be abstract (shapes only: train.py matches before it compiles
  the step, so a bad source fails in seconds, not after the compilation).
  Raises ValueError when nothing matches (that is a wrong path or model, not
  a warm start), and when the token table is taken and `vocab_path` (this
  run's wordpiece vocabulary) differs from the source's.
  """
  source, step = saved_variables.read_variables(config.init_from)
  parts = config.init_from_parts
  take = _taker(parts, state.params.keys())
  report = {"loaded": [], "initialised": [], "unused": []}
  arrays = {}
  for collection in ("params", "batch_stats"):
    have = saved_variables.flat(source.get(collection, {}))
    for path, leaf in jax.tree_util.tree_leaves_with_path(getattr(state, collection)):
      name = _name(path)
      full = f"{collection}/{name}"
      value = have.get(name)
      if not take(name) or value is None:
        report["initialised"].append(full)
      elif tuple(np.shape(value)) != tuple(leaf.shape):
        report["initialised"].append(f"{full} (source shape {tuple(np.shape(value))}, "
                                     f"this model {tuple(leaf.shape)})")
      else:
        report["loaded"].append(full)
        arrays[full] = value
    report["unused"] += [f"{collection}/{n}" for n in have if f"{collection}/{n}" not in arrays]
  if saved_variables.is_import(config.init_from):
    missed = [n for n in report["unused"] if take(n.split("/", 1)[1])]
    if missed:
      raise ValueError(f"config.init_from: {missed[0]} of the imported towers in {config.init_from} fits "
                       f"no variable of this model ({len(missed)} do not): the model's fields must be the "
                       "import's (config_lib.towers_from sets them)")
  if not report["loaded"]:
    raise ValueError(f"config.init_from: no array of {config.init_from} matches this model by name "
                     f"and shape (init_from_parts={parts!r}); newly initialised: "
                     f"{_summary(report['initialised'], 3)}")
  if any(n.startswith(_TOKEN_TABLE) for n in report["loaded"]):
    _check_vocab(config, vocab_path)
  groups = sorted({n.split("/")[1] for n in report["loaded"]})
  count = sum(int(np.prod(np.shape(x))) for x in arrays.values())
  logging.info("Warm start from %s (step %d, parts=%s): loaded %d arrays (%d values) of %s; newly "
               "initialised %d: %s; in the source, not loaded: %d: %s.", config.init_from, step, parts,
               len(report["loaded"]), count, ", ".join(groups), len(report["initialised"]),
               _summary(report["initialised"]), len(report["unused"]), _summary(report["unused"]))
  return WarmStart(arrays, report)


def load_into(state, config, vocab_path: Optional[str] = None) -> Tuple[Any, Dict[str, List[str]]]:
  """(state with the source's matching arrays, {'loaded', 'initialised', 'unused'} array names):
  match and apply in one call (see match)."""
  warm = match(state, config, vocab_path)
  return warm.apply(state), warm.report
