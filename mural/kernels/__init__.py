"""C++ kernels for XLA's CPU runtime, compiled on first use.

Why: on the CPU, XLA runs EfficientNet's batch norm + swish + depthwise conv as
many elementwise and reduction passes, each writing an activation of the
block's widest shape out to memory, and the train step is bound by those
bytes (benchmarks/README.md). `norm_act_depthwise.cc` does the op image by
image, its activation kept in a per-thread scratch and never written out, and
the next norm + swish + squeeze-excite as two passes over memory forward and
two backward. It is built here, with the machine's C++ compiler against the
FFI headers this jaxlib ships (`jax.ffi.include_dir()`), into a cache keyed
by the source, the flags, the jaxlib and the CPU (it is built for the CPU it
runs on), and registered as XLA FFI targets.

`available()` says whether the kernels loaded; `unavailable_reason()` why not
(no compiler, a failed build). `config.model.image.conv_impl` 'auto' uses them
on the CPU when they load and falls back to the XLA ops ('fast') when not;
'native' asks for them and is a clear error when they cannot load. Set
MURAL_KERNEL_CACHE for the cache's folder (default ~/.cache/mural/kernels) and
CXX for the compiler (default c++).
"""

import contextlib
import ctypes
import functools
import hashlib
import importlib.metadata
import importlib.util
import os
import pathlib
import platform
import shutil
import subprocess
import tempfile
import threading
from typing import Optional

import jax
import jax.numpy as jnp
from absl import logging

try:
  import fcntl  # POSIX only: the cache folder's lock (_locked).
except ImportError:
  fcntl = None

SOURCE = pathlib.Path(__file__).with_name("norm_act_depthwise.cc")
# -fno-trapping-math: GCC vectorises the float -> int conversion of the exp only then.
FLAGS = ("-O3", "-march=native", "-fno-trapping-math", "-fno-math-errno", "-std=c++17",
         "-shared", "-fPIC")
# The backward's tasks: parts of the batch, each summing its kernel gradient over its
# images, added up in order by the kernel (a fixed number, so the sums do not depend on
# the machine's threads).
BATCH_PARTS = 32
TARGETS = {"mural_norm_act_depthwise_fwd": "MuralNormActDepthwiseForward",
           "mural_norm_act_depthwise_bwd": "MuralNormActDepthwiseBackward",
           "mural_expand_norm_act_depthwise_fwd": "MuralExpandNormActDepthwiseForward",
           "mural_expand_norm_act_depthwise_bwd": "MuralExpandNormActDepthwiseBackward",
           "mural_squeeze_fwd": "MuralSqueezeForward",
           "mural_excite_fwd": "MuralExciteForward",
           "mural_excite_sums": "MuralExciteSums",
           "mural_excite_input_grad": "MuralExciteInputGrad"}


def cache_dir() -> pathlib.Path:
  default = pathlib.Path.home() / ".cache" / "mural" / "kernels"
  return pathlib.Path(os.environ.get("MURAL_KERNEL_CACHE", default))


def _cpu_signature() -> str:
  """The CPU's model and flags: -march=native code must not run on another CPU."""
  try:
    with open("/proc/cpuinfo") as f:
      lines = [l for l in f if l.startswith(("model name", "flags"))]
    return "".join(sorted(set(lines)))
  except OSError:
    return platform.processor()


def build(source: pathlib.Path = SOURCE, directory: Optional[pathlib.Path] = None,
          compiler: Optional[str] = None) -> pathlib.Path:
  """Returns the shared library of `source`, compiling it unless the cache has it.

  Raises RuntimeError with the compiler's message when it cannot be built. Processes that
  need it at once (a launcher's processes, pytest's workers) build it once: the first holds
  a lock on the cache folder while it compiles, the others wait and load its library. It is
  written under a temporary name and renamed, so no process ever loads half a file.
  """
  directory = directory or cache_dir()
  compiler = compiler or os.environ.get("CXX", "c++")
  include = jax.ffi.include_dir()
  key = hashlib.sha256("\n".join(
      [source.read_text(), compiler, " ".join(FLAGS), jax.__version__,
       pathlib.Path(include, "xla/ffi/api/c_api.h").read_text(), _cpu_signature()]).encode())
  library = directory / f"{source.stem}-{key.hexdigest()[:16]}.so"
  if library.exists():
    return library
  directory.mkdir(parents=True, exist_ok=True)
  with _locked(directory) as exclusive:
    if library.exists():  # Built by the process that held the lock.
      return library
    if exclusive:  # Only a lock holder writes a partial file: any left are of builders that died.
      for stale in directory.glob("*.so.tmp"):
        stale.unlink(missing_ok=True)
    with tempfile.NamedTemporaryFile(dir=directory, suffix=".so.tmp", delete=False) as tmp:
      partial = pathlib.Path(tmp.name)
    logging.info("Compiling %s into %s (once per machine and source).", source.name, library)
    try:
      # By its full path: subprocess searches PATH with an import statement of its own, and
      # build_in_background's thread runs none (train.compile_train_step_in_background says why).
      command = [shutil.which(compiler) or compiler, *FLAGS, f"-I{include}", str(source), "-o",
                 str(partial)]
      try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=600)
      except (OSError, subprocess.TimeoutExpired) as e:
        raise RuntimeError(f"cannot run the C++ compiler {compiler!r}: {e}") from e
      if done.returncode:
        raise RuntimeError(f"{' '.join(command)} failed:\n{done.stderr[-2000:]}")
      os.replace(partial, library)
    finally:
      partial.unlink(missing_ok=True)
  return library


