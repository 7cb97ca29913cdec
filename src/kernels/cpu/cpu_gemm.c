/* GEMM for the CPU backend.
 * float: oneDNN's dnnl_sgemm. Measured on this machine (Zen 5, AVX-512): ~227 GFLOP/s on one core
 * against ~117 for Debian's OpenBLAS 0.3.21, which mis-detects the CPU unless OPENBLAS_CORETYPE is set
 * before the library loads; oneDNN dispatches on CPU features, so full speed needs no user setting.
 * It threads with OpenMP: omp_get_max_threads() of the calling thread outside a parallel region,
 * one thread inside one.
 * double (the test build only): dot products of packed rows (gemm_f64); the float path is checked
 * against the reference table. */
#include "kernels/cpu/cpu.h"

#include "core/bf16.h"
#include "core/status.h"

#include <stdlib.h>

#ifndef CH_REAL_DOUBLE
#include <dnnl.h>
#include <pthread.h>
#include <stdint.h>
#include <string.h>
#endif

#ifdef CH_REAL_DOUBLE
/* The double build's GEMM (gradient checks and the double equivalence tests; no BLAS of ours
 * takes double). Each C element is a dot product of a row of op(A) and a column of op(B), both
 * made contiguous along k (packed where the layout is not), summed in GF_LANES independent
 * partials that the compiler keeps in vector registers, then added in a fixed order: a single
 * running sum was one dependent add per element, ~0.6 GFLOP/s, which made resnet18's gradient
 * check minutes long under the sanitizers. The same bits at any thread count: one thread makes
 * each element, always the same way. */
enum { GF_LANES = 8, GF_PAR_WORK = 1 << 20 };

/* The sanitizers' per-element checks stop the compiler vectorising the dot product: under them
 * it ran no faster than the single running sum, and resnet18's gradient check took 5 minutes.
 * So the dot is left uninstrumented, as oneDNN's sgemm (the float build's GEMM, not compiled
 * with them) is, and gemm_f64 (instrumented) reads the first and last element of every row it
 * hands it instead: a span running off its buffer still stops the sanitizer build there. */
#if defined(__GNUC__)
#define GF_UNCHECKED __attribute__((no_sanitize("address", "undefined")))
#else
#define GF_UNCHECKED
#endif

/* The dot of x and y, k long, sx and sy apart: GF_LANES partials, then their sum in lane order,
 * then the tail. */
GF_UNCHECKED static double gf_dot(const double *restrict x, size_t sx, const double *restrict y, size_t sy,
                     int k)
{
    double acc[GF_LANES] = { 0 };
    int p = 0;
    if (sx == 1 && sy == 1)   /* the packed case, which the compiler vectorises */
        for (; p + GF_LANES <= k; p += GF_LANES)
            for (int l = 0; l < GF_LANES; l++) acc[l] += x[p + l] * y[p + l];
    else
        for (; p + GF_LANES <= k; p += GF_LANES)
            for (int l = 0; l < GF_LANES; l++) acc[l] += x[(p + l) * sx] * y[(p + l) * sy];
    double s = 0;
    for (int l = 0; l < GF_LANES; l++) s += acc[l];
    for (; p < k; p++) s += x[p * sx] * y[p * sy];
    return s;
}

/* Read the ends of each of count spans of k elements, sx apart within a span and ld between
 * spans: the sanitizer build's check of what gf_dot will read. */
static void gf_touch_spans(const double *x, int count, size_t ld, size_t sx, int k)
{
    volatile double sink = 0;
    for (int r = 0; r < count && k > 0; r++)
        sink += x[(size_t)r * ld] + x[(size_t)r * ld + (size_t)(k - 1) * sx];
    (void)sink;
}

static void gf_store(double *cij, double alpha, double s, double beta)
{
    *cij = alpha * s + (beta == 0 ? 0 : beta * *cij);
}

