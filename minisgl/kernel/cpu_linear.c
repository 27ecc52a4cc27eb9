/* CPU 上的 y = x Wᵀ + b：fp32（权重也可以是 bf16），行优先，W [N, K]，x [M, K]，y [M, N]。
 *
 * 小批次解码每步把每个权重读一遍；这个内核让这一遍读得值：TILE_W 行权重从内存里读进来一次，每次同时乘 TILE_X
 * 行 x（TILE_W × TILE_X 个累加器都留在寄存器里），所以 M = 1 时按读带宽流过权重，M = 8 时每个权重读一遍就够。
 * 向量宽度和分块按编译它的 CPU 定（-march=native）：AVX-512 有 32 个 16 路寄存器，4 × 6 个累加器加 6 行 x、
 * 1 行权重正好放下，M = 8 只要两趟；AVX2 / NEON 只有 16 个 8 路（或 4 路）寄存器，放得下 4 × 3。
 * 边算这一块边预取下一块权重（何时、预取进哪一级缓存在这颗 CPU 上现量，见 pf_split）。
 * x 行数多（M ≥ GEMM_FROM，长提示词的预填充）时换成矩阵乘的分块（gemm_panel）：权重的读取已经摊薄，省的是 hsum。
 * 再往上（M 超过测量过的行数）Python 那边改用 F.linear——在哪儿换由第一次用到时的测量决定。
 * 权重也可以是 bf16（cpu_linear_bf16w）：读的字节减半，读进寄存器后左移 16 位就是同值的 fp32，照样 fp32 累加。
 * CPU 有 AVX512_BF16 时另有 cpu_linear_bf16：x、权重都是 bf16，vdpbf16ps 一条指令做 16 对 bf16 乘、fp32 累加
 * （每条 32 个乘加，是 fp32 FMA 的两倍，也省了左移）；x 是 bf16，与 Hugging Face 用 bf16 跑模型时一样。
 * 线程按输出行分工（OpenMP：与 PyTorch 同一个线程池，libgomp 已由 PyTorch 先加载）。每个输出由一个线程
 * 按固定顺序求和：结果与线程数无关。
 */
#include <stdint.h>
#include <string.h>
#if defined(__AVX512F__) || defined(__AVX2__)
#include <immintrin.h>
#endif

/* 预取下一块权重：前 pf_split 趟分摊（每趟 TILE_W / pf_split 行），x 至少 pf_from 行时才预取；pf_lockstep 时
 * 这几行与正在算的列同步往前走，否则一行接一行地扫；pf_l2 时预取进 L2，否则进 L1。哪组好因 CPU 而异：AVX-512 的
 * 至强上，第一趟就把下一块四行同步预取进 L2，M = 1、2、8 快 3–38%；AVX2 的 Zen 1 上 M = 1 时预取反而慢 3–7%，只在 x
 * 多于一趟时、由前两趟分摊才好。下面的 PF_* 是编译时按指令集给的初值；Python 第一次加载库时在这颗 CPU 上把几组
 * 现量一遍（minisgl/kernel 的 prefetch_plan），用 cpu_linear_set_prefetch 换成最快的那组。预取只改快慢，不改结果。 */
#if defined(__AVX512F__)
#define VW 16 /* 一个向量寄存器放几个 float */
#define TILE_W 4
#define TILE_X 6
#define PF_SPLIT 1
#define PF_FROM 1
#define PF_LOCKSTEP 1
#define PF_LOCALITY 2
#else
#define VW 8
#define TILE_W 4
#define TILE_X 3
#define PF_SPLIT 2
#define PF_FROM (TILE_X + 1)
#define PF_LOCKSTEP 0
#define PF_LOCALITY 3
#endif

static int pf_split = PF_SPLIT, pf_from = PF_FROM, pf_lockstep = PF_LOCKSTEP, pf_l2 = PF_LOCALITY == 2;

