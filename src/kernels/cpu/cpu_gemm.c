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
#include <omp.h>
#include <pthread.h>
#include <stdatomic.h>
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

/* The strided batch. float: one oneDNN matmul primitive per shape, made for the replica when its
 * workspace is planned (the scratch query) and kept in its kernel cache (cpu_dnnl_conv.c, freed
 * with the backend), with a stream and the operands' memory handles for each thread of its team:
 * a call finds its entry without a lock, points its thread's handles at the call's buffers and
 * runs. Why not a loop of dnnl_sgemm: Winograd's 49 small GEMMs per chunk (cpu_wino5.c, 20 x 160
 * x 20 in mnist-cnn) each paid sgemm's per-call packing and checks, and the weight-gradient
 * shape, whose operands are both contiguous along k, ran at ~52 GFLOP/s. The batched primitive
 * (oneDNN's brgemm kernels) ran those 49 at 0.68, 0.74 and 1.24 us each against sgemm's 0.95,
 * 0.97 and 2.49 (one core, this machine). Where oneDNN offers only its reference kernel (no
 * AVX-512), the loop runs instead. */
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

void ch_cpu_gb_cache_free(struct ch_gb_cache *c) { (void)c; }
size_t ch_cpu_gb_cache_entries(const struct ch_gb_cache *c)
{
    (void)c;
    return 0;
}

size_t ch_cpu_gemm_batch_scratch(const ch_kctx *kc, const ch_gemm_batch *g)
{
    (void)kc, (void)g;
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

bool ch_cpu_gemm_batch_fast(const ch_kctx *kc, const ch_gemm_batch *g)
{
    (void)kc, (void)g;
    return false;
}

#else

enum { GB_ALIGN = 64, GB_ARGS = 4 };

/* What one thread runs an entry's primitive with: its stream, and a memory handle per operand (A,
 * B, C, scratchpad) that each call points at its buffers. */
typedef struct gb_handles {
    dnnl_stream_t stream;
    dnnl_memory_t mem[GB_ARGS];
} gb_handles;

typedef struct gb_entry {   /* what a lookup reads first: the descriptors after it are kilobytes */
    ch_gemm_batch key;
    int threads;          /* handle sets: one per thread of a team of up to this many */
    struct gb_entry *next;   /* set before the entry is published, never changed after */
    dnnl_primitive_t p;   /* NULL: run the loop */
    dnnl_memory_desc_t md[GB_ARGS];   /* A, B, C, scratchpad */
    size_t scratch_bytes;
    gb_handles *h;        /* threads of them (NULL where p is) */
} gb_entry;

/* A replica's entries, on its kernel cache's engine: only added, at the head, each complete before
 * it is published, so a call finds its entry without a lock; the lock orders two makers (a
 * planning thread and a lazy backend's worker). */
struct ch_gb_cache {
    pthread_mutex_t add;
    dnnl_engine_t engine;   /* the kernel cache's */
    _Atomic(gb_entry *) entries;
    uint64_t serial;        /* this cache's number in the process, never reused (gb_memo) */
};

/* The serials of caches made so far: 0 marks an empty memo slot. */
static _Atomic uint64_t gb_serials = 0;

struct ch_gb_cache *ch_cpu_gb_cache_create(dnnl_engine_t engine)
{
    struct ch_gb_cache *c = calloc(1, sizeof *c);
    if (!c || pthread_mutex_init(&c->add, NULL) != 0) {
        free(c);
        return NULL;
    }
    c->engine = engine;
    atomic_init(&c->entries, NULL);
    c->serial = atomic_fetch_add(&gb_serials, 1) + 1;
    return c;
}

static void handles_free(gb_handles *h)
{
    for (int i = 0; i < GB_ARGS; i++)
        if (h->mem[i]) dnnl_memory_destroy(h->mem[i]);
    if (h->stream) dnnl_stream_destroy(h->stream);
}

static void gb_entry_free(gb_entry *e)
{
    for (int t = 0; e->h && t < e->threads; t++) handles_free(&e->h[t]);
    free(e->h);
    if (e->p) dnnl_primitive_destroy(e->p);
    free(e);
}

void ch_cpu_gb_cache_free(struct ch_gb_cache *c)
{
    if (!c) return;
    for (gb_entry *e = atomic_load(&c->entries), *next; e; e = next) {
        next = e->next;
        gb_entry_free(e);
    }
    pthread_mutex_destroy(&c->add);
    free(c);
}

size_t ch_cpu_gb_cache_entries(const struct ch_gb_cache *c)
{
    size_t count = 0;
    for (const gb_entry *e = c ? atomic_load(&c->entries) : NULL; e; e = e->next) count++;
    return count;
}

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

/* A thread's stream and handles for e (no data yet: each call sets it). */
static bool handles_make(dnnl_engine_t eng, const gb_entry *e, gb_handles *h)
{
    if (dnnl_stream_create(&h->stream, eng, dnnl_stream_default_flags) != dnnl_success) {
        h->stream = NULL;
        return false;
    }
    for (int i = 0; i < GB_ARGS; i++)
        if (dnnl_memory_create(&h->mem[i], &e->md[i], eng, DNNL_MEMORY_NONE) != dnnl_success) {
            h->mem[i] = NULL;
            return false;
        }
    return true;
}

/* The matmul of e->key, made for one thread (it runs inside the caller's team), and e->threads
 * handle sets; e->p stays NULL where oneDNN has only its reference kernel or anything fails. */
static void gb_build(dnnl_engine_t eng, gb_entry *e)
{
    const ch_gemm_batch *g = &e->key;
    if (!gb_md(&e->md[0], g->batch, g->m, g->k, g->sa, g->ta ? 1 : (size_t)g->lda,
               g->ta ? (size_t)g->lda : 1, g->bf16) ||
        !gb_md(&e->md[1], g->batch, g->k, g->n, g->sb, g->tb ? 1 : (size_t)g->ldb,
               g->tb ? (size_t)g->ldb : 1, g->bf16) ||
        !gb_md(&e->md[2], g->batch, g->m, g->n, g->sc, (size_t)g->ldc, 1, false))
        return;
    dnnl_matmul_desc_t md;
    dnnl_primitive_desc_t pd = NULL;
    dnnl_primitive_attr_t attr = gb_attr(g->accumulate);
    /* Made for the one thread each call runs on: the descriptor and the primitive both. The
     * primitive was made at the caller's thread count once, and oneDNN 2.6, finding in its
     * primitive cache one descriptor made into primitives at two thread counts, threw
     * std::bad_alloc (or crashed) making a brgemm kernel (test_bf16_parallel, ~1 run in 9 at
     * 6237191; reproduced without cohort by replaying its 176 matmuls, fixed by this alone). */
    const int prev = omp_get_max_threads();
    omp_set_num_threads(1);
    const bool made = attr && dnnl_matmul_desc_init(&md, &e->md[0], &e->md[1], NULL, &e->md[2]) ==
                                  dnnl_success &&
                      dnnl_primitive_desc_create(&pd, &md, attr, eng, NULL) == dnnl_success;
    if (attr) dnnl_primitive_attr_destroy(attr);
    const char *impl = NULL;
    const bool fast = made && dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &impl) ==
                                  dnnl_success &&
                      impl && strncmp(impl, "ref", 3) != 0;
    const dnnl_memory_desc_t *sp = made ? dnnl_primitive_desc_query_md(pd, dnnl_query_scratchpad_md, 0) : NULL;
    bool ok = fast && sp && dnnl_primitive_create(&e->p, pd) == dnnl_success;
    omp_set_num_threads(prev);
    if (!made) return;
    if (ok) {   /* sp lives in pd */
        e->md[3] = *sp;
        e->scratch_bytes = dnnl_memory_desc_get_size(sp);
    }
    dnnl_primitive_desc_destroy(pd);
    if (!ok) {
        e->p = NULL;
        return;
    }
    ok = (e->h = calloc((size_t)e->threads, sizeof *e->h)) != NULL;
    for (int t = 0; ok && t < e->threads; t++) ok = handles_make(eng, e, &e->h[t]);
    if (!ok) {   /* no handles: no primitive, the loop runs */
        for (int t = 0; e->h && t < e->threads; t++) handles_free(&e->h[t]);
        free(e->h), e->h = NULL;
        dnnl_primitive_destroy(e->p), e->p = NULL;
    }
}

