/* CPU 上的 y = x Wᵀ + b：fp32，行优先，W [N, K]，x [M, K]，y [M, N]。
 *
 * 小批次解码每步把每个权重读一遍；这个内核让这一遍读得值：4 行权重从内存里读进来一次，每次同时乘 3 行 x
 * （4 × 3 个 8 路累加器都留在寄存器里），所以 M = 1 时按读带宽流过权重，M = 8 时接近乘加峰值。
 * x 多于 3 行时同一块权重要乘好几趟，趁后几趟只算不读的空当预取下一块权重（M = 8 时快约两成）。
 * x 不分块：M 很大（长提示词的预填充）时 Python 那边改用 F.linear。
 * 线程按输出行分工（OpenMP：与 PyTorch 同一个线程池，libgomp 已由 PyTorch 先加载）。每个输出由一个线程
 * 按固定顺序求和：结果与线程数无关。
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

/* 从第 r 行起的 rw 行权重 × 从第 m 行起的 rx 行 x；内联后 rw、rx 都是常数，循环全部展开。 */
static inline __attribute__((always_inline)) void tile(const float *w, const float *x, const float *b, float *y,
                                                       int64_t K, int64_t N, int64_t r, int64_t m, int rw, int rx,
                                                       const float *pf) {
    v8f acc[4][3] = {{{0}}};
    for (int64_t k = 0; k < K; k += 8) {
        if (pf) __builtin_prefetch(pf + 2 * k);
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

/* x 多于 3 行时，同一块 4 行权重要乘好几趟（每趟 3 行 x）：第一趟的权重来自内存，后几趟来自缓存、只算不读，
 * 这时内存总线是闲着的。所以前两趟各顺手预取下一块权重的一半。只有一趟时（M ≤ 3）硬件预取已经够了，不插手。 */
static inline const float *prefetch(const float *w, int64_t M, int64_t K, int64_t N, int64_t r, int rw, int64_t pass) {
    return (M > 3 && rw == 4 && r + 8 <= N && pass < 2) ? w + (r + 4) * K + pass * 2 * K : 0;
}

static inline __attribute__((always_inline)) void rows(const float *w, const float *x, const float *b, float *y,
                                                       int64_t M, int64_t K, int64_t N, int64_t r, int rw) {
    int64_t m = 0;
    for (; m + 3 <= M; m += 3) tile(w, x, b, y, K, N, r, m, rw, 3, prefetch(w, M, K, N, r, rw, m / 3));
    if (M - m == 2) tile(w, x, b, y, K, N, r, m, rw, 2, prefetch(w, M, K, N, r, rw, m / 3));
    if (M - m == 1) tile(w, x, b, y, K, N, r, m, rw, 1, prefetch(w, M, K, N, r, rw, m / 3));
}

/* K 必须是 8 的倍数（Python 那边检查过）；b 可以是 NULL。 */
void cpu_linear(const float *x, const float *w, const float *b, float *y, int64_t M, int64_t K, int64_t N) {
    int64_t tiles = N / 4;
#pragma omp parallel for schedule(static)
    for (int64_t t = 0; t < tiles; ++t) rows(w, x, b, y, M, K, N, 4 * t, 4);
    for (int64_t r = 4 * tiles; r < N; ++r) rows(w, x, b, y, M, K, N, r, 1);
}
