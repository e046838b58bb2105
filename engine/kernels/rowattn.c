/* Attention whose every output row depends on that row's query and the slots its mask lets it
 * see, and on nothing else: not on the other query rows of the forward, nor on hidden slots.
 * engine/kernels/rowattn.py builds this file (engine/kernels/qmm.py's builder) and calls it for the
 * eager forwards of a packed CPU target (engine/kernels/attention.py).
 *
 * Keys and values are IEEE half precision: stored so (a static buffer of fp16 slots: half the
 * bytes each step reads), or fp32 rounded to half (to nearest, ties to even) as they are read,
 * so that an fp32 cache (generate()'s) and an fp16 one give the same bits; every product and sum
 * is fp32 (llama.cpp's default cache type, f16, with fp32 arithmetic).
 *
 * For query row i of head h (key/value head g = h / (H / KV)), over the slots j whose mask
 * value is not hidden (-inf or the lowest finite float, as the engine's masks write it):
 *   s_j = dot(q, k_j) * scale + mask[i, j];  m = max_j s_j;  e_j = exp_neg(s_j - m);
 *   out = acc / sum,  sum = lanesum_j e_j,  acc[d] = sum_j e_j v_j[d] (slot order, fmaf).
 * dot(a, b): 8 lanes (lane k: the fused multiply-adds of the d = k mod 8, in order of d)
 * reduced as ((l0 + l1) + (l2 + l3)) + ((l4 + l5) + (l6 + l7)); lanesum the same over lanes
 * t mod 8, t the slot's place among the row's visible slots (not its position: a draft node
 * that sees its ancestors at slots 0, 1 and 3 of a tree sums them as a chain of three, as the
 * one-token steps that committed them would). Hidden slots are skipped in both sums, and a
 * row's loops end at its last visible slot (found once per row, for all its heads: a static
 * buffer's unwritten tail is never read); a row that sees no slot gives 0. The query heads of
 * one key/value head are taken up to three at a time (row_heads): a block of 8 keys is read
 * from L1 after the first head, and a value row is loaded once for all of them; each head's
 * operations stay its own. exp_neg is a
 * polynomial of float operations (below). The AVX2 path and the plain C path (-DROWATTN_PLAIN,
 * or a machine without AVX2, FMA and F16C) do these operations in this order, and round to half
 * alike (F16C's conversions; half_bits and half_value below), so they give the same bits
 * (tests/model/test_rowattn.py).
 */
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#if !defined(ROWATTN_PLAIN) && defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define VECTOR 1
#include <immintrin.h>
#else
#define VECTOR 0
#endif

#define BIG 12582912.0f /* 1.5 * 2^23: adding and taking it away rounds to an integer */
#define LOG2E 1.44269504088896341f
#define LN2_HI 0.693145751953125f /* ln 2 in two parts, the first exact in 16 bits */
#define LN2_LO 1.428606765330187045e-06f
#define FLOOR (-87.0f) /* below: e^x < 2^-125, taken as 0 */
/* a hidden slot: -inf, or the lowest finite float (the engine's masks and transformers' use it) */
#define HIDDEN(add) ((add) <= -FLT_MAX)

/* e^x for x <= 0: x = n ln2 + r, n = round(x log2 e), |r| <= ln2 / 2; e^r by its Taylor
 * polynomial to r^7 (relative error under 2e-7), times 2^n set in the exponent bits. */
static inline float exp_neg(float x) {
    const float xc = x > FLOOR ? x : FLOOR;
    const float n = (xc * LOG2E + BIG) - BIG;
    float r = fmaf(n, -LN2_HI, xc);
    r = fmaf(n, -LN2_LO, r);
    float p = 1.0f / 5040.0f;
    p = fmaf(p, r, 1.0f / 720.0f);
    p = fmaf(p, r, 1.0f / 120.0f);
    p = fmaf(p, r, 1.0f / 24.0f);
    p = fmaf(p, r, 1.0f / 6.0f);
    p = fmaf(p, r, 0.5f);
    p = fmaf(p, r, 1.0f);
    p = fmaf(p, r, 1.0f);
    union { int32_t i; float f; } two = {.i = ((int32_t)n + 127) << 23};
    return x < FLOOR ? 0.0f : p * two.f;
}

static inline float tree8(const float *l) {
    return ((l[0] + l[1]) + (l[2] + l[3])) + ((l[4] + l[5]) + (l[6] + l[7]));
}