/* 换一组预取的做法（split 要整除 TILE_W；from 很大就是不预取）。在没有线程正在算的时候调用。 */
void cpu_linear_set_prefetch(int split, int from, int lockstep, int l2) {
    pf_split = split == 1 || split == 2 || split == 4 ? split : 1;
    pf_from = from, pf_lockstep = lockstep, pf_l2 = l2;
}

/* __builtin_prefetch 的第三个参数必须是常数：进 L2 是 2，进 L1 是 3。 */
#define PREFETCH(a) (pf_l2 ? __builtin_prefetch((a), 0, 2) : __builtin_prefetch((a), 0, 3))

typedef float vf __attribute__((vector_size(VW * sizeof(float))));
typedef float v8f __attribute__((vector_size(8 * sizeof(float))));
typedef uint16_t vh __attribute__((vector_size(VW * sizeof(uint16_t))));
typedef uint16_t v8h __attribute__((vector_size(8 * sizeof(uint16_t))));
typedef uint32_t vu __attribute__((vector_size(VW * sizeof(uint32_t))));
typedef uint32_t v8u __attribute__((vector_size(8 * sizeof(uint32_t))));

/* 读一个向量（不要求对齐）。 */
#define LOAD(type, p) ({ type v_; memcpy(&v_, (p), sizeof v_); v_; })
/* 第 i 个权重起的一个向量：fp32 直接读；bf16 是 fp32 的高 16 位，补上低 16 位的 0 就是同一个数。 */
#define LOAD_W(vtype, htype, utype, w, i, bf16)                                                        \
    ((bf16) ? (vtype)(__builtin_convertvector(LOAD(htype, (const uint16_t *)(w) + (i)), utype) << 16) \
            : LOAD(vtype, (const float *)(w) + (i)))

static inline float hsum(vf v) {
#if defined(__AVX512F__)
    return _mm512_reduce_add_ps((__m512)v);
#endif
    float s = 0.f;
    for (int i = 0; i < VW; ++i) s += v[i];
    return s;
}

static inline float hsum8(v8f v) {
    float s = 0.f;
    for (int i = 0; i < 8; ++i) s += v[i];
    return s;
}

/* 从第 r 行起的 rw 行权重 × 从第 m 行起的 rx 行 x；内联后 rw、rx 都是常数，循环全部展开。
 * K 是 8 的倍数：AVX-512 上 K 不是 16 的倍数时，最后 8 列用 8 路向量补上。 */
static inline __attribute__((always_inline)) void tile(const void *w, const float *x, const float *b, float *y,
                                                       int64_t K, int64_t N, int64_t r, int64_t m, int rw, int rx,
                                                       const char *pf, int bf16) {
    vf acc[TILE_W][TILE_X] = {{{0}}};
    v8f tail[TILE_W][TILE_X] = {{{0}}};
    const int64_t kv = K - K % VW;
    for (int64_t k = 0; k < kv; k += VW) {
        if (pf) { /* 这一趟分到的那几行（连续的 TILE_W / pf_split × K 个权重）里这一步的一份：每 64 字节一条指令 */
            const int bytes = bf16 ? 2 : 4, rows = TILE_W / pf_split;
            if (pf_lockstep) /* 每行里与这一步同一列的那段 */
                for (int i = 0; i < rows; ++i)
                    for (int l = 0; l < VW * bytes; l += 64) PREFETCH(pf + (i * K + k) * bytes + l);
            else /* 把这几行当成一整段，每步往前扫 rows 倍 */
                for (int l = 0; l < rows * VW * bytes; l += 64) PREFETCH(pf + rows * k * bytes + l);
        }
        vf xv[TILE_X];
        for (int j = 0; j < rx; ++j) xv[j] = LOAD(vf, x + (m + j) * K + k);
        for (int i = 0; i < rw; ++i) {
            vf wv = LOAD_W(vf, vh, vu, w, (r + i) * K + k, bf16);
            for (int j = 0; j < rx; ++j) acc[i][j] += wv * xv[j];
        }
    }
    for (int64_t k = kv; VW > 8 && k < K; k += 8) /* AVX2 / NEON 上 kv 就是 K：整段编译时去掉 */
        for (int i = 0; i < rw; ++i)
            for (int j = 0; j < rx; ++j)
                tail[i][j] += LOAD_W(v8f, v8h, v8u, w, (r + i) * K + k, bf16) * LOAD(v8f, x + (m + j) * K + k);
    for (int i = 0; i < rw; ++i)
        for (int j = 0; j < rx; ++j)
            y[(m + j) * N + r + i] = hsum(acc[i][j]) + hsum8(tail[i][j]) + (b ? b[r + i] : 0.f);
}

