/* 一整步解码的全部解码层，一次调用算完（CPU）：Python 每层要发几十个小算子，每个都有固定开销，
 * 小模型上这些开销比读权重还费时；这里同样的计算一次做完，Python 只剩嵌入、最后的归一化和 LM head。
 *
 * 每层与 solutions/stage1 的参考实现一一对应：RMSNorm → 合并的 qkv → （Qwen3 的）q/k 归一化 → RoPE →
 * K/V 写进槽位 → 按页表读 K/V 算注意力 → o_proj 加回残差 → RMSNorm → gate_up → silu(gate)·up → down_proj
 * 加回残差。线性层用 cpu_linear.c 的内核；注意力按（请求, 头）分给线程，各自按固定顺序求和。
 *
 * 权重和 KV 缓存可以是 fp32 或 bf16（Shape.weights），层循环只有一份。bf16 时激活仍以 fp32 存在草稿里，但在
 * 逐层的 bf16 引擎（以及 Hugging Face 的 bf16）把结果存成 bf16 的每个地方都舍入一次（rnd）：残差、归一化、
 * 每个线性层的输出、RoPE 的每个乘积与和、注意力输出、silu 和它乘 up 的积；只差这些舍入，贪心的 token 就会分岔。
 * 线性层读 bf16 权重：CPU 有 AVX512_BF16 时用 vdpbf16ps（输入先舍入成 bf16），否则读进来左移 16 位成 fp32 再 FMA。
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

void cpu_linear(const float *x, const float *w, const float *b, float *y, int64_t M, int64_t K, int64_t N);
void cpu_linear_bf16w(const float *x, const uint16_t *w, const float *b, float *y, int64_t M, int64_t K, int64_t N);
void cpu_linear_q8(const float *x, const int8_t *w, const float *scale, const float *b, float *y, int64_t M, int64_t K,
                   int64_t N);
void cpu_linear_q4(const float *x, const uint8_t *w, const float *scale, const float *zs, const float *b, float *y,
                   int64_t M, int64_t K, int64_t N, int64_t group);
#if defined(__AVX512BF16__) && defined(__AVX512BW__)
#define HAVE_BF16_DOT 1
void cpu_linear_bf16(const uint16_t *x, const uint16_t *w, const float *b, uint16_t *y, int64_t M, int64_t K, int64_t N);
#else
#define HAVE_BF16_DOT 0
#endif

/* 每层的指针表（Python 那边按这个顺序填，没有的项填 0）。归一化权重和偏置总是 fp32（bf16 模型由 Python 另存
 * 一份 fp32 副本）；线性层的权重和 K/V 缓存是 Shape.weights 说的类型。 */
enum { IN_NORM, QKV_W, QKV_B, Q_NORM, K_NORM, O_W, O_B, POST_NORM, GATE_UP_W, GATE_UP_B, DOWN_W, DOWN_B,
       K_CACHE, V_CACHE, QKV_S, QKV_Z, O_S, O_Z, GATE_UP_S, GATE_UP_Z, DOWN_S, DOWN_Z, NUM_PTRS };
/* 量化的权重（第 5.4 章）时每个线性层还有 scale 和偏移 zs（只有 int4 有）：上面 *_S、*_Z 四对。 */

/* 权重和 KV 缓存的类型，以及 bf16 线性层用哪种点积；量化的权重（int8 每通道、int4 按组）时激活和 KV 缓存是 fp32。 */
enum { W_F32, W_BF16_WIDEN, W_BF16_DOT, W_Q8, W_Q4 };

typedef struct {
    int64_t batch, hidden, q_heads, kv_heads, head_dim, intermediate, layers, weights, group; /* group：int4 的组大小 */
    float eps;
} Shape;

/* fp32 → 最近的 bf16（一样近时取偶数，与 cpu_linear.c 的 to_bf16、PyTorch 的 .to(torch.bfloat16) 相同），
 * 以及 bf16 → fp32（补上低 16 位的 0）。 */
static inline uint16_t to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40); /* NaN 仍是 NaN */
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1)) >> 16);
}

