/* y = x Wᵀ + b on the CPU, fp32, row-major W [N, K], x [M, K], y [M, N].
 *
 * Small-batch decode reads every weight once per step; this kernel makes that one pass count:
 * a tile of 4 weight rows is read from memory once and multiplied against the x rows three at a time
 * (4 × 3 accumulators of 8 lanes stay in registers), so at M = 1 it streams at the memory bandwidth and
 * at M = 8 it runs near the FMA peak. Threads split the output rows (OpenMP: the same thread pool as
 * PyTorch, which loaded libgomp first). Each output is summed by one thread in a fixed order: the result
 * does not depend on the thread count.
 */
#include <stdint.h>
#include <string.h>

typedef float v8f __attribute__((vector_size(32)));

static inline v8f load8(const float *p) {
    v8f v;
    memcpy(&v, p, sizeof v);
    return v;
}

static inline float hsum(v8f v) {
    float s = 0.f;
    for (int i = 0; i < 8; ++i) s += v[i];
    return s;
}

/* rw weight rows starting at r times rx x rows starting at m; rw, rx are constants after inlining. */
static inline __attribute__((always_inline)) void tile(const float *w, const float *x, const float *b, float *y,
                                                       int64_t K, int64_t N, int64_t r, int64_t m, int rw, int rx) {
    v8f acc[4][3] = {{{0}}};
    for (int64_t k = 0; k < K; k += 8) {
        v8f xv[3];
        for (int j = 0; j < rx; ++j) xv[j] = load8(x + (m + j) * K + k);
        for (int i = 0; i < rw; ++i) {
            v8f wv = load8(w + (r + i) * K + k);
            for (int j = 0; j < rx; ++j) acc[i][j] += wv * xv[j];
        }
    }
    for (int i = 0; i < rw; ++i)
        for (int j = 0; j < rx; ++j) y[(m + j) * N + r + i] = hsum(acc[i][j]) + (b ? b[r + i] : 0.f);
}

static inline __attribute__((always_inline)) void rows(const float *w, const float *x, const float *b, float *y,
                                                       int64_t M, int64_t K, int64_t N, int64_t r, int rw) {
    int64_t m = 0;
    for (; m + 3 <= M; m += 3) tile(w, x, b, y, K, N, r, m, rw, 3);
    if (M - m == 2) tile(w, x, b, y, K, N, r, m, rw, 2);
    if (M - m == 1) tile(w, x, b, y, K, N, r, m, rw, 1);
}

/* K must be a multiple of 8 (the Python side checks). b may be NULL. */
void cpu_linear(const float *x, const float *w, const float *b, float *y, int64_t M, int64_t K, int64_t N) {
    int64_t tiles = N / 4;
#pragma omp parallel for schedule(static)
    for (int64_t t = 0; t < tiles; ++t) rows(w, x, b, y, M, K, N, 4 * t, 4);
    for (int64_t r = 4 * tiles; r < N; ++r) rows(w, x, b, y, M, K, N, r, 1);
}
