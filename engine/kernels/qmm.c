/* 4-bit weight, 16-bit (or 8-bit) activation matrix products for the packed CPU target.
 * engine/kernels/qmm.py builds this file with the machine's C compiler and loads it with ctypes;
 * engine/kernels/qmm.py's `reference` is the same computation in torch (the tests' oracle).
 *
 * y[r, n] = sum_b ( dot_b(r, n) * (dw[n, b] * dx[r, b]) + mw[n, b] * sx[r, b] )
 *
 * over blocks b of 32 input columns, where
 *   - the weight's block is w = dw q + mw with q in 0..15 (GGUF Q4_1: dw = d, mw = m);
 *   - the activation's block is quantised to 16 bits: dx = max|x| / 32767,
 *     qx = round-to-nearest-even(x / dx) in -32767..32767 (x * (1 / dx), computed in fp32),
 *     sx = dx * sum(qx);
 *   - dot_b = sum of q * qx over the block, an exact integer (at most 32 * 15 * 32767 < 2^24
 *     in size, so its conversion to fp32 is exact too).
 * The sum over b runs in block order, two fused multiply-adds a block, in fp32. Every path
 * (AVX512-VNNI, AVX2, plain C) forms the same integers and the same float operations in the
 * same order, so all give the same bits; and a row's output never depends on the other rows
 * (R rows give the bits of R one-row products).
 *
 * Weight layout (engine/kernels/qmm.py `pack`): columns in tiles of 16; for tile t and block b,
 * 256 bytes: four 64-byte vectors P_j (j = 0..3), P_j's byte 4 c + e holding, for column
 * 16 t + c, q[32 b + 4 j + e] in its low nibble and q[32 b + 16 + 4 j + e] in its high one.
 * So P_j's low nibbles are input group j (4 inputs) and its high nibbles group j + 4. Widened to
 * 16 bits, a group's bytes e = 0, 2 and e = 1, 3 make two vectors of 16 columns x 2 inputs:
 * one 16-bit multiply-add (AVX2's madd_epi16) each. The activations are laid out to match
 * (quantize_rows): per block, for each group g (inputs i = 4 g), x[i], x[i + 2], x[i + 1],
 * x[i + 3]. The AVX512-VNNI path keeps the bytes as they are (a group is one 8-bit VNNI
 * product for 16 columns) and takes each activation as two bytes (tile_rows there).
 * dw and mw: fp16, (tile, block, 16).
 *
 * qmm_q4_a8 is the same product against activations quantised to 8 bits (dx = max|x| / 127,
 * qx in -127..127, in input order: llama.cpp's Q8_1 against a Q4_1 weight), the same float
 * operations in the same order; the integers as 8-bit products on the same weight layout
 * (AVX512-VNNI's vpdpbusd, a group of 16 columns x 4 inputs an instruction; AVX2's
 * maddubs_epi16).
 *
 * qmm_q8 / qmm_q8_a8 take a Q8_0 weight (w = dw q, q in -128..127, one fp16 dw a block of 32:
 * GGUF's Q8_0, the embedded model's LM head) against the same activations:
 * y[r, n] = sum_b dot_b(r, n) * (dw[n, b] * dx[r, b]), one fused multiply-add a block, in block
 * order, with dot_b = sum of q * qx an exact integer (|dot_b| <= 32 * 128 * 32767 < 2^31; at
 * 16 bits it can pass 2^24, and its conversion to fp32 then rounds to nearest even, the same
 * on every path). Layout (qmm.py `pack8`): for tile t and block b, 512 bytes: eight 64-byte
 * vectors G_g, G_g's byte 4 c + e holding q[16 t + c][32 b + 4 g + e] (signed). AVX512-VNNI
 * multiplies unsigned by signed bytes: it takes q + 128 (the byte's top bit flipped) against
 * the signed activations and subtracts 128 times their block sum (an exact integer), and at 16
 * bits takes the low activation bytes unsigned against q itself; AVX2 takes |q| against the
 * activations carrying q's sign (maddubs_epi16, |pair| <= 2 * 128 * 127 < 2^15), or q widened
 * to 16 bits (madd_epi16) at 16 bits.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define GROUP 32
#define TILE 16

#if defined(QMM_PLAIN) /* the plain C path, whatever the machine (tests compare the paths) */
#define PATH 0
#elif defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__) && \
    defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define PATH 512
#include <immintrin.h>
#elif defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define PATH 256
#include <immintrin.h>
#else
#define PATH 0
#endif