static gb_entry *gb_find(gb_entry *e, const ch_gemm_batch *g, int threads)
{
    while (e && !(e->threads == threads && gb_key_eq(&e->key, g))) e = e->next;
    return e;
}

/* A thread's last GB_MEMO entries found, with the serial of their cache: a walk of the list
 * misses the cache at each entry (each is kilobytes, its descriptors), and a bf16 resnet18 step
 * walked ~60 entries a call, ~2,000 calls a step (the Winograds' chunks), 0.6% of the step under
 * perf. A chunked pass asks for one or two keys over and over. A freed cache's serial never comes
 * back, so a slot of one is never matched. */
enum { GB_MEMO = 4 };
typedef struct gb_memo {
    uint64_t serial;
    int threads;
    ch_gemm_batch key;
    const gb_entry *e;
} gb_memo;
static _Thread_local gb_memo gb_memos[GB_MEMO];
static _Thread_local unsigned gb_memo_next;

static const gb_entry *memo_find(const struct ch_gb_cache *c, const ch_gemm_batch *g, int threads)
{
    for (int i = 0; i < GB_MEMO; i++) {
        const gb_memo *m = &gb_memos[i];
        if (m->serial == c->serial && m->threads == threads && gb_key_eq(&m->key, g)) return m->e;
    }
    return NULL;
}

static void memo_keep(const struct ch_gb_cache *c, const ch_gemm_batch *g, int threads, const gb_entry *e)
{
    gb_memos[gb_memo_next++ % GB_MEMO] = (gb_memo){ .serial = c->serial, .threads = threads, .key = *g, .e = e };
}

/* c's entry of g for teams of up to `threads`, made and published when there is none (NULL only
 * where memory ran out). */
