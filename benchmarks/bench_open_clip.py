"""The reference for benchmarks/bench_step.py: the same towers and step in PyTorch (open_clip + timm).

Why: issue 9 sets mural's step speed and memory targets relative to open_clip
on the same towers and machine (>= 1.5x the samples/s of open_clip tuned,
peak memory no higher). This times that reference, one configuration per
fresh subprocess (peak RSS is per process; jemalloc must be preloaded).

Setup (a separate venv, NOT a project dependency; CPU torch, not the huge CUDA one):
  python3.11 -m venv /tmp/oc_venv
  /tmp/oc_venv/bin/pip install --no-index --find-links /opt/wheels --find-links /opt/pypi/files \\
      --find-links /opt/pypi-more/files "torch==2.13.0+cpu" "torchvision==0.28.0" \\
      open_clip_torch==3.3.0 timm numpy
  apt-get install -y libjemalloc2      # optional: the 'tuned' run preloads it
(or from PyPI: pip install torch --index-url https://download.pytorch.org/whl/cpu, then
open_clip_torch timm). A torchvision wheel built for CUDA torch cannot load its C++ ops
under CPU torch and fails on import ('operator torchvision::nms does not exist'); this
script then declares the two op schemas torchvision's import needs (nms, qnms; never
called here) and imports it again. open_clip only uses torchvision for transforms.

Run (about 1-2 minutes per configuration at the defaults on 2 cores):
  /tmp/oc_venv/bin/python benchmarks/bench_open_clip.py                       # stock, channels_last, tuned
  /tmp/oc_venv/bin/python benchmarks/bench_open_clip.py --configs=tuned --image_size=224 --batch=64
  python3 benchmarks/bench_open_clip.py --device=cuda --configs=stock,channels_last --amp=bf16   # a GPU

Model: open_clip.CLIP with a timm `efficientnet_b0` image tower (its 1280-wide
head conv, average pool, a linear projection to 256; no pretrained weights)
and open_clip's text transformer (4 layers, width 256, 4 heads, MLP 1024,
vocab 30522, context 32, projection to 256); fp32; random images
[batch, 3, size, size] and token ids. A step: forward, open_clip's ClipLoss
(in-batch softmax both ways, learned logit scale), backward, AdamW
(torch.optim.AdamW, its default foreach implementation), zero_grad.
Configurations:
  stock          as above, NCHW, the system malloc;
  channels_last  model and images in torch.channels_last;
  tuned          channels_last + jemalloc (LD_PRELOAD of libjemalloc.so.2 with
                 MALLOC_CONF=JEMALLOC_CONF below, Intel's PyTorch CPU tuning guide);
                 without libjemalloc it is skipped.

What it prints, per configuration (the same figures as bench_step.py):
  samples/s      batch / the median step time of --steps timed steps after --warmup;
  step time      median, min, max seconds;
  peak RSS       the process's peak resident memory (getrusage ru_maxrss) right
                 after the timed steps (model, optimizer state, activations,
                 allocator caches, the Python / torch runtime);
  device memory  with --device=cuda: torch.cuda.max_memory_allocated;
  GFLOP/step     3 x torch.utils.flop_counter's count of one forward (convs and
                 matmuls, the loss included), counted after the timed steps, and
                 GFLOP/s: bench_step.py's "3 x forward" figure (about 172-190
                 for the same towers). Not the counter's count of a whole step:
                 it (torch 2.13) counts one of a depthwise conv's two backward
                 convs as a dense conv (C times its FLOPs): one 3x3 depthwise
                 conv at [8, 96, 32, 32] counts 14.2 MFLOP forward (right) and
                 1387 forward + backward, against 3 x 14.2 = 42.5; the default
                 towers' step counted 1423 GFLOP;
  torch matmul   GFLOP/s of an f32 [4096]^2 torch.mm (median of --matmul_repeats);
then a table of all configurations and one JSON line with every figure.
"""

import argparse
import glob
import importlib.util
import json
import os
import resource
import statistics
import subprocess
import sys
import time

JEMALLOC_CONF = ("oversize_threshold:1,background_thread:true,metadata_thp:auto,"
                 "dirty_decay_ms:9000000000,muzzy_decay_ms:9000000000")
CONFIGS = ("stock", "channels_last", "tuned")
SETUP_HINT = ("bench_open_clip.py needs torch, timm and open_clip_torch in a separate venv; set it up as "
              "the docstring says, e.g.\n  python3.11 -m venv /tmp/oc_venv && /tmp/oc_venv/bin/pip install "
              "--no-index --find-links /opt/wheels --find-links /opt/pypi/files --find-links "
              "/opt/pypi-more/files 'torch==2.13.0+cpu' 'torchvision==0.28.0' open_clip_torch==3.3.0 timm numpy\n"
              "and run it with /tmp/oc_venv/bin/python benchmarks/bench_open_clip.py")


