// The CPU kernels in C++ of the ops a compiled step calls (engine/kernels/qmm.py `native_op`):
// specviz::qmm (qmm.c's product) and specviz::rowattn (rowattn.c's attention), both linked
// into this library and built with their libraries' own flags (the same bits), and
// specviz::rmsnorm / specviz::rotary (engine/kernels/eager_bits.py: the stock modules' formulas
// with ATen's roundings, so a compiled step rounds as an eager one). Torch's
// dispatcher reaches them without Python, where the ops' Python kernels pass a Python
// function, its checks and a ctypes call: for qmm about 12 % of a compiled one-row step on an
// AVX512 Xeon (docs/benchmarks.md, "The op's kernel in C++"), for rowattn's 30 calls a step
// some 3 % of a compiled `sd` run ("The op's kernel in C++").
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <map>
#include <mutex>
#include <vector>

extern "C" {
int qmm_q4(const float *x, int64_t R, int64_t K, const uint8_t *qw, const uint16_t *dw,
           const uint16_t *mw, float *y, int64_t N, int threads, int64_t period, int64_t live);
int qmm_q4_a8(const float *x, int64_t R, int64_t K, const uint8_t *qw, const uint16_t *dw,
              const uint16_t *mw, float *y, int64_t N, int threads, int64_t period,
              int64_t live);
int qmm_q8(const float *x, int64_t R, int64_t K, const uint8_t *qw, const uint16_t *dw,
           float *y, int64_t N, int threads, int64_t period, int64_t live);
int qmm_q8_a8(const float *x, int64_t R, int64_t K, const uint8_t *qw, const uint16_t *dw,
              float *y, int64_t N, int threads, int64_t period, int64_t live);
int rowattn(const float *q, const void *k, const void *v, const float *mask,
            const int64_t *strides, float *out, int64_t W, int64_t H, int64_t KV, int64_t Q,
            int64_t S, int64_t D, float scale, int half);
}

// this thread's padding (qmm.py `padded_rows`, which sets it here too once this is loaded)
static thread_local int64_t padding_period = 0, padding_live = 0;

extern "C" void qmm_op_set_padding(int64_t period, int64_t live) {
    padding_period = period;
    padding_live = live;
}

// x (R, K) fp32 times the packed weight (N, K), activations quantised to `bits` -> (R, N) fp32;
// the weight Q4_1 (qw, dw, mw: N K / 2 bytes) or, without mw, Q8_0 (N K bytes)
static at::Tensor qmm_cpu(const at::Tensor &x, const at::Tensor &qw, const at::Tensor &dw,
                          const std::optional<at::Tensor> &mw, int64_t n, int64_t bits) {
    const bool q8 = !mw.has_value();
    TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat && (bits == 8 || bits == 16) &&
                    x.size(1) % 32 == 0 && qw.numel() * (q8 ? 1 : 2) == n * x.size(1) &&
                    qw.is_contiguous() && dw.is_contiguous() && (q8 || mw->is_contiguous()),
                "qmm: x ", x.sizes(), " ", x.scalar_type(), " at ", bits,
                " bits does not fit a packed weight of ", n, " rows");
    const at::Tensor xc = x.contiguous();
    const int64_t r = xc.size(0), k = xc.size(1);
    at::Tensor y = at::empty({r, n}, xc.options());
    const auto *w = static_cast<const uint8_t *>(qw.data_ptr());
    const auto *d = static_cast<const uint16_t *>(dw.data_ptr());
    const int threads = at::get_num_threads();
    const int rc =
        q8 ? (bits == 16 ? qmm_q8 : qmm_q8_a8)(xc.data_ptr<float>(), r, k, w, d,
                                               y.data_ptr<float>(), n, threads,
                                               padding_period, padding_live)
           : (bits == 16 ? qmm_q4 : qmm_q4_a8)(
                 xc.data_ptr<float>(), r, k, w, d,
                 static_cast<const uint16_t *>(mw->data_ptr()), y.data_ptr<float>(), n,
                 threads, padding_period, padding_live);
    TORCH_CHECK(rc == 0, "qmm: no scratch memory for the activations");
    return y;
}

