"""Samples/s, MFU and peak memory of mural's production train step (issue 9).

Why: the step is what training spends its time on; this times the function
`mural.step.make_train_step` returns, built from a config through
`mural.train.build` and jitted with the shardings and donation training uses,
on random inputs. Nothing of the step is re-implemented here.

  .venv/bin/python benchmarks/bench_step.py                      # issue-9 towers, f32, 128 px, batch 128
  .venv/bin/python benchmarks/bench_step.py --conv_impl=xla      # XLA's own convolutions
  .venv/bin/python benchmarks/bench_step.py --norm_impl=flax     # nn.BatchNorm + nn.swish, autodiff'd
  .venv/bin/python benchmarks/bench_step.py --dtype=bfloat16     # bf16 compute (params stay f32)
  .venv/bin/python benchmarks/bench_step.py --remat=full         # recompute each block in the backward
  .venv/bin/python benchmarks/bench_step.py --no_dropout         # no dropout, as bench_open_clip.py's towers
  XLA_FLAGS=--xla_cpu_use_onednn=true .venv/bin/python benchmarks/bench_step.py   # XLA CPU options
  GLIBC_TUNABLES=glibc.malloc.hugetlb=0 .venv/bin/python benchmarks/bench_step.py  # without huge pages
  .venv/bin/python benchmarks/bench_step.py --profile=/tmp/step_trace   # + per-op time of a step
  .venv/bin/python benchmarks/bench_step.py --image_size=64 --batch=16 --steps=3 --pipeline_batches=0  # smoke

The default towers are those of a typical small CLIP benchmark: EfficientNet-B0
with its 1280-wide head conv and a 256-d image projection head; BERT
L4/H256/A4/MLP1024, vocab 30522, 32 tokens, with a 256-d text head; the ALIGN
system (one image-text task: in-batch softmax both ways; LAMB, or AdamW with
--optimizer=adamw as open_clip uses); fp32; batch 128 at 128 x 128 px. The
full step runs: forward, loss, backward, optimizer.
XLA options are passed through the XLA_FLAGS environment variable (an unknown
flag makes XLA abort at start-up).

What it prints:
  samples/s      batch / the median step time over --steps timed steps, after
                 --warmup untimed ones (each step waited for);
  step time      median, min and max seconds of the timed steps;
  compile time   seconds to trace + lower, and to compile, the step;
  device memory  on an accelerator, its peak bytes in use (memory_stats);
  peak RSS       the process's peak resident memory (getrusage ru_maxrss) read
                 right after the timed steps: model state, optimizer state,
                 XLA's buffers and the compiler's own peak, plus the Python /
                 JAX runtime (TensorFlow is not loaded yet; the input pipeline
                 runs after this is read, and the FLOP analyses below, which
                 trace the model again, too). XLA's own figures (memory_analysis:
                 arguments, outputs, temporaries) are printed beside it;
  XLA GFLOP      FLOPs of one step by XLA's cost analysis of the compiled step
                 (compiled.cost_analysis()['flops']). Caveats: a loop body is
                 counted once (the 'fast' depthwise kernel gradient is a loop
                 over batch chunks: undercounted), and the 'xla' depthwise
                 kernel gradient is counted as the dense conv XLA runs for it;
                 with 'native' (mural's C++ kernels, custom calls XLA cannot
                 see into) it is the same step written in XLA ops ('fast'),
                 lowered but not compiled, and the kernel-free count is
                 printed beside it; on a GPU, where XLA leaves the convolutions
                 it hands to cuDNN out of the compiled step's count and gives 0
                 for an unoptimised module (seen on an H200, jax 0.11.2), it is
                 the same step (the implementations the GPU resolved to) lowered
                 on the CPU backend in a child process (--count_flops), and the
                 GPU's own count is printed beside it;
                 '3 x forward GFLOP' (cost analysis of the step's forward and
                 losses before optimisation, times 3) is printed as a cross-check.
                 Both count dropout's random bits (threefry's integer ops) as
                 FLOPs: at the defaults 169.8 GFLOP, 169.2 with --no_dropout
                 (`--count_flops` prints the count alone in ~10 s: nothing is
                 allocated or compiled);
  GFLOP/s, MFU   XLA GFLOP / median step time, and its ratio to the peak: an f32
                 [4096, 4096] @ [4096, 4096] jnp.dot timed in this same run,
                 right after the timed steps (as many times), median (on a GPU
                 at the backend's default matmul precision); or
                 --peak_gflops (a datasheet figure) when given;
                 With --dtype=bfloat16 a bf16 matmul is timed too;
  bandwidth      XLA's bytes accessed by one step (cost_analysis()['bytes
                 accessed']: every op's operands and results, each op's data
                 once, as if nothing stayed in cache between ops) over the
                 step time, and its ratio to the machine's memory bandwidth:
                 a jitted `a + b` over two [2**25] f32 arrays (3 x 128 MiB
                 moved; a STREAM "add") timed after the steps as the matmul
                 is, and the seconds those bytes alone take at that
                 bandwidth. Near 100%, the step is bound by the bytes its
                 elementwise passes move, and only moving fewer raises its MFU.
                 A loop body's bytes are counted once, as its FLOPs are;
  pipeline       samples/s of mural's real tf.data training input
                 (pipeline.build_train_iterator on the built-in synthetic
                 source, same image size, text length and batch, rendered at
                 the image size, as benchmarks/bench_pipeline.py does) run on
                 its own after the step, and its ratio to the step's
                 consumption (the issue's target: >= 3x);
  profile        with --profile=DIR: a jax.profiler trace of --profile_steps more
                 steps in DIR, and the ops that took the most time, grouped by
                 op kind (conv, dot, elementwise fusion, reduce, ...) and by
                 model part (from the HLO metadata). An op's time is its least
                 over the traced steps: a traced step runs slower than an
                 untraced one, and on this project's VMs every other step back
                 to back is about 1 s slower, the extra time landing on the ops
                 that touch fresh memory first (one traced step: 5.5 s, block
                 1's expand matmul 0.30 s in it against 19 ms alone; the least
                 over 5 sums to the untraced step). A trace event is the op's
                 wall time: an op split over the cores shows
                 as one event (an elementwise pass over [128, 64, 64, 96] took
                 13.5 ms on 2 cores, 26.8 ms under `taskset -c 0`), and ops that
                 run side by side (YNNPACK's reductions) are each counted, so
                 the total can exceed the step. It turns on XLA's per-op
                 trace events (--xla_cpu_enable_xprof_traceme), which slow
                 every step a little: take timings from a run without it.
                 On a GPU, first what a traced step asks of the card (kernels a
                 step, their time by kind, the share under 5 us, the time the
                 card was busy against the timed step) and what the host spent
                 issuing it (the executable's thunks, CUDA graphs launched and
                 updated): a card busy for a fraction of the step waits on the
                 host (an H200 at batch 128: 45-70%, benchmarks/README.md);
The last line is one JSON object with all these figures.
"""

