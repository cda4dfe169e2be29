"""mural's imports point down its layers, with no circles (docs/design.md draws the layers).

Every import in mural/ counts, function-local ones included, and so does each
`lazy_import.module("...")`: a module imported later is still a dependency. Read from the source
(no code runs), so a new upward import or circle fails here with the modules that make it.
"""

import ast

from conftest import ROOT

# Bottom first. A module may import its own layer and the layers below; the table names each
# module (a package's name covers its modules unless one is named itself).
LAYERS = (
    ("base: no mural imports, or the config layer's own", (
        "mural", "mural.config_lib", "mural.lazy_import", "mural.disk_space", "mural.state",
        "mural.host_memory", "mural.distributed", "mural.kernels", "mural.systems.defaults")),
    ("core: meshes, optimizers, losses, metrics, tasks as values, checkpoints", (
        "mural.sharding", "mural.optim", "mural.metrics", "mural.losses", "mural.ring_loss",
        "mural.clc", "mural.system", "mural.orbax_quiet", "mural.checkpointing", "mural.saved_variables")),
    ("data: sources, record kinds, pipelines, vocabularies, eval sets", ("mural.data",)),
    ("models: towers and heads", ("mural.models",)),
    ("evaluation and logs", ("mural.evaluate", "mural.metric_log", "mural.translation_retrieval", "mural.public_sets")),
    ("systems: each system's tasks, model and evaluators", ("mural.systems",)),
    ("the trainer: the step, the loop and what it needs", (
        "mural.step", "mural.device_memory", "mural.warm_start", "mural.train")),
    ("tools and entry points", (
        "mural.plan", "mural.describe", "mural.export", "mural.embed", "mural.index", "mural.search",
        "mural.svcca", "mural.learn_words", "mural.pretrained", "mural.import_weights", "mural.evaluate_public",
        "mural.main")),
)


def _modules():
  out = {}
  for path in (ROOT / "mural").rglob("*.py"):
    name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
    out[name.removesuffix(".__init__")] = path
  return out


def _imports(name: str, path, modules) -> set:
  """The mural modules `name` imports anywhere in its file."""
  package = path.name == "__init__.py"
  targets = set()
  for node in ast.walk(ast.parse(path.read_text(), str(path))):
    if isinstance(node, ast.Import):
      targets |= {a.name for a in node.names}
    elif isinstance(node, ast.ImportFrom):
      base = node.module or ""
      if node.level:
        parts = name.split(".")[:len(name.split(".")) - (0 if package else 1)]
        parts = parts[:len(parts) - (node.level - 1)]
        base = ".".join(parts + ([base] if base else []))
      targets |= {f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names}
    elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "module"
          and isinstance(node.func.value, ast.Name) and node.func.value.id == "lazy_import"):
      targets.add(node.args[0].value)
  resolved = set()
  for target in targets:
    while target and target not in modules:
      target = target.rpartition(".")[0]
    if target.startswith("mural") and target != name:
      resolved.add(target)
  return resolved


def _layer(name: str) -> int:
  best = None
  for i, (_, members) in enumerate(LAYERS):
    for m in members:
      if name == m or name.startswith(m + ".") and m != "mural":
        if best is None or len(m) > len(best[1]):
          best = (i, m)
  assert best is not None, f"{name} is in no layer of LAYERS: add it where it belongs"
  return best[0]


def _graph():
  modules = _modules()
  return {name: _imports(name, path, modules) for name, path in modules.items()}


def test_every_import_points_down_or_across():
  upward = [f"{a} ({LAYERS[_layer(a)][0].split(':')[0]}) imports {b} ({LAYERS[_layer(b)][0].split(':')[0]})"
            for a, deps in sorted(_graph().items()) for b in sorted(deps) if _layer(b) > _layer(a)]
  assert upward == []


def test_no_import_circles():
  graph, circles = _graph(), []
  index, low, stack, on_stack, counter = {}, {}, [], set(), [0]

  def visit(v):  # Tarjan's strongly connected components.
    index[v] = low[v] = counter[0]
    counter[0] += 1
    stack.append(v)
    on_stack.add(v)
    for w in graph[v]:
      if w not in index:
        visit(w)
        low[v] = min(low[v], low[w])
      elif w in on_stack:
        low[v] = min(low[v], index[w])
    if low[v] == index[v]:
      component = []
      while True:
        w = stack.pop()
        on_stack.discard(w)
        component.append(w)
        if w == v:
          break
      if len(component) > 1:
        circles.append(sorted(component))

  for v in sorted(graph):
    if v not in index:
      visit(v)
  assert circles == []


def test_the_walk_sees_function_local_and_lazy_imports():
  """What the two tests above stand on: both kinds of hidden import are edges."""
  graph = _graph()
  assert "mural.data.sources" in graph["mural.data.inputs"]  # lazy_import.module("mural.data.sources").
  assert "mural.data.vocab" in graph["mural.export"]  # Inside export(): function-local.


# Modules whose functions may hold import statements, and why (docs/design.md, "Layers"). Entry
# points and tools load only what the chosen mode or command runs; elsewhere an import is at the
# top of its module, or `lazy_import.module(...)` there when it loads TensorFlow for one use.
LOCAL_IMPORTS = {
    "mural.data": "TensorFlow is first imported inside the calls that configure it",
    "mural.distributed": "a private JAX module, read only when a distributed client is shut down",
}


def _has_function_local_import(path) -> bool:
  for node in ast.walk(ast.parse(path.read_text(), str(path))):
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
      if any(isinstance(n, (ast.Import, ast.ImportFrom)) for n in ast.walk(node)):
        return True
  return False


def test_function_local_imports_only_where_the_layout_says():
  tools = len(LAYERS) - 1
  local = sorted(name for name, path in _modules().items()
                 if _layer(name) != tools and name not in LOCAL_IMPORTS
                 and _has_function_local_import(path))
  assert local == [], "import at the top, or through lazy_import.module at the top"