static const gb_entry *gb_entry_of(struct ch_gb_cache *c, const ch_gemm_batch *g, int threads)
{
    const gb_entry *known = memo_find(c, g, threads);
    if (known) return known;
    gb_entry *e = gb_find(atomic_load_explicit(&c->entries, memory_order_acquire), g, threads);
    if (e) {
        memo_keep(c, g, threads, e);
        return e;
    }
    pthread_mutex_lock(&c->add);
    gb_entry *head = atomic_load_explicit(&c->entries, memory_order_acquire);
    if (!(e = gb_find(head, g, threads)) && (e = calloc(1, sizeof *e)) != NULL) {
        e->key = *g;
        e->threads = threads;
        gb_build(c->engine, e);
        e->next = head;
        atomic_store_explicit(&c->entries, e, memory_order_release);
    }
    pthread_mutex_unlock(&c->add);
    return e;
}

/* kc's entry of g (NULL only where memory or oneDNN failed). Without a kernel cache (a ch_kctx
 * made by hand) it is one of a cache made for the call, as cpu_dnnl_conv.c's passes do, left in
 * *own for the caller to free: such a call makes its primitive and frees it, correct and slow. */
static const gb_entry *gb_entry_for(const ch_kctx *kc, const ch_gemm_batch *g, struct ch_kcache **own)
{
    *own = kc->cache ? NULL : ch_cpu_kcache_create();
    struct ch_gb_cache *c = ch_cpu_kcache_gemms(kc->cache ? kc->cache : *own);
    return c ? gb_entry_of(c, g, kc->nthreads > 0 ? kc->nthreads : 1) : NULL;
}

size_t ch_cpu_gemm_batch_scratch(const ch_kctx *kc, const ch_gemm_batch *g)
{
    struct ch_kcache *own;
    const gb_entry *e = gb_entry_for(kc, g, &own);
    const size_t bytes = e && e->p && e->scratch_bytes ? e->scratch_bytes + GB_ALIGN : 0;
    ch_cpu_kcache_free(own);
    return bytes;
}

bool ch_cpu_gemm_batch_fast(const ch_kctx *kc, const ch_gemm_batch *g)
{
    struct ch_kcache *own;
    const gb_entry *e = gb_entry_for(kc, g, &own);
    const bool fast = e && e->p;
    ch_cpu_kcache_free(own);
    return fast;
}

/* The batch through e's primitive on the calling thread's handles; false where there is none (the
 * caller loops instead). A team larger than the entry's is a caller's error, not a reason to run
 * the loop, whose sums (bf16: in double) give other bits. */
static bool gb_run(const gb_entry *e, const void *a, const void *b, ch_real *c, void *scratch)
{
    const int t = omp_in_parallel() ? omp_get_thread_num() : 0;
    if (!e || !e->p || (e->scratch_bytes && !scratch)) return false;
    CH_ASSERT(t < e->threads);
    void *sp = (void *)(((uintptr_t)scratch + GB_ALIGN - 1) & ~(uintptr_t)(GB_ALIGN - 1));
    const gb_handles *h = &e->h[t];
    void *ptrs[GB_ARGS] = { (void *)a, (void *)b, c, sp };
    const int args[GB_ARGS] = { DNNL_ARG_SRC, DNNL_ARG_WEIGHTS, DNNL_ARG_DST, DNNL_ARG_SCRATCHPAD };
    const int n = e->scratch_bytes ? GB_ARGS : GB_ARGS - 1;
    dnnl_exec_arg_t ex[GB_ARGS];
    for (int i = 0; i < n; i++) {
        CH_ASSERT(dnnl_memory_set_data_handle(h->mem[i], ptrs[i]) == dnnl_success);
        ex[i] = (dnnl_exec_arg_t){ args[i], h->mem[i] };
    }
    CH_ASSERT(dnnl_primitive_execute(e->p, h->stream, n, ex) == dnnl_success);
    CH_ASSERT(dnnl_stream_wait(h->stream) == dnnl_success);
    return true;
}

/* g through kc's entry of it, or false. */
static bool gb_call(const ch_kctx *kc, const ch_gemm_batch *g, const void *a, const void *b,
                    ch_real *c, void *scratch)
{
    struct ch_kcache *own;
    const bool ran = gb_run(gb_entry_for(kc, g, &own), a, b, c, scratch);
    ch_cpu_kcache_free(own);
    return ran;
}

void ch_cpu_gemm_batch(const ch_kctx *kc, const ch_gemm_batch *g, const ch_real *a,
                       const ch_real *b, ch_real *c, void *scratch)
{
    CH_ASSERT(!g->bf16);
    if (g->batch <= 0 || g->m <= 0 || g->n <= 0) return;
    if (!gb_call(kc, g, a, b, c, scratch)) gemm_batch_loop(kc, g, a, b, c);
}

void ch_cpu_gemm_batch_bf16(const ch_kctx *kc, const ch_gemm_batch *g, const uint16_t *a,
                            const uint16_t *b, ch_real *c, void *scratch)
{
    CH_ASSERT(g->bf16);
    if (g->batch <= 0 || g->m <= 0 || g->n <= 0) return;
    if (!gb_call(kc, g, a, b, c, scratch)) gemm_batch_loop_bf16(g, a, b, c);
}

#endif