/* 第 pass 趟要预取的那几行从哪儿起（不预取时是 NULL）。每一行权重都是一段新的内存，硬件预取器每行都要重新
 * 认出这条流；x 行数多时每读一行要算得更久，等它认出来就晚了。x 一趟放不下时后几趟只算不读，内存总线闲着，
 * 正好预取。 */
static inline const char *prefetch(const void *w, int64_t M, int64_t K, int64_t N, int64_t r, int rw, int64_t pass,
                                   int bf16) {
    const int64_t row = K * (bf16 ? 2 : 4); /* 一行权重的字节数 */
    return (M >= pf_from && rw == TILE_W && r + 2 * TILE_W <= N && pass < pf_split)
               ? (const char *)w + (r + TILE_W + pass * (TILE_W / pf_split)) * row : 0;
}

static inline __attribute__((always_inline)) void rows(const void *w, const float *x, const float *b, float *y,
                                                       int64_t M, int64_t K, int64_t N, int64_t r, int rw, int bf16) {
    int64_t m = 0;
    for (; m + TILE_X <= M; m += TILE_X)
        tile(w, x, b, y, K, N, r, m, rw, TILE_X, prefetch(w, M, K, N, r, rw, m / TILE_X, bf16), bf16);
    const char *pf = prefetch(w, M, K, N, r, rw, m / TILE_X, bf16);
    switch (M - m) { /* 剩下的几行：每种行数各展开一份 */
#define REST(n) case n: if (n < TILE_X) tile(w, x, b, y, K, N, r, m, rw, n, pf, bf16); break;
        REST(1) REST(2) REST(3) REST(4) REST(5) REST(6) REST(7)
#undef REST
    }
}

/* ---- x 行数多（长提示词的预填充）时换一种分块 ----
 * 上面那种写法每个输出要在最后把一个向量的各路加起来（hsum），K 短时这笔账不小；而且每步要读 TILE_X 行 x 和
 * TILE_W 行权重才做 TILE_W × TILE_X 次乘加。x 行数多时权重的读取早已摊薄，该比的是乘加之外的指令：
 * 换成「一个 x 值广播成向量 × 一段连续的输出列」——累加器直接就是 y 的一段，不用 hsum。这要权重按列（k）连续：
 * 每次取 NR 行权重的 KC 列，在缓存里转置成 panel[k][NR]（16 × 16 一块，四轮交错），再让所有 x 行扫过它。
 * 转置的开销是每个权重一次，乘加是每个权重 M 次：所以只在 M ≥ GEMM_FROM 时走这条路。 */
#if defined(__AVX512F__)
#define NRV 4 /* 一次算几个向量宽的输出列：MR × NRV 个累加器 + NRV 个权重向量 ≤ 32 个寄存器 */
#else
#define NRV 2 /* 16 个寄存器：6 × 2 个累加器 + 2 个权重向量 + 1 个广播 */
#endif
#define NR (NRV * VW)
#define MR 6
#define KC 256 /* 一次转置几列：KC × NR 个 float 的 panel 留在 L2（AVX-512 上 64 KiB） */
#define GEMM_FROM 32