import argparse
import collections
import json
import os
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # Run from a checkout.
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # bench_convs, bench_pipeline.
from mural import data as _data  # pylint: disable=g-import-not-at-top,wrong-import-position

_data.set_tensorflow_env_defaults()  # As mural's commands run TensorFlow: before it loads.

MATMUL = 4096


def parse_args(argv):
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--image_size", type=int, default=128)
  p.add_argument("--batch", type=int, default=128)
  p.add_argument("--variant", default="b0", help="EfficientNet variant (b0..b7, l2)")
  p.add_argument("--width", type=float, default=None, help="width coefficient (default: the variant's)")
  p.add_argument("--depth", type=float, default=None, help="depth coefficient (default: the variant's)")
  p.add_argument("--no_head_conv", action="store_true", help="drop the 1x1 head conv (ALIGN's choice)")
  p.add_argument("--no_dropout", action="store_true",
                 help="no dropout or drop-connect in either tower, as bench_open_clip.py's towers "
                      "(open_clip's and timm's defaults); default: the config's (BERT's 0.1, B0's 0.2)")
  p.add_argument("--embed_dim", type=int, default=256, help="image and text projection heads' width")
  p.add_argument("--text_layers", type=int, default=4)
  p.add_argument("--text_hidden", type=int, default=256)
  p.add_argument("--text_heads", type=int, default=4)
  p.add_argument("--text_mlp", type=int, default=1024)
  p.add_argument("--vocab", type=int, default=30522)
  p.add_argument("--text_len", type=int, default=32)
  p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"],
                 help="config.model.dtype: compute dtype of the towers (params stay float32)")
  p.add_argument("--conv_impl", default="auto", choices=["auto", "xla", "fast", "native"],
                 help="config.model.image.conv_impl")
  p.add_argument("--norm_impl", default="auto", choices=["auto", "flax", "fused"],
                 help="config.model.image.norm_impl (batch norm + swish)")
  p.add_argument("--remat", default="none", choices=["none", "full", "dots"],
                 help="config.model.image.remat and model.text.remat (mural/models/remat.py)")
  p.add_argument("--optimizer", default="lamb", choices=["lamb", "adamw"],
                 help="lamb (the papers'), or adamw (config.optim.layer_adaptation=False, as open_clip)")
  p.add_argument("--warmup", type=int, default=2, help="untimed steps after compiling")
  p.add_argument("--steps", type=int, default=5, help="timed steps")
  p.add_argument("--peak_gflops", type=float, default=None,
                 help="peak FLOP/s (GFLOP/s) to divide by, e.g. a GPU's datasheet figure; "
                      "default: the matmul measured here")
  p.add_argument("--count_flops", action="store_true",
                 help="print the step's FLOPs by XLA's cost analysis of its unoptimised HLO on this "
                      "backend (lowered, not compiled) as one JSON line, and exit")
  p.add_argument("--pipeline_batches", type=int, default=20, help="timed input batches; 0: skip")
  p.add_argument("--profile", default="", help="directory for a jax.profiler trace of --profile_steps steps")
  p.add_argument("--top", type=int, default=25, help="ops listed by --profile")
  p.add_argument("--profile_steps", type=int, default=5,
                 help="steps traced by --profile; each op's time is its least over them")
  args = p.parse_args(argv)
  for name, least in (("steps", 1), ("warmup", 0), ("pipeline_batches", 0), ("top", 1),
                      ("profile_steps", 1)):
    if getattr(args, name) < least:  # Before the minute of building and compiling, not after.
      p.error(f"--{name} must be >= {least}, got {getattr(args, name)}")
  return args