// rowattn.py `attend` without Python: query (W, H, Q, D) fp32, key / value (W, KV, S, D) both fp16
// or both fp32 (read rounded to half), on the CPU (any strides, the last dimension made
// contiguous), an additive fp32 mask broadcasting to
// (W, 1, Q, S) (a longer last dimension cut to S) -> (W, Q, H, D) fp32
static at::Tensor rowattn_cpu(const at::Tensor &query, const at::Tensor &key,
                              const at::Tensor &value, const at::Tensor &mask, double scale) {
    TORCH_CHECK(query.dim() == 4 && key.dim() == 4 && value.dim() == 4, "rowattn: query ",
                query.sizes(), ", key ", key.sizes(), ", value ", value.sizes(),
                " do not fit (fp32 on the CPU)");
    const at::Tensor q = query.stride(3) == 1 ? query : query.contiguous();
    const at::Tensor k = key.stride(3) == 1 ? key : key.contiguous();
    const at::Tensor v = value.stride(3) == 1 ? value : value.contiguous();
    const int64_t W = q.size(0), H = q.size(1), Q = q.size(2), D = q.size(3);
    const int64_t KV = k.size(1), S = k.size(2);
    TORCH_CHECK(k.size(0) == W && k.size(3) == D && v.sizes() == k.sizes() && KV != 0 &&
                    H % KV == 0 && q.is_cpu() && k.is_cpu() && v.is_cpu() && mask.is_cpu() &&
                    q.scalar_type() == at::kFloat &&
                    (k.scalar_type() == at::kFloat || k.scalar_type() == at::kHalf) &&
                    v.scalar_type() == k.scalar_type(),
                "rowattn: query ", query.sizes(), ", key ", key.sizes(), ", value ",
                value.sizes(), " do not fit (an fp32 query, fp16 or fp32 keys and values, on "
                "the CPU)");
    TORCH_CHECK(mask.dim() == 4 && mask.size(1) == 1 && mask.size(3) >= S, "rowattn: a mask ",
                mask.sizes(), " for ", W, " x ", Q, " rows over ", S, " slots");
    at::Tensor m = mask.size(3) == S ? mask : mask.narrow(3, 0, S);
    if (m.scalar_type() != at::kFloat || m.stride(3) != 1) m = m.to(at::kFloat).contiguous();
    if (m.size(0) != W || m.size(2) != Q) m = m.expand({W, 1, Q, S});  // stride 0 where broadcast
    at::Tensor out = at::empty({W, Q, H, D}, q.options());
    int64_t strides[16];
    const at::Tensor *parts[4] = {&q, &k, &v, &m};
    for (int t = 0; t < 4; t++)
        for (int d = 0; d < 4; d++) strides[4 * t + d] = parts[t]->stride(d);
    const int rc = rowattn(q.data_ptr<float>(), k.data_ptr(), v.data_ptr(), m.data_ptr<float>(),
                           strides, out.data_ptr<float>(), W, H, KV, Q, S, D,
                           static_cast<float>(scale), k.scalar_type() == at::kHalf);
    TORCH_CHECK(rc == 0, "rowattn: no scratch memory");
    return out;
}

// ATen's CPU sum of one contiguous fp32 row, lane by lane: cascade_sum's vectorized_inner_sum
// over Vectorized<float> of L lanes (row_sum's 4 accumulators of multi_row_sum's 4 cascade
// levels, the leftover vectors into the first, the 4 summed, then the scalar tail and the lanes
// in order), every addition an fp32 one as ATen's. Only where `aten_sum_lanes` found it gives
// ATen's bits on this build (torch registers the sum for AVX2 and not AVX512: 8 lanes on both).
static int64_t ceil_log2(int64_t x) {  // c10's CeilLog2
    if (x <= 2) return 1;
    return 64 - __builtin_clzll(static_cast<uint64_t>(x - 1));
}

