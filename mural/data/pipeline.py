"""The training input: one batch per task per step, for any system's tasks.

`build_train_iterator(config, tasks, tokenizer, process_index=, process_count=, seed=,
sources=)` returns a `TrainIterator` (`sources`: `open_train_sources`' for the same
tasks, opened earlier so that a bad source fails early); `next(it)` is
`{task name: {key: NumPy array}}`, this process's part of each task's global
batch, with the keys and fixed shapes of the task's record kind
(mural/data/inputs.py; e.g. image-text: 'image', 'text_ids', 'text_mask',
'valid', plus 'lang' for the host), ready for
`jax.make_array_from_process_local_data`. A task here is anything with
`name`, `input` (a RecordKind), `sources` (source configs) and `batch_size`
(global); the pipeline knows no task by name. A task with
`one_source_per_batch` gets each batch whole from one source, drawn by
source weight per batch (one source per language: batches of one language).

Per task, each source is one stream (one process's shard, see sources.py):
  epochs of shuffled raw records, each record keyed by (epoch, position)
  -> cheap checks (language, text, image bytes) give a status
  -> language sampling (keeps records of language l with probability a_l)
  -> image decode under a per-record guard, then random crop + flip
  -> a running count of skipped records by reason -> drop skipped records.
Per record that is one tf.data map (two more while images need decoding); the count and
the drop run on chunks of records (tf.data's cost is per element and stage).
The sources are mixed by weight, batched, tokenised per batch and prefetched.

Language sampling: within a source, language (text pairs: language pair) l is drawn
with p_l ∝ n_l^(1/T), T = data.language_sampling_temperature, n_l its records
on this process (one counting pass over the 'lang' fields at build time,
skipped when T == 1). It is done by thinning: a record of l is kept with
probability a_l = (p_l / q_l) / max_k (p_k / q_k), q_l = n_l / n, so the kept
stream has exactly the proportions p; the scarcest-relative-to-target language
is never thinned. Records it drops are not skips; they may be drawn next epoch.

Bad records never crash and never vanish silently: each record gets one status
(the first failing check, in SKIP_REASONS order). A `scan` over chunks carries a
running count per reason through the stream, so every emitted record holds the number
of records its source skipped up to and including it; `skip_counts()` reads
those of the last consumed record of each source. Counts therefore match what
training consumed (not what tf.data read ahead), and they resume exactly.
Records are counted when they reach validation, i.e. after language sampling
(all of them when T == 1); records in an unknown language are never thinned.
Decoding errors that no cheap check catches (a PNG with a bad CRC, a JPEG with
a broken header) are caught per record: the decode runs in a one-element
dataset with `ignore_errors()` followed by a fallback element marked
'undecodable_image', so exactly one element comes out per record and the error
cannot come from anything but the decode op.

Determinism and resume: all randomness is stateless, keyed by (seed, process,
source, epoch, position) for records and by the element number for the source
mixture; epoch e of a source is its records shuffled with a seed derived from
e. So the stream is a pure function of the seed, and the state that restores
it is small: per source (epoch, next position, skip counts) of its last
consumed record, plus the number of records consumed (the mixture's draws).
`set_state` rebuilds the streams starting at those positions (re-reading, not
decoding, at most one epoch of raw records per source), and the next batches
equal those of an uninterrupted iterator. The state is per process and only
valid for the same seed, process_index/process_count and sources.
An `Endless` source (the synthetic one) is opened at the resume position
directly (no re-reading) and not reshuffled here (it permutes each epoch
itself); it reports its own language counts.
tf.data's own iterator checkpoints were not used: they would store the shuffle
buffers (thousands of encoded images) instead of a few integers.
"""

import atexit
import dataclasses
import json
import re
import weakref
from typing import Callable, Dict, List, Optional, Sequence

import numpy as np
import tensorflow as tf

from mural.data import preprocess
from mural.data import records
from mural.data import sources as sources_lib

SKIP_REASONS = records.SKIP_REASONS
_OK, _STATUS = records.OK, records.STATUS
# A source whose records are skipped this many times in a row is unusable
# (e.g. none of its languages is in data.languages): fail loudly, don't spin.
MAX_CONSECUTIVE_SKIPS = 10_000
_STATE_VERSION = 1
_FOREVER = 2**62