def make_config(args):
  """The ALIGN system with the benchmark's towers, through the ordinary config path."""
  from mural import systems  # pylint: disable=g-import-not-at-top
  c = systems.base_config("align")
  im = c.model.image
  im.variant, im.width_coefficient, im.depth_coefficient = args.variant, args.width, args.depth
  im.include_head = not args.no_head_conv
  im.conv_impl = args.conv_impl
  im.norm_impl = args.norm_impl
  im.remat = c.model.text.remat = args.remat
  if args.no_dropout:
    im.dropout_rate = im.stochastic_depth_rate = c.model.text.dropout_rate = 0.0
  t = c.model.text
  t.vocab_size, t.token_embed_dim, t.hidden_dim = args.vocab, args.text_hidden, args.text_hidden
  t.num_layers, t.num_heads, t.mlp_dim, t.max_len = (args.text_layers, args.text_heads,
                                                     args.text_mlp, args.text_len)
  c.model.dtype = args.dtype
  c.model.heads.embed_dim = args.embed_dim
  c.tasks.i2t.image_head = "image"  # The 256-d image projection (a head named 'image').
  c.tasks.i2t.text_head = "i2t"
  c.tasks.i2t.batch_size = args.batch
  c.data.image_size = args.image_size
  c.data.eval_resize = int(round(args.image_size * 346 / 289))
  c.data.synthetic.render_size = args.image_size
  c.optim.warmup_steps = 10  # Nonzero learning rates from the first step.
  if args.optimizer == "adamw":
    c.optim.layer_adaptation = False
  c.total_steps = 1_000_000
  systems.validate(c)
  return c


def random_batch(setup, config, seed=0):
  """Random device batch of the step's layout: N(0, 1) pixels, random ids and lengths."""
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  from mural import sharding  # pylint: disable=g-import-not-at-top
  keys = iter(jax.random.split(jax.random.key(seed), 16))
  batch = {}
  for task in setup.tasks:
    shapes = task.shapes(config)
    b, length = shapes["text_ids"].shape
    lengths = jax.random.randint(next(keys), (b, 1), min(8, length), length + 1)
    local = {
        "image": jax.random.normal(next(keys), shapes["image"].shape, shapes["image"].dtype),
        "text_ids": jax.random.randint(next(keys), (b, length), 1, config.model.text.vocab_size),
        "text_mask": (jnp.arange(length)[None] < lengths).astype(jnp.int32),
        "valid": jnp.ones((b,), jnp.bool_),
    }
    batch[task.name] = sharding.global_batch(
        {k: jax.device_get(v) for k, v in local.items()}, setup.data_sharding)
  return batch


def xla_cost(compiled_or_lowered, key="flops") -> float:
  """One figure of XLA's cost analysis ("flops", "bytes accessed"); 0 where it has none."""
  cost = compiled_or_lowered.cost_analysis()
  cost = cost[0] if isinstance(cost, (list, tuple)) else cost
  return float(cost.get(key, 0.0)) if cost else 0.0


def countable_config(config, impl):
  """`config` with mural's C++ kernels (custom calls XLA cannot see into) as the same maths in
  XLA ops ('fast'), so that XLA's cost analysis counts every FLOP; else `config` itself."""
  if impl != "native":
    return config
  config = config.copy_and_resolve_references()
  config.model.image.conv_impl = "fast"
  return config


def abstract_batch(setup, config):
  """The step's batch as shapes (jax.ShapeDtypeStruct), for lowering without data."""
  return {t.name: t.shapes(config) for t in setup.tasks}


def lowered_step_flops(setup, config) -> float:
  """FLOPs of one step by XLA's cost analysis of its unoptimised HLO (lowered on abstract inputs
  of the step's layout, not compiled)."""
  from mural import train  # pylint: disable=g-import-not-at-top
  return xla_cost(train.jit_train_step(setup).lower(setup.abstract_state, abstract_batch(setup, config)))


def lowered_forward_flops(setup, config) -> float:
  """The same for the step's forward and losses alone (the '3 x forward' cross-check)."""
  import jax  # pylint: disable=g-import-not-at-top
  from mural import system as system_lib  # pylint: disable=g-import-not-at-top
  fwd = jax.jit(lambda p, bs, b, r: system_lib.task_losses(setup.model, setup.tasks, p, bs, b, r)[0])
  state = setup.abstract_state
  return xla_cost(fwd.lower(state.params, state.batch_stats, abstract_batch(setup, config),
                            jax.random.key(0)))


def flops_counted_on_cpu(argv, impl, norm):
  """(lowered_step_flops, lowered_forward_flops) of this run's step, with the implementations
  this backend resolved to, counted by the CPU backend in a child process: on a GPU, XLA's cost
  analysis leaves the convolutions it hands to cuDNN out of the compiled step's count and gives
  0 for an unoptimised module."""
  cmd = [sys.executable, os.path.abspath(__file__), *argv, f"--conv_impl={impl}",
         f"--norm_impl={norm}", "--count_flops"]
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  out = subprocess.run(cmd, env=env, capture_output=True, text=True)
  if out.returncode:
    raise RuntimeError(f"counting the step's FLOPs on the CPU failed:\n{out.stderr[-3000:]}")
  counted = json.loads(out.stdout.strip().splitlines()[-1])
  return counted["flops"], counted["fwd_flops"]


def peak_rss_bytes() -> int:
  return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB.


def matmul(dtype):
  """A function timing one [N, N] @ [N, N] jnp.dot in `dtype` (compiled and warmed up here).

  Its operands are made before and dropped after each timed call, so they are not
  resident during the train steps: the peak RSS is the step's, as bench_open_clip.py's
  is (it times torch's matmul after reading its peak).
  """
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  operands = jax.jit(lambda: tuple(jax.random.normal(jax.random.key(i), (MATMUL, MATMUL), jnp.float32)
                                   .astype(dtype) for i in (1, 2)))
  f = jax.jit(jnp.dot)

  def timed():
    a, b = jax.block_until_ready(operands())
    t0 = time.perf_counter()
    jax.block_until_ready(f(a, b))
    return time.perf_counter() - t0

  timed()  # Compiles both.
  return timed


