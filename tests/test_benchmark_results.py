"""Benchmark results as data: benchmarks/results.jsonl is well-formed, benchmarks/README.md is
what benchmarks/results_table.py prints from it, and benchmarks/results.record appends a
well-formed line. Standard library only: no JAX, about a second."""

import datetime
import importlib.util
import json
import math
import pathlib
import re
import shutil
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
BENCH = ROOT / "benchmarks"
RESULTS = BENCH / "results.jsonl"
README = BENCH / "README.md"
REGENERATE = "python benchmarks/results_table.py > benchmarks/README.md"


def _module(name):
  spec = importlib.util.spec_from_file_location(f"_bench_{name}", BENCH / f"{name}.py")
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


results = _module("results")
results_table = _module("results_table")


def _lines():
  return RESULTS.read_text(encoding="utf-8").splitlines()


def _check(entry, where):
  """The schema, checked here without results.problems, so a fault there cannot hide one."""
  required = {"benchmark", "command", "commit", "date", "hardware", "figures", "note"}
  assert required <= set(entry), f"{where}: missing {sorted(required - set(entry))}"
  assert set(entry) <= required | {"config"}, f"{where}: unknown keys {set(entry) - required}"
  for key in ("benchmark", "command", "hardware"):
    assert isinstance(entry[key], str) and entry[key].strip(), f"{where}: {key} {entry[key]!r}"
  assert isinstance(entry["note"], str), where
  if "config" in entry:
    assert isinstance(entry["config"], str) and entry["config"].strip(), where
  assert entry["commit"] is None or re.fullmatch(r"[0-9a-f]{7,40}", entry["commit"]), where
  assert entry["date"] is None or datetime.date.fromisoformat(entry["date"]), where
  assert entry["hardware"].startswith(("cpu: ", "gpu: ")), f"{where}: {entry['hardware']!r}"
  figures = entry["figures"]
  assert isinstance(figures, dict) and figures, f"{where}: figures {figures!r}"
  for name, value in figures.items():
    assert isinstance(name, str) and name.strip(), where
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    assert (number and math.isfinite(value)) or isinstance(value, str), \
        f"{where}: figure {name!r} = {value!r}"


def test_every_results_line_parses_with_the_required_keys():
  lines = _lines()
  assert len(lines) >= 20, "results.jsonl should hold the headline figures"
  for i, line in enumerate(lines, 1):
    assert line.strip(), f"results.jsonl:{i}: an empty line"
    entry = json.loads(line)
    _check(entry, f"results.jsonl:{i}")
    assert results.problems(entry) == [], f"results.jsonl:{i}"


def test_results_speak_of_the_product_only():
  text = RESULTS.read_text(encoding="utf-8")
  for pattern in (r"/work\b", r"\.\./shared", r"\bstop \d", r"\bissues? \d", r"\bsession"):
    assert not re.search(pattern, text), f"results.jsonl mentions {pattern!r}"


@pytest.mark.parametrize("bad", [
    {"figures": {}},
    {"figures": {"samples/s": None}},
    {"figures": {"samples/s": float("nan")}},
    {"figures": {"samples/s": True}},
    {"figures": {"samples/s": [1, 2]}},
    {"commit": "not-a-hash"},
    {"date": "30 Nov"},
    {"hardware": "2-core Xeon"},
    {"command": ""},
    {"extra": 1},
])
def test_problems_finds_a_bad_line(bad):
  good = json.loads(_lines()[0])
  assert results.problems(good) == []
  assert results.problems({**good, **bad}), bad
  missing = dict(good)
  del missing["figures"]
  assert results.problems(missing)


def test_readme_is_what_results_table_prints():
  assert README.read_text(encoding="utf-8") == results_table.render(), \
      f"benchmarks/README.md is out of date with results.jsonl or the scripts; run {REGENERATE}"
  out = subprocess.run([sys.executable, str(BENCH / "results_table.py")], cwd=ROOT,
                       capture_output=True, text=True, timeout=60, check=True)
  assert out.stdout == README.read_text(encoding="utf-8")