# ---------------------------------------------------------------------------
# Pure helpers (unit-tested directly).


def language_probabilities(counts: Sequence[float], temperature: float) -> np.ndarray:
  """p_l ∝ n_l^(1/T) over languages with n_l > 0 (zeros stay zero)."""
  n = np.asarray(counts, np.float64)
  if not np.any(n > 0):
    raise ValueError("language_probabilities: every language count is zero")
  w = np.where(n > 0, np.power(np.maximum(n, 1e-300), 1.0 / temperature), 0.0)
  return w / w.sum()


def language_acceptance(counts: Sequence[float], temperature: float) -> np.ndarray:
  """Keep-probabilities that thin a stream with counts n_l to p_l ∝ n_l^(1/T)."""
  n = np.asarray(counts, np.float64)
  p = language_probabilities(n, temperature)
  ratio = np.where(n > 0, p / np.maximum(n / n.sum(), 1e-300), 0.0)
  return ratio / ratio.max()


def _fold(seed, *data) -> tf.Tensor:
  """A stateless seed int64 [2] derived from `seed` and integers (tensors or ints)."""
  seed = tf.convert_to_tensor(seed, tf.int64)
  for d in data:
    seed = tf.random.experimental.stateless_fold_in(seed, tf.cast(d, tf.int64))
  return seed


def _int_seed(seed: tf.Tensor) -> tf.Tensor:
  """A scalar int64 seed hashed from all of a stateless seed (fold_in keeps data in word 1)."""
  return tf.random.stateless_uniform([], seed, minval=None, maxval=None, dtype=tf.int64)


# ---------------------------------------------------------------------------
# One source of one task as a stream of validated, preprocessed records.


@dataclasses.dataclass
class _Source:
  """A finite `raw` stream (the pipeline makes epochs of it), or `open_at`.

  `open_at(k)`: an endless, already shuffled stream starting at this process's
  k-th record (the synthetic source: cheap to resume, not reshuffled here).
  """
  name: str
  weight: float
  raw: Optional[tf.data.Dataset]
  open_at: Optional[Callable[[int], tf.data.Dataset]]
  acceptance: Optional[np.ndarray]  # None: no language thinning.


def _guarded_decode(ds: tf.data.Dataset, num_parallel_calls: int) -> tf.data.Dataset:
  """Decodes element['image'] bytes; a record that fails to decode gets 'undecodable_image'.

  One element in, one element out, in order: each record is decoded in its own
  one-element dataset whose only op is the decode (so `ignore_errors` there
  can only swallow a decode error), followed by a fallback copy of the record
  marked undecodable; `take(1)` keeps the first.
  """

  def one(e):
    rec = tf.data.Dataset.from_tensors(e)

    def decode(x):
      x = dict(x)
      x["image"] = tf.cond(tf.equal(x["status"], _OK), lambda: preprocess.decode(x["image"]),
                           lambda: tf.zeros([1, 1, 3], tf.uint8))
      return x

    def fallback(x):
      x = dict(x)
      x["image"] = tf.zeros([1, 1, 3], tf.uint8)
      x["status"] = tf.constant(_STATUS["undecodable_image"])
      return x

    return rec.map(decode).ignore_errors().concatenate(rec.map(fallback)).take(1)

  cycle = None if num_parallel_calls == tf.data.AUTOTUNE else num_parallel_calls  # None: CPU count.
  return ds.interleave(one, cycle_length=cycle, block_length=1, num_parallel_calls=num_parallel_calls,
                       deterministic=True)