/* fp32 -> IEEE half bits, rounded to nearest, ties to even: F16C's vcvtps2ph with
 * _MM_FROUND_TO_NEAREST_INT for every non-NaN input (compared over all 2^32 patterns); a NaN
 * gives the quiet NaN 0x7e00 with its sign (F16C keeps part of its payload: a NaN either way).
 * Finite values at or above 65520 round to infinity. */
static inline uint16_t half_bits(float x) {
    union { float f; uint32_t u; } v = {.f = x};
    const uint32_t sign = (v.u >> 16) & 0x8000u;
    v.u &= 0x7fffffffu;
    uint16_t h;
    if (v.u >= 0x47800000u) { /* 2^16 and up: infinity, or NaN */
        h = v.u > 0x7f800000u ? 0x7e00u : 0x7c00u;
    } else if (v.u < 0x38800000u) { /* below 2^-14: a subnormal half or zero; adding 0.5 puts
                                      * the half's last bit at the float's (rounding as the
                                      * addition does: to nearest, ties to even) */
        union { uint32_t u; float f; } magic = {.u = 126u << 23};
        v.f += magic.f;
        h = (uint16_t)(v.u - magic.u);
    } else { /* normal: rebias the exponent, round on the 13 bits dropped */
        const uint32_t odd = (v.u >> 13) & 1u;
        v.u += ((uint32_t)(15 - 127) << 23) + 0xfffu + odd;
        h = (uint16_t)(v.u >> 13);
    }
    return (uint16_t)(h | sign);
}

/* IEEE half bits -> fp32 (exact) */
static inline float half_value(uint16_t h) {
    union { uint32_t u; float f; } o;
    const uint32_t sign = (uint32_t)(h & 0x8000u) << 16, em = h & 0x7fffu;
    if (em >= 0x7c00u) { /* infinity or NaN (quieted, as F16C's vcvtph2ps does) */
        o.u = sign | 0x7f800000u | ((em & 0x3ffu) << 13) | (em > 0x7c00u ? 0x400000u : 0u);
    } else if (em >= 0x0400u) { /* normal */
        o.u = sign | ((em << 13) + ((uint32_t)(127 - 15) << 23));
    } else { /* subnormal or zero: em x 2^-24, exact */
        o.f = (float)em * 5.9604644775390625e-08f;
        o.u |= sign;
    }
    return o.f;
}

/* element i of a key or value row as the kernel reads it: an fp16 slot, or an fp32 one
 * rounded to half */
static inline float kv_at(const void *row, int64_t i, int half) {
    return half ? half_value(((const uint16_t *)row)[i])
                : half_value(half_bits(((const float *)row)[i]));
}

