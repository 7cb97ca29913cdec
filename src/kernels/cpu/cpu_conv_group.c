/* Convolutions with groups (depthwise, grouped) or dilation: what imported models use and the
 * zoo does not (depthwise ones go to cpu_conv_dw.c). One sample at a time per thread, one group at a time: im2col of the group's input
 * channels with dilated taps, then a single-threaded GEMM with the group's weights. Simple rather
 * than fast; the ungrouped, undilated convolutions of the zoo keep cpu_conv.c's paths.
 * Weight gradients go to per-thread partial sums added in thread order (deterministic for a given
 * thread count), as cpu_conv.c's. */
#include "kernels/cpu/cpu.h"

#include <string.h>

bool ch_cpu_conv_is_grouped(const ch_conv_desc *d)
{
    return ch_conv_groups(d) > 1 || ch_conv_dilation(d) > 1;
}

typedef struct group_geom {
    int G, cg, ocg, D;
    size_t K, P;   /* rows of a group's im2col matrix (cg * kh * kw), output positions */
} group_geom;

static group_geom geom_of(const ch_conv_desc *d)
{
    group_geom g;
    g.G = ch_conv_groups(d);
    g.cg = d->c / g.G;
    g.ocg = d->oc / g.G;
    g.D = ch_conv_dilation(d);
    g.K = (size_t)g.cg * d->kh * d->kw;
    g.P = (size_t)d->oh * d->ow;
    return g;
}

static int team(const ch_kctx *kc, int n) { return n < kc->nthreads ? (n > 0 ? n : 1) : kc->nthreads; }

/* Per thread: the col matrix, then dW and db partials. */
static size_t per_thread(const ch_conv_desc *d)
{
    const group_geom g = geom_of(d);
    return g.K * g.P + (size_t)d->oc * g.K + (size_t)d->oc;
}

size_t ch_cpu_conv_group_workspace(const ch_conv_desc *d, int n, int nthreads)
{
    (void)n;
    if (ch_cpu_conv_is_depthwise(d)) return ch_cpu_conv_dw_workspace(d, nthreads);
    return per_thread(d) * (size_t)(nthreads > 0 ? nthreads : 1);
}

/* col (K, P) of group gi's channels of one sample x (c, h, w). */
static void im2col_group(const ch_conv_desc *d, const group_geom *g, int gi, const ch_real *x,
                         ch_real *col)
{
    for (int ci = 0; ci < g->cg; ci++) {
        const ch_real *xc = x + (size_t)(gi * g->cg + ci) * d->h * d->w;
        for (int p = 0; p < d->kh; p++)
            for (int q = 0; q < d->kw; q++) {
                ch_real *row = col + (((size_t)ci * d->kh + p) * d->kw + q) * g->P;
                for (int i = 0; i < d->oh; i++) {
                    const int ih = i * d->stride - d->pad + p * g->D;
                    for (int j = 0; j < d->ow; j++) {
                        const int iw = j * d->stride - d->pad + q * g->D;
                        const bool in = ih >= 0 && ih < d->h && iw >= 0 && iw < d->w;
                        row[(size_t)i * d->ow + j] = in ? xc[(size_t)ih * d->w + iw] : 0;
                    }
                }
            }
    }
}

/* dx (group gi's channels of one sample) += col2im(col). */
static void col2im_group(const ch_conv_desc *d, const group_geom *g, int gi, const ch_real *col,
                         ch_real *dx)
{
    for (int ci = 0; ci < g->cg; ci++) {
        ch_real *dxc = dx + (size_t)(gi * g->cg + ci) * d->h * d->w;
        for (int p = 0; p < d->kh; p++)
            for (int q = 0; q < d->kw; q++) {
                const ch_real *row = col + (((size_t)ci * d->kh + p) * d->kw + q) * g->P;
                for (int i = 0; i < d->oh; i++) {
                    const int ih = i * d->stride - d->pad + p * g->D;
                    if (ih < 0 || ih >= d->h) continue;
                    for (int j = 0; j < d->ow; j++) {
                        const int iw = j * d->stride - d->pad + q * g->D;
                        if (iw >= 0 && iw < d->w) dxc[(size_t)ih * d->w + iw] += row[(size_t)i * d->ow + j];
                    }
                }
            }
    }
}

