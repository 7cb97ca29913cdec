/* --precision bf16's plain GEMMs (Linear layers): C = op(A) op(B), plus C where asked, with A and
 * B rounded to bf16 (to nearest even) and the products summed in fp32.
 * Why: a bf16 dot product (vdpbf16ps) does twice an FMA's work, and a Linear layer is one GEMM per
 * pass. Measured on Zen 5, 2 threads, batch 256, the forward with both operands rounded on every
 * call: 4096 -> 4096 40.7 ms with dnnl_sgemm against 19.8 (2.05x), 1024 -> 1024 2.57 against 1.42,
 * 512 -> 512 0.59 against 0.38, 800 -> 128 0.27 against 0.27: below about 2^26 multiply-adds the
 * rounding costs what bf16 saves, so smaller GEMMs stay fp32 (the workspace query is 0, and a call
 * runs ch_cpu_gemm).
 * How: each thread rounds its rows of op(A), written out dense (op applied, so the matmul never
 * reads a transposed A), and its share of B's rows as B is stored, into the kernel workspace;
 * after one barrier it multiplies its rows of C through ch_cpu_gemm_batch_bf16 (oneDNN's bf16
 * matmul, made for one thread). Each element of C is the same sum at any thread count. */
#include "kernels/cpu/cpu.h"

#include <stdint.h>

#include "core/bf16.h"

enum { GB16_ALIGN = 64 };
static const double GB16_MIN_MACS = 67108864.0;   /* 2^26: 256 x 512 x 512 */

typedef struct gb16_geo {
    bool ta, tb;
    int m, n, k, brows, bcols, threads;   /* B as stored: brows x bcols */
} gb16_geo;

static gb16_geo geo_of(const ch_kctx *kc, bool ta, bool tb, int m, int n, int k)
{
    return (gb16_geo){ .ta = ta, .tb = tb, .m = m, .n = n, .k = k, .brows = tb ? n : k,
                       .bcols = tb ? k : n, .threads = kc->nthreads < 1 ? 1 : kc->nthreads };
}

/* Thread t's rows of C and op(A): [*lo, *hi). */
static void rows_of(int rows, int t, int threads, int *lo, int *hi)
{
    *lo = (int)((long)rows * t / threads);
    *hi = (int)((long)rows * (t + 1) / threads);
}

static ch_gemm_batch slice_gemm(const gb16_geo *g, int rows, int ldc, bool accumulate)
{
    return (ch_gemm_batch){ .batch = 1, .m = rows, .n = g->n, .k = g->k, .lda = g->k,
                            .ldb = g->bcols, .ldc = ldc, .sa = (size_t)rows * g->k,
                            .sb = (size_t)g->brows * g->bcols, .sc = (size_t)rows * ldc,
                            .tb = g->tb, .accumulate = accumulate, .bf16 = true };
}

static size_t align_up(size_t b) { return (b + GB16_ALIGN - 1) & ~(size_t)(GB16_ALIGN - 1); }

/* Every thread's slice has a fast kernel (the loops that would stand in are far slower than
 * sgemm); *scratch: the most any needs. ldc and accumulate do not change which kernel runs, but
 * they are part of the kernel's key: the query uses the caller's. */
static bool slices_ready(const ch_kctx *kc, const gb16_geo *g, int ldc, bool accumulate,
                         size_t *scratch)
{
    *scratch = 0;
    for (int t = 0; t < g->threads; t++) {
        int lo, hi;
        rows_of(g->m, t, g->threads, &lo, &hi);
        if (hi == lo) continue;
        const ch_gemm_batch gb = slice_gemm(g, hi - lo, ldc, accumulate);
        if (!ch_cpu_gemm_batch_fast(kc, &gb)) return false;
        const size_t s = ch_cpu_gemm_batch_scratch(kc, &gb);
        if (s > *scratch) *scratch = s;
    }
    return true;
}

static size_t need_bytes(const gb16_geo *g, size_t scratch)
{
    return GB16_ALIGN + align_up(sizeof(uint16_t) * (size_t)g->m * g->k) +
           align_up(sizeof(uint16_t) * (size_t)g->brows * g->bcols) +
           (size_t)g->threads * align_up(scratch);
}

/* Whether g runs in bf16 (large enough, native bf16, a fast kernel for every slice), with *g and
 * *scratch set. */
static bool usable(const ch_kctx *kc, bool ta, bool tb, int m, int n, int k, int ldc,
                   bool accumulate, gb16_geo *g, size_t *scratch)
{
    if (m <= 0 || n <= 0 || k <= 0 || (double)m * n * k < GB16_MIN_MACS ||
        !ch_cpu_bf16_products(NULL, 0))
        return false;
    *g = geo_of(kc, ta, tb, m, n, k);
    return slices_ready(kc, g, ldc, accumulate, scratch);
}