static inline float dot(const float *a, const void *b, int64_t D, int half) {
    float l[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
    for (int64_t d = 0; d < D; d++) l[d & 7] = fmaf(a[d], kv_at(b, d, half), l[d & 7]);
    return tree8(l);
}

#if VECTOR
static inline __m256 exp_neg8(__m256 x) {
    const __m256 xc = _mm256_max_ps(x, _mm256_set1_ps(FLOOR));
    const __m256 big = _mm256_set1_ps(BIG);
    const __m256 n = _mm256_sub_ps(_mm256_add_ps(_mm256_mul_ps(xc, _mm256_set1_ps(LOG2E)), big), big);
    __m256 r = _mm256_fmadd_ps(n, _mm256_set1_ps(-LN2_HI), xc);
    r = _mm256_fmadd_ps(n, _mm256_set1_ps(-LN2_LO), r);
    __m256 p = _mm256_set1_ps(1.0f / 5040.0f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 720.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 120.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 24.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 6.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    const __m256 y = _mm256_mul_ps(p, _mm256_castsi256_ps(e));
    return _mm256_andnot_ps(_mm256_cmp_ps(x, _mm256_set1_ps(FLOOR), _CMP_LT_OQ), y);
}

/* elements i..i+7 of a key or value row, as kv_at reads each */
static inline __m256 kv8(const void *row, int64_t i, int half) {
    if (half) return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)row + i)));
    return _mm256_cvtph_ps(_mm256_cvtps_ph(_mm256_loadu_ps((const float *)row + i),
                                           _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}

/* the dot products of q with 8 consecutive slots' keys (k: the first slot's row, kstride
 * elements apart), as dot() forms each */
static inline __m256 dot8_slots(const float *q, const void *k, int64_t kstride, int64_t D,
                                int half) {
    __m256 a[8];
    for (int s = 0; s < 8; s++) a[s] = _mm256_setzero_ps();
    for (int64_t d = 0; d < D; d += 8) {
        const __m256 qv = _mm256_loadu_ps(q + d);
        for (int s = 0; s < 8; s++)
            a[s] = _mm256_fmadd_ps(qv, kv8(k, s * kstride + d, half), a[s]);
    }
    const __m256 h01 = _mm256_hadd_ps(a[0], a[1]), h23 = _mm256_hadd_ps(a[2], a[3]);
    const __m256 h45 = _mm256_hadd_ps(a[4], a[5]), h67 = _mm256_hadd_ps(a[6], a[7]);
    const __m256 lo4 = _mm256_hadd_ps(h01, h23), hi4 = _mm256_hadd_ps(h45, h67);
    return _mm256_add_ps(_mm256_permute2f128_ps(lo4, hi4, 0x20),
                         _mm256_permute2f128_ps(lo4, hi4, 0x31));
}
#endif

#define BATCH 3 /* query heads of one key/value head taken together (their registers fit) */

/* element i of a key or value buffer: its address (half: 2 bytes an element, else 4) */
static inline const void *kv_ptr(const void *base, int64_t i, int half) {
    return half ? (const void *)((const uint16_t *)base + i) : (const void *)((const float *)base + i);
}

/* Query row i (mask row mr, visible slots 0..n-1, a prefix or not) of the HB query heads qr[0..HB)
 * that share the key/value head kb / vb, into o[hh] (each D floats). The heads are taken
 * together: a block of 8 keys is scored for each head in turn (from L1 after the first), and a
 * value row, loaded once, is summed into every head's accumulators; each head's operations and
 * their order are those of the header. e: HB scratch rows of S + 8 floats. */
static inline __attribute__((always_inline)) void row_heads(
    int HB, const float *const *qr, const void *kb, int64_t kst, const void *vb, int64_t vst,
    const float *mr, int64_t n, int prefix, float *const *o, float *e, int64_t S, int64_t D,
    float scale, int vec, int half) {
    float m[BATCH], sum[BATCH];
    float *eh[BATCH];
    for (int hh = 0; hh < HB; hh++) m[hh] = -INFINITY, eh[hh] = e + hh * (S + 8);
    int64_t j = 0;
    const int64_t S8 = vec ? n / 8 * 8 : 0; /* the slots the vector loops take */
    (void)S8; /* (the plain build has no vector loops) */
#if VECTOR
    {
        __m256 vm[BATCH];
        for (int hh = 0; hh < HB; hh++) vm[hh] = _mm256_set1_ps(-INFINITY);
        for (; j < S8; j += 8) {
            const __m256 add = _mm256_loadu_ps(mr + j);
            const __m256 hidden = _mm256_cmp_ps(add, _mm256_set1_ps(-FLT_MAX), _CMP_LE_OQ);
            for (int hh = 0; hh < HB; hh++) { /* the 8 slots' keys: from L1 after the first */
                __m256 sc = _mm256_mul_ps(dot8_slots(qr[hh], kv_ptr(kb, j * kst, half), kst, D, half),
                                          _mm256_set1_ps(scale));
                sc = _mm256_add_ps(sc, add); /* a hidden slot: -inf, whatever its key holds */
                sc = _mm256_blendv_ps(sc, _mm256_set1_ps(-INFINITY), hidden);
                _mm256_storeu_ps(eh[hh] + j, sc);
                vm[hh] = _mm256_max_ps(sc, vm[hh]); /* a NaN score leaves vm, as the scalar
                                                     * loop's s > m ? s : m leaves m */
            }
        }
        for (int hh = 0; hh < HB; hh++) {
            float mv[8];
            _mm256_storeu_ps(mv, vm[hh]);
            for (int k = 0; k < 8; k++) m[hh] = mv[k] > m[hh] ? mv[k] : m[hh];
        }
    }
#endif
    for (int hh = 0; hh < HB; hh++)
        for (int64_t jj = j; jj < n; jj++) {
            const float sc = HIDDEN(mr[jj]) ? -INFINITY
                                            : dot(qr[hh], kv_ptr(kb, jj * kst, half), D, half) * scale + mr[jj];
            eh[hh][jj] = sc;
            m[hh] = sc > m[hh] ? sc : m[hh];
        }
    for (int hh = 0; hh < HB; hh++) {
        float *eb = eh[hh];
        if (m[hh] == -INFINITY) { /* no slot scored (a key of -inf): 0, its weights 0 below */
            memset(eb, 0, (size_t)n * sizeof(float));
            sum[hh] = 0.0f;
            continue;
        }
        j = 0;
#if VECTOR
        const __m256 vmax = _mm256_set1_ps(m[hh]);
        for (; j < S8; j += 8)
            _mm256_storeu_ps(eb + j, exp_neg8(_mm256_sub_ps(_mm256_loadu_ps(eb + j), vmax)));
#endif
        for (; j < n; j++) eb[j] = exp_neg(eb[j] - m[hh]);
        float lanes[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
        if (prefix) { /* the visible slots are a prefix: place = position, and a hidden
                       * slot's e_j = 0 adds +0 to its lane */
            j = 0;
#if VECTOR
            __m256 vsum = _mm256_setzero_ps();
            for (; j < S8; j += 8) vsum = _mm256_add_ps(vsum, _mm256_loadu_ps(eb + j));
            _mm256_storeu_ps(lanes, vsum);
#endif
            for (; j < n; j++) lanes[j & 7] += eb[j];
        } else {
            for (int64_t j2 = 0, t = 0; j2 < n; j2++) /* lane: place among the visible */
                if (!HIDDEN(mr[j2])) lanes[t++ & 7] += eb[j2];
        }
        sum[hh] = tree8(lanes);
    }
    /* out = acc / sum, acc summed slot by slot; a value row read once for the HB heads */
#if VECTOR
    if (vec) { /* 4 vectors of the head at a time: 4 HB accumulators */
        for (int64_t c0 = 0; c0 < D / 8; c0 += 4) {
            const int nc = D / 8 - c0 < 4 ? (int)(D / 8 - c0) : 4;
            __m256 va[BATCH][4];
            for (int hh = 0; hh < HB; hh++)
                for (int c = 0; c < 4; c++) va[hh][c] = _mm256_setzero_ps();
            for (int64_t jj = 0; jj < n; jj++) {
                if (!prefix && HIDDEN(mr[jj])) continue;
                const void *vr = kv_ptr(vb, jj * vst + 8 * c0, half);
                for (int c = 0; c < nc; c++) {
                    const __m256 v = kv8(vr, 8 * c, half);
                    for (int hh = 0; hh < HB; hh++)
                        va[hh][c] = _mm256_fmadd_ps(_mm256_set1_ps(eh[hh][jj]), v, va[hh][c]);
                }
            }
            for (int hh = 0; hh < HB; hh++)
                if (m[hh] != -INFINITY)
                    for (int c = 0; c < nc; c++)
                        _mm256_storeu_ps(o[hh] + 8 * (c0 + c),
                                         _mm256_div_ps(va[hh][c], _mm256_set1_ps(sum[hh])));
        }
    } else
#endif
    {
        float *acc = e + BATCH * (S + 8); /* D + 8 floats past the score rows */
        for (int hh = 0; hh < HB; hh++) {
            if (m[hh] == -INFINITY) continue;
            for (int64_t d = 0; d < D; d++) acc[d] = 0.0f;
            for (int64_t jj = 0; jj < n; jj++) {
                if (!prefix && HIDDEN(mr[jj])) continue;
                const void *vr = kv_ptr(vb, jj * vst, half);
                for (int64_t d = 0; d < D; d++) acc[d] = fmaf(eh[hh][jj], kv_at(vr, d, half), acc[d]);
            }
            for (int64_t d = 0; d < D; d++) o[hh][d] = acc[d] / sum[hh];
        }
    }
    for (int hh = 0; hh < HB; hh++)
        if (m[hh] == -INFINITY) memset(o[hh], 0, (size_t)D * sizeof(float));
}

static inline __attribute__((always_inline)) int rowattn_d(
    const float *query, const int64_t *qs, const void *key, const int64_t *ks,
    const void *value, const int64_t *vs, const float *mask, const int64_t *ms, float *out,
    int64_t W, int64_t H, int64_t KV, int64_t Q, int64_t S, int64_t D, float scale, int half) {
    float *e = malloc((size_t)(BATCH * (S + 8) + D + 8) * sizeof(float)); /* scores, then an
                                                                           * accumulator */
    int64_t *ends = malloc((size_t)(Q + 1) * sizeof(int64_t)); /* per query row: 1 + its last
                                                                 * visible slot (0: none) */
    char *prefix = malloc((size_t)(Q + 1)); /* per query row: its visible slots are 0..end-1 */
    if (!e || !ends || !prefix) {
        free(e);
        free(ends);
        free(prefix);
        return -1;
    }
    const int64_t group = H / KV;
#if VECTOR
    const int vec = D % 8 == 0;
#else
    const int vec = 0;
#endif
    for (int64_t w = 0; w < W; w++) {
        /* once per query row, not per head: where its visible slots end, and whether they are a
         * prefix. Slots past the last visible one are skipped: a hidden slot adds nothing. */
        for (int64_t i = 0; i < Q; i++) {
            const float *mr = mask + w * ms[0] + i * ms[2];
            int64_t n_seen = 0, last = -1;
            for (int64_t j = 0; j < S; j++)
                if (!HIDDEN(mr[j])) n_seen++, last = j;
            ends[i] = last + 1;
            prefix[i] = n_seen == last + 1;
        }
        for (int64_t g = 0; g < KV; g++) {
            const void *kb = kv_ptr(key, w * ks[0] + g * ks[1], half);
            const void *vb = kv_ptr(value, w * vs[0] + g * vs[1], half);
            for (int64_t i = 0; i < Q; i++) {
                const float *mr = mask + w * ms[0] + i * ms[2];
                for (int64_t h0 = g * group; h0 < (g + 1) * group; h0 += BATCH) {
                    const int HB = (g + 1) * group - h0 < BATCH ? (int)((g + 1) * group - h0) : BATCH;
                    const float *qr[BATCH];
                    float *o[BATCH];
                    for (int hh = 0; hh < HB; hh++) {
                        qr[hh] = query + w * qs[0] + (h0 + hh) * qs[1] + i * qs[2];
                        o[hh] = out + ((w * Q + i) * H + h0 + hh) * D;
                    }
                    if (ends[i] == 0) { /* no slot visible */
                        for (int hh = 0; hh < HB; hh++) memset(o[hh], 0, (size_t)D * sizeof(float));
                        continue;
                    }
                    /* the batch's size a constant in each call: its accumulators in registers */
                    if (HB == 3)
                        row_heads(3, qr, kb, ks[2], vb, vs[2], mr, ends[i], prefix[i], o, e, S, D,
                                  scale, vec, half);
                    else if (HB == 2)
                        row_heads(2, qr, kb, ks[2], vb, vs[2], mr, ends[i], prefix[i], o, e, S, D,
                                  scale, vec, half);
                    else
                        row_heads(1, qr, kb, ks[2], vb, vs[2], mr, ends[i], prefix[i], o, e, S, D,
                                  scale, vec, half);
                }
            }
        }
    }
    free(e);
    free(ends);
    free(prefix);
    return 0;
}

/* query (W, H, Q, D) fp32, key and value (W, KV, S, D): fp16 (IEEE half bits) where `half`, else
 * fp32 (read rounded to half), mask (W, 1, Q, S) additive fp32; `strides`: the four element
 * strides of each, in that order (each last one 1; the mask's first and third may be 0: one
 * mask for every beam row or every query row);
 * out (W, Q, H, D) contiguous. Returns 0, or -1 when the scratch memory could not be had. */
int rowattn(const float *query, const void *key, const void *value, const float *mask,
            const int64_t *strides, float *out, int64_t W, int64_t H, int64_t KV, int64_t Q,
            int64_t S, int64_t D, float scale, int half) {
    const int64_t *qs = strides, *ks = strides + 4, *vs = strides + 8, *ms = strides + 12;
    /* each variant a constant in its call: the common head size's loops unrolled, the element
     * type's loads chosen at compile time (the same operations) */
    if (D == 64 && half)
        return rowattn_d(query, qs, key, ks, value, vs, mask, ms, out, W, H, KV, Q, S, 64, scale, 1);
    if (D == 64)
        return rowattn_d(query, qs, key, ks, value, vs, mask, ms, out, W, H, KV, Q, S, 64, scale, 0);
    if (half)
        return rowattn_d(query, qs, key, ks, value, vs, mask, ms, out, W, H, KV, Q, S, D, scale, 1);
    return rowattn_d(query, qs, key, ks, value, vs, mask, ms, out, W, H, KV, Q, S, D, scale, 0);
}
