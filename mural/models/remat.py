"""Activation rematerialisation per block (config.model.image.remat / model.text.remat).

A tower wraps each repeated block (an MBConv, a BERT layer) with `nn.remat`
under one of the policies below: the backward pass recomputes what the
policy does not save, trading compute for activation memory. Parameter
names are unchanged (a remat block keeps its name), so checkpoints load
across policies, and the gradients are the same function (tests/test_models.py).

  none  keep every activation (no remat; the fastest step, the most memory)
  full  keep only each block's input; recompute the whole block
  dots  keep the outputs of matrix multiplies without batch dimensions
        (jax.checkpoint_policies.dots_with_no_batch_dims_saveable: dense
        layers and 1x1 convolutions written as dots), recompute the
        elementwise work between them (norms, activations, attention softmax)
"""

import flax.linen as nn
import jax

from mural import config_lib

POLICIES = {
    "none": None,
    "full": jax.checkpoint_policies.nothing_saveable,
    "dots": jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
}
assert tuple(POLICIES) == config_lib.REMAT_POLICIES  # Validated by name before JAX loads.


def check(policy: str, field: str) -> str:
  """policy, or a ConfigError naming config.<field>."""
  if policy not in POLICIES:
    raise config_lib.ConfigError(f"config.{field}: {policy!r} not in {list(POLICIES)}")
  return policy


def block(cls, policy: str, static_argnums):
  """cls itself (policy 'none'), or cls under nn.remat with that policy.

  static_argnums: the positions of the block's Python-valued call arguments
  (`train`), counting `self` as 0, as nn.remat does.
  """
  if policy == "none":  # Checked by the tower's from_config (check above).
    return cls
  return nn.remat(cls, policy=POLICIES[policy], static_argnums=static_argnums, prevent_cse=True)