/* 把 VW 个向量当成 VW × VW 的方阵转置：log2(VW) 轮，每轮把第 i 个与第 i + VW/2 个交错（前半、后半各一个）。 */
static inline void transpose(vf r[VW]) {
#if VW == 16
    const vu lo = {0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23}, hi = lo + 8;
#else
    const vu lo = {0, 8, 1, 9, 2, 10, 3, 11}, hi = lo + 4;
#endif
    for (int round = VW; round > 1; round /= 2) {
        vf t[VW];
        for (int i = 0; i < VW / 2; ++i) {
            t[2 * i] = __builtin_shuffle(r[i], r[i + VW / 2], lo);
            t[2 * i + 1] = __builtin_shuffle(r[i], r[i + VW / 2], hi);
        }
        memcpy(r, t, sizeof t);
    }
}

/* panel[k][c] = W[n + c][k0 + k]（c < NR，k < kc），bf16 权重顺便变成 fp32。 */
static inline void pack(const void *w, int64_t K, int64_t n, int64_t k0, int64_t kc, float *panel, int bf16) {
    const int64_t kv = kc - kc % VW;
    for (int c = 0; c < NR; c += VW)
        for (int64_t k = 0; k < kv; k += VW) {
            vf r[VW];
            for (int i = 0; i < VW; ++i) r[i] = LOAD_W(vf, vh, vu, w, (n + c + i) * K + k0 + k, bf16);
            transpose(r);
            for (int i = 0; i < VW; ++i) memcpy(panel + (k + i) * NR + c, &r[i], sizeof r[i]);
        }
    for (int64_t k = kv; k < kc; ++k) /* K 不是 VW 的倍数时剩下的几列（AVX-512 上 K = 16j + 8） */
        for (int c = 0; c < NR; ++c) {
            const int64_t i = (n + c) * K + k0 + k;
            const uint32_t u = bf16 ? (uint32_t)((const uint16_t *)w)[i] << 16 : 0;
            if (bf16) memcpy(panel + k * NR + c, &u, sizeof u);
            else panel[k * NR + c] = ((const float *)w)[i];
        }
}

/* y[m..m+mr) 的第 n..n+NR 列 += x 的那几行（第 k0 列起 kc 列）× panel；first：从 0 起算，last：最后加偏置。 */
static inline __attribute__((always_inline)) void gemm_tile(const float *panel, const float *x, const float *b, float *y,
                                                            int64_t K, int64_t N, int64_t n, int64_t m, int mr,
                                                            int64_t k0, int64_t kc, int first, int last) {
    vf acc[MR][NRV];
    for (int i = 0; i < mr; ++i)
        for (int c = 0; c < NRV; ++c) acc[i][c] = first ? (vf){0} : LOAD(vf, y + (m + i) * N + n + c * VW);
    for (int64_t k = 0; k < kc; ++k) {
        vf wv[NRV];
        for (int c = 0; c < NRV; ++c) wv[c] = LOAD(vf, panel + k * NR + c * VW);
        for (int i = 0; i < mr; ++i) {
            const float xs = x[(m + i) * K + k0 + k];
            for (int c = 0; c < NRV; ++c) acc[i][c] += wv[c] * xs;
        }
    }
    for (int i = 0; i < mr; ++i)
        for (int c = 0; c < NRV; ++c) {
            vf v = acc[i][c];
            if (last && b) v += LOAD(vf, b + n + c * VW);
            memcpy(y + (m + i) * N + n + c * VW, &v, sizeof v);
        }
}

/* 第 n 行起的 NR 行权重的输出：K 按 KC 分段，每段转置一次，所有 x 行扫过它。每个输出仍由一个线程按固定顺序求和。 */
static inline __attribute__((always_inline)) void gemm_panel(const void *w, const float *x, const float *b, float *y,
                                                             int64_t M, int64_t K, int64_t N, int64_t n, int bf16) {
    float panel[KC * NR] __attribute__((aligned(64)));
    for (int64_t k0 = 0; k0 < K; k0 += KC) {
        const int64_t kc = K - k0 < KC ? K - k0 : KC;
        const int first = k0 == 0, last = k0 + kc == K;
        pack(w, K, n, k0, kc, panel, bf16);
        int64_t m = 0;
        for (; m + MR <= M; m += MR) gemm_tile(panel, x, b, y, K, N, n, m, MR, k0, kc, first, last);
        switch (M - m) { /* 剩下的几行：每种行数各展开一份 */
#define REST(r) case r: gemm_tile(panel, x, b, y, K, N, n, m, r, k0, kc, first, last); break;
            REST(1) REST(2) REST(3) REST(4) REST(5)
#undef REST
        }
    }
}