/* op(X)'s rows (rows x k), each contiguous, *ld apart: X itself where it is laid out so, else
 * (trans: X is k x rows, row r down column r) a packed copy in *owned, NULL if that allocation
 * fails. */
static const double *gf_rows(bool trans, int rows, int k, const double *x, int ld, int *row_ld,
                             double **owned)
{
    *owned = NULL;
    *row_ld = ld;
    if (!trans) return x;
    double *p = malloc(sizeof(double) * (size_t)rows * (size_t)k);
    if (!p) return NULL;
    for (int q = 0; q < k; q++)
        for (int r = 0; r < rows; r++) p[(size_t)r * k + q] = x[(size_t)q * ld + r];
    *owned = p;
    *row_ld = k;
    return p;
}

/* C = alpha op(A) op(B) + beta C, element (i, j) the dot of x + i xr and y + j yc (k elements,
 * xs and ys apart), threaded over elements outside a parallel region. */
static void gf_elements(int threads, int m, int n, int k, double alpha, const double *x, size_t xr,
                        size_t xs, const double *y, size_t yc, size_t ys, double beta, double *c,
                        int ldc)
{
    const bool par = threads > 1 && !omp_in_parallel() && (double)m * n * k > GF_PAR_WORK;
#pragma omp parallel for collapse(2) schedule(static) num_threads(threads) if (par)
    for (int i = 0; i < m; i++)
        for (int j = 0; j < n; j++)
            gf_store(&c[(size_t)i * ldc + j], alpha,
                     gf_dot(x + (size_t)i * xr, xs, y + (size_t)j * yc, ys, k), beta);
}

static void gemm_f64(int threads, bool ta, bool tb, int m, int n, int k, double alpha,
                     const double *a, int lda, const double *b, int ldb, double beta, double *c,
                     int ldc)
{
    /* op(A)'s rows and op(B)'s columns as laid out: where each starts, how far apart its elements. */
    const size_t a_row = ta ? 1 : (size_t)lda, a_step = ta ? (size_t)lda : 1;
    const size_t b_col = tb ? (size_t)ldb : 1, b_step = tb ? 1 : (size_t)ldb;
    gf_touch_spans(a, m, a_row, a_step, k);
    gf_touch_spans(b, n, b_col, b_step, k);
    double *own_a, *own_b;
    int ar_ld, bc_ld;
    const double *ar = gf_rows(ta, m, k, a, lda, &ar_ld, &own_a);   /* op(A): m rows of k */
    const double *bc = gf_rows(!tb, n, k, b, ldb, &bc_ld, &own_b);  /* op(B)^T: n rows of k */
    if (ar && bc)
        gf_elements(threads, m, n, k, alpha, ar, (size_t)ar_ld, 1, bc, (size_t)bc_ld, 1, beta, c, ldc);
    else   /* no memory for a packed copy: the same sums in the same order, read strided */
        gf_elements(threads, m, n, k, alpha, a, a_row, a_step, b, b_col, b_step, beta, c, ldc);
    free(own_a);
    free(own_b);
}
#endif

