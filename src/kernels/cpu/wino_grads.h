/* The hand-written Winograds' backward passes that make the weights' gradient (wino_body.h): dU
 * per point over each thread's groups, G^T dU G into dw, and both backward passes at once (x and dy
 * packed and transformed once per chunk for both GEMMs), from x in fp32 or in bf16. Included at the
 * end of wino_body.h, whose chunks, scratch, passes and team members it uses. */
#ifndef WINO_FN
#error "wino_grads.h is part of wino_body.h"
#endif

/* Per point dU[p] (oc x c) += E[p] (oc x cols) V[p]^T for the chunk's V and E, or = where `first`
 * (the thread's dU is not cleared beforehand: a memset and a read of it were a fifth of the pass
 * on the 512-channel layers; team_size gives every thread a group, so every thread's dU is set). */
static void weights_products(const ch_kctx *kc, const wgeo *g, const wscratch *s, wspan k,
                             bool first)
{
    ch_gemm_batch gb = point_gemms(g->d, PASS_WEIGHTS, k);
    gb.bf16 = g->bf16, gb.accumulate = !first;
    if (g->bf16)
        ch_cpu_gemm_batch_bf16(kc, &gb, (const uint16_t *)s->e, (const uint16_t *)s->v, s->du, s->gemm);
    else
        ch_cpu_gemm_batch(kc, &gb, s->e, s->v, s->du, s->gemm);
}

/* dg = G^T dU G for TB pairs from their points dl[p][lane] (nl of them live), into dw. */
static void untransform_lanes(const ch_real dl[NP][TB], int nl, ch_real *restrict dw)
{
    ch_real t[WR][WA][TB], raw[TB * WR * WR];
    for (int a = 0; a < WR; a++)
        for (int jj = 0; jj < WA; jj++) {
            ch_real acc[TB] = { 0 };
            for (int i = 0; i < WA; i++)
#pragma omp simd
                for (int j = 0; j < TB; j++) acc[j] += G[i][a] * dl[i * WA + jj][j];
            memcpy(t[a][jj], acc, sizeof acc);
        }
    for (int a = 0; a < WR; a++)
        for (int b = 0; b < WR; b++) {
            ch_real acc[TB] = { 0 };
            for (int jj = 0; jj < WA; jj++)
#pragma omp simd
                for (int j = 0; j < TB; j++) acc[j] += t[a][jj][j] * G[jj][b];
#pragma omp simd
            for (int j = 0; j < TB; j++) raw[j * WR * WR + a * WR + b] = acc[j];
        }
    if (nl == TB) memcpy(dw, raw, sizeof raw);   /* a size the compiler knows: moves, no call */
    else memcpy(dw, raw, sizeof(ch_real) * WR * WR * (size_t)nl);
}

enum { UNT_BLOCK = 32 * TB };   /* pairs summed at a time: NP x 512 floats, 72 KiB (L2) at NP 36 */

/* dg = G^T dU G for the pairs [lo, hi): the adjoint of transform_weights, dU being the sum of the
 * T threads' partials (thread u's at du0 + u * step), added here in thread order as a block of
 * pairs is read: 2 KiB runs of each point and partial, which the prefetchers follow (a run of TB
 * pairs from each of the 2 x 36 was slower than the separate pass of adding them it replaced). */
static void untransform_weights(const ch_conv_desc *d, const ch_real *du0, size_t step, int T,
                                int lo, int hi, ch_real *dw)
{
    const size_t plane = (size_t)d->oc * d->c;
    for (int b0 = lo; b0 < hi; b0 += UNT_BLOCK) {
        const int nb = hi - b0 < UNT_BLOCK ? hi - b0 : UNT_BLOCK;
        ch_real blk[NP][UNT_BLOCK];
        for (int p = 0; p < NP; p++)
            for (int u = 0; u < T; u++) {
                const ch_real *part = du0 + step * (size_t)u + (size_t)p * plane + b0;
                if (u == 0) {
                    memcpy(blk[p], part, sizeof(ch_real) * (size_t)nb);
                } else {
#pragma omp simd
                    for (int j = 0; j < nb; j++) blk[p][j] += part[j];
                }
            }
        for (int k0 = 0; k0 < nb; k0 += TB) {
            const int nl = nb - k0 < TB ? nb - k0 : TB;
            ch_real dl[NP][TB];
            if (nl < TB) memset(dl, 0, sizeof dl);
            for (int p = 0; p < NP; p++) {
                if (nl == TB) memcpy(dl[p], blk[p] + k0, sizeof dl[p]);   /* moves, no call */
                else memcpy(dl[p], blk[p] + k0, sizeof(ch_real) * (size_t)nl);
            }
            untransform_lanes((const ch_real(*)[TB])dl, nl, dw + (size_t)(b0 + k0) * WR * WR);
        }
    }
}

