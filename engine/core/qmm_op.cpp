// specviz::qmm's CPU kernel in C++ (engine/core/qmm.py `native_op`): torch's dispatcher calls
// qmm.c's product (linked into this library, built with qmm.c's own flags: the same bits)
// without Python, where the Python kernel of the op (qmm.py) passes a Python function, its
// checks and a ctypes call with 11 converted arguments: about 12 % of a compiled one-row step
// on an AVX512 Xeon (docs/benchmarks.md, "The op's kernel in C++").
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <cstdint>

extern "C" {
int qmm_q4(const float *x, int64_t R, int64_t K, const uint8_t *qw, const uint16_t *dw,
           const uint16_t *mw, float *y, int64_t N, int threads, int64_t period, int64_t live);
int qmm_q4_a8(const float *x, int64_t R, int64_t K, const uint8_t *qw, const uint16_t *dw,
              const uint16_t *mw, float *y, int64_t N, int threads, int64_t period,
              int64_t live);
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

TORCH_LIBRARY_IMPL(specviz, CPU, m) { m.impl("qmm", qmm_cpu); }
