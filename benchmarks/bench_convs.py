"""Forward+backward time of the EfficientNet convs per implementation (CPU MFU).

  .venv/bin/python benchmarks/bench_convs.py            # issue-9 shapes, B0 at 128 x 128 px
  .venv/bin/python benchmarks/bench_convs.py --small    # seconds, not minutes
  .venv/bin/python benchmarks/bench_convs.py --xla_flags_sweep   # + oneDNN XLA flags

Times, under jit after a warm-up call, the median over --repeats calls (all
programs in turn, round robin, so load from other processes hits each alike) of
forward + backward (the VJP with a random cotangent; the model: the gradient
of a loss of the pooled features w.r.t. the params, batch stats updated) for:
  depthwise  k x k depthwise conv of [batch, size, size, channels] (SAME);
  pointwise  1x1 conv channels -> out_channels;
  model      the EfficientNet image tower (--variant, include_head=True,
             train=True), [model_batch, image_size, image_size, 3] images;
  matmul     a [4096, 4096] f32 matmul (forward only): the measured peak.
for each implementation in mural.models.op_impls.CONV_IMPLS ('xla',
'fast'). It prints samples/s, the time ratio xla / fast, and the achieved
FLOP/s over the matmul peak (MFU), with the FLOPs of the conv maths: 3 x 2 x
the multiply-adds of every conv (forward, input and kernel gradients; the
model's batch norm, swish and pooling not counted). XLA's cost analysis of
each compiled program is printed too ('XLA GFLOP'), but it is no common
measure: it counts the 'xla' depthwise kernel gradient as the dense conv
XLA runs for it (C times the maths) and a loop's body once.

--xla_flags_sweep reruns the script in subprocesses with each set of XLA CPU
flags in FLAG_SETS appended to XLA_FLAGS (oneDNN, YNNPACK off), and prints
each median relative to the run without them, and which library fusions the
compiled programs contain. An unknown flag makes XLA abort at start-up; that
is reported as such.
"""

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # Run from a checkout.

FLAG_SETS = (
    "--xla_cpu_use_onednn=true",
    "--xla_cpu_experimental_onednn_custom_call=true",
    "--xla_cpu_use_onednn=true --xla_cpu_experimental_onednn_fusion_type=dot",
    "--xla_cpu_use_onednn=true --xla_cpu_experimental_onednn_custom_call=true "
    "--xla_cpu_experimental_onednn_fusion_type=dot,eltwise,reduce",
    "--xla_cpu_experimental_ynn_fusion_type=",  # YNNPACK off: XLA's own emitters / Eigen.
)
MATMUL = 4096


def cpu_name() -> str:
  try:
    info = open("/proc/cpuinfo").read()
  except OSError:
    return "unknown CPU"
  name = re.search(r"model name\s*:\s*(.*)", info)
  flags = re.search(r"flags\s*:\s*(.*)", info)
  avx512 = "avx512f" in flags.group(1).split() if flags else False
  return (f"{name.group(1) if name else 'unknown CPU'}, {os.cpu_count()} logical CPUs, "
          f"avx512f {'yes' if avx512 else 'no'}")


def main(argv=None) -> None:
  from mural import host_memory  # pylint: disable=g-import-not-at-top
  host_memory.prefer_memory_saving_schedule()  # As mural.main (XLA_FLAGS=...concurrency_optimized_scheduler=true: off),
  host_memory.reexec()  # and huge pages for XLA's temporaries (GLIBC_TUNABLES=...hugetlb=0: off).
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--batch", type=int, default=128, help="depthwise/pointwise batch")
  p.add_argument("--size", type=int, default=64, help="depthwise/pointwise height = width")
  p.add_argument("--channels", type=int, default=96)
  p.add_argument("--out_channels", type=int, default=384, help="pointwise output channels")
  p.add_argument("--kernel", type=int, default=3, help="depthwise kernel size")
  p.add_argument("--stride", type=int, default=1, help="depthwise stride")
  p.add_argument("--variant", default="b0")
  p.add_argument("--model_batch", type=int, default=128)
  p.add_argument("--image_size", type=int, default=128)
  p.add_argument("--repeats", type=int, default=5)
  p.add_argument("--small", action="store_true",
                 help="batch 16, 32 px convs; model batch 16 at 64 px")
  p.add_argument("--only", default="depthwise,pointwise,model,matmul",
                 help="comma-separated subset of depthwise,pointwise,model,matmul")
  p.add_argument("--impls", default="xla,fast")
  p.add_argument("--xla_flags_sweep", action="store_true",
                 help="also run with each of FLAG_SETS in XLA_FLAGS (subprocesses)")
  p.add_argument("--json", action="store_true", help=argparse.SUPPRESS)  # Sweep children.
  args = p.parse_args(argv)
  if args.small:
    args.batch, args.size, args.model_batch, args.image_size = 16, 32, 16, 64
  if args.xla_flags_sweep:
    return sweep(args, [a for a in (argv if argv is not None else sys.argv[1:])
                        if a != "--xla_flags_sweep"])
  results = run(args)
  if args.json:
    print("JSON " + json.dumps(results))
  else:
    report(args, results)