size_t ch_cpu_gemm_bf16_workspace(const ch_kctx *kc, bool ta, bool tb, int m, int n, int k,
                                  int ldc, bool accumulate)
{
    gb16_geo g;
    size_t scratch;
    if (!usable(kc, ta, tb, m, n, k, ldc, accumulate, &g, &scratch)) return 0;
    return (need_bytes(&g, scratch) + sizeof(ch_real) - 1) / sizeof(ch_real);
}

/* Rows lo .. hi-1 of op(A), rounded, into out (dense, k per row). */
static void round_a_rows(const gb16_geo *g, const ch_real *a, int lda, int lo, int hi,
                         uint16_t *restrict out)
{
    if (!g->ta) {
        for (int r = lo; r < hi; r++)
            for (int p = 0; p < g->k; p++)
                out[(size_t)r * g->k + p] = ch_bf16_from_float((float)a[(size_t)r * lda + p]);
        return;
    }
    /* op(A) = A^T: stored row p holds column p of op(A); read along it, write down the rows */
    for (int p = 0; p < g->k; p++)
        for (int r = lo; r < hi; r++)
            out[(size_t)r * g->k + p] = ch_bf16_from_float((float)a[(size_t)p * lda + r]);
}

static void round_b_rows(const gb16_geo *g, const ch_real *b, int ldb, int lo, int hi,
                         uint16_t *restrict out)
{
    for (int r = lo; r < hi; r++)
        for (int q = 0; q < g->bcols; q++)
            out[(size_t)r * g->bcols + q] = ch_bf16_from_float((float)b[(size_t)r * ldb + q]);
}

/* What the team shares (ch_cpu_team's arg). */
typedef struct gb16_team {
    const ch_kctx *kc;
    const gb16_geo *g;
    const ch_real *a, *b;
    int lda, ldb, ldc;
    bool accumulate;
    ch_real *c;
    uint16_t *ab, *bb;      /* the rounded operands */
    char *scratch0;         /* thread t's matmul scratch at t * align_up(scratch) */
    size_t scratch;
} gb16_team;

/* Thread t of T: its rows of both operands rounded, then, once all are, its rows of C. */
static void gemm_member(void *arg, int t, int T)
{
    const gb16_team *m = arg;
    const gb16_geo *g = m->g;
    int lo, hi, blo, bhi;
    rows_of(g->m, t, T, &lo, &hi);
    rows_of(g->brows, t, T, &blo, &bhi);
    round_a_rows(g, m->a, m->lda, lo, hi, m->ab);
    round_b_rows(g, m->b, m->ldb, blo, bhi, m->bb);
#pragma omp barrier
    if (hi > lo) {
        const ch_gemm_batch gb = slice_gemm(g, hi - lo, m->ldc, m->accumulate);
        ch_cpu_gemm_batch_bf16(m->kc, &gb, m->ab + (size_t)lo * g->k, m->bb, m->c + (size_t)lo * m->ldc,
                               m->scratch0 + (size_t)t * align_up(m->scratch));
    }
}

void ch_cpu_gemm_bf16(const ch_kctx *kc, bool ta, bool tb, int m, int n, int k, const ch_real *a,
                      int lda, const ch_real *b, int ldb, bool accumulate, ch_real *c, int ldc)
{
    gb16_geo g;
    size_t scratch;
    if (!usable(kc, ta, tb, m, n, k, ldc, accumulate, &g, &scratch) || !kc->ws ||
        need_bytes(&g, scratch) > kc->ws_len * sizeof(ch_real)) {
        /* A batch smaller than planned (an epoch's last) may fall below the size where bf16 pays */
        ch_cpu_gemm(kc, ta, tb, m, n, k, 1, a, lda, b, ldb, accumulate ? 1 : 0, c, ldc);
        return;
    }
    char *at = (char *)(((uintptr_t)kc->ws + GB16_ALIGN - 1) & ~(uintptr_t)(GB16_ALIGN - 1));
    uint16_t *ab = (uint16_t *)at;
    at += align_up(sizeof(uint16_t) * (size_t)m * k);
    uint16_t *bb = (uint16_t *)at;
    at += align_up(sizeof(uint16_t) * (size_t)g.brows * g.bcols);
    gb16_team team = { .kc = kc, .g = &g, .a = a, .lda = lda, .b = b, .ldb = ldb, .accumulate = accumulate,
                       .c = c, .ldc = ldc, .ab = ab, .bb = bb, .scratch0 = at, .scratch = scratch };
    ch_cpu_team(g.threads, gemm_member, &team);
}
