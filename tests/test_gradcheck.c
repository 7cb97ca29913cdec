/* Gradient checks in double precision (this test links libcohort_f64: the same layer and kernel
 * sources compiled with ch_real = double). For every layer and every zoo model, the analytic
 * gradients of the parameters and of the input are compared with central differences
 *   (L(p + eps) - L(p - eps)) / (2 eps),  eps = 1e-6,
 * and must agree to a relative error of 1e-4. Where both are below 1e-7 (gradients that are
 * mathematically zero, such as a conv bias feeding BatchNorm, whose numeric estimate is pure
 * rounding noise) they must agree to 1e-7 absolutely; a missing gradient still fails, since its
 * numeric estimate is far above that. Layers are checked under the linear functional
 * L = sum(y * R) for a fixed random R; models under the softmax cross-entropy of random labels and
 * under the mean squared error against a random target.
 * Inputs are random and continuous, so no ReLU or max-pool kink lies within eps of a probe.
 * The models live on the backend --backend=NAME names (cpu without it); CI runs this test on the
 * lazy backend too (gradcheck_lazy), whose memory reads as garbage to any code that bypasses the
 * backend and whose work runs only when waited for. */
#include "test_util.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/rng.h"
#include "graph/graph.h"
#include "models/zoo.h"
#include "nn/model.h"

static const double eps = 1e-6, tol = 1e-4, zero_floor = 1e-7;
static ch_backend *be;    /* every model's, made in main */

typedef struct probe {
    ch_model *m;
    ch_run run;
    int n;
    ch_real *x, *dx, *R, *dout;   /* backend memory */
    ch_real *Rh, *yh;     /* host: R as drawn; y for sum(y * R) */
    int32_t *labels;      /* softmax cross-entropy of these labels (backend memory) */
    bool mse;             /* else, with mse: mean squared error against R; else sum(y * R) */
} probe;

static ch_real get1(const ch_real *dev)
{
    ch_real v;
    ch_backend_download(be, &v, dev, sizeof v);
    return v;
}

static void set1(ch_real *dev, ch_real v) { ch_backend_upload(be, dev, &v, sizeof v); }

static void *dev_alloc(size_t bytes)
{
    void *p = ch_backend_alloc(be, bytes);
    assert_non_null(p);
    return p;
}

static void upload_uniform(ch_real *dev, size_t n, double lo, double hi, uint64_t seed)
{
    ch_real *h = malloc(sizeof(ch_real) * (n ? n : 1));
    assert_non_null(h);
    tu_fill_uniform(h, n, lo, hi, seed);
    ch_backend_upload(be, dev, h, sizeof(ch_real) * n);
    free(h);
}

/* Where the loss kernels write their sums: host memory that outlives the call, since a backend
 * with streams writes it when the kernel runs (read after ch_backend_sync). */
static double loss_out;
static int64_t correct_out;

static double loss_of(probe *p)
{
    const ch_real *y = ch_model_forward(p->m, &p->run, p->n, p->x);
    const size_t len = ch_shape3_size(p->m->root->out) * (size_t)p->n;
    if (p->mse) {
        p->run.k->mse(&p->run.kc, len, y, p->R, 1.0 / len, NULL, &loss_out);
        ch_backend_sync(be, CH_STREAM_COMPUTE);
        return loss_out / len;
    }
    if (!p->labels) {
        ch_backend_download(be, p->yh, y, sizeof(ch_real) * len);
        double s = 0;
        for (size_t i = 0; i < len; i++) s += (double)p->yh[i] * p->Rh[i];
        return s;
    }
    p->run.k->softmax_xent(&p->run.kc, p->n, p->m->classes, y, p->labels, 1.0 / p->n, NULL, &loss_out,
                           &correct_out);
    ch_backend_sync(be, CH_STREAM_COMPUTE);
    return loss_out / p->n;
}

static void analytic(probe *p)
{
    const ch_real *y = ch_model_forward(p->m, &p->run, p->n, p->x);
    const size_t len = ch_shape3_size(p->m->root->out) * (size_t)p->n;
    if (p->mse) {
        p->run.k->mse(&p->run.kc, len, y, p->R, 1.0 / len, p->dout, &loss_out);
    } else if (p->labels) {
        p->run.k->softmax_xent(&p->run.kc, p->n, p->m->classes, y, p->labels, 1.0 / p->n, p->dout,
                               &loss_out, &correct_out);
    } else {
        ch_backend_copy(be, p->dout, p->R, sizeof(ch_real) * len);
    }
    /* Backward overwrites dx: stale values there (here 1e3) must not show through. */
    const size_t xl = ch_shape3_size(p->m->input) * (size_t)p->n;
    upload_uniform(p->dx, xl, 1e3, 1e3, 1);
    p->m->root->ops->backward(p->m->root, &p->run, p->n, p->x, p->dout, p->dx);
}

static double numeric(probe *p, ch_real *v)
{
    const ch_real saved = get1(v);
    set1(v, saved + eps);
    const double lp = loss_of(p);
    set1(v, saved - eps);
    const double lm = loss_of(p);
    set1(v, saved);
    return (lp - lm) / (2 * eps);
}

/* Relative error, or the absolute error scaled to tol where both values are below zero_floor. */
static double rel(double a, double b)
{
    const double m = fmax(fabs(a), fabs(b));
    if (m < zero_floor) return fabs(a - b) / zero_floor * tol;
    return fabs(a - b) / m;
}