static inline float half_to_float(uint16_t h) {
    uint32_t sign = (uint32_t)(h >> 15) << 31, exp = (h >> 10) & 31, man = h & 1023, bits;
    if (exp == 0) {
        if (man == 0) {
            bits = sign;
        } else { /* subnormal: normalise */
            exp = 127 - 15 + 1;
            while (!(man & 1024)) {
                man <<= 1;
                exp--;
            }
            bits = sign | (exp << 23) | ((man & 1023) << 13);
        }
    } else if (exp == 31) {
        bits = sign | (255u << 23) | (man << 13);
    } else {
        bits = sign | ((exp - 15 + 127) << 23) | (man << 13);
    }
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

/* max |x| over a block. Written as a comparison, not fmaxf: the same value for every input
 * (a NaN leaves the running maximum as fmaxf does, and it starts at +0), but the compiler
 * inlines it, where without -ffinite-math-only each fmaxf was a call into libm (about 2 % of
 * a compiled greedy run's samples). */
static inline float block_amax(const float *xb) {
    float amax = 0.0f;
    for (int k = 0; k < GROUP; k++) {
        const float a = fabsf(xb[k]);
        amax = a > amax ? a : amax;
    }
    return amax;
}

/* x (R, K) fp32 -> qx (R, K) int16 in the order of the header, dx and sx (R, K / 32) fp32 */
static void quantize_rows(const float *x, int64_t R, int64_t K, int16_t *qx, float *dx,
                          float *sx) {
    const int64_t nb = K / GROUP;
    static const int order[GROUP] = {0,  2,  1,  3,  4,  6,  5,  7,  8,  10, 9,
                                     11, 12, 14, 13, 15, 16, 18, 17, 19, 20, 22,
                                     21, 23, 24, 26, 25, 27, 28, 30, 29, 31};
    for (int64_t r = 0; r < R; r++)
        for (int64_t b = 0; b < nb; b++) {
            const float *xb = x + r * K + b * GROUP;
            const float amax = block_amax(xb);
            const float d = amax / 32767.0f;
            const float id = d != 0.0f ? 1.0f / d : 0.0f;
            int sum = 0;
#if PATH == 512
            /* as two byte planes in input order: the low bytes (0..255), then the high ones
             * (-128..127), q = 256 hi + lo */
            uint8_t *lo = (uint8_t *)(qx + r * K + b * GROUP), *hi = lo + GROUP;
            (void)order;
            for (int k = 0; k < GROUP; k++) {
                const int q = (int)nearbyintf(xb[k] * id);
                lo[k] = (uint8_t)(q & 255);
                hi[k] = (uint8_t)(int8_t)((q - (q & 255)) / 256);
                sum += q;
            }
#else
            for (int k = 0; k < GROUP; k++) {
                const int q = (int)nearbyintf(xb[order[k]] * id);
                qx[r * K + b * GROUP + k] = (int16_t)q;
                sum += q;
            }
#endif
            dx[r * nb + b] = d;
            sx[r * nb + b] = d * (float)sum;
        }
}

/* 8-bit activations (llama.cpp's Q8_1 against a Q4_1 weight): x (R, K) fp32 -> qx (R, K) int8
 * in input order, dx = max|x| / 127 and sx = dx * sum(qx) (R, K / 32) fp32, on every path */
static void quantize_rows8(const float *x, int64_t R, int64_t K, int8_t *qx, float *dx,
                           float *sx) {
    const int64_t nb = K / GROUP;
    for (int64_t r = 0; r < R; r++)
        for (int64_t b = 0; b < nb; b++) {
            const float *xb = x + r * K + b * GROUP;
            const float amax = block_amax(xb);
            const float d = amax / 127.0f;
            const float id = d != 0.0f ? 1.0f / d : 0.0f;
            int sum = 0;
            for (int k = 0; k < GROUP; k++) {
                const int q = (int)nearbyintf(xb[k] * id);
                qx[r * K + b * GROUP + k] = (int8_t)q;
                sum += q;
            }
            dx[r * nb + b] = d;
            sx[r * nb + b] = d * (float)sum;
        }
}

#if PATH == 512
/* the integer each (row, block) of the activations adds to a Q8_0 product's AVX512 sums, to be
 * taken away: the block's sum of the signed bytes that meet q + 128 (8 bits: qx; 16 bits: the
 * high bytes, which quantize_rows writes after the low ones) */
static void block_sums(const void *qx, int64_t R, int64_t K, int bits, int32_t *cs) {
    const int64_t nb = K / GROUP;
    for (int64_t r = 0; r < R; r++)
        for (int64_t b = 0; b < nb; b++) {
            const int8_t *v = bits == 8 ? (const int8_t *)qx + r * K + b * GROUP
                                        : (const int8_t *)qx + 2 * (r * K + b * GROUP) + GROUP;
            int32_t sum = 0;
            for (int k = 0; k < GROUP; k++) sum += v[k];
            cs[r * nb + b] = sum;
        }
}
#endif

#if PATH == 512 || PATH == 256
#ifndef AHEAD
#define AHEAD 16
#endif
/* the weight's stream, AHEAD blocks past block i (of tile-major order: the next tile's when
 * the tile ends), asked into the cache while block i is computed. One thread streams a step's
 * weights from memory, and its hardware prefetchers alone keep too few lines in flight: on an
 * AVX512 Xeon this took a pass over the model's 210 products from 5.14 to 4.51 ms at one row
 * and from 12.94 to 9.17 at eight (docs/benchmarks.md, "The weight stream prefetched"). A
 * prefetch never faults, so past the weight's end it is harmless. */
static inline __attribute__((always_inline)) void prefetch_block(
    const uint8_t *qw, const uint16_t *dw, const uint16_t *mw, int64_t i) {
    const char *p = (const char *)(qw + (i + AHEAD) * 256);
    _mm_prefetch(p, _MM_HINT_T0);
    _mm_prefetch(p + 64, _MM_HINT_T0);
    _mm_prefetch(p + 128, _MM_HINT_T0);
    _mm_prefetch(p + 192, _MM_HINT_T0);
    _mm_prefetch((const char *)(dw + (i + AHEAD) * 16), _MM_HINT_T0);
    _mm_prefetch((const char *)(mw + (i + AHEAD) * 16), _MM_HINT_T0);
}

/* the same for a Q8_0 weight (512 bytes a block), as many bytes ahead */
static inline __attribute__((always_inline)) void prefetch_block8(
    const uint8_t *qw, const uint16_t *dw, int64_t i) {
    const char *p = (const char *)(qw + (i + AHEAD / 2) * 512);
#pragma GCC unroll 8
    for (int k = 0; k < 8; k++) _mm_prefetch(p + 64 * k, _MM_HINT_T0);
    _mm_prefetch((const char *)(dw + (i + AHEAD / 2) * 16), _MM_HINT_T0);
}
#endif

#if PATH == 512
/* one block's integer dot products for 16 columns (AVX512-VNNI), shared by both weight kinds:
 * wu[g] the unsigned operand of group g's products with the signed activation bytes, ws[g] the
 * signed operand of the 16-bit low bytes' products, bias what the unsigned weights' offset adds
 * (0 for Q4_1, whose q is 0..15; 128 times the block sum for Q8_0's q + 128). 8 bits: the sum
 * less bias; 16 bits (xp: the low bytes, then the high ones): 256 times that for the high bytes
 * plus the low bytes' sum. */
static inline __attribute__((always_inline)) __m512i block_dot_512(
    int bits, const __m512i *wu, const __m512i *ws, const int32_t *xp, __m512i bias) {
    if (bits == 8) {
        __m512i s0 = _mm512_setzero_si512(), s1 = s0;
#pragma GCC unroll 4
        for (int g = 0; g < 8; g += 2) {
            s0 = _mm512_dpbusd_epi32(s0, wu[g], _mm512_set1_epi32(xp[g]));
            s1 = _mm512_dpbusd_epi32(s1, wu[g + 1], _mm512_set1_epi32(xp[g + 1]));
        }
        return _mm512_sub_epi32(_mm512_add_epi32(s0, s1), bias);
    }
    const int32_t *xh = xp + GROUP / 4;
    __m512i h0 = _mm512_setzero_si512(), h1 = h0, l0 = h0, l1 = h0;
#pragma GCC unroll 4
    for (int g = 0; g < 8; g += 2) {
        h0 = _mm512_dpbusd_epi32(h0, wu[g], _mm512_set1_epi32(xh[g]));
        h1 = _mm512_dpbusd_epi32(h1, wu[g + 1], _mm512_set1_epi32(xh[g + 1]));
        l0 = _mm512_dpbusd_epi32(l0, _mm512_set1_epi32(xp[g]), ws[g]);
        l1 = _mm512_dpbusd_epi32(l1, _mm512_set1_epi32(xp[g + 1]), ws[g + 1]);
    }
    return _mm512_add_epi32(
        _mm512_slli_epi32(_mm512_sub_epi32(_mm512_add_epi32(h0, h1), bias), 8),
        _mm512_add_epi32(l0, l1));
}

/* MR rows against tile t: acc[r] holds the tile's 16 columns; activations of `bits` bits (a
 * constant where it is inlined: one loop compiled per width). Group g's weights are 16 columns
 * x 4 inputs, one byte each: one 8-bit VNNI product (vpdpbusd, 4 inputs summed into each
 * column's 32-bit sum).
 * 16 bits (tile_rows): an activation is 256 hi + lo with lo in 0..255 and hi in -128..127, so
 * a dot product is 256 times the weights' with the high bytes plus theirs with the low bytes:
 * two products, the unsigned operand the weights (0..15) in the first, the low bytes in the
 * second. 8 bits (tile_rows8): one product, the weights unsigned, the activations signed
 * (|sum| <= 32 * 15 * 127: no saturation). */
static inline __attribute__((always_inline)) void tile_512(
    int MR, int bits, const void *qx, const float *dx, const float *sx, int64_t K,
    const uint8_t *qw, const uint16_t *dw, const uint16_t *mw, int64_t t, float *y, int64_t N) {
    const int64_t nb = K / GROUP, width = bits == 8 ? 1 : 2; /* bytes an activation */
    const __m512i low = _mm512_set1_epi8(15);
    __m512 acc[8];
#pragma GCC unroll 8
    for (int r = 0; r < MR; r++) acc[r] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *p = qw + (t * nb + b) * 256;
        prefetch_block(qw, dw, mw, t * nb + b);
        __m512i w[8]; /* group g: 16 columns x 4 inputs, one byte each */
#pragma GCC unroll 4
        for (int j = 0; j < 4; j++) {
            const __m512i v = _mm512_loadu_si512((const void *)(p + 64 * j));
            w[j] = _mm512_and_si512(v, low);
            w[j + 4] = _mm512_and_si512(_mm512_srli_epi16(v, 4), low);
        }
        const __m512 vdw = _mm512_cvtph_ps(_mm256_loadu_si256((const void *)(dw + (t * nb + b) * 16)));
        const __m512 vmw = _mm512_cvtph_ps(_mm256_loadu_si256((const void *)(mw + (t * nb + b) * 16)));
#pragma GCC unroll 8
        for (int r = 0; r < MR; r++) {
            const int32_t *xp = (const int32_t *)((const char *)qx + (r * K + b * GROUP) * width);
            const __m512i dot = block_dot_512(bits, w, w, xp, _mm512_setzero_si512());
            const __m512 scale = _mm512_mul_ps(vdw, _mm512_set1_ps(dx[r * nb + b]));
            acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), scale, acc[r]);
            acc[r] = _mm512_fmadd_ps(vmw, _mm512_set1_ps(sx[r * nb + b]), acc[r]);
        }
    }
