/* oneDNN's convolution primitives, all three passes, in two uses:
 *  - Winograd F(4x4, 3x3) in fp32 (`jit_wino_4x3:avx512_core`) for 3x3, stride-1, pad-1 layers with
 *    channel counts in multiples of 16 (ch_cpu_wino_*);
 *  - direct convolutions with bf16 operands and fp32 accumulation (`jit_bf16:avx512_core_bf16`) for
 *    the layers of a --precision bf16 model where bf16 is the faster (ch_cpu_conv_bf16_*).
 * Why Winograd: F(4x4, 3x3) does a 6x6 tile's 36 multiplies where the direct form does 16 outputs
 * x 9 taps, so on resnet18's layers (batch 256, 2 threads, a Zen 3) the three passes took 78, 90,
 * 63 and 55 ms for 64@28x28, 128@14x14, 256@7x7 and 512@4x4 against im2col + GEMM's 118, 105, 114
 * and 147 ms, at 400-1200 "GFLOP/s" counted as direct work (the GEMM peaks at ~450).
 * Why bf16 direct where no Winograd applies: a bf16 dot product (vdpbf16ps) does twice an fp32
 * FMA's multiplies. Measured on a Zen 5 (batch 256, 2 threads, the three passes with their
 * reorders), fp32 (im2col + GEMM) against bf16: resnet18's 3x3 stride-2 layers 64@28x28 -> 128
 * 97.5 against 52.2 ms, 128@14x14 -> 256 84.2 against 48.7, 256@7x7 -> 512 104.1 against 65.5.
 * Where a Winograd applies it stays the faster in fp32 (64@28x28: cohort's F(4x4, 3x3) 69 ms,
 * bf16 direct 77; 256@7x7: oneDNN's Winograd 59, bf16 72), and 1x1 layers gain nothing once their
 * operands are reordered (64@28x28 -> 128, stride 2: 13.1 against 19.7 ms), so those keep fp32.
 * How: the kernels need blocked layouts (nChw16c, and bf16 pairs for the weights), so each pass
 * reorders its operands from NCHW fp32 into the kernel workspace (the reorder rounds fp32 to bf16,
 * to nearest even), runs the primitive and reorders the fp32 result back. Master weights,
 * gradients and activations stay fp32 in the model: only the operands of the products are bf16.
 * The primitives are made once per geometry, use, batch and thread count, on first use (at plan
 * time for the planned batch), and kept in a process-wide cache that is freed at exit, unless a
 * pass is still running then (a thread that exit() did not stop): that pass keeps its primitives,
 * and later ones run im2col. Their scratchpad is in the kernel workspace ("user" mode): with
 * oneDNN's default, replicas running the same primitive at once would share one.
 * Where oneDNN has no such kernel (no AVX-512, no native bf16) or a layer does not fit, the caller
 * runs its fp32 path. Numerically Winograd's transforms add rounding, within test_kernels's 1e-5 of
 * the reference; the bf16 passes are held to the reference run on operands rounded to bf16.
 * Each pass makes a stream and its memory handles (small oneDNN objects; oneDNN's execute builds
 * its own argument map on every call anyway): the primitives may run in several replicas at once,
 * so nothing per call is kept in the shared cache. */
#include "kernels/cpu/cpu.h"

#ifdef CH_REAL_DOUBLE

size_t ch_cpu_wino_workspace(const ch_conv_desc *d, int n, int nthreads)
{
    (void)d, (void)n, (void)nthreads;
    return 0;
}

bool ch_cpu_wino_forward(const ch_kctx *kc, const ch_conv_desc *d, int n, const ch_real *x,
                         const ch_real *w, const ch_real *b, ch_real *y)
{
    (void)kc, (void)d, (void)n, (void)x, (void)w, (void)b, (void)y;
    return false;
}

bool ch_cpu_wino_backward_data(const ch_kctx *kc, const ch_conv_desc *d, int n, const ch_real *dy,
                               const ch_real *w, ch_real *dx)
{
    (void)kc, (void)d, (void)n, (void)dy, (void)w, (void)dx;
    return false;
}

bool ch_cpu_wino_backward_weights(const ch_kctx *kc, const ch_conv_desc *d, int n,
                                  const ch_real *x, const ch_real *y, ch_real *dy, ch_real *dw,
                                  ch_real *db)
{
    (void)kc, (void)d, (void)n, (void)x, (void)y, (void)dy, (void)dw, (void)db;
    return false;
}