STREAM = 2 ** 25  # f32 elements per operand: 128 MiB, far beyond any cache.


def stream_add():
  """A function timing one jitted `a + b` over [STREAM] f32 arrays (STREAM's "add": 2 reads, 1
  write); its operands are made before and dropped after each call, as matmul()'s are. The sum
  goes into a's buffer (donated): a new one would time its pages' first faults too (14-17 GB/s
  measured so on the Xeon, against 35-38 donated)."""
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  operands = jax.jit(lambda: (jnp.full((STREAM,), 1.0, jnp.float32), jnp.full((STREAM,), 2.0, jnp.float32)))
  f = jax.jit(jnp.add, donate_argnums=0)

  def timed():
    a, b = jax.block_until_ready(operands())
    t0 = time.perf_counter()
    jax.block_until_ready(f(a, b))
    return time.perf_counter() - t0

  timed()
  return timed


def pipeline_rate(config, batches):
  """Median-free plain rate (samples/s) of mural's training input over `batches` batches."""
  import bench_pipeline  # pylint: disable=g-import-not-at-top
  from mural import data  # pylint: disable=g-import-not-at-top
  from mural import system  # pylint: disable=g-import-not-at-top
  from mural import systems  # pylint: disable=g-import-not-at-top
  from mural.data import pipeline  # pylint: disable=g-import-not-at-top
  from mural.data import tokenizer as tokenizer_lib  # pylint: disable=g-import-not-at-top
  data.set_tensorflow_intra_op_threads(config.data.tf_intra_op_threads)  # As mural.main does.
  with tempfile.TemporaryDirectory() as tmp:
    vocab = os.path.join(tmp, "vocab.txt")
    bench_pipeline._vocab(config, vocab)  # pylint: disable=protected-access
    tok = tokenizer_lib.Tokenizer(vocab, config.model.text.max_len)
    tasks = system.active_tasks(systems.get(config), config)
    it = pipeline.build_train_iterator(config, tasks, tok, process_index=0, process_count=1, seed=0)
    for _ in range(3):  # Warm-up: build, first renders, prefetch.
      next(it)
    rows = sum(t.batch_size for t in tasks)
    t0 = time.perf_counter()
    for _ in range(batches):
      next(it)
    return batches * rows / (time.perf_counter() - t0)


# ---------------------------------------------------------------------------
# --profile: per-op time of a step, the least over several traced steps.


def _hlo_ops(hlo_text):
  """{instruction name: (opcode, kind, op_name metadata, fused computation body)} of the HLO."""
  bodies, current, lines = {}, None, []
  for line in hlo_text.splitlines():
    m = re.match(r"^(?:ENTRY\s+)?%?([\w.\-]+)\s.*\{\s*$", line)  # A computation's header.
    if m:
      current, lines = m.group(1), []
      bodies[current] = lines
    elif current is not None:
      lines.append(line)
  ops = {}
  for line in hlo_text.splitlines():
    m = re.match(r"^\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=\s*\S.*?\s([a-z][\w\-]*)\(", line)
    if not m:
      continue
    name, opcode = m.group(1), m.group(2)
    kind = re.search(r"kind=(\w+)", line)
    called = re.search(r"calls=%?([\w.\-]+)", line)
    meta = re.search(r'op_name="([^"]*)"', line)
    body = "\n".join(bodies.get(called.group(1), [])) if called else ""
    ops[name] = (opcode, kind.group(1) if kind else "", meta.group(1) if meta else "", body)
  return ops


def _category(opcode, body):
  text = opcode + " " + body
  for word, cat in (("convolution", "conv"), ("dot(", "dot"), ("custom-call", "custom-call"),
                    ("reduce-window", "reduce-window"), ("reduce(", "reduce"), ("while", "loop"),
                    ("scatter", "scatter"), ("gather", "gather"), ("dynamic-update-slice", "update-slice")):
    if word in text or opcode == word.rstrip("("):
      return cat
  if opcode in ("copy", "transpose", "concatenate", "pad", "slice", "reshape", "bitcast", "broadcast"):
    return "data movement"
  return "elementwise" if opcode == "fusion" else opcode


def _part(op_name):
  """A coarse model part from an op's metadata name (flax module path)."""
  if "image_tower" in op_name:
    inner = op_name.split("image_tower", 1)[1]
    if "silu" in inner:
      return "image/swish"
    for part in ("expand_conv", "expand_bn", "depthwise_conv", "depthwise_bn", "se_reduce",
                 "se_expand", "project_conv", "project_bn", "stem_conv", "stem_bn", "head_conv",
                 "head_bn"):
      if part in inner:
        return f"image/{part}"
    return "image/other (SE gate, residual, pool)"
  if "text_tower" in op_name:
    inner = op_name.split("text_tower", 1)[1]
    for part in ("attention", "mlp_in", "mlp_out", "gelu", "erf", "norm", "token_embed"):
      if part in inner:
        return f"text/{'gelu' if part == 'erf' else part}"
    return "text/other"
  if "_head" in op_name:
    return "heads"
  return "other (loss, optimizer, glue)"


def least_over_steps(events, steps):
  """{op: [(start, seconds), ...]} of `steps` traced steps -> {op: its least time in a step}.
  An op with the same number of events in every step (several inside a loop) gets the
  least of the steps' sums, the events taken in time order; one without, its mean."""
  per_op = {}
  for name, timed in events.items():
    times = [t for _, t in sorted(timed)]
    if len(times) % steps == 0:
      per_step = len(times) // steps
      per_op[name] = min(sum(times[i * per_step:(i + 1) * per_step]) for i in range(steps))
    else:
      per_op[name] = sum(times) / steps
  return per_op