def _source_stream(task, src: _Source, index: int, state: dict, seed,
                   data_config, num_parallel_calls: int) -> tf.data.Dataset:
  """Validated, preprocessed records of one source, from `state` on, forever.

  Per record: one map (checks, language sampling, and the crop unless the images still need
  decoding); per chunk of records: the skip counts and the drop of skipped and thinned
  records. Each stage of tf.data costs per element, so the fewer per-record stages the
  cheaper the stream (benchmarks/bench_pipeline.py).
  """
  buffer = data_config.shuffle_buffer
  src_seed = _fold(seed, index)

  def epoch(e):
    ds = src.raw
    if buffer > 1:
      ds = ds.shuffle(buffer, seed=_int_seed(_fold(src_seed, e)), reshuffle_each_iteration=False)
    return ds.enumerate().map(lambda pos, x: (tf.cast(e, tf.int64), pos, x))

  start_epoch, start_pos = state["epoch"], state["next_pos"]
  if src.open_at is not None:  # One epoch (0) of (position, record); `prepare` adds the epoch.
    ds = src.open_at(start_pos).enumerate(start=start_pos)
  else:
    first = epoch(tf.constant(start_epoch, tf.int64)).skip(start_pos)
    rest = tf.data.Dataset.range(start_epoch + 1, _FOREVER).flat_map(epoch)
    ds = first.concatenate(rest)

  languages = tf.constant(list(data_config.languages))
  max_chars = data_config.max_text_chars
  accept = None if src.acceptance is None else tf.constant(src.acceptance, tf.float32)
  decode = task.input.has_image and ds.element_spec[-1]["image"].dtype == tf.string
  crop = _crop_fn(task.input, data_config) if task.input.has_image else None

  def prepare(*element):
    e, pos, raw = element if len(element) == 3 else (tf.constant(0, tf.int64), *element)
    x = task.input.check(raw, languages, max_chars)
    x.update(_epoch=e, _pos=pos, _seed=_fold(src_seed, e, pos))
    if accept is not None:  # Thinned records are dropped uncounted; skipped ones are always kept.
      u = tf.random.stateless_uniform([], _fold(x["_seed"], 1))
      x["_keep"] = tf.logical_or(tf.not_equal(x["status"], _OK),
                                 u < tf.gather(accept, tf.maximum(x["lang_key"], 0)))
    if crop is not None and not decode:
      x = crop(x)
    return x

  ds = ds.map(prepare, num_parallel_calls=num_parallel_calls, deterministic=True)
  if decode:
    if accept is not None:  # Thin before decoding: a thinned record costs no decode.
      ds = ds.filter(lambda x: x["_keep"])
    ds = _guarded_decode(ds, num_parallel_calls)
    ds = ds.map(crop, num_parallel_calls=num_parallel_calls, deterministic=True)
  return _counted(ds, index, state["skips"])


def _crop_fn(kind, data_config) -> Callable[[dict], dict]:
  """record -> record with its training image(s): the kind's views or the crop (+ flip), float32
  [S, S, 3]; a skipped or thinned record gets a blank one at no cost (it is dropped later)."""
  size = data_config.image_size
  views = kind.train_views  # A kind's own augmentation (e.g. two SimCLR views), or None.

  def crop(x):
    x = dict(x)
    use = tf.equal(x["status"], _OK)
    if "_keep" in x:
      use = tf.logical_and(use, x["_keep"])
    if views is None:
      x["image"] = tf.cond(
          use,
          lambda: preprocess.train_image(
              x["image"], _fold(x["_seed"], 2), size, tuple(data_config.crop_area_range),
              tuple(data_config.crop_aspect_range), data_config.random_flip),
          lambda: tf.zeros([size, size, 3], tf.float32))
      return x
    blank = tf.zeros([size, size, 3], tf.uint8)  # A skipped record's views (dropped later).
    x.update(tf.cond(use, lambda: views(x["image"], _fold(x["_seed"], 2), data_config),
                     lambda: views(blank, _fold(x["_seed"], 2), data_config)))
    return x

  return crop


_CHUNK = 64  # Records per step of the skip count (see _counted).


_SKIP_LIMIT = "mural: skip limit reached by source"  # _counted's assertion; _Task.next reads it.