/* Sample s's output, through col (a thread's im2col scratch). */
static void forward_sample(const ch_kctx *kc, const ch_conv_desc *d, const group_geom *g, int s,
                           const ch_real *x, const ch_real *w, const ch_real *b, ch_real *y, ch_real *col)
{
    const size_t xs = (size_t)d->c * d->h * d->w, ys = (size_t)d->oc * g->P;
    ch_real *ys_ = y + s * ys;
    for (int gi = 0; gi < g->G; gi++) {
        im2col_group(d, g, gi, x + s * xs, col);
        ch_cpu_gemm(kc, false, false, g->ocg, (int)g->P, (int)g->K, 1, w + (size_t)gi * g->ocg * g->K,
                    (int)g->K, col, (int)g->P, 0, ys_ + (size_t)gi * g->ocg * g->P, (int)g->P);
    }
    if (b)
        for (int o = 0; o < d->oc; o++)
            for (size_t p = 0; p < g->P; p++) ys_[o * g->P + p] += b[o];
    if (d->relu) ch_cpu_relu_span(ys, ys_, ys_);
}

/* What a pass's team members share (ch_cpu_team's arg): each thread takes a contiguous share of
 * the samples and its own im2col scratch. */
typedef struct group_team {
    const ch_kctx *kc;
    const ch_conv_desc *d;
    const group_geom *g;
    int n;
    const ch_real *in, *w, *b;   /* x (forward) or dy (data); b: forward's bias */
    ch_real *out;                /* y or dx */
    bool data;                   /* backward data, else forward */
} group_team;

static void backward_data_sample(const ch_kctx *kc, const ch_conv_desc *d, const group_geom *g, int s,
                                 const ch_real *dy, const ch_real *w, ch_real *dx, ch_real *col);

/* Thread t of T: its share of the samples, forward or backward data, through its own scratch. */
static void samples_member(void *arg, int t, int T)
{
    const group_team *m = arg;
    ch_real *col = m->kc->ws + per_thread(m->d) * (size_t)t;
    for (int s = (int)((long)m->n * t / T); s < (int)((long)m->n * (t + 1) / T); s++) {
        if (m->data) backward_data_sample(m->kc, m->d, m->g, s, m->in, m->w, m->out, col);
        else forward_sample(m->kc, m->d, m->g, s, m->in, m->w, m->b, m->out, col);
    }
}

void ch_cpu_conv_group_forward(const ch_kctx *kc, const ch_conv_desc *d, int n, const ch_real *x,
                               const ch_real *w, const ch_real *b, ch_real *y)
{
    if (ch_cpu_conv_is_depthwise(d)) {
        ch_cpu_conv_dw_forward(kc, d, n, x, w, b, y);
        return;
    }
    const group_geom g = geom_of(d);
    group_team m = { .kc = kc, .d = d, .g = &g, .n = n, .in = x, .w = w, .b = b, .out = y };
    ch_cpu_team(team(kc, n), samples_member, &m);
}

/* Sample s's dx, through col (a thread's scratch). */
static void backward_data_sample(const ch_kctx *kc, const ch_conv_desc *d, const group_geom *g, int s,
                                 const ch_real *dy, const ch_real *w, ch_real *dx, ch_real *col)
{
    const size_t xs = (size_t)d->c * d->h * d->w, ys = (size_t)d->oc * g->P;
    memset(dx + s * xs, 0, sizeof(ch_real) * xs);
    for (int gi = 0; gi < g->G; gi++) {
        ch_cpu_gemm(kc, true, false, (int)g->K, (int)g->P, g->ocg, 1, w + (size_t)gi * g->ocg * g->K,
                    (int)g->K, dy + s * ys + (size_t)gi * g->ocg * g->P, (int)g->P, 0, col, (int)g->P);
        col2im_group(d, g, gi, col, dx + s * xs);
    }
}