def _device_planes(planes):
  return [p for p in planes if p.name.startswith(("/device:GPU", "/device:TPU"))]


def device_op_events(planes, ops):
  """{HLO op: [(start_ns, seconds), ...]} from a trace's planes. On a GPU, the kernels on its
  device planes (the host's events there are launches, not the work), each by its `hlo_op` stat,
  or, inside a command buffer (a CUDA graph, whose kernels all carry the buffer's name), by its
  kernel name, which XLA derives from the op's ('.' -> '_'); a library's kernels there (cuBLAS,
  cuDNN) name no op and are left out. On the CPU, the events named after an op."""
  planes = list(planes)  # ProfileData.planes is an iterator: read it once.
  on_device = _device_planes(planes)
  by_kernel = {name.replace(".", "_"): name for name in ops}
  events = {}
  for plane in on_device or planes:
    for line in plane.lines:
      for event in line.events:
        name = event.name
        if on_device:
          name = dict(event.stats).get("hlo_op", "")
          name = name if name in ops else by_kernel.get(event.name, "")
        # Containers (a loop, a call) span the ops inside them, which have their own events.
        if name in ops and ops[name][0] not in ("while", "call", "conditional"):
          events.setdefault(name, []).append((event.start_ns, event.duration_ns / 1e9))
  return events


def kernel_class(name):
  """A GPU kernel's kind from its name: XLA's own code or a library's."""
  low = name.lower()  # Convolutions first: cuDNN's implicit-GEMM kernels are convolutions.
  if any(w in low for w in ("conv", "cudnn", "fprop", "dgrad", "wgrad", "implicit")):
    return "convolution"
  if any(w in low for w in ("gemm", "cublas", "cutlass", "nvjet")):
    return "GEMM"
  if any(w in low for w in ("memcpy", "memset")):
    return "copy / memset"
  return "XLA fusion"


def device_kernels(planes, steps):
  """What a traced step asks of the accelerator: kernels per step, their time per step (summed,
  and as the union of their intervals, i.e. the time the device was busy), by kind, and the
  share of kernels shorter than 5 us. None without a device plane (the CPU)."""
  events = sorted(((e.start_ns, e.end_ns, e.name) for p in _device_planes(planes)
                   for line in p.lines for e in line.events), key=lambda e: e[0])
  if not events:
    return None
  busy, start, end = 0, None, None
  for s, e, _ in events:
    if end is None or s > end:
      busy += 0 if end is None else end - start
      start, end = s, e
    else:
      end = max(end, e)
  busy += end - start
  by_class = collections.Counter()
  for s, e, name in events:
    by_class[kernel_class(name)] += e - s
  return {"kernels": len(events) / steps, "kernel_s": sum(by_class.values()) / steps / 1e9,
          "busy_s": busy / steps / 1e9,
          "by_class": {k: v / steps / 1e9 for k, v in by_class.items()},
          "short": sum(e - s < 5000 for s, e, _ in events) / len(events)}


def host_issue(planes, steps):
  """What the host spends issuing a GPU step (XLA's own trace events, per traced step): the
  executable's thunks, and within them the CUDA graphs launched and their updates. A step
  whose device is idle while these run is bound by the host. None where the trace has no
  GPU executable (the CPU, or an XLA that names these events otherwise)."""
  thunks, launches, launch_ns, update_ns = 0, 0, 0, 0
  for plane in planes:
    if plane.name.startswith("/device:"):
      continue
    for line in plane.lines:
      for event in line.events:
        if event.name.endswith("GpuExecutable::ExecuteThunks"):
          thunks += event.duration_ns
        elif event.name.startswith("cuGraphLaunch"):
          launches, launch_ns = launches + 1, launch_ns + event.duration_ns
        elif event.name == "command_buffer::update":
          update_ns += event.duration_ns
  if not thunks:
    return None
  return {"thunks_s": thunks / steps / 1e9, "graph_launches": launches / steps,
          "graph_launch_s": launch_ns / steps / 1e9, "graph_update_s": update_ns / steps / 1e9}


def accelerator_lines(kernels, host, steps, step_s):
  """device_kernels' and host_issue's figures as the profile's lines (none on the CPU)."""
  lines = []
  if kernels:
    lines.append(
        f"profile: the device ran {kernels['kernels']:.0f} kernels a step, "
        f"{kernels['kernel_s'] * 1e3:.2f} ms of kernels ("
        + ", ".join(f"{k} {v / kernels['kernel_s']:.0%}" for k, v in
                    sorted(kernels["by_class"].items(), key=lambda kv: -kv[1]))
        + f"; {kernels['short']:.0%} of the kernels under 5 us); busy {kernels['busy_s'] * 1e3:.2f} "
        f"ms a step (their union, mean over {steps} traced steps) = "
        f"{kernels['busy_s'] / step_s:.0%} of the timed step's median ({step_s * 1e3:.2f} ms): the "
        "rest the device waited for the host")
  if host:
    lines.append(
        f"profile: the host issued it in {host['thunks_s'] * 1e3:.2f} ms a step (the executable's "
        f"thunks): {host['graph_launches']:.0f} CUDA graphs launched in "
        f"{host['graph_launch_s'] * 1e3:.2f} ms and updated in {host['graph_update_s'] * 1e3:.2f} ms, "
        "the rest the kernels launched one by one and XLA's own work")
  return lines