size_t ch_cpu_conv_bf16_workspace(const ch_conv_desc *d, int n, int nthreads)
{
    (void)d, (void)n, (void)nthreads;
    return 0;
}

bool ch_cpu_conv_bf16_forward(const ch_kctx *kc, const ch_conv_desc *d, int n, const ch_real *x,
                              const ch_real *w, const ch_real *b, ch_real *y)
{
    (void)kc, (void)d, (void)n, (void)x, (void)w, (void)b, (void)y;
    return false;
}

bool ch_cpu_conv_bf16_backward_data(const ch_kctx *kc, const ch_conv_desc *d, int n,
                                    const ch_real *dy, const ch_real *w, ch_real *dx)
{
    (void)kc, (void)d, (void)n, (void)dy, (void)w, (void)dx;
    return false;
}

bool ch_cpu_conv_bf16_backward_weights(const ch_kctx *kc, const ch_conv_desc *d, int n,
                                       const ch_real *x, const ch_real *y, ch_real *dy,
                                       ch_real *dw, ch_real *db)
{
    (void)kc, (void)d, (void)n, (void)x, (void)y, (void)dy, (void)dw, (void)db;
    return false;
}

#else

#include <dnnl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/status.h"

enum { WINO_ALIGN = 64, WINO_SIMD = 16 };

/* What a cache entry is for: the two uses of this file. */
typedef enum dc_use { DC_WINOGRAD, DC_BF16 } dc_use;

typedef struct wino_key {
    int c, oc, h, w, kh, kw, stride, pad, oh, ow, n, nthreads;
    bool relu;
    dc_use use;
} wino_key;

/* A primitive and the scratchpad it wants (bytes; user mode). */
typedef struct wino_prim {
    dnnl_primitive_t p;
    size_t scratch;
} wino_prim;

/* The operands of a pass in the layouts its primitive chose, and the reorders into them. */
typedef struct wino_entry {
    wino_key key;
    bool ok;   /* false: oneDNN made no Winograd kernel here */
    dnnl_memory_desc_t plain_x, plain_y, plain_w, bias;
    dnnl_memory_desc_t f_src, f_wei, f_dst;   /* forward */
    dnnl_memory_desc_t d_dst, d_wei, d_src;   /* backward data: diff_dst, weights, diff_src */
    dnnl_memory_desc_t w_src, w_dst, w_dwei;  /* backward weights: src, diff_dst, diff_weights */
    wino_prim fwd, bwd_data, bwd_weights;
    wino_prim f_x_in, f_w_in, f_y_out, d_dy_in, d_w_in, d_dx_out, w_x_in, w_dy_in, w_dw_out;
    size_t need;   /* workspace bytes of the largest pass */
    struct wino_entry *next;
} wino_entry;

static struct {
    pthread_mutex_t lock;
    dnnl_engine_t engine;
    wino_entry *entries;
    bool freed_at_exit;
    bool closed;   /* exit has begun: no new passes */
    int running;   /* passes between pass_begin and pass_end */
} g_wino = { .lock = PTHREAD_MUTEX_INITIALIZER };

/* Where cohort's own F(4x4, 3x3) (cpu_wino3.c) is the faster of the two: planes of 14x14 and up
 * with 32 channels and more. Measured on a Zen 5 (AVX-512), the three passes together, oneDNN's
 * against cohort's: resnet18's 64@28x28 98 against 73 ms and 128@14x14 81 against 64 (batch 256,
 * 2 threads); 44 against 35 and 40 against 33 (batch 64, 1 thread); ResNet-20's 32@14x14 2.2
 * against 1.9 ms. oneDNN's keeps 16@28x28 (2.1 against 2.9 ms), 256@7x7 (58 against 67) and
 * 512@4x4 (57 against 125), whose few tiles per sample its blocked layout serves better. */
static bool own_wino_wins(const ch_conv_desc *d)
{
    return d->c >= 32 && d->oc >= 32 && (long)d->oh * d->ow >= 14 * 14;
}

/* Also, as for cohort's own Winograds (wino_body.h): fewer multiplies than the direct form, 36 per
 * 4x4 tile against 9 per output. A 2x2 plane (one tile: 36 against 36) or a 1x1 plane (36 against
 * 9) gains nothing, and the transforms round ~15 times more than im2col there. */
