"""engine.kernels.qmm, the 4-bit (Q4_1) and 8-bit (Q8_0) weight kernels of the packed target:
their layouts round-trip, the C build equals the torch reference, every code path of qmm.c
gives the same bits, a row's output depends on its row alone, and the op is fit for
torch.compile."""

from __future__ import annotations

import platform

import pytest
import torch

from engine.kernels import qmm


def _weight(n: int, k: int, seed: int):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randint(0, 16, (n, k), generator=gen, dtype=torch.uint8)  # (N, K)
    dw = (torch.rand(n, k // qmm.GROUP, generator=gen) * 0.02).half()  # (N, K / G)
    mw = (torch.rand(n, k // qmm.GROUP, generator=gen) * -0.1).half()  # (N, K / G)
    return q, dw, mw


def _x(r: int, k: int, seed: int) -> torch.Tensor:
    x = torch.randn(r, k, generator=torch.Generator().manual_seed(seed))  # (R, K)
    x[0, :qmm.GROUP] = 0.0  # an all-zero block: dx = 0
    return x


@pytest.fixture(scope="module")
def packed():
    q, dw, mw = _weight(48, 96, seed=0)
    return (q, dw, mw), qmm.pack(q, dw, mw)


def _weight8(n: int, k: int, seed: int):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randint(-128, 128, (n, k), generator=gen, dtype=torch.int8)  # (N, K)
    q[0, :qmm.GROUP], q[1, :qmm.GROUP] = -128, 127  # the range's ends, a block each
    dw = (torch.rand(n, k // qmm.GROUP, generator=gen) * 0.02).half()  # (N, K / G)
    return q, dw


@pytest.fixture(scope="module")
def packed8():
    """A Q8_0 weight (48, 96) and its layout: (q, dw), (qw, dw, None) as matmul takes it."""
    q, dw = _weight8(48, 96, seed=20)
    return (q, dw), (*qmm.pack8(q, dw), None)


def test_the_layout_round_trips(packed):
    (q, dw, mw), (qw, pdw, pmw) = packed
    back = qmm.unpack(qw, pdw, pmw, 48, 96)
    assert all(torch.equal(a, b) for a, b in zip(back, (q, dw, mw)))


def test_the_layout_puts_a_blocks_two_halves_in_one_bytes_nibbles(packed):
    (q, _, _), (qw, _, _) = packed
    # tile 0, block 0, vector j = 0, column 0, byte e = 0: q[0, 0] low, q[0, 16] high
    assert int(qw[0]) == int(q[0, 0]) | int(q[0, 16]) << 4
    # column 1's first byte follows column 0's four
    assert int(qw[4]) == int(q[1, 0]) | int(q[1, 16]) << 4


def test_the_q8_0_layout_round_trips_and_puts_four_inputs_of_a_column_in_one_word(packed8):
    (q, dw), (qw, pdw, _) = packed8
    back_q, back_d = qmm.unpack8(qw, pdw, 48, 96)
    assert torch.equal(back_q, q) and torch.equal(back_d, dw)
    b = qw.view(torch.int8)
    # tile 0, block 0, group 0: column 0's inputs 0..3, then column 1's
    assert b[:8].tolist() == q[0, :4].tolist() + q[1, :4].tolist()
    assert b[64:68].tolist() == q[0, 4:8].tolist()  # group 1: inputs 4..7
    assert b[512:516].tolist() == q[0, 32:36].tolist()  # block 1 of tile 0


@pytest.mark.parametrize("bits", qmm.BITS)
def test_the_q8_0_product_equals_the_torch_reference_and_the_weights_product(packed8, bits):
    from tests.oracles import qmm_error_bound

    (q, dw), (qw, pdw, _) = packed8
    x = _x(11, 96, seed=21)
    y = qmm.run_with(qmm.library(), x, qw, pdw, None, 48, bits)  # (11, 48)
    assert torch.equal(y, qmm.reference(x, qw, pdw, None, 48, bits))
    w = dw.float().repeat_interleave(qmm.GROUP, 1) * q.float()  # (48, 96) dequantised
    err = (y.double() - x.double() @ w.double().T).abs()
    levels = qmm.LEVELS8 if bits == 8 else qmm.LEVELS
    assert (err <= qmm_error_bound(w.abs(), x, levels=levels)).all()
    # the negative control: the bytes read as q + 128 (the AVX512 loop without its block
    # sums taken away) break the bound
    u = q.to(torch.int32) + 128  # (48, 96) in 0..255
    wrong = x.double() @ (dw.double().repeat_interleave(qmm.GROUP, 1) * u.double()).T
    assert not ((wrong - x.double() @ w.double().T).abs()
                <= qmm_error_bound(w.abs(), x, levels=levels)).all()


@pytest.mark.parametrize("bits", qmm.BITS)
def test_the_q8_0_products_largest_sums_neither_saturate_nor_differ_from_the_reference(bits):
    """q = -128 against activations at +-their largest: AVX2's 8-bit pairs at 2 x 128 x 127
    (just under 2^15) and, at 16 bits, dot products of 32 x 128 x 32767 (past 2^24: rounded to
    fp32 the same way on every path)."""
    q = torch.full((32, 64), -128, dtype=torch.int8)  # (N, K)
    q[16:] = 127
    d = torch.full((32, 2), 0.01).half()
    qw, dw = qmm.pack8(q, d)
    x = torch.full((3, 64), 2.5)  # (3, K)
    x[1] = -2.5
    x[2, 32:] = -7.0
    x[2, 33] = 6.99  # a block whose integers do not all round alike
    y = qmm.matmul(x, qw, dw, None, 32, bits)  # (3, 32)
    assert torch.equal(y, qmm.reference(x, qw, dw, None, 32, bits))
    torch.testing.assert_close(y[:2, 0], x[:2].sum(1) * -128 * float(d[0, 0]), rtol=1e-5,
                               atol=1e-5)


@pytest.mark.parametrize("bits", qmm.BITS)
def test_the_built_kernel_equals_the_torch_reference(packed, bits):
    lib = qmm.library()
    assert lib is not None, "qmm.c must build here (a C compiler is part of the setup)"
    _, (qw, dw, mw) = packed
    x = _x(11, 96, seed=1)
    y = qmm.run_with(lib, x, qw, dw, mw, 48, bits)  # (11, 48)
    ref = qmm.reference(x, qw, dw, mw, 48, bits)  # (11, 48)
    assert (y == ref).float().mean() > 0.99  # equal bits but for a rare double rounding
    torch.testing.assert_close(y, ref, rtol=1e-6, atol=1e-6)


def test_the_reference_quantises_activations_to_16_bits_of_their_blocks_largest():
    x = torch.zeros(1, qmm.GROUP)
    x[0, :3] = torch.tensor([3.2767, -1.0, 0.00005])
    qx, dx, sx = qmm.quantize(x)
    assert dx[0, 0] == pytest.approx(1e-4)
    assert qx[0, 0, :3].tolist() == [32767.0, -10000.0, 0.0]  # 0.5 steps: to even
    assert sx[0, 0] == pytest.approx(dx[0, 0] * 22767)


def test_the_reference_quantises_activations_to_8_bits_of_their_blocks_largest():
    x = torch.zeros(1, qmm.GROUP)
    x[0, :3] = torch.tensor([1.27, -0.305, 0.004])
    qx, dx, sx = qmm.quantize(x, 8)
    assert dx[0, 0] == pytest.approx(0.01)
    assert qx[0, 0, :3].tolist() == [127.0, -30.0, 0.0]  # -30.5 and 0.4 steps: to even, to 0
    assert sx[0, 0] == pytest.approx(dx[0, 0] * 97)


def test_8_bit_activations_stay_within_half_their_step_of_the_fp32_product(packed):
    from tests.oracles import qmm_error_bound

    (q, dw, mw), (qw, pdw, pmw) = packed
    w = (dw.float().repeat_interleave(qmm.GROUP, 1) * q.float()
         + mw.float().repeat_interleave(qmm.GROUP, 1))  # (48, 96): the dequantised weight
    x = _x(7, 96, seed=14)
    y8 = qmm.matmul(x, qw, pdw, pmw, 48, bits=8)  # (7, 48)
    err = (y8.double() - x.double() @ w.double().T).abs()
    assert (err <= qmm_error_bound(w.abs(), x, levels=qmm.LEVELS8)).all()
    # the 16-bit product's tighter bound does not hold for 8 bits: the steps are 258x coarser
    assert not (err <= qmm_error_bound(w.abs(), x, levels=qmm.LEVELS)).all()


def test_a_wrong_activation_rounding_is_caught_by_the_reference_comparison(packed):
    lib = qmm.library()
    _, (qw, dw, mw) = packed
    x = _x(4, 96, seed=2)
    y = qmm.run_with(lib, x, qw, dw, mw, 48)

    def truncating(v, bits=16):  # the negative control: round toward zero, not to nearest
        r, k = v.shape
        xb = v.view(r, k // qmm.GROUP, qmm.GROUP)
        dx = xb.abs().amax(-1) / float(qmm.LEVELS)
        qx = torch.trunc(xb / dx.clamp_min(1e-30)[..., None])
        return qx, dx, dx * qx.sum(-1)

    right = qmm.quantize
    try:
        qmm.quantize = truncating
        wrong = qmm.reference(x, qw, dw, mw, 48)
    finally:
        qmm.quantize = right
    # the tolerance the right reference meets (test above) rejects the wrong one
    assert not torch.allclose(y, wrong, rtol=1e-6, atol=1e-6)


_Q8 = (*qmm.pack8(*_weight8(48, 96, seed=22)), None)  # a Q8_0 weight for every code path


@pytest.mark.parametrize("bits", qmm.BITS)
@pytest.mark.parametrize("name,march,defines", [
    ("plain C", "native", ("QMM_PLAIN",)),
    ("AVX2", "x86-64-v3", ()),
    ("AVX512-VNNI", "icelake-server", ()),
])
def test_every_code_path_gives_the_same_bits(packed, tmp_path, name, march, defines, bits):
    if march != "native" and platform.machine() != "x86_64":
        pytest.skip(f"{march} is an x86 target")
    if name == "AVX512-VNNI" and "avx512_vnni" not in qmm._cpu_flags().split():
        pytest.skip("this CPU runs no AVX512-VNNI code")  # the build is checked where it runs
    lib = qmm.build(tmp_path / "qmm.so", march=march, defines=defines)
    assert lib is not None
    assert qmm.PATHS[lib.qmm_path()] == {"plain C": "c", "AVX2": "avx2",
                                         "AVX512-VNNI": "avx512-vnni"}[name]
    x = _x(11, 96, seed=3)
    for weight in (packed[1], _Q8):  # the Q4_1 and the Q8_0 products
        assert torch.equal(qmm.run_with(lib, x, *weight, 48, bits),
                           qmm.run_with(qmm.library(), x, *weight, 48, bits))


@pytest.mark.parametrize("bits", qmm.BITS)
@pytest.mark.parametrize("kind", ["q4", "q8"])
def test_rows_are_independent_across_the_8_row_tiles(packed, packed8, bits, kind):
    qw, dw, mw = (packed if kind == "q4" else packed8)[1]
    x = _x(19, 96, seed=4)
    y = qmm.matmul(x, qw, dw, mw, 48, bits)  # (19, 48): tiles of 8, 8 and 3 rows
    for i in range(19):
        assert torch.equal(qmm.matmul(x[i:i + 1].clone(), qw, dw, mw, 48, bits)[0], y[i]), i


@pytest.mark.parametrize("bits", qmm.BITS)
def test_threads_do_not_change_the_bits(packed, bits):
    _, (qw, dw, mw) = packed
    x = _x(5, 96, seed=5)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = qmm.matmul(x, qw, dw, mw, 48, bits)
        torch.set_num_threads(2)
        two = qmm.matmul(x, qw, dw, mw, 48, bits)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(one, two)


def test_the_custom_op_passes_torchs_op_check(packed, packed8):
    for qw, dw, mw in (packed[1], packed8[1]):
        torch.library.opcheck(torch.ops.specviz.qmm.default, (_x(3, 96, seed=6), qw, dw, mw, 48))
        torch.library.opcheck(torch.ops.specviz.qmm.default,
                              (_x(3, 96, seed=6), qw, dw, mw, 48, 8))


def test_a_packed_layer_compiled_by_inductor_gives_the_eager_bits():
    from engine.kernels.packed4 import Packed4Linear, quantize_q4_1

    w = torch.randn(32, 64, generator=torch.Generator().manual_seed(7))  # (out, in)
    layer = Packed4Linear(quantize_q4_1(w), bias=torch.zeros(32))
    x = _x(3, 64, seed=8)[None] * 2  # (1, 3, in): a shape to view, a product to fuse around

    def f(v):
        return torch.relu(layer(v * 0.5)) + 1

    torch._dynamo.reset()
    compiled = torch.compile(f, fullgraph=True, dynamic=False)
    assert torch.equal(compiled(x), f(x))


def test_an_unknown_kernel_choice_is_refused_in_one_line(monkeypatch):
    from engine.core.errors import ConfigError

    monkeypatch.setenv("SPECVIZ_QMM", "fast")
    qmm.library.cache_clear()
    try:
        with pytest.raises(ConfigError, match="SPECVIZ_QMM='fast': expected native or torch"):
            qmm.library()
    finally:
        monkeypatch.delenv("SPECVIZ_QMM")
        qmm.library.cache_clear()


def test_without_the_library_a_packed_layer_runs_the_torch_reference(monkeypatch, packed):
    _, (qw, dw, mw) = packed
    x = _x(2, 96, seed=9)
    monkeypatch.setenv("SPECVIZ_QMM", "torch")
    qmm.library.cache_clear()
    try:
        assert qmm.path() == "torch"
        assert torch.equal(qmm.matmul(x, qw, dw, mw, 48), qmm.reference(x, qw, dw, mw, 48))
    finally:
        monkeypatch.delenv("SPECVIZ_QMM")
        qmm.library.cache_clear()
    assert qmm.path() != "torch"


def test_the_8_bit_products_largest_sums_do_not_saturate():
    """Every weight 15 against every activation +127 or -127 (a block of one value): the
    16-bit sums of the AVX2 loop at their largest (8 groups x 2 x 15 x 127 = 30,480)."""
    q = torch.full((32, 64), 15, dtype=torch.uint8)  # (N, K)
    d, m = torch.full((32, 2), 0.01).half(), torch.zeros(32, 2).half()
    qw, dw, mw = qmm.pack(q, d, m)
    x = torch.full((3, 64), 2.5)  # (3, K)
    x[1] = -2.5
    x[2, 32:] = -7.0
    y = qmm.matmul(x, qw, dw, mw, 32, 8)  # (3, 32)
    assert torch.equal(y, qmm.reference(x, qw, dw, mw, 32, 8))
    torch.testing.assert_close(y[:, 0], x.sum(1) * 15 * float(d[0, 0]), rtol=1e-5, atol=1e-5)


def test_the_8_bit_product_is_caught_by_the_reference_only_at_8_bits(packed):
    _, (qw, dw, mw) = packed
    x = _x(4, 96, seed=15)
    y8 = qmm.run_with(qmm.library(), x, qw, dw, mw, 48, 8)
    torch.testing.assert_close(y8, qmm.reference(x, qw, dw, mw, 48, 8), rtol=1e-6, atol=1e-6)
    assert not torch.allclose(y8, qmm.reference(x, qw, dw, mw, 48, 16), rtol=1e-6, atol=1e-6)


def test_an_input_that_does_not_fit_the_packed_weight_is_refused(packed):
    _, (qw, dw, mw) = packed
    with pytest.raises(ValueError, match="does not fit"):
        qmm.run_with(qmm.library(), _x(2, 96, seed=10).double(), qw, dw, mw, 48)
    with pytest.raises(ValueError, match="does not fit"):
        qmm.run_with(qmm.library(), _x(2, 64, seed=10), qw, dw, mw, 48)
    with pytest.raises(ValueError, match="does not fit"):  # an activation width it lacks
        qmm.run_with(qmm.library(), _x(2, 96, seed=10), qw, dw, mw, 48, 4)
    with pytest.raises(ValueError, match="4 bits"):  # on every path, the reference's too
        qmm.matmul(_x(2, 96, seed=10), qw, dw, mw, 48, 4)


@pytest.mark.parametrize("period,live,bits,kind", [
    (4, 1, 16, "q4"), (4, 3, 16, "q4"), (8, 5, 16, "q4"), (2, 0, 16, "q4"), (4, 3, 8, "q4"),
    (4, 1, 8, "q8"), (8, 5, 16, "q8")])
def test_padded_rows_are_skipped_and_real_rows_keep_their_bits(packed, packed8, period, live,
                                                               bits, kind):
    qw, dw, mw = (packed if kind == "q4" else packed8)[1]
    x = _x(5 * period, 96, seed=11)  # five chunks: a fixed-shape step of five beam rows (the
    # real rows of several chunks share the kernel's 8-row blocks)
    full = qmm.matmul(x, qw, dw, mw, 48, bits)  # (5 period, 48)
    with qmm.padded_rows(period, live):
        y = qmm.matmul(x, qw, dw, mw, 48, bits)  # (5 period, 48)
    real = (torch.arange(5 * period) % period) < live  # (5 period,)
    assert torch.equal(y[real], full[real])
    assert not y[~real].any() and full[~real].any()  # the padding was not computed


def test_padding_that_does_not_cut_the_rows_into_chunks_computes_every_row(packed):
    _, (qw, dw, mw) = packed
    x = _x(6, 96, seed=12)
    with qmm.padded_rows(4, 1):  # 6 rows are not chunks of 4: another product's rows
        y = qmm.matmul(x, qw, dw, mw, 48)
    assert torch.equal(y, qmm.matmul(x, qw, dw, mw, 48))


def test_padding_is_declared_per_thread_and_restored_on_exit(packed):
    import threading

    _, (qw, dw, mw) = packed
    x = _x(4, 96, seed=13)
    seen = {}
    with qmm.padded_rows(4, 2):
        worker = threading.Thread(target=lambda: seen.setdefault(
            "other", qmm.matmul(x, qw, dw, mw, 48)))
        worker.start()
        worker.join()
        with qmm.padded_rows(4, 1):
            pass
        inner = qmm.matmul(x, qw, dw, mw, 48)
    assert torch.equal(seen["other"], qmm.matmul(x, qw, dw, mw, 48))  # no padding there
    assert inner[:2].any() and not inner[2:].any()  # the outer declaration is back


@pytest.mark.parametrize("bits", qmm.BITS)
@pytest.mark.parametrize("kind", ["q4", "q8"])
def test_the_ops_cpp_kernel_gives_the_librarys_bits(packed, packed8, bits, kind):
    qw, dw, mw = (packed if kind == "q4" else packed8)[1]
    x = _x(11, 96, seed=14)
    op = torch.ops.specviz.qmm.default
    first = op(x, qw, dw, mw, 48, bits)  # the Python kernel, which loads the C++ one
    assert qmm.native_op() is not None and qmm._OP.lib is not None
    want = qmm.run_with(qmm.library(), x, qw, dw, mw, 48, bits)
    assert torch.equal(first, want)
    assert torch.equal(op(x, qw, dw, mw, 48, bits), want)  # the C++ kernel


def test_the_ops_cpp_kernel_skips_the_padding_of_its_own_thread_only(packed):
    import threading

    _, (qw, dw, mw) = packed
    op = torch.ops.specviz.qmm.default
    op(_x(1, 96, seed=15), qw, dw, mw, 48)  # loaded
    x = _x(8, 96, seed=16)
    seen = {}
    with qmm.padded_rows(4, 1):
        worker = threading.Thread(target=lambda: seen.setdefault("other", op(x, qw, dw, mw, 48)))
        worker.start()
        worker.join()
        y = op(x, qw, dw, mw, 48)
    every = op(x, qw, dw, mw, 48)  # the declaration is gone on exit
    assert torch.equal(y, qmm.run_with(qmm.library(), x, qw, dw, mw, 48) * torch.tensor(
        [1.0, 0, 0, 0, 1, 0, 0, 0])[:, None])  # rows 0 and 4 real, the rest 0
    assert torch.equal(seen["other"], every) and every[1:4].any()


def test_a_bad_input_to_the_ops_cpp_kernel_is_refused_in_one_line(packed, packed8):
    _, (qw, dw, mw) = packed
    op = torch.ops.specviz.qmm.default
    op(_x(1, 96, seed=17), qw, dw, mw, 48)  # loaded
    with pytest.raises(RuntimeError, match="does not fit a packed weight of 48 rows"):
        op(_x(2, 64, seed=18), qw, dw, mw, 48)
    with pytest.raises(RuntimeError, match="does not fit a packed weight of 48 rows"):
        op(_x(2, 96, seed=18), qw, dw, None, 48)  # Q4_1 bytes read as a Q8_0 weight
    with pytest.raises(ValueError, match="does not fit"):
        qmm.run_with(qmm.library(), _x(2, 96, seed=18), *packed8[1][:2], mw, 48)


def test_a_build_that_hangs_fails_or_cannot_start_falls_back_with_its_reason(monkeypatch,
                                                                               tmp_path, caplog):
    """build_first: the OpenMP variant failing runs the plain one; a compiler past its timeout
    or one that cannot start ends in a reason (and the caller's fallback: no library, the op's
    Python kernel), never a traceback. A wrong builder that let the timeout through would
    raise here."""
    import subprocess

    calls = []

    def run(cmd, **kw):
        calls.append(cmd)
        if "fail-omp" in cmd and qmm.OPENMP in cmd:
            return subprocess.CompletedProcess(cmd, 1, "", "error: no omp.h\n")
        if "hang" in cmd:
            raise subprocess.TimeoutExpired(cmd, kw["timeout"])
        if "absent" in cmd:
            raise FileNotFoundError(2, "No such file or directory")
        return subprocess.CompletedProcess(cmd, 0, "", "")

    def variants(tag: str) -> list:  # OpenMP first, then without: two commands each
        return [[["cc", tag, *extra], ["c++", tag]] for extra in ((qmm.OPENMP,), ())]

    monkeypatch.setattr(subprocess, "run", run)
    assert qmm.build_first(variants("fail-omp"), timeout=5) == ""
    assert calls == [["cc", "fail-omp", qmm.OPENMP], ["cc", "fail-omp"], ["c++", "fail-omp"]]
    assert qmm.build_first(variants("hang"), timeout=5) == "cc ran past 5 s"
    assert "did not start" in qmm.build_first(variants("absent"), timeout=5)
    monkeypatch.setattr(qmm, "_cc", lambda: "hang")
    with caplog.at_level("WARNING"):
        assert qmm.compile_native(qmm.SOURCE, tmp_path / "q.so") is None
        assert not qmm._build_op(tmp_path / "op.so")
    assert "ran past 300 s" in caplog.text and "ran past 600 s" in caplog.text
    assert list(tmp_path.iterdir()) == []  # no half-built library left behind


@pytest.mark.parametrize("kind", ["q4", "q8"])
def test_a_product_of_no_rows_is_an_empty_result_not_an_error(packed, packed8, kind):
    qw, dw, mw = (packed if kind == "q4" else packed8)[1]
    x = torch.zeros(0, 96)  # (0, K): its data pointer may be NULL
    for bits in qmm.BITS:
        assert qmm.run_with(qmm.library(), x, qw, dw, mw, 48, bits).shape == (0, 48)
        assert torch.ops.specviz.qmm(x, qw, dw, mw, 48, bits).shape == (0, 48)