#pragma GCC unroll 8
    for (int r = 0; r < MR; r++) _mm512_storeu_ps(y + r * N + t * TILE, acc[r]);
}
#define tile_rows(MR, ...) tile_512(MR, 16, __VA_ARGS__)
#define tile_rows8(MR, ...) tile_512(MR, 8, __VA_ARGS__)

/* MR rows against tile t of a Q8_0 weight (header): u = q + 128 (unsigned) against the signed
 * activation bytes, less 128 times their block sum cs; at 16 bits 256 times that for the high
 * bytes plus the low bytes (unsigned) against q (signed) */
static inline __attribute__((always_inline)) void tile_q8_512(
    int MR, int bits, const void *qx, const int32_t *cs, const float *dx, int64_t K,
    const uint8_t *qw, const uint16_t *dw, int64_t t, float *y, int64_t N) {
    const int64_t nb = K / GROUP, width = bits == 8 ? 1 : 2; /* bytes an activation */
    const __m512i flip = _mm512_set1_epi8((char)0x80);
    __m512 acc[8];
#pragma GCC unroll 8
    for (int r = 0; r < MR; r++) acc[r] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *p = qw + (t * nb + b) * 512;
        prefetch_block8(qw, dw, t * nb + b);
        __m512i w[8], u[8]; /* group g: 16 columns x 4 inputs; q signed, u = q + 128 */
#pragma GCC unroll 8
        for (int g = 0; g < 8; g++) {
            w[g] = _mm512_loadu_si512((const void *)(p + 64 * g));
            u[g] = _mm512_xor_si512(w[g], flip);
        }
        const __m512 vdw = _mm512_cvtph_ps(_mm256_loadu_si256((const void *)(dw + (t * nb + b) * 16)));
#pragma GCC unroll 8
        for (int r = 0; r < MR; r++) {
            const int32_t *xp = (const int32_t *)((const char *)qx + (r * K + b * GROUP) * width);
            const __m512i dot = block_dot_512(bits, u, w, xp,
                                              _mm512_set1_epi32(128 * cs[r * nb + b]));
            const __m512 scale = _mm512_mul_ps(vdw, _mm512_set1_ps(dx[r * nb + b]));
            acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), scale, acc[r]);
        }
    }