static bool wino_geometry(const ch_conv_desc *d)
{
    const long tiles = (long)((d->oh + 3) / 4) * ((d->ow + 3) / 4);
    return d->kh == 3 && d->kw == 3 && d->stride == 1 && d->pad == 1 && d->c % WINO_SIMD == 0 &&
           d->oc % WINO_SIMD == 0 && tiles * 36 < (long)d->oh * d->ow * 9 && !own_wino_wins(d);
}

/* A --precision bf16 layer that no Winograd takes (their fp32 beats bf16 direct where they apply),
 * not 1x1 (its operands' reorders cost what bf16 saves), with 16 channels or more each way (oneDNN's
 * bf16 kernels block channels by 16: fewer leave most of each vector idle), on a CPU with native
 * bf16. Grouped and dilated layers keep their own fp32 kernels (cpu_conv_group.c). */
static bool bf16_geometry(const ch_conv_desc *d)
{
    return d->bf16 && ch_conv_groups(d) == 1 && ch_conv_dilation(d) == 1 && d->kh * d->kw > 1 &&
           d->c >= 16 && d->oc >= 16 && !wino_geometry(d) && ch_cpu_wino3_workspace(d, 1, 1) == 0 &&
           ch_cpu_wino5_workspace(d, 1, 1) == 0 && ch_cpu_bf16_native(NULL, 0);
}

static size_t align_up(size_t v) { return (v + WINO_ALIGN - 1) / WINO_ALIGN * WINO_ALIGN; }
static size_t md_bytes(const dnnl_memory_desc_t *md) { return dnnl_memory_desc_get_size(md); }

static void prim_free(wino_prim *p)
{
    if (p->p) dnnl_primitive_destroy(p->p);
    p->p = NULL;
}

static void entry_free(wino_entry *e)
{
    wino_prim *all[] = { &e->fwd, &e->bwd_data, &e->bwd_weights, &e->f_x_in, &e->f_w_in,
                         &e->f_y_out, &e->d_dy_in, &e->d_w_in, &e->d_dx_out, &e->w_x_in,
                         &e->w_dy_in, &e->w_dw_out };
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) prim_free(all[i]);
    free(e);
}

static void wino_free_all(void)
{
    pthread_mutex_lock(&g_wino.lock);
    g_wino.closed = true;
    while (g_wino.running == 0 && g_wino.entries) {
        wino_entry *e = g_wino.entries;
        g_wino.entries = e->next;
        entry_free(e);
    }
    if (g_wino.running == 0 && g_wino.engine) {
        dnnl_engine_destroy(g_wino.engine);
        g_wino.engine = NULL;
    }
    pthread_mutex_unlock(&g_wino.lock);
}

static dnnl_primitive_attr_t user_scratchpad_attr(bool relu)
{
    dnnl_primitive_attr_t attr = NULL;
    if (dnnl_primitive_attr_create(&attr) != dnnl_success) return NULL;
    bool ok = dnnl_primitive_attr_set_scratchpad_mode(attr, dnnl_scratchpad_mode_user) ==
              dnnl_success;
    if (ok && relu) {
        dnnl_post_ops_t po = NULL;
        ok = dnnl_post_ops_create(&po) == dnnl_success &&
             dnnl_post_ops_append_eltwise(po, 1.0f, dnnl_eltwise_relu, 0, 0) == dnnl_success &&
             dnnl_primitive_attr_set_post_ops(attr, po) == dnnl_success;
        if (po) dnnl_post_ops_destroy(po);
    }
    if (!ok) {
        dnnl_primitive_attr_destroy(attr);
        return NULL;
    }
    return attr;
}

/* The primitive of pd (which it then owns) and its scratchpad size. */
static bool prim_from_pd(dnnl_primitive_desc_t pd, wino_prim *out)
{
    const dnnl_memory_desc_t *sp = dnnl_primitive_desc_query_md(pd, dnnl_query_scratchpad_md, 0);
    out->scratch = sp ? md_bytes(sp) : 0;
    const bool ok = dnnl_primitive_create(&out->p, pd) == dnnl_success;
    dnnl_primitive_desc_destroy(pd);
    return ok;
}

