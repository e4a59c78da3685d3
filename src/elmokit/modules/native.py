"""Optional C++ kernels for small-batch inference: compiled on first use, with the TorchScript/ATen paths as fallback.

At batch 1 (one sentence) the biLM's time is weight traffic and per-op overhead. ``native_kernels.cpp`` (beside this
file) holds two kernels, used without autograd on float32 CPU tensors only:

* :func:`lstm_layer`: one LSTM layer, both directions, for batches of at most :data:`MAX_LSTM_ROWS` rows: the step
  loop of :func:`elmokit.modules.lstm_steps._steps_by_direction` in C++, with W_hh packed by :func:`pack_lstm` (H and P
  multiples of 16; other sizes keep the TorchScript loop). The whole loop of a direction is one OpenMP team of
  torch's threads: each thread owns a range of 16-unit blocks (its share of W_hh and W_proj, 1.25 MB per core for
  the small configuration, stays in its L2 across the steps), computes their recurrent product, gates and cell state
  in registers and a partial projection, and one barrier per step joins the partials into the next h;
* :func:`highway_layer`: one highway layer for at most :data:`MAX_HIGHWAY_ROWS` distinct tokens, reading the weight
  once in blocks packed by :func:`pack_highway` (MKL's GEMM at 10 rows runs at about half its matrix-vector rate).

Compiled into the same extension, ``native_train.cpp`` holds the fused training layer's forward and backward
(registered as ``torch.ops.elmokit_train``, see :func:`train_ops` and :mod:`elmokit.modules.lstm_train`), and
``native_softmax.cpp`` the sampled softmax's one-pass rows (``torch.ops.elmokit_softmax``, see :func:`softmax_ops` and
:mod:`elmokit.modules.softmax`).

The same extension holds the batch-invariant kernels that :mod:`elmokit.modules.invariant` wraps (any row count, each
row in one fixed summation order). Both give the other paths' values up to float rounding (sums in another order,
exp/tanh from glibc's vector math library): ``tests/test_native.py`` checks them within 2e-6 on the small
configuration's shapes. The file is built with ``-ffast-math`` (so that exp and tanh vectorise), which assumes finite
values: the arguments of σ and tanh are clamped where float32 results saturate, and inputs holding inf or NaN are
refused (the callers run the ATen path).

The extension is built by ``torch.utils.cpp_extension.load`` (it needs a C++ compiler and ``ninja``, which the
``ninja`` package installed with elmokit provides; ≈ 20 s on 2 cores when the machine is quiet, once per environment,
kept in torch's extension directory, ``TORCH_EXTENSIONS_DIR``). **One build per environment**: the build's name
(:func:`build_name`) carries a digest of everything that changes the build or what it links against — the source, the
flags (``-march=native``), this CPU's model and flags, the torch version and commit, the Python version, the
environment (``sys.prefix``), torch's and Python's include folders and the compiler (``CXX``) — so two virtual
environments on one machine each keep their own build (before, they shared one folder whose ``build.ninja`` named the
other's include paths, and each rebuilt it in turn), and a home directory shared by different machines never loads
another CPU's build. Builds are serialised by a file lock (``<name>.lock`` beside the build folder; two processes
starting at once build once, the second waits and loads), and a build counts only once it finished: the library is
loaded only when the folder's ``elmokit-build.json`` names it with its size and sha256, written after a successful
build, so a build killed half-way is built again rather than loaded. :func:`status` says where the kernels came
from (``elmokit info`` prints it). Where the build or the load fails (no compiler, no ninja, another platform) one
warning is logged and the fallback paths run (same values, slower at batch 1). ``ELMOKIT_NATIVE=0`` turns the kernels
off.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import json
import logging
import os
import platform
import shutil
import sys
import sysconfig
import threading
import time
from pathlib import Path

import torch

__all__ = [
    "kernels",
    "status",
    "build_name",
    "lstm_layer",
    "highway_layer",
    "pack_lstm",
    "pack_highway",
    "MAX_HIGHWAY_ROWS",
    "MAX_LSTM_ROWS",
    "MAX_DIRECTION_ROWS",
    "lstm_rows_limit",
    "train_ops",
]

log = logging.getLogger(__name__)

#: the highway kernel keeps one register pair per row: 12 rows fill AVX-512's 32 vector registers with room to load
MAX_HIGHWAY_ROWS = 12
#: batches up to this many rows take the C++ step loop where it was built for AVX-512: with four rows sharing each
#: weight load it beats the batched GEMM loop up to 32 rows (1.03–1.4× at 16–32 rows, small and original shapes, one
#: and two threads) and is level with it at 64 (0.95–1.07×; ``bench/lstm_rows.py``)
MAX_LSTM_ROWS = 32
#: without the kernel, or with one built without AVX-512 (one row a weight load, four rows' accumulators would not
#: fit its registers), batches up to this many rows run direction after direction (TorchScript or the kernel), as
#: measured before the row groups: the batched loop above it
MAX_DIRECTION_ROWS = 8


def lstm_rows_limit(module) -> int:
    """The most rows a batch may have to run direction after direction: :data:`MAX_LSTM_ROWS` with the kernels
    ``module`` built for AVX-512 (its ``max_rows``), :data:`MAX_DIRECTION_ROWS` otherwise (``None``: no kernels)."""
    if module is None:
        return MAX_DIRECTION_ROWS
    return min(MAX_LSTM_ROWS, int(getattr(module, "max_rows", MAX_DIRECTION_ROWS)))


SOURCE = Path(__file__).with_name("native_kernels.cpp")
#: the fused training layer's kernels (:mod:`elmokit.modules.lstm_train`), compiled into the same extension
TRAIN_SOURCE = Path(__file__).with_name("native_train.cpp")
#: the sampled softmax's fused rows (:class:`elmokit.modules.softmax.SoftmaxLM`'s training loss), same extension
SOFTMAX_SOURCE = Path(__file__).with_name("native_softmax.cpp")
#: the bfloat16 loads and stores both of those include (part of the build's digest)
BF16_HEADER = Path(__file__).with_name("native_bf16.h")
FLAGS = ["-O3", "-march=native", "-ffast-math", "-fopenmp"] + (
    ["-mprefer-vector-width=512"] if platform.machine() in ("x86_64", "AMD64") else []
)

_module = None  # None = not tried yet; False = unavailable here
_lock = threading.Lock()
#: where the kernels came from, for :func:`status`
_status: dict = {"state": "not loaded yet"}
#: written into the build folder after a successful build; the library is loaded only when it matches
MARKER_NAME = "elmokit-build.json"


def _cpu_identity() -> str:
    """This CPU's model name and feature flags (Linux ``/proc/cpuinfo``), else the platform's processor string."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
        keep = [line for line in lines if line.startswith(("model name", "flags"))][:2]
        return "\n".join(keep)
    except OSError:
        return platform.processor() or platform.machine()