#pragma GCC unroll 8
    for (int r = 0; r < MR; r++) _mm512_storeu_ps(y + r * N + t * TILE, acc[r]);
}
#define tile_q8_rows(MR, ...) tile_q8_512(MR, 16, __VA_ARGS__)
#define tile_q8_rows8(MR, ...) tile_q8_512(MR, 8, __VA_ARGS__)
#endif

#if PATH == 256
/* MR rows against tile t, the 16 columns as two halves of 8 (acc[r]: a half's columns), with
 * activations of `bits` bits (a constant where it is inlined: one loop compiled per width).
 * 16 bits (the AVX2 build's tile_rows): a group's bytes widened to 16 bits, e = 0, 2 and e = 1, 3
 * as two vectors of 8 columns x 2 inputs, one madd_epi16 each (|w x| <= 15 * 32767: a pair
 * fits int32). 8 bits (tile_rows8): maddubs_epi16 (unsigned weights x
 * signed activations, pairs summed to 16 bits), the 8 groups of a block summed in 16 bits
 * (|sum| <= 8 * 2 * 15 * 127 < 2^15), then madd_epi16 by 1 to each column's 32-bit dot. */
static inline __attribute__((always_inline)) void tile_avx2(
    int MR, int bits, const void *qx, const float *dx, const float *sx, int64_t K,
    const uint8_t *qw, const uint16_t *dw, const uint16_t *mw, int64_t t, float *y, int64_t N) {
    const int64_t nb = K / GROUP, width = bits == 8 ? 1 : 2; /* bytes an activation */
    const __m256i low = _mm256_set1_epi8(15), even = _mm256_set1_epi32(0x00FF00FF);
    const __m256i ones = _mm256_set1_epi16(1);
    for (int h = 0; h < 2; h++) {
        __m256 acc[8];
#pragma GCC unroll 8
        for (int r = 0; r < MR; r++) acc[r] = _mm256_setzero_ps();
        for (int64_t b = 0; b < nb; b++) {
            const uint8_t *p = qw + (t * nb + b) * 256 + 32 * h;
            if (h == 0) prefetch_block(qw, dw, mw, t * nb + b); /* h = 1 reads it from L1 */
            __m256i w[16]; /* 16 bits: 16 vectors of 8 columns x 2 inputs; 8 bits: group g's
                            * 8 columns x 4 inputs, one byte each, in w[g] */
#pragma GCC unroll 4
            for (int j = 0; j < 4; j++) {
                const __m256i v = _mm256_loadu_si256((const void *)(p + 64 * j));
                const __m256i lo = _mm256_and_si256(v, low);
                const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), low);
                if (bits == 8) {
                    w[j] = lo;
                    w[j + 4] = hi;
                } else {
                    w[2 * j] = _mm256_and_si256(lo, even);
                    w[2 * j + 1] = _mm256_srli_epi16(lo, 8);
                    w[8 + 2 * j] = _mm256_and_si256(hi, even);
                    w[8 + 2 * j + 1] = _mm256_srli_epi16(hi, 8);
                }
            }
            const __m256 vdw = _mm256_cvtph_ps(_mm_loadu_si128((const void *)(dw + (t * nb + b) * 16 + 8 * h)));
            const __m256 vmw = _mm256_cvtph_ps(_mm_loadu_si128((const void *)(mw + (t * nb + b) * 16 + 8 * h)));
#pragma GCC unroll 8
            for (int r = 0; r < MR; r++) {
                const int32_t *xp = (const int32_t *)((const char *)qx + (r * K + b * GROUP) * width);
                __m256i dot;
                if (bits == 8) { /* xp[g]: group g's 4 inputs */
                    __m256i s0 = _mm256_maddubs_epi16(w[0], _mm256_set1_epi32(xp[0]));
                    __m256i s1 = _mm256_maddubs_epi16(w[1], _mm256_set1_epi32(xp[1]));
#pragma GCC unroll 3
                    for (int g = 2; g < 8; g += 2) {
                        s0 = _mm256_add_epi16(s0, _mm256_maddubs_epi16(w[g], _mm256_set1_epi32(xp[g])));
                        s1 = _mm256_add_epi16(s1, _mm256_maddubs_epi16(w[g + 1], _mm256_set1_epi32(xp[g + 1])));
                    }
                    dot = _mm256_madd_epi16(_mm256_add_epi16(s0, s1), ones);
                } else { /* xp[i]: two inputs, in the order of w[i] */
                    dot = _mm256_setzero_si256();
#pragma GCC unroll 16
                    for (int i = 0; i < 16; i++)
                        dot = _mm256_add_epi32(dot, _mm256_madd_epi16(w[i], _mm256_set1_epi32(xp[i])));
                }
                const __m256 scale = _mm256_mul_ps(vdw, _mm256_set1_ps(dx[r * nb + b]));
                acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), scale, acc[r]);
                acc[r] = _mm256_fmadd_ps(vmw, _mm256_set1_ps(sx[r * nb + b]), acc[r]);
            }
        }