static bool make_reorder(const dnnl_memory_desc_t *from, const dnnl_memory_desc_t *to,
                         wino_prim *out)
{
    dnnl_primitive_attr_t attr = user_scratchpad_attr(false);
    dnnl_primitive_desc_t pd = NULL;
    const bool ok = attr && dnnl_reorder_primitive_desc_create(&pd, from, g_wino.engine, to,
                                                               g_wino.engine, attr) == dnnl_success;
    if (attr) dnnl_primitive_attr_destroy(attr);
    return ok && prim_from_pd(pd, out);
}

static void copy_md(dnnl_primitive_desc_t pd, dnnl_query_t what, dnnl_memory_desc_t *out)
{
    *out = *dnnl_primitive_desc_query_md(pd, what, 0);
}

/* The three convolution primitives, with the layouts they chose; pds are destroyed here. In bf16
 * the products' operands (x, w, dy) are bf16 and what the passes write (y, dx, dw) fp32. */
static bool make_convolutions(wino_entry *e)
{
    const wino_key *k = &e->key;
    const bool bf16 = k->use == DC_BF16;
    const dnnl_data_type_t in = bf16 ? dnnl_bf16 : dnnl_f32;
    const dnnl_alg_kind_t alg = bf16 ? dnnl_convolution_direct : dnnl_convolution_winograd;
    dnnl_memory_desc_t any_x, any_y, any_w, out_x, out_y, out_w;
    const dnnl_dims_t xd = { k->n, k->c, k->h, k->w }, yd = { k->n, k->oc, k->oh, k->ow };
    const dnnl_dims_t wd = { k->oc, k->c, k->kh, k->kw }, bd = { k->oc };
    /* PyTorch's output size rounds down: the right and bottom padding is what the last window
     * reaches, which may be less than pad. */
    const dnnl_dims_t st = { k->stride, k->stride }, pl = { k->pad, k->pad },
                      pr = { (k->oh - 1) * k->stride + k->kh - k->h - k->pad,
                             (k->ow - 1) * k->stride + k->kw - k->w - k->pad };
    if (pr[0] < 0 || pr[1] < 0) return false;
    if (dnnl_memory_desc_init_by_tag(&e->plain_x, 4, xd, dnnl_f32, dnnl_nchw) ||
        dnnl_memory_desc_init_by_tag(&e->plain_y, 4, yd, dnnl_f32, dnnl_nchw) ||
        dnnl_memory_desc_init_by_tag(&e->plain_w, 4, wd, dnnl_f32, dnnl_oihw) ||
        dnnl_memory_desc_init_by_tag(&e->bias, 1, bd, dnnl_f32, dnnl_x) ||
        dnnl_memory_desc_init_by_tag(&any_x, 4, xd, in, dnnl_format_tag_any) ||
        dnnl_memory_desc_init_by_tag(&any_y, 4, yd, in, dnnl_format_tag_any) ||
        dnnl_memory_desc_init_by_tag(&any_w, 4, wd, in, dnnl_format_tag_any) ||
        dnnl_memory_desc_init_by_tag(&out_x, 4, xd, dnnl_f32, dnnl_format_tag_any) ||
        dnnl_memory_desc_init_by_tag(&out_y, 4, yd, dnnl_f32, dnnl_format_tag_any) ||
        dnnl_memory_desc_init_by_tag(&out_w, 4, wd, dnnl_f32, dnnl_format_tag_any))
        return false;

    dnnl_convolution_desc_t cd;
    dnnl_primitive_desc_t fpd = NULL, pd = NULL;
    dnnl_primitive_attr_t fattr = user_scratchpad_attr(k->relu), attr = user_scratchpad_attr(false);
    bool ok = fattr && attr &&
              dnnl_convolution_forward_desc_init(&cd, dnnl_forward_training, alg, &any_x, &any_w,
                                                 &e->bias, &out_y, st, pl, pr) == dnnl_success &&
              dnnl_primitive_desc_create(&fpd, &cd, fattr, g_wino.engine, NULL) == dnnl_success;
    if (ok) {
        copy_md(fpd, dnnl_query_src_md, &e->f_src);
        copy_md(fpd, dnnl_query_weights_md, &e->f_wei);
        copy_md(fpd, dnnl_query_dst_md, &e->f_dst);
        ok = dnnl_convolution_backward_data_desc_init(&cd, alg, bf16 ? &out_x : &e->f_src, &any_w,
                                                      bf16 ? &any_y : &e->f_dst, st, pl, pr) ==
                 dnnl_success &&
             dnnl_primitive_desc_create(&pd, &cd, attr, g_wino.engine, fpd) == dnnl_success;
    }
    if (ok) {
        copy_md(pd, dnnl_query_diff_dst_md, &e->d_dst);
        copy_md(pd, dnnl_query_weights_md, &e->d_wei);
        copy_md(pd, dnnl_query_diff_src_md, &e->d_src);
        ok = prim_from_pd(pd, &e->bwd_data);
        pd = NULL;
    }
    if (ok)
        ok = dnnl_convolution_backward_weights_desc_init(&cd, alg, bf16 ? &any_x : &e->f_src,
                                                         &out_w, &e->bias,
                                                         bf16 ? &any_y : &e->f_dst, st, pl,
                                                         pr) == dnnl_success &&
             dnnl_primitive_desc_create(&pd, &cd, attr, g_wino.engine, fpd) == dnnl_success;
    if (ok) {
        copy_md(pd, dnnl_query_src_md, &e->w_src);
        copy_md(pd, dnnl_query_diff_dst_md, &e->w_dst);
        copy_md(pd, dnnl_query_diff_weights_md, &e->w_dwei);
        ok = prim_from_pd(pd, &e->bwd_weights);
        pd = NULL;
    }
    if (ok) {
        ok = prim_from_pd(fpd, &e->fwd);
        fpd = NULL;
    }
    if (fpd) dnnl_primitive_desc_destroy(fpd);
    if (pd) dnnl_primitive_desc_destroy(pd);
    if (fattr) dnnl_primitive_attr_destroy(fattr);
    if (attr) dnnl_primitive_attr_destroy(attr);
    return ok;
}

