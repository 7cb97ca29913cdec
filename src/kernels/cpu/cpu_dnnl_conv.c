/* oneDNN's convolution primitives, all three passes, in three uses:
 *  - Winograd F(4x4, 3x3) in fp32 (`jit_wino_4x3:avx512_core`) for 3x3, stride-1, pad-1 layers with
 *    channel counts in multiples of 16 (ch_cpu_wino_*);
 *  - direct convolutions with bf16 operands and fp32 accumulation (`jit_bf16:avx512_core_bf16`) for
 *    the layers of a --precision bf16 model where bf16 is the faster;
 *  - direct convolutions in fp32 (`jit:avx512_core`) for 3x3 stride-2 layers no bf16 kernel takes;
 *    the two direct uses share one set of passes (ch_cpu_conv_direct_*), each layer taking one.
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
 * The primitives are made once per geometry, use, batch and thread count, at plan time (the
 * workspace query) for the planned batch, and kept in the replica's kernel cache (ch_kctx's cache,
 * made and freed with its backend) with a oneDNN engine, a stream and a memory handle per operand,
 * whose data pointer each pass sets: nothing is made per call and no lock is shared between
 * replicas. Their scratchpad is in the kernel workspace ("user" mode): with oneDNN's default,
 * every primitive would hold one of its own.
 * Where oneDNN has no such kernel (no AVX-512, no native bf16) or a layer does not fit, the caller
 * runs its fp32 path. Numerically Winograd's transforms add rounding, within test_kernels's 1e-5 of
 * the reference; the bf16 passes are held to the reference run on operands rounded to bf16.
 * Each pass makes a stream and its memory handles (small oneDNN objects; oneDNN's execute builds
 * its own argument map on every call anyway): the primitives may run in several replicas at once,
 * so nothing per call is kept in the shared cache. */
#include "kernels/cpu/cpu.h"

#ifdef CH_REAL_DOUBLE

#include <stdlib.h>

/* The double build has no oneDNN convolutions: an empty cache, so backends are made alike. */
struct ch_kcache {
    int unused;
};

struct ch_kcache *ch_cpu_kcache_create(void) { return calloc(1, sizeof(struct ch_kcache)); }
void ch_cpu_kcache_free(struct ch_kcache *c) { free(c); }
struct ch_gb_cache *ch_cpu_kcache_gemms(const struct ch_kcache *c)
{
    (void)c;
    return NULL;
}
size_t ch_cpu_kcache_entries(const struct ch_kcache *c)
{
    (void)c;
    return 0;
}