def _environment_identity() -> list[str]:
    """What, besides source, flags and CPU, changes the build or what it links against: torch's version and commit,
    Python's version, the environment's prefix, torch's and Python's include folders, the compiler."""
    try:
        from torch.utils import cpp_extension  # lazy: it imports setuptools

        includes = cpp_extension.include_paths()
    except Exception:  # a torch without the helper: the version and prefix still separate environments
        includes = []
    return [
        torch.__version__,
        str(getattr(torch.version, "git_version", "")),
        sys.version,
        os.path.realpath(sys.prefix),
        *map(str, includes),
        str(sysconfig.get_paths().get("include", "")),
        os.environ.get("CXX", "c++"),
    ]


def build_name() -> str:
    """The extension's name: ``elmokit_native_`` + a digest of source, flags, CPU and environment (see the module
    docstring: one build per environment)."""
    digest = hashlib.sha256()
    parts = [SOURCE.read_bytes(), TRAIN_SOURCE.read_bytes(), SOFTMAX_SOURCE.read_bytes(), BF16_HEADER.read_bytes()]
    parts += [" ".join(FLAGS).encode(), _cpu_identity().encode()]
    parts += [p.encode() for p in _environment_identity()]
    for part in parts:
        digest.update(part)
        digest.update(b"\0")
    return "elmokit_native_" + digest.hexdigest()[:16]


def status() -> dict:
    """Where the kernels came from in this process: ``{"state": …}`` with state ``"off"`` (``ELMOKIT_NATIVE=0``),
    ``"not loaded yet"``, ``"unavailable"`` (with ``"reason"``), ``"loaded"`` (an earlier build) or ``"built now"``
    (with ``"build_seconds"``); loaded or built: ``"path"`` of the library."""
    return dict(_status)


