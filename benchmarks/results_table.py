"""Prints benchmarks/README.md: the scripts, and each benchmark's latest figures from results.jsonl.

    python benchmarks/results_table.py > benchmarks/README.md

One table per benchmark, a row for each (configuration, hardware) with the last line
results.jsonl holds for it, then each row's command and note. The scripts' one-line
summaries come from their docstrings (read with ast: nothing is imported, no JAX loads).
tests/test_benchmark_results.py checks that benchmarks/README.md is this output.
"""

import ast
import os
import re
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
  sys.path.insert(0, HERE)
import results  # noqa: E402  (benchmarks/results.py)

# Benchmarks that are not a script of this folder, and what each measures.
OTHERS = {
    "demo": "`make demo`: the tiny MURAL on the built-in data, 1,200 steps on 2 CPU cores: its "
            "wall time (the run's \"Done\" line: start-up, vocabulary, compilation and "
            "evaluations included; and with the install) and its final mean recall (mR, "
            "image->text and text->image R@1/5/10 on 200 held-out scenes).",
    "test_suite": "The test suite cold (new JAX and kernel caches), as CI runs it.",
    "svcca": "`python -m mural.svcca`: how alike the languages' caption embeddings are (SVCCA "
             "similarity, the MURAL paper's section 5) in an exported run.",
    "flickr8k": "Training from scratch on the 875 Flickr8k photos (captions in six languages) "
                "and Multi30k's translation pairs: mean mR on the 113 dev photos, and how often "
                "a Multi30k test caption's translation ranks first among 1000.",
}
# The order of the sections; benchmarks not named here follow in order of appearance.
ORDER = ("bench_step", "bench_open_clip", "gpu_bench", "demo", "demo_input", "bench_pipeline",
         "test_suite", "pytest_cpu", "mural_claim", "svcca", "mule_claim", "smalr_claim",
         "kadar_claim", "globetrotter_claim", "flickr8k", "export_roundtrip", "bench_retrieval",
         "bench_ann", "fasttext_read")
NOT_BENCHMARKS = ("results.py", "results_table.py")


def _clean(text):
  """One line of a docstring, without references to issue numbers."""
  text = re.sub(r"\s*\((?:issue|stop)s? \d+[^)]*\)", "", text)
  return " ".join(text.split())


def summary(path):
  """The first paragraph of a script's docstring (or, for a shell script, the first line of
  its first comment)."""
  with open(path, encoding="utf-8") as f:
    source = f.read()
  if path.endswith(".py"):
    doc = (ast.get_docstring(ast.parse(source)) or "").strip()
    return _clean(doc.split("\n\n")[0]) if doc else ""
  for line in source.splitlines():
    if line.startswith("#") and not line.startswith("#!") and line.strip("# ").strip():
      return _clean(line.lstrip("#").strip())
  return ""


def scripts(bench_dir=HERE):
  """[(name, file name, summary)] of the benchmark scripts, by name."""
  out = []
  for name in sorted(os.listdir(bench_dir)):
    if name.endswith((".py", ".sh")) and name not in NOT_BENCHMARKS and not name.startswith("_"):
      out.append((os.path.splitext(name)[0], name, summary(os.path.join(bench_dir, name))))
  return out


def cell(value):
  if value is None:
    return ""
  if isinstance(value, float):
    value = repr(value)
  return str(value).replace("|", "\\|").replace("\n", " ")


def code(text):
  """`text` as a Markdown code span, whatever backticks it holds."""
  ticks = "`" * (max((len(r) for r in re.findall(r"`+", text)), default=0) + 1)
  pad = " " if text.startswith("`") or text.endswith("`") else ""
  return f"{ticks}{pad}{text}{pad}{ticks}"


def _table(rows):
  lines = ["| " + " | ".join(rows[0]) + " |", "|" + "---|" * len(rows[0])]
  lines += ["| " + " | ".join(row) + " |" for row in rows[1:]]
  return lines


