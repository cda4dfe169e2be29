"""Benchmark results as data: one JSON object per line of benchmarks/results.jsonl.

Any benchmark script (or a person, from a shell) adds a result with `record`:

    import sys
    sys.path.insert(0, "benchmarks")        # not needed in a script that lives in benchmarks/
    from results import record
    record("bench_step", {"samples/s": 59.67, "peak RSS GiB": 2.71, "MFU %": 44.6},
           config="128 px, batch 128, float32", note="after open_clip")

It appends one line with the current commit (`git rev-parse --short HEAD`; null outside a
git checkout), today's date and the hardware read off the machine: the GPU's name from
nvidia-smi where there is one, else the CPU's kind from `lscpu` (its model name, its core
count and whether it has AVX-512 or AVX2, and for an AMD CPU its Zen generation), e.g.
"cpu: 2-core AMD EPYC, AVX-512 (Zen 4)" or "gpu: NVIDIA H200". `command` defaults to the
running script's command line. Then regenerate the summary:

    python benchmarks/results_table.py > benchmarks/README.md

A line's keys: benchmark (the script, or "demo", "test_suite", ...), config (optional:
which configuration of the benchmark, when it has several), command, commit, date
(YYYY-MM-DD), hardware, figures ({name: number or string}) and note (a short phrase).
For each (benchmark, config, hardware) the last line is the current one. Standard
library only: importing this loads no JAX.
"""

import datetime
import json
import math
import os
import re
import shlex
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
RESULTS = os.path.join(HERE, "results.jsonl")

KEYS = ("benchmark", "config", "command", "commit", "date", "hardware", "figures", "note")
REQUIRED = ("benchmark", "command", "commit", "date", "hardware", "figures", "note")
_COMMIT = re.compile(r"^[0-9a-f]{7,40}$")
_DATE = re.compile(r"^\d{4}-\d{2}-\d{2}$")


def _run(argv, cwd=None, timeout=10):
  """stdout of a command, or None when it is missing or fails."""
  try:
    out = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=timeout,
                         env={**os.environ, "LC_ALL": "C"})
  except (OSError, subprocess.SubprocessError):
    return None
  return out.stdout if out.returncode == 0 else None


def git_commit(cwd=ROOT):
  """The checkout's short HEAD, or None outside a git checkout."""
  out = _run(["git", "rev-parse", "--short", "HEAD"], cwd=cwd)
  return out.strip() or None if out else None


def _zen(family, model):
  """AMD's core generation from `lscpu`'s CPU family and model."""
  if family == 23:
    return "Zen 2" if model >= 0x30 else "Zen"
  if family == 25:
    return "Zen 4" if 0x10 <= model <= 0x1F or 0x60 <= model <= 0xAF else "Zen 3"
  if family == 26:
    return "Zen 5"
  return f"family {family} model {model}"


def _short_name(name):
  """'Intel(R) Xeon(R) Processor @ 2.50GHz' -> 'Intel Xeon'."""
  name = re.sub(r"\((R|TM|tm)\)", "", name)
  name = re.sub(r"@\s*[\d.]+\s*GHz", "", name)
  name = re.sub(r"\b(\d+-Core|CPU|Processor)\b", "", name)
  return " ".join(name.split()) or "unknown CPU"


def cpu_kind(lscpu_text=None):
  """The CPU's kind, e.g. 'cpu: 2-core Intel Xeon, AVX-512', from `lscpu`'s output
  (read off this machine when not given; /proc/cpuinfo where lscpu is missing)."""
  text = lscpu_text if lscpu_text is not None else _run(["lscpu"])
  fields = {}
  if text:
    for line in text.splitlines():
      key, sep, value = line.partition(":")
      if sep:
        fields.setdefault(key.strip(), value.strip())
    name, family, model = fields.get("Model name", ""), fields.get("CPU family"), fields.get("Model")
    flags, cpus = fields.get("Flags", "").split(), fields.get("CPU(s)")
  else:
    info = {}
    try:
      with open("/proc/cpuinfo") as f:
        for line in f:
          key, sep, value = line.partition(":")
          if sep:
            info.setdefault(key.strip(), value.strip())
    except OSError:
      pass
    name, family, model = info.get("model name", ""), info.get("cpu family"), info.get("model")
    flags, cpus = info.get("flags", "").split(), str(os.cpu_count() or "")
  isa = "AVX-512" if "avx512f" in flags else "AVX2" if "avx2" in flags else "no AVX2"
  kind = f"cpu: {cpus}-core {_short_name(name)}" if cpus and cpus.isdigit() else \
      f"cpu: {_short_name(name)}"
  kind += f", {isa}"
  if "AMD" in name and family and model and family.isdigit() and model.isdigit():
    kind += f" ({_zen(int(family), int(model))})"
  return kind