#pragma GCC unroll 8
        for (int r = 0; r < MR; r++) _mm256_storeu_ps(y + r * N + t * TILE + 8 * h, acc[r]);
    }
}
#define tile_rows(MR, ...) tile_avx2(MR, 16, __VA_ARGS__)
#define tile_rows8(MR, ...) tile_avx2(MR, 8, __VA_ARGS__)

/* MR rows against tile t of a Q8_0 weight (header), as two halves of 8 columns. 8 bits: |q|
 * (unsigned) against the activations with q's sign (maddubs_epi16, no saturation), each group's
 * pairs summed to 32 bits at once. 16 bits: a group's bytes e = 0, 2 and e = 1, 3 sign-extended
 * to 16 bits, one madd_epi16 each against the activations in the header's order. */
static inline __attribute__((always_inline)) void tile_q8_avx2(
    int MR, int bits, const void *qx, const int32_t *cs, const float *dx, int64_t K,
    const uint8_t *qw, const uint16_t *dw, int64_t t, float *y, int64_t N) {
    const int64_t nb = K / GROUP, width = bits == 8 ? 1 : 2; /* bytes an activation */
    const __m256i ones = _mm256_set1_epi16(1);
    (void)cs;
    for (int h = 0; h < 2; h++) {
        __m256 acc[8];
#pragma GCC unroll 8
        for (int r = 0; r < MR; r++) acc[r] = _mm256_setzero_ps();
        for (int64_t b = 0; b < nb; b++) {
            const uint8_t *p = qw + (t * nb + b) * 512 + 32 * h;
            if (h == 0) prefetch_block8(qw, dw, t * nb + b); /* h = 1 reads it from L1 */
            __m256i w[16]; /* 8 bits: q and |q| of group g in w[g], w[8 + g]; 16 bits: group
                            * g's bytes e = 0, 2 in w[2 g] and e = 1, 3 in w[2 g + 1] */
#pragma GCC unroll 8
            for (int g = 0; g < 8; g++) {
                const __m256i v = _mm256_loadu_si256((const void *)(p + 64 * g));
                if (bits == 8) {
                    w[g] = v;
                    w[8 + g] = _mm256_sign_epi8(v, v);
                } else {
                    w[2 * g] = _mm256_srai_epi16(_mm256_slli_epi16(v, 8), 8);
                    w[2 * g + 1] = _mm256_srai_epi16(v, 8);
                }
            }
            const __m256 vdw = _mm256_cvtph_ps(_mm_loadu_si128((const void *)(dw + (t * nb + b) * 16 + 8 * h)));
#pragma GCC unroll 8
            for (int r = 0; r < MR; r++) {
                const int32_t *xp = (const int32_t *)((const char *)qx + (r * K + b * GROUP) * width);
                __m256i dot = _mm256_setzero_si256();
                if (bits == 8) {
#pragma GCC unroll 8
                    for (int g = 0; g < 8; g++) {
                        const __m256i sx = _mm256_sign_epi8(_mm256_set1_epi32(xp[g]), w[g]);
                        dot = _mm256_add_epi32(dot, _mm256_madd_epi16(_mm256_maddubs_epi16(w[8 + g], sx), ones));
                    }
                } else {
#pragma GCC unroll 16
                    for (int i = 0; i < 16; i++)
                        dot = _mm256_add_epi32(dot, _mm256_madd_epi16(w[i], _mm256_set1_epi32(xp[i])));
                }
                const __m256 scale = _mm256_mul_ps(vdw, _mm256_set1_ps(dx[r * nb + b]));
                acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), scale, acc[r]);
            }
        }