static inline __attribute__((always_inline)) void linear(const float *x, const void *w, const float *b, float *y,
                                                         int64_t M, int64_t K, int64_t N, int bf16) {
    const int64_t panels = M >= GEMM_FROM ? N / NR : 0, done = panels * NR; /* 前 done 行权重按 panel 算 */
    const int64_t tiles = (N - done) / TILE_W;
#pragma omp parallel
    {
#pragma omp for schedule(static) nowait
        for (int64_t p = 0; p < panels; ++p) gemm_panel(w, x, b, y, M, K, N, NR * p, bf16);
#pragma omp for schedule(static)
        for (int64_t t = 0; t < tiles; ++t) rows(w, x, b, y, M, K, N, done + TILE_W * t, TILE_W, bf16);
    }
    for (int64_t r = done + TILE_W * tiles; r < N; ++r) rows(w, x, b, y, M, K, N, r, 1, bf16);
}

/* K 必须是 8 的倍数（Python 那边检查过）；b 可以是 NULL。 */
void cpu_linear(const float *x, const float *w, const float *b, float *y, int64_t M, int64_t K, int64_t N) {
    linear(x, w, b, y, M, K, N, 0);
}

/* 同上，只是 w 是 bf16（按 uint16 存）；x、b、y 仍是 fp32。 */
void cpu_linear_bf16w(const float *x, const uint16_t *w, const float *b, float *y, int64_t M, int64_t K, int64_t N) {
    linear(x, w, b, y, M, K, N, 1);
}

/* 编这个库的 CPU 有没有 AVX512_BF16（有才有 cpu_linear_bf16）。 */
int cpu_linear_bf16_dot(void) {
#if defined(__AVX512BF16__) && defined(__AVX512BW__)
    return 1;
#else
    return 0;
#endif
}

#if defined(__AVX512BF16__) && defined(__AVX512BW__)
/* fp32 舍入到最近的 bf16（一样近时取偶数），与 PyTorch 的 .to(torch.bfloat16) 逐位相同。 */
static inline uint16_t to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40); /* NaN 仍是 NaN */
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1)) >> 16);
}

/* 同 tile，只是 x、权重都是 bf16：一个寄存器放 32 个 bf16（16 对），vdpbf16ps 把每对的两个乘积加进 16 个 fp32
 * 累加器。K 不是 32 的倍数时最后一段用掩码读（读不到的位置是 0，乘出来也是 0）。结果加上偏置后舍入成 bf16。 */
static inline __attribute__((always_inline)) void tile_dot(const uint16_t *w, const uint16_t *x, const float *b,
                                                           uint16_t *y, int64_t K, int64_t N, int64_t r, int64_t m,
                                                           int rw, int rx, const char *pf) {
    __m512 acc[TILE_W][TILE_X];
    for (int i = 0; i < rw; ++i)
        for (int j = 0; j < rx; ++j) acc[i][j] = _mm512_setzero_ps();
    const int64_t kv = K - K % 32;
    for (int64_t k = 0; k < kv; k += 32) {
        if (pf) /* 这一趟分到的每行里与这一步同一列的 64 字节（同步预取） */
            for (int i = 0; i < TILE_W / pf_split; ++i) PREFETCH(pf + (i * K + k) * 2);
        __m512bh xv[TILE_X];
        for (int j = 0; j < rx; ++j) xv[j] = (__m512bh)_mm512_loadu_si512(x + (m + j) * K + k);
        for (int i = 0; i < rw; ++i) {
            __m512bh wv = (__m512bh)_mm512_loadu_si512(w + (r + i) * K + k);
            for (int j = 0; j < rx; ++j) acc[i][j] = _mm512_dpbf16_ps(acc[i][j], wv, xv[j]);
        }
    }
    if (kv < K) {
        const __mmask32 mask = (__mmask32)((1ull << (K - kv)) - 1);
        __m512bh xv[TILE_X];
        for (int j = 0; j < rx; ++j) xv[j] = (__m512bh)_mm512_maskz_loadu_epi16(mask, x + (m + j) * K + kv);
        for (int i = 0; i < rw; ++i) {
            __m512bh wv = (__m512bh)_mm512_maskz_loadu_epi16(mask, w + (r + i) * K + kv);
            for (int j = 0; j < rx; ++j) acc[i][j] = _mm512_dpbf16_ps(acc[i][j], wv, xv[j]);
        }
    }
    for (int i = 0; i < rw; ++i)
        for (int j = 0; j < rx; ++j)
            y[(m + j) * N + r + i] = to_bf16(_mm512_reduce_add_ps(acc[i][j]) + (b ? b[r + i] : 0.f));
}