size_t ch_cpu_wino_workspace(const ch_kctx *kc, const ch_conv_desc *d, int n)
{
    (void)kc, (void)d, (void)n;
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

size_t ch_cpu_conv_bf16_workspace(const ch_kctx *kc, const ch_conv_desc *d, int n)
{
    (void)kc, (void)d, (void)n;
    return 0;
}

bool ch_cpu_dnnl_conv_takes(const ch_conv_desc *d, int n)
{
    (void)d, (void)n;
    return false;
}

bool ch_cpu_conv_bf16_direct(const ch_conv_desc *d)
{
    (void)d;
    return false;
}

size_t ch_cpu_conv_direct_workspace(const ch_kctx *kc, const ch_conv_desc *d, int n)
{
    (void)kc, (void)d, (void)n;
    return 0;
}

bool ch_cpu_conv_direct_forward(const ch_kctx *kc, const ch_conv_desc *d, int n, const ch_real *x,
                                const ch_real *w, const ch_real *b, ch_real *y)
{
    (void)kc, (void)d, (void)n, (void)x, (void)w, (void)b, (void)y;
    return false;
}

bool ch_cpu_conv_direct_backward_data(const ch_kctx *kc, const ch_conv_desc *d, int n,
                                      const ch_real *dy, const ch_real *w, ch_real *dx)
{
    (void)kc, (void)d, (void)n, (void)dy, (void)w, (void)dx;
    return false;
}

bool ch_cpu_conv_direct_backward_weights(const ch_kctx *kc, const ch_conv_desc *d, int n,
                                         const ch_real *x, const ch_real *y, ch_real *dy,
                                         ch_real *dw, ch_real *db)
{
    (void)kc, (void)d, (void)n, (void)x, (void)y, (void)dy, (void)dw, (void)db;
    return false;
}

#else

#include <dnnl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/status.h"

enum { WINO_ALIGN = 64, WINO_SIMD = 16 };

/* What a cache entry is for: the three uses of this file. */
typedef enum dc_use { DC_WINOGRAD, DC_BF16, DC_DIRECT } dc_use;

typedef struct wino_key {
    int c, oc, h, w, kh, kw, stride, pad, oh, ow, n, nthreads;
    bool relu;
    dc_use use;
} wino_key;

/* A primitive, the scratchpad it wants (bytes; user mode) and the handle its scratchpad is passed
 * through. */
typedef struct wino_prim {
    dnnl_primitive_t p;
    size_t scratch;
    dnnl_memory_t scratch_mem;
} wino_prim;

/* The operands of the passes: plain (NCHW, fp32) forms, and the layouts the primitives chose. */
typedef enum wino_slot {
    S_PLAIN_X, S_PLAIN_Y, S_PLAIN_W, S_BIAS,
    S_F_SRC, S_F_WEI, S_F_DST,      /* forward */
    S_D_DST, S_D_WEI, S_D_SRC,      /* backward data: diff_dst, weights, diff_src */
    S_W_SRC, S_W_DST, S_W_DWEI,     /* backward weights: src, diff_dst, diff_weights */
    S_SLOTS
} wino_slot;

/* A geometry's primitives, the reorders into and out of their layouts, and a memory handle per
 * operand (no data of its own: each pass points it at that call's buffer). */
typedef struct wino_entry {
    wino_key key;
    bool ok;   /* false: oneDNN made no such kernel here */
    dnnl_memory_desc_t md[S_SLOTS];
    dnnl_memory_t mem[S_SLOTS];
    wino_prim fwd, bwd_data, bwd_weights;
    wino_prim f_x_in, f_w_in, f_y_out, d_dy_in, d_w_in, d_dx_out, w_x_in, w_dy_in, w_dw_out;
    size_t need;   /* workspace bytes of the largest pass */
    struct wino_entry *next;   /* set before the entry is published, never changed after */
} wino_entry;

/* One replica's: entries are only added, at the head, each complete before it is published, so
 * a pass finds its entry without a lock; the lock orders two planners (a lazy backend plans on
 * the host thread while its worker runs queued passes). */
struct ch_kcache {
    pthread_mutex_t add;
    dnnl_engine_t engine;
    dnnl_stream_t stream;
    _Atomic(wino_entry *) entries;
    struct ch_gb_cache *gemms;   /* cpu_gemm.c's batched matmuls, made with the cache */
};

/* Where cohort's own F(4x4, 3x3) (cpu_wino3.c) is the faster of the two: planes of 14x14 and up
 * with 32 channels and more. Measured on a Zen 5 (AVX-512), the three passes together, oneDNN's
 * against cohort's: resnet18's 64@28x28 98 against 73 ms and 128@14x14 81 against 64 (batch 256,
 * 2 threads); 44 against 35 and 40 against 33 (batch 64, 1 thread); ResNet-20's 32@14x14 2.2
 * against 1.9 ms. oneDNN's keeps 16@28x28 (2.1 against 2.9 ms), 256@7x7 (58 against 67) and
 * 512@4x4 (57 against 125), whose few tiles per sample its blocked layout serves better. A
 * --precision bf16 layer goes to cohort's in every case: its bf16 point products, with the
 * groups of small planes run several at a time through each GEMM, beat this fp32 Winograd
 * (batch 256, 2 threads, three passes: 256@7x7 49.8-50.3 against 56.5-59.9 ms with only backward
 * weights in cohort's, 512@4x4 52.2-54.4 against 59.5-61.4). */
static bool own_wino_wins(const ch_conv_desc *d)
{
    return ch_cpu_wino3_in_bf16(d) || (d->c >= 32 && d->oc >= 32 && (long)d->oh * d->ow >= 14 * 14);
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
           d->c >= 16 && d->oc >= 16 && !wino_geometry(d) && !ch_cpu_wino3_applies(d) &&
           !ch_cpu_wino5_applies(d) && ch_cpu_bf16_products(NULL, 0);
}

/* oneDNN's fp32 direct kernel against im2col + GEMM on 3x3 stride-2 layers (ms of forward /
 * backward data / backward weights, 2 threads, bench/conv_kernels; an Intel family 6 model 207,
 * AVX-512): resnet18's (28x28, batch 256) 64@28x28 -> 128 29.8 / 30.6 / 32.6 against 37.8 / 36.7 /
 * 37.6, 128@14x14 -> 256 26.6-29.1 / 29.2-30.6 / 31.3-32.8 against 31.0-33.6 / 34.6-38.9 /
 * 31.6-34.0, 256@7x7 -> 512 23.7-25.3 / 38.8-41.9 / 43.2-46.7 against 39.9-42.5 / 44.6-45.1 /
 * 40.3-41.0; ResNet-20's (batch 64) 16@28x28 -> 32 and 32@14x14 -> 64 1.3 to 2 times as fast in
 * all three. So the forward and backward data are oneDNN's wherever it applies, the weight
 * gradient where the output plane is 7x7 or more (at 4x4 it loses; between, unmeasured, im2col
 * as before). Fewer than 16 channels leave most of its 16-channel blocks idle. Not measured on the
 * AVX-512 Zen 4 and 5, which take it too; without AVX-512, im2col stays. A --precision bf16 layer
 * takes it where its products stay fp32. */
bool ch_cpu_conv_bf16_direct(const ch_conv_desc *d) { return bf16_geometry(d); }

static bool direct_geometry(const ch_conv_desc *d)
{
    return ch_conv_groups(d) == 1 && ch_conv_dilation(d) == 1 && d->kh == 3 && d->kw == 3 &&
           d->stride == 2 && d->c >= 16 && d->oc >= 16 && !bf16_geometry(d) && ch_cpu_avx512();
}

static bool direct_weights_win(const ch_conv_desc *d)
{
    return (long)d->oh * d->ow >= 49;
}

static size_t align_up(size_t v) { return (v + WINO_ALIGN - 1) / WINO_ALIGN * WINO_ALIGN; }
static size_t md_bytes(const dnnl_memory_desc_t *md) { return dnnl_memory_desc_get_size(md); }

static void prim_free(wino_prim *p)
{
    if (p->scratch_mem) dnnl_memory_destroy(p->scratch_mem);
    if (p->p) dnnl_primitive_destroy(p->p);
    *p = (wino_prim){ 0 };
}

static void entry_free(wino_entry *e)
{
    wino_prim *all[] = { &e->fwd, &e->bwd_data, &e->bwd_weights, &e->f_x_in, &e->f_w_in,
                         &e->f_y_out, &e->d_dy_in, &e->d_w_in, &e->d_dx_out, &e->w_x_in,
                         &e->w_dy_in, &e->w_dw_out };
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) prim_free(all[i]);
    for (int m = 0; m < S_SLOTS; m++)
        if (e->mem[m]) dnnl_memory_destroy(e->mem[m]);
    free(e);
}

