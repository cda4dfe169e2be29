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
  for flag in ("--steps=0", "--warmup=-1", "--pipeline_batches=-2", "--profile_steps=0"):
    with pytest.raises(SystemExit):
      bench.parse_args([flag])
    assert f"{flag.split('=')[0]} must be >= " in capsys.readouterr().err
  assert bench.parse_args(["--steps=1", "--warmup=0", "--pipeline_batches=0"]).steps == 1


def test_profile_takes_each_ops_least_time_over_the_traced_steps():
  events = {"dot": [(30, 0.9), (10, 0.2), (20, 0.3)],             # One a step: the least.
            "loop_body": [(1, 0.1), (2, 0.1), (11, 0.5), (12, 0.4), (21, 0.1), (22, 0.3)],
            "odd": [(5, 0.6), (15, 0.3)]}                          # Not one a step: the mean.
  got = load_benchmark("bench_step").least_over_steps(events, steps=3)
  assert got == pytest.approx({"dot": 0.2, "loop_body": 0.2, "odd": 0.3})


def test_profile_reads_a_gpus_kernels_by_their_hlo_op_and_the_cpus_events_by_name():
  """On a GPU the work is the kernels on the device plane, named by their hlo_op stat (a
  fusion may launch several); the host's events of the same names are launches, left out."""
  from types import SimpleNamespace as NS  # pylint: disable=g-import-not-at-top
  ops = {"fusion.1": ("fusion", "kLoop", "", ""), "dot.2": ("dot", "", "", ""),
         "while.3": ("while", "", "", "")}
  event = lambda name, start, ns, **stats: NS(name=name, start_ns=start, duration_ns=ns,
                                              stats=list(stats.items()))
  host = NS(name="/host:CPU", lines=[NS(name="thread", events=[
      event("fusion.1", 0, 5000), event("while.3", 0, 9000)])])
  gpu = NS(name="/device:GPU:0", lines=[NS(name="Stream #7", events=[
      event("loop_fusion_kernel", 10, 1000, hlo_op="fusion.1"),
      event("sm90_gemm_a", 20, 3000, hlo_op="dot.2"), event("sm90_gemm_b", 30, 2000, hlo_op="dot.2"),
      event("memset", 40, 100),
      # In a command buffer (a CUDA graph) every kernel names the buffer: XLA's by the op's name.
      event("fusion_1", 50, 4000, hlo_op="command_buffer_1"),
      event("sm90_xmma_gemm_f32", 60, 7000, hlo_op="command_buffer_1")])])
  bench = load_benchmark("bench_step")
  assert bench.device_op_events(iter([host, gpu]), ops) == {
      "fusion.1": [(10, 1e-6), (50, 4e-6)], "dot.2": [(20, 3e-6), (30, 2e-6)]}
  assert bench.device_op_events(iter([host]), ops) == {"fusion.1": [(0, 5e-6)]}  # As ProfileData gives them.


def test_device_kernels_sums_a_steps_kernels_by_kind_and_their_union_as_busy_time():
  from types import SimpleNamespace as NS  # pylint: disable=g-import-not-at-top
  bench = load_benchmark("bench_step")
  kernel = lambda name, start, end: NS(name=name, start_ns=start, duration_ns=end - start, end_ns=end)
  # Two steps; on two streams the GEMM overlaps the fusion by 1 us.
  gpu = NS(name="/device:GPU:0", lines=[
      NS(name="Stream #1", events=[kernel("loop_add_fusion_3", 0, 4000), kernel("Memset 3", 10000, 10500),
                                   kernel("loop_add_fusion_3", 20000, 24000)]),
      NS(name="Stream #2", events=[kernel("sm90_xmma_gemm_f32f32", 3000, 9000),
                                   kernel("sm90_xmma_fprop_implicit_gemm_f32", 30000, 38000)])])
  got = bench.device_kernels([NS(name="/host:CPU", lines=[]), gpu], steps=2)
  assert got["kernels"] == 2.5 and got["short"] == pytest.approx(3 / 5)
  assert got["kernel_s"] == pytest.approx((8000 + 500 + 6000 + 8000) / 2 / 1e9)
  assert got["busy_s"] == pytest.approx((9000 + 500 + 4000 + 8000) / 2 / 1e9)
  assert got["by_class"] == pytest.approx({"XLA fusion": 4e-6, "copy / memset": 0.25e-6,
                                           "GEMM": 3e-6, "convolution": 4e-6})
  assert bench.device_kernels([NS(name="/host:CPU", lines=[])], steps=2) is None


