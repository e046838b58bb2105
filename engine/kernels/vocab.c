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
 * builder's first variant), scalar and correct without it.
 */
#include <math.h>
#include <stdint.h>

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
        double z = 0.0;
#pragma omp simd reduction(+ : z)
        for (int64_t i = 0; i < n; i++) z += (double)exp_nonpos(v[i] - top);
        for (int64_t j = 0; j < k; j++) {
            ids[row * k + j] = idx[j];
            probs[row * k + j] = (float)(exp((double)val[j] - (double)top) / z);
        }
    }
    return 0;
}