def profile_step(compiled, state, batch, directory, top, steps, step_s):
  """Traces `steps` steps into `directory`; prints the top ops by their least time over
  the steps, and totals by kind and part, and their sum against the timed step (`step_s`): on
  a GPU what is left is the device waiting for the host."""
  import jax  # pylint: disable=g-import-not-at-top
  with jax.profiler.trace(directory):
    for _ in range(steps):
      state, metrics = compiled(state, batch)
      jax.block_until_ready((state, metrics))
  paths = [os.path.join(r, f) for r, _, fs in os.walk(directory) for f in fs if f.endswith(".xplane.pb")]
  if not paths:
    print(f"profile: no .xplane.pb under {directory}")
    return state, {}
  data = jax.profiler.ProfileData.from_file(max(paths, key=os.path.getmtime))
  ops = _hlo_ops(compiled.as_text())
  planes = list(data.planes)  # An iterator of wrappers: read the trace once.
  kernels, host = device_kernels(planes, steps), host_issue(planes, steps)
  for line in accelerator_lines(kernels, host, steps, step_s):
    print(line)
  summary = {}
  if kernels:
    summary.update({"profile_kernels_per_step": round(kernels["kernels"]),
                    "profile_kernel_ms": round(kernels["kernel_s"] * 1e3, 3),
                    "profile_busy_ms": round(kernels["busy_s"] * 1e3, 3),
                    "profile_busy_of_step": round(kernels["busy_s"] / step_s, 4),
                    "profile_kernel_ms_by_class": {k: round(v * 1e3, 3) for k, v in kernels["by_class"].items()}})
  if host:
    summary.update({"profile_host_thunks_ms": round(host["thunks_s"] * 1e3, 3),
                    "profile_graph_launches": round(host["graph_launches"])})
  per_op = least_over_steps(device_op_events(planes, ops), steps)
  total = sum(per_op.values())
  if not total:
    print("profile: no kernel named after an XLA op" if kernels else
          "profile: no per-op events (needs --xla_cpu_enable_xprof_traceme=true in XLA_FLAGS)")
    return state, summary
  by_cat, by_part = {}, {}
  for name, s in per_op.items():
    opcode, _, meta, body = ops[name]
    cat, part = _category(opcode, body), _part(meta)
    by_cat[cat] = by_cat.get(cat, 0.0) + s
    by_part[part] = by_part.get(part, 0.0) + s
  covers = f", {total / kernels['kernel_s']:.0%} of the kernels' time" if kernels else ""
  print(f"profile: {total * 1e3:.2f} ms in {len(per_op)} XLA ops (each op's least wall time over "
        f"{steps} traced steps, summed), {total / step_s:.0%} of the timed step's median "
        f"({step_s * 1e3:.2f} ms){covers}; trace in {directory}")
  print("  by op kind:   " + ", ".join(f"{k} {v / total:.0%}" for k, v in
                                        sorted(by_cat.items(), key=lambda kv: -kv[1])))
  print("  by model part: " + ", ".join(f"{k} {v / total:.0%}" for k, v in
                                         sorted(by_part.items(), key=lambda kv: -kv[1])))
  print(f"  top {top} ops:")
  for name, s in sorted(per_op.items(), key=lambda kv: -kv[1])[:top]:
    opcode, _, meta, body = ops[name]
    print(f"  {s * 1e3:9.3f} ms {s / total:5.1%}  {_category(opcode, body):13s} {name:32s} "
          f"{meta[-90:]}")
  summary.update({"profile_total_s": total, "profile_of_step": round(total / step_s, 4),
                  "profile_by_kind": {k: round(v / total, 4) for k, v in by_cat.items()},
                  "profile_by_part": {k: round(v / total, 4) for k, v in by_part.items()}})
  return state, summary


# ---------------------------------------------------------------------------


