// The CPU kernels in C++ of the ops a compiled step calls (engine/kernels/qmm.py `native_op`):
// specviz::qmm (qmm.c's product) and specviz::rowattn (rowattn.c's attention), both linked
// into this library and built with their libraries' own flags (the same bits), and
// specviz::rmsnorm / specviz::rotary (engine/kernels/eager_bits.py: the stock modules' formulas
// with ATen's roundings, so a compiled step rounds as an eager one). Torch's
// dispatcher reaches them without Python, where the ops' Python kernels pass a Python
// function, its checks and a ctypes call: for qmm about 12 % of a compiled one-row step on an
// AVX512 Xeon (docs/benchmarks.md, "The op's kernel in C++"), for rowattn's 30 calls a step
// some 3 % of a compiled `sd` run ("The ratio on the compiled path, looked at again").
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <cmath>
#include <cstdint>

extern "C" {
int qmm_q4(const float *x, int64_t R, int64_t K, const uint8_t *qw, const uint16_t *dw,
           const uint16_t *mw, float *y, int64_t N, int threads, int64_t period, int64_t live);
int qmm_q4_a8(const float *x, int64_t R, int64_t K, const uint8_t *qw, const uint16_t *dw,
              const uint16_t *mw, float *y, int64_t N, int threads, int64_t period,
              int64_t live);
int rowattn(const float *q, const float *k, const float *v, const float *mask,
            const int64_t *strides, float *out, int64_t W, int64_t H, int64_t KV, int64_t Q,
            int64_t S, int64_t D, float scale);
}

// this thread's padding (qmm.py `padded_rows`, which sets it here too once this is loaded)
static thread_local int64_t padding_period = 0, padding_live = 0;

extern "C" void qmm_op_set_padding(int64_t period, int64_t live) {
    padding_period = period;
    padding_live = live;
}

// x (R, K) fp32 times the packed weight (N, K), activations quantised to `bits` -> (R, N) fp32
static at::Tensor qmm_cpu(const at::Tensor &x, const at::Tensor &qw, const at::Tensor &dw,
                          const at::Tensor &mw, int64_t n, int64_t bits) {
    TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat && (bits == 8 || bits == 16) &&
                    x.size(1) % 32 == 0 && qw.numel() * 2 == n * x.size(1) &&
                    qw.is_contiguous() && dw.is_contiguous() && mw.is_contiguous(),
                "qmm: x ", x.sizes(), " ", x.scalar_type(), " at ", bits,
                " bits does not fit a packed weight of ", n, " rows");
    const at::Tensor xc = x.contiguous();
    const int64_t r = xc.size(0), k = xc.size(1);
    at::Tensor y = at::empty({r, n}, xc.options());
    const auto product = bits == 16 ? qmm_q4 : qmm_q4_a8;
    const int rc = product(xc.data_ptr<float>(), r, k, static_cast<const uint8_t *>(qw.data_ptr()),
                           static_cast<const uint16_t *>(dw.data_ptr()),
                           static_cast<const uint16_t *>(mw.data_ptr()), y.data_ptr<float>(), n,
                           at::get_num_threads(), padding_period, padding_live);
    TORCH_CHECK(rc == 0, "qmm: no scratch memory for the activations");
    return y;
}

// rowattn.py `attend` without Python: query (W, H, Q, D), key / value (W, KV, S, D) fp32 on the
// CPU (any strides, the last dimension made contiguous), an additive fp32 mask broadcasting to
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
                    q.scalar_type() == at::kFloat && k.scalar_type() == at::kFloat &&
                    v.scalar_type() == at::kFloat,
                "rowattn: query ", query.sizes(), ", key ", key.sizes(), ", value ",
                value.sizes(), " do not fit (fp32 on the CPU)");
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
    const int rc = rowattn(q.data_ptr<float>(), k.data_ptr<float>(), v.data_ptr<float>(),
                           m.data_ptr<float>(), strides, out.data_ptr<float>(), W, H, KV, Q, S,
                           D, static_cast<float>(scale));
    TORCH_CHECK(rc == 0, "rowattn: no scratch memory");
    return out;
}

// eager_bits.py `rmsnorm` without Python: the stock RMSNorm's formula in its order, so a compiled
// step's norms round as the eager step's (inductor's fused mean does not). For fp32 contiguous
// input (a step's norms) the mean of squares is ATen's (its reduction order is what inductor
// changes) and the rest one loop whose every operation rounds once in fp32 as ATen's does
// (var + (float)eps, a correctly rounded sqrt and divide for rsqrt, the two products in the
// stock order): ATen's bits in 2 ATen calls instead of 7 (tests/model/test_eager_bits.py)
static at::Tensor rmsnorm_cpu(const at::Tensor &x, const at::Tensor &weight, double eps) {
    const int64_t d = x.dim() ? x.size(-1) : 0;
    if (x.scalar_type() == at::kFloat && weight.scalar_type() == at::kFloat && x.is_cpu() &&
        weight.is_cpu() && x.is_contiguous() && weight.is_contiguous() && weight.dim() == 1 &&
        weight.size(0) == d && d > 0) {
        const at::Tensor variance = x.pow(2).mean(-1, /*keepdim=*/true).contiguous();  // (..., 1)
        at::Tensor out = at::empty_like(x);
        const float *xp = x.data_ptr<float>(), *wp = weight.data_ptr<float>(),
                    *vp = variance.data_ptr<float>();
        float *op = out.data_ptr<float>();
        const float e = static_cast<float>(eps);  // ATen adds a double scalar in fp32
        for (int64_t r = 0, rows = x.numel() / d; r < rows; r++) {
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
