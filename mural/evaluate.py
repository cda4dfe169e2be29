"""Evaluators: embed an eval set with the model, score it with mural.metrics, report.

An evaluator is a small value with `run(embedder, variables) -> {'<set>/<metric>': value}`;
a system lists its evaluators (mural/systems/), and the trainer runs them all
(`run_all`) and `report`s the result: workdir/eval/step_<N>.json (`directory_for`:
an evaluation of another config has its own), TensorBoard scalars and a console
table. The maths lives in mural.metrics; this file only moves data.

  Retrieval:   images and captions per language -> i2t/t2i Recall@1/5/10, mR
               (and 'mean/mR' over the sets), with the heads the task trained;
               scored in blocks (metrics.retrieval_metrics_from_embeddings), never
               the whole texts x images matrix.
  Translation: aligned sentence pairs -> l2r/r2l accuracy, with one text head.

`Embedder` holds the jitted embedding calls, in fixed-size batches (padded
tail) sharded over the batch axes. Multi-host: every process holds the whole
(small) eval set; embeddings come back replicated, so every process computes
the same numbers and process 0 writes them.
"""

import hashlib
import json
import os
import re
from typing import Any, Dict, Mapping, Optional, Sequence

import jax
import numpy as np
from absl import logging
from etils import epath

from mural import config_lib
from mural import disk_space
from mural import metrics
from mural import sharding

RECALL_COLUMNS = ("i2t_R@1", "i2t_R@5", "i2t_R@10", "t2i_R@1", "t2i_R@5", "t2i_R@10", "mR")
TRANSLATION_COLUMNS = ("l2r_acc", "r2l_acc", "acc")