enum { DB_BLOCK = 64 };   /* channels a sweep over the samples sums */

/* db[o] = the sum of channel o's planes of dy (fp32, or bf16 from dyh where dy is NULL) over the
 * samples [s0, s1): per channel in sample order, in double, as one plane at a time per channel
 * summed them (the same bits), but read in memory order, a sample's planes of a block of channels
 * one after another. Channel by channel it read a short plane (1.5 KB at 28x28 in bf16, 32 bytes
 * at 4x4) every sample's length apart, which the prefetchers did not follow: resnet18 at batch 256
 * in bf16 trains 1.017x faster this way (bench/compare_builds, Zen 5, 2 threads). */
static void bias_sums(const ch_conv_desc *d, const ch_real *dy, const uint16_t *dyh, int s0, int s1, ch_real *db)
{
    const size_t hw = (size_t)d->oh * d->ow, ys = (size_t)d->oc * hw;
    for (int o0 = 0; o0 < d->oc; o0 += DB_BLOCK) {
        const int no = d->oc - o0 < DB_BLOCK ? d->oc - o0 : DB_BLOCK;
        double acc[DB_BLOCK] = { 0 };
        for (int i = s0; i < s1; i++)
            for (int o = 0; o < no; o++) {
                const size_t at = i * ys + (size_t)(o0 + o) * hw;
                acc[o] += dy ? ch_cpu_sum(dy + at, hw) : ch_cpu_sum_bf16(dyh + at, hw);
            }
        for (int o = 0; o < no; o++) db[o0 + o] = (ch_real)acc[o];
    }
}

/* The thread's groups [lo, hi): dy masked by the fused ReLU in place (backward data reads it
 * next), and its db where the layer has a bias; dy in fp32, or where dy is NULL in bf16 from dyh
 * (no fused ReLU then). */
static void prepare_dy(const wgeo *g, const wscratch *s, int n, int lo, int hi, const ch_real *y,
                       ch_real *dy, const uint16_t *dyh, bool bias)
{
    const ch_conv_desc *d = g->d;
    const size_t ys = (size_t)d->oc * d->oh * d->ow;
    const int s0 = lo * TB, s1 = hi * TB < n ? hi * TB : n;
    if (d->relu) ch_cpu_relu_backward_span((size_t)(s1 - s0) * ys, y + s0 * ys, dy + s0 * ys, dy + s0 * ys);
    if (bias) bias_sums(d, dy, dyh, s0, s1, s->db);
}

/* What a backward pass writes: dU (and db) always; dx too where dx is not NULL, the two passes at
 * once (WINO_FN(backward)). Apart, backward weights and backward data each packed dy and
 * transformed E; together the second packing, transform and read of dy are gone. The same sums in
 * the same order as the two passes apart: the same bits. */
typedef struct wgrads {
    wsrc x;
    const ch_real *y;
    ch_real *dy;          /* the layer's own (masked in place for a fused ReLU), or NULL: */
    const uint16_t *dyh;  /* ... dy in bf16 */
    ch_real *dx;
    bool bias;
} wgrads;

/* The run of `live` samples from s0: x and dy packed into the thread's planes, and its dx planes
 * cleared where dx is made. */
static void pack_grads_run(const wgeo *g, const wscratch *s, const wgrads *a, int s0, int live)
{
    const ch_conv_desc *d = g->d;
    const size_t xs = (size_t)d->c * d->h * d->w, ys = (size_t)d->oc * d->oh * d->ow;
    pack_run(x_layout(g), src_at(a->x, (size_t)s0 * xs), xs, live, s->xg);
    pack_run(y_layout(g), src_at((wsrc){ a->dy, a->dyh }, (size_t)s0 * ys), ys, live, s->yg);
    if (a->dx) memset(s->dxg, 0, sizeof(ch_real) * group_len(x_layout(g)) * (size_t)groups_of(live));
}

/* The run's dx planes into dx, where it is made. */
static void unpack_dx_run(const wgeo *g, const wscratch *s, const wgrads *a, int s0, int live)
{
    const size_t xs = (size_t)g->d->c * g->d->h * g->d->w;
    if (a->dx) unpack_run(x_layout(g), s->dxg, live, xs, (wdest){ a->dx + (size_t)s0 * xs, NULL });
}

