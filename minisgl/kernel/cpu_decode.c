/* 一整步解码的全部解码层，一次调用算完（fp32，CPU）：Python 每层要发几十个小算子，每个都有固定开销，
 * 小模型上这些开销比读权重还费时；这里同样的计算一次做完，Python 只剩嵌入、最后的归一化和 LM head。
 *
 * 每层与 solutions/stage1 的参考实现一一对应：RMSNorm → 合并的 qkv → （Qwen3 的）q/k 归一化 → RoPE →
 * K/V 写进槽位 → 按页表读 K/V 算注意力 → o_proj 加回残差 → RMSNorm → gate_up → silu(gate)·up → down_proj
 * 加回残差。线性层用 cpu_linear.c 的内核；注意力按（请求, 头）分给线程，各自按固定顺序求和。
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

void cpu_linear(const float *x, const float *w, const float *b, float *y, int64_t M, int64_t K, int64_t N);

/* 每层的指针表（Python 那边按这个顺序填，没有的项填 0）。 */
enum { IN_NORM, QKV_W, QKV_B, Q_NORM, K_NORM, O_W, O_B, POST_NORM, GATE_UP_W, GATE_UP_B, DOWN_W, DOWN_B,
       K_CACHE, V_CACHE, NUM_PTRS };

typedef struct {
    int64_t batch, hidden, q_heads, kv_heads, head_dim, intermediate, layers;
    float eps;
} Shape;

/* y[i] = x[i] / sqrt(mean(x²) + eps) * w[i]（y 可以就是 x）。 */
static void rms_norm(const float *x, const float *w, float *y, int64_t n, float eps) {
    float ss = 0.f;
    for (int64_t i = 0; i < n; ++i) ss += x[i] * x[i];
    float r = 1.f / sqrtf(ss / (float)n + eps);
    for (int64_t i = 0; i < n; ++i) y[i] = x[i] * r * w[i];
}

/* NeoX 排布的 RoPE：(v[i], v[i + D/2]) 转过 cos/sin 表里第 i 个角度。 */
static void rope(float *v, const float *cos, const float *sin, int64_t d) {
    int64_t half = d / 2;
    for (int64_t i = 0; i < half; ++i) {
        float a = v[i], b = v[i + half];
        v[i] = a * cos[i] - b * sin[i];
        v[i + half] = b * cos[i + half] + a * sin[i + half];
    }
}

static void add_into(float *x, const float *y, int64_t n) {
    for (int64_t i = 0; i < n; ++i) x[i] += y[i];
}

/* 一个请求、一个 query 头：看页表里前 len 个槽位的 K/V。scores 是 len 个 float 的草稿。 */
static void attend_one(const float *q, const float *kc, const float *vc, const int32_t *slots, int64_t len,
                       int64_t kv_stride, int64_t d, float scale, float *scores, float *out) {
    float mx = -INFINITY;
    for (int64_t j = 0; j < len; ++j) {
        const float *k = kc + slots[j] * kv_stride;
        float s = 0.f;
        for (int64_t i = 0; i < d; ++i) s += q[i] * k[i];
        scores[j] = s * scale;
        if (scores[j] > mx) mx = scores[j];
    }
    float sum = 0.f;
    for (int64_t j = 0; j < len; ++j) sum += (scores[j] = expf(scores[j] - mx));
    memset(out, 0, d * sizeof(float));
    for (int64_t j = 0; j < len; ++j) {
        const float *v = vc + slots[j] * kv_stride;
        float p = scores[j] / sum;
        for (int64_t i = 0; i < d; ++i) out[i] += p * v[i];
    }
}

/* 草稿要多少个 float：h、qkv、attn、gate_up、act、proj 各一块，再加每个（请求, 头）max_len 个注意力分数。
 * 下面 cpu_decode 按同样的顺序切分；Python 那边问这个函数，不自己再算一遍。 */
int64_t cpu_decode_work_floats(const Shape *s, int64_t max_len) {
    const int64_t QKV = (s->q_heads + 2 * s->kv_heads) * s->head_dim;
    return s->batch * (2 * s->hidden + QKV + s->q_heads * s->head_dim + 3 * s->intermediate + s->q_heads * max_len);
}

