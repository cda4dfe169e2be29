"""A locked tower (LiT, Zhai et al. 2022): it embeds, but does not train.

`Locked(tower)` runs the tower in inference mode (batch norm on its running
statistics, no dropout) and stops the gradient at its outputs. So the step's
backward pass never enters it, and no task's optimizer holds state for it:
mural/optim.py trains only the parameters a loss's gradient reaches. The tower
keeps its own parameter names (it shares this module's scope), so a locked run
reads and writes the same checkpoints, warm starts and exports as an unlocked
one, and an imported or trained tower can be locked for tuning the other.
"""

import flax.linen as nn
import jax


class Locked(nn.Module):
  """`tower`, in inference mode and without a gradient, under the tower's own parameter names."""
  tower: nn.Module

  def setup(self):
    nn.share_scope(self, self.tower)

  @property
  def output_dim(self) -> int:
    return self.tower.output_dim

  def __call__(self, *args, train: bool = False, **kwargs):
    del train  # Always inference mode: the batch statistics stay those it was trained with.
    return jax.tree.map(jax.lax.stop_gradient, self.tower(*args, train=False, **kwargs))