static inline __attribute__((always_inline)) void rows_dot(const uint16_t *w, const uint16_t *x, const float *b,
                                                           uint16_t *y, int64_t M, int64_t K, int64_t N, int64_t r,
                                                           int rw) {
    int64_t m = 0;
    for (; m + TILE_X <= M; m += TILE_X) tile_dot(w, x, b, y, K, N, r, m, rw, TILE_X, prefetch(w, M, K, N, r, rw, m / TILE_X, 1));
    const char *pf = prefetch(w, M, K, N, r, rw, m / TILE_X, 1);
    switch (M - m) {
#define REST(n) case n: if (n < TILE_X) tile_dot(w, x, b, y, K, N, r, m, rw, n, pf); break;
        REST(1) REST(2) REST(3) REST(4) REST(5) REST(6) REST(7)
#undef REST
    }
}

/* x、w、y 都是 bf16（按 uint16 存），b 是 fp32（可以是 NULL）；K 任意（Python 那边仍要求 8 的倍数）。 */
void cpu_linear_bf16(const uint16_t *x, const uint16_t *w, const float *b, uint16_t *y, int64_t M, int64_t K, int64_t N) {
    int64_t tiles = N / TILE_W;
#pragma omp parallel for schedule(static)
    for (int64_t t = 0; t < tiles; ++t) rows_dot(w, x, b, y, M, K, N, TILE_W * t, TILE_W);
    for (int64_t r = TILE_W * tiles; r < N; ++r) rows_dot(w, x, b, y, M, K, N, r, 1);
}
#endif

/* ---- 量化的权重（第 5.4 章）：读 1 个或半个字节，在寄存器里变回 fp32 再乘 ----
 * int8，每个输出行一个 fp32 的 scale：y[m, n] = scale[n] · Σ_k x[m, k] q[n, k] + b[n]。整行共用一个 scale，
 * 所以先按整数值累加，最后乘一次——与 fp32 那条路一样的分块，只是每个权重读进来时从 int8 变成 fp32。
 * int4 按组（每 group 个输入列一组，group 是 32 的倍数），每组一个 scale 和一个偏移 zs：w = q · scale + zs。字节的排法与 llama.cpp 的 Q4_0 一样：每 32 列一块 16 个字节，第 i 个
 * 字节的低 4 位是第 i 列、高 4 位是第 i + 16 列——一次读 16 个字节，与 15 按位与、右移 4 位，就得到两段连续的
 * 16 列，不用任何重排。组内先把权重还原（一次 FMA），再乘 x 累加。
 * 这两个函数只管解码的几行 x；行数多（预填充）时 Python 那边还原整块权重、交给 F.linear。 */