def run(args) -> dict:
  """{'name/impl': {'seconds', 'times', 'flops', 'xla_flops', 'samples', 'fusions'}}."""
  import flax.linen as nn  # pylint: disable=g-import-not-at-top
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  from mural.models import conv_ops, efficientnet, image_layers, op_impls  # pylint: disable=g-import-not-at-top

  parts = args.only.split(",")
  impls = args.impls.split(",")
  for impl in impls:
    op_impls.check_conv_impl(impl)
  keys = iter(jax.random.split(jax.random.key(0), 64))
  normal = lambda shape: jax.random.normal(next(keys), shape, jnp.float32)
  results = {}

  programs = []  # (name, compiled, inputs); timed together at the end.

  def measure(name, fn, *inputs, samples, flops):
    compiled = jax.jit(fn).lower(*inputs).compile()
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, (list, tuple)) else cost
    fusions = sorted(set(re.findall(r'"kind":"(__\w+)"', compiled.as_text())))
    results[name] = dict(flops=flops, xla_flops=float(cost.get("flops", 0.0)) if cost else 0.0,
                         samples=samples, fusions=fusions, times=[])
    programs.append((name, compiled, inputs))

  def conv_flops(x_shape, kernel_shape, stride):
    """Forward + backward FLOPs of one SAME conv: 3 x 2 x multiply-adds."""
    b, h, w, _ = x_shape
    k, _, per_group, features = kernel_shape
    return 6 * b * -(-h // stride) * -(-w // stride) * k * k * per_group * features

  def model_flops(net, images):
    """conv_flops summed over the Conv modules net calls (shapes only)."""
    total = []

    def count(next_fun, args, kwargs, context):
      module = context.module
      if isinstance(module, image_layers.Conv) and context.method_name == "__call__":
        k, c = module.kernel_size, args[0].shape[-1]
        total.append(conv_flops(args[0].shape, (k, k, c // module.feature_group_count,
                                                module.features), module.strides))
      return next_fun(*args, **kwargs)

    with nn.intercept_methods(count):
      jax.eval_shape(lambda: net.init(jax.random.key(0), images, train=False))
    return float(sum(total))

  def vjp_step(f):
    def step(x, w, ct):
      y, pull = jax.vjp(f, x, w)
      return y, pull(ct)
    return step

  b, s, c = args.batch, args.size, args.channels
  if "depthwise" in parts:
    x, w = normal((b, s, s, c)), normal((args.kernel, args.kernel, 1, c))
    out = -(-s // args.stride)
    ct = normal((b, out, out, c))
    for impl in impls:
      f = lambda x, w, impl=impl: conv_ops.conv2d(x, w, args.stride, c, impl)
      measure(f"depthwise/{impl}", vjp_step(f), x, w, ct, samples=b,
              flops=conv_flops(x.shape, w.shape, args.stride))
  if "pointwise" in parts:
    x, w = normal((b, s, s, c)), normal((1, 1, c, args.out_channels))
    ct = normal((b, s, s, args.out_channels))
    for impl in impls:
      f = lambda x, w, impl=impl: conv_ops.conv2d(x, w, 1, 1, impl)
      measure(f"pointwise/{impl}", vjp_step(f), x, w, ct, samples=b,
              flops=conv_flops(x.shape, w.shape, 1))
  if "model" in parts:
    width, depth, _, dropout = efficientnet.VARIANTS[args.variant]
    images = normal((args.model_batch, args.image_size, args.image_size, 3))
    for impl in impls:
      net = efficientnet.EfficientNet(width, depth, dropout, include_head=True, conv_impl=impl)
      variables = jax.jit(lambda im, net=net: net.init(jax.random.key(1), im, train=False))(
          images[:1])
      params, stats = nn.unbox(variables["params"]), variables["batch_stats"]

      def step(params, stats, images, net=net):
        def loss(params):
          (features, _), state = net.apply(
              {"params": params, "batch_stats": stats}, images, train=True,
              mutable=["batch_stats"], rngs={"dropout": jax.random.key(2)})
          return jnp.mean(jnp.square(features)), state["batch_stats"]
        (value, new_stats), grads = jax.value_and_grad(loss, has_aux=True)(params)
        return value, grads, new_stats

      measure(f"model/{impl}", step, params, stats, images, samples=args.model_batch,
              flops=model_flops(net, images))
  if "matmul" in parts:
    a = normal((MATMUL, MATMUL))
    measure("matmul/-", lambda a, b: a @ b, a, a.T, samples=1, flops=2.0 * MATMUL ** 3)
  # Round robin: on a shared machine every program sees the same mix of load.
  for name, compiled, inputs in programs:
    jax.block_until_ready(compiled(*inputs))  # Warm-up.
  for _ in range(args.repeats):
    for name, compiled, inputs in programs:
      start = time.perf_counter()
      jax.block_until_ready(compiled(*inputs))
      results[name]["times"].append(time.perf_counter() - start)
  for name, r in results.items():
    r["seconds"] = statistics.median(r["times"])
    print(f"  {name}: median {r['seconds']:.4f} s of {len(r['times'])}", file=sys.stderr)
  return results


def report(args, results) -> None:
  import jax  # pylint: disable=g-import-not-at-top
  print(f"CPU: {cpu_name()}")
  print(f"jax {jax.__version__}, backend {jax.default_backend()}, "
        f"XLA_FLAGS={os.environ.get('XLA_FLAGS', '')!r}, GLIBC_TUNABLES={os.environ.get('GLIBC_TUNABLES', '')!r}, "
        f"repeats {args.repeats} (median)")
  peak = None
  if "matmul/-" in results:
    m = results["matmul/-"]
    peak = m["flops"] / m["seconds"]
    print(f"matmul f32 [{MATMUL}]^2: median {m['seconds']:.3f} s (min {min(m['times']):.3f}), "
          f"peak {peak / 1e9:.1f} GFLOP/s (MFU = GFLOP/s over this)")
  shapes = {
      "depthwise": f"{args.kernel}x{args.kernel}/s{args.stride} depthwise "
                   f"[{args.batch},{args.size},{args.size},{args.channels}]",
      "pointwise": f"1x1 {args.channels}->{args.out_channels} "
                   f"[{args.batch},{args.size},{args.size},{args.channels}]",
      "model": f"EfficientNet-{args.variant.upper()} + head, train, "
               f"[{args.model_batch},{args.image_size},{args.image_size},3]",
  }
  print(f"{'forward+backward':58s} {'impl':5s} {'median s':>9s} {'min s':>8s} {'samples/s':>10s} "
        f"{'GFLOP':>8s} {'GFLOP/s':>8s} {'MFU':>6s} {'XLA GFLOP':>9s}")
  for part, title in shapes.items():
    rows = [(n.split("/")[1], r) for n, r in results.items() if n.startswith(part + "/")]
    for impl, r in rows:
      rate = r["flops"] / r["seconds"]
      mfu = f"{rate / peak:6.1%}" if peak else "     -"
      print(f"{title:58s} {impl:5s} {r['seconds']:9.4f} {min(r['times']):8.4f} "
            f"{r['samples'] / r['seconds']:10.1f} "
            f"{r['flops'] / 1e9:8.2f} {rate / 1e9:8.1f} {mfu} {r['xla_flops'] / 1e9:9.2f}")
    times = dict(rows)
    if "xla" in times and "fast" in times:
      print(f"{'':58s} ratio xla / fast time: {times['xla']['seconds'] / times['fast']['seconds']:.2f}x")


def sweep(args, child_argv) -> None:
  """Runs the benchmark once per XLA flag set in subprocesses; prints medians vs none."""
  print(f"CPU: {cpu_name()}")
  base = os.environ.get("XLA_FLAGS", "")
  runs = {}
  for flags in ("",) + FLAG_SETS:
    env = dict(os.environ, XLA_FLAGS=f"{base} {flags}".strip())
    print(f"running with XLA_FLAGS={env['XLA_FLAGS']!r}", file=sys.stderr, flush=True)
    proc = subprocess.run([sys.executable, os.path.abspath(__file__), *child_argv, "--json"],
                          env=env, capture_output=True, text=True, check=False)
    line = [l for l in proc.stdout.splitlines() if l.startswith("JSON ")]
    if proc.returncode or not line:
      err = (proc.stderr.strip().splitlines() or ["no output"])[-1]
      runs[flags] = f"failed (exit {proc.returncode}): {err[:200]}"
    else:
      runs[flags] = json.loads(line[0][5:])
  baseline = runs[""]
  if isinstance(baseline, str):
    print(f"baseline run {baseline}")
    return
  print(f"median seconds of forward+backward; (x) = time / time without the flags; "
        f"repeats {args.repeats}")
  for flags, result in runs.items():
    print(f"XLA_FLAGS += {flags!r}" if flags else "no extra XLA_FLAGS")
    if isinstance(result, str):
      print(f"  {result}")
      continue
    for name, r in result.items():
      ratio = r["seconds"] / baseline[name]["seconds"] if name in baseline else float("nan")
      print(f"  {name:16s} {r['seconds']:9.4f} s ({ratio:5.2f}x)  "
            f"library fusions: {','.join(r['fusions']) or 'none'}")


if __name__ == "__main__":
  main()