class Embedder:
  """L2-normalised float64 embeddings of images / texts through a named head."""

  def __init__(self, model, mesh, rules, batch_size: int):
    self.data_sharding = sharding.batch_sharding(mesh, rules)
    shards = sharding.batch_shards(mesh, rules)
    self.batch_size = -(-batch_size // shards) * shards  # Round up to whole shards.
    out = sharding.replicated(mesh)
    self._images = jax.jit(lambda v, x, head: model.apply(v, x, head, method="embed_images"),
                           static_argnums=2, out_shardings=out)
    self._texts = jax.jit(lambda v, ids, mask, head: model.apply(v, ids, mask, head, method="embed_texts"),
                          static_argnums=3, out_shardings=out)

  def _embed(self, fn, variables, arrays, head) -> np.ndarray:
    n, bs, outs = arrays[0].shape[0], self.batch_size, []
    for start in range(0, n, bs):
      chunk = [a[start:start + bs] for a in arrays]
      real = chunk[0].shape[0]
      if real < bs:  # Pad the tail to the compiled shape; padded rows are dropped.
        chunk = [np.concatenate([c, np.zeros((bs - real,) + c.shape[1:], c.dtype)]) for c in chunk]
      inputs = [sharding.from_full(c, self.data_sharding) for c in chunk]
      outs.append(sharding.to_host(fn(variables, *inputs, head or None))[:real])
    return metrics.unit_rows(np.concatenate(outs)) if outs else np.zeros((0, 0))

  def images(self, variables, images: np.ndarray, head: Optional[str]) -> np.ndarray:
    return self._embed(self._images, variables, [images], head)

  def texts(self, variables, ids: np.ndarray, mask: np.ndarray, head: Optional[str]) -> np.ndarray:
    return self._embed(self._texts, variables, [ids, mask], head)


class Retrieval:
  """Image<->text retrieval per language (eval_data.EvalSet), 'mean/mR' over the sets."""

  def __init__(self, sets: Sequence[Any], text_head: Optional[str], image_head: Optional[str] = None):
    self.sets, self.text_head, self.image_head = list(sets), text_head, image_head

  def run(self, embedder: Embedder, variables) -> Dict[str, float]:
    results, mrs, cache = {}, [], {}  # Languages of one dataset share an image array: embed it once.
    for s in self.sets:
      if id(s.images) not in cache:
        cache[id(s.images)] = embedder.images(variables, s.images, self.image_head)
      texts = embedder.texts(variables, s.text_ids, s.text_mask, self.text_head)
      scores = metrics.retrieval_metrics_from_embeddings(texts, cache[id(s.images)], s.text_to_image)
      mrs.append(scores["mR"])
      results.update({f"{s.name}/{k}": float(v) for k, v in scores.items()})
    if mrs:
      results["mean/mR"] = float(np.mean(mrs))
    return results


class Translation:
  """Translation retrieval per language pair (eval_data.TranslationEvalSet)."""

  def __init__(self, sets: Sequence[Any], head: Optional[str]):
    self.sets, self.head = list(sets), head

  def run(self, embedder: Embedder, variables) -> Dict[str, float]:
    results, embedded = {}, {}

    def texts(ids, mask):  # Sets may share a language's arrays (eval_data's multi30k): embed them once.
      if id(ids) not in embedded:
        embedded[id(ids)] = embedder.texts(variables, ids, mask, self.head)
      return embedded[id(ids)]

    for s in self.sets:
      left, right = texts(s.left_ids, s.left_mask), texts(s.right_ids, s.right_mask)
      scores = metrics.translation_accuracy_from_embeddings(left, right)
      results.update({f"{s.name}/{k}": float(v) for k, v in scores.items()})
    return results


def run_all(evaluators: Sequence[Any], embedder: Embedder, variables) -> Dict[str, float]:
  results = {}
  for e in evaluators:
    results.update(e.run(embedder, variables))
  return results


class Named:
  """The evaluators of one entry of config.data.eval_sets: '<name>.' before each result's set name."""

  def __init__(self, name: str, evaluators: Sequence[Any]):
    self.name, self.evaluators = name, list(evaluators)

  def run(self, embedder: Embedder, variables) -> Dict[str, float]:
    return {f"{self.name}.{k}": v for k, v in run_all(self.evaluators, embedder, variables).items()}


def evaluators_for(system, config, tasks, tokenizer) -> list:
  """The system's evaluators on config.data's eval data, then on each entry of data.eval_sets: the
  same evaluators over a config whose eval_source / eval_translations are the entry's."""
  out = list(system.evaluators(config, tasks, tokenizer))
  for name, entry in config.data.eval_sets.items():
    named = config_lib.with_eval_data(config, entry.get("source", dict(name="")),
                                      entry.get("translations", dict(name="")))
    try:
      out.append(Named(name, system.evaluators(named, tasks, tokenizer)))
    except ValueError as e:
      raise ValueError(f"config.data.eval_sets.{name} (read as data.eval_source and "
                       f"data.eval_translations): {e}") from None
  return out


def _groups(results: Mapping[str, float]) -> Dict[str, Dict[str, float]]:
  """'' -> the results of config.data's eval data; '<name>' -> those of eval_sets' entry (keys unprefixed)."""
  groups: Dict[str, Dict[str, float]] = {}
  for key, value in results.items():
    head, _, rest = key.partition("/")
    name, dot, set_name = head.partition(".")
    group, key = (name, f"{set_name}/{rest}") if dot else ("", key)
    groups.setdefault(group, {})[key] = value
  return groups


def format_table(results: Mapping[str, float]) -> str:
  """Retrieval rows (one per language) and translation rows as aligned text; each eval_sets entry
  in a table of its own under its name."""
  groups = _groups(results)
  tables = [_format_one(groups.pop("", {}))]
  tables += [f"{name}:\n{_format_one(group)}" for name, group in sorted(groups.items())]
  return "\n".join(t for t in tables if t)


def _format_one(results: Mapping[str, float]) -> str:
  names = sorted({k.split("/")[0] for k in results})
  retrieval = [n for n in names if f"{n}/i2t_R@1" in results]
  translation = [n for n in names if f"{n}/acc" in results]
  w = max([8] + [len(n) + 2 for n in retrieval + translation])  # The name column.
  lines = []
  if retrieval:
    lines.append(f"{'lang':<{w}}" + "".join(f"{c:>10}" for c in RECALL_COLUMNS))
    lines += [f"{n:<{w}}" + "".join(f"{results[f'{n}/{c}']:>10.1f}" for c in RECALL_COLUMNS)
              for n in retrieval]
    if "mean/mR" in results:
      lines.append(f"{'mean':<{w}}" + " " * 10 * (len(RECALL_COLUMNS) - 1) + f"{results['mean/mR']:>10.1f}")
  if translation:
    lines.append(f"{'pair':<{w}}" + "".join(f"{c:>10}" for c in TRANSLATION_COLUMNS))
    lines += [f"{n:<{w}}" + "".join(f"{results[f'{n}/{c}']:>10.1f}" for c in TRANSLATION_COLUMNS)
              for n in translation]
  return "\n".join(lines)


def training_directory(workdir: str) -> str:
  """WORKDIR/eval: training's evaluations, and --mode=eval's of the config the workdir records."""
  return os.path.join(workdir, "eval")


def directory_for(config, workdir: str, changed: Optional[Sequence[str]]) -> str:
  """Where --mode=eval writes: WORKDIR/eval, beside training's evaluations, for the config the
  workdir records (`changed`, the fields in which `config` differs from it, empty or None: no
  record); for another (other eval data, say), a directory of its own named after the fields
  that differ, which holds that config's record and a TensorBoard run, so that training's
  eval/step_<N>.json and curves stay its own."""
  default = training_directory(workdir)
  if not changed:
    return default
  values = config_lib.flat(config)
  name = ",".join(f"{k}={json.dumps(values.get(k))}" for k in changed)
  name = re.sub(r"[^\w.,=+-]+", "_", name)
  if len(name) > 100:
    name = "config-" + hashlib.sha1(name.encode()).hexdigest()[:10]
  directory = os.path.join(default, name)
  logging.info("The config differs from the one %s recorded, in: %s; results in %s.", workdir,
               ", ".join(changed), directory)
  if jax.process_index() == 0:
    epath.Path(directory).mkdir(parents=True, exist_ok=True)
    config_lib.write_record(config, directory)
  return directory


def report(results: Mapping[str, float], step: int, directory: str, writer) -> str:
  """Writes DIRECTORY/step_<N>.json (training's: WORKDIR/eval) and TensorBoard 'eval/...' scalars;
  logs the table."""
  table = format_table(results)
  logging.info("Evaluation at step %d:\n%s", step, table)
  if jax.process_index() == 0:
    path = epath.Path(directory) / f"step_{step}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    disk_space.write_file(path, json.dumps({"step": int(step), **results}, indent=1, sort_keys=True),
                          "evaluation results")
  writer.write_scalars(step, {f"eval/{k}": v for k, v in results.items()})
  writer.flush()
  return table