def gpu_kind(smi_text=None):
  """'gpu: NVIDIA H200' (or 'gpu: 8x NVIDIA H100 80GB HBM3'), or None without a GPU."""
  text = smi_text if smi_text is not None else _run(
      ["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"])
  names = [n.strip() for n in (text or "").splitlines() if n.strip()]
  if not names:
    return None
  if len(set(names)) == 1:
    return f"gpu: {names[0]}" if len(names) == 1 else f"gpu: {len(names)}x {names[0]}"
  return "gpu: " + ", ".join(names)


def machine(which=None):
  """The machine's kind: None -> the GPU if there is one, else the CPU; 'cpu' or 'gpu' ->
  that one; any other string is taken as given."""
  if which in (None, "gpu"):
    gpu = gpu_kind()
    if gpu or which == "gpu":
      return gpu or "gpu: none found"
    return cpu_kind()
  return cpu_kind() if which == "cpu" else which


def _default_command():
  argv = list(sys.argv)
  if not argv or not argv[0]:
    return "python"
  script = os.path.abspath(argv[0])
  if script.startswith(ROOT + os.sep):
    script = os.path.relpath(script, ROOT)
  return shlex.join(["python", script] + argv[1:])


def problems(entry):
  """What is wrong with one results line (a dict), as a list of strings; [] if nothing."""
  if not isinstance(entry, dict):
    return ["not a JSON object"]
  found = [f"missing key {k!r}" for k in REQUIRED if k not in entry]
  found += [f"unknown key {k!r}" for k in entry if k not in KEYS]
  for key in ("benchmark", "command", "hardware"):
    if key in entry and (not isinstance(entry[key], str) or not entry[key].strip()):
      found.append(f"{key} must be a non-empty string")
  if "config" in entry and (not isinstance(entry["config"], str) or not entry["config"].strip()):
    found.append("config, when given, must be a non-empty string")
  if "note" in entry and not isinstance(entry["note"], str):
    found.append("note must be a string")
  commit = entry.get("commit")
  if commit is not None and not (isinstance(commit, str) and _COMMIT.match(commit)):
    found.append(f"commit must be a hex hash or null, not {commit!r}")
  date = entry.get("date")
  if date is not None and not (isinstance(date, str) and _DATE.match(date)):
    found.append(f"date must be YYYY-MM-DD or null, not {date!r}")
  hw = entry.get("hardware")
  if isinstance(hw, str) and not hw.startswith(("cpu: ", "gpu: ")):
    found.append(f"hardware must start with 'cpu: ' or 'gpu: ', not {hw!r}")
  figures = entry.get("figures")
  if "figures" in entry:
    if not isinstance(figures, dict) or not figures:
      found.append("figures must be a non-empty object")
    else:
      for name, value in figures.items():
        number = isinstance(value, (int, float)) and not isinstance(value, bool)
        if not isinstance(name, str) or not name.strip():
          found.append(f"figure name {name!r} must be a non-empty string")
        if not (number and math.isfinite(value)) and not isinstance(value, str):
          found.append(f"figure {name!r} must be a finite number or a string, not {value!r}")
  return found


def record(benchmark, figures, command=None, note="", *, config=None, hardware=None,
           path=None):
  """Appends one result to results.jsonl (or `path`) and returns it as a dict.

  benchmark: the script's name without .py ("bench_step"), or "demo", "test_suite", ...
  figures: {name: number or string}, the name with its unit ("samples/s", "peak RSS GiB").
  command: the exact command; by default this process's command line.
  config: which configuration, when the benchmark has several ("224 px, batch 64").
  hardware: None (the GPU if present, else the CPU), "cpu", "gpu", or a kind as a string.
  """
  entry = {"benchmark": benchmark}
  if config is not None:
    entry["config"] = config
  entry.update(command=command if command is not None else _default_command(),
               commit=git_commit(), date=datetime.date.today().isoformat(),
               hardware=machine(hardware), figures=dict(figures), note=note)
  wrong = problems(entry)
  if wrong:
    raise ValueError("results.record: " + "; ".join(wrong))
  path = path or RESULTS
  line = json.dumps(entry, ensure_ascii=False) + "\n"
  with open(path, "a+", encoding="utf-8") as f:
    f.seek(0, os.SEEK_END)
    if f.tell():
      f.seek(f.tell() - 1)
      if f.read(1) != "\n":
        line = "\n" + line
    f.write(line)
  return entry


def read(path=None):
  """Every line of results.jsonl (or `path`) as a dict, in file order."""
  with open(path or RESULTS, encoding="utf-8") as f:
    return [json.loads(line) for line in f if line.strip()]


def key(entry):
  """What a later line supersedes an earlier one on."""
  return entry["benchmark"], entry.get("config"), entry["hardware"]


def latest(entries):
  """The last line of each (benchmark, config, hardware), in order of their first line."""
  out = {}
  for entry in entries:
    out[key(entry)] = entry
  first = {}
  for i, entry in enumerate(entries):
    first.setdefault(key(entry), i)
  return sorted(out.values(), key=lambda e: first[key(e)])


if __name__ == "__main__":
  print(machine())
  print("commit", git_commit())