template <int L>
__attribute__((optimize("fp-contract=off"))) static float aten_row_sum(const float *x,
                                                                       int64_t n) {
    const int64_t vecs = n / L, size = vecs / 4;  // vectors; rows of 4 vectors (ilp_factor)
    float acc[4][4][L] = {};                      // [level][accumulator][lane]
    const int64_t power = std::max<int64_t>(4, ceil_log2(size) / 4), step = int64_t(1) << power;
    const int64_t mask = step - 1;
    int64_t i = 0;
    while (i + step <= size) {
        for (int64_t j = 0; j < step; ++j, ++i)
            for (int k = 0; k < 4; k++)
                for (int l = 0; l < L; l++) acc[0][k][l] += x[(4 * i + k) * L + l];
        for (int j = 1; j < 4; ++j) {
            for (int k = 0; k < 4; k++)
                for (int l = 0; l < L; l++) {
                    acc[j][k][l] += acc[j - 1][k][l];
                    acc[j - 1][k][l] = 0.0f;
                }
            if ((i & (mask << (j * power))) != 0) break;
        }
    }
    for (; i < size; ++i)
        for (int k = 0; k < 4; k++)
            for (int l = 0; l < L; l++) acc[0][k][l] += x[(4 * i + k) * L + l];
    for (int j = 1; j < 4; ++j)
        for (int k = 0; k < 4; k++)
            for (int l = 0; l < L; l++) acc[0][k][l] += acc[j][k][l];
    for (int64_t v = size * 4; v < vecs; ++v)
        for (int l = 0; l < L; l++) acc[0][0][l] += x[v * L + l];
    for (int k = 1; k < 4; k++)
        for (int l = 0; l < L; l++) acc[0][0][l] += acc[0][k][l];
    float total = 0.0f;
    for (int64_t t = vecs * L; t < n; ++t) total += x[t];
    for (int l = 0; l < L; l++) total += acc[0][0][l];
    return total;
}

// the mean of squares of `rows` rows of d (x * x, then the row's sum as ATen's over L lanes,
// then / d): x.pow(2).mean(-1)'s bits where `aten_sum_lanes` chose L
template <int L>
__attribute__((optimize("fp-contract=off"))) static void mean_squares(const float *x,
                                                                      int64_t rows, int64_t d,
                                                                      float *out) {
    std::vector<float> sq(static_cast<size_t>(d));
    for (int64_t r = 0; r < rows; r++) {
        for (int64_t i = 0; i < d; i++) sq[i] = x[r * d + i] * x[r * d + i];
        out[r] = aten_row_sum<L>(sq.data(), d) / static_cast<float>(d);
    }
}

// Which lane count gives ATen's bits for rows of d here (8 or 16), or 0: none (then ATen's
// own ops run). Checked once per d on 64 rows of a fixed pseudo-random spread of magnitudes
// (no torch generator is drawn from) against x.pow(2).mean(-1).
static int aten_sum_lanes(int64_t d) {
    static std::mutex lock;
    static std::map<int64_t, int> known;
    std::lock_guard<std::mutex> guard(lock);
    const auto it = known.find(d);
    if (it != known.end()) return it->second;
    const int64_t rows = 64;
    at::Tensor x = at::empty({rows, d}, at::kFloat);
    float *xp = x.data_ptr<float>();
    uint64_t state = 0x9E3779B97F4A7C15ull;
    for (int64_t i = 0; i < rows * d; i++) {
        state = state * 6364136223846793005ull + 1442695040888963407ull;
        const double u = static_cast<double>(state >> 11) / 9007199254740992.0;  // [0, 1)
        xp[i] = static_cast<float>((u - 0.5) * std::ldexp(1.0, static_cast<int>(i % 13) - 6));
    }
    const at::Tensor ref = x.pow(2).mean(-1).contiguous();  // (rows,)
    std::vector<float> mine(static_cast<size_t>(rows));
    int lanes = 0;
    for (const int L : {8, 16}) {
        if (L == 8) mean_squares<8>(xp, rows, d, mine.data());
        else mean_squares<16>(xp, rows, d, mine.data());
        if (std::memcmp(mine.data(), ref.data_ptr<float>(), sizeof(float) * rows) == 0) {
            lanes = L;
            break;
        }
    }
    known[d] = lanes;
    return lanes;
}