def _counted(ds: tf.data.Dataset, index: int, skips: Sequence[int]) -> tf.data.Dataset:
  """The usable records of `ds`, each with its source's running skip counts ('_skips').

  Runs on chunks of _CHUNK records (a scan over chunks, cumulative sums inside one): a scan
  and a filter per record cost more than the rest of a small record's stages together. A
  record's counts include itself and every skipped record before it; thinned records
  ('_keep' False) are neither counted nor emitted. Fails after MAX_CONSECUTIVE_SKIPS skipped
  records in a row (an assertion that _Task.next turns into a ValueError naming the source).
  """
  num_reasons = len(SKIP_REASONS)
  limit = MAX_CONSECUTIVE_SKIPS  # Read when the stream is built (tests lower it).

  def count(carry, chunk):
    counts, run = carry  # Counts by reason so far; skipped records since the last usable one.
    status = chunk.pop("status")
    keep = chunk.pop("_keep", tf.ones_like(status, tf.bool))
    for k in ("lang_key", "_seed"):
      chunk.pop(k)
    bad = tf.logical_and(keep, tf.not_equal(status, _OK))
    good = tf.logical_and(keep, tf.equal(status, _OK))
    per_record = tf.one_hot(status - 1, num_reasons, dtype=tf.int64)  # Status 0 -> zeros.
    running = counts + tf.cumsum(per_record * tf.cast(bad, tf.int64)[:, None], axis=0)
    # Skipped records in a row at each record: bad ones so far minus those at the last
    # usable record before it (or, before the chunk's first usable one, plus the carried run).
    bad_so_far = tf.cumsum(tf.cast(bad, tf.int64))
    at_good = tf.concat([[-run], tf.boolean_mask(bad_so_far, good)], 0)
    runs = bad_so_far - tf.gather(at_good, tf.cumsum(tf.cast(good, tf.int32)))
    check = tf.debugging.Assert(tf.reduce_all(runs < limit),
                                [f"{_SKIP_LIMIT} {index}, counts:", running[-1]], summarize=num_reasons)
    with tf.control_dependencies([check]):
      out = {k: tf.boolean_mask(v, good) for k, v in chunk.items()}
    out.update(_skips=tf.boolean_mask(running, good),
               _source=tf.fill(tf.shape(out["_pos"]), tf.constant(index, tf.int32)))
    return (running[-1], runs[-1]), out

  ds = ds.batch(_CHUNK).scan((tf.constant(skips, tf.int64), tf.constant(0, tf.int64)), count)
  return ds.unbatch()


def _language_counts(kind, raw: tf.data.Dataset, data_config) -> np.ndarray:
  """Records per language key in `raw` (one pass over it; unknown ones ignored)."""
  table = tf.constant(list(data_config.languages))
  keys = raw.map(lambda r: kind.lang_key(r, table), num_parallel_calls=tf.data.AUTOTUNE).batch(4096)
  keys = keys.with_options(records.run_options(data_config))
  size = kind.num_lang_keys(len(data_config.languages))
  counts = np.zeros(size, np.int64)
  for k in keys.as_numpy_iterator():
    k = k[k >= 0]
    counts += np.bincount(k, minlength=size)
  return counts


# ---------------------------------------------------------------------------
# The iterator.