def kernels():
    """The compiled extension module, building it on first use; ``None`` where it is off (``ELMOKIT_NATIVE=0``) or
    cannot be built or loaded here (one logged warning)."""
    global _module
    if _module is None:
        with _lock:
            if _module is None:
                _module = _load() or False
    return _module or None


def _file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _finished_library(folder: Path, name: str) -> Path | None:
    """The library of a build that finished (its marker names it, with the library's size and sha256), else
    ``None``."""
    try:
        marker = json.loads((folder / MARKER_NAME).read_text())
        library = folder / marker["library"]
        if marker.get("name") != name or library.stat().st_size != marker["size"]:
            return None
        return library if _file_sha256(library) == marker["sha256"] else None
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _mark_finished(folder: Path, name: str, library: Path) -> None:
    """Write the marker (atomically: a temporary file renamed over it)."""
    data = {"name": name, "library": library.name, "size": library.stat().st_size, "sha256": _file_sha256(library)}
    tmp = folder / f".{MARKER_NAME}.{os.getpid()}.tmp"
    tmp.write_text(json.dumps(data))
    os.replace(tmp, folder / MARKER_NAME)


def _import_library(name: str, library: Path):
    """Import a finished build's shared library as the module ``name``."""
    spec = importlib.util.spec_from_file_location(name, library)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import {library}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@contextlib.contextmanager
def _build_lock(path: Path):
    """An exclusive lock on ``path`` across processes (``fcntl.flock``; released when the process ends, even killed);
    a no-op where ``fcntl`` is missing (Windows)."""
    try:
        import fcntl  # optional: POSIX only
    except ImportError:
        yield
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _load():
    global _status
    if os.environ.get("ELMOKIT_NATIVE", "1") == "0":
        _status = {"state": "off"}
        return None
    try:
        from torch.utils import cpp_extension  # lazy: only when the kernels are built (it imports setuptools)

        if shutil.which("ninja") is None:  # the pip package's binary, when its environment is not on PATH
            try:
                import ninja  # optional: ninja

                os.environ["PATH"] = ninja.BIN_DIR + os.pathsep + os.environ.get("PATH", "")
            except ImportError:
                pass
        name = build_name()
        folder = Path(cpp_extension._get_build_directory(name, verbose=False))  # torch's (private) folder rule
        with _build_lock(folder.parent / f"{name}.lock"):
            library = _finished_library(folder, name)
            if library is not None:  # an earlier build of this very environment: no compiler, no ninja run
                module = _import_library(name, library)
                _status = {"state": "loaded", "path": str(library)}
                return module
            log.warning(
                "elmokit: compiling the native batch-1 kernels for this environment (once, about 20 s; "
                "ELMOKIT_NATIVE=0 skips them)"
            )
            for stale in folder.glob(f"{name}*.so"):  # an unfinished build's library is never loaded
                stale.unlink()
            start = time.perf_counter()
            module = cpp_extension.load(
                name=name,
                sources=[str(SOURCE), str(TRAIN_SOURCE), str(SOFTMAX_SOURCE)],
                extra_cflags=FLAGS,
                extra_ldflags=["-fopenmp"],
                verbose=False,
            )
            library = Path(module.__file__)
            _mark_finished(folder, name, library)
            _status = {"state": "built now", "path": str(library), "build_seconds": time.perf_counter() - start}
            return module
    except Exception as exc:  # no compiler, no ninja, no headers, another OS …
        reason = f"{type(exc).__name__}: {(str(exc).strip().splitlines() or [''])[-1]}"
        _status = {"state": "unavailable", "reason": reason}
        log.warning(
            "elmokit: native kernels unavailable (%s); the TorchScript/ATen paths run instead (same values, slower at "
            "batch 1)",
            reason,
        )
        return None


def train_ops():
    """The fused training layer's operators (``torch.ops.elmokit_train``: ``lstm_train_forward``,
    ``lstm_train_backward``, from ``native_train.cpp``), or ``None`` where the kernels are off or unavailable."""
    if kernels() is None:
        return None
    ops = torch.ops.elmokit_train
    return ops if hasattr(ops, "lstm_train_forward") else None


def softmax_ops():
    """The sampled softmax's fused rows (``torch.ops.elmokit_softmax.softmax_rows_``, from ``native_softmax.cpp``),
    or ``None`` where the kernels are off or unavailable."""
    if kernels() is None:
        return None
    ops = torch.ops.elmokit_softmax
    return ops if hasattr(ops, "softmax_rows_") else None