static inline float from_bf16(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* bf16 时把 v 舍入成最近的 bf16（仍以 fp32 存），fp32 时原样。 */
static inline float rnd(float v, int bf16) { return bf16 ? from_bf16(to_bf16(v)) : v; }

/* fp32 或 bf16 数组里第 i 个数（KV 缓存）。 */
static inline float load(const void *p, int64_t i, int bf16) {
    return bf16 ? from_bf16(((const uint16_t *)p)[i]) : ((const float *)p)[i];
}

/* y[i] = x[i] / sqrt(mean(x²) + eps) * w[i]（y 可以就是 x）。bf16 时与参考实现一样：归一化的结果先舍入，
 * 乘上权重再舍入。 */
static void rms_norm(const float *x, const float *w, float *y, int64_t n, float eps, int bf16) {
    float ss = 0.f;
    for (int64_t i = 0; i < n; ++i) ss += x[i] * x[i];
    float r = 1.f / sqrtf(ss / (float)n + eps);
    for (int64_t i = 0; i < n; ++i) y[i] = bf16 ? rnd(w[i] * rnd(x[i] * r, 1), 1) : x[i] * r * w[i];
}

/* NeoX 排布的 RoPE：(v[i], v[i + D/2]) 转过 cos/sin 表里第 i 个角度。bf16 时（表已由 Python 舍入成 bf16）
 * 两个乘积和它们的和各舍入一次，与参考实现 x * cos + rotate_half(x) * sin 在 bf16 里的三步一样。 */
static void rope(float *v, const float *cos, const float *sin, int64_t d, int bf16) {
    int64_t half = d / 2;
    for (int64_t i = 0; i < half; ++i) {
        float a = v[i], b = v[i + half];
        if (bf16) {
            v[i] = rnd(rnd(a * cos[i], 1) - rnd(b * sin[i], 1), 1);
            v[i + half] = rnd(rnd(b * cos[i + half], 1) + rnd(a * sin[i + half], 1), 1);
        } else {
            v[i] = a * cos[i] - b * sin[i];
            v[i + half] = b * cos[i + half] + a * sin[i + half];
        }
    }
}

/* 残差：x += y（bf16 时和再舍入：逐层的引擎里残差流本身是 bf16）。 */
static void add_into(float *x, const float *y, int64_t n, int bf16) {
    for (int64_t i = 0; i < n; ++i) x[i] = rnd(x[i] + y[i], bf16);
}

/* 把 n 个数写进 KV 缓存从第 at 个元素起的位置（bf16 时存成 bf16：src 已是舍入过的值，转换不再改变它）。 */
static void store(void *cache, int64_t at, const float *src, int64_t n, int bf16) {
    if (!bf16) {
        memcpy((float *)cache + at, src, n * sizeof(float));
        return;
    }
    for (int64_t i = 0; i < n; ++i) ((uint16_t *)cache)[at + i] = to_bf16(src[i]);
}

/* y = x Wᵀ + b，x、y 都是 fp32 的草稿，w 是 Shape.weights 说的类型。bf16 时 x 的值已是 bf16（上一步舍入过），
 * y 舍入成 bf16，与逐层引擎里的 kernel_linear 一样；点积那条路要 bf16 的输入输出，借 xb、yb 两块草稿转换。 */
static void linear(int kind, const float *x, const void *w, const float *b, float *y, int64_t M, int64_t K, int64_t N,
                   uint16_t *xb, uint16_t *yb, const float *scale, const float *zs, int64_t group) {
    if (kind == W_Q8) {
        cpu_linear_q8(x, (const int8_t *)w, scale, b, y, M, K, N);
        return;
    }
    if (kind == W_Q4) {
        cpu_linear_q4(x, (const uint8_t *)w, scale, zs, b, y, M, K, N, group);
        return;
    }
#if HAVE_BF16_DOT
    if (kind == W_BF16_DOT) {
        for (int64_t i = 0; i < M * K; ++i) xb[i] = to_bf16(x[i]);
        cpu_linear_bf16(xb, (const uint16_t *)w, b, yb, M, K, N);
        for (int64_t i = 0; i < M * N; ++i) y[i] = from_bf16(yb[i]);
        return;
    }
#else
    (void)xb, (void)yb;
#endif
    if (kind == W_F32) {
        cpu_linear(x, (const float *)w, b, y, M, K, N);
        return;
    }
    cpu_linear_bf16w(x, (const uint16_t *)w, b, y, M, K, N); /* 没有 AVX512_BF16：左移 16 位成 fp32 再 FMA */
    for (int64_t i = 0; i < M * N; ++i) y[i] = rnd(y[i], 1);
}

/* 一个请求、一个 query 头：看页表里前 len 个槽位的 K/V（这个头的 K/V 在每个槽位里从第 off 个元素起）。scores 是 len 个 float
 * 的草稿。bf16 时照 PyTorch 的 CPU 注意力（F.scaled_dot_product_attention）：未归一化的 exp 舍入成 bf16 再乘 V，
 * 除以 fp32 的和，结果舍入成 bf16。 */
static void attend_one(const float *q, const void *kc, const void *vc, int64_t off, const int32_t *slots, int64_t len,
                       int64_t kv_stride, int64_t d, float scale, float *scores, float *out, int bf16) {
    float mx = -INFINITY;
    for (int64_t j = 0; j < len; ++j) {
        const int64_t k = slots[j] * kv_stride + off;
        float s = 0.f;
        for (int64_t i = 0; i < d; ++i) s += q[i] * load(kc, k + i, bf16);
        scores[j] = s * scale;
        if (scores[j] > mx) mx = scores[j];
    }
    float sum = 0.f;
    for (int64_t j = 0; j < len; ++j) sum += (scores[j] = expf(scores[j] - mx));
    memset(out, 0, d * sizeof(float));
    for (int64_t j = 0; j < len; ++j) {
        const int64_t v = slots[j] * kv_stride + off;
        float p = bf16 ? rnd(scores[j], 1) : scores[j] / sum;
        for (int64_t i = 0; i < d; ++i) out[i] += p * load(vc, v + i, bf16);
    }
    if (bf16)
        for (int64_t i = 0; i < d; ++i) out[i] = rnd(out[i] / sum, 1);
}

/* 点积那条路转换用的 bf16 草稿有多少个（输入、输出各一块，按最宽的线性层算）；别的路不用。 */
static int64_t dot_halves(const Shape *s, int64_t *in) {
    const int64_t QKV = (s->q_heads + 2 * s->kv_heads) * s->head_dim, I = s->intermediate;
    int64_t k = s->hidden > I ? s->hidden : I, n = QKV > 2 * I ? QKV : 2 * I;
    if (s->q_heads * s->head_dim > k) k = s->q_heads * s->head_dim;
    if (s->hidden > n) n = s->hidden;
    *in = s->weights == W_BF16_DOT ? s->batch * k : 0;
    return s->weights == W_BF16_DOT ? s->batch * (k + n) : 0;
}

/* 草稿要多少个 float：h、qkv、attn、gate_up、act、proj 各一块，再加每个（请求, 头）max_len 个注意力分数，
 * 点积那条路再加两块 bf16 草稿（两个 bf16 占一个 float 的位置）。
 * 下面 cpu_decode 按同样的顺序切分；Python 那边问这个函数，不自己再算一遍。 */
int64_t cpu_decode_work_floats(const Shape *s, int64_t max_len) {
    const int64_t QKV = (s->q_heads + 2 * s->kv_heads) * s->head_dim;
    int64_t in;
    return s->batch * (2 * s->hidden + QKV + s->q_heads * s->head_dim + 3 * s->intermediate + s->q_heads * max_len)
           + (dot_halves(s, &in) + 1) / 2;
}

/* x: [B, hidden] 残差流（fp32，原地更新；bf16 模型时存的是 bf16 的值）。positions / out_loc / table_idx / seq_lens:
 * 每个请求一个 int32。page_table: [行数, table_width] int32。cos_table / sin_table: fp32（bf16 模型时已舍入成 bf16）。
 * work: 草稿，至少 cpu_decode_work_floats(s, max_len) 个 float。 */
void cpu_decode(const Shape *s, const int64_t *ptrs, float *x, const float *cos_table, const float *sin_table,
                const int32_t *positions, const int32_t *out_loc, const int32_t *page_table, int64_t table_width,
                const int32_t *table_idx, const int32_t *seq_lens, int64_t max_len, float *work) {
    const int64_t B = s->batch, H = s->hidden, D = s->head_dim, Hq = s->q_heads, Hkv = s->kv_heads;
    const int64_t I = s->intermediate, QKV = (Hq + 2 * Hkv) * D, group = Hq / Hkv, kv_stride = Hkv * D;
    const int kind = (int)s->weights, bf16 = kind == W_BF16_WIDEN || kind == W_BF16_DOT;
    const float scale = 1.f / sqrtf((float)D), eps = s->eps;
    float *h = work, *qkv = h + B * H, *attn = qkv + B * QKV, *gate_up = attn + B * Hq * D;
    float *act = gate_up + B * 2 * I, *proj = act + B * I, *scores = proj + B * H;
    int64_t in_halves;
    dot_halves(s, &in_halves);
    uint16_t *xb = (uint16_t *)(scores + B * Hq * max_len), *yb = xb + in_halves;

    for (int64_t l = 0; l < s->layers; ++l) {
        const int64_t *p = ptrs + l * NUM_PTRS;
        const float *q_norm = (const float *)p[Q_NORM], *k_norm = (const float *)p[K_NORM];
        void *kc = (void *)p[K_CACHE], *vc = (void *)p[V_CACHE];
/* P 是线性层的前缀（QKV、O、GATE_UP、DOWN）：它的权重、偏置、scale、偏移在指针表里的位置是 P_W、P_B、P_S、P_Z */
#define LINEAR(in, P, out, K, N)                                                                                    \
    linear(kind, in, (const void *)p[P##_W], (const float *)p[P##_B], out, B, K, N, xb, yb, (const float *)p[P##_S], \
           (const float *)p[P##_Z], s->group)

        for (int64_t b = 0; b < B; ++b) rms_norm(x + b * H, (const float *)p[IN_NORM], h + b * H, H, eps, bf16);
        LINEAR(h, QKV, qkv, H, QKV);
        for (int64_t b = 0; b < B; ++b) {
            float *q = qkv + b * QKV, *k = q + Hq * D, *v = k + Hkv * D;
            const float *c = cos_table + (int64_t)positions[b] * D, *sn = sin_table + (int64_t)positions[b] * D;
            for (int64_t hh = 0; hh < Hq; ++hh) {
                if (q_norm) rms_norm(q + hh * D, q_norm, q + hh * D, D, eps, bf16);
                rope(q + hh * D, c, sn, D, bf16);
            }
            for (int64_t hh = 0; hh < Hkv; ++hh) {
                if (k_norm) rms_norm(k + hh * D, k_norm, k + hh * D, D, eps, bf16);
                rope(k + hh * D, c, sn, D, bf16);
            }
            store(kc, (int64_t)out_loc[b] * kv_stride, k, kv_stride, bf16);
            store(vc, (int64_t)out_loc[b] * kv_stride, v, kv_stride, bf16);
        }
#pragma omp parallel for collapse(2) schedule(static)
        for (int64_t b = 0; b < B; ++b)
            for (int64_t hh = 0; hh < Hq; ++hh) {
                const int32_t *slots = page_table + (int64_t)table_idx[b] * table_width;
                attend_one(qkv + b * QKV + hh * D, kc, vc, (hh / group) * D, slots, seq_lens[b], kv_stride, D, scale,
                           scores + (b * Hq + hh) * max_len, attn + (b * Hq + hh) * D, bf16);
            }
        LINEAR(attn, O, proj, Hq * D, H);
        add_into(x, proj, B * H, bf16);

        for (int64_t b = 0; b < B; ++b) rms_norm(x + b * H, (const float *)p[POST_NORM], h + b * H, H, eps, bf16);
        LINEAR(h, GATE_UP, gate_up, H, 2 * I);
#pragma omp parallel for collapse(2) schedule(static) if (B * I >= 8192)
        for (int64_t b = 0; b < B; ++b)
            for (int64_t i = 0; i < I; ++i) {
                float g = gate_up[b * 2 * I + i], u = gate_up[b * 2 * I + I + i];
                act[b * I + i] = bf16 ? rnd(rnd(g / (1.f + expf(-g)), 1) * u, 1) : g / (1.f + expf(-g)) * u;
            }
        LINEAR(act, DOWN, proj, I, H);
        add_into(x, proj, B * H, bf16);
#undef LINEAR
    }
}
