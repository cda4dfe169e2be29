"""mural.lazy_import: modules imported on first use without swapping builtins.__import__."""

import ast
import builtins
import sys
import threading

from conftest import ROOT
from mural import lazy_import


def _counting_module(tmp_path, monkeypatch, name: str):
  """A module `name` on sys.path that appends to a list each time it is executed."""
  (tmp_path / f"{name}.py").write_text("import builtins\nbuiltins._mural_loads.append(1)\nVALUE = 7\n")
  monkeypatch.syspath_prepend(str(tmp_path))
  monkeypatch.setattr(builtins, "_mural_loads", [], raising=False)
  monkeypatch.delitem(sys.modules, name, raising=False)
  return builtins._mural_loads  # pylint: disable=no-member


def test_imported_at_first_attribute_read_once(tmp_path, monkeypatch):
  loads = _counting_module(tmp_path, monkeypatch, "mural_lazy_probe")
  module = lazy_import.module("mural_lazy_probe")
  assert loads == [] and "mural_lazy_probe" not in sys.modules
  assert "not loaded yet" in repr(module)
  assert module.VALUE == 7 and module.VALUE == 7
  assert loads == [1] and "VALUE" in dir(module) and "loaded" in repr(module)


def test_first_reads_from_many_threads_import_once(tmp_path, monkeypatch):
  loads = _counting_module(tmp_path, monkeypatch, "mural_lazy_threads")
  module = lazy_import.module("mural_lazy_threads")
  values, start = [], threading.Barrier(8)

  def read():
    start.wait()
    values.append(module.VALUE)

  threads = [threading.Thread(target=read) for _ in range(8)]
  for t in threads:
    t.start()
  for t in threads:
    t.join()
  assert values == [7] * 8 and loads == [1]


def test_builtins_import_is_never_swapped_by_mural():
  """etils.epy.lazy_imports swaps builtins.__import__ for every thread while it is open, which
  breaks a step traced in another thread (train.compile_train_step_in_background): no module of
  mural's opens it; mural.lazy_import serves instead."""
  opened = []
  for path in sorted((ROOT / "mural").rglob("*.py")):
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
      if isinstance(node, ast.Attribute) and node.attr == "lazy_imports":
        opened.append(f"{path.relative_to(ROOT)}:{node.lineno}")
      if isinstance(node, ast.ImportFrom) and any(a.name == "lazy_imports" for a in node.names):
        opened.append(f"{path.relative_to(ROOT)}:{node.lineno}")
  assert opened == []