static size_t max_of(size_t a, size_t b) { return a > b ? a : b; }

/* The largest scratchpad of a pass's four primitives (they run one after another). */
static size_t pass_scratch(const wino_prim *a, const wino_prim *b, const wino_prim *c,
                           const wino_prim *d)
{
    return max_of(max_of(a->scratch, b->scratch), max_of(c->scratch, d->scratch));
}

/* Workspace of one pass: its three operands, a zero bias or spare db, then the largest
 * scratchpad of its primitives (they run one after another). */
static size_t pass_need(const dnnl_memory_desc_t *a, const dnnl_memory_desc_t *b,
                        const dnnl_memory_desc_t *c, const wino_entry *e, size_t scratch)
{
    return WINO_ALIGN + align_up(md_bytes(a)) + align_up(md_bytes(b)) + align_up(md_bytes(c)) +
           align_up(sizeof(float) * (size_t)e->key.oc) + align_up(scratch);
}

static void entry_build(wino_entry *e)
{
    e->ok = make_convolutions(e) && make_reorder(&e->plain_x, &e->f_src, &e->f_x_in) &&
            make_reorder(&e->plain_w, &e->f_wei, &e->f_w_in) &&
            make_reorder(&e->f_dst, &e->plain_y, &e->f_y_out) &&
            make_reorder(&e->plain_y, &e->d_dst, &e->d_dy_in) &&
            make_reorder(&e->plain_w, &e->d_wei, &e->d_w_in) &&
            make_reorder(&e->d_src, &e->plain_x, &e->d_dx_out) &&
            make_reorder(&e->plain_x, &e->w_src, &e->w_x_in) &&
            make_reorder(&e->plain_y, &e->w_dst, &e->w_dy_in) &&
            make_reorder(&e->w_dwei, &e->plain_w, &e->w_dw_out);
    if (!e->ok) return;
    const size_t fs = pass_scratch(&e->fwd, &e->f_x_in, &e->f_w_in, &e->f_y_out);
    const size_t ds = pass_scratch(&e->bwd_data, &e->d_dy_in, &e->d_w_in, &e->d_dx_out);
    const size_t ws = pass_scratch(&e->bwd_weights, &e->w_x_in, &e->w_dy_in, &e->w_dw_out);
    e->need = max_of(pass_need(&e->f_src, &e->f_wei, &e->f_dst, e, fs),
                     max_of(pass_need(&e->d_dst, &e->d_wei, &e->d_src, e, ds),
                            pass_need(&e->w_src, &e->w_dst, &e->w_dwei, e, ws)));
}

