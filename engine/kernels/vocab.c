/* Vocabulary-sized reads of logits rows on the CPU, one call each (engine/kernels/vocab.py
 * builds this file with engine/kernels/qmm.py's builder and calls it through ctypes):
 *
 * vocab_argmax: the index of the first maximum of a vector, the first NaN where it holds one
 *   (torch.argmax's answer): one pass for the maximum and the NaN count, then the first chunk
 *   of CHUNK entries that holds it, scanned.
 * vocab_top: each row's k largest entries, largest first (the lower index first among equal
 *   ones), and their softmax probabilities exp(x_i - max) / z, z = sum_j exp(x_j - max) summed
 *   in double. The k largest are kept sorted while a chunk of CHUNK entries is counted against
 *   the k-th largest so far and scanned only where one entry passes it (a few chunks a row).
 *   z's terms take exp_nonpos below (Cody-Waite reduction and Cephes' degree-6 polynomial,
 *   within 1e-7 relative of exp on [-87, 0]), the k numerators libm's exp of the difference in
 *   double: each probability is within about 3e-7 relative of a float64 softmax (torch's
 *   float32 softmax: up to 2e-6, its differences x - max rounded in float32).
 *
 * Both run the whole row in compiled loops: a torch version of the same work is some twenty
 * operator calls, and right after a forward (which streams the weights through the caches)
 * each of them ran 5-10x its warm time (docs/benchmarks.md, "The round's vocabulary reads").
 * The loops' reductions are `omp simd` ones: vectorised where the build has OpenMP (the
 * builder's first variant), scalar and correct without it. z's pass is the exception: the
 * compilers leave exp_nonpos's rounding scalar inside it (about 8 ns an entry, 0.4 ms of a
 * 49,152-entry row on a Zen 1 EPYC), so where the machine has AVX2 (and VOCAB_PLAIN is not
 * defined: tests compare the paths) z_sum runs the same steps eight entries at a time (the
 * same float operations, none fused, so each term is the scalar one's; the terms summed in
 * double in another order): about 35 us there.
 */
#include <math.h>
#include <stdint.h>
#if defined(__AVX2__) && !defined(VOCAB_PLAIN)
#include <immintrin.h>
#define VOCAB_AVX2 1
#endif

#define CHUNK 64 /* entries counted together before any is looked at one by one */
#define MAX_K 64 /* the most entries vocab_top keeps a row */

/* exp(y) for y <= 0 (below -87: exp(-87), 1.6e-38, where it adds nothing to a sum) */
static inline float exp_nonpos(float y) {
    y = y < -87.0f ? -87.0f : y;
    float fn = rintf(y * 1.44269504088896341f); /* y = fn ln2 + r, |r| <= ln2 / 2 */
    float r = y - fn * 0.693359375f;
    r = r - fn * -2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * (r * r) + r + 1.0f;
    union {
        int32_t i;
        float f;
    } two;
    two.i = ((int32_t)fn + 127) << 23; /* 2^fn, fn >= -126 */
    return p * two.f;
}

#ifdef VOCAB_AVX2
/* exp_nonpos(v[i] - top) of eight entries: its steps in its order, none fused */
static inline __m256 exp8(const float *v, __m256 top) {
    __m256 y = _mm256_max_ps(_mm256_sub_ps(_mm256_loadu_ps(v), top), _mm256_set1_ps(-87.0f));
    __m256 fn = _mm256_round_ps(_mm256_mul_ps(y, _mm256_set1_ps(1.44269504088896341f)),
                                _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_sub_ps(y, _mm256_mul_ps(fn, _mm256_set1_ps(0.693359375f)));
    r = _mm256_sub_ps(r, _mm256_mul_ps(fn, _mm256_set1_ps(-2.12194440e-4f)));
    __m256 p = _mm256_set1_ps(1.9875691500e-4f);
    p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(1.3981999507e-3f));
    p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(8.3334519073e-3f));
    p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(4.1665795894e-2f));
    p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(1.6666665459e-1f));
    p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(5.0000001201e-1f));
    p = _mm256_add_ps(_mm256_add_ps(_mm256_mul_ps(p, _mm256_mul_ps(r, r)), r),
                      _mm256_set1_ps(1.0f));
    __m256i e = _mm256_slli_epi32(
        _mm256_add_epi32(_mm256_cvtps_epi32(fn), _mm256_set1_epi32(127)), 23); /* 2^fn */
    return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}

/* the sum of eight floats' widening to double, into two accumulators of four */
static inline void add8(__m256d *a, __m256d *b, __m256 x) {
    *a = _mm256_add_pd(*a, _mm256_cvtps_pd(_mm256_castps256_ps128(x)));
    *b = _mm256_add_pd(*b, _mm256_cvtps_pd(_mm256_extractf128_ps(x, 1)));
}
#endif