def test_host_issue_sums_the_executables_thunks_and_its_graph_launches_per_step():
  from types import SimpleNamespace as NS  # pylint: disable=g-import-not-at-top
  bench = load_benchmark("bench_step")
  event = lambda name, ns: NS(name=name, duration_ns=ns)
  host = NS(name="/host:CPU", lines=[NS(name="python3", events=[
      event("[0] GpuExecutable::ExecuteThunks", 26_000_000), event("[0] GpuExecutable::ExecuteThunks", 28_000_000),
      event("cuGraphLaunch (CudaGraph:339)", 80_000), event("cuGraphLaunch (CudaGraph:698)", 60_000),
      event("command_buffer::update", 30_000), event("PjitFunction(jit(train_step))", 36_000_000)])])
  gpu = NS(name="/device:GPU:0", lines=[NS(name="Stream #14", events=[event("cuGraphLaunch", 1)])])
  got = bench.host_issue([host, gpu], steps=2)
  assert got == pytest.approx({"thunks_s": 0.027, "graph_launches": 1.0, "graph_launch_s": 70e-6,
                               "graph_update_s": 15e-6})
  assert bench.host_issue([NS(name="/host:CPU", lines=[NS(name="python", events=[
      event("ThunkExecutor::Execute", 5)])])], steps=2) is None  # The CPU's executable.
  kernels = {"kernels": 2448.0, "kernel_s": 0.015, "busy_s": 0.0147, "short": 0.78,
             "by_class": {"XLA fusion": 0.0082, "convolution": 0.0046, "GEMM": 0.002, "copy / memset": 0.0002}}
  device, issue = bench.accelerator_lines(kernels, got, 5, 0.0294)
  assert device.startswith("profile: the device ran 2448 kernels a step, 15.00 ms of kernels (XLA fusion 55%, "
                           "convolution 31%, GEMM 13%, copy / memset 1%; 78% of the kernels under 5 us); "
                           "busy 14.70 ms a step") and "= 50% of the timed step's median (29.40 ms)" in device
  assert issue.startswith("profile: the host issued it in 27.00 ms a step (the executable's thunks): "
                          "1 CUDA graphs launched in 0.07 ms and updated in 0.02 ms")
  assert bench.accelerator_lines(None, None, 5, 0.03) == []


def test_flops_counted_in_a_cpu_child_process_are_this_processs_lowered_count():
  """On a GPU the MFU's FLOPs come from a child process on the CPU backend (XLA's GPU cost
  analysis leaves cuDNN's convolutions out): the child gets this run's flags and the
  implementations the GPU resolved to, and counts what lowered_step_flops and
  lowered_forward_flops count here."""
  from mural import train  # pylint: disable=g-import-not-at-top
  bench = load_benchmark("bench_step")
  argv = ["--image_size=32", "--batch=4", "--variant=b0", "--width=0.25", "--depth=0.25",
          "--text_layers=1", "--text_hidden=32", "--text_heads=2", "--text_mlp=64", "--vocab=64",
          "--text_len=8", "--embed_dim=16"]
  config = bench.make_config(bench.parse_args(argv + ["--conv_impl=xla", "--norm_impl=flax"]))
  setup = train.build(config)
  here = bench.lowered_step_flops(setup, config), bench.lowered_forward_flops(setup, config)
  assert here[0] > 2 * here[1] > 0  # The step: forward, backward and update.
  assert bench.flops_counted_on_cpu(argv, "xla", "flax") == here
  with pytest.raises(RuntimeError, match="counting the step's FLOPs on the CPU failed"):
    bench.flops_counted_on_cpu(argv + ["--no_such_flag"], "xla", "flax")