/* x: [B, hidden] 残差流（原地更新）。positions / out_loc / table_idx / seq_lens: 每个请求一个 int32。
 * page_table: [行数, table_width] int32。work: 草稿，至少 cpu_decode_work_floats(s, max_len) 个 float。 */
void cpu_decode(const Shape *s, const int64_t *ptrs, float *x, const float *cos_table, const float *sin_table,
                const int32_t *positions, const int32_t *out_loc, const int32_t *page_table, int64_t table_width,
                const int32_t *table_idx, const int32_t *seq_lens, int64_t max_len, float *work) {
    const int64_t B = s->batch, H = s->hidden, D = s->head_dim, Hq = s->q_heads, Hkv = s->kv_heads;
    const int64_t I = s->intermediate, QKV = (Hq + 2 * Hkv) * D, group = Hq / Hkv, kv_stride = Hkv * D;
    const float scale = 1.f / sqrtf((float)D);
    float *h = work, *qkv = h + B * H, *attn = qkv + B * QKV, *gate_up = attn + B * Hq * D;
    float *act = gate_up + B * 2 * I, *proj = act + B * I, *scores = proj + B * H;

    for (int64_t l = 0; l < s->layers; ++l) {
        const int64_t *p = ptrs + l * NUM_PTRS;
        const float *q_norm = (const float *)p[Q_NORM], *k_norm = (const float *)p[K_NORM];
        float *kc = (float *)p[K_CACHE], *vc = (float *)p[V_CACHE];

        for (int64_t b = 0; b < B; ++b) rms_norm(x + b * H, (const float *)p[IN_NORM], h + b * H, H, s->eps);
        cpu_linear(h, (const float *)p[QKV_W], (const float *)p[QKV_B], qkv, B, H, QKV);
        for (int64_t b = 0; b < B; ++b) {
            float *q = qkv + b * QKV, *k = q + Hq * D, *v = k + Hkv * D;
            const float *c = cos_table + (int64_t)positions[b] * D, *sn = sin_table + (int64_t)positions[b] * D;
            for (int64_t hh = 0; hh < Hq; ++hh) {
                if (q_norm) rms_norm(q + hh * D, q_norm, q + hh * D, D, s->eps);
                rope(q + hh * D, c, sn, D);
            }
            for (int64_t hh = 0; hh < Hkv; ++hh) {
                if (k_norm) rms_norm(k + hh * D, k_norm, k + hh * D, D, s->eps);
                rope(k + hh * D, c, sn, D);
            }
            memcpy(kc + (int64_t)out_loc[b] * kv_stride, k, kv_stride * sizeof(float));
            memcpy(vc + (int64_t)out_loc[b] * kv_stride, v, kv_stride * sizeof(float));
        }
#pragma omp parallel for collapse(2) schedule(static)
        for (int64_t b = 0; b < B; ++b)
            for (int64_t hh = 0; hh < Hq; ++hh) {
                const int32_t *slots = page_table + (int64_t)table_idx[b] * table_width;
                const int64_t kv_off = (hh / group) * D;
                attend_one(qkv + b * QKV + hh * D, kc + kv_off, vc + kv_off, slots, seq_lens[b], kv_stride, D,
                           scale, scores + (b * Hq + hh) * max_len, attn + (b * Hq + hh) * D);
            }
        cpu_linear(attn, (const float *)p[O_W], (const float *)p[O_B], proj, B, Hq * D, H);
        add_into(x, proj, B * H);

        for (int64_t b = 0; b < B; ++b) rms_norm(x + b * H, (const float *)p[POST_NORM], h + b * H, H, s->eps);
        cpu_linear(h, (const float *)p[GATE_UP_W], (const float *)p[GATE_UP_B], gate_up, B, H, 2 * I);
#pragma omp parallel for collapse(2) schedule(static) if (B * I >= 8192)
        for (int64_t b = 0; b < B; ++b)
            for (int64_t i = 0; i < I; ++i) {
                float g = gate_up[b * 2 * I + i], u = gate_up[b * 2 * I + I + i];
                act[b * I + i] = g / (1.f + expf(-g)) * u;
            }
        cpu_linear(act, (const float *)p[DOWN_W], (const float *)p[DOWN_B], proj, B, I, H);
        add_into(x, proj, B * H);
    }
}
