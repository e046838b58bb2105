"""The packed target's 4-bit kernels (engine's qmm) beside torchao's CPU low-bit linears on
SmolLM2-135M's linear shapes: us a call (min and median), per shape and number of rows, one
torch thread; and the numerics of each against the fp32 product of the GGUF-style weight
(docs/benchmarks.md, "Against torchao").

    .venv/bin/pip install --no-deps --target /tmp/tao 'torchao==0.18.*'
    git -C <pytorch/ao clone> show v0.18.0:torchao/csrc/cpu/aten_kernels/da8w4_linear.cpp \\
        > /tmp/da8w4_linear.cpp   # only for da8w4 (below)
    PYTHONPATH=/tmp/tao taskset -c 1 .venv/bin/python scripts/torchao_bench.py \\
        [--reps 400] [--da8w4-src /tmp/da8w4_linear.cpp]

Products (one weight, random Q4_1 blocks of the model's shapes: w = d q + m per block of 32):
- `q4` / `q4:a8`: engine's qmm (`embedded-q4` / `embedded-q4:a8`) on the blocks exactly,
  fp32 activations quantised per row and block of 32 to 16 / 8 bits (llama.cpp's Q8_1 at 8).
- `ao int4wo`: torchao's int4 weight-only linear on CPU (0.18: the prototype
  `PrototypeInt4WeightOnlyConfig`, Int4OpaqueTensor, torch's
  `aten._weight_int4pack_mm_for_cpu`), bf16 model, group 32; `op` the aten call alone.
  (0.18's `Int4WeightOnlyConfig` has no CPU format: plain needs mslk, tile_packed_to_4d
  CUDA, plain_int32 "does not support device 'cpu' yet".)
- `ao da8w4`: torchao's `Int8DynamicActivationInt4WeightConfig` (Int4OpaqueTensor's da8w4
  path, `torchao::da8w4_linear_cpu`), fp32 model, group 32, uint8 activations per token;
  `op` the kernel alone on activations quantised beforehand (its activation quantisation,
  several torch ops in Python, left out). PyPI's torchao wheel is built without its CPU
  kernels (USE_CPU_KERNELS=0); --da8w4-src builds torchao's own
  csrc/cpu/aten_kernels/da8w4_linear.cpp with its setup.py's x86 flags. Its VNNI
  micro-kernels run only where `cpublas::could_pack` (AMX); elsewhere a scalar loop runs.
torchao quantises the float weight (here the Q4_1 blocks' dequantised fp32 weight) with its
own group quantisation (bf16 scale and zero for int4wo, fp32 scale and integer zero point
for da8w4), so its products are not llama.cpp's, nor the GGUF's own numbers.

The head (49152 x 576) runs in the engine as Q8_0 through qmm's Q8_0 product (`head`, qmm
only); `head 4-bit` is the like-for-like 4-bit product.
Each shape's weights are small enough to stay in the caches between calls (the head's
barely): these are warm-cache figures; `pass` runs one pass over 30 layers' 210 linears
(66 MB of 4-bit weights, streamed from memory as a decode step does) and reports ms.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import time
import warnings
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine.kernels import qmm  # noqa: E402

GROUP = 32
SHAPES = {  # name -> (out, in)
    "q / o": (576, 576),
    "k / v": (192, 576),
    "gate / up": (1536, 576),
    "down": (576, 1536),
    "head 4-bit": (49152, 576),
}
LAYER = ["q / o", "k / v", "k / v", "q / o", "gate / up", "gate / up", "down"]
LAYERS = 30


def cpu_name() -> str:
    """lscpu's model name, family and the AVX512 / VNNI flags."""
    info = {}
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
        for line in out.splitlines():
            key, _, val = line.partition(":")
            info[key.strip()] = val.strip()
    except OSError:
        pass
    flags = set(info.get("Flags", "").split())
    simd = [f for f in ("avx2", "avx512f", "avx512_vnni", "avx_vnni", "avx512_bf16", "amx_int8")
            if f in flags]
    return (f"{info.get('Model name', platform.processor())}, family {info.get('CPU family', '?')}"
            f" model {info.get('Model', '?')}, {' '.join(simd)}")