struct ch_kcache *ch_cpu_kcache_create(void)
{
    struct ch_kcache *c = calloc(1, sizeof *c);
    if (!c) return NULL;
    atomic_init(&c->entries, NULL);
    if (pthread_mutex_init(&c->add, NULL) != 0) {
        free(c);
        return NULL;
    }
    if (dnnl_engine_create(&c->engine, dnnl_cpu, 0) != dnnl_success) c->engine = NULL;
    if (!c->engine || dnnl_stream_create(&c->stream, c->engine, dnnl_stream_default_flags) !=
                          dnnl_success) {
        c->stream = NULL;
        ch_cpu_kcache_free(c);
        return NULL;
    }
    if (!(c->gemms = ch_cpu_gb_cache_create(c->engine))) {
        ch_cpu_kcache_free(c);
        return NULL;
    }
    return c;
}

struct ch_gb_cache *ch_cpu_kcache_gemms(const struct ch_kcache *c) { return c ? c->gemms : NULL; }

void ch_cpu_kcache_free(struct ch_kcache *c)
{
    if (!c) return;
    wino_entry *e = atomic_load(&c->entries);
    while (e) {
        wino_entry *next = e->next;
        entry_free(e);
        e = next;
    }
    ch_cpu_gb_cache_free(c->gemms);
    if (c->stream) dnnl_stream_destroy(c->stream);
    if (c->engine) dnnl_engine_destroy(c->engine);
    pthread_mutex_destroy(&c->add);
    free(c);
}