/* Check `per_tensor` entries of every parameter tensor and `inputs` input entries. */
static void check(probe *p, const char *what, int per_tensor, int inputs)
{
    analytic(p);
    ch_real *grads = malloc(sizeof(ch_real) * (p->m->nparams ? p->m->nparams : 1));
    assert_non_null(grads);
    ch_backend_download(be, grads, p->m->grads, sizeof(ch_real) * p->m->nparams);
    double worst = 0;
    char worst_at[256] = "";
    for (int t = 0; t < p->m->ntensors; t++) {
        const ch_tensor_ref *ref = &p->m->tensors[t];
        if (ref->kind != CH_TENSOR_PARAM) continue;
        const size_t cnt = ref->spec->count;
        for (int j = 0; j < per_tensor; j++) {
            const size_t i = per_tensor == 1 ? cnt / 2 : (cnt - 1) * (size_t)j / (size_t)(per_tensor - 1);
            const double num = numeric(p, &ref->data[i]);
            const double r = rel(grads[ref->spec->offset + i], num);
            if (r > worst) {
                worst = r;
                snprintf(worst_at, sizeof worst_at, "%s[%zu]: analytic %.9g numeric %.9g", ref->name,
                         i, (double)grads[ref->spec->offset + i], num);
            }
        }
    }
    const size_t xlen = ch_shape3_size(p->m->input) * (size_t)p->n;
    for (int j = 0; j < inputs; j++) {
        const size_t i = (xlen - 1) * (size_t)j / (size_t)(inputs > 1 ? inputs - 1 : 1);
        const double num = numeric(p, &p->x[i]);
        const double dxi = get1(&p->dx[i]);
        const double r = rel(dxi, num);
        if (r > worst) {
            worst = r;
            snprintf(worst_at, sizeof worst_at, "input[%zu]: analytic %.9g numeric %.9g", i, dxi, num);
        }
    }
    print_message("%-28s max relative error %.2e %s\n", what, worst, worst_at);
    free(grads);
    assert_true(worst <= tol);
}

static void probe_init(probe *p, ch_model *m, int n, bool xent, uint64_t seed)
{
    ch_err err;
    memset(p, 0, sizeof *p);
    p->m = m;
    p->n = n;
    assert_int_equal(ch_model_init_params(m, "default", seed, &err), CH_STATUS_OK);
    /* Give BatchNorm non-trivial affine parameters so their gradients are exercised. */
    for (int t = 0; t < m->ntensors; t++)
        if (m->tensors[t].kind == CH_TENSOR_PARAM && m->tensors[t].spec->role >= CH_ROLE_ONES)
            upload_uniform(m->tensors[t].data, m->tensors[t].spec->count, 0.5, 1.5, seed + (uint64_t)t);
    assert_int_equal(ch_model_plan(m, n, 2, &err), CH_STATUS_OK);
    p->run = ch_model_run(m, true);
    p->run.seed = 7;
    p->run.step = 3;
    const size_t xl = ch_shape3_size(m->input) * (size_t)n, yl = ch_shape3_size(m->root->out) * (size_t)n;
    p->x = dev_alloc(sizeof(ch_real) * xl);
    p->dx = dev_alloc(sizeof(ch_real) * xl);
    p->R = dev_alloc(sizeof(ch_real) * yl);
    p->dout = dev_alloc(sizeof(ch_real) * yl);
    p->Rh = malloc(sizeof(ch_real) * yl);
    p->yh = malloc(sizeof(ch_real) * yl);
    assert_true(p->Rh && p->yh);
    upload_uniform(p->x, xl, -1, 1, seed + 100);
    tu_fill_uniform(p->Rh, yl, -1, 1, seed + 200);
    ch_backend_upload(be, p->R, p->Rh, sizeof(ch_real) * yl);
    if (xent) {
        int32_t *h = malloc(sizeof(int32_t) * (size_t)n);
        assert_non_null(h);
        ch_rng r;
        ch_rng_init(&r, seed, CH_RNG_STREAM_TEST, 0);
        for (int i = 0; i < n; i++) h[i] = (int32_t)ch_rng_below(&r, (uint32_t)m->classes);
        p->labels = dev_alloc(sizeof(int32_t) * (size_t)n);
        ch_backend_upload(be, p->labels, h, sizeof(int32_t) * (size_t)n);
        free(h);
    }
}

static void probe_free(probe *p)
{
    ch_model_free(p->m);
    ch_backend_release(be, p->x), ch_backend_release(be, p->dx), ch_backend_release(be, p->R);
    ch_backend_release(be, p->dout), ch_backend_release(be, p->labels);
    free(p->Rh), free(p->yh);
}

/* Wrap one layer in a model and check it, at `inputs` input elements. */
static void check_layer_inputs(const char *what, ch_layer *l, int n, int inputs)
{
    assert_non_null(l);
    ch_model *m;
    ch_err err;
    assert_int_equal(ch_model_create_from("layer", l, 0, be, &m, &err), CH_STATUS_OK);
    probe p;
    probe_init(&p, m, n, false, 11);
    check(&p, what, 4, inputs);
    probe_free(&p);
}

static void check_layer(const char *what, ch_layer *l, int n) { check_layer_inputs(what, l, n, 6); }

static ch_layer *made_layer;
static ch_err made_err;

static ch_layer *made(ch_status st)
{
    if (st != CH_STATUS_OK) fail_msg("%s", made_err.msg);
    return made_layer;
}

