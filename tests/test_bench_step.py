"""benchmarks/bench_step.py: its flags reach the ordinary config, bad counts are a clear error, and the XLA cost figures it reads."""

import pytest

from conftest import load_benchmark


def test_no_dropout_clears_every_dropout_and_keeps_the_rest():
  bench = load_benchmark("bench_step")
  default = bench.make_config(bench.parse_args([]))
  plain = bench.make_config(bench.parse_args(["--no_dropout"]))
  assert default.model.text.dropout_rate == 0.1
  assert default.model.image.stochastic_depth_rate == 0.2
  assert default.model.image.dropout_rate is None  # B0's own 0.2.
  assert (plain.model.text.dropout_rate, plain.model.image.dropout_rate,
          plain.model.image.stochastic_depth_rate) == (0.0, 0.0, 0.0)
  for c in (default, plain):
    assert (c.tasks.i2t.batch_size, c.data.image_size, c.model.text.num_layers) == (128, 128, 4)


def test_xla_cost_reads_flops_and_bytes_of_a_dot():
  """The MFU and bandwidth lines rest on these two figures: a [4, 8] @ [8, 16] f32 dot is
  2 * 4 * 8 * 16 FLOPs and moves its operands and result once, (32 + 128 + 64) * 4 bytes."""
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  bench = load_benchmark("bench_step")
  compiled = jax.jit(jnp.dot).lower(jnp.ones((4, 8)), jnp.ones((8, 16))).compile()
  assert bench.xla_cost(compiled) == 2 * 4 * 8 * 16
  assert bench.xla_cost(compiled, "bytes accessed") == (32 + 128 + 64) * 4
  assert bench.xla_cost(compiled, "no such figure") == 0.0


def test_counts_below_their_least_are_a_clear_error(capsys):
  bench = load_benchmark("bench_step")
  for flag in ("--steps=0", "--warmup=-1", "--pipeline_batches=-2"):
    with pytest.raises(SystemExit):
      bench.parse_args([flag])
    assert f"{flag.split('=')[0]} must be >= " in capsys.readouterr().err
  assert bench.parse_args(["--steps=1", "--warmup=0", "--pipeline_batches=0"]).steps == 1