/* Chunk k's V and E, from the run's x and dY planes. */
static void grads_points(const wgeo *g, wspan k, const wscratch *s)
{
    transform_chunk(g, k, s, false);
    transform_chunk(g, k, s, true);
}

/* Chunk i of the run (x in s->xg, dY in s->yg): V and E, the weights' products, then where dx is
 * made the data's, into s->dxg (V's buffer takes dV: V is used by then). */
static void grads_chunk(const ch_kctx *kc, const wgeo *g, const ch_real *u, const wscratch *s,
                        int ng, int i, bool first, bool data)
{
    const wspan k = chunk_span(g, ng, i);
    grads_points(g, k, s);
    weights_products(kc, g, s, k, first);
    if (data) data_products_add(kc, g, u, s, k, s->dxg);
}

/* The thread's groups [lo, hi): dy prepared, then its dU (and db), and its samples' dx. */
static void grads_groups(const ch_kctx *kc, const wgeo *g, const ch_real *u, const wscratch *s,
                         int n, int lo, int hi, const wgrads *a)
{
    prepare_dy(g, s, n, lo, hi, a->y, a->dy, a->dyh, a->bias);
    for (int q = lo; q < hi; q += g->G) {
        const int live = run_live(g, n, q, hi), ng = groups_of(live);
        pack_grads_run(g, s, a, q * TB, live);
        for (int i = 0; i < run_chunks(g, ng); i++)
            grads_chunk(kc, g, u, s, ng, i, q == lo && i == 0, a->dx != NULL);
        unpack_dx_run(g, s, a, q * TB, live);
    }
}

/* Thread t of T: with dx, its share of the weights' transform; its groups; its share of dU's
 * untransform into dw. */
static void grads_member(void *arg, int t, int T)
{
    const wteam *m = arg;
    const wgeo *g = m->g;
    const int pairs = g->d->oc * g->d->c, groups = groups_of(m->n);
    if (m->a->dx && m->make_u) {   /* the same branch in every thread */
        transform_share(m, t, T);
#pragma omp barrier
    }
    const wscratch s = pass_scratch(m->kc, g, t, m->a->x.h != NULL, m->a->dyh != NULL);
    grads_groups(m->kc, g, m->u, &s, m->n, groups * t / T, groups * (t + 1) / T, m->a);
#pragma omp barrier
    untransform_weights(g->d, scratch_of(m->kc, g, 0).du, thread_len(g), T, pairs * t / T, pairs * (t + 1) / T,
                        m->dw);
}

/* How many of the batch's groups thread t of T takes: [groups * t / T, groups * (t + 1) / T). */
static int member_groups(int n, int t, int T)
{
    const int groups = groups_of(n);
    return groups * (t + 1) / T - groups * t / T;
}

/* Whether the pass splits the weights' products by rows of dU (split_layer): a team of every
 * thread, each with one run of one chunk. */
static bool split_rows(const ch_kctx *kc, const wgeo *g, int n, int T)
{
    if (!split_layer(kc, g) || T != kc->nthreads) return false;
    for (int t = 0; t < T; t++) {
        const int ng = member_groups(n, t, T);
        if (ng < 1 || ng > g->G || run_chunks(g, ng) != 1) return false;
    }
    return true;
}

/* dU[p]'s rows [o0, o1) += thread u's chunk's products (set where u is 0). */
static void split_products(const wteam *m, int u, int T, int p, int o0, int o1, ch_real *du,
                           const wscratch *s)
{
    const wgeo *g = m->g;
    const ch_conv_desc *d = g->d;
    const wspan k = chunk_span(g, member_groups(m->n, u, T), 0);
    const wscratch su = scratch_of(m->kc, g, u);
    const ch_gemm_batch gb = split_gemm(d, k, o1 - o0, u == 0);
    const size_t es = point_stride(d->oc, k) * (size_t)p, vs = point_stride(d->c, k) * (size_t)p;
    ch_cpu_gemm_batch_bf16(m->kc, &gb, (const uint16_t *)su.e + es + (size_t)o0 * k.cols,
                           (const uint16_t *)su.v + vs, du + shared_len(d) / NP * (size_t)p + (size_t)o0 * d->c,
                           s->gemm);
}

/* Thread t of T where the pass splits (split_rows): its chunk's V and E; once every thread's are
 * made, its rows of dU from all of them; once every thread has read them (the data's products
 * write dV over V), its samples' dx, and its rows' untransform into dw. dU's rows are the sums of
 * the same partial products in the same order as the partials added in thread order (the GEMM
 * adds its products to what is there, as the untransform added a partial): the same bits. */