/* MAKE(ctor, args...): call a layer constructor, fail the test on error, yield the layer. */
#define MAKE(ctor, ...) made(ctor(__VA_ARGS__, &made_layer, &made_err))

static void conv2d_gradients(void **state)
{
    (void)state;
    check_layer("conv 3x3 s1 p0", MAKE(ch_conv2d_create, "c", (ch_shape3){ 2, 7, 6 }, 3, 3, 1, 0, true), 2);
    check_layer("conv 3x3 s2 p1", MAKE(ch_conv2d_create, "c", (ch_shape3){ 3, 7, 7 }, 4, 3, 2, 1, true), 3);
    check_layer("conv 5x5 s1 p2", MAKE(ch_conv2d_create, "c", (ch_shape3){ 2, 6, 6 }, 2, 5, 1, 2, true), 2);
    /* P = 64: one sample per GEMM, so backward data runs as the flipped forward convolution */
    check_layer("conv 3x3 s1 p1, P 64", MAKE(ch_conv2d_create, "c", (ch_shape3){ 2, 8, 8 }, 3, 3, 1, 1, true), 2);
    /* 8 -> 32 channels, 5x5: Winograd F(3x3, 5x5) (cpu_wino5.c), tiles clipped at both edges */
    check_layer("conv 5x5 s1 p1, Winograd", MAKE(ch_conv2d_create, "c", (ch_shape3){ 8, 8, 7 }, 32, 5, 1, 1, true), 2);
    check_layer("conv 1x1 s2 no bias", MAKE(ch_conv2d_create, "c", (ch_shape3){ 3, 5, 5 }, 4, 1, 2, 0, false), 2);
    check_layer("conv 1x1 s1 pointwise", MAKE(ch_conv2d_create, "c", (ch_shape3){ 3, 4, 4 }, 5, 1, 1, 0, true), 3);
}

/* ConvTranspose2d: stride 2 with output_padding (a U-Net's up-step), groups without bias, dilation. */
static void conv_transpose_gradients(void **state)
{
    (void)state;
    const ch_conv2d_opts up = { .out_channels = 2, .kernel = 3, .stride = 2, .pad = 1, .dilation = 1, .groups = 1, .bias = true };
    check_layer("conv transpose 3x3 s2 p1 op1", MAKE(ch_conv_transpose2d_create, "t", (ch_shape3){ 3, 4, 3 }, &up, 1), 2);
    const ch_conv2d_opts grouped = { .out_channels = 6, .kernel = 2, .stride = 2, .dilation = 1, .groups = 2 };
    check_layer("conv transpose 2x2 s2 groups 2", MAKE(ch_conv_transpose2d_create, "t", (ch_shape3){ 4, 3, 3 }, &grouped, 0), 3);
    const ch_conv2d_opts dil = { .out_channels = 3, .kernel = 3, .stride = 1, .pad = 2, .dilation = 2, .groups = 1, .bias = true };
    check_layer("conv transpose 3x3 d2 p2", MAKE(ch_conv_transpose2d_create, "t", (ch_shape3){ 2, 5, 5 }, &dil, 0), 2);
}

static void linear_gradients(void **state)
{
    (void)state;
    check_layer("linear", MAKE(ch_linear_create, "l", (ch_shape3){ 12, 1, 1 }, 5), 3);
}

static void pooling_gradients(void **state)
{
    (void)state;
    check_layer("maxpool 2 s2", MAKE(ch_maxpool2d_create, "p", (ch_shape3){ 2, 6, 6 }, 2, 2, 0), 2);
    check_layer("maxpool 3 s2 p1", MAKE(ch_maxpool2d_create, "p", (ch_shape3){ 2, 7, 7 }, 3, 2, 1), 2);
    check_layer("avgpool 2 s2", MAKE(ch_avgpool2d_create, "p", (ch_shape3){ 2, 7, 7 }, 2, 2, 0), 2);
    check_layer("avgpool 3 s2 p1", MAKE(ch_avgpool2d_create, "p", (ch_shape3){ 2, 6, 6 }, 3, 2, 1), 2);
    check_layer("global avgpool", MAKE(ch_global_avgpool_create, "p", (ch_shape3){ 3, 4, 4 }), 2);
    check_layer("upsample nearest 2x3", MAKE(ch_upsample_nearest_create, "u", (ch_shape3){ 2, 3, 4 }, 2, 3), 2);
    check_layer("upsample nearest 1x2", MAKE(ch_upsample_nearest_create, "u", (ch_shape3){ 3, 2, 3 }, 1, 2), 2);
    /* Every input element: bilinear weights reach each one differently near the edges. */
    check_layer_inputs("bilinear x2", MAKE(ch_upsample_bilinear_create, "u", (ch_shape3){ 2, 3, 4 }, 6, 8, false), 2, 48);
    check_layer_inputs("bilinear x2 aligned", MAKE(ch_upsample_bilinear_create, "u", (ch_shape3){ 2, 3, 4 }, 6, 8, true), 2, 48);
    check_layer_inputs("bilinear 5x4 -> 7x3", MAKE(ch_upsample_bilinear_create, "u", (ch_shape3){ 1, 5, 4 }, 7, 3, false), 2, 40);
}

/* The channel shuffle and slice forward: y's values are x's at the index maps of their definitions
 * (ch_graph_channel_shuffle: channel j * g + i from i * m + j), on n samples. */