#pragma GCC unroll 8
        for (int r = 0; r < MR; r++) _mm256_storeu_ps(y + r * N + t * TILE + 8 * h, acc[r]);
    }
}
#define tile_q8_rows(MR, ...) tile_q8_avx2(MR, 16, __VA_ARGS__)
#define tile_q8_rows8(MR, ...) tile_q8_avx2(MR, 8, __VA_ARGS__)
#elif PATH == 0
/* the plain C loops: column by column, the same integers and float operations in order;
 * 16 bits take a group's inputs in the header's order (e = 0, 2, 1, 3), 8 bits in input order */
static inline __attribute__((always_inline)) void tile_plain(
    int MR, int bits, const void *qx, const float *dx, const float *sx, int64_t K,
    const uint8_t *qw, const uint16_t *dw, const uint16_t *mw, int64_t t, float *y, int64_t N) {
    const int64_t nb = K / GROUP;
    const int order[2][4] = {{0, 1, 2, 3}, {0, 2, 1, 3}};
    const int *e = order[bits != 8];
    for (int r = 0; r < MR; r++)
        for (int c = 0; c < TILE; c++) {
            float acc = 0.0f;
            for (int64_t b = 0; b < nb; b++) {
                const uint8_t *p = qw + (t * nb + b) * 256 + 4 * c;
                const int64_t at = r * K + b * GROUP; /* the block's first activation */
                int32_t dot = 0;
                for (int j = 0; j < 4; j++)
                    for (int k = 0; k < 4; k++) {
                        const int v = p[64 * j + e[k]];
                        const int i = 4 * j + k;
                        const int lo = bits == 8 ? ((const int8_t *)qx)[at + i] : ((const int16_t *)qx)[at + i];
                        const int hi = bits == 8 ? ((const int8_t *)qx)[at + 16 + i] : ((const int16_t *)qx)[at + 16 + i];
                        dot += (v & 15) * lo + (v >> 4) * hi;
                    }
                const float scale = half_to_float(dw[(t * nb + b) * 16 + c]) * dx[r * nb + b];
                acc = fmaf((float)dot, scale, acc);
                acc = fmaf(half_to_float(mw[(t * nb + b) * 16 + c]), sx[r * nb + b], acc);
            }
            y[r * N + t * TILE + c] = acc;
        }
}
#define tile_rows(MR, ...) tile_plain(MR, 16, __VA_ARGS__)
#define tile_rows8(MR, ...) tile_plain(MR, 8, __VA_ARGS__)

