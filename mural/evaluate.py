"""Retrieval evaluation: embed the eval sets, score them with mural.metrics, report.

`Evaluator.run(variables)` embeds every EvalSet (images and captions of one
language) and TranslationEvalSet (aligned sentence pairs) in fixed-size
batches with the model under jit, scores cosine similarities with
mural.metrics (pure NumPy), and returns flat `{'<set>/<metric>': value}`.
`report()` writes workdir/eval/step_<N>.json, TensorBoard scalars and a
console table. The maths lives in mural.metrics; this file only moves data.

Multi-host: every process holds the whole (small) eval set; each batch is a
global array sharded over the batch axes, embeddings come back replicated, so
every process computes the same numbers and process 0 writes them.
"""

import json
from typing import Any, Dict, Mapping, Sequence

import jax
import numpy as np
from absl import logging
from etils import epath

from mural import metrics
from mural import sharding
from mural.models import DualEncoder

RECALL_COLUMNS = ("i2t_R@1", "i2t_R@5", "i2t_R@10", "t2i_R@1", "t2i_R@5", "t2i_R@10", "mR")
TRANSLATION_COLUMNS = ("l2r_acc", "r2l_acc", "acc")


def to_host(x: jax.Array) -> np.ndarray:
  """A replicated (or fully addressable) global array as NumPy, on any process."""
  if x.is_fully_addressable:
    return np.asarray(x)
  if not x.sharding.is_fully_replicated:
    raise ValueError(f"to_host needs a replicated array, got {x.sharding}")
  return np.asarray(x.addressable_data(0))


def _normalize(x: np.ndarray) -> np.ndarray:
  x = np.asarray(x, np.float64)
  return x / np.maximum(np.linalg.norm(x, axis=-1, keepdims=True), 1e-12)


class Evaluator:
  """Embeds eval sets with one jit per input kind (fixed batch shape, padded tail)."""

  def __init__(self, model: DualEncoder, eval_sets: Sequence[Any], mesh, rules,
               batch_size: int, translation_task: str = "t2t"):
    self.eval_sets = list(eval_sets)
    self.data_sharding = sharding.batch_sharding(mesh, rules)
    shards = sharding.batch_shards(mesh, rules)
    self.batch_size = -(-batch_size // shards) * shards  # Round up to whole shards.
    out = sharding.replicated(mesh)
    self._images = jax.jit(
        lambda v, x: model.apply(v, x, train=False, method=DualEncoder.embed_images),
        out_shardings=out)
    self._texts = {
        task: jax.jit(lambda v, ids, mask, task=task: model.apply(
            v, ids, mask, task=task, train=False, method=DualEncoder.embed_texts), out_shardings=out)
        for task in {"i2t", translation_task}}
    self.translation_task = translation_task

  def _embed(self, fn, variables, *arrays: np.ndarray) -> np.ndarray:
    n, bs, outs = arrays[0].shape[0], self.batch_size, []
    for start in range(0, n, bs):
      chunk = [a[start:start + bs] for a in arrays]
      real = chunk[0].shape[0]
      if real < bs:  # Pad the tail to the compiled shape; padded rows are dropped.
        chunk = [np.concatenate([c, np.zeros((bs - real,) + c.shape[1:], c.dtype)]) for c in chunk]
      inputs = [sharding.from_full(c, self.data_sharding) for c in chunk]
      outs.append(to_host(fn(variables, *inputs))[:real])
    return np.concatenate(outs) if outs else np.zeros((0, 0), np.float32)

  def run(self, variables: Mapping[str, Any]) -> Dict[str, float]:
    """{'<set name>/<metric>': value} plus 'mean/mR' over the retrieval sets."""
    results, mrs = {}, []
    image_cache = {}  # Languages of one dataset share their image array: embed it once.
    for s in self.eval_sets:
      if hasattr(s, "images"):
        if id(s.images) not in image_cache:
          image_cache[id(s.images)] = _normalize(self._embed(self._images, variables, s.images))
        images = image_cache[id(s.images)]
        texts = _normalize(self._embed(self._texts["i2t"], variables, s.text_ids, s.text_mask))
        scores = metrics.retrieval_metrics(texts @ images.T, s.text_to_image)
        mrs.append(scores["mR"])
      else:
        embed = self._texts[self.translation_task]
        left = _normalize(self._embed(embed, variables, s.left_ids, s.left_mask))
        right = _normalize(self._embed(embed, variables, s.right_ids, s.right_mask))
        scores = metrics.translation_accuracy(left @ right.T)
      results.update({f"{s.name}/{k}": float(v) for k, v in scores.items()})
    if mrs:
      results["mean/mR"] = float(np.mean(mrs))
    return results


def format_table(results: Mapping[str, float]) -> str:
  """Retrieval rows (one per language) and translation rows as aligned text."""
  names = sorted({k.split("/")[0] for k in results})
  lines = []
  retrieval = [n for n in names if f"{n}/i2t_R@1" in results]
  if retrieval:
    lines.append(f"{'lang':<8}" + "".join(f"{c:>10}" for c in RECALL_COLUMNS))
    lines += [f"{n:<8}" + "".join(f"{results[f'{n}/{c}']:>10.1f}" for c in RECALL_COLUMNS)
              for n in retrieval]
    if "mean/mR" in results:
      lines.append(f"{'mean':<8}" + " " * 10 * (len(RECALL_COLUMNS) - 1) + f"{results['mean/mR']:>10.1f}")
  translation = [n for n in names if f"{n}/acc" in results]
  if translation:
    lines.append(f"{'pair':<8}" + "".join(f"{c:>10}" for c in TRANSLATION_COLUMNS))
    lines += [f"{n:<8}" + "".join(f"{results[f'{n}/{c}']:>10.1f}" for c in TRANSLATION_COLUMNS)
              for n in translation]
  return "\n".join(lines)


class SummaryWriter:
  """TensorBoard scalars via TF's core summary op (no tensorboard package needed).

  Writes the same event protos tf.summary.scalar does (scalars plugin);
  only process 0 writes.
  """

  def __init__(self, logdir: str):
    import tensorflow as tf  # Deferred: only the writing process pays the import.
    from tensorflow.core.framework import summary_pb2
    self._tf = tf
    self._writer = tf.summary.create_file_writer(str(logdir)) if jax.process_index() == 0 else None
    self._metadata = summary_pb2.SummaryMetadata(
        plugin_data=summary_pb2.SummaryMetadata.PluginData(plugin_name="scalars"),
        data_class=summary_pb2.DATA_CLASS_SCALAR)

  def write_scalars(self, step: int, scalars: Mapping[str, float]):
    if self._writer is None:
      return
    with self._writer.as_default():
      for tag, value in scalars.items():
        self._tf.summary.write(tag, self._tf.constant(float(value), self._tf.float32),
                               step=int(step), metadata=self._metadata)
    self._writer.flush()

  def close(self):
    if self._writer is not None:
      self._writer.close()


def report(results: Mapping[str, float], step: int, workdir: str, writer: SummaryWriter) -> str:
  """Writes workdir/eval/step_<N>.json and TensorBoard 'eval/...' scalars; logs the table."""
  table = format_table(results)
  logging.info("Evaluation at step %d:\n%s", step, table)
  if jax.process_index() == 0:
    path = epath.Path(workdir) / "eval" / f"step_{step}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"step": int(step), **results}, indent=1, sort_keys=True))
  writer.write_scalars(step, {f"eval/{k}": v for k, v in results.items()})
  return table