static void check_channel_map(ch_layer *l, int n, int groups, int start)
{
    ch_model *m;
    ch_err err;
    assert_int_equal(ch_model_create_from("layer", l, 0, be, &m, &err), CH_STATUS_OK);
    probe p;
    probe_init(&p, m, n, false, 5);
    const ch_shape3 in = m->input, out = m->root->out;
    const size_t hw = (size_t)in.h * in.w, xl = ch_shape3_size(in) * (size_t)n, yl = ch_shape3_size(out) * (size_t)n;
    ch_real *x = malloc(sizeof(ch_real) * xl), *y = malloc(sizeof(ch_real) * yl);
    assert_true(x && y);
    ch_backend_download(be, x, p.x, sizeof(ch_real) * xl);
    ch_backend_download(be, y, ch_model_forward(p.m, &p.run, n, p.x), sizeof(ch_real) * yl);
    size_t wrong = 0;
    for (int s = 0; s < n; s++)
        for (int k = 0; k < out.c; k++) {
            const int from = groups ? (k % groups) * (in.c / groups) + k / groups : start + k;
            for (size_t q = 0; q < hw; q++)
                wrong += y[((size_t)s * out.c + k) * hw + q] != x[((size_t)s * in.c + from) * hw + q];
        }
    free(x), free(y);
    probe_free(&p);
    assert_int_equal(wrong, 0);
}

/* x.permute(0, 1 + perm[0], 1 + perm[1], 1 + perm[2])'s forward against its definition, on n
 * samples: y[s][a][b][c] is x[s] at the index whose dimension perm[0] is a, perm[1] b, perm[2] c. */
static void check_permute_map(const int perm[3], ch_shape3 in, int n)
{
    ch_model *m;
    ch_err err;
    assert_int_equal(ch_model_create_from("layer", MAKE(ch_permute_create, "p", in, perm), 0, be, &m, &err),
                     CH_STATUS_OK);
    probe p;
    probe_init(&p, m, n, false, 5);
    const int dims[3] = { in.c, in.h, in.w }, od[3] = { dims[perm[0]], dims[perm[1]], dims[perm[2]] };
    const size_t len = ch_shape3_size(in) * (size_t)n;
    ch_real *x = malloc(sizeof(ch_real) * len), *y = malloc(sizeof(ch_real) * len);
    assert_true(x && y);
    ch_backend_download(be, x, p.x, sizeof(ch_real) * len);
    ch_backend_download(be, y, ch_model_forward(p.m, &p.run, n, p.x), sizeof(ch_real) * len);
    size_t wrong = 0, at = 0;
    for (int s = 0; s < n; s++)
        for (int a = 0; a < od[0]; a++)
            for (int b = 0; b < od[1]; b++)
                for (int c = 0; c < od[2]; c++) {
                    int j[3];
                    j[perm[0]] = a, j[perm[1]] = b, j[perm[2]] = c;
                    wrong += y[at++] != x[(((size_t)s * dims[0] + j[0]) * dims[1] + j[1]) * dims[2] + j[2]];
                }
    free(x), free(y);
    probe_free(&p);
    assert_int_equal(wrong, 0);
}

/* Every order of (c, h, w) but the identity, on sides 2, 3, 4 (so that each order gives another
 * shape): the forward map, and every input's gradient (the backward is the inverse order). */
static void permute_gradients(void **state)
{
    (void)state;
    static const int perms[5][3] = { { 0, 2, 1 }, { 1, 0, 2 }, { 1, 2, 0 }, { 2, 0, 1 }, { 2, 1, 0 } };
    const ch_shape3 in = { 2, 3, 4 };
    for (int i = 0; i < 5; i++) {
        char what[80];
        snprintf(what, sizeof what, "permute (0, %d, %d, %d)", perms[i][0] + 1, perms[i][1] + 1, perms[i][2] + 1);
        check_layer_inputs(what, MAKE(ch_permute_create, "p", in, perms[i]), 2, 48);
        check_permute_map(perms[i], in, 3);
    }
    static const int bad[3][3] = { { 0, 0, 1 }, { 0, 1, 3 }, { -1, 1, 2 } };
    for (int i = 0; i < 3; i++) {
        ch_layer *l = NULL;
        ch_err err;
        assert_int_equal(ch_permute_create("p", in, bad[i], &l, &err), CH_STATUS_BAD_INPUT);
        assert_null(l);
        assert_non_null(strstr(err.msg, "is not an order of the dimensions"));
    }
}

/* Both of the shuffle's copy orders (per sample and group while n * groups <= c, else per channel
 * over the batch), and a slice inside the channels. */
static void channel_move_gradients(void **state)
{
    (void)state;
    check_layer("channel shuffle 6/3, n 1", MAKE(ch_channel_shuffle_create, "s", (ch_shape3){ 6, 2, 3 }, 3), 1);
    check_layer("channel shuffle 6/3, n 4", MAKE(ch_channel_shuffle_create, "s", (ch_shape3){ 6, 2, 3 }, 3), 4);
    check_layer("channel slice 1+3 of 5", MAKE(ch_channel_slice_create, "s", (ch_shape3){ 5, 2, 2 }, 1, 3), 2);
    check_channel_map(MAKE(ch_channel_shuffle_create, "s", (ch_shape3){ 6, 2, 3 }, 3), 1, 3, 0);
    check_channel_map(MAKE(ch_channel_shuffle_create, "s", (ch_shape3){ 6, 2, 3 }, 3), 4, 3, 0);
    check_channel_map(MAKE(ch_channel_shuffle_create, "s", (ch_shape3){ 8, 1, 2 }, 2), 3, 2, 0);
    check_channel_map(MAKE(ch_channel_slice_create, "s", (ch_shape3){ 5, 2, 2 }, 1, 3), 3, 0, 1);
}