def q4_1(n: int, k: int, gen: torch.Generator):
    """Random Q4_1 blocks (q, d, m) and their dequantised fp32 weight (the reference)."""
    q = torch.randint(0, 16, (n, k), generator=gen, dtype=torch.uint8)  # (N, K)
    d = (torch.rand(n, k // GROUP, generator=gen) * 0.02 + 1e-3).half()  # (N, K / G)
    m = (torch.rand(n, k // GROUP, generator=gen) * -0.15).half()  # (N, K / G)
    w = (q.view(n, k // GROUP, GROUP).float() * d.float()[..., None]
         + m.float()[..., None]).view(n, k)  # (N, K)
    return q, d, m, w


def load_torchao(da8w4_src: str | None, build_dir: str):
    """torchao's two CPU configs (None and why, where a path is unavailable)."""
    why = {}
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            import torchao  # noqa: F401
            from torchao.prototype.quantization.int4 import (
                Int8DynamicActivationInt4WeightConfig,
                PrototypeInt4WeightOnlyConfig,
            )
            from torchao.quantization import quantize_
    except Exception as err:  # noqa: BLE001
        return None, {"all": f"import torchao: {type(err).__name__}: {err}"}
    ver = torchao.__version__
    if da8w4_src and "CPU" not in torch._C._dispatch_dump("torchao::da8w4_linear_cpu"):
        from torch.utils import cpp_extension
        os.makedirs(build_dir, exist_ok=True)
        flags = ["-O3", "-march=native", "-mfma", "-fopenmp"]  # torchao setup.py's x86 flags
        if torch.cpu._is_avx512_supported():  # as torchao's setup.py asks
            flags.append("-DCPU_CAPABILITY_AVX512")
        if torch.cpu._is_vnni_supported():
            flags.append("-DCPU_CAPABILITY_AVX512_VNNI")
        try:
            cpp_extension.load(name="torchao_da8w4_cpu", sources=[da8w4_src],
                               build_directory=build_dir, extra_cflags=flags,
                               extra_ldflags=["-fopenmp"], is_python_module=False)
            ver += " (da8w4 kernel built from " + Path(da8w4_src).name + ")"
        except Exception as err:  # noqa: BLE001
            why["da8w4"] = f"building {da8w4_src}: {str(err).splitlines()[-1]}"
    if "CPU" not in torch._C._dispatch_dump("torchao::da8w4_linear_cpu"):
        why.setdefault("da8w4", "torchao::da8w4_linear_cpu has no CPU kernel in this torchao "
                                "build (PyPI wheels: USE_CPU_KERNELS=0); pass --da8w4-src")
    return (ver, quantize_, PrototypeInt4WeightOnlyConfig,
            Int8DynamicActivationInt4WeightConfig), why


def timed(fns: dict, reps: int, budget_s: float = 2.0) -> dict:
    """us (min, median) of each callable, run in turn every repeat after warm-ups; a slow one
    (torchao's da8w4 without AMX) gets fewer repeats (at least 5) to fit `budget_s`."""
    clock = time.perf_counter_ns
    want = {}
    for name, fn in fns.items():
        fn()
        t0 = clock()
        fn()
        cost = max(clock() - t0, 1) / 1e9
        want[name] = max(5, min(reps, int(budget_s / cost)))
    spent = {name: [] for name in fns}
    for i in range(max(want.values())):
        for name, fn in fns.items():
            if i < want[name]:
                t0 = clock()
                fn()
                spent[name].append(clock() - t0)
    return {name: (min(t) / 1e3, statistics.median(t) / 1e3) for name, t in spent.items()}


class Weight:
    """One (out, in) weight in every product's form."""

    def __init__(self, n: int, k: int, gen: torch.Generator, ao, why: dict):
        self.n, self.k = n, k
        q, d, m, self.w = q4_1(n, k, gen)
        self.qw, self.dw, self.mw = qmm.pack(q, d, m)
        self.ao = {}
        if ao is None:
            return
        _, quantize_, Int4WO, DA8W4 = ao
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                lin = nn.Linear(k, n, bias=False).to(torch.bfloat16)
                lin.weight.data.copy_(self.w)
                quantize_(lin, Int4WO(group_size=GROUP, set_inductor_config=False))
                self.ao["int4wo"] = lin
            except Exception as err:  # noqa: BLE001
                why.setdefault("int4wo", f"{type(err).__name__}: {err}")
            if "da8w4" not in why:
                try:
                    lin = nn.Linear(k, n, bias=False)
                    lin.weight.data.copy_(self.w)
                    quantize_(lin, DA8W4(group_size=GROUP, set_inductor_config=False))
                    self.ao["da8w4"] = lin
                except Exception as err:  # noqa: BLE001
                    why.setdefault("da8w4", f"{type(err).__name__}: {err}")

    def products(self, x: torch.Tensor) -> dict:
        """name -> a call computing x's product, x (R, K) fp32."""
        xb = x.bfloat16()
        out = {
            "q4": lambda: qmm.matmul(x, self.qw, self.dw, self.mw, self.n, 16),
            "q4:a8": lambda: qmm.matmul(x, self.qw, self.dw, self.mw, self.n, 8),
        }
        if "int4wo" in self.ao:
            wo = self.ao["int4wo"]
            wt = wo.weight
            out["ao int4wo"] = lambda: wo(xb)
            out["ao int4wo op"] = lambda: torch.ops.aten._weight_int4pack_mm_for_cpu(
                xb, wt.qdata, GROUP, wt.scale_and_zero)
        if "da8w4" in self.ao:
            da = self.ao["da8w4"]
            dt = da.weight
            xa, sa, za = quantize_act_u8(x)
            out["ao da8w4"] = lambda: da(x)
            out["ao da8w4 op"] = lambda: torch.ops.torchao.da8w4_linear_cpu.default(
                xa, sa, za, dt.qdata, dt.scale_and_zero, dt.qzeros, dt.compensation, None,
                torch.float32)
        return out


def quantize_act_u8(x: torch.Tensor):
    """x (R, K) -> uint8 activations, fp32 scales, int32 zero points per row: what torchao's
    da8w4 linear computes before its kernel (asymmetric, 0..255)."""
    lo = x.amin(-1).clamp(max=0)
    hi = x.amax(-1).clamp(min=0)
    scale = ((hi - lo) / 255).clamp(min=torch.finfo(torch.float32).eps)
    zp = (-torch.round(lo / scale)).clamp(0, 255).to(torch.int32)
    xq = (torch.round(x / scale[:, None]) + zp[:, None]).clamp(0, 255).to(torch.uint8)
    return xq.contiguous(), scale.contiguous(), zp.contiguous()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", default="1,2,4,8,16")
    ap.add_argument("--reps", type=int, default=400, help="repeats a cell (the head: 1/4)")
    ap.add_argument("--pass-reps", type=int, default=15)
    ap.add_argument("--da8w4-src", default=None,
                    help="torchao's csrc/cpu/aten_kernels/da8w4_linear.cpp, built if the "
                         "installed torchao has no CPU kernel for it")
    ap.add_argument("--build-dir", default="/tmp/torchao_da8w4_build")
    args = ap.parse_args()
    torch.set_num_threads(1)
    rows = [int(r) for r in args.rows.split(",")]
    ao, why = load_torchao(args.da8w4_src, args.build_dir)
    gen = torch.Generator().manual_seed(0)
    weights = {name: Weight(n, k, gen, ao, why) for name, (n, k) in SHAPES.items()}
    qh = torch.randint(-128, 128, (49152, 576), generator=gen, dtype=torch.int8)  # (V, d)
    dh = (torch.rand(49152, 576 // 32, generator=gen) * 0.02).half()  # (V, d / 32)
    head = (*qmm.pack8(qh, dh), None)  # the engine's head: its Q8_0 product

    try:
        load = os.getloadavg()
    except OSError:
        load = ("?",)
    print(f"CPU: {cpu_name()}; torch {torch.__version__}, "
          f"{torch.get_num_threads()} thread, affinity {sorted(os.sched_getaffinity(0))}; "
          f"qmm path {qmm.path()}; torchao {ao[0] if ao else 'unavailable'}; "
          f"load {load[0]}; {time.strftime('%Y-%m-%d %H:%M')}")
    for name, reason in why.items():
        print(f"unavailable: {name}: {reason}")
    if ao and "da8w4" not in why:  # its kernel's VNNI / brgemm paths need cpublas to pack (AMX)
        amx = torch.cpu._is_amx_tile_supported()
        print(f"da8w4 kernel path: {'AMX brgemm' if amx else 'no AMX: its scalar C++ loop'} "
              f"(torchao gates its fast paths on cpublas::could_pack, which needs AMX)")

    print("\n## us a call, min / median\n")
    names = None
    mins: dict = {}
    for name, w in weights.items():
        for r in rows:
            x = torch.randn(r, w.k, generator=gen)
            fns = w.products(x)
            if name == "head 4-bit":
                fns["head (engine, Q8_0)"] = lambda x=x: qmm.matmul(x, *head, 49152, 8)
            reps = args.reps // 4 if name.startswith("head") else args.reps
            cells = timed(fns, reps)
            mins[(name, r)] = {n: c[0] for n, c in cells.items()}
            if names is None:
                names = list(cells)
                print("| shape (out x in) | rows | " + " | ".join(names) + " |")
                print("|---|---|" + "---|" * len(names))
            line = " | ".join(f"{cells[n][0]:.1f} / {cells[n][1]:.1f}" if n in cells else ""
                              for n in names)
            print(f"| {name} {w.n}x{w.k} | {r} | {line} |", flush=True)
            if "head (engine, Q8_0)" in cells:
                c = cells["head (engine, Q8_0)"]
                print(f"| head (engine: Q8_0, 49152x576), q4:a8 | {r} | | "
                      f"{c[0]:.1f} / {c[1]:.1f} |", flush=True)

    print("\n## one decoder layer's 7 linears (sum of the shapes' min us) and the head\n")
    print("| product | " + " | ".join(f"{r} row{'s' if r > 1 else ''}" for r in rows) + " |")
    print("|---|" + "---|" * len(rows))
    for n in names:
        layer = [sum(mins[(s, r)][n] for s in LAYER) for r in rows]
        print(f"| {n}, layer | " + " | ".join(f"{v:.0f}" for v in layer) + " |")
    for n in names + ["head (engine, Q8_0)"]:
        label = "q4:a8, head as the engine runs it (Q8_0 as 4-bit x 1152)" \
            if n.startswith("head") else f"{n}, head"
        print(f"| {label} | " + " | ".join(f"{mins[('head 4-bit', r)][n]:.0f}"
                                           for r in rows) + " |")

    print(f"\n## one pass over {LAYERS * len(LAYER)} linears (weights from memory), "
          f"ms, min / median of {args.pass_reps}\n")
    layer_ws = [Weight(*SHAPES[s], gen, ao, why) for _ in range(LAYERS) for s in LAYER]
    print("| rows | " + " | ".join(n for n in names if not n.startswith("head")) + " |")
    print("|---|" + "---|" * len([n for n in names if not n.startswith("head")]))
    for r in rows:
        xs = {k: torch.randn(r, k, generator=gen) for k in (576, 1536)}
        per = [w.products(xs[w.k]) for w in layer_ws]
        kinds = [n for n in names if not n.startswith("head") and n in per[0]]
        fns = {kind: (lambda kind=kind: [p[kind]() for p in per]) for kind in kinds}
        cells = timed(fns, args.pass_reps)
        print(f"| {r} | " + " | ".join(f"{cells[k][0] / 1e3:.2f} / {cells[k][1] / 1e3:.2f}"
                                       for k in kinds) + " |", flush=True)

    print("\n## numerics: max |y - y_ref| (4 rows, x ~ N(0, 1)); y_ref = x W^T in fp64, "
          "W the Q4_1 blocks' fp32 weight\n")
    print("| shape | max abs y_ref | " + " | ".join(
        f"{n} vs ref" for n in names if not n.endswith(" op") and not n.startswith("head"))
          + " | ao vs q4:a8 (int4wo / da8w4) |")
    print("|---|---|" + "---|" * (len([n for n in names if not n.endswith(" op")
                                       and not n.startswith("head")]) + 1))
    for name, w in weights.items():
        x = torch.randn(4, w.k, generator=gen)
        ref = (x.double() @ w.w.double().T)
        ys = {n: fn().double() for n, fn in w.products(x).items() if not n.endswith(" op")}
        diffs = " | ".join(f"{(ys[n] - ref).abs().max().item():.2e}" if n in ys else ""
                           for n in names if not n.endswith(" op") and not n.startswith("head"))
        ours = ys["q4:a8"]
        vs = " / ".join(f"{(ys[n] - ours).abs().max().item():.2e}"
                        for n in ("ao int4wo", "ao da8w4") if n in ys)
        print(f"| {name} {w.n}x{w.k} | {ref.abs().max().item():.2f} | {diffs} | {vs} |")
    try:
        print(f"\nload after: {os.getloadavg()[0]}")
    except OSError:
        pass


if __name__ == "__main__":
    main()