class _Task:
  """One task's sources, its tf.data pipeline and the state that rebuilds it."""

  def __init__(self, name: str, kind, batch_size: int, tokenizer, sources: List[_Source], seed,
               data_config, one_source_per_batch: bool = False):
    self.name, self.input, self.batch_size, self.tokenizer = name, kind, batch_size, tokenizer
    self.one_source_per_batch = one_source_per_batch
    self.sources, self.seed, self.data = sources, seed, data_config
    # elements: records consumed (= draws of the source mixture); per source,
    # where its stream continues and its skip counts so far.
    self.state = dict(elements=0, sources=[dict(epoch=0, next_pos=0, skips=[0] * len(SKIP_REASONS))
                                           for _ in sources])
    self._it = None
    _OPEN_TASKS.add(self)

  @tf.autograph.experimental.do_not_convert  # See _open_sources.
  def dataset(self) -> tf.data.Dataset:
    """The batches from `state` on (records, then `finish`ed batches), with this run's options."""
    par = self.data.num_parallel_calls
    par = tf.data.AUTOTUNE if par == -1 else par
    streams = [_source_stream(self, s, i, self.state["sources"][i], self.seed, self.data, par)
               for i, s in enumerate(self.sources)]
    per_batch = self.one_source_per_batch and len(streams) > 1
    if len(streams) == 1:
      ds = streams[0]
    else:
      logits = tf.constant(np.log([s.weight for s in self.sources]), tf.float32)[None]
      mix_seed = _fold(self.seed, 1_000_000)
      # One draw per record, or per batch (the whole batch from the drawn source); consumed
      # batches are whole, so elements // batch_size is the next batch's draw.
      first = self.state["elements"] // self.batch_size if per_batch else self.state["elements"]
      choice = tf.data.Dataset.range(first, _FOREVER).map(
          lambda i: tf.random.stateless_categorical(logits, 1, _fold(mix_seed, i))[0, 0])
      if per_batch:
        streams = [s.batch(self.batch_size, drop_remainder=True) for s in streams]
      ds = tf.data.Dataset.choose_from_datasets(streams, choice)
    if not per_batch:
      ds = ds.batch(self.batch_size, drop_remainder=True)
    keep = ("_source", "_epoch", "_pos", "_skips")
    # Locals, not `self`: a cycle would keep the iterator alive until exit.
    finish, tokenizer = self.input.finish, self.tokenizer
    ds = ds.map(lambda b: {**finish(b, tokenizer), **{k: b[k] for k in keep}},
                num_parallel_calls=par, deterministic=True)
    return ds.prefetch(self.data.prefetch_batches).with_options(records.run_options(self.data))

  def next(self) -> dict:
    if self._it is None:
      self._it = self.dataset().as_numpy_iterator()
    try:
      batch = next(self._it)
    except tf.errors.InvalidArgumentError as e:
      found = re.search(re.escape(_SKIP_LIMIT) + r" (\d+), counts:\] \[([\d ]+)\]", e.message)
      if not found:
        raise
      index, counts = int(found.group(1)), [int(n) for n in found.group(2).split()]
      reasons = ", ".join(f"{r} {n}" for r, n in zip(SKIP_REASONS, counts) if n)
      raise ValueError(
          f"config.tasks.{self.name}.sources[{index}] ({self.sources[index].name!r}): "
          f"{MAX_CONSECUTIVE_SKIPS} records in a row were skipped (so far, by reason: {reasons}), "
          f"so it has no usable records: check that it is the data meant and that its languages "
          f"are in config.data.languages {tuple(self.data.languages)}") from None
    source, epoch, pos, skips = (batch.pop(k) for k in ("_source", "_epoch", "_pos", "_skips"))
    for i, st in enumerate(self.state["sources"]):
      rows = np.flatnonzero(source == i)
      if rows.size:
        last = rows[-1]
        st.update(epoch=int(epoch[last]), next_pos=int(pos[last]) + 1,
                  skips=[int(v) for v in skips[last]])
    self.state["elements"] += len(source)
    return batch

  def close(self):
    self._it = None

  def set_state(self, state: dict):
    if len(state["sources"]) != len(self.sources):
      raise ValueError(f"set_state: {self.name} state has {len(state['sources'])} sources, "
                       f"the config {len(self.sources)}")
    self.state = json.loads(json.dumps(state))
    self._it = None

  def skip_counts(self) -> Dict[str, int]:
    totals = np.sum([s["skips"] for s in self.state["sources"]], axis=0)
    return {f"{self.name}/{r}": int(n) for r, n in zip(SKIP_REASONS, totals) if r in self.input.reasons}


class TrainIterator:
  """`next()` -> the step's NumPy batch dict; `get_state`/`set_state`; `skip_counts`."""

  def __init__(self, tasks: List[_Task], fingerprint: dict):
    self._tasks = tasks
    self._fingerprint = fingerprint

  def __iter__(self):
    return self

  def __next__(self) -> dict:
    return {t.name: t.next() for t in self._tasks}

  def get_state(self) -> dict:
    """Small JSON-able dict; `set_state` on a freshly built iterator resumes exactly."""
    return json.loads(json.dumps(dict(version=_STATE_VERSION, fingerprint=self._fingerprint,
                                      tasks={t.name: t.state for t in self._tasks})))

  def set_state(self, state: dict) -> None:
    if state.get("version") != _STATE_VERSION:
      raise ValueError(f"set_state: state version {state.get('version')} != {_STATE_VERSION}")
    if state["fingerprint"] != self._fingerprint:
      raise ValueError(f"set_state: the state was made by a different input setup "
                       f"{state['fingerprint']}, this iterator is {self._fingerprint}")
    for t in self._tasks:
      t.set_state(state["tasks"][t.name])

  def skip_counts(self) -> Dict[str, int]:
    """Records skipped so far by the consumed stream, by '<task>/<reason>'."""
    out = {}
    for t in self._tasks:
      out.update(t.skip_counts())
    return out

  def close(self) -> None:
    """Stops tf.data's threads; `next` afterwards restarts from the current state."""
    for t in self._tasks:
      t.close()


# A tf.data iterator still running when Python exits can hang the exit: its
# threads call back into Python (the synthetic source's numpy_function) while
# the interpreter shuts down. Close every live iterator first.
_OPEN_TASKS = weakref.WeakSet()