/* a Q8_0 weight's plain loops (header), the activations in the order above */
static inline __attribute__((always_inline)) void tile_q8_plain(
    int MR, int bits, const void *qx, const int32_t *cs, const float *dx, int64_t K,
    const uint8_t *qw, const uint16_t *dw, int64_t t, float *y, int64_t N) {
    const int64_t nb = K / GROUP;
    const int order[2][4] = {{0, 1, 2, 3}, {0, 2, 1, 3}};
    const int *e = order[bits != 8];
    (void)cs;
    for (int r = 0; r < MR; r++)
        for (int c = 0; c < TILE; c++) {
            float acc = 0.0f;
            for (int64_t b = 0; b < nb; b++) {
                const int8_t *p = (const int8_t *)(qw + (t * nb + b) * 512) + 4 * c;
                const int64_t at = r * K + b * GROUP;
                int32_t dot = 0;
                for (int g = 0; g < 8; g++)
                    for (int k = 0; k < 4; k++) {
                        const int i = 4 * g + k;
                        const int v = bits == 8 ? ((const int8_t *)qx)[at + i] : ((const int16_t *)qx)[at + i];
                        dot += p[64 * g + e[k]] * v;
                    }
                const float scale = half_to_float(dw[(t * nb + b) * 16 + c]) * dx[r * nb + b];
                acc = fmaf((float)dot, scale, acc);
            }
            y[r * N + t * TILE + c] = acc;
        }
}
#define tile_q8_rows(MR, ...) tile_q8_plain(MR, 16, __VA_ARGS__)
#define tile_q8_rows8(MR, ...) tile_q8_plain(MR, 8, __VA_ARGS__)
#endif

/* every tile t of y through `tile`: one thread in a plain loop (an OpenMP region costs about a
 * microsecond a call, even with its if clause false, of 211 products a step), else split
 * among `threads` */
#define OVER_TILES(tile)                                                     \
    if (threads <= 1) {                                                      \
        for (int64_t t = 0; t < N / TILE; t++) tile;                         \
        return;                                                              \
    }                                                                        \
    _Pragma("omp parallel for schedule(static) num_threads(threads)")        \
    for (int64_t t = 0; t < N / TILE; t++) tile;

#define ROWS(MR)                                                                       \
    static void rows_##MR(const void *qx, const float *dx, const float *sx, int64_t K, \
                          const uint8_t *qw, const uint16_t *dw, const uint16_t *mw,  \
                          float *y, int64_t N, int threads) {                         \
        OVER_TILES(tile_rows(MR, qx, dx, sx, K, qw, dw, mw, t, y, N))                 \
    }                                                                                  \
    static void rows8_##MR(const void *qx, const float *dx, const float *sx, int64_t K, \
                           const uint8_t *qw, const uint16_t *dw, const uint16_t *mw, \
                           float *y, int64_t N, int threads) {                        \
        OVER_TILES(tile_rows8(MR, qx, dx, sx, K, qw, dw, mw, t, y, N))                \
    }                                                                                  \
    static void q8rows_##MR(const void *qx, const int32_t *cs, const float *dx,        \
                            int64_t K, const uint8_t *qw, const uint16_t *dw, float *y, \
                            int64_t N, int threads) {                                  \
        OVER_TILES(tile_q8_rows(MR, qx, cs, dx, K, qw, dw, t, y, N))                  \
    }                                                                                  \
    static void q8rows8_##MR(const void *qx, const int32_t *cs, const float *dx,       \
                             int64_t K, const uint8_t *qw, const uint16_t *dw, float *y, \
                             int64_t N, int threads) {                                 \
        OVER_TILES(tile_q8_rows8(MR, qx, cs, dx, K, qw, dw, t, y, N))                 \
    }
ROWS(1)
ROWS(2)
ROWS(3)
ROWS(4)
ROWS(5)
ROWS(6)
ROWS(7)
ROWS(8)

typedef void (*rows_fn)(const void *, const float *, const float *, int64_t, const uint8_t *,
                        const uint16_t *, const uint16_t *, float *, int64_t, int);
static const rows_fn ROWS_OF[9] = {0, rows_1, rows_2, rows_3, rows_4,
                                   rows_5, rows_6, rows_7, rows_8};
static const rows_fn ROWS8_OF[9] = {0, rows8_1, rows8_2, rows8_3, rows8_4,
                                    rows8_5, rows8_6, rows8_7, rows8_8};
typedef void (*q8rows_fn)(const void *, const int32_t *, const float *, int64_t,
                          const uint8_t *, const uint16_t *, float *, int64_t, int);
static const q8rows_fn Q8ROWS_OF[9] = {0, q8rows_1, q8rows_2, q8rows_3, q8rows_4,
                                       q8rows_5, q8rows_6, q8rows_7, q8rows_8};
static const q8rows_fn Q8ROWS8_OF[9] = {0, q8rows8_1, q8rows8_2, q8rows8_3, q8rows8_4,
                                        q8rows8_5, q8rows8_6, q8rows8_7, q8rows8_8};