/* sum_i exp_nonpos(v[i] - top) over n entries, in double */
static double z_sum(const float *v, int64_t n, float top) {
    double z = 0.0;
    int64_t i = 0;
#ifdef VOCAB_AVX2
    const __m256 t = _mm256_set1_ps(top);
    __m256d za = _mm256_setzero_pd(), zb = _mm256_setzero_pd();
    __m256d zc = _mm256_setzero_pd(), zd = _mm256_setzero_pd();
    for (; i + 16 <= n; i += 16) { /* two independent chains a step */
        add8(&za, &zb, exp8(v + i, t));
        add8(&zc, &zd, exp8(v + i + 8, t));
    }
    for (; i + 8 <= n; i += 8) add8(&za, &zb, exp8(v + i, t));
    double part[4];
    _mm256_storeu_pd(part, _mm256_add_pd(_mm256_add_pd(za, zb), _mm256_add_pd(zc, zd)));
    z = (part[0] + part[1]) + (part[2] + part[3]);
#endif
#pragma omp simd reduction(+ : z)
    for (; i < n; i++) z += (double)exp_nonpos(v[i] - top);
    return z;
}

/* the n terms z_sum adds, exp_nonpos(v[i] - top), into out (n,): the same path, so a test can
 * compare a build's terms bit for bit with the plain C build's */
void vocab_exp_terms(const float *v, int64_t n, float top, float *out) {
    int64_t i = 0;
#ifdef VOCAB_AVX2
    const __m256 t = _mm256_set1_ps(top);
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(out + i, exp8(v + i, t));
#endif
    for (; i < n; i++) out[i] = exp_nonpos(v[i] - top);
}

int64_t vocab_argmax(const float *x, int64_t n) {
    int32_t nans = 0;
    float m = -INFINITY;
#pragma omp simd reduction(+ : nans) reduction(max : m)
    for (int64_t i = 0; i < n; i++) {
        nans += x[i] != x[i];
        m = x[i] > m ? x[i] : m;
    }
    for (int64_t c = 0; c < n; c += CHUNK) {
        int64_t end = c + CHUNK < n ? c + CHUNK : n;
        int32_t hits = 0;
#pragma omp simd reduction(+ : hits)
        for (int64_t i = c; i < end; i++) hits += nans ? x[i] != x[i] : x[i] == m;
        if (!hits) continue;
        for (int64_t i = c; i < end; i++)
            if (nans ? x[i] != x[i] : x[i] == m) return i;
    }
    return 0; /* n == 0 */
}

/* rows x (m, n), row r at x + r * stride: ids (m, k) and probs (m, k) as above. Returns 0; 1
 * where a row's maximum is not finite (a NaN in it, or every entry -inf), 2 where k is not in
 * 1..min(n, MAX_K): the caller takes the softmax then (its outputs are left unwritten). */
int vocab_top(const float *x, int64_t m, int64_t n, int64_t stride, int64_t k, int64_t *ids,
              float *probs) {
    if (k < 1 || k > MAX_K || k > n) return 2;
    for (int64_t row = 0; row < m; row++) {
        const float *v = x + row * stride;
        float val[MAX_K];
        int64_t idx[MAX_K];
        int64_t have = 0;
        float kth = -INFINITY; /* the k-th largest so far, once k are held */
        int32_t nans = 0;
        for (int64_t c = 0; c < n; c += CHUNK) {
            int64_t end = c + CHUNK < n ? c + CHUNK : n;
            int32_t over = 0;
#pragma omp simd reduction(+ : over, nans)
            for (int64_t i = c; i < end; i++) {
                over += v[i] > kth;
                nans += v[i] != v[i];
            }
            if (!over && have == k) continue;
            for (int64_t i = c; i < end; i++) {
                float e = v[i];
                if (e != e || (have == k && !(e > kth))) continue;
                int64_t j = have < k ? have++ : k - 1; /* the last kept one drops out */
                while (j > 0 && val[j - 1] < e) { /* an equal one stays ahead */
                    val[j] = val[j - 1];
                    idx[j] = idx[j - 1];
                    j--;
                }
                val[j] = e;
                idx[j] = i;
                if (have == k) kth = val[k - 1];
            }
        }
        float top = val[0];
        if (nans || have < k || !isfinite(top)) return 1;
        double z = z_sum(v, n, top);
        for (int64_t j = 0; j < k; j++) {
            ids[row * k + j] = idx[j];
            probs[row * k + j] = (float)(exp((double)val[j] - (double)top) / z);
        }
    }
    return 0;
}