typedef int8_t vi8 __attribute__((vector_size(VW)));
typedef int8_t v8i8 __attribute__((vector_size(8)));
typedef uint8_t vu8 __attribute__((vector_size(VW)));
typedef int32_t vi32 __attribute__((vector_size(VW * sizeof(int32_t))));
typedef int32_t v8i32 __attribute__((vector_size(8 * sizeof(int32_t))));
/* 整数向量变成 fp32：先扩成 32 位整数再转（一步转时 GCC 会逐个元素地转） */
#define TO_F32(v, itype, ftype) __builtin_convertvector(__builtin_convertvector((v), itype), ftype)
/* VW 个有符号的 int8 变成 fp32：GCC 把有符号的扩展逐个元素地做，x86 上直接用扩展指令（vpmovsxbd） */
static inline vf load_i8(const int8_t *p) {
#if defined(__AVX512F__)
    return (vf)_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)p)));
#elif defined(__AVX2__)
    return (vf)_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)p)));
#else
    return TO_F32(LOAD(vi8, p), vi32, vf);
#endif
}
#define QX 4 /* int4 一块同时乘几行 x：还原后的权重、每行的 scale 和偏移也要寄存器 */

static inline __attribute__((always_inline)) void tile_q8(const int8_t *w, const float *scale, const float *x,
                                                          const float *b, float *y, int64_t K, int64_t N, int64_t r,
                                                          int64_t m, int rw, int rx, const int8_t *pf) {
    vf acc[TILE_W][TILE_X] = {{{0}}};
    v8f tail[TILE_W][TILE_X] = {{{0}}};
    const int64_t kv = K - K % VW;
    for (int64_t k = 0; k < kv; k += VW) {
        if (pf && k % 64 == 0) /* 下一块的几行里与这一步同一列的 64 字节（与 fp32 那条路一样同步预取） */
            for (int i = 0; i < TILE_W; ++i) PREFETCH(pf + i * K + k);
        vf xv[TILE_X];
        for (int j = 0; j < rx; ++j) xv[j] = LOAD(vf, x + (m + j) * K + k);
        for (int i = 0; i < rw; ++i) {
            vf wv = load_i8(w + (r + i) * K + k);
            for (int j = 0; j < rx; ++j) acc[i][j] += wv * xv[j];
        }
    }
    for (int64_t k = kv; VW > 8 && k < K; k += 8)
        for (int i = 0; i < rw; ++i)
            for (int j = 0; j < rx; ++j)
                tail[i][j] += TO_F32(LOAD(v8i8, w + (r + i) * K + k), v8i32, v8f) * LOAD(v8f, x + (m + j) * K + k);
    for (int i = 0; i < rw; ++i)
        for (int j = 0; j < rx; ++j)
            y[(m + j) * N + r + i] = (hsum(acc[i][j]) + hsum8(tail[i][j])) * scale[r + i] + (b ? b[r + i] : 0.f);
}

static inline __attribute__((always_inline)) void rows_q8(const int8_t *w, const float *scale, const float *x,
                                                          const float *b, float *y, int64_t M, int64_t K, int64_t N,
                                                          int64_t r, int rw) {
    /* 只在第一趟 x 时预取下一块权重（之后几趟读的是已在缓存里的这一块） */
    const int8_t *pf = M >= pf_from && rw == TILE_W && r + 2 * TILE_W <= N ? w + (r + TILE_W) * K : 0;
    int64_t m = 0;
    for (; m + TILE_X <= M; m += TILE_X) tile_q8(w, scale, x, b, y, K, N, r, m, rw, TILE_X, m ? 0 : pf);
    switch (M - m) {
#define REST(n) case n: if (n < TILE_X) tile_q8(w, scale, x, b, y, K, N, r, m, rw, n, m ? 0 : pf); break;
        REST(1) REST(2) REST(3) REST(4) REST(5) REST(6) REST(7)
#undef REST
    }
}

/* K 是 8 的倍数；scale [N]；b 可以是 NULL。 */
void cpu_linear_q8(const float *x, const int8_t *w, const float *scale, const float *b, float *y, int64_t M, int64_t K,
                   int64_t N) {
    const int64_t tiles = N / TILE_W;
#pragma omp parallel for schedule(static)
    for (int64_t t = 0; t < tiles; ++t) rows_q8(w, scale, x, b, y, M, K, N, TILE_W * t, TILE_W);
    for (int64_t r = TILE_W * tiles; r < N; ++r) rows_q8(w, scale, x, b, y, M, K, N, r, 1);
}