static void split_member(void *arg, int t, int T)
{
    const wteam *m = arg;
    const wgeo *g = m->g;
    const ch_conv_desc *d = g->d;
    if (m->a->dx && m->make_u) {   /* the same branch in every thread */
        transform_share(m, t, T);
#pragma omp barrier
    }
    const wscratch s = pass_scratch(m->kc, g, t, m->a->x.h != NULL, m->a->dyh != NULL);
    const int groups = groups_of(m->n), lo = groups * t / T, hi = groups * (t + 1) / T;
    const int live = run_live(g, m->n, lo, hi);
    const wspan k = chunk_span(g, hi - lo, 0);
    prepare_dy(g, &s, m->n, lo, hi, m->a->y, m->a->dy, m->a->dyh, m->a->bias);
    pack_grads_run(g, &s, m->a, lo * TB, live);
    grads_points(g, k, &s);
#pragma omp barrier
    const int o0 = split_row(d, t, T), o1 = split_row(d, t + 1, T);
    ch_real *du = scratch_of(m->kc, g, 0).du;
    for (int p = 0; p < NP; p++)
        for (int u = 0; u < T; u++) split_products(m, u, T, p, o0, o1, du, &s);
#pragma omp barrier
    if (m->a->dx) data_products_add(m->kc, g, m->u, &s, k, s.dxg);
    unpack_dx_run(g, &s, m->a, lo * TB, live);
    untransform_weights(d, du, 0, 1, o0 * d->c, o1 * d->c, m->dw);
}

/* The pass over the batch: U from w where dx is made, each thread's groups, then dw from the
 * threads' partial dU (or, split, from the one dU) and db from theirs, added in thread order. */
static void grads_pass(const ch_kctx *kc, const wgeo *gp, int n, const ch_real *w, const wgrads *a,
                       ch_real *dw, ch_real *db)
{
    const wgeo g = *gp;
    const ch_conv_desc *d = g.d;
    const int T = team_size(n, kc->nthreads);
    wteam m = { .kc = kc, .g = &g, .n = n, .w = w, .a = a, .dw = dw };
    if (a->dx) m.u = u_for(kc, &g, w, false, &m.make_u);
    ch_cpu_team(T, split_rows(kc, &g, n, T) ? split_member : grads_member, &m);
    for (int o = 0; db && o < d->oc; o++) {
        ch_real acc = 0;
        for (int t = 0; t < T; t++) acc += scratch_of(kc, &g, t).db[o];
        db[o] = acc;
    }
}

bool WINO_FN(backward_weights)(const ch_kctx *kc, const ch_conv_desc *d, int n,
                                   const ch_real *x, const ch_real *y, ch_real *dy, ch_real *dw,
                                   ch_real *db)
{
    wgeo g;
    if (!wino_usable(kc, d, n, &g)) return false;
    grads_pass(kc, &g, n, NULL, &(wgrads){ { x, NULL }, y, dy, NULL, NULL, db != NULL }, dw, db);
    return true;
}

/* Whether na bytes at a and nb at b share any. */
static bool overlaps(const void *a, size_t na, const void *b, size_t nb)
{
    return (uintptr_t)a < (uintptr_t)b + nb && (uintptr_t)b < (uintptr_t)a + na;
}

/* Whether n samples of dx share bytes with x (xsize bytes a value: fp32 or bf16), and with dy
 * (likewise dysize). */
static bool dx_over_x(const ch_conv_desc *d, int n, const ch_real *dx, const void *x, size_t xsize)
{
    const size_t xl = (size_t)n * d->c * d->h * d->w;
    return overlaps(dx, sizeof(ch_real) * xl, x, xsize * xl);
}

static bool dx_over_dy(const ch_conv_desc *d, int n, const ch_real *dx, const void *dy, size_t dysize)
{
    const size_t xl = (size_t)n * d->c * d->h * d->w, yl = (size_t)n * d->oc * d->oh * d->ow;
    return overlaps(dx, sizeof(ch_real) * xl, dy, dysize * yl);
}

/* backward_weights and backward_data in one pass over the batch. dx must not overlap x or dy (a
 * thread writes its samples' dx while another still reads its own x and dy): false where it does,
 * as where the layer is not one this Winograd takes, and nothing is written. */
bool WINO_FN(backward)(const ch_kctx *kc, const ch_conv_desc *d, int n, const ch_real *x,
                       const ch_real *y, ch_real *dy, const ch_real *w, ch_real *dx, ch_real *dw,
                       ch_real *db)
{
    wgeo g;
    if (!wino_usable(kc, d, n, &g) || dx_over_x(d, n, dx, x, sizeof(ch_real)) || dx_over_dy(d, n, dx, dy, sizeof(ch_real)))
        return false;
    grads_pass(kc, &g, n, w, &(wgrads){ { x, NULL }, y, dy, NULL, dx, db != NULL }, dw, db);
    return true;
}