void ch_cpu_gemm(const ch_kctx *kc, bool ta, bool tb, int m, int n, int k, ch_real alpha,
                 const ch_real *a, int lda, const ch_real *b, int ldb, ch_real beta, ch_real *c,
                 int ldc)
{
    if (m <= 0 || n <= 0) return;
    if (k <= 0) {
        /* An empty sum: C = beta * C. dnnl_sgemm returns without touching C when k is 0, which
         * left a replica with no samples holding the previous step's weight gradients. */
        for (int i = 0; i < m; i++)
            for (int j = 0; j < n; j++) {
                ch_real *cij = &c[(size_t)i * ldc + j];
                *cij = beta == 0 ? 0 : beta * *cij;
            }
        return;
    }
#ifndef CH_REAL_DOUBLE
    (void)kc;
    dnnl_status_t st = dnnl_sgemm(ta ? 'T' : 'N', tb ? 'T' : 'N', m, n, k, alpha, a, lda, b, ldb,
                                  beta, c, ldc);
    CH_ASSERT(st == dnnl_success);
#else
    gemm_f64(kc ? kc->nthreads : 1, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
#endif
}

/* The strided batch. float: one oneDNN matmul primitive per shape, made on first use and kept
 * for the life of the process (a handful of shapes per model; never freed, so a replica still
 * running at exit cannot find one destroyed under it). Why not a loop of dnnl_sgemm: Winograd's
 * 49 small GEMMs per chunk (cpu_wino5.c, 20 x 160 x 20 in mnist-cnn) each paid sgemm's
 * per-call packing and checks, and the weight-gradient shape, whose operands are both
 * contiguous along k, ran at ~52 GFLOP/s. The batched primitive (oneDNN's brgemm kernels) ran
 * those 49 at 0.68, 0.74 and 1.24 us each against sgemm's 0.95, 0.97 and 2.49 (one core, this
 * machine). Where oneDNN offers only its reference kernel (no AVX-512), the loop runs instead. */
static void gemm_batch_loop(const ch_kctx *kc, const ch_gemm_batch *g, const ch_real *a,
                            const ch_real *b, ch_real *c)
{
    for (int i = 0; i < g->batch; i++)
        ch_cpu_gemm(kc, g->ta, g->tb, g->m, g->n, g->k, 1, a + g->sa * i, g->lda, b + g->sb * i,
                    g->ldb, g->accumulate ? 1 : 0, c + g->sc * i, g->ldc);
}

/* bf16 operands where oneDNN has no batched kernel for them (or the double build): plain loops,
 * the products of the widened values summed in double. */
static void gemm_batch_loop_bf16(const ch_gemm_batch *g, const uint16_t *a, const uint16_t *b,
                                 ch_real *c)
{
    for (int i = 0; i < g->batch; i++)
        for (int r = 0; r < g->m; r++)
            for (int q = 0; q < g->n; q++) {
                double s = 0;
                for (int p = 0; p < g->k; p++) {
                    const size_t ai = g->ta ? (size_t)p * g->lda + r : (size_t)r * g->lda + p;
                    const size_t bi = g->tb ? (size_t)q * g->ldb + p : (size_t)p * g->ldb + q;
                    s += (double)ch_bf16_to_float(a[g->sa * i + ai]) *
                         ch_bf16_to_float(b[g->sb * i + bi]);
                }
                ch_real *cij = c + g->sc * i + (size_t)r * g->ldc + q;
                *cij = (ch_real)(s + (g->accumulate ? *cij : 0));
            }
}

#ifdef CH_REAL_DOUBLE

size_t ch_cpu_gemm_batch_scratch(const ch_gemm_batch *g)
{
    (void)g;
    return 0;
}

void ch_cpu_gemm_batch(const ch_kctx *kc, const ch_gemm_batch *g, const ch_real *a,
                       const ch_real *b, ch_real *c, void *scratch)
{
    (void)scratch;
    gemm_batch_loop(kc, g, a, b, c);
}

void ch_cpu_gemm_batch_bf16(const ch_kctx *kc, const ch_gemm_batch *g, const uint16_t *a,
                            const uint16_t *b, ch_real *c, void *scratch)
{
    (void)kc, (void)scratch;
    gemm_batch_loop_bf16(g, a, b, c);
}

bool ch_cpu_gemm_batch_fast(const ch_gemm_batch *g)
{
    (void)g;
    return false;
}

#else

enum { GB_ALIGN = 64 };

typedef struct gb_entry {
    ch_gemm_batch key;
    dnnl_primitive_t p;   /* NULL: run the loop */
    dnnl_memory_desc_t a, b, c, scratch;
    size_t scratch_bytes;
    struct gb_entry *next;
} gb_entry;

static struct {
    pthread_mutex_t lock;
    dnnl_engine_t engine;
    gb_entry *entries;
} g_gb = { .lock = PTHREAD_MUTEX_INITIALIZER };

static bool gb_key_eq(const ch_gemm_batch *x, const ch_gemm_batch *y)
{
    return x->batch == y->batch && x->m == y->m && x->n == y->n && x->k == y->k &&
           x->lda == y->lda && x->ldb == y->ldb && x->ldc == y->ldc && x->sa == y->sa &&
           x->sb == y->sb && x->sc == y->sc && x->ta == y->ta && x->tb == y->tb &&
           x->accumulate == y->accumulate && x->bf16 == y->bf16;
}

/* A batch x rows x cols matrix whose element (i, r, q) is at i*s + r*rs + q*qs. */
static bool gb_md(dnnl_memory_desc_t *md, int batch, int rows, int cols, size_t s, size_t rs,
                  size_t qs, bool bf16)
{
    const dnnl_dims_t dims = { batch, rows, cols };
    const dnnl_dims_t strides = { (dnnl_dim_t)s, (dnnl_dim_t)rs, (dnnl_dim_t)qs };
    return dnnl_memory_desc_init_by_strides(md, 3, dims, bf16 ? dnnl_bf16 : dnnl_f32, strides) ==
           dnnl_success;
}

static dnnl_primitive_attr_t gb_attr(bool accumulate)
{
    dnnl_primitive_attr_t attr = NULL;
    if (dnnl_primitive_attr_create(&attr) != dnnl_success) return NULL;
    dnnl_post_ops_t po = NULL;
    bool ok = dnnl_primitive_attr_set_scratchpad_mode(attr, dnnl_scratchpad_mode_user) ==
              dnnl_success;
    if (ok && accumulate)
        ok = dnnl_post_ops_create(&po) == dnnl_success &&
             dnnl_post_ops_append_sum(po, 1.0f) == dnnl_success &&
             dnnl_primitive_attr_set_post_ops(attr, po) == dnnl_success;
    if (po) dnnl_post_ops_destroy(po);
    if (!ok) {
        dnnl_primitive_attr_destroy(attr);
        return NULL;
    }
    return attr;
}

/* The matmul of e->key, made for one thread (it runs inside the caller's team); e->p stays NULL
 * where oneDNN has only its reference kernel or anything fails. */
static void gb_build(gb_entry *e)
{
    const ch_gemm_batch *g = &e->key;
    if (!gb_md(&e->a, g->batch, g->m, g->k, g->sa, g->ta ? 1 : (size_t)g->lda,
               g->ta ? (size_t)g->lda : 1, g->bf16) ||
        !gb_md(&e->b, g->batch, g->k, g->n, g->sb, g->tb ? 1 : (size_t)g->ldb,
               g->tb ? (size_t)g->ldb : 1, g->bf16) ||
        !gb_md(&e->c, g->batch, g->m, g->n, g->sc, (size_t)g->ldc, 1, false))
        return;
    dnnl_matmul_desc_t md;
    dnnl_primitive_desc_t pd = NULL;
    dnnl_primitive_attr_t attr = gb_attr(g->accumulate);
    const int prev = omp_get_max_threads();
    omp_set_num_threads(1);
    const bool made = attr && dnnl_matmul_desc_init(&md, &e->a, &e->b, NULL, &e->c) ==
                                  dnnl_success &&
                      dnnl_primitive_desc_create(&pd, &md, attr, g_gb.engine, NULL) ==
                          dnnl_success;
    omp_set_num_threads(prev);
    if (attr) dnnl_primitive_attr_destroy(attr);
    if (!made) return;
    const char *impl = NULL;
    const bool fast = dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &impl) ==
                          dnnl_success &&
                      impl && strncmp(impl, "ref", 3) != 0;
    const dnnl_memory_desc_t *sp = dnnl_primitive_desc_query_md(pd, dnnl_query_scratchpad_md, 0);
    if (fast && sp) {
        e->scratch = *sp;
        e->scratch_bytes = dnnl_memory_desc_get_size(sp);
        if (dnnl_primitive_create(&e->p, pd) != dnnl_success) e->p = NULL;
    }
    dnnl_primitive_desc_destroy(pd);
}