static inline __attribute__((always_inline)) void tile_q4(const uint8_t *w, const float *scale, const float *zs,
                                                          const float *x, const float *b, float *y, int64_t K,
                                                          int64_t N, int64_t group, int64_t r, int64_t m, int rw,
                                                          int rx, const uint8_t *pf) {
    vf acc[TILE_W][QX] = {{{0}}};
    const int64_t groups = K / group;
    for (int64_t g = 0; g < groups; ++g) {
        vf sv[TILE_W], zv[TILE_W];
        for (int i = 0; i < rw; ++i) {
            sv[i] = (vf){0} + scale[(r + i) * groups + g];
            zv[i] = (vf){0} + zs[(r + i) * groups + g];
        }
        for (int64_t k = g * group; k < (g + 1) * group; k += 32) {
            if (pf && k % 128 == 0) /* 128 列是 64 字节 */
                for (int i = 0; i < TILE_W; ++i) PREFETCH(pf + (i * K + k) / 2);
            for (int h = 0; h < 16; h += VW) /* 16 个字节：AVX-512 一次，AVX2 / NEON 两次 */
                for (int half = 0; half < 2; ++half) { /* 低 4 位：第 k + h 列起；高 4 位：第 k + 16 + h 列起 */
                    vf xv[QX];
                    for (int j = 0; j < rx; ++j) xv[j] = LOAD(vf, x + (m + j) * K + k + 16 * half + h);
                    for (int i = 0; i < rw; ++i) {
                        vu8 bytes = LOAD(vu8, w + ((r + i) * K + k) / 2 + h);
                        vu8 q = half ? bytes >> 4 : bytes & 15;
                        vf wv = TO_F32(q, vi32, vf) * sv[i] + zv[i];
                        for (int j = 0; j < rx; ++j) acc[i][j] += wv * xv[j];
                    }
                }
        }
    }
    for (int i = 0; i < rw; ++i)
        for (int j = 0; j < rx; ++j) y[(m + j) * N + r + i] = hsum(acc[i][j]) + (b ? b[r + i] : 0.f);
}

static inline __attribute__((always_inline)) void rows_q4(const uint8_t *w, const float *scale, const float *zs,
                                                          const float *x, const float *b, float *y, int64_t M,
                                                          int64_t K, int64_t N, int64_t group, int64_t r, int rw) {
    const uint8_t *pf = M >= pf_from && rw == TILE_W && r + 2 * TILE_W <= N ? w + (r + TILE_W) * K / 2 : 0;
    int64_t m = 0;
    for (; m + QX <= M; m += QX) tile_q4(w, scale, zs, x, b, y, K, N, group, r, m, rw, QX, m ? 0 : pf);
    switch (M - m) {
#define REST(n) case n: if (n < QX) tile_q4(w, scale, zs, x, b, y, K, N, group, r, m, rw, n, m ? 0 : pf); break;
        REST(1) REST(2) REST(3)
#undef REST
    }
}

/* w [N, K / 2]（上面说的排法）；scale、zs（偏移）[N, K / group]；K 是 group 的倍数，group 是 32 的倍数；b 可以是 NULL。 */
void cpu_linear_q4(const float *x, const uint8_t *w, const float *scale, const float *zs, const float *b, float *y,
                   int64_t M, int64_t K, int64_t N, int64_t group) {
    const int64_t tiles = N / TILE_W;
#pragma omp parallel for schedule(static)
    for (int64_t t = 0; t < tiles; ++t) rows_q4(w, scale, zs, x, b, y, M, K, N, group, TILE_W * t, TILE_W);
    for (int64_t r = TILE_W * tiles; r < N; ++r) rows_q4(w, scale, zs, x, b, y, M, K, N, group, r, 1);
}