def test_the_last_line_of_each_benchmark_config_and_hardware_is_shown():
  base = {"benchmark": "bench_x", "command": "python benchmarks/bench_x.py", "commit": None,
          "date": None, "note": ""}
  entries = [
      {**base, "hardware": "cpu: 2-core A", "figures": {"samples/s": 11.5}},
      {**base, "hardware": "cpu: 2-core B", "figures": {"samples/s": 22.5}},
      {**base, "hardware": "cpu: 2-core A", "figures": {"samples/s": 33.5}},
      {**base, "hardware": "cpu: 2-core A", "config": "big", "figures": {"samples/s": 44.5}},
  ]
  text = results_table.render(entries)
  section = text[text.index("## bench_x"):]
  assert "33.5" in section and "22.5" in section and "44.5" in section
  assert "11.5" not in section
  rows = [line for line in section.splitlines() if line.startswith("| cpu")]
  assert [row.split(" | ")[0] for row in rows] == ["| cpu: 2-core A", "| cpu: 2-core B",
                                                   "| cpu: 2-core A"]
  assert [e["figures"]["samples/s"] for e in results.latest(entries)] == [33.5, 22.5, 44.5]


def test_record_appends_one_well_formed_line(tmp_path):
  path = tmp_path / "results.jsonl"
  shutil.copy(RESULTS, path)
  before = path.read_text(encoding="utf-8")
  entry = results.record("bench_check", {"samples/s": 12.5, "peak RSS GiB": 2.71, "kind": "x"},
                         command="python benchmarks/bench_check.py --steps=3", note="a check",
                         config="128 px", path=str(path))
  after = path.read_text(encoding="utf-8")
  assert after.startswith(before) and after.count("\n") == before.count("\n") + 1
  line = after.splitlines()[-1]
  assert json.loads(line) == entry
  _check(entry, "recorded")
  assert list(entry) == ["benchmark", "config", "command", "commit", "date", "hardware",
                         "figures", "note"]
  assert entry["figures"] == {"samples/s": 12.5, "peak RSS GiB": 2.71, "kind": "x"}
  assert entry["date"] == datetime.date.today().isoformat()
  git = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                       text=True)
  assert entry["commit"] == (git.stdout.strip() if git.returncode == 0 else None)

  # Without a command: this process's command line; a file whose last line has no newline.
  path.write_text('{"partial": 1}', encoding="utf-8")
  second = results.record("bench_check", {"n": 1}, hardware="cpu", path=str(path))
  assert second["command"].startswith("python ")
  assert second["hardware"].startswith("cpu: ")
  assert json.loads(path.read_text(encoding="utf-8").splitlines()[-1]) == second


@pytest.mark.parametrize("figures", [{}, {"samples/s": None}, {"samples/s": float("inf")}])
def test_record_refuses_a_bad_line_and_writes_nothing(tmp_path, figures):
  path = tmp_path / "results.jsonl"
  path.write_text("", encoding="utf-8")
  with pytest.raises(ValueError):
    results.record("bench_check", figures, command="python x.py", path=str(path))
  assert path.read_text(encoding="utf-8") == ""


LSCPU = """CPU(s):                                  {cpus}
Vendor ID:                               {vendor}
Model name:                              {name}
CPU family:                              {family}
Model:                                   {model}
Flags:                                   fpu sse2 avx fma {flags} rdrand
"""


@pytest.mark.parametrize("name, family, model, flags, cpus, kind", [
    ("Intel(R) Xeon(R) Processor @ 2.50GHz", 6, 85, "avx2 avx512f avx512bw", 2,
     "cpu: 2-core Intel Xeon, AVX-512"),
    ("AMD EPYC", 25, 1, "avx2", 2, "cpu: 2-core AMD EPYC, AVX2 (Zen 3)"),
    ("AMD EPYC", 25, 17, "avx2 avx512f", 2, "cpu: 2-core AMD EPYC, AVX-512 (Zen 4)"),
    ("AMD EPYC 7B12 64-Core Processor", 23, 49, "avx2", 8, "cpu: 8-core AMD EPYC 7B12, AVX2 (Zen 2)"),
    ("AMD EPYC", 30, 3, "avx2", 2, "cpu: 2-core AMD EPYC, AVX2 (family 30 model 3)"),
])
def test_cpu_kind_from_lscpu(name, family, model, flags, cpus, kind):
  text = LSCPU.format(cpus=cpus, vendor="x", name=name, family=family, model=model, flags=flags)
  assert results.cpu_kind(text) == kind


def test_gpu_kind_from_nvidia_smi():
  assert results.gpu_kind("NVIDIA H200\n") == "gpu: NVIDIA H200"
  assert results.gpu_kind("NVIDIA H100 80GB HBM3\n" * 8) == "gpu: 8x NVIDIA H100 80GB HBM3"
  assert results.gpu_kind("") is None