size_t ch_cpu_kcache_entries(const struct ch_kcache *c)
{
    size_t count = 0;
    for (const wino_entry *e = atomic_load(&c->entries); e; e = e->next) count++;
    return count;
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

/* The primitive of pd (which it then owns), its scratchpad size and the scratchpad's handle. */
static bool prim_from_pd(dnnl_engine_t eng, dnnl_primitive_desc_t pd, wino_prim *out)
{
    const dnnl_memory_desc_t *sp = dnnl_primitive_desc_query_md(pd, dnnl_query_scratchpad_md, 0);
    out->scratch = sp ? md_bytes(sp) : 0;
    bool ok = dnnl_primitive_create(&out->p, pd) == dnnl_success;
    if (ok && out->scratch)
        ok = dnnl_memory_create(&out->scratch_mem, sp, eng, DNNL_MEMORY_NONE) == dnnl_success;
    dnnl_primitive_desc_destroy(pd);
    return ok;
}

static bool make_reorder(dnnl_engine_t eng, const dnnl_memory_desc_t *from,
                         const dnnl_memory_desc_t *to, wino_prim *out)
{
    dnnl_primitive_attr_t attr = user_scratchpad_attr(false);
    dnnl_primitive_desc_t pd = NULL;
    const bool ok = attr && dnnl_reorder_primitive_desc_create(&pd, from, eng, to, eng, attr) ==
                                dnnl_success;
    if (attr) dnnl_primitive_attr_destroy(attr);
    return ok && prim_from_pd(eng, pd, out);
}

static void copy_md(dnnl_primitive_desc_t pd, dnnl_query_t what, dnnl_memory_desc_t *out)
{
    *out = *dnnl_primitive_desc_query_md(pd, what, 0);
}

/* The three convolution primitives, with the layouts they chose; pds are destroyed here. In bf16
 * the products' operands (x, w, dy) are bf16 and what the passes write (y, dx, dw) fp32. A
 * direct convolution's backward passes choose their own layouts; Winograd's take the forward's. */
static bool make_convolutions(dnnl_engine_t eng, wino_entry *e)
{
    const wino_key *k = &e->key;
    dnnl_memory_desc_t *md = e->md;
    const bool direct = k->use != DC_WINOGRAD;
    const dnnl_data_type_t in = k->use == DC_BF16 ? dnnl_bf16 : dnnl_f32;
    const dnnl_alg_kind_t alg = direct ? dnnl_convolution_direct : dnnl_convolution_winograd;
    dnnl_memory_desc_t any_x, any_y, any_w, out_x, out_y, out_w;
    const dnnl_dims_t xd = { k->n, k->c, k->h, k->w }, yd = { k->n, k->oc, k->oh, k->ow };
    const dnnl_dims_t wd = { k->oc, k->c, k->kh, k->kw }, bd = { k->oc };
    /* PyTorch's output size rounds down: the right and bottom padding is what the last window
     * reaches, which may be less than pad. */
    const dnnl_dims_t st = { k->stride, k->stride }, pl = { k->pad, k->pad },
                      pr = { (k->oh - 1) * k->stride + k->kh - k->h - k->pad,
                             (k->ow - 1) * k->stride + k->kw - k->w - k->pad };
    if (pr[0] < 0 || pr[1] < 0) return false;
    if (dnnl_memory_desc_init_by_tag(&md[S_PLAIN_X], 4, xd, dnnl_f32, dnnl_nchw) ||
        dnnl_memory_desc_init_by_tag(&md[S_PLAIN_Y], 4, yd, dnnl_f32, dnnl_nchw) ||
        dnnl_memory_desc_init_by_tag(&md[S_PLAIN_W], 4, wd, dnnl_f32, dnnl_oihw) ||
        dnnl_memory_desc_init_by_tag(&md[S_BIAS], 1, bd, dnnl_f32, dnnl_x) ||
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
                                                 &md[S_BIAS], &out_y, st, pl, pr) == dnnl_success &&
              dnnl_primitive_desc_create(&fpd, &cd, fattr, eng, NULL) == dnnl_success;
    if (ok) {
        copy_md(fpd, dnnl_query_src_md, &md[S_F_SRC]);
        copy_md(fpd, dnnl_query_weights_md, &md[S_F_WEI]);
        copy_md(fpd, dnnl_query_dst_md, &md[S_F_DST]);
        ok = dnnl_convolution_backward_data_desc_init(&cd, alg, direct ? &out_x : &md[S_F_SRC],
                                                      &any_w, direct ? &any_y : &md[S_F_DST], st,
                                                      pl, pr) == dnnl_success &&
             dnnl_primitive_desc_create(&pd, &cd, attr, eng, fpd) == dnnl_success;
    }
    if (ok) {
        copy_md(pd, dnnl_query_diff_dst_md, &md[S_D_DST]);
        copy_md(pd, dnnl_query_weights_md, &md[S_D_WEI]);
        copy_md(pd, dnnl_query_diff_src_md, &md[S_D_SRC]);
        ok = prim_from_pd(eng, pd, &e->bwd_data);
        pd = NULL;
    }
    if (ok)
        ok = dnnl_convolution_backward_weights_desc_init(&cd, alg, direct ? &any_x : &md[S_F_SRC],
                                                         &out_w, &md[S_BIAS],
                                                         direct ? &any_y : &md[S_F_DST], st, pl,
                                                         pr) == dnnl_success &&
             dnnl_primitive_desc_create(&pd, &cd, attr, eng, fpd) == dnnl_success;
    if (ok) {
        copy_md(pd, dnnl_query_src_md, &md[S_W_SRC]);
        copy_md(pd, dnnl_query_diff_dst_md, &md[S_W_DST]);
        copy_md(pd, dnnl_query_diff_weights_md, &md[S_W_DWEI]);
        ok = prim_from_pd(eng, pd, &e->bwd_weights);
        pd = NULL;
    }
    if (ok) {
        ok = prim_from_pd(eng, fpd, &e->fwd);
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
static size_t pass_need(const wino_entry *e, wino_slot a, wino_slot b, wino_slot c, size_t scratch)
{
    return WINO_ALIGN + align_up(md_bytes(&e->md[a])) + align_up(md_bytes(&e->md[b])) +
           align_up(md_bytes(&e->md[c])) + align_up(sizeof(float) * (size_t)e->key.oc) +
           align_up(scratch);
}

static bool make_reorders(dnnl_engine_t eng, wino_entry *e)
{
    const dnnl_memory_desc_t *md = e->md;
    return make_reorder(eng, &md[S_PLAIN_X], &md[S_F_SRC], &e->f_x_in) &&
           make_reorder(eng, &md[S_PLAIN_W], &md[S_F_WEI], &e->f_w_in) &&
           make_reorder(eng, &md[S_F_DST], &md[S_PLAIN_Y], &e->f_y_out) &&
           make_reorder(eng, &md[S_PLAIN_Y], &md[S_D_DST], &e->d_dy_in) &&
           make_reorder(eng, &md[S_PLAIN_W], &md[S_D_WEI], &e->d_w_in) &&
           make_reorder(eng, &md[S_D_SRC], &md[S_PLAIN_X], &e->d_dx_out) &&
           make_reorder(eng, &md[S_PLAIN_X], &md[S_W_SRC], &e->w_x_in) &&
           make_reorder(eng, &md[S_PLAIN_Y], &md[S_W_DST], &e->w_dy_in) &&
           make_reorder(eng, &md[S_W_DWEI], &md[S_PLAIN_W], &e->w_dw_out);
}

static void entry_build(dnnl_engine_t eng, wino_entry *e)
{
    e->ok = make_convolutions(eng, e) && make_reorders(eng, e);
    for (int m = 0; e->ok && m < S_SLOTS; m++)
        e->ok = dnnl_memory_create(&e->mem[m], &e->md[m], eng, DNNL_MEMORY_NONE) == dnnl_success;
    if (!e->ok) return;
    const size_t fs = pass_scratch(&e->fwd, &e->f_x_in, &e->f_w_in, &e->f_y_out);
    const size_t ds = pass_scratch(&e->bwd_data, &e->d_dy_in, &e->d_w_in, &e->d_dx_out);
    const size_t ws = pass_scratch(&e->bwd_weights, &e->w_x_in, &e->w_dy_in, &e->w_dw_out);
    e->need = max_of(pass_need(e, S_F_SRC, S_F_WEI, S_F_DST, fs),
                     max_of(pass_need(e, S_D_DST, S_D_WEI, S_D_SRC, ds),
                            pass_need(e, S_W_SRC, S_W_DST, S_W_DWEI, ws)));
}

static bool key_eq(const wino_key *a, const wino_key *b)
{
    return a->c == b->c && a->oc == b->oc && a->h == b->h && a->w == b->w && a->kh == b->kh &&
           a->kw == b->kw && a->stride == b->stride && a->pad == b->pad && a->oh == b->oh &&
           a->ow == b->ow && a->n == b->n && a->nthreads == b->nthreads && a->relu == b->relu &&
           a->use == b->use;
}

static wino_entry *find(wino_entry *e, const wino_key *key)
{
    while (e && !key_eq(&e->key, key)) e = e->next;
    return e;
}

/* c's entry of key, made and published when there is none (NULL only where memory ran out).
 * oneDNN sizes its work for omp_get_max_threads() of the calling thread, so that is set to the
 * entry's thread count while the primitives are made and while they run. */
static const wino_entry *entry_of(struct ch_kcache *c, const wino_key *key)
{
    wino_entry *e = find(atomic_load_explicit(&c->entries, memory_order_acquire), key);
    if (e) return e;
    pthread_mutex_lock(&c->add);
    wino_entry *head = atomic_load_explicit(&c->entries, memory_order_acquire);
    if (!(e = find(head, key)) && (e = calloc(1, sizeof *e)) != NULL) {
        e->key = *key;
        const int prev = omp_get_max_threads();
        omp_set_num_threads(key->nthreads);
        entry_build(c->engine, e);
        omp_set_num_threads(prev);
        e->next = head;
        atomic_store_explicit(&c->entries, e, memory_order_release);
    }
    pthread_mutex_unlock(&c->add);
    return e;
}

static bool applies(dc_use use, const ch_conv_desc *d, int n)
{
    if (n <= 0) return false;
    switch (use) {
    case DC_WINOGRAD: return wino_geometry(d);
    case DC_BF16: return bf16_geometry(d);
    case DC_DIRECT: return direct_geometry(d);
    }
    return false;
}

bool ch_cpu_dnnl_conv_takes(const ch_conv_desc *d, int n)
{
    return applies(DC_WINOGRAD, d, n) || applies(DC_BF16, d, n) || applies(DC_DIRECT, d, n);
}

static wino_key key_of(dc_use use, const ch_conv_desc *d, int n, int nthreads)
{
    return (wino_key){ .c = d->c, .oc = d->oc, .h = d->h, .w = d->w, .kh = d->kh, .kw = d->kw,
                       .stride = d->stride, .pad = d->pad, .oh = d->oh, .ow = d->ow, .n = n,
                       .nthreads = nthreads, .relu = d->relu, .use = use };
}

/* kc's cache; without one (a ch_kctx made by hand), one for the caller to free with done_with. */
static struct ch_kcache *cache_of(const ch_kctx *kc)
{
    return kc->cache ? kc->cache : ch_cpu_kcache_create();
}

static void done_with(const ch_kctx *kc, struct ch_kcache *c)
{
    if (c != kc->cache) ch_cpu_kcache_free(c);
}

static size_t workspace_of(dc_use use, const ch_kctx *kc, const ch_conv_desc *d, int n)
{
    if (!applies(use, d, n)) return 0;
    struct ch_kcache *c = cache_of(kc);
    const wino_key key = key_of(use, d, n, kc->nthreads);
    const wino_entry *e = c ? entry_of(c, &key) : NULL;
    const size_t need = e && e->ok ? (e->need + sizeof(ch_real) - 1) / sizeof(ch_real) : 0;
    done_with(kc, c);
    return need;
}

size_t ch_cpu_wino_workspace(const ch_kctx *kc, const ch_conv_desc *d, int n)
{
    return workspace_of(DC_WINOGRAD, kc, d, n);
}

size_t ch_cpu_conv_bf16_workspace(const ch_kctx *kc, const ch_conv_desc *d, int n)
{
    return workspace_of(DC_BF16, kc, d, n);
}

size_t ch_cpu_conv_direct_workspace(const ch_kctx *kc, const ch_conv_desc *d, int n)
{
    return max_of(workspace_of(DC_BF16, kc, d, n), workspace_of(DC_DIRECT, kc, d, n));
}

/* The next buffer of a pass in the kernel workspace, 64-byte aligned. */
static void *carve(char **at, size_t bytes)
{
    void *p = *at;
    *at += align_up(bytes);
    return p;
}

/* Runs p on (arg, operand slot, pointer) triples; the scratchpad, if any, at scratch. */
enum { WINO_MAX_ARGS = 6 };
typedef struct wino_arg {
    int arg;
    wino_slot slot;
    const void *ptr;
} wino_arg;

/* A running pass: its context, cache (kc's, or one of its own), entry, the calling thread's
 * OpenMP thread count before the pass set it to the entry's, and the workspace. */
typedef struct wino_pass {
    const ch_kctx *kc;
    struct ch_kcache *c;
    const wino_entry *e;
    int prev_threads;
    char *ws;   /* the next free byte of the workspace */
} wino_pass;

static void run(const wino_pass *ps, const wino_prim *p, const wino_arg *a, int na, void *scratch)
{
    dnnl_exec_arg_t args[WINO_MAX_ARGS + 1];
    int m = 0;
    for (; m < na; m++) {
        dnnl_memory_t mem = ps->e->mem[a[m].slot];
        CH_ASSERT(dnnl_memory_set_data_handle(mem, (void *)a[m].ptr) == dnnl_success);
        args[m] = (dnnl_exec_arg_t){ a[m].arg, mem };
    }
    if (p->scratch) {
        CH_ASSERT(dnnl_memory_set_data_handle(p->scratch_mem, scratch) == dnnl_success);
        args[m++] = (dnnl_exec_arg_t){ DNNL_ARG_SCRATCHPAD, p->scratch_mem };
    }
    CH_ASSERT(dnnl_primitive_execute(p->p, ps->c->stream, m, args) == dnnl_success);
    CH_ASSERT(dnnl_stream_wait(ps->c->stream) == dnnl_success);
}

static void reorder(const wino_pass *ps, const wino_prim *p, wino_slot from_slot,
                    const void *from, wino_slot to_slot, void *to, void *scratch)
{
    const wino_arg a[] = { { DNNL_ARG_FROM, from_slot, from }, { DNNL_ARG_TO, to_slot, to } };
    run(ps, p, a, 2, scratch);
}

static bool pass_begin(dc_use use, const ch_kctx *kc, const ch_conv_desc *d, int n, wino_pass *p)
{
    if (!applies(use, d, n)) return false;
    p->kc = kc;
    p->c = cache_of(kc);
    const wino_key key = key_of(use, d, n, kc->nthreads);
    p->e = p->c ? entry_of(p->c, &key) : NULL;
    if (!p->e || !p->e->ok || p->e->need > kc->ws_len * sizeof(ch_real)) {
        done_with(kc, p->c);
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
    done_with(p->kc, p->c);
}

static bool forward(dc_use use, const ch_kctx *kc, const ch_conv_desc *d, int n, const ch_real *x,
                    const ch_real *w, const ch_real *b, ch_real *y)
{
    wino_pass p;
    if (!pass_begin(use, kc, d, n, &p)) return false;
    const wino_entry *e = p.e;
    void *xb = carve(&p.ws, md_bytes(&e->md[S_F_SRC])), *wb = carve(&p.ws, md_bytes(&e->md[S_F_WEI]));
    void *yb = carve(&p.ws, md_bytes(&e->md[S_F_DST]));
    float *bias = carve(&p.ws, sizeof(float) * (size_t)d->oc);
    void *scratch = p.ws;
    if (!b) memset(bias, 0, sizeof(float) * (size_t)d->oc);
    reorder(&p, &e->f_x_in, S_PLAIN_X, x, S_F_SRC, xb, scratch);
    reorder(&p, &e->f_w_in, S_PLAIN_W, w, S_F_WEI, wb, scratch);
    const wino_arg a[] = { { DNNL_ARG_SRC, S_F_SRC, xb }, { DNNL_ARG_WEIGHTS, S_F_WEI, wb },
                           { DNNL_ARG_BIAS, S_BIAS, b ? b : bias }, { DNNL_ARG_DST, S_F_DST, yb } };
    run(&p, &e->fwd, a, 4, scratch);
    reorder(&p, &e->f_y_out, S_F_DST, yb, S_PLAIN_Y, y, scratch);
    pass_end(&p);
    return true;
}

static bool backward_data(dc_use use, const ch_kctx *kc, const ch_conv_desc *d, int n,
                          const ch_real *dy, const ch_real *w, ch_real *dx)
{
    wino_pass p;
    if (!pass_begin(use, kc, d, n, &p)) return false;
    const wino_entry *e = p.e;
    void *dyb = carve(&p.ws, md_bytes(&e->md[S_D_DST])), *wb = carve(&p.ws, md_bytes(&e->md[S_D_WEI]));
    void *dxb = carve(&p.ws, md_bytes(&e->md[S_D_SRC]));
    carve(&p.ws, sizeof(float) * (size_t)d->oc);
    void *scratch = p.ws;
    reorder(&p, &e->d_dy_in, S_PLAIN_Y, dy, S_D_DST, dyb, scratch);
    reorder(&p, &e->d_w_in, S_PLAIN_W, w, S_D_WEI, wb, scratch);
    const wino_arg a[] = { { DNNL_ARG_DIFF_DST, S_D_DST, dyb }, { DNNL_ARG_WEIGHTS, S_D_WEI, wb },
                           { DNNL_ARG_DIFF_SRC, S_D_SRC, dxb } };
    run(&p, &e->bwd_data, a, 3, scratch);
    reorder(&p, &e->d_dx_out, S_D_SRC, dxb, S_PLAIN_X, dx, scratch);
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
    void *xb = carve(&p.ws, md_bytes(&e->md[S_W_SRC])), *dyb = carve(&p.ws, md_bytes(&e->md[S_W_DST]));
    void *dwb = carve(&p.ws, md_bytes(&e->md[S_W_DWEI]));
    float *spare_db = carve(&p.ws, sizeof(float) * (size_t)d->oc);
    void *scratch = p.ws;
    /* The fused ReLU's backward, in place, before anything reads dy (backward data does next). */
    if (d->relu) ch_cpu_relu_backward(kc, (size_t)n * d->oc * d->oh * d->ow, y, dy, dy);
    reorder(&p, &e->w_x_in, S_PLAIN_X, x, S_W_SRC, xb, scratch);
    reorder(&p, &e->w_dy_in, S_PLAIN_Y, dy, S_W_DST, dyb, scratch);
    const wino_arg a[] = { { DNNL_ARG_SRC, S_W_SRC, xb }, { DNNL_ARG_DIFF_DST, S_W_DST, dyb },
                           { DNNL_ARG_DIFF_WEIGHTS, S_W_DWEI, dwb },
                           { DNNL_ARG_DIFF_BIAS, S_BIAS, db ? db : spare_db } };
    run(&p, &e->bwd_weights, a, 4, scratch);
    reorder(&p, &e->w_dw_out, S_W_DWEI, dwb, S_PLAIN_W, dw, scratch);
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

bool ch_cpu_conv_direct_forward(const ch_kctx *kc, const ch_conv_desc *d, int n, const ch_real *x,
                                const ch_real *w, const ch_real *b, ch_real *y)
{
    return forward(DC_BF16, kc, d, n, x, w, b, y) || forward(DC_DIRECT, kc, d, n, x, w, b, y);
}

bool ch_cpu_conv_direct_backward_data(const ch_kctx *kc, const ch_conv_desc *d, int n,
                                      const ch_real *dy, const ch_real *w, ch_real *dx)
{
    return backward_data(DC_BF16, kc, d, n, dy, w, dx) || backward_data(DC_DIRECT, kc, d, n, dy, w, dx);
}

bool ch_cpu_conv_direct_backward_weights(const ch_kctx *kc, const ch_conv_desc *d, int n,
                                         const ch_real *x, const ch_real *y, ch_real *dy,
                                         ch_real *dw, ch_real *db)
{
    return backward_weights(DC_BF16, kc, d, n, x, y, dy, dw, db) ||
           (direct_weights_win(d) && backward_weights(DC_DIRECT, kc, d, n, x, y, dy, dw, db));
}

#endif