#ifdef WINO_BF16
/* Whether bf16's two backward passes run faster apart than at once, by measurement: on the
 * layers of 64 and 128 channels (in and out) on planes of 49 tile positions or fewer, which do not
 * split (split_layer). resnet18 (reference program D) at batch 256, 2 threads, bf16: its first
 * two stages' (64@28x28, 128@14x14) at once 33.7-34.3 and 28.5-28.7 ms, apart 30.5-31.0 and
 * 22.8-22.9 (bench/conv_kernels); in training 0.95x the step (docs/PERFORMANCE.md, "bf16"). At
 * once stays faster on 64@56x56 (1.14x: 196 positions), on ResNet-20's 16 and 32 channels
 * (1.12x) and on the layers that split (256 and 512 channels: 1.03-1.06x). Apart packs dy and
 * transforms E twice; at once holds a thread's x, dy and dx planes and both chunk buffers
 * together, and on these layers that costs more than it saves. */
static bool apart_faster(const ch_kctx *kc, const wgeo *g)
{
    const ch_conv_desc *d = g->d;
    return g->bf16 && !split_layer(kc, g) && d->c >= 64 && d->c <= 128 && d->oc >= 64 && d->oc <= 128 &&
           g->pos <= 49;
}

/* grads_pass of a (dx included), or where apart the weights' pass alone first (it reads x, and
 * masks dy for a fused ReLU, before dx is written) and then the data's over the same dy: where
 * dx overlaps x (`apart`), or where that is the faster (apart_faster). */
static void grads_maybe_apart(const ch_kctx *kc, const wgeo *g, int n, const ch_real *w, wgrads a, bool apart,
                              ch_real *dw, ch_real *db)
{
    ch_real *dx = a.dx;
    if (dx && apart_faster(kc, g)) apart = true;
    if (apart) a.dx = NULL;
    grads_pass(kc, g, n, apart ? NULL : w, &a, dw, db);
    if (apart)
        run_pass(kc, g, n, w, &(wpass){ .in = { a.dy, a.dyh }, .out = { dx, NULL }, .group = backward_data_group });
}

/* Both backward passes of an input kept in bf16 (dx may be NULL: the weights' pass alone). Where
 * dx overlaps x the passes run apart (grads_maybe_apart), so that a layer the plan gave a bf16
 * input never needs the fp32 one. dx must not overlap dy (false, nothing written): the data's
 * pass would write one sample's dx over another's dy before it is read. */
bool WINO_FN(backward_of_bf16)(const ch_kctx *kc, const ch_conv_desc *d, int n, const uint16_t *x,
                               const ch_real *y, ch_real *dy, const ch_real *w, ch_real *dx, ch_real *dw,
                               ch_real *db)
{
    wgeo g;
    if (!wino_usable(kc, d, n, &g) || (dx && dx_over_dy(d, n, dx, dy, sizeof(ch_real)))) return false;
    const bool apart = dx && dx_over_x(d, n, dx, x, sizeof(uint16_t));
    grads_maybe_apart(kc, &g, n, w, (wgrads){ { NULL, x }, y, dy, NULL, dx, db != NULL }, apart, dw, db);
    return true;
}

/* Both backward passes of dy kept in bf16 (dx may be NULL: the weights' pass alone), x fp32 or,
 * where x is NULL, bf16 from xh; dx over x and dy as backward_of_bf16's. Not with a fused ReLU,
 * whose backward masks dy in place. */
bool WINO_FN(backward_dy_bf16)(const ch_kctx *kc, const ch_conv_desc *d, int n, const ch_real *x,
                               const uint16_t *xh, const uint16_t *dy, const ch_real *w, ch_real *dx, ch_real *dw,
                               ch_real *db)
{
    wgeo g;
    if (d->relu || !wino_usable(kc, d, n, &g) || (dx && dx_over_dy(d, n, dx, dy, sizeof(uint16_t)))) return false;
    const bool apart = dx && (x ? dx_over_x(d, n, dx, x, sizeof(ch_real)) : dx_over_x(d, n, dx, xh, sizeof(uint16_t)));
    grads_maybe_apart(kc, &g, n, w, (wgrads){ { x, x ? NULL : xh }, NULL, NULL, dy, dx, db != NULL }, apart, dw, db);
    return true;
}
#endif