/* y (R, N) fp32 = x (R, K) fp32 times the packed weight (N, K); K a multiple of 32, N of 16;
 * the activations quantised to `bits` (16 or 8) bits; the weight Q4_1 (qw, dw, mw) or, where
 * mw is NULL, Q8_0 (qw, dw in the Q8_0 layout).
 * The rows come in chunks of `period` (R a multiple of it), of which the first `live` are real
 * and the rest padding (a fixed-shape step's padded tokens): only real rows are computed, a
 * padding row's output is 0 (live >= period: every row is real). Returns 0 (at once for no
 * rows), or -1 when the scratch memory could not be had. */
static int product(const float *x, int64_t R, int64_t K, const uint8_t *qw, const uint16_t *dw,
                   const uint16_t *mw, float *y, int64_t N, int threads, int64_t period,
                   int64_t live, int bits) {
    if (R <= 0) return 0; /* no rows: nothing to compute (y may be NULL) */
    if (period <= 0 || live < 0 || live >= period || R % period) period = live = R;
    const int64_t nb = K / GROUP, chunks = period ? R / period : 0, L = live * chunks;
    const int64_t width = bits == 8 ? 1 : 2; /* bytes an activation */
    /* the real rows of every chunk, one after another: blocks of 8 rows span the chunks */
    char *qx = malloc((size_t)(L * K + 1) * width);
    float *dx = malloc((size_t)(L * nb + 1) * sizeof(float));
    float *sx = malloc((size_t)(L * nb + 1) * sizeof(float));
    int32_t *cs = mw ? NULL : malloc((size_t)(L * nb + 1) * sizeof(int32_t));
    float *out = live == period ? y : malloc((size_t)(L * N + 1) * sizeof(float));
    if (!qx || !dx || !sx || (!mw && !cs) || !out) {
        free(qx);
        free(dx);
        free(sx);
        free(cs);
        if (out != y) free(out);
        return -1;
    }
    for (int64_t c = 0; c < chunks; c++) {
        if (bits == 8)
            quantize_rows8(x + c * period * K, live, K, (int8_t *)qx + c * live * K,
                           dx + c * live * nb, sx + c * live * nb);
        else
            quantize_rows(x + c * period * K, live, K, (int16_t *)qx + c * live * K,
                          dx + c * live * nb, sx + c * live * nb);
    }
#if PATH == 512
    if (!mw) block_sums(qx, L, K, bits, cs);
#endif
    for (int64_t r0 = 0; r0 < L; r0 += 8) {
        const int64_t mr = L - r0 < 8 ? L - r0 : 8;
        if (mw)
            (bits == 8 ? ROWS8_OF : ROWS_OF)[mr](qx + r0 * K * width, dx + r0 * nb,
                                                 sx + r0 * nb, K, qw, dw, mw, out + r0 * N, N,
                                                 threads);
        else
            (bits == 8 ? Q8ROWS8_OF : Q8ROWS_OF)[mr](qx + r0 * K * width, cs + r0 * nb,
                                                     dx + r0 * nb, K, qw, dw, out + r0 * N, N,
                                                     threads);
    }
    if (out != y) { /* each chunk's real rows back in place, its padding rows 0 */
        for (int64_t c = 0; c < chunks; c++) {
            memcpy(y + c * period * N, out + c * live * N, (size_t)(live * N) * sizeof(float));
            memset(y + (c * period + live) * N, 0, (size_t)((period - live) * N) * sizeof(float));
        }
        free(out);
    }
    free(qx);
    free(dx);
    free(sx);
    free(cs);
    return 0;
}

/* the product with 16-bit activations (the header's) */
int qmm_q4(const float *x, int64_t R, int64_t K, const uint8_t *qw, const uint16_t *dw,
           const uint16_t *mw, float *y, int64_t N, int threads, int64_t period, int64_t live) {
    return product(x, R, K, qw, dw, mw, y, N, threads, period, live, 16);
}

/* the product with 8-bit activations (quantize_rows8) */
int qmm_q4_a8(const float *x, int64_t R, int64_t K, const uint8_t *qw, const uint16_t *dw,
              const uint16_t *mw, float *y, int64_t N, int threads, int64_t period,
              int64_t live) {
    return product(x, R, K, qw, dw, mw, y, N, threads, period, live, 8);
}

/* a Q8_0 weight's products, 16-bit and 8-bit activations */
int qmm_q8(const float *x, int64_t R, int64_t K, const uint8_t *qw, const uint16_t *dw,
           float *y, int64_t N, int threads, int64_t period, int64_t live) {
    return product(x, R, K, qw, dw, NULL, y, N, threads, period, live, 16);
}

int qmm_q8_a8(const float *x, int64_t R, int64_t K, const uint8_t *qw, const uint16_t *dw,
              float *y, int64_t N, int threads, int64_t period, int64_t live) {
    return product(x, R, K, qw, dw, NULL, y, N, threads, period, live, 8);
}

/* which path this build took: 512 (AVX512-VNNI), 256 (AVX2) or 0 (plain C) */
int qmm_path(void) { return PATH; }