@atexit.register
def _close_open_iterators():
  for task in list(_OPEN_TASKS):
    task.close()


def _per_process(global_size: int, process_count: int, field: str) -> int:
  if global_size % process_count:
    raise ValueError(f"config.{field}: {global_size} is not divisible by process_count {process_count}")
  return global_size // process_count


# The functions the pipeline hands to tf.data (its own, the sources', the record kinds') are
# written for graph mode (tf.cond, no Python branch on a tensor), so AutoGraph has nothing to
# convert in them: with it off while the datasets are built, a process starts 1.3-2.7 CPU-s
# sooner (the tiny config's two tasks: 39 conversions, 46 with the vocab learner's) and builds
# the same graphs (the same batches, bit for bit).
@tf.autograph.experimental.do_not_convert
def _open_sources(task, config, process_index, process_count) -> List[_Source]:
  """Opens (and checks) every source of a task; errors name the config entry."""
  temperature = config.data.language_sampling_temperature
  languages = list(config.data.languages)
  kind = task.input
  out = []
  for i, sc in enumerate(task.sources):
    sc = dict(sc)
    name, field = sc.get("name"), f"config.tasks.{task.name}.sources[{i}]"
    if name not in kind.table:
      raise ValueError(f"{field}: unknown {kind.name} source {name!r}; known: {sorted(kind.table)}")
    opened = kind.table[name](sc, "train", process_index, process_count, config=config)
    holdout = records.holdout_fraction(sc, field)
    raw = open_at = counts = None
    if holdout and isinstance(opened, sources_lib.Endless):
      raise ValueError(f"{field}.holdout: the {name!r} source has its own held-out data "
                       "(eval_source 'synthetic')")
    if isinstance(opened, sources_lib.Endless):
      open_at, first = opened.open_at, opened.open_at(0)
      counts = np.zeros(kind.num_lang_keys(len(languages)), np.int64)
      for key_name, n in opened.language_counts.items():
        key = kind.key_of_name(key_name, languages)
        if key >= 0:
          counts[key] += n
    else:
      raw = first = records.holdout_side(opened, records.holdout_key(kind.has_image), holdout, held_out=False)
    if next(iter(first.take(1)), None) is None:
      raise ValueError(f"{field} ({name!r}): no records on process {process_index} of {process_count}")
    acceptance = None
    if temperature != 1.0:
      counts = _language_counts(kind, raw, config.data) if counts is None else counts
      if not counts.any():
        raise ValueError(f"{field} ({name!r}): no record is in a language of config.data.languages")
      acceptance = language_acceptance(counts, temperature)
    out.append(_Source(name, float(sc.get("weight", 1.0)), raw, open_at, acceptance))
  return out


def open_train_sources(config, tasks: Sequence, *, process_index: int = 0,
                       process_count: int = 1) -> Dict[str, List[_Source]]:
  """Every task's training sources, opened and checked (a fraction of a second on paths that
  exist): the trainer opens them before it traces the step, so that a missing path or a bad
  record is an error in seconds, not after the trace."""
  return {task.name: _open_sources(task, config, process_index, process_count) for task in tasks}


def build_train_iterator(config, tasks: Sequence, tokenizer, *, process_index: int = 0,
                         process_count: int = 1, seed: Optional[int] = None,
                         sources: Optional[Dict[str, List[_Source]]] = None) -> TrainIterator:
  """The training stream of this process for `tasks` (see the module docstring), from `sources`
  (open_train_sources' for the same tasks and process) or from sources it opens."""
  seed = config.seed if seed is None else seed
  if sources is None:
    sources = open_train_sources(config, tasks, process_index=process_index, process_count=process_count)
  streams = []
  for k, task in enumerate(tasks):
    batch = _per_process(task.batch_size, process_count, f"tasks.{task.name}.batch_size")
    task_seed = [int(seed), process_index * len(tasks) + k]
    streams.append(_Task(task.name, task.input, batch, tokenizer, sources[task.name], task_seed, config.data,
                         bool(getattr(task, "one_source_per_batch", False))))
  fingerprint = dict(seed=int(seed), process_index=process_index, process_count=process_count,
                     sources={t.name: [s.name for s in t.sources] for t in streams})
  return TrainIterator(streams, fingerprint)