static bool key_eq(const wino_key *a, const wino_key *b)
{
    return a->c == b->c && a->oc == b->oc && a->h == b->h && a->w == b->w && a->kh == b->kh &&
           a->kw == b->kw && a->stride == b->stride && a->pad == b->pad && a->oh == b->oh &&
           a->ow == b->ow && a->n == b->n && a->nthreads == b->nthreads && a->relu == b->relu &&
           a->use == b->use;
}

/* The cache entry of (d, n, nthreads), made on first use; NULL where Winograd does not apply.
 * oneDNN sizes its work for omp_get_max_threads() of the calling thread, so that is set to the
 * entry's thread count while the primitives are made and while they run. A pass that gets an
 * entry with fits (workspace bytes it has) counts as running until pass_end. */
static const wino_entry *entry_for(dc_use use, const ch_conv_desc *d, int n, int nthreads,
                                   size_t fits)
{
    if (n <= 0 || !(use == DC_WINOGRAD ? wino_geometry(d) : bf16_geometry(d))) return NULL;
    const wino_key key = { .c = d->c, .oc = d->oc, .h = d->h, .w = d->w, .kh = d->kh, .kw = d->kw,
                           .stride = d->stride, .pad = d->pad, .oh = d->oh, .ow = d->ow, .n = n,
                           .nthreads = nthreads, .relu = d->relu, .use = use };
    pthread_mutex_lock(&g_wino.lock);
    if (g_wino.closed) {
        pthread_mutex_unlock(&g_wino.lock);
        return NULL;
    }
    wino_entry *e = g_wino.entries;
    while (e && !key_eq(&e->key, &key)) e = e->next;
    if (!e && !g_wino.engine && dnnl_engine_create(&g_wino.engine, dnnl_cpu, 0) != dnnl_success)
        g_wino.engine = NULL;
    if (!e && g_wino.engine && (e = calloc(1, sizeof *e)) != NULL) {
        e->key = key;
        const int prev = omp_get_max_threads();
        omp_set_num_threads(nthreads);
        entry_build(e);
        omp_set_num_threads(prev);
        e->next = g_wino.entries;
        g_wino.entries = e;
        if (!g_wino.freed_at_exit) g_wino.freed_at_exit = atexit(wino_free_all) == 0;
    }
    if (e && !(e->ok && e->need <= fits)) e = NULL;
    if (e && fits != SIZE_MAX) g_wino.running++;
    pthread_mutex_unlock(&g_wino.lock);
    return e;
}

static size_t workspace_of(dc_use use, const ch_conv_desc *d, int n, int nthreads)
{
    const wino_entry *e = entry_for(use, d, n, nthreads, SIZE_MAX);
    return e ? (e->need + sizeof(ch_real) - 1) / sizeof(ch_real) : 0;
}

size_t ch_cpu_wino_workspace(const ch_conv_desc *d, int n, int nthreads)
{
    return workspace_of(DC_WINOGRAD, d, n, nthreads);
}

size_t ch_cpu_conv_bf16_workspace(const ch_conv_desc *d, int n, int nthreads)
{
    return workspace_of(DC_BF16, d, n, nthreads);
}

/* The next buffer of a pass in the kernel workspace, 64-byte aligned. */
static void *carve(char **at, size_t bytes)
{
    void *p = *at;
    *at += align_up(bytes);
    return p;
}

/* Runs p on (arg, memory over ptr) pairs; the scratchpad, if any, at scratch. */
enum { WINO_MAX_ARGS = 6 };
typedef struct wino_arg {
    int arg;
    const dnnl_memory_desc_t *md;
    const void *ptr;
} wino_arg;

static void run(const wino_prim *p, dnnl_stream_t s, const wino_arg *a, int na, void *scratch)
{
    dnnl_exec_arg_t args[WINO_MAX_ARGS + 1];
    dnnl_memory_t mem[WINO_MAX_ARGS + 1];
    int m = 0;
    for (; m < na; m++) {
        CH_ASSERT(dnnl_memory_create(&mem[m], a[m].md, g_wino.engine, (void *)a[m].ptr) ==
                  dnnl_success);
        args[m] = (dnnl_exec_arg_t){ a[m].arg, mem[m] };
    }
    if (p->scratch) {
        const_dnnl_primitive_desc_t pd = NULL;
        CH_ASSERT(dnnl_primitive_get_primitive_desc(p->p, &pd) == dnnl_success);
        const dnnl_memory_desc_t *md =
            dnnl_primitive_desc_query_md(pd, dnnl_query_scratchpad_md, 0);
        CH_ASSERT(dnnl_memory_create(&mem[m], md, g_wino.engine, scratch) == dnnl_success);
        args[m] = (dnnl_exec_arg_t){ DNNL_ARG_SCRATCHPAD, mem[m] };
        m++;
    }
    CH_ASSERT(dnnl_primitive_execute(p->p, s, m, args) == dnnl_success);
    CH_ASSERT(dnnl_stream_wait(s) == dnnl_success);
    for (int i = 0; i < m; i++) dnnl_memory_destroy(mem[i]);
}