/* LayerNorm over each trailing span and over the channels (ConvNeXt's), with eps 1e-3 (a dropped eps
 * shows) and weights and biases away from 1 and 0 (probe_init). */
static void layernorm_gradients(void **state)
{
    (void)state;
    const ch_shape3 s = { 3, 2, 4 };
    check_layer("layernorm (w)", MAKE(ch_layernorm_create, "n", s, 3, false, 1e-3), 3);
    check_layer("layernorm (h, w)", MAKE(ch_layernorm_create, "n", s, 2, false, 1e-3), 2);
    check_layer("layernorm (c, h, w)", MAKE(ch_layernorm_create, "n", s, 1, false, 1e-3), 2);
    check_layer("layernorm channels", MAKE(ch_layernorm_create, "n", s, CH_LN_CHANNELS, false, 1e-3), 2);
    check_layer("layernorm features", MAKE(ch_layernorm_create, "n", (ch_shape3){ 6, 1, 1 }, 1, true, 1e-3), 3);
}

static void elementwise_gradients(void **state)
{
    (void)state;
    check_layer("relu", MAKE(ch_relu_create, "r", (ch_shape3){ 2, 3, 5 }), 3);
    check_layer("flatten", MAKE(ch_flatten_create, "f", (ch_shape3){ 2, 3, 5 }), 2);
    check_layer("dropout p=0.3", MAKE(ch_dropout_create, "d", (ch_shape3){ 2, 3, 5 }, 0.3, 1), 3);
}

static void batchnorm_gradients(void **state)
{
    (void)state;
    check_layer("batchnorm2d", MAKE(ch_batchnorm2d_create, "bn", (ch_shape3){ 3, 4, 5 }), 3);
    check_layer("batchnorm2d eps 1e-3", MAKE(ch_batchnorm2d_create_opts, "bn", (ch_shape3){ 3, 4, 5 }, 1e-3, 0.3), 3);
}

