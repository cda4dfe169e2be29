"""benchmarks/bench_step.py's config: its flags reach the ordinary config (no JAX step is run)."""

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