static void reorder(const wino_prim *p, dnnl_stream_t s, const dnnl_memory_desc_t *from_md,
                    const void *from, const dnnl_memory_desc_t *to_md, void *to, void *scratch)
{
    const wino_arg a[] = { { DNNL_ARG_FROM, from_md, from }, { DNNL_ARG_TO, to_md, to } };
    run(p, s, a, 2, scratch);
}

/* A running pass: its entry, a stream, the calling thread's OpenMP thread count before the pass
 * set it to the entry's, and the workspace. */
typedef struct wino_pass {
    const wino_entry *e;
    dnnl_stream_t s;
    int prev_threads;
    char *ws;   /* the next free byte of the workspace */
} wino_pass;

static void pass_done(void)
{
    pthread_mutex_lock(&g_wino.lock);
    g_wino.running--;
    pthread_mutex_unlock(&g_wino.lock);
}

static bool pass_begin(dc_use use, const ch_kctx *kc, const ch_conv_desc *d, int n, wino_pass *p)
{
    p->e = entry_for(use, d, n, kc->nthreads, kc->ws_len * sizeof(ch_real));
    if (!p->e) return false;
    if (dnnl_stream_create(&p->s, g_wino.engine, dnnl_stream_default_flags) != dnnl_success) {
        pass_done();
        return false;
    }
    p->prev_threads = omp_get_max_threads();
    omp_set_num_threads(kc->nthreads);
    p->ws = (char *)(((uintptr_t)kc->ws + WINO_ALIGN - 1) & ~(uintptr_t)(WINO_ALIGN - 1));
    return true;
}

static void pass_end(wino_pass *p)
{
    omp_set_num_threads(p->prev_threads);
    dnnl_stream_destroy(p->s);
    pass_done();
}

static bool forward(dc_use use, const ch_kctx *kc, const ch_conv_desc *d, int n, const ch_real *x,
                    const ch_real *w, const ch_real *b, ch_real *y)
{
    wino_pass p;
    if (!pass_begin(use, kc, d, n, &p)) return false;
    const wino_entry *e = p.e;
    void *xb = carve(&p.ws, md_bytes(&e->f_src)), *wb = carve(&p.ws, md_bytes(&e->f_wei));
    void *yb = carve(&p.ws, md_bytes(&e->f_dst));
    float *bias = carve(&p.ws, sizeof(float) * (size_t)d->oc);
    void *scratch = p.ws;
    if (!b) memset(bias, 0, sizeof(float) * (size_t)d->oc);
    reorder(&e->f_x_in, p.s, &e->plain_x, x, &e->f_src, xb, scratch);
    reorder(&e->f_w_in, p.s, &e->plain_w, w, &e->f_wei, wb, scratch);
    const wino_arg a[] = { { DNNL_ARG_SRC, &e->f_src, xb }, { DNNL_ARG_WEIGHTS, &e->f_wei, wb },
                           { DNNL_ARG_BIAS, &e->bias, b ? b : bias },
                           { DNNL_ARG_DST, &e->f_dst, yb } };
    run(&e->fwd, p.s, a, 4, scratch);
    reorder(&e->f_y_out, p.s, &e->f_dst, yb, &e->plain_y, y, scratch);
    pass_end(&p);
    return true;
}