def jemalloc_path():
  paths = sorted(glob.glob("/usr/lib/x86_64-linux-gnu/libjemalloc.so*") +
                 glob.glob("/usr/lib64/libjemalloc.so*") + glob.glob("/usr/lib/libjemalloc.so*"))
  return paths[0] if paths else None


def import_open_clip():
  """(torch, open_clip); a CUDA-built torchvision under CPU torch gets its two op schemas."""
  import torch  # pylint: disable=g-import-not-at-top
  try:
    import torchvision  # pylint: disable=g-import-not-at-top,unused-import
  except RuntimeError as e:
    if "torchvision::nms" not in str(e):
      raise
    for name in [m for m in sys.modules if m == "torchvision" or m.startswith("torchvision.")]:
      del sys.modules[name]
    global _TORCHVISION_SCHEMAS  # pylint: disable=global-variable-undefined
    _TORCHVISION_SCHEMAS = torch.library.Library("torchvision", "DEF")  # Kept alive.
    for op in ("nms", "qnms"):
      _TORCHVISION_SCHEMAS.define(f"{op}(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
    import torchvision  # pylint: disable=g-import-not-at-top,unused-import,redefined-outer-name
  import open_clip  # pylint: disable=g-import-not-at-top
  return torch, open_clip


def run_one(args) -> dict:
  """Builds, warms up and times one configuration in this process."""
  torch, open_clip = import_open_clip()
  import timm  # pylint: disable=g-import-not-at-top
  from torch.utils.flop_counter import FlopCounterMode  # pylint: disable=g-import-not-at-top
  torch.manual_seed(0)
  channels_last = args.config in ("channels_last", "tuned")
  model = open_clip.CLIP(
      embed_dim=args.embed_dim,
      vision_cfg=dict(timm_model_name="efficientnet_b0", timm_model_pretrained=False, timm_pool="avg",
                      timm_proj="linear", image_size=args.image_size),
      text_cfg=dict(context_length=args.context, vocab_size=args.vocab, width=args.width,
                    heads=args.heads, layers=args.layers, mlp_ratio=args.mlp / args.width),
      output_dict=True)
  model.train()
  device = torch.device(args.device)
  model = model.to(device)
  images = torch.randn(args.batch, 3, args.image_size, args.image_size, device=device)
  texts = torch.randint(1, args.vocab, (args.batch, args.context), device=device)
  if channels_last:
    model = model.to(memory_format=torch.channels_last)
    images = images.contiguous(memory_format=torch.channels_last)
  loss_fn = open_clip.ClipLoss()
  optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=1e-5)

  def step():
    # --amp=bf16: torch.autocast, as open_clip's --precision amp_bf16 (params and AdamW stay f32).
    with torch.autocast(device.type, dtype=torch.bfloat16, enabled=args.amp == "bf16"):
      out = model(images, texts)
      loss = loss_fn(out["image_features"], out["text_features"], out["logit_scale"])
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return float(loss)  # Waits for the device.

  for _ in range(args.warmup):
    step()
  times = []
  for _ in range(args.steps):
    t0 = time.perf_counter()
    loss = step()
    times.append(time.perf_counter() - t0)
  rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
  device_peak = torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None
  # The forward's FLOPs, times 3 for the step (bench_step.py's "3 x forward" line): torch's
  # counter counts a grouped conv's backward as a dense conv's (B0's depthwise backward at
  # 128 px: 1,313 GFLOP counted against 32 for every conv forward), so it cannot count the step.
  counter = FlopCounterMode(display=False)
  with counter, torch.no_grad():
    out = model(images, texts)
    loss_fn(out["image_features"], out["text_features"], out["logit_scale"])
  flops = 3 * float(counter.get_total_flops())
  a = torch.randn(4096, 4096, device=device)
  mm = []
  for _ in range(args.matmul_repeats + 1):
    t0 = time.perf_counter()
    torch.mm(a, a)
    if device.type == "cuda":
      torch.cuda.synchronize(device)
    mm.append(time.perf_counter() - t0)
  mm_rate = 2 * 4096 ** 3 / statistics.median(mm[1:])
  step_s = statistics.median(times)
  return dict(config=args.config, device=args.device, amp=args.amp,
              device_peak_gib=device_peak / 2**30 if device_peak is not None else None,
              samples_s=args.batch / step_s, step_s_median=step_s,
              step_s_all=[round(t, 4) for t in times], peak_rss_gib=rss / 2**30, gflop=flops / 1e9,
              gflops=flops / step_s / 1e9, torch_matmul_f32_gflops=mm_rate / 1e9, loss=loss,
              threads=torch.get_num_threads(), torch=torch.__version__, open_clip=open_clip.__version__,
              timm=timm.__version__, params_m=sum(p.numel() for p in model.parameters()) / 1e6,
              ld_preload=os.environ.get("LD_PRELOAD", ""))