def cpu_backend_expected() -> bool:
  """Whether JAX will run on this host's CPU, judged without starting a backend (which on a pod
  must wait for jax.distributed.initialize): JAX_PLATFORMS names the CPU first, or it is unset
  and no accelerator is installed (libtpu, a PJRT plugin under `jax_plugins`). It only decides
  whether mural.main starts the kernels' build early; conv_impl 'auto' asks the backend itself."""
  platforms = os.environ.get("JAX_PLATFORMS", "").strip()
  if platforms:
    return platforms.split(",")[0].strip() == "cpu"
  if os.environ.get("TPU_LIBRARY_PATH") or importlib.util.find_spec("libtpu"):
    return False
  return not (importlib.util.find_spec("jax_plugins") or importlib.metadata.entry_points(group="jax_plugins"))


def build_in_background() -> threading.Thread:
  """Starts build() in a daemon thread and returns it, so that the compiler (15-20 s the first
  time on a machine) runs beside the caller's imports and set-up. A later build() or
  available() finds its library, or waits for it on the cache folder's lock; its errors are
  left for them to report. A process that ends first leaves at most a *.so.tmp behind, which
  the next build removes."""

  def quietly():
    try:
      build()
    except Exception:  # pylint: disable=broad-except  (reported by the caller's own build())
      pass

  thread = threading.Thread(target=quietly, name="mural-kernel-build", daemon=True)
  thread.start()
  return thread


@contextlib.contextmanager
def _locked(directory: pathlib.Path):
  """An exclusive lock on `directory` (flock: released when the process ends, however); yields
  whether it holds one. Where there are no locks (a network file system without them; no
  fcntl, as on Windows), each process builds its own copy."""
  if fcntl is None:
    yield False
    return
  fd = os.open(directory, os.O_RDONLY)
  try:
    try:
      fcntl.flock(fd, fcntl.LOCK_EX)
    except OSError as e:
      logging.info("No lock on %s (%s): building without it.", directory, e)
      yield False
    else:
      yield True
  finally:
    os.close(fd)


@functools.cache
def _load() -> Optional[str]:
  """Builds, loads and registers the kernels once per process: None, or why not."""
  try:
    library = ctypes.cdll.LoadLibrary(str(build()))
    for target, symbol in TARGETS.items():
      jax.ffi.register_ffi_target(target, jax.ffi.pycapsule(getattr(library, symbol)),
                                  platform="cpu")
  except (RuntimeError, OSError, AttributeError) as e:
    logging.warning("mural's C++ kernels are not available (%s); the XLA ops run instead.", e)
    return str(e)
  return None


def available() -> bool:
  return _load() is None


def unavailable_reason() -> Optional[str]:
  return _load()


def _check():
  if not available():
    raise RuntimeError(f"mural's C++ kernels are not available: {unavailable_reason()}")