/* The convolutions and pools a graph may hold beyond the zoo's. */
static void conv_options_gradients(void **state)
{
    (void)state;
    const struct { const char *what; ch_shape3 in; ch_conv2d_opts o; } cases[] = {
        { "conv groups 2", { 4, 6, 6 }, { .out_channels = 6, .kernel = 3, .stride = 1, .pad = 1, .dilation = 1, .groups = 2, .bias = true } },
        { "conv depthwise", { 4, 6, 5 }, { .out_channels = 4, .kernel = 3, .stride = 1, .pad = 1, .dilation = 1, .groups = 4, .bias = false } },
        { "conv depthwise x2 s2", { 3, 7, 7 }, { .out_channels = 6, .kernel = 3, .stride = 2, .pad = 1, .dilation = 1, .groups = 3, .bias = true } },
        { "conv dilation 2", { 2, 7, 7 }, { .out_channels = 3, .kernel = 3, .stride = 1, .pad = 2, .dilation = 2, .groups = 1, .bias = true } },
        { "conv dil 2 s2 groups 2", { 4, 9, 8 }, { .out_channels = 4, .kernel = 3, .stride = 2, .pad = 1, .dilation = 2, .groups = 2, .bias = true } },
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        check_layer(cases[i].what, MAKE(ch_conv2d_create_opts, "c", cases[i].in, &cases[i].o), 2);
    const struct { const char *what; bool max; ch_shape3 in; ch_pool2d_opts o; } pools[] = {
        { "maxpool 3 s2 ceil", true, { 2, 8, 8 }, { .kernel = 3, .stride = 2, .ceil_mode = true } },
        { "maxpool 2 s2 p1 ceil", true, { 2, 7, 6 }, { .kernel = 2, .stride = 2, .pad = 1, .ceil_mode = true } },
        { "avgpool 3 s2 ceil incl pad", false, { 2, 8, 8 }, { .kernel = 3, .stride = 2, .ceil_mode = true, .count_include_pad = true } },
        { "avgpool 3 s2 p1 ceil excl pad", false, { 2, 8, 7 }, { .kernel = 3, .stride = 2, .pad = 1, .ceil_mode = true } },
        { "avgpool 3 s1 p1 excl pad", false, { 2, 5, 5 }, { .kernel = 3, .stride = 1, .pad = 1 } },
    };
    for (size_t i = 0; i < sizeof pools / sizeof pools[0]; i++)
        check_layer(pools[i].what, pools[i].max ? MAKE(ch_maxpool2d_create_opts, "p", pools[i].in, &pools[i].o)
                                                : MAKE(ch_avgpool2d_create_opts, "p", pools[i].in, &pools[i].o), 2);
    check_layer("linear no bias", MAKE(ch_linear_create_opts, "l", (ch_shape3){ 12, 1, 1 }, 5, false), 3);
}

static void activation_gradients(void **state)
{
    (void)state;
    const struct { const char *what; ch_act a; } cases[] = {
        { "leaky_relu 0.1", { .kind = CH_ACT_LEAKY_RELU, .alpha = 0.1f } },
        { "clip -0.5..0.5", { .kind = CH_ACT_CLIP, .lo = -0.5f, .hi = 0.5f } },
        { "sigmoid", { .kind = CH_ACT_SIGMOID } },
        { "tanh", { .kind = CH_ACT_TANH } },
        { "hardsigmoid", { .kind = CH_ACT_HARDSIGMOID } },
        { "hardswish", { .kind = CH_ACT_HARDSWISH } },
        { "affine -1.5, 0.25", { .kind = CH_ACT_AFFINE, .alpha = -1.5f, .beta = 0.25f } },
        { "erf", { .kind = CH_ACT_ERF } },
        { "gelu", { .kind = CH_ACT_GELU } },
        { "gelu tanh", { .kind = CH_ACT_GELU_TANH } },
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        check_layer(cases[i].what, MAKE(ch_activation_create, "a", (ch_shape3){ 2, 3, 5 }, &cases[i].a), 4);
}

/* ---- whole graphs ---- */

static int conv(ch_graph *g, const char *name, int x, int oc, int k, int pad, int groups)
{
    return ch_graph_conv2d(g, name, x, &(ch_conv2d_args){ .out_channels = oc, .kernel = k, .padding = pad,
                                                         .groups = groups });
}

/* A squeeze-excitation block with a residual sum: y is read three times. */
static void build_se(ch_graph *g)
{
    int x = ch_graph_input(g, "x", 4, 5, 5);
    int y = conv(g, "conv", x, 6, 3, 1, 1);
    y = ch_graph_batchnorm2d(g, "bn", y, NULL);
    y = ch_graph_relu6(g, "act", y);
    int s = ch_graph_mean_hw(g, "se.pool", y, true);
    s = conv(g, "se.fc1", s, 3, 1, 0, 1);
    s = ch_graph_relu(g, "se.relu", s);
    s = conv(g, "se.fc2", s, 6, 1, 0, 1);
    s = ch_graph_sigmoid(g, "se.gate", s);
    int z = ch_graph_mul(g, "se.mul", y, s);
    z = ch_graph_add(g, "add", z, y);
    z = ch_graph_global_avg_pool(g, "pool", z);
    z = ch_graph_flatten(g, "flatten", z);
    ch_graph_output(g, ch_graph_linear(g, "fc", z, 5, true));
}

/* DenseNet-style concatenations: a and b each feed two concats; the input feeds two convs;
 * a depthwise conv followed by a fused ReLU, a conv whose ReLU must not be fused (the conv's own
 * output is read too). */
static void build_dense(ch_graph *g)
{
    int x = ch_graph_input(g, "x", 2, 7, 7);
    int a0 = conv(g, "a", x, 4, 3, 1, 1);
    int a = ch_graph_relu(g, "a.relu", a0);   /* a0 has a second reader: no conv+ReLU fusion */
    int b = conv(g, "b", x, 2, 1, 0, 1);
    b = ch_graph_leaky_relu(g, "b.act", b, 0.2);
    int c = ch_graph_concat(g, "c", (int[]){ a, b }, 2);
    int d = conv(g, "d", c, 6, 3, 1, 3);
    d = ch_graph_relu(g, "d.relu", d);
    d = ch_graph_tanh(g, "d.act", d);
    int e = ch_graph_concat(g, "e", (int[]){ a, b, d, a0 }, 4);
    e = ch_graph_max_pool2d(g, "pool1", e, &(ch_pool2d_args){ .kernel = 3, .stride = 2, .ceil_mode = true });
    e = ch_graph_avg_pool2d(g, "pool2", e, &(ch_pool2d_args){ .kernel = 2, .padding = 1, .exclude_pad = true });
    e = ch_graph_dropout(g, "drop", e, 0.25);
    e = ch_graph_flatten(g, "flatten", e);
    ch_graph_output(g, ch_graph_linear(g, "fc", e, 5, false));
}

/* Rank-1 broadcasting: a (c) vector against (c, h, w) aligns with w, as in PyTorch. */
static void build_flat(ch_graph *g)
{
    int x = ch_graph_input(g, "x", 3, 3, 3);
    int v = ch_graph_mean_hw(g, "mean", x, false);                 /* (3) */
    int y = ch_graph_mul(g, "scale", x, v);                         /* (3, 3, 3) * (1, 1, 3) */
    int f = ch_graph_flatten(g, "flatten", y);                      /* (27) */
    int h1 = ch_graph_linear(g, "h1", f, 4, true);
    int h2 = ch_graph_linear(g, "h2", f, 4, true);
    int h = ch_graph_add(g, "sum", h1, h2);                         /* (4) + (4) */
    h = ch_graph_mul(g, "sq", h, h);                                /* the same tensor twice */
    ch_graph_output(g, ch_graph_linear(g, "out", h, 3, true));
}

/* The hard activations over all their pieces (inputs spread to [-3.5, 4.5] by an affine node), a
 * view to another (c, h, w), BatchNorm1d over features and a view of them into a channel gate. */
static void build_head(ch_graph *g)
{
    int x = ch_graph_input(g, "x", 2, 4, 4);
    int a = ch_graph_affine(g, "spread", x, 4, 0.5);
    int h = ch_graph_hardswish(g, "hswish", a);
    int s = ch_graph_hardsigmoid(g, "hsig", ch_graph_affine(g, "spread2", a, 1.2, -0.3));
    int y = ch_graph_mul(g, "mul", h, s);                           /* (2, 4, 4) */
    int v = ch_graph_view(g, "view", y, 8, 2, 2);
    v = conv(g, "pw", v, 3, 1, 0, 1);                               /* (3, 2, 2) */
    int f = ch_graph_flatten(g, "flat", y);                         /* (32) */
    f = ch_graph_linear(g, "fc1", f, 3, true);
    f = ch_graph_batchnorm1d(g, "bn", f, NULL);
    int gate = ch_graph_view(g, "gate", ch_graph_sigmoid(g, "sig", f), 3, 1, 1);
    int z = ch_graph_mul(g, "apply", v, gate);                      /* (3, 2, 2) * (3, 1, 1) */
    z = ch_graph_flatten(g, "flat2", z);
    ch_graph_output(g, ch_graph_linear(g, "out", z, 4, true));
}

static void check_graph_inputs(const char *what, void (*build)(ch_graph *), int n, bool xent, int inputs)
{
    ch_graph *g;
    ch_err err;
    assert_int_equal(ch_graph_create(what, &g, &err), CH_STATUS_OK);
    build(g);
    if (ch_graph_status(g, &err) != CH_STATUS_OK) fail_msg("%s", err.msg);
    ch_layer *root;
    if (ch_graph_compile(g, &root, &err) != CH_STATUS_OK) fail_msg("%s", err.msg);
    ch_model *m;
    assert_int_equal(ch_model_create_from(what, root, (int)ch_shape3_size(root->out), be, &m, &err), CH_STATUS_OK);
    ch_graph_free(g);
    probe p;
    probe_init(&p, m, n, xent, 41);
    check(&p, what, 3, inputs);
    probe_free(&p);
}

/* Modules called twice or three times (ch_graph_reuse): a conv three times (the third named by
 * the second's name), a linear and a LayerNorm twice; each parameter's gradient is the sum over
 * its uses, checked against the numeric one. */
static void build_tied(ch_graph *g)
{
    int x = ch_graph_input(g, "x", 2, 4, 4);
    int y = ch_graph_conv2d(g, "conv", x, &(ch_conv2d_args){ .out_channels = 2, .kernel = 3, .padding = 1 });
    y = ch_graph_reuse(g, "conv_again", "conv", ch_graph_sigmoid(g, "act1", y));
    y = ch_graph_reuse(g, "conv_third", "conv_again", ch_graph_tanh(g, "act2", y));
    y = ch_graph_layer_norm(g, "ln", y, 2, 1e-3);
    y = ch_graph_reuse(g, "ln_again", "ln", ch_graph_sigmoid(g, "act3", y));
    int f = ch_graph_linear(g, "fc", ch_graph_flatten(g, "flat", y), 32, true);
    f = ch_graph_reuse(g, "fc_again", "fc", ch_graph_tanh(g, "act4", f));
    ch_graph_output(g, ch_graph_linear(g, "out", f, 3, true));
}

static void check_graph(const char *what, void (*build)(ch_graph *), int n, bool xent)
{
    check_graph_inputs(what, build, n, xent, 6);
}

static void graph_gradients(void **state)
{
    (void)state;
    check_graph("graph se-gate", build_se, 3, false);
    check_graph("graph se-gate xent", build_se, 3, true);
    check_graph("graph dense", build_dense, 3, false);
    check_graph("graph flat broadcast", build_flat, 3, false);
    check_graph("graph modules reused", build_tied, 3, false);
    /* Every input element: each piece of the hard activations is checked. */
    check_graph_inputs("graph hard activations, views, batchnorm1d", build_head, 3, false, 96);
}

/* Residual blocks as graphs, so the executor's memory passes run: bn1's output remade in backward,
 * bn2, the sum and the last ReLU in one buffer, BatchNorm input gradients over conv outputs, a
 * ReLU's and a sum's input gradient over their dy (graph/exec.c). */
static void build_residual(ch_graph *g, int in_c, int out_c, int stride, bool torchvision)
{
    const bool project = stride != 1 || in_c != out_c;
    int x = ch_graph_input(g, "x", in_c, 6, 6);
    int y = ch_graph_conv2d(g, "conv1", x, &(ch_conv2d_args){ .out_channels = out_c, .kernel = 3,
                                                              .stride = stride, .padding = 1,
                                                              .no_bias = torchvision });
    y = ch_graph_relu(g, "relu1", ch_graph_batchnorm2d(g, "bn1", y, NULL));
    y = ch_graph_conv2d(g, "conv2", y, &(ch_conv2d_args){ .out_channels = out_c, .kernel = 3, .padding = 1,
                                                          .no_bias = torchvision });
    y = ch_graph_batchnorm2d(g, "bn2", y, NULL);
    int s = x;
    if (project) {
        s = ch_graph_conv2d(g, "short", x, &(ch_conv2d_args){ .out_channels = out_c, .kernel = 1,
                                                              .stride = stride, .no_bias = torchvision });
        if (torchvision) s = ch_graph_batchnorm2d(g, "short_bn", s, NULL);
    }
    y = ch_graph_relu(g, "relu2", ch_graph_add(g, "add", y, s));
    ch_graph_output(g, ch_graph_linear(g, "fc", ch_graph_flatten(g, "flat", y), 3, true));
}

static void build_residual_identity(ch_graph *g) { build_residual(g, 4, 4, 1, false); }
static void build_residual_projected(ch_graph *g) { build_residual(g, 3, 5, 2, false); }
static void build_basicblock_downsample(ch_graph *g) { build_residual(g, 3, 5, 2, true); }

/* A sum's two operand gradients share its dy's block where nothing writes that block before both
 * operands' makers have read it (graph/exec.c, shares_dy: the two projected residual graphs above
 * and resnet18's blocks; the input's gradient, the caller's, never shares). Three
 * graphs where they must not: the second operand's maker comes after the first's and masks its
 * dy in place (a convolution with a fused ReLU); the second operand has a reader after the first's
 * maker (its gradient added into the block before that maker reads it); the first operand has a
 * second reader (likewise). */
static void build_sum_late_masking(ch_graph *g)
{
    int x = ch_graph_input(g, "x", 3, 6, 6);
    int y = ch_graph_batchnorm2d(g, "bn", conv(g, "conv", x, 4, 3, 1, 1), NULL);
    int s = ch_graph_relu(g, "short.relu", conv(g, "short", x, 4, 1, 0, 1));
    y = ch_graph_relu(g, "relu", ch_graph_add(g, "add", y, s));
    ch_graph_output(g, ch_graph_linear(g, "fc", ch_graph_flatten(g, "flat", y), 3, true));
}

static void build_sum_second_read_late(ch_graph *g)
{
    int x = ch_graph_input(g, "x", 3, 6, 6);
    int s = ch_graph_relu(g, "a.relu", conv(g, "a", x, 4, 3, 1, 1));
    int y = ch_graph_batchnorm2d(g, "bn", conv(g, "b", s, 4, 3, 1, 1), NULL);
    int w = conv(g, "c", s, 4, 1, 0, 1);
    int z = ch_graph_add(g, "add", y, s);
    ch_graph_output(g, ch_graph_linear(g, "fc", ch_graph_flatten(g, "flat", ch_graph_add(g, "add2", z, w)), 3, true));
}

static void build_sum_first_read_twice(ch_graph *g)
{
    int x = ch_graph_input(g, "x", 3, 6, 6);
    int s = conv(g, "short", x, 4, 1, 0, 1);
    int y = ch_graph_batchnorm2d(g, "bn", conv(g, "a", x, 4, 3, 1, 1), NULL);
    int w = conv(g, "c", y, 4, 3, 1, 1);
    int z = ch_graph_add(g, "add", y, s);
    ch_graph_output(g, ch_graph_linear(g, "fc", ch_graph_flatten(g, "flat", ch_graph_add(g, "add2", z, w)), 3, true));
}

static void residual_gradients(void **state)
{
    (void)state;
    check_graph("residual identity", build_residual_identity, 2, false);
    check_graph("residual 1x1 s2", build_residual_projected, 2, false);
    check_graph("basicblock downsample", build_basicblock_downsample, 2, false);
    check_graph("sum, second maker late and masking", build_sum_late_masking, 2, false);
    check_graph("sum, second operand read late", build_sum_second_read_late, 2, false);
    check_graph("sum, first operand read twice", build_sum_first_read_twice, 2, false);
}

static void check_model(const char *arch, ch_shape3 in, int n, int per_tensor, int inputs)
{
    ch_model *m;
    ch_err err;
    assert_int_equal(ch_zoo_model(arch, in, 10, be, &m, &err), CH_STATUS_OK);
    probe p;
    probe_init(&p, m, n, true, 21);
    check(&p, arch, per_tensor, inputs);
    probe_free(&p);
}

/* Reference program E's toy: Linear(5, 5) under the mean squared error. */
static void mse_loss_gradients(void **state)
{
    (void)state;
    ch_model *m;
    ch_err err;
    assert_int_equal(ch_zoo_model("mlp", (ch_shape3){ 1, 28, 28 }, 5, be, &m, &err), CH_STATUS_OK);
    probe p;
    probe_init(&p, m, 4, false, 31);
    p.mse = true;
    check(&p, "mlp + mse", 3, 4);
    probe_free(&p);
}

static void model_gradients(void **state)
{
    (void)state;
    check_model("lenet", (ch_shape3){ 1, 28, 28 }, 3, 3, 4);
    check_model("mnist-cnn", (ch_shape3){ 1, 28, 28 }, 3, 3, 4);
    check_model("mlp", (ch_shape3){ 1, 28, 28 }, 3, 3, 4);
    check_model("resnet18", (ch_shape3){ 1, 8, 8 }, 4, 1, 3);
    /* torchvision's: 7x7 stride-2 stem, max pool with padding, BasicBlocks with downsample. */
    check_model("resnet18-imagenet", (ch_shape3){ 3, 16, 16 }, 4, 1, 3);
    check_model("linear", (ch_shape3){ 1, 1, 5 }, 3, 3, 4);
}

int main(int argc, char **argv)
{
    tu_take_backend(&argc, argv);
    if (argc > 1) cmocka_set_test_filter(argv[1]);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(conv2d_gradients),
        cmocka_unit_test(conv_transpose_gradients),
        cmocka_unit_test(linear_gradients),
        cmocka_unit_test(pooling_gradients),
        cmocka_unit_test(elementwise_gradients),
        cmocka_unit_test(channel_move_gradients),
        cmocka_unit_test(permute_gradients),
        cmocka_unit_test(layernorm_gradients),
        cmocka_unit_test(batchnorm_gradients),
        cmocka_unit_test(conv_options_gradients),
        cmocka_unit_test(activation_gradients),
        cmocka_unit_test(graph_gradients),
        cmocka_unit_test(residual_gradients),
        cmocka_unit_test(mse_loss_gradients),
        cmocka_unit_test(model_gradients),
    };
    ch_err err;
    if (ch_backend_create(tu_backend, 0, 2, &be, &err) != CH_STATUS_OK) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    print_message("backend: %s\n", be->ops->name);
    const int failed = cmocka_run_group_tests(tests, NULL, NULL);
    ch_backend_free(be);
    return failed;
}
