"""4-bit weight x 16-bit (or 8-bit) activation products on the CPU: the packed target's kernel
(and its 8-bit weight product for a Q8_0 weight: the embedded model's LM head, :func:`pack8`).

The product (qmm.c's header has it in full): a weight kept in blocks of 32 input columns,
w = dw q + mw with q in 0..15 and fp16 dw, mw (GGUF's Q4_1), against activations quantised
per row and block to 16 bits (dx = max|x| / 32767, qx = round(x / dx) in -32767..32767):
y = sum_b dot_b dw dx + mw sx, with dot_b the block's exact integer dot product and
sx = dx sum(qx). The integer work runs as 8-bit dot products on AVX512-VNNI (a 16-bit
activation as 256 hi + lo: two vpdpbusd products) or 16-bit multiply-add pairs on AVX2, one
block's weights unpacked once for up to 8 rows: so a forward of a few rows costs little more
than one (measured in docs/benchmarks.md), where torch's own int4 kernel (fp32 multiply-adds on
bf16 activations) costs in proportion to the rows past one.

The activations' width is the caller's (``bits``): 16 for `embedded-q4`, whose rounding step (a
32767th of a block's largest) keeps its layers within 4e-5 of the fp32 ones; 8 for
`embedded-q4:a8` (dx = max|x| / 127: llama.cpp's Q8_1 against Q4_1, the numerics it runs this
file with; ``qmm_q4_a8``, 8-bit integer products: AVX512-VNNI's ``vpdpbusd``, AVX2's
``maddubs_epi16``, about half the cost of a row past the first). Every SIMD path asks the
weight stream into the cache some blocks ahead of the one it computes (``prefetch_block``).
Either width gives a row the same bits whatever else the product holds, and with
engine/kernels/rowattn.py's attention a packed target's forwards do too, so a speculative run
keeps its own greedy's tokens at both (with torch's attention, whose sums depend on the
forward's shape, 8-bit rounding turns those float-order differences into token changes at near
ties).

qmm.c is built once per machine by the C compiler (``$CC``, else ``cc`` / ``gcc``) with
``-march=native`` into the cache (:func:`engine.core.paths.cache_root`/kernels), keyed by the
source, the flags and the CPU's flags, and loaded with ctypes. Every path the build can take
(AVX512-VNNI, AVX2, plain C) gives the same bits, a row's output does not depend on the other
rows, and :func:`reference` is the same computation in torch: the tests' oracle and the
fallback (slow: it unpacks the weight on every call) where no compiler is found.

Under ``torch.compile`` the product is the op ``specviz::qmm`` (opaque to inductor); eager
calls go to the library directly. The op's first call builds (once per machine and torch,
16-25 s) and loads the compiled step's C++ kernels, ops.cpp linked with qmm.c and rowattn.c
(:func:`native_op`): later calls of both ops on CPU tensors reach qmm.c's product and
rowattn.c's attention from torch's dispatcher without Python (the same bits).
A fixed-shape step (the compiled path) declares its padded tokens with :func:`padded_rows`,
and the library skips those rows.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path

import torch

from engine.core.errors import ConfigError
from engine.core.paths import cache_root

GROUP = 32  # input columns a block
TILE = 16  # output columns a tile of the packed layout
LEVELS = 32767  # an activation's largest quantised size: 16 bits
LEVELS8 = 127  # the same with 8-bit activations (llama.cpp's Q8_1)
BITS = (16, 8)  # the activation widths the kernel takes (16: the packed target's)
SOURCE = Path(__file__).with_name("qmm.c")
OP_SOURCE = Path(__file__).with_name("ops.cpp")  # the ops' CPU kernels in C++ (native_op)
ROWATTN_SOURCE = Path(__file__).with_name("rowattn.c")  # linked into them (rowattn.py)
FLAGS = ("-O3", "-ffp-contract=off", "-fPIC", "-shared")  # and -march
OPENMP = "-fopenmp"
PATHS = {512: "avx512-vnni", 256: "avx2", 0: "c"}
ENV = "SPECVIZ_QMM"  # native (the default) or torch (the reference: slow, for checking)

log = logging.getLogger(__name__)


def pack(q: torch.Tensor, dw: torch.Tensor, mw: torch.Tensor
         ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The kernel's layout (qmm.c header) of a weight w = dw q + mw:
    q (N, K) uint8 in 0..15, dw and mw (N, K / GROUP) fp16 ->
    qw (N / TILE * K / GROUP * 256,) uint8, dw and mw (N / TILE, K / GROUP, TILE) int16 bits."""
    n, k = q.shape
    nb = k // GROUP
    w = q.view(n // TILE, TILE, nb, 2, 4, 4)  # (t, c, b, half, j, e)
    w = w.permute(0, 2, 4, 1, 5, 3)  # (t, b, j, c, e, half)
    qw = (w[..., 0] | (w[..., 1] << 4)).contiguous().view(-1)  # (t * b * 256,)

    def tiles(a: torch.Tensor) -> torch.Tensor:
        a = a.to(torch.float16).view(n // TILE, TILE, nb).permute(0, 2, 1)  # (t, b, c)
        return a.contiguous().view(torch.int16)

    return qw, tiles(dw), tiles(mw)


def unpack(qw: torch.Tensor, dw: torch.Tensor, mw: torch.Tensor, n: int, k: int
           ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The inverse of :func:`pack`: q (N, K) uint8, dw and mw (N, K / GROUP) fp16."""
    nb = k // GROUP
    w = qw.view(n // TILE, nb, 4, TILE, 4)  # (t, b, j, c, e)
    halves = torch.stack([w & 15, w >> 4], dim=-1)  # (t, b, j, c, e, half)
    q = halves.permute(0, 3, 1, 5, 2, 4).reshape(n, k)  # (t, c, b, half, j, e) -> (N, K)

    def untile(a: torch.Tensor) -> torch.Tensor:
        return a.view(torch.float16).permute(0, 2, 1).reshape(n, nb)  # (N, K / G)

    return q.contiguous(), untile(dw), untile(mw)


def pack8(q: torch.Tensor, dw: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The kernel's layout of a Q8_0 weight w = dw q (qmm.c header): q (N, K) int8, dw
    (N, K / GROUP) fp16 -> qw (N / TILE * K / GROUP * 512,) uint8 (q's bytes) and dw
    (N / TILE, K / GROUP, TILE) int16 bits."""
    n, k = q.shape
    nb = k // GROUP
    w = q.view(n // TILE, TILE, nb, 8, 4)  # (t, c, b, g, e)
    qw = w.permute(0, 2, 3, 1, 4).contiguous().view(torch.uint8).view(-1)  # (t * b * 512,)
    d = dw.to(torch.float16).view(n // TILE, TILE, nb).permute(0, 2, 1)  # (t, b, c)
    return qw, d.contiguous().view(torch.int16)


def unpack8(qw: torch.Tensor, dw: torch.Tensor, n: int, k: int
            ) -> tuple[torch.Tensor, torch.Tensor]:
    """The inverse of :func:`pack8`: q (N, K) int8, dw (N, K / GROUP) fp16."""
    nb = k // GROUP
    w = qw.view(torch.int8).view(n // TILE, nb, 8, TILE, 4)  # (t, b, g, c, e)
    q = w.permute(0, 3, 1, 2, 4).reshape(n, k)  # (t, c, b, g, e) -> (N, K)
    return q.contiguous(), dw.view(torch.float16).permute(0, 2, 1).reshape(n, nb)


def quantize(x: torch.Tensor, bits: int = 16
             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """x (R, K) fp32 -> qx (R, K / G, G) fp32 integers in -L..L (L = LEVELS for 16 bits,
    LEVELS8 for 8), dx and sx (R, K / G): the activation quantisation of qmm.c, in torch
    (inputs in their own order)."""
    r, k = x.shape
    xb = x.view(r, k // GROUP, GROUP)  # (R, nb, G)
    dx = xb.abs().amax(-1) / float(LEVELS if bits == 16 else LEVELS8)  # (R, nb)
    inv = torch.where(dx != 0, 1.0 / dx, torch.zeros_like(dx))  # (R, nb)
    qx = torch.round(xb * inv[..., None])  # (R, nb, G), half to even as nearbyintf
    return qx, dx, dx * qx.sum(-1)


def reference(x: torch.Tensor, qw: torch.Tensor, dw: torch.Tensor, mw: torch.Tensor | None,
              n: int, bits: int = 16) -> torch.Tensor:
    """The product of qmm.c computed in torch: x (R, K) fp32 -> (R, N) fp32, the activations
    quantised to `bits`, the weight Q4_1 (qw, dw, mw) or, with mw None, Q8_0 (:func:`pack8`).
    Its integers are qmm.c's (a Q8_0 block's converted to fp32 as the C cast does); its float
    steps are qmm.c's fused multiply-adds, each formed in fp64 and rounded to fp32 (equal bits
    but for a rare double rounding)."""
    r, k = x.shape
    nb = k // GROUP
    qx, dx, sx = quantize(x, bits)
    if mw is None:  # Q8_0: dot_b * (dw dx), one step a block; |dot_b| < 2^31, exact in fp64
        q, d = unpack8(qw, dw, n, k)
        dot = torch.einsum("rbg,nbg->rnb", qx.double(),
                           q.view(n, nb, GROUP).double()).float()  # (R, N, nb) rounded
        scale = d.float()[None] * dx[:, None, :]  # (R, N, nb)
        y = torch.zeros(r, n)  # (R, N)
        for b in range(nb):
            y = (y.double() + dot[..., b].double() * scale[..., b].double()).float()
        return y
    q, d, m = unpack(qw, dw, mw, n, k)
    qb = q.view(n, nb, GROUP).float()  # (N, nb, G)
    dot = torch.einsum("rbg,nbg->rnb", qx, qb)  # (R, N, nb): exact integers below 2^24
    scale = d.float()[None] * dx[:, None, :]  # (R, N, nb)
    m64, sx64 = m.double(), sx.double()
    y = torch.zeros(r, n)  # (R, N)
    for b in range(nb):  # each step in fp64, rounded to fp32: a fused multiply-add
        y = (y.double() + dot[..., b].double() * scale[..., b].double()).float()
        y = (y.double() + m64[None, :, b] * sx64[:, None, b]).float()
    return y


def _cpu_flags() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return line
    except OSError:
        pass
    return os.uname().machine


def _cc() -> str | None:
    return os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")


def compile_native(source: Path, out: Path, march: str = "native",
                   defines: tuple[str, ...] = ()) -> ctypes.CDLL | None:
    """The C file `source` built into the shared library `out` for `march` (with -D
    `defines`) and loaded; None (and a log line) where it does not build. Atomic: several
    processes may build at once. (qmm.c's builder, also rowattn.c's, vocab.c's and ngram.c's.)"""
    cc = _cc()
    if cc is None:
        log.warning("no C compiler: %s is not built (qmm runs its torch reference, slow; the "
                    "attention stays torch's)", source.name)
        return None
    if not out.exists():
        out.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(suffix=".so", dir=out.parent)
        os.close(fd)
        try:
            flags = [f"-march={march}", *FLAGS, *(f"-D{d}" for d in defines)]
            why = build_first([[[cc, *flags, *extra, "-o", tmp, str(source), "-lm"]]
                               for extra in ((OPENMP,), ())], timeout=300)
            if why:
                log.warning("%s did not build with %s: %s", source.name, cc, why)
                return None
            os.replace(tmp, out)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
    return ctypes.CDLL(str(out))


def build_first(variants: list[list[list[str]]], timeout: float) -> str:
    """Runs the build variants in order (OpenMP first, then without, where the compiler has
    no OpenMP) until every command of one succeeds: '' then, else why the last variant
    failed (its failing command's last error line, or that it ran past `timeout` seconds or
    did not start), so a build that cannot finish leaves the caller's fallback, never a
    traceback."""
    why = "?"
    for commands in variants:
        for cmd in commands:
            try:
                done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
            except subprocess.TimeoutExpired:
                why = f"{Path(cmd[0]).name} ran past {timeout:g} s"
                break
            except OSError as err:
                why = f"{Path(cmd[0]).name} did not start ({err.strerror or err})"
                break
            if done.returncode != 0:
                why = (done.stderr.strip().splitlines() or ["?"])[-1]
                break
        else:
            return ""
    return why


def native_path(source: Path) -> Path:
    """Where `source`'s library for this machine is cached: keyed by the source, the flags,
    the compiler and the CPU's flags."""
    key = hashlib.sha256("\n".join([source.read_text(), " ".join(FLAGS), str(_cc()),
                                    _cpu_flags()]).encode()).hexdigest()[:16]
    return cache_root() / "kernels" / f"{source.stem}-{key}.so"


def declared(lib: ctypes.CDLL | None, **signatures: tuple[list, object]) -> ctypes.CDLL | None:
    """`lib` with each named C function's (argtypes, restype) set, for ctypes; None stays
    None (a library that did not build)."""
    if lib is None:
        return None
    for name, (args, result) in signatures.items():
        fn = getattr(lib, name)
        fn.argtypes, fn.restype = args, result
    return lib


def build(out: Path, march: str = "native", defines: tuple[str, ...] = ()
          ) -> ctypes.CDLL | None:
    """qmm.c built into `out` for `march` (with -D `defines`) and loaded (None where it does
    not build)."""
    lib = compile_native(SOURCE, out, march, defines)
    if lib is None:
        return None
    p, i64 = ctypes.c_void_p, ctypes.c_int64
    for product in (lib.qmm_q4, lib.qmm_q4_a8):  # 16-bit and 8-bit activations
        product.argtypes = [p, i64, i64, p, p, p, p, i64, ctypes.c_int, i64, i64]
        product.restype = ctypes.c_int
    for product in (lib.qmm_q8, lib.qmm_q8_a8):  # a Q8_0 weight's (no mw)
        product.argtypes = [p, i64, i64, p, p, p, i64, ctypes.c_int, i64, i64]
        product.restype = ctypes.c_int
    lib.qmm_path.restype = ctypes.c_int
    return lib


@functools.lru_cache(maxsize=1)
def library() -> ctypes.CDLL | None:
    """qmm.c built for this machine (cached per source, compiler and CPU) and loaded; None
    where no C compiler builds it, or with SPECVIZ_QMM=torch (ConfigError, one line, for
    another value)."""
    mode = os.environ.get(ENV, "").strip().lower()
    if mode not in ("", "native", "torch"):
        raise ConfigError(f"{ENV}={mode!r}: expected native or torch")
    if mode == "torch":
        return None
    return build(native_path(SOURCE))


class _Padding(threading.local):
    """The padding of the products run in this thread (see :func:`padded_rows`)."""

    period = 0  # rows a chunk (0: no padding declared)
    live = 0  # real rows at the start of each chunk


_PADDING = _Padding()


def _set_op_padding(period: int, live: int) -> None:
    """The C++ kernel's copy of this thread's padding (once it is loaded)."""
    if _OP.lib is not None:
        _OP.lib.qmm_op_set_padding(period, live)


def padding() -> tuple[int, int]:
    """This thread's declared padding: (period, live), (0, 0) where none is."""
    return _PADDING.period, _PADDING.live


@contextlib.contextmanager
def padded_rows(period: int, live: int):
    """Within: the products this thread runs take rows in chunks of ``period`` (a fixed-shape
    step's fed tokens per beam row) whose first ``live`` rows are real and the rest padding.
    The library computes the real rows only and gives a padding row 0 (a product whose rows
    are not whole chunks computes every row); a real row's bits do not change, as a row's
    output never depends on the other rows. The torch reference computes every row."""
    saved = _PADDING.period, _PADDING.live
    _PADDING.period, _PADDING.live = period, live
    _set_op_padding(period, live)
    try:
        yield
    finally:
        _PADDING.period, _PADDING.live = saved
        _set_op_padding(*saved)


def fits(x: torch.Tensor, qw: torch.Tensor, mw: torch.Tensor | None, n: int) -> bool:
    """Whether x (R, K) fits a packed weight of n rows: qw holds N K / 2 bytes for Q4_1, N K
    for Q8_0 (mw None)."""
    k = x.shape[1]
    return k % GROUP == 0 and qw.numel() * (1 if mw is None else 2) == n * k


def run_with(lib: ctypes.CDLL, x: torch.Tensor, qw: torch.Tensor, dw: torch.Tensor,
             mw: torch.Tensor | None, n: int, bits: int = 16) -> torch.Tensor:
    """x (R, K) fp32 times the packed weight (N, K) by `lib` (Q4_1, or Q8_0 where mw is
    None), the activations quantised to `bits` -> (R, N) fp32 (ValueError for another dtype,
    width or bits: the library reads raw memory)."""
    x = x.contiguous()  # (R, K): a compiled graph may hand over any strides
    r, k = x.shape
    if x.dtype != torch.float32 or not fits(x, qw, mw, n) or bits not in BITS:
        raise ValueError(f"qmm: x {tuple(x.shape)} {x.dtype} at {bits} bits does not fit a "
                         f"packed weight of {n} rows and {qw.numel()} bytes")
    y = torch.empty(r, n)  # (R, N)
    if mw is None:
        rc = (lib.qmm_q8 if bits == 16 else lib.qmm_q8_a8)(
            x.data_ptr(), r, k, qw.data_ptr(), dw.data_ptr(), y.data_ptr(), n,
            torch.get_num_threads(), _PADDING.period, _PADDING.live)
    else:
        rc = (lib.qmm_q4 if bits == 16 else lib.qmm_q4_a8)(
            x.data_ptr(), r, k, qw.data_ptr(), dw.data_ptr(), mw.data_ptr(), y.data_ptr(), n,
            torch.get_num_threads(), _PADDING.period, _PADDING.live)
    if rc != 0:
        raise MemoryError("qmm: no scratch memory for the activations")
    return y


def path() -> str:
    """Which code runs the product here: 'avx512-vnni', 'avx2', 'c' or 'torch'."""
    lib = library()
    return "torch" if lib is None else PATHS[lib.qmm_path()]


def _run(x: torch.Tensor, qw: torch.Tensor, dw: torch.Tensor, mw: torch.Tensor | None,
         n: int, bits: int = 16) -> torch.Tensor:
    lib = library()
    return reference(x, qw, dw, mw, n, bits) if lib is None \
        else run_with(lib, x, qw, dw, mw, n, bits)


class _OpLibrary:
    """The loaded C++ kernels of the compiled step's ops (None: not loaded, or not built
    here); qmm's padding is set there through it."""

    lib: ctypes.CDLL | None = None


_OP = _OpLibrary()


class _Builds(threading.local):
    """Per thread: whether a Python kernel's first call here may build the ops' C++ kernels
    (a compiler run of about 12 s on one core). Not on a thread that defers compiles (the
    app's model thread: engine.execution.static_kv.CompilePolicy.deferred sets it): its ops
    keep their Python kernels, with the same bits, until another thread (the app's warm-up)
    has built and loaded the C++ ones."""

    here = True


BUILDS = _Builds()


def load_op() -> None:
    """A Python kernel's first step: the C++ kernels loaded (built first where this thread
    builds: BUILDS), so later CPU calls go there."""
    if BUILDS.here:
        native_op()


def op_path() -> Path:
    """Where the ops' C++ kernels for this machine and torch are cached (keyed as
    :func:`native_path`, with ops.cpp, rowattn.c and torch's version)."""
    key = hashlib.sha256("\n".join([SOURCE.read_text(), OP_SOURCE.read_text(),
                                    ROWATTN_SOURCE.read_text(), " ".join(FLAGS),
                                    str(_cc()), str(_cxx()), torch.__version__,
                                    _cpu_flags()]).encode()).hexdigest()[:16]
    return cache_root() / "kernels" / f"ops-{key}.so"


def _cxx() -> str | None:
    return os.environ.get("CXX") or shutil.which("c++") or shutil.which("g++")


def _build_op(out: Path) -> bool:
    """ops.cpp linked with qmm.c and rowattn.c (each built with its library's own flags) into
    `out` against torch's headers and libraries; False (and a log line) where it does not
    build."""
    from torch.utils import cpp_extension

    cc, cxx = _cc(), _cxx()
    if cc is None or cxx is None:
        log.warning("no C/C++ compiler: the compiled step's ops keep their Python kernels")
        return False
    out.parent.mkdir(parents=True, exist_ok=True)
    libs = cpp_extension.library_paths()
    with tempfile.TemporaryDirectory(dir=out.parent) as tmp:
        objs = {src: os.path.join(tmp, f"{src.stem}.o") for src in (SOURCE, ROWATTN_SOURCE)}
        cpp_obj, so = os.path.join(tmp, "ops_cpp.o"), os.path.join(tmp, "ops.so")
        c_flags = ["-march=native", *(f for f in FLAGS if f != "-shared"), "-c"]
        abi = int(torch._C._GLIBCXX_USE_CXX11_ABI)
        steps = [[  # as compile_native: OpenMP where the compiler has it
            *([cc, *c_flags, str(src), "-o", obj, *extra] for src, obj in objs.items()),
            [cxx, "-O2", "-fPIC", "-std=c++20", f"-D_GLIBCXX_USE_CXX11_ABI={abi}",
             *(f"-I{d}" for d in cpp_extension.include_paths()), "-c", str(OP_SOURCE),
             "-o", cpp_obj],
            [cxx, "-shared", "-o", so, cpp_obj, *objs.values(), *(f"-L{d}" for d in libs),
             *(f"-Wl,-rpath,{d}" for d in libs), "-ltorch", "-ltorch_cpu", "-lc10", "-lm",
             *extra],
        ] for extra in ((OPENMP,), ())]
        why = build_first(steps, timeout=600)
        if why:
            log.warning("%s did not build: %s (the compiled step's ops keep their Python "
                        "kernels)", OP_SOURCE.name, why)
            return False
        os.replace(so, out)
        return True


@functools.lru_cache(maxsize=1)
def native_op() -> ctypes.CDLL | None:
    """The compiled step's C++ kernels (ops.cpp: qmm.c's product and rowattn.c's attention
    called by torch's dispatcher, no Python on the way) built for this machine (cached) and
    loaded, registered for CPU tensors over the ops' Python kernels; None where qmm.c runs no
    native library (no compiler, SPECVIZ_QMM=torch) or the kernels do not build or load.
    Loaded by either op's first call (a compiled step's), never by eager products."""
    if library() is None:
        return None
    out = op_path()
    if not out.exists() and not _build_op(out):
        return None
    try:
        torch.ops.load_library(str(out))
        lib = ctypes.CDLL(str(out))
    except (OSError, RuntimeError) as err:
        log.warning("the compiled step's C++ kernels did not load: %s", err)
        return None
    lib.qmm_op_set_padding.argtypes = [ctypes.c_int64, ctypes.c_int64]
    lib.qmm_op_set_padding.restype = None
    _OP.lib = lib
    _set_op_padding(_PADDING.period, _PADDING.live)  # inside a step: its padding
    return lib


def _op_python(x: torch.Tensor, qw: torch.Tensor, dw: torch.Tensor, mw: torch.Tensor | None,
               n: int, bits: int = 16) -> torch.Tensor:
    """The op's Python kernel: it loads the C++ one (later calls on CPU tensors go there)
    and computes this call itself."""
    load_op()
    return _run(x, qw, dw, mw, n, bits)


# The op torch.compile sees (opaque to inductor). Defined with torch.library.Library, not
# custom_op: its dispatch costs about 1 us a call against custom_op's 8 (measured, one
# thread), which counts at 211 products a step. Its Python kernel is registered for every
# backend (CompositeExplicitAutograd); the C++ one, once loaded, for CPU, which the
# dispatcher takes first.
_LIB = torch.library.Library("specviz", "DEF")
_LIB.define("qmm(Tensor x, Tensor qw, Tensor dw, Tensor? mw, int n, int bits=16) -> Tensor")
_LIB.impl("qmm", _op_python, "CompositeExplicitAutograd")


@torch.library.register_fake("specviz::qmm")
def _(x, qw, dw, mw, n, bits=16):
    return x.new_empty(x.shape[0], n)


def matmul(x: torch.Tensor, qw: torch.Tensor, dw: torch.Tensor, mw: torch.Tensor | None,
           n: int, bits: int = 16) -> torch.Tensor:
    """x (R, K) fp32 times the packed weight (N, K): Q4_1 (:func:`pack`), or Q8_0
    (:func:`pack8`) where mw is None; the activations quantised to `bits` (16, the packed
    target's, or 8) -> (R, N) fp32 (ValueError for another width)."""
    if bits not in BITS:
        raise ValueError(f"qmm: activations of {bits} bits (expected one of {BITS})")
    if torch.compiler.is_compiling():
        return torch.ops.specviz.qmm(x, qw, dw, mw, n, bits)
    return _run(x, qw, dw, mw, n, bits)