static bool backward_data(dc_use use, const ch_kctx *kc, const ch_conv_desc *d, int n,
                          const ch_real *dy, const ch_real *w, ch_real *dx)
{
    wino_pass p;
    if (!pass_begin(use, kc, d, n, &p)) return false;
    const wino_entry *e = p.e;
    void *dyb = carve(&p.ws, md_bytes(&e->d_dst)), *wb = carve(&p.ws, md_bytes(&e->d_wei));
    void *dxb = carve(&p.ws, md_bytes(&e->d_src));
    carve(&p.ws, sizeof(float) * (size_t)d->oc);
    void *scratch = p.ws;
    reorder(&e->d_dy_in, p.s, &e->plain_y, dy, &e->d_dst, dyb, scratch);
    reorder(&e->d_w_in, p.s, &e->plain_w, w, &e->d_wei, wb, scratch);
    const wino_arg a[] = { { DNNL_ARG_DIFF_DST, &e->d_dst, dyb },
                           { DNNL_ARG_WEIGHTS, &e->d_wei, wb },
                           { DNNL_ARG_DIFF_SRC, &e->d_src, dxb } };
    run(&e->bwd_data, p.s, a, 3, scratch);
    reorder(&e->d_dx_out, p.s, &e->d_src, dxb, &e->plain_x, dx, scratch);
    pass_end(&p);
    return true;
}

static bool backward_weights(dc_use use, const ch_kctx *kc, const ch_conv_desc *d, int n,
                             const ch_real *x, const ch_real *y, ch_real *dy, ch_real *dw,
                             ch_real *db)
{
    wino_pass p;
    if (!pass_begin(use, kc, d, n, &p)) return false;
    const wino_entry *e = p.e;
    void *xb = carve(&p.ws, md_bytes(&e->w_src)), *dyb = carve(&p.ws, md_bytes(&e->w_dst));
    void *dwb = carve(&p.ws, md_bytes(&e->w_dwei));
    float *spare_db = carve(&p.ws, sizeof(float) * (size_t)d->oc);
    void *scratch = p.ws;
    /* The fused ReLU's backward, in place, before anything reads dy (backward data does next). */
    if (d->relu) ch_cpu_relu_backward(kc, (size_t)n * d->oc * d->oh * d->ow, y, dy, dy);
    reorder(&e->w_x_in, p.s, &e->plain_x, x, &e->w_src, xb, scratch);
    reorder(&e->w_dy_in, p.s, &e->plain_y, dy, &e->w_dst, dyb, scratch);
    const wino_arg a[] = { { DNNL_ARG_SRC, &e->w_src, xb }, { DNNL_ARG_DIFF_DST, &e->w_dst, dyb },
                           { DNNL_ARG_DIFF_WEIGHTS, &e->w_dwei, dwb },
                           { DNNL_ARG_DIFF_BIAS, &e->bias, db ? db : spare_db } };
    run(&e->bwd_weights, p.s, a, 4, scratch);
    reorder(&e->w_dw_out, p.s, &e->w_dwei, dwb, &e->plain_w, dw, scratch);
    pass_end(&p);
    return true;
}

bool ch_cpu_wino_forward(const ch_kctx *kc, const ch_conv_desc *d, int n, const ch_real *x,
                         const ch_real *w, const ch_real *b, ch_real *y)
{
    return forward(DC_WINOGRAD, kc, d, n, x, w, b, y);
}

bool ch_cpu_wino_backward_data(const ch_kctx *kc, const ch_conv_desc *d, int n, const ch_real *dy,
                               const ch_real *w, ch_real *dx)
{
    return backward_data(DC_WINOGRAD, kc, d, n, dy, w, dx);
}

bool ch_cpu_wino_backward_weights(const ch_kctx *kc, const ch_conv_desc *d, int n,
                                  const ch_real *x, const ch_real *y, ch_real *dy, ch_real *dw,
                                  ch_real *db)
{
    return backward_weights(DC_WINOGRAD, kc, d, n, x, y, dy, dw, db);
}

bool ch_cpu_conv_bf16_forward(const ch_kctx *kc, const ch_conv_desc *d, int n, const ch_real *x,
                              const ch_real *w, const ch_real *b, ch_real *y)
{
    return forward(DC_BF16, kc, d, n, x, w, b, y);
}

bool ch_cpu_conv_bf16_backward_data(const ch_kctx *kc, const ch_conv_desc *d, int n,
                                    const ch_real *dy, const ch_real *w, ch_real *dx)
{
    return backward_data(DC_BF16, kc, d, n, dy, w, dx);
}

bool ch_cpu_conv_bf16_backward_weights(const ch_kctx *kc, const ch_conv_desc *d, int n,
                                       const ch_real *x, const ch_real *y, ch_real *dy,
                                       ch_real *dw, ch_real *db)
{
    return backward_weights(DC_BF16, kc, d, n, x, y, dy, dw, db);
}

#endif
