/* The n-gram draft law after a context, in one call: engine/drafters/ngram.py's ngram_law
 * (that function's docstring states the law; engine/kernels/ngram.py calls this one).
 *
 * ctx (L,) token ids, oldest first. Every earlier end i < L - 1 of the newest token holds a
 * match whose length, up to top = min(max_n, L - 1), counts back while ctx[i - j] equals
 * ctx[L - 1 - j]; n = the longest such length; under min_n there is no law. Each end whose
 * match reaches n has a follower ctx[i + 1] and a start i - n + 1; a follower's weight is its
 * count + recency * (1 + its latest start) / L, normalised as numpy sums (pairwise). Writes the
 * k followers in ascending id order to tokens and their probabilities to probs (both hold at
 * least L entries; work holds 2 L), returns k (0: no law). */
#include <stdint.h>
#include <stdlib.h>

static int by_token(const void *a, const void *b) {
    int64_t x = ((const int64_t *)a)[0], y = ((const int64_t *)b)[0];
    return (x > y) - (x < y);
}

/* numpy's pairwise sum of n doubles (its order of additions, so the same bits) */
static double pairwise(const double *a, int64_t n) {
    if (n < 8) {
        double s = 0.0;
        for (int64_t i = 0; i < n; i++) s += a[i];
        return s;
    }
    if (n <= 128) {
        double r[8];
        for (int j = 0; j < 8; j++) r[j] = a[j];
        int64_t i;
        for (i = 8; i < n - (n % 8); i += 8)
            for (int j = 0; j < 8; j++) r[j] += a[i + j];
        double s = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]));
        for (; i < n; i++) s += a[i];
        return s;
    }
    int64_t n2 = n / 2;
    n2 -= n2 % 8;
    return pairwise(a, n2) + pairwise(a + n2, n - n2);
}

int64_t ngram_law(const int64_t *ctx, int64_t L, int64_t max_n, int64_t min_n,
                  double recency, int64_t *tokens, double *probs, int64_t *work) {
    int64_t top = max_n < L - 1 ? max_n : L - 1;
    if (top < min_n || top < 1) return 0;
    int64_t last = ctx[L - 1], best = 0;
    for (int64_t i = 0; i < L - 1; i++) { /* the longest match over every earlier end */
        if (ctx[i] != last) continue;
        int64_t len = 1;
        while (len < top && i - len >= 0 && ctx[i - len] == ctx[L - 1 - len]) len++;
        if (len > best) best = len;
    }
    if (best < min_n) return 0;
    int64_t h = 0; /* (follower, 1 + start) of each end whose match reaches best */
    for (int64_t i = 0; i < L - 1; i++) {
        if (ctx[i] != last) continue;
        int64_t len = 1;
        while (len < best && i - len >= 0 && ctx[i - len] == ctx[L - 1 - len]) len++;
        if (len < best) continue;
        work[2 * h] = ctx[i + 1];
        work[2 * h + 1] = i - best + 2;
        h++;
    }
    qsort(work, (size_t)h, 2 * sizeof(int64_t), by_token);
    int64_t k = 0;
    for (int64_t j = 0; j < h;) { /* one follower per run of equal ids */
        int64_t tok = work[2 * j], count = 0, latest = 0;
        for (; j < h && work[2 * j] == tok; j++) {
            count++;
            if (work[2 * j + 1] > latest) latest = work[2 * j + 1];
        }
        tokens[k] = tok;
        probs[k] = (double)count + recency * (double)latest / (double)L;
        k++;
    }
    double z = pairwise(probs, k);
    for (int64_t j = 0; j < k; j++) probs[j] /= z;
    return k;
}
