"""The train state pytree and the error a run stops with."""

from typing import Any, Dict

import flax
import jax


class TrainingError(RuntimeError):
  """The run cannot go on; the message names the step and what to try."""


@flax.struct.dataclass
class TrainState:
  """Everything a step reads and writes, as one pytree (checkpointed whole)."""
  step: jax.Array  # int32 scalar: updates done.
  params: Any
  opt_state: Dict[str, Any]  # Task name -> that task's optimizer state (optim.py).
  batch_stats: Any  # Batch-norm running statistics of the image tower.
  rng: jax.Array  # Base key; step s uses fold_in(rng, s).

  def variables(self) -> dict:
    """What model.apply takes."""
    return {"params": self.params, "batch_stats": self.batch_stats}