/* The entry of g, made on first use; NULL only where memory ran out. */
static const gb_entry *gb_entry_for(const ch_gemm_batch *g)
{
    pthread_mutex_lock(&g_gb.lock);
    gb_entry *e = g_gb.entries;
    while (e && !gb_key_eq(&e->key, g)) e = e->next;
    if (!e && !g_gb.engine && dnnl_engine_create(&g_gb.engine, dnnl_cpu, 0) != dnnl_success)
        g_gb.engine = NULL;
    if (!e && (e = calloc(1, sizeof *e)) != NULL) {
        e->key = *g;
        if (g_gb.engine) gb_build(e);
        e->next = g_gb.entries;
        g_gb.entries = e;
    }
    pthread_mutex_unlock(&g_gb.lock);
    return e;
}

size_t ch_cpu_gemm_batch_scratch(const ch_gemm_batch *g)
{
    const gb_entry *e = gb_entry_for(g);
    return e && e->p && e->scratch_bytes ? e->scratch_bytes + GB_ALIGN : 0;
}

bool ch_cpu_gemm_batch_fast(const ch_gemm_batch *g)
{
    const gb_entry *e = gb_entry_for(g);
    return e && e->p;
}

/* The batch through e's primitive; false where there is none (the caller loops instead). */
static bool gb_run(const gb_entry *e, const void *a, const void *b, ch_real *c, void *scratch)
{
    if (!e || !e->p || (e->scratch_bytes && !scratch)) return false;
    void *sp = (void *)(((uintptr_t)scratch + GB_ALIGN - 1) & ~(uintptr_t)(GB_ALIGN - 1));
    dnnl_stream_t s = NULL;
    dnnl_memory_t mem[4] = { NULL };
    const dnnl_memory_desc_t *mds[4] = { &e->a, &e->b, &e->c, &e->scratch };
    void *ptrs[4] = { (void *)a, (void *)b, c, sp };
    const int args[4] = { DNNL_ARG_SRC, DNNL_ARG_WEIGHTS, DNNL_ARG_DST, DNNL_ARG_SCRATCHPAD };
    const int n = e->scratch_bytes ? 4 : 3;
    dnnl_exec_arg_t ex[4];
    CH_ASSERT(dnnl_stream_create(&s, g_gb.engine, dnnl_stream_default_flags) == dnnl_success);
    for (int i = 0; i < n; i++) {
        CH_ASSERT(dnnl_memory_create(&mem[i], mds[i], g_gb.engine, ptrs[i]) == dnnl_success);
        ex[i] = (dnnl_exec_arg_t){ args[i], mem[i] };
    }
    CH_ASSERT(dnnl_primitive_execute(e->p, s, n, ex) == dnnl_success);
    CH_ASSERT(dnnl_stream_wait(s) == dnnl_success);
    for (int i = 0; i < n; i++) dnnl_memory_destroy(mem[i]);
    dnnl_stream_destroy(s);
    return true;
}

void ch_cpu_gemm_batch(const ch_kctx *kc, const ch_gemm_batch *g, const ch_real *a,
                       const ch_real *b, ch_real *c, void *scratch)
{
    CH_ASSERT(!g->bf16);
    if (g->batch <= 0 || g->m <= 0 || g->n <= 0) return;
    if (!gb_run(gb_entry_for(g), a, b, c, scratch)) gemm_batch_loop(kc, g, a, b, c);
}

void ch_cpu_gemm_batch_bf16(const ch_kctx *kc, const ch_gemm_batch *g, const uint16_t *a,
                            const uint16_t *b, ch_real *c, void *scratch)
{
    (void)kc;
    CH_ASSERT(g->bf16);
    if (g->batch <= 0 || g->m <= 0 || g->n <= 0) return;
    if (!gb_run(gb_entry_for(g), a, b, c, scratch)) gemm_batch_loop_bf16(g, a, b, c);
}

#endif