def render(entries=None, bench_dir=HERE):
  """benchmarks/README.md as a string."""
  entries = results.read() if entries is None else entries
  current = results.latest(entries)
  found = scripts(bench_dir)
  described = {name: text for name, _, text in found}
  described.update(OTHERS)
  names = [b for b in ORDER if any(e["benchmark"] == b for e in current)]
  names += [b for b in dict.fromkeys(e["benchmark"] for e in current) if b not in names]

  out = [
      "# Benchmarks",
      "",
      "The current figures of mural's benchmarks: for each benchmark, the latest result on each",
      "kind of hardware (and each configuration, where a benchmark has several), with the",
      "command that produced it. This file is generated from `results.jsonl`; do not edit it,",
      "regenerate it:",
      "",
      "```sh",
      "python benchmarks/results_table.py > benchmarks/README.md",
      "```",
      "",
      "Read a figure with its hardware. The CPU figures come from shared 2-core virtual",
      "machines of three kinds (an Intel Xeon with AVX-512, an AMD EPYC with AVX2 only (Zen 3),",
      "an AMD EPYC with AVX-512 (Zen 4)) whose speed moves by up to 2.5x from hour to hour (a",
      "row's note says when a run fell in a slow spell), so compare runs made one after the",
      "other on one machine. What was tried and dropped, with the figures that dropped it, is",
      "in [docs/tried_and_dropped.md](../docs/tried_and_dropped.md).",
      "",
      "## The scripts",
      "",
      "Each script's docstring says how to run it and what it prints. Run them from the",
      "repository root with the project's venv, e.g.",
      "`.venv/bin/python benchmarks/bench_step.py --warmup=1 --steps=10 --pipeline_batches=0`.",
      "",
  ]
  out += _table([("script", "measures")] +
                [(f"`{fname}`", cell(text)) for _, fname, text in found])
  out += [
      "",
      "## Results as data",
      "",
      "`results.jsonl` holds one JSON object per line, one per result: `benchmark` (the",
      "script, or `demo`, `test_suite`, ...), `config` (optional: which configuration), the",
      "exact `command`, the `commit` it ran on and the `date` (null where not recorded), the",
      "`hardware` kind, the `figures` ({name: number or string}) and a short `note`. For",
      "each (benchmark, config, hardware) the last line is the current one; earlier lines",
      "stay as history. A benchmark script, or a person, adds a result with",
      "`benchmarks/results.py` (standard library only), which reads the commit, the date and",
      "the hardware off the checkout and the machine; then regenerate this file:",
      "",
      "```python",
      "from results import record  # in a script in benchmarks/; elsewhere put benchmarks/ on sys.path",
      "record(\"bench_step\", {\"samples/s\": 59.67, \"peak RSS GiB\": 2.71},",
      "       config=\"128 px, batch 128, float32\", note=\"after open_clip\")",
      "```",
  ]
  for name in names:
    rows = [e for e in current if e["benchmark"] == name]
    out += ["", f"## {name}", ""]
    if described.get(name):
      out += [described[name], ""]
    hardware = list(dict.fromkeys(e["hardware"] for e in rows))
    with_config = any(e.get("config") for e in rows)
    figures = list(dict.fromkeys(k for e in rows for k in e["figures"]))
    if len(hardware) == 1:
      out += [f"Hardware: {code(hardware[0])}.", ""]
    header = (["hardware"] if len(hardware) > 1 else []) + (["config"] if with_config else [])
    table = [header + figures + ["commit", "date"]]
    for e in rows:
      row = ([cell(e["hardware"])] if len(hardware) > 1 else [])
      row += [cell(e.get("config"))] if with_config else []
      row += [cell(e["figures"].get(k)) for k in figures]
      row += [cell(e["commit"]), cell(e["date"])]
      table.append(row)
    out += _table(table)
    out += [""]
    for e in rows:
      label = ", ".join(x for x in ((e["hardware"] if len(hardware) > 1 else None),
                                    e.get("config")) if x) or e["hardware"]
      note = f" — {cell(e['note'])}" if e["note"] else ""
      out.append(f"- {cell(label)}: {code(e['command'])}{note}")
  return "\n".join(out) + "\n"


if __name__ == "__main__":
  sys.stdout.write(render())