void ch_cpu_conv_group_backward_data(const ch_kctx *kc, const ch_conv_desc *d, int n,
                                     const ch_real *dy, const ch_real *w, ch_real *dx)
{
    if (ch_cpu_conv_is_depthwise(d)) {
        ch_cpu_conv_dw_backward_data(kc, d, n, dy, w, dx);
        return;
    }
    const group_geom g = geom_of(d);
    group_team m = { .kc = kc, .d = d, .g = &g, .n = n, .in = dy, .w = w, .out = dx, .data = true };
    ch_cpu_team(team(kc, n), samples_member, &m);
}

/* Thread t's samples [lo, hi) summed into its partials pw, pb (overwritten). */
static void weights_partial(const ch_kctx *kc, const ch_conv_desc *d, const group_geom *g, int lo,
                            int hi, const ch_real *x, const ch_real *y, ch_real *dy, ch_real *col,
                            ch_real *pw, ch_real *pb)
{
    const size_t xs = (size_t)d->c * d->h * d->w, ys = (size_t)d->oc * g->P;
    memset(pw, 0, sizeof(ch_real) * (size_t)d->oc * g->K);
    if (pb) memset(pb, 0, sizeof(ch_real) * (size_t)d->oc);
    for (int s = lo; s < hi; s++) {
        ch_real *dys = dy + s * ys;
        /* The fused ReLU's backward: dy is an output too (see kernels.h). */
        if (d->relu) ch_cpu_relu_backward_span(ys, y + s * ys, dys, dys);
        for (int gi = 0; gi < g->G; gi++) {
            im2col_group(d, g, gi, x + s * xs, col);
            ch_cpu_gemm(kc, false, true, g->ocg, (int)g->K, (int)g->P, 1, dys + (size_t)gi * g->ocg * g->P,
                        (int)g->P, col, (int)g->P, 1, pw + (size_t)gi * g->ocg * g->K, (int)g->K);
        }
        if (pb)
            for (int o = 0; o < d->oc; o++) pb[o] += (ch_real)ch_cpu_sum(dys + o * g->P, g->P);
    }
}

void ch_cpu_conv_group_backward_weights(const ch_kctx *kc, const ch_conv_desc *d, int n,
                                        const ch_real *x, const ch_real *y, ch_real *dy,
                                        ch_real *dw, ch_real *db)
{
    if (ch_cpu_conv_is_depthwise(d)) {
        ch_cpu_conv_dw_backward_weights(kc, d, n, x, y, dy, dw, db);
        return;
    }
    const group_geom g = geom_of(d);
    const size_t wl = (size_t)d->oc * g.K, pt = per_thread(d);
    const int T = team(kc, n);
    if (T == 1) {
        weights_partial(kc, d, &g, 0, n, x, y, dy, kc->ws, dw, db);
        return;
    }
#pragma omp parallel num_threads(T)
    {
        const int t = ch_omp_thread();
        ch_real *col = kc->ws + pt * (size_t)t, *pw = col + g.K * g.P, *pb = pw + wl;
        weights_partial(kc, d, &g, (int)((long)n * t / T), (int)((long)n * (t + 1) / T), x, y, dy,
                        col, pw, db ? pb : NULL);
#pragma omp barrier
#pragma omp for schedule(static)
        for (size_t i = 0; i < wl + (size_t)d->oc; i++) {
            if (i >= wl && !db) continue;
            ch_real acc = 0;
            for (int u = 0; u < T; u++) acc += kc->ws[pt * (size_t)u + g.K * g.P + i];
            if (i < wl) dw[i] = acc; else db[i - wl] = acc;
        }
    }
}
