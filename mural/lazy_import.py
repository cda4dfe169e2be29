"""`lazy_import.module(name)`: a module that is imported when one of its attributes is first read.

Why not `etils.epy.lazy_imports()`: that context swaps `builtins.__import__` for the whole
process while it is open, so every other thread's import statements get lazy stand-ins meanwhile;
JAX's tracing runs import statements inside its functions, and a step traced in another thread
then fails deep inside JAX. This proxy touches nothing global: it calls `importlib.import_module`
on first use, which is safe from any thread.
"""

import importlib
import types


class LazyModule(types.ModuleType):
  """Stands for module `name` until an attribute is read; from then on forwards to it."""

  def __init__(self, name: str):
    super().__init__(name)
    self.__dict__["_module"] = None

  def _load(self) -> types.ModuleType:
    module = self.__dict__["_module"]
    if module is None:
      module = importlib.import_module(self.__name__)  # Thread-safe: the import system locks.
      self.__dict__["_module"] = module
    return module

  def __getattr__(self, attribute: str):  # Only for attributes not set on the proxy itself.
    return getattr(self._load(), attribute)

  def __dir__(self):
    return dir(self._load())

  def __repr__(self) -> str:
    loaded = "loaded" if self.__dict__["_module"] is not None else "not loaded yet"
    return f"<lazy module {self.__name__!r}, {loaded}>"


def module(name: str) -> LazyModule:
  """`name` (absolute, dotted), imported at the first read of one of its attributes."""
  return LazyModule(name)
