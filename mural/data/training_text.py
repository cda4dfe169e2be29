"""The training text that vocabularies learn from: the first RECORDS_PER_SOURCE records of each
active task's training sources, their text and language fields only. A source two tasks read
as the same record kind (SMALR's pairs and latent tasks) is read once: its text counts once.

Its own module so that both vocabularies (vocab.py's wordpiece, word_vocab.py's per-language
words) read the same records from below, and neither imports the other back.
"""

import json
from typing import Iterator, Sequence

from mural.data import records
from mural.data import sources

# Records read per training source to learn a vocab when none is configured.
RECORDS_PER_SOURCE = 10_000
_READ_BATCH = 1024


def training_records(config, tasks: Sequence) -> Iterator[tuple]:
  """(task, {field: value}) for the first RECORDS_PER_SOURCE records of each task's sources,
  holding the text fields and their language fields only.

  Read in batches of the text fields: a tf.data element per record costs more than the record
  (the demo's 20k records: 26 s one by one, images included)."""
  seen = set()
  for task in tasks:
    fields = set(task.input.text_fields) | {f for pair in getattr(task.input, "text_langs", ()) for f in pair}
    for sc in task.sources:
      key = (task.input.name, json.dumps({k: v for k, v in dict(sc).items() if k != "weight"},
                                         sort_keys=True, default=str))
      if key in seen:
        continue
      seen.add(key)
      ds = task.input.table[sc["name"]](dict(sc), "train", 0, 1, config=config)
      if isinstance(ds, sources.Endless):
        ds = (ds.open_text_at or ds.open_at)(0)
      else:  # The vocabulary reads no held-out text either.
        ds = records.holdout_side(ds, records.holdout_key(task.input.has_image),
                                  records.holdout_fraction(sc, f"config.tasks.{task.name}.sources"), held_out=False)
      texts = ds.take(RECORDS_PER_SOURCE).map(lambda r: {f: r[f] for f in fields}).batch(_READ_BATCH)
      texts = texts.with_options(records.run_options(config.data))  # Its deletion need not wait.
      for batch in texts.as_numpy_iterator():
        for i in range(len(next(iter(batch.values())))):
          yield task, {f: v[i] for f, v in batch.items()}