def usable(*tensors: torch.Tensor) -> bool:
    """Whether the kernels may run on these tensors: float32, CPU, no autograd wanted, plain tensors or parameters
    (no other tensor subclass: the kernels read raw memory)."""
    if torch.is_grad_enabled() and any(t.requires_grad for t in tensors):
        return False
    return all(
        type(t) in (torch.Tensor, torch.nn.Parameter) and t.dtype == torch.float32 and t.device.type == "cpu"
        for t in tensors
    )


def lstm_layer(
    module,
    x: torch.Tensor,
    sizes: list[int],
    c: torch.Tensor,
    h: torch.Tensor,
    w_ih: torch.Tensor,
    bias: torch.Tensor,
    w_hh: torch.Tensor,
    w_proj: torch.Tensor,
    cell_clip: float,
    proj_clip: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
    """One LSTM layer by the extension ``module`` (from :func:`kernels`); arguments and result as
    :func:`elmokit.modules.lstm_steps._steps_by_direction` (``sizes``: the running rows per step, zeros dropped) but for
    ``w_hh``, packed by :func:`pack_lstm`; all float32 CPU tensors; ``None`` when ``x``, ``c`` or ``h`` hold inf or
    NaN (the kernel is built with ``-ffast-math``, which assumes finite values: the caller then runs its ATen path,
    which propagates them)."""
    result = module.lstm_layer(
        x.contiguous(),
        sizes,
        c.contiguous(),
        h.contiguous(),
        w_ih,
        bias,
        w_hh,
        w_proj.contiguous(),
        float(cell_clip),
        float(proj_clip),
    )
    return tuple(result) if result else None


def pack_lstm(w_hh: torch.Tensor) -> torch.Tensor:
    """A layer's (2, P, 4H) W_hh, gate columns i, f, o, j (:meth:`BiLSTM._inference_weights`) → the fused loop's
    layout (2, H/16, P, 64): block b and input k hold the i, f, o, j columns of units 16b … 16b + 15 (16 each), so a
    thread owning a range of units reads one contiguous stretch. Raises ``ValueError`` when H or P is not a multiple
    of 16 (such layers run the TorchScript loop)."""
    d, p, g = w_hh.shape
    hd = g // 4
    if d != 2 or g != 4 * hd or hd % 16 or p % 16:
        raise ValueError(f"pack_lstm needs a (2, P, 4H) W_hh with H and P multiples of 16, got {tuple(w_hh.shape)}")
    return w_hh.reshape(2, p, 4, hd // 16, 16).permute(0, 3, 1, 2, 4).reshape(2, hd // 16, p, 64).contiguous()


def pack_highway(weight: torch.Tensor, bias: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The highway layer's fused (F, 2F) weight [W_hᵀ | W_gᵀ] and (2F,) bias [b_h | b_g] → the kernel's layout:
    (F/16, F, 32), block b holding, for every input k, the transform columns of units 16b … 16b + 15 then their gate
    columns; and the (F/16, 32) bias in the same order. Raises ``ValueError`` when F is not a multiple of 16."""
    f = weight.shape[0]
    if f % 16 or tuple(weight.shape) != (f, 2 * f) or tuple(bias.shape) != (2 * f,):
        raise ValueError(
            f"pack_highway needs an (F, 2F) weight and (2F,) bias with F a multiple of 16, got "
            f"{tuple(weight.shape)} and {tuple(bias.shape)}"
        )
    blocks = torch.cat([weight[:, :f].reshape(f, f // 16, 16), weight[:, f:].reshape(f, f // 16, 16)], dim=2)
    packed_bias = torch.cat([bias[:f].reshape(f // 16, 16), bias[f:].reshape(f // 16, 16)], dim=1)
    return blocks.permute(1, 0, 2).contiguous(), packed_bias.contiguous()


def highway_layer(module, x: torch.Tensor, packed: torch.Tensor, packed_bias: torch.Tensor) -> torch.Tensor | None:
    """One highway layer by the extension ``module``: x (M, F) float32, 1 ≤ M ≤ :data:`MAX_HIGHWAY_ROWS`, the weights
    from :func:`pack_highway` → (M, F), t·relu(x·W_h + b_h) + (1 − t)·x with t = σ(x·W_g + b_g); ``None`` when ``x``
    holds inf or NaN (as :func:`lstm_layer`)."""
    return module.highway_layer(x.contiguous(), packed, packed_bias)