def main(argv=None) -> None:
  from mural import host_memory  # pylint: disable=g-import-not-at-top
  host_memory.prefer_memory_saving_schedule()  # As mural.main (XLA_FLAGS=...concurrency_optimized_scheduler=true: off),
  host_memory.reexec()  # and huge pages for XLA's temporaries (GLIBC_TUNABLES=...hugetlb=0: off).
  args = parse_args(argv)
  if args.profile and "xla_cpu_enable_xprof_traceme" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                               " --xla_cpu_enable_xprof_traceme=true").strip()
  config = make_config(args)  # Config mistakes end here, before JAX loads.

  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  from bench_convs import cpu_name  # pylint: disable=g-import-not-at-top
  from mural import train  # pylint: disable=g-import-not-at-top
  from mural.models import op_impls  # pylint: disable=g-import-not-at-top

  load = os.getloadavg()
  print(f"CPU: {cpu_name()}; load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
  print(f"jax {jax.__version__}, backend {jax.default_backend()}, {jax.device_count()} device(s), "
        f"XLA_FLAGS={os.environ.get('XLA_FLAGS', '')!r}, GLIBC_TUNABLES={os.environ.get('GLIBC_TUNABLES', '')!r}")
  impl = op_impls.resolve_conv_impl(args.conv_impl)
  norm = op_impls.resolve_norm_impl(args.norm_impl)
  head_dropout = config.model.image.dropout_rate  # None: the variant's own rate.
  head_dropout = "the variant's" if head_dropout is None else head_dropout
  print(f"step: ALIGN, EfficientNet-{args.variant.upper()}"
        f"{'' if args.no_head_conv else ' + head conv'} (width {args.width or 'variant'}, depth "
        f"{args.depth or 'variant'}, conv_impl {args.conv_impl} -> {impl}, norm_impl {args.norm_impl} -> {norm}) -> {args.embed_dim}; BERT "
        f"L{args.text_layers}/H{args.text_hidden}/A{args.text_heads}/MLP{args.text_mlp}, vocab "
        f"{args.vocab}, {args.text_len} tokens -> {args.embed_dim}; {args.dtype}; batch {args.batch} at "
        f"{args.image_size}x{args.image_size} px; {args.optimizer}; dropout: text "
        f"{config.model.text.dropout_rate}, image head {head_dropout}, "
        f"drop-connect {config.model.image.stochastic_depth_rate}")

  if args.count_flops:  # Abstract shapes only: no state allocated, nothing compiled.
    counted = train.build(countable_config(config, impl))
    step_flops, fwd_flops = lowered_step_flops(counted, config), lowered_forward_flops(counted, config)
    print(json.dumps({"backend": jax.default_backend(), "conv_impl": impl, "norm_impl": norm,
                      "flops": step_flops, "fwd_flops": fwd_flops}))
    return

  # ---- The production step, built as train_and_evaluate builds it. --------
  setup = train.build(config)
  state = setup.init_state(jax.random.PRNGKey(config.seed))
  setup.release_init_program()  # As train_and_evaluate does.
  n_params = sum(x.size for x in jax.tree.leaves(state.params))
  batch = random_batch(setup, config)
  step = train.jit_train_step(setup)
  rss_before = peak_rss_bytes()
  t0 = time.perf_counter()
  lowered = step.lower(state, batch)
  t1 = time.perf_counter()
  compiled = lowered.compile()
  t2 = time.perf_counter()
  del lowered  # Its module is not needed to run the step.
  rss_compiled = peak_rss_bytes()
  host_memory.release_freed_memory()  # As train_and_evaluate does once its step is compiled.
  lower_s, compile_s = t1 - t0, t2 - t1
  print(f"params: {n_params / 1e6:.2f} M; trace + lower {lower_s:.1f} s, compile {compile_s:.1f} s")

  # ---- Timed steps back to back, as training runs them; then as many timed matmuls (the
  # peak) and `a + b` (bandwidth). Not round robin: a probe between two steps (0.4 GB of
  # operands made and dropped) slowed the step after it by ~1.2 s of 2.6 (EPYC, at 478c6c8:
  # median 3.80 s against 2.57 s back to back, the same run's matmul peak 129 and 131 GFLOP/s).
  probes = {"f32": matmul(jnp.float32), "stream": stream_add()}
  if args.dtype == "bfloat16":
    probes["bf16"] = matmul(jnp.bfloat16)
  for _ in range(args.warmup):
    state, metrics = compiled(state, batch)
    jax.block_until_ready((state, metrics))
  times, probe_times = [], {k: [] for k in probes}
  for _ in range(args.steps):
    t0 = time.perf_counter()
    state, metrics = compiled(state, batch)
    jax.block_until_ready((state, metrics))
    times.append(time.perf_counter() - t0)
  rss = peak_rss_bytes()  # The steps' peak, before the probes' operands.
  for _ in range(args.steps):
    for k, timed in probes.items():
      probe_times[k].append(timed())
  # The analyses after the peak is read, so that their traces are not counted in it.
  compiled_flops = xla_flops = xla_cost(compiled)
  # The cross-check: 3 x the forward (+ losses) FLOPs, from the unoptimised HLO (no compile).
  if jax.default_backend() != "cpu":  # Both counts fall short here (flops_counted_on_cpu).
    xla_flops, fwd_flops = flops_counted_on_cpu(sys.argv[1:] if argv is None else argv, impl, norm)
  else:
    counted = setup
    if impl == "native":  # The C++ kernels' FLOPs, as the same step in XLA ops, lowered.
      counted = train.build(countable_config(config, impl))
      xla_flops = lowered_step_flops(counted, config)
    fwd_flops = lowered_forward_flops(counted, config)
  xla_bytes = xla_cost(compiled, "bytes accessed")
  mem = compiled.memory_analysis()
  loss = float(metrics["loss"])
  step_s = statistics.median(times)
  samples_s = args.batch / step_s
  print(f"step: median {step_s:.3f} s (min {min(times):.3f}, max {max(times):.3f}) over {len(times)} "
        f"steps after {args.warmup} warm-up; loss {loss:.4f}")
  print(f"samples/s: {samples_s:.2f}")
  print(f"peak RSS: {rss / 2**30:.2f} GiB (process, after the timed steps; "
        f"{rss_before / 2**30:.2f} GiB before compiling, {rss_compiled / 2**30:.2f} GiB after)")
  device_peak = (jax.local_devices()[0].memory_stats() or {}).get("peak_bytes_in_use")
  if device_peak is not None:  # An accelerator's own memory (the CPU backend keeps no such count).
    print(f"device memory: peak {device_peak / 2**30:.2f} GiB in use")
  if mem is not None:
    print(f"XLA memory: arguments {mem.argument_size_in_bytes / 2**30:.2f} GiB, outputs "
          f"{mem.output_size_in_bytes / 2**30:.2f} GiB, temporaries {mem.temp_size_in_bytes / 2**30:.2f} GiB, "
          f"aliased {mem.alias_size_in_bytes / 2**30:.2f} GiB")

  # ---- FLOPs and the matmul peak. ---------------------------------------------
  mm_s = statistics.median(probe_times["f32"])
  mm_rate = 2.0 * MATMUL ** 3 / mm_s
  print(f"matmul f32 [{MATMUL}]^2: median {mm_s:.3f} s (min {min(probe_times['f32']):.3f}) = "
        f"{mm_rate / 1e9:.1f} GFLOP/s (measured peak, right after the timed steps)")
  result_bf16 = {}
  if "bf16" in probe_times:
    brate = 2.0 * MATMUL ** 3 / statistics.median(probe_times["bf16"])
    print(f"matmul bf16 [{MATMUL}]^2: {brate / 1e9:.1f} GFLOP/s")
    result_bf16 = {"matmul_bf16_gflops": round(brate / 1e9, 2)}
  peak = args.peak_gflops * 1e9 if args.peak_gflops else mm_rate
  rate = xla_flops / step_s
  if jax.default_backend() != "cpu":
    print(f"XLA GFLOP/step: {compiled_flops / 1e9:.1f} by this backend's cost analysis, which leaves "
          "out the convolutions it hands to a library (cuDNN); below, the same step counted by the "
          "CPU backend (unoptimised, in a child process)")
  elif impl == "native":
    print(f"XLA GFLOP/step: {compiled_flops / 1e9:.1f} without the C++ kernels' FLOPs (custom "
          "calls XLA cannot see into); below, the same step in XLA ops ('fast', unoptimised)")
  print(f"XLA GFLOP/step: {xla_flops / 1e9:.1f} (3 x forward GFLOP: {3 * fwd_flops / 1e9:.1f}); "
        f"achieved {rate / 1e9:.1f} GFLOP/s; MFU {rate / peak:.1%} of "
        f"{'--peak_gflops' if args.peak_gflops else 'the measured matmul'} "
        f"({peak / 1e9:.1f} GFLOP/s); by 3 x forward: {3 * fwd_flops / step_s / peak:.1%}")

  bw = 3 * STREAM * 4 / statistics.median(probe_times["stream"])
  bytes_rate = xla_bytes / step_s
  result_bw = {"xla_gbytes": round(xla_bytes / 1e9, 2), "bytes_gbs": round(bytes_rate / 1e9, 2),
               "stream_gbs": round(bw / 1e9, 2), "bandwidth_use": round(bytes_rate / bw, 4)}
  if xla_bytes:
    print(f"XLA bytes accessed/step: {xla_bytes / 1e9:.1f} GB; {bytes_rate / 1e9:.1f} GB/s = "
          f"{bytes_rate / bw:.0%} of the measured memory bandwidth ({bw / 1e9:.1f} GB/s, `a + b` over "
          f"[{STREAM}] f32, after the timed steps); every byte at that bandwidth alone: "
          f"{xla_bytes / bw:.2f} s/step")

  # ---- Input pipeline. ---------------------------------------------------------
  result_pipe = {}
  if args.pipeline_batches > 0:
    pipe = pipeline_rate(config, args.pipeline_batches)
    print(f"input pipeline: {pipe:.1f} samples/s ({args.pipeline_batches} batches of {args.batch}, "
          f"synthetic source, {args.image_size} px, {args.text_len} tokens), "
          f"{pipe / samples_s:.1f}x the step's consumption ({samples_s:.2f} samples/s; target >= 3x)")
    result_pipe = {"pipeline_samples_s": pipe, "pipeline_ratio": pipe / samples_s}

  result_prof = {}
  if args.profile:
    state, result_prof = profile_step(compiled, state, batch, args.profile, args.top,
                                      args.profile_steps, step_s)

  print(json.dumps({
      "cpu": cpu_name(), "load_avg": [round(x, 2) for x in load],
      "xla_flags": os.environ.get("XLA_FLAGS", ""), "glibc_tunables": os.environ.get("GLIBC_TUNABLES", ""),
      "backend": jax.default_backend(),
      "image_size": args.image_size, "batch": args.batch, "variant": args.variant,
      "head_conv": not args.no_head_conv, "text": [args.text_layers, args.text_hidden, args.text_heads,
                                                    args.text_mlp, args.vocab, args.text_len],
      "dtype": args.dtype, "conv_impl": impl, "norm_impl": norm, "optimizer": args.optimizer, "no_dropout": args.no_dropout, "params_m": round(n_params / 1e6, 3),
      "samples_s": round(samples_s, 3), "step_s_median": round(step_s, 4),
      "step_s_all": [round(t, 4) for t in times], "lower_s": round(lower_s, 2),
      "compile_s": round(compile_s, 2), "peak_rss_gib": round(rss / 2**30, 3),
      "rss_before_compile_gib": round(rss_before / 2**30, 3),
      "rss_after_compile_gib": round(rss_compiled / 2**30, 3),
      "device_peak_gib": round(device_peak / 2**30, 3) if device_peak is not None else None,
      "xla_temp_gib": round(mem.temp_size_in_bytes / 2**30, 3) if mem is not None else None,
      "xla_gflop": round(xla_flops / 1e9, 2), "compiled_gflop": round(compiled_flops / 1e9, 2),
      "fwd3_gflop": round(3 * fwd_flops / 1e9, 2),
      "gflops": round(rate / 1e9, 2), "matmul_f32_gflops": round(mm_rate / 1e9, 2), **result_bw,
      "matmul_s_all": [round(t, 4) for t in probe_times["f32"]],
      "peak_gflops": round(peak / 1e9, 2), "mfu": round(rate / peak, 4),
      "mfu_fwd3": round(3 * fwd_flops / step_s / peak, 4), "loss": loss,
      **result_bf16, **result_pipe, **result_prof}))


if __name__ == "__main__":
  main()