def print_one(r) -> None:
  print(f"[{r['config']}] step: median {r['step_s_median']:.3f} s (min {min(r['step_s_all']):.3f}, "
        f"max {max(r['step_s_all']):.3f}); loss {r['loss']:.4f}")
  print(f"[{r['config']}] samples/s: {r['samples_s']:.2f}")
  print(f"[{r['config']}] peak RSS: {r['peak_rss_gib']:.2f} GiB (process, after the timed steps)")
  if r["device_peak_gib"] is not None:
    print(f"[{r['config']}] device memory: peak {r['device_peak_gib']:.2f} GiB allocated")
  print(f"[{r['config']}] GFLOP/step (3 x forward, torch's flop counter): {r['gflop']:.1f}; achieved "
        f"{r['gflops']:.1f} GFLOP/s; torch matmul f32 [4096]^2 {r['torch_matmul_f32_gflops']:.1f} GFLOP/s")


def main(argv=None) -> None:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--configs", default=",".join(CONFIGS), help=f"comma-separated subset of {CONFIGS}")
  p.add_argument("--image_size", type=int, default=128)
  p.add_argument("--batch", type=int, default=128)
  p.add_argument("--embed_dim", type=int, default=256)
  p.add_argument("--layers", type=int, default=4)
  p.add_argument("--width", type=int, default=256)
  p.add_argument("--heads", type=int, default=4)
  p.add_argument("--mlp", type=int, default=1024)
  p.add_argument("--vocab", type=int, default=30522)
  p.add_argument("--context", type=int, default=32)
  p.add_argument("--warmup", type=int, default=2)
  p.add_argument("--steps", type=int, default=5)
  p.add_argument("--matmul_repeats", type=int, default=3)
  p.add_argument("--device", default="cpu", help="torch device: cpu, or cuda on a GPU")
  p.add_argument("--amp", default="none", choices=["none", "bf16"], help="bf16 autocast (mixed precision)")
  p.add_argument("--config", default="", help=argparse.SUPPRESS)  # A child: run this one.
  args = p.parse_args(argv)
  missing = [m for m in ("torch", "torchvision", "timm", "open_clip") if importlib.util.find_spec(m) is None]
  if missing:
    print(f"missing module(s) {', '.join(missing)} in {sys.executable}.\n{SETUP_HINT}", file=sys.stderr)
    sys.exit(2)
  if args.device.startswith("cuda") and not args.config:
    import torch  # pylint: disable=g-import-not-at-top
    if not torch.cuda.is_available():
      sys.exit(f"--device={args.device}: this torch ({torch.__version__}) sees no CUDA device")
  if args.config:
    r = run_one(args)
    print_one(r)
    print("JSON " + json.dumps(r))
    return

  load = os.getloadavg()
  print(f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}; open_clip CLIP: timm efficientnet_b0 "
        f"(+ 1280 head conv) -> {args.embed_dim}, text L{args.layers}/W{args.width}/H{args.heads}/"
        f"MLP{args.mlp}, vocab {args.vocab}, context {args.context}; "
        f"fp32{' + bf16 autocast' if args.amp == 'bf16' else ''} on {args.device}; batch {args.batch} at "
        f"{args.image_size} px; AdamW")
  results = []
  forwarded = [a for a in (argv if argv is not None else sys.argv[1:]) if not a.startswith("--configs")]
  for config in args.configs.split(","):
    if config not in CONFIGS:
      sys.exit(f"--configs: {config!r} not in {CONFIGS}")
    env = dict(os.environ)
    if config == "tuned":
      lib = jemalloc_path()
      if lib is None:
        print("[tuned] skipped: no libjemalloc.so (apt-get install -y libjemalloc2)")
        continue
      env["LD_PRELOAD"] = f"{lib} {env.get('LD_PRELOAD', '')}".strip()
      env["MALLOC_CONF"] = JEMALLOC_CONF
    proc = subprocess.run([sys.executable, os.path.abspath(__file__), *forwarded, f"--config={config}"],
                          env=env, capture_output=True, text=True, check=False)
    lines = proc.stdout.splitlines()
    print("\n".join(l for l in lines if not l.startswith("JSON ")), flush=True)
    done = [l for l in lines if l.startswith("JSON ")]
    if proc.returncode or not done:
      print(f"[{config}] failed (exit {proc.returncode}): {proc.stderr.strip()[-800:]}")
      continue
    results.append(json.loads(done[0][5:]))
  print(f"{'config':14s} {'samples/s':>9s} {'step s':>7s} {'peak RSS GiB':>12s} {'GFLOP/s':>8s}")
  for r in results:
    print(f"{r['config']:14s} {r['samples_s']:9.2f} {r['step_s_median']:7.3f} {r['peak_rss_gib']:12.2f} "
          f"{r['gflops']:8.1f}")
  print(json.dumps({"load_avg": [round(x, 2) for x in load], "image_size": args.image_size,
                    "batch": args.batch, "results": results}))


if __name__ == "__main__":
  main()