def norm_act_depthwise_forward(x, mean, inv, scale, bias, kernel, stride: int, w=None):
  """(y, moments): y = depthwise_conv(swish((x - mean) * (inv * scale) + bias), kernel,
  stride), SAME, and moments [2, C] its sums over the batch of y and of y * y (for the
  norm after it: XLA's own two passes over y cost as much as the op).

  x [B, H, W, C] float32; mean, inv, scale, bias [C]; kernel [K, K, C]. With w [K, C],
  x is [B, H, W, K] and the norm's input is x @ w (the block's expand conv), which the
  kernel computes image by image and never writes out.
  """
  _check()
  b, h, width = x.shape[:3]
  c = kernel.shape[-1]
  out = (jax.ShapeDtypeStruct((b, -(-h // stride), -(-width // stride), c), jnp.float32),
         jax.ShapeDtypeStruct((2, c), jnp.float32))
  if w is None:
    call = jax.ffi.ffi_call("mural_norm_act_depthwise_fwd", out, vmap_method="sequential")
    return call(x, mean, inv, scale, bias, kernel, stride=stride)
  call = jax.ffi.ffi_call("mural_expand_norm_act_depthwise_fwd", out, vmap_method="sequential")
  return call(x, w, mean, inv, scale, bias, kernel, stride=stride)


def norm_act_depthwise_backward(x, mean, inv, scale, bias, kernel, grad, stride: int):
  """The forward's backward up to the norm: (dz, dkernel, sum(dz), sum(dz * xhat)).

  dz [B, H, W, C] is the gradient at z = (x - mean) * (inv * scale) + bias, the
  norm's output before swish; xhat = (x - mean) * inv. The kernel returns the kernel
  gradient and the sums over BATCH_PARTS parts of the batch (one task each), added up
  in order.
  """
  _check()
  b, _, _, c = x.shape
  k = kernel.shape[0]
  shapes = (jax.ShapeDtypeStruct(x.shape, jnp.float32),
            jax.ShapeDtypeStruct((k * k, c), jnp.float32),
            jax.ShapeDtypeStruct((2, c), jnp.float32))
  call = jax.ffi.ffi_call("mural_norm_act_depthwise_bwd", shapes, vmap_method="sequential")
  dz, dkernel, sums = call(x, mean, inv, scale, bias, kernel, grad, stride=stride,
                           parts=min(b, BATCH_PARTS))
  return dz, dkernel.reshape(kernel.shape), sums[0], sums[1]


def expand_norm_act_depthwise_backward(x, w, mean, inv, scale, bias, kernel, grad, stride: int):
  """norm_act_depthwise_backward with the norm's input x @ w (x [B, H, W, K], w [K, C]),
  and dz taken on into the expand conv's gradients inside the kernel, never written out:
  (dz @ (w * a)' [B, H, W, K], x' dz [K, C], dkernel, sum(dz), sum(dz * xhat)), with
  a = inv * scale. The rest of the expand conv's gradients needs the two sums over the
  whole batch, so the caller adds it."""
  _check()
  b, k_in = x.shape[0], x.shape[-1]
  k, c = kernel.shape[0], kernel.shape[-1]
  shapes = (jax.ShapeDtypeStruct(x.shape, jnp.float32),
            jax.ShapeDtypeStruct((k_in, c), jnp.float32),
            jax.ShapeDtypeStruct((k * k, c), jnp.float32),
            jax.ShapeDtypeStruct((2, c), jnp.float32))
  call = jax.ffi.ffi_call("mural_expand_norm_act_depthwise_bwd", shapes, vmap_method="sequential")
  dx_a, xdz, dkernel, sums = call(x, w, mean, inv, scale, bias, kernel, grad, stride=stride,
                                  parts=min(b, BATCH_PARTS))
  return dx_a, xdz, dkernel.reshape(kernel.shape), sums[0], sums[1]


def _call(target, shape, *args):
  return jax.ffi.ffi_call(target, jax.ShapeDtypeStruct(shape, jnp.float32),
                          vmap_method="sequential")(*args)


def squeeze_forward(y, mean, inv, scale, bias):
  """pooled [B, C]: the mean over each image's pixels of swish((y - mean) * (inv * scale)
  + bias), y [B, H, W, C] float32."""
  _check()
  return _call("mural_squeeze_fwd", (y.shape[0], y.shape[-1]), y, mean, inv, scale, bias)


def excite_forward(y, mean, inv, scale, bias, gate):
  """swish((y - mean) * (inv * scale) + bias) * gate[:, None, None, :], gate [B, C]."""
  _check()
  return _call("mural_excite_fwd", y.shape, y, mean, inv, scale, bias, gate)


def excite_sums(y, mean, inv, scale, bias, grad):
  """Given grad at excite_forward's output: [B, 5, C], sums over each image's pixels of
  grad * act, swish'(z) * grad, swish'(z) * grad * xhat, swish'(z) and swish'(z) * xhat
  (act = swish(z), z the norm's output, xhat = (y - mean) * inv)."""
  _check()
  return _call("mural_excite_sums", (y.shape[0], 5, y.shape[-1]), y, mean, inv, scale, bias,
               grad)


def excite_input_grad(y, mean, inv, scale, bias, grad, gate, dpool, k1, k2):
  """(inv * scale) * (dz - k1 - xhat * k2), dz = swish'(z) * (grad * gate + dpool), with
  gate and dpool [B, C] broadcast over the pixels and k1, k2 [C]: the batch norm's input
  gradient when k1 and k2 are its two sums over the element count."""
  _check()
  return _call("mural_excite_input_grad", y.shape, y, mean, inv, scale, bias, grad, gate,
               dpool, k1, k2)