// for the tests: the lane count rmsnorm_cpu sums rows of d with (0: ATen's ops)
extern "C" int specviz_sum_lanes(int64_t d) { return aten_sum_lanes(d); }

// eager_bits.py `rmsnorm` without Python: the stock RMSNorm's formula in its order, so a compiled
// step's norms round as the eager step's (inductor's fused mean does not). For fp32 contiguous
// input (a step's norms) the mean of squares has ATen's bits, computed here in ATen's order
// (`aten_sum_lanes`; else by ATen: 2 ATen calls of about 10 us each for a 576-wide row, 61
// norms a step) and the rest one loop whose every operation rounds once in fp32 as ATen's does
// (var + (float)eps, a correctly rounded sqrt and divide for rsqrt, the two products in the
// stock order): ATen's bits (tests/model/test_eager_bits.py)
static at::Tensor rmsnorm_cpu(const at::Tensor &x, const at::Tensor &weight, double eps) {
    const int64_t d = x.dim() ? x.size(-1) : 0;
    if (x.scalar_type() == at::kFloat && weight.scalar_type() == at::kFloat && x.is_cpu() &&
        weight.is_cpu() && x.is_contiguous() && weight.is_contiguous() && weight.dim() == 1 &&
        weight.size(0) == d && d > 0) {
        const int64_t rows = x.numel() / d;
        const float *xp = x.data_ptr<float>(), *wp = weight.data_ptr<float>();
        std::vector<float> var(static_cast<size_t>(rows));
        const int lanes = aten_sum_lanes(d);
        at::Tensor variance;  // (..., 1) where ATen computes it
        if (lanes == 8) mean_squares<8>(xp, rows, d, var.data());
        else if (lanes == 16) mean_squares<16>(xp, rows, d, var.data());
        else variance = x.pow(2).mean(-1, /*keepdim=*/true).contiguous();
        const float *vp = lanes ? var.data() : variance.data_ptr<float>();
        at::Tensor out = at::empty_like(x);
        float *op = out.data_ptr<float>();
        const float e = static_cast<float>(eps);  // ATen adds a double scalar in fp32
        for (int64_t r = 0; r < rows; r++) {
            const float s = 1.0f / std::sqrt(vp[r] + e);  // rsqrt: correctly rounded sqrt, divide
            for (int64_t i = 0; i < d; i++) op[r * d + i] = wp[i] * (xp[r * d + i] * s);
        }
        return out;
    }
    at::Tensor h = x.to(at::kFloat);
    const at::Tensor variance = h.pow(2).mean(-1, /*keepdim=*/true);
    h = h * at::rsqrt(variance + eps);
    return weight * h.to(x.scalar_type());
}

// eager_bits.py `rotary`: the stock default rotary embedding's cos and sin (ATen's, not
// inductor's vectorised functions)
static std::tuple<at::Tensor, at::Tensor> rotary_cpu(const at::Tensor &position_ids,
                                                     const at::Tensor &inv_freq, double scaling,
                                                     const at::Tensor &like) {
    const at::Tensor freqs = position_ids.unsqueeze(-1).to(at::kFloat) *
                             inv_freq.to(like.device(), at::kFloat);  // (W, q, d / 2)
    const at::Tensor emb = at::cat({freqs, freqs}, -1);                // (W, q, d)
    const at::Tensor cos = emb.cos() * scaling, sin = emb.sin() * scaling;
    return {cos.to(like.scalar_type()), sin.to(like.scalar_type())};
}

TORCH_LIBRARY_IMPL(specviz, CPU, m) {
    m.impl("qmm", qmm_cpu);
    m.impl("rowattn", rowattn_cpu);
    m.impl("rmsnorm", rmsnorm_cpu);
    m.impl("rotary", rotary_cpu);
}
