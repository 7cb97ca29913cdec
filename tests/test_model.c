/* Models, initialisation, the optimizer's update rule and the trainer's contracts. */
#include "test_util.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/bf16.h"
#include "core/rng.h"
#include "models/zoo.h"
#include "nn/model.h"
#include "optim/optim.h"
#include "train/trainer.h"

static ch_model *make(const char *arch, ch_shape3 in)
{
    ch_model *m;
    ch_err err;
    if (ch_zoo_model(arch, in, 10, ch_backend_host(), &m, &err) != CH_STATUS_OK) fail_msg("%s", err.msg);
    return m;
}

/* The scratch (floats) that zoo model arch on 1x28x28 inputs plans for batches of `batch`. */
static size_t planned_scratch(const char *arch, int batch)
{
    ch_model *m = make(arch, (ch_shape3){ 1, 28, 28 });
    ch_err err;
    if (ch_model_plan(m, batch, 1, &err) != CH_STATUS_OK) fail_msg("%s", err.msg);
    const size_t len = m->scratch_len;
    ch_model_free(m);
    return len;
}

/* resnet18's backward scratch is three of its largest activations: the gradient carried past a
 * residual block, the gradient inside it and its inner activation remade for conv2's backward.
 * The late stages' small blocks share the early stages' places (the stack's blocks are placed
 * after the walk, the largest first: graph/blocks.c), the gradients of BatchNorm inputs are
 * written over the convolution outputs they replace, a ReLU's and a sum's input gradients take
 * over their output gradient, and no inner activation is kept between forward and backward
 * (graph/exec.c). */
static void resnet18_backward_scratch_is_three_largest_activations(void **state)
{
    (void)state;
    assert_int_equal(planned_scratch("resnet18", 8), (size_t)3 * 64 * 28 * 28 * 8);
}

/* mnist-cnn's backward scratch is the least it can be: the gradients either side of its first max
 * pool, live together in that pool's backward (20 x 28 x 28 and 20 x 14 x 14 a sample). Placed as
 * the walk took them (best fit, before ch_blocks_place) its blocks needed 1.3 times that. */
static void mnist_cnn_backward_scratch_is_its_first_pools_gradients(void **state)
{
    (void)state;
    assert_int_equal(planned_scratch("mnist-cnn", 64), (size_t)(20 * 28 * 28 + 20 * 14 * 14) * 64);
}

/* The CPU's copy_rows, counted where a row is more than the 10 logits (whose gradient the model
 * copies once a step): a same-shaped sum's backward copies its dy to an operand's gradient with
 * it, where that gradient is not its dy's block. */
static int rows_copied;

static void counted_copy_rows(const ch_kctx *kc, int rows, size_t len, const ch_real *src, size_t src_stride,
                              ch_real *dst, size_t dst_stride)
{
    rows_copied += len > 10;
    ch_kernels_cpu()->copy_rows(kc, rows, len, src, src_stride, dst, dst_stride);
}

/* resnet18's 8 residual sums copy nothing in backward, in fp32 and with --precision bf16: both
 * operands' gradients are the sum's dy block (graph/exec.c, shares_dy). Without the sharing there
 * are 8 a step. (The scratch this costs nothing is held by the two tests either side: three
 * activations in fp32, one more in bf16.) */
static void resnet18_sums_copy_nothing_in_backward(void **state)
{
    (void)state;
    enum { P = 11175818 };
    ch_backend *be;
    ch_err err;
    if (ch_backend_create("cpu", 0, 2, &be, &err) != CH_STATUS_OK) fail_msg("%s", err.msg);
    ch_kernels counted = *be->k;
    counted.copy_rows = counted_copy_rows;
    be->k = &counted;
    float *g = malloc(sizeof(float) * P);
    assert_non_null(g);
    for (int bf16 = 0; bf16 < 2; bf16++) {
        rows_copied = 0;
        ch_model_free(tu_zoo_step(be, "resnet18", (ch_shape3){ 1, 28, 28 }, 4, bf16, 8, g));
        if (rows_copied != 0) fail_msg("%s: %d copies of a row in backward", bf16 ? "bf16" : "fp32", rows_copied);
    }
    free(g);
    ch_backend_free(be);
}

/* resnet18's logits for n samples of x, planned and run on backend be. */
static void resnet18_logits(ch_backend *be, int n, const float *x, float *out)
{
    ch_model *m;
    ch_err err;
    const ch_shape3 in = { 1, 12, 12 };
    if (ch_zoo_model("resnet18", in, 10, be, &m, &err) != CH_STATUS_OK ||
        ch_model_init_params(m, "default", 9, &err) != CH_STATUS_OK || ch_model_plan(m, n, 2, &err) != CH_STATUS_OK)
        fail_msg("%s", err.msg);
    assert_true(be->ws->len >= m->ws_len);
    ch_real *dx = ch_backend_alloc(be, sizeof(ch_real) * (size_t)n * 144);
    assert_non_null(dx);
    if (ch_model_upload_floats(m, dx, x, (size_t)n * 144, &err) != CH_STATUS_OK) fail_msg("%s", err.msg);
    const ch_run r = ch_model_run(m, true);
    const ch_real *y = ch_model_forward(m, &r, n, dx);
    if (ch_model_download_floats(m, out, y, (size_t)n * 10, &err) != CH_STATUS_OK) fail_msg("%s", err.msg);
    ch_backend_release(be, dx);
    ch_model_free(m);
}

/* resnet18's parameter gradients (nparams floats into g) for one training step of n samples on
 * backend be (threads 2) planned in bf16 or not, from fixed inputs and a fixed gradient of the
 * logits; the planned model's saved bytes and scratch go to *saved and *scratch. */
static void resnet18_step(ch_backend *be, bool bf16, int n, float *g, size_t *saved, size_t *scratch)
{
    ch_model *m = tu_zoo_step(be, "resnet18", (ch_shape3){ 1, 12, 12 }, 4, bf16, n, g);
    *saved = m->saved_bytes;
    *scratch = m->scratch_len;
    ch_model_free(m);
}

/* The CPU's channel_affine, then its input rounded to bf16 in place: in a model whose values are
 * all fp32, BatchNorm's forward (and the remake of its output) then leaves backward exactly the
 * values that --precision bf16 keeps of its input. */
static void affine_then_round_input(const ch_kctx *kc, int n, int c, int hw, const ch_real *x,
                                    const ch_real *scale, const ch_real *shift, ch_real *y)
{
    ch_kernels_cpu()->channel_affine(kc, n, c, hw, x, scale, shift, y);
    ch_real *kept = (ch_real *)x;   /* the test's own model: rounding it is the point */
    for (size_t i = 0; i < (size_t)n * c * hw; i++) kept[i] = ch_bf16_to_float(ch_bf16_from_float(kept[i]));
}

/* The CPU's conv2d_forward, then y rounded to bf16 in place for the layers whose --precision bf16
 * convolution writes its output in bf16 for its BatchNorm (conv2d_out_bf16, of a layer a BatchNorm
 * follows: in resnet18 all but the 1x1 shortcuts, which feed the residual sum): the values that
 * BatchNorm then reads. */
static void conv_then_round_output(const ch_kctx *kc, const ch_conv_desc *d, int n, const ch_real *x,
                                   const ch_real *w, const ch_real *b, ch_real *y)
{
    ch_kernels_cpu()->conv2d_forward(kc, d, n, x, w, b, y);
    if (!ch_kernels_cpu()->conv2d_out_bf16(kc, d, n) || d->kh * d->kw == 1) return;
    for (size_t i = 0; i < (size_t)n * d->oc * d->oh * d->ow; i++) y[i] = ch_bf16_to_float(ch_bf16_from_float(y[i]));
}

/* --precision bf16 keeps every BatchNorm input (resnet18: 17 of its 20 convolutions' outputs) in
 * bf16 between forward and backward (graph/exec.c): 2 saved bytes per value of those outputs,
 * and one largest activation more of scratch, for their gradients. The step's gradients are, bit
 * for bit, those of the all-fp32 model whose BatchNorms round their inputs after forward and whose
 * bf16 Winograd convolutions round their outputs (those write them in bf16 themselves, where the
 * CPU has native bf16), and they differ from the unrounded model's; the lazy backend, whose memory
 * reads as garbage outside the kernels' arguments, gives the same bits. bf16 products run in all
 * of them where the CPU has them. */
static void resnet18_bf16_keeps_batchnorm_inputs_in_bf16(void **state)
{
    (void)state;
    enum { N = 5, P = 11175818 };
    /* The convolutions a BatchNorm follows: 5 at 64@12x12, 4 in each later stage (d2l's 1x1
     * shortcut, conv3, has none). */
    const size_t convs = (size_t)N * ((64 * 144) * 5 + (128 * 36) * 4 + (256 * 9) * 4 + (512 * 4) * 4);
    ch_backend *cpu, *plain, *rounding, *lazy;
    ch_err err;
    if (ch_backend_create("cpu", 0, 2, &cpu, &err) != CH_STATUS_OK ||
        ch_backend_create("cpu", 0, 2, &plain, &err) != CH_STATUS_OK ||
        ch_backend_create("cpu", 0, 2, &rounding, &err) != CH_STATUS_OK ||
        ch_backend_create("lazy", 0, 2, &lazy, &err) != CH_STATUS_OK)
        fail_msg("%s", err.msg);
    ch_kernels fp32_storage = *cpu->k, emulated = *cpu->k;   /* without the conversions */
    /* The kept inputs alone: the ReLU outputs passed in bf16 to convolutions, and the gradients
     * passed in bf16 from BatchNorms to convolutions, are the next tests'. */
    ch_kernels kept_only = *cpu->k;
    kept_only.bn_relu_forward_to_bf16 = NULL;
    kept_only.bn_backward_data_to_bf16 = NULL;
    cpu->k = &kept_only;
    fp32_storage.channel_affine_keep_bf16 = emulated.channel_affine_keep_bf16 = NULL;
    fp32_storage.conv2d_out_bf16 = emulated.conv2d_out_bf16 = NULL;
    /* The ReLUs after BatchNorms and the sums over them apart, so that every BatchNorm normalises
     * through channel_affine (the cpu backend's fused ones give the same bits: kernels.h). */
    fp32_storage.bn_relu_forward = emulated.bn_relu_forward = NULL;
    fp32_storage.bn_add_forward = emulated.bn_add_forward = NULL;
    emulated.channel_affine = affine_then_round_input;
    emulated.conv2d_forward = conv_then_round_output;
    plain->k = &fp32_storage;
    rounding->k = &emulated;
    float *want = malloc(sizeof(float) * P), *unrounded = malloc(sizeof(float) * P);
    float *got = malloc(sizeof(float) * P), *lz = malloc(sizeof(float) * P);
    assert_true(want && unrounded && got && lz);
    size_t saved32, scratch32, saved, scratch, saved_lz, scratch_lz;
    resnet18_step(plain, true, N, unrounded, &saved32, &scratch32);
    resnet18_step(rounding, true, N, want, &saved32, &scratch32);
    resnet18_step(cpu, true, N, got, &saved, &scratch);
    resnet18_step(lazy, true, N, lz, &saved_lz, &scratch_lz);
    assert_int_equal(saved32, 0);
    assert_int_equal(saved, 2 * convs);
    assert_int_equal(scratch, scratch32 + (size_t)64 * 144 * N);
    assert_memory_equal(got, want, sizeof(float) * P);
    assert_memory_equal(lz, want, sizeof(float) * P);
    const double e = tu_max_norm_err_f32(got, unrounded, P);
    print_message("bf16-kept BatchNorm inputs: gradients within %.2e of the unrounded model's\n", e);
    assert_true(e > 1e-4);
    free(want), free(unrounded), free(got), free(lz);
    ch_backend_free(cpu);
    ch_backend_free(plain);
    ch_backend_free(rounding);
    ch_backend_free(lazy);
}

/* The model's scratch (its remade outputs' blocks), for the kernel below. */
static uintptr_t scratch_lo, scratch_hi;

static void note_scratch(const ch_model *m)
{
    scratch_lo = (uintptr_t)m->scratch;
    scratch_hi = scratch_lo + sizeof(ch_real) * m->scratch_len;
}

/* The CPU's fused BatchNorm + ReLU, then y rounded to bf16 in place where it is a remade output
 * (in the model's scratch, not an output the model keeps) read by a convolution that takes bf16
 * input (in resnet18 the one reader of a remade bn1 + relu1 is its block's conv2, 3x3 stride 1 with
 * as many channels out as in): in an all-fp32 model, the values those convolutions then read. */
static void bn_relu_then_round_remade(const ch_kctx *kc, int n, int c, int hw, const ch_real *x, const uint16_t *xh,
                                      const ch_real *scale, const ch_real *shift, ch_real *y, uint16_t *keep)
{
    ch_kernels_cpu()->bn_relu_forward(kc, n, c, hw, x, xh, scale, shift, y, keep);
    const int side = (int)lround(sqrt(hw));
    const ch_conv_desc conv2 = { .c = c, .h = side, .w = side, .oc = c, .kh = 3, .kw = 3, .stride = 1, .pad = 1,
                                 .oh = side, .ow = side, .bf16 = true };
    if ((uintptr_t)y < scratch_lo || (uintptr_t)y >= scratch_hi || !ch_kernels_cpu()->conv2d_x_bf16(kc, &conv2, n))
        return;
    for (size_t i = 0; i < (size_t)n * c * hw; i++) y[i] = ch_bf16_to_float(ch_bf16_from_float(y[i]));
}

/* One resnet18 step (12x12 inputs, batch 5, bf16) three ways, on CPU backends: with the CPU's own
 * table (got), with a bf16 path off (unrounded), and with it off but its rounding emulated in fp32
 * (want; planned told of that model's plan first). The first two models are kept for their plans. */
enum { RR_N = 5, RR_P = 11175818 };
typedef struct rounding_run {
    ch_backend *be[3];
    ch_model *own, *off;
    float *got, *unrounded, *want;
} rounding_run;

static rounding_run rounding_run_make(const ch_kernels *off, const ch_kernels *emulated,
                                      void (*planned)(const ch_model *m))
{
    rounding_run r = { .got = malloc(sizeof(float) * RR_P), .unrounded = malloc(sizeof(float) * RR_P),
                       .want = malloc(sizeof(float) * RR_P) };
    assert_true(r.got && r.unrounded && r.want);
    ch_err err;
    for (int i = 0; i < 3; i++)
        if (ch_backend_create("cpu", 0, 2, &r.be[i], &err) != CH_STATUS_OK) fail_msg("%s", err.msg);
    r.be[1]->k = off, r.be[2]->k = emulated;
    r.own = tu_zoo_step(r.be[0], "resnet18", (ch_shape3){ 1, 12, 12 }, 4, true, RR_N, r.got);
    r.off = tu_zoo_step(r.be[1], "resnet18", (ch_shape3){ 1, 12, 12 }, 4, true, RR_N, r.unrounded);
    tu_zoo_planned = planned;
    ch_model_free(tu_zoo_step(r.be[2], "resnet18", (ch_shape3){ 1, 12, 12 }, 4, true, RR_N, r.want));
    tu_zoo_planned = NULL;
    return r;
}

/* got is want bit for bit, and not unrounded; everything freed. */
static void rounding_run_check(rounding_run *r)
{
    ch_model_free(r->own);
    ch_model_free(r->off);
    assert_memory_equal(r->got, r->want, sizeof(float) * RR_P);
    assert_memory_not_equal(r->got, r->unrounded, sizeof(float) * RR_P);
    free(r->got), free(r->want), free(r->unrounded);
    for (int i = 0; i < 3; i++) ch_backend_free(r->be[i]);
}

/* --precision bf16 passes each remade BatchNorm + ReLU output whose one reader is a convolution that
 * takes its input in bf16 (graph/exec.c, plan_bf16_inputs; resnet18: bn1's, read by conv2, in the
 * 6 blocks of its first three stages, cohort's F(4x4, 3x3); the last stage's 2x2 planes, one tile
 * of 36 products against 36 direct ones, are not Winograd's) to it in bf16. The plan counts exactly
 * those values (saved bytes and scratch unchanged), and the step's gradients are, bit for bit,
 * those of the model whose outputs are fp32 but rounded where those are made and remade, and not
 * those of the model that leaves them unrounded. */
static void resnet18_bf16_passes_relu_outputs_in_bf16(void **state)
{
    (void)state;
    ch_kernels fp32_inputs = *ch_kernels_cpu(), emulated = *ch_kernels_cpu();
    fp32_inputs.bn_relu_forward_to_bf16 = emulated.bn_relu_forward_to_bf16 = NULL;
    emulated.bn_relu_forward = bn_relu_then_round_remade;
    rounding_run r = rounding_run_make(&fp32_inputs, &emulated, note_scratch);
    assert_int_equal(r.own->bf16_inputs, (size_t)RR_N * 2 * (64 * 144 + 128 * 36 + 256 * 9));
    assert_int_equal(r.off->bf16_inputs, 0);
    assert_int_equal(r.own->saved_bytes, r.off->saved_bytes);
    assert_int_equal(r.own->scratch_len, r.off->scratch_len);
    rounding_run_check(&r);
}

/* The CPU's convolution backward passes, dy first rounded to bf16 in place for the layers whose
 * backward reads it in bf16 (conv2d_dy_bf16): in a model whose gradients are all fp32, the values
 * those layers then read, from BatchNorm backward passes that wrote them unrounded. (dy is the
 * layer's own: its BatchNorm's dx, read by nothing else.) */
static void round_dy_for(const ch_kctx *kc, const ch_conv_desc *d, int n, ch_real *dy)
{
    if (!ch_kernels_cpu()->conv2d_dy_bf16(kc, d, n)) return;
    for (size_t i = 0; i < (size_t)n * d->oc * d->oh * d->ow; i++) dy[i] = ch_bf16_to_float(ch_bf16_from_float(dy[i]));
}

static bool backward_of_rounded_dy(const ch_kctx *kc, const ch_conv_desc *d, int n, const ch_real *x,
                                   const ch_real *y, ch_real *dy, const ch_real *w, ch_real *dx, ch_real *dw, ch_real *db)
{
    round_dy_for(kc, d, n, dy);
    return ch_kernels_cpu()->conv2d_backward(kc, d, n, x, y, dy, w, dx, dw, db);
}

static void backward_of_bf16_rounded_dy(const ch_kctx *kc, const ch_conv_desc *d, int n, const uint16_t *x,
                                        const ch_real *y, ch_real *dy, const ch_real *w, ch_real *dx, ch_real *dw,
                                        ch_real *db)
{
    round_dy_for(kc, d, n, dy);
    ch_kernels_cpu()->conv2d_backward_of_bf16(kc, d, n, x, y, dy, w, dx, dw, db);
}

/* --precision bf16 passes the gradient of each kept BatchNorm input whose maker reads it in bf16
 * (graph/exec.c, plan_halves; resnet18: the outputs of the 3x3 stride-1 convolutions of its
 * first three stages, cohort's F(4x4, 3x3): 4 at 64@12x12, 3 in each of the next two stages) from
 * the BatchNorm's backward to the convolution's in bf16, over the kept copy. The plan counts
 * exactly those values; their gradients take no scratch block; the step's gradients are, bit for
 * bit, those of the model whose gradients are fp32 but rounded where those convolutions read
 * them, and not those of the model that leaves them unrounded. */
static void resnet18_bf16_passes_conv_grads_in_bf16(void **state)
{
    (void)state;
    ch_kernels fp32_grads = *ch_kernels_cpu(), emulated = *ch_kernels_cpu();
    fp32_grads.bn_backward_data_to_bf16 = emulated.bn_backward_data_to_bf16 = NULL;
    emulated.conv2d_backward = backward_of_rounded_dy;
    emulated.conv2d_backward_of_bf16 = backward_of_bf16_rounded_dy;
    rounding_run r = rounding_run_make(&fp32_grads, &emulated, NULL);
    assert_int_equal(r.own->bf16_grads, (size_t)RR_N * (4 * 64 * 144 + 3 * 128 * 36 + 3 * 256 * 9));
    assert_int_equal(r.off->bf16_grads, 0);
    assert_int_equal(r.own->saved_bytes, r.off->saved_bytes);
    assert_true(r.own->scratch_len < r.off->scratch_len);
    print_message("bf16 convolution output gradients: scratch %zu -> %zu values\n", r.off->scratch_len,
                  r.own->scratch_len);
    rounding_run_check(&r);
}

/* The kernels' workspace belongs to the backend (ch_backend_reserve_workspace): a model planned
 * after a smaller one on the same backend grows it to its own need, and computes the bits it
 * computes on a backend of its own (on the lazy backend, whose memory reads as garbage to a
 * kernel that strays outside what it was given). */
static void models_on_one_backend_share_its_workspace(void **state)
{
    (void)state;
    enum { N = 6 };
    ch_backend *shared, *own;
    ch_err err;
    if (ch_backend_create("lazy", 0, 2, &shared, &err) != CH_STATUS_OK ||
        ch_backend_create("lazy", 0, 2, &own, &err) != CH_STATUS_OK)
        fail_msg("%s", err.msg);
    ch_model *small;
    if (ch_zoo_model("linear", (ch_shape3){ 1, 12, 12 }, 10, shared, &small, &err) != CH_STATUS_OK ||
        ch_model_plan(small, 1, 1, &err) != CH_STATUS_OK)
        fail_msg("%s", err.msg);
    const size_t before = shared->ws->len;
    float x[N * 144], a[N * 10], b[N * 10];
    for (int i = 0; i < N * 144; i++) x[i] = (float)((i * 37) % 101) / 50.0f - 1.0f;
    resnet18_logits(shared, N, x, a);
    assert_true(shared->ws->len > before);   /* resnet18's 3x3 convolutions need far more */
    resnet18_logits(own, N, x, b);
    assert_memory_equal(a, b, sizeof a);
    ch_model_free(small);
    ch_backend_free(shared);
    ch_backend_free(own);
}

/* Names and shapes equal PyTorch's state_dict() (fixture written by make_state_dicts.py). The
 * order is the graph's, which is PyTorch's where modules are registered in the order they run
 * (d2l's Residual registers conv3 before bn1, and runs it after bn2). */
static void state_dict_matches_pytorch(void **state)
{
    (void)state;
    static const char *const archs[] = { "lenet", "mnist-cnn", "mlp", "resnet18", "linear", "resnet18-imagenet" };
    FILE *f = fopen(COHORT_FIXTURES "/state_dicts.txt", "r");
    assert_non_null(f);
    char line[256];
    for (size_t a = 0; a < sizeof archs / sizeof archs[0]; a++) {
        /* torchvision's ResNet-18 takes RGB images. */
        const bool rgb = strcmp(archs[a], "resnet18-imagenet") == 0;
        ch_model *m = make(archs[a], rgb ? (ch_shape3){ 3, 64, 64 } : (ch_shape3){ 1, 28, 28 });
        int seen = 0;
        size_t param_total = 0;
        rewind(f);
        while (fgets(line, sizeof line, f)) {
            char arch[32], name[128], shape[64];
            assert_int_equal(sscanf(line, "%31s %127s %63s", arch, name, shape), 3);
            if (strcmp(arch, archs[a]) != 0) continue;
            assert_true(seen < m->ntensors);
            const ch_tensor_ref *t = ch_model_find(m, name);
            if (!t) fail_msg("%s: no tensor %s", archs[a], name);
            if (strcmp(archs[a], "resnet18") != 0) assert_string_equal(m->tensors[seen].name, name);
            seen++;
            char mine[64] = "scalar";
            if (t->spec) {
                int at = 0;
                for (int d = 0; d < t->spec->ndim; d++)
                    at += snprintf(mine + at, sizeof mine - (size_t)at, "%s%lld", d ? "x" : "",
                                   (long long)t->spec->dims[d]);
            }
            assert_string_equal(mine, shape);
            if (t->kind == CH_TENSOR_PARAM) param_total += t->spec->count;
        }
        assert_int_equal(seen, m->ntensors);
        assert_int_equal(param_total, m->nparams);
        ch_model_free(m);
    }
    fclose(f);
}

static void default_init_is_pytorchs_and_seeded(void **state)
{
    (void)state;
    ch_err err;
    ch_model *a = make("lenet", (ch_shape3){ 1, 28, 28 }), *b = make("lenet", (ch_shape3){ 1, 28, 28 });
    assert_int_equal(ch_model_init_params(a, "default", 1, &err), CH_STATUS_OK);
    assert_int_equal(ch_model_init_params(b, "default", 1, &err), CH_STATUS_OK);
    assert_memory_equal(a->params, b->params, sizeof(ch_real) * a->nparams);
    /* 3.weight: fan_in 20*5*5 = 500, uniform in +-1/sqrt(500). */
    const ch_tensor_ref *w = ch_model_find(a, "3.weight");
    assert_non_null(w);
    double bound = 1 / sqrt(500.0), mx = 0, s2 = 0;
    for (size_t i = 0; i < w->spec->count; i++) {
        mx = fmax(mx, fabs(w->data[i]));
        s2 += (double)w->data[i] * w->data[i];
    }
    assert_true(mx <= bound && mx > 0.99 * bound);
    assert_true(fabs(sqrt(s2 / w->spec->count) - bound / sqrt(3.0)) < 0.02 * bound);
    assert_int_equal(ch_model_init_params(b, "default", 2, &err), CH_STATUS_OK);
    assert_memory_not_equal(a->params, b->params, sizeof(ch_real) * a->nparams);
    ch_model_free(a);
    ch_model_free(b);
}

static void normal_init_and_bad_specs(void **state)
{
    (void)state;
    ch_err err;
    ch_model *m = make("resnet18", (ch_shape3){ 1, 28, 28 });
    assert_int_equal(ch_model_init_params(m, "normal:0.01", 1, &err), CH_STATUS_OK);
    const ch_tensor_ref *w = ch_model_find(m, "resnet_block3.0.conv1.weight");
    const ch_tensor_ref *b = ch_model_find(m, "fc.1.bias"), *g = ch_model_find(m, "1.weight");
    const ch_tensor_ref *rv = ch_model_find(m, "1.running_var");
    assert_true(w && b && g && rv);
    double s2 = 0;
    for (size_t i = 0; i < w->spec->count; i++) s2 += (double)w->data[i] * w->data[i];
    assert_true(fabs(sqrt(s2 / w->spec->count) - 0.01) < 0.0005);
    assert_true(b->data[0] == 0 && g->data[5] == 1 && rv->data[3] == 1);
    assert_int_equal(ch_model_init_params(m, "normal:-1", 1, &err), CH_STATUS_BAD_INPUT);
    assert_int_equal(ch_model_init_params(m, "xavier", 1, &err), CH_STATUS_BAD_INPUT);
    assert_non_null(strstr(err.msg, "--init 'xavier'"));
    ch_model_free(m);
}

static void unknown_models_and_impossible_inputs_are_refused(void **state)
{
    (void)state;
    ch_model *m = NULL;
    ch_err err;
    assert_int_equal(ch_zoo_model("vgg", (ch_shape3){ 1, 28, 28 }, 10, ch_backend_host(), &m, &err), CH_STATUS_BAD_INPUT);
    assert_non_null(strstr(err.msg, "unknown model 'vgg'"));
    assert_int_equal(ch_zoo_model("lenet", (ch_shape3){ 1, 8, 8 }, 10, ch_backend_host(), &m, &err), CH_STATUS_BAD_INPUT);
    assert_non_null(strstr(err.msg, "lenet cannot take 1x8x8"));
    assert_null(m);
}

/* Five steps of SGD against PyTorch's published update rule, evaluated here in double. */
static void sgd_follows_pytorch_update_rule(void **state)
{
    (void)state;
    enum { N = 4 };
    const double lr = 0.1, mom = 0.9, wd = 0.01;
    for (int nesterov = 0; nesterov < 2; nesterov++) {
        ch_optim o;
        ch_err err;
        ch_optim_config c = ch_optim_defaults(CH_OPTIM_SGD);
        c.momentum = mom;
        c.weight_decay = wd;
        c.nesterov = nesterov;
        assert_int_equal(ch_optim_init(&o, N, &c, ch_backend_host(), &err), CH_STATUS_OK);
        ch_real p[N] = { 1, -2, 0.5, 3 }, g[N];
        double ep[N] = { 1, -2, 0.5, 3 }, buf[N] = { 0 };
        for (int step = 0; step < 5; step++) {
            for (int i = 0; i < N; i++) g[i] = (ch_real)(0.3 * (i + 1) - 0.2 * step);
            ch_optim_step(&o, lr, p, g, 1);
            for (int i = 0; i < N; i++) {
                double d = (double)g[i] + wd * ep[i];
                buf[i] = step == 0 ? d : mom * buf[i] + d;
                ep[i] -= lr * (nesterov ? d + mom * buf[i] : buf[i]);
            }
        }
        for (int i = 0; i < N; i++) assert_true(fabs(p[i] - ep[i]) < 1e-5);
        ch_optim_free(&o);
    }
}

static ch_trainer *trainer(const char *model, ch_dataset *d, int batch, double lr, uint64_t seed)
{
    ch_train_config cfg = ch_train_config_default();
    cfg.model = model;
    cfg.batch_size = batch;
    cfg.lr = lr;
    cfg.momentum = 0.9;
    cfg.seed = seed;
    cfg.threads = 2;
    ch_trainer *t;
    ch_err err;
    if (ch_trainer_create(&cfg, d, d, &t, &err) != CH_STATUS_OK) fail_msg("%s", err.msg);
    return t;
}

static void same_seed_same_bits_and_uneven_last_batch(void **state)
{
    (void)state;
    ch_dataset *d = tu_synthetic(203, 28, 1);   /* 203 = 6 * 32 + 11: the last batch is short */
    ch_trainer *a = trainer("mnist-cnn", d, 32, 0.05, 4), *b = trainer("mnist-cnn", d, 32, 0.05, 4);
    ch_epoch_stats sa, sb;
    ch_err err;
    for (int e = 0; e < 2; e++) {
        assert_int_equal(ch_trainer_run_epoch(a, &sa, &err), CH_STATUS_OK);
        assert_int_equal(ch_trainer_run_epoch(b, &sb, &err), CH_STATUS_OK);
    }
    assert_int_equal(sa.train_images, 203);
    assert_int_equal(a->step, 14);
    assert_memory_equal(a->replicas[0].model->params, b->replicas[0].model->params,
                        sizeof(ch_real) * a->replicas[0].model->nparams);
    assert_true(sa.loss == sb.loss && sa.test_acc == sb.test_acc);
    /* The pattern is easy: two epochs must learn it. */
    assert_true(sa.test_acc > 0.5);
    ch_trainer_free(a);
    ch_trainer_free(b);
    ch_dataset_free(d);
}

static void batchnorm_running_statistics_follow_pytorch(void **state)
{
    (void)state;
    ch_dataset *d = tu_synthetic(16, 28, 2);
    ch_trainer *t = trainer("resnet18", d, 16, 0.0, 1);
    const ch_tensor_ref *rm = ch_model_find(t->replicas[0].model, "1.running_mean");
    const ch_tensor_ref *rv = ch_model_find(t->replicas[0].model, "1.running_var");
    const ch_tensor_ref *nb = ch_model_find(t->replicas[0].model, "1.num_batches_tracked");
    assert_true(rm && rv && nb);
    uint32_t idx[16];
    for (int i = 0; i < 16; i++) idx[i] = (uint32_t)i;
    double l;
    int64_t c;
    ch_err err;
    assert_int_equal(ch_trainer_step(t, idx, 16, &l, &c, &err), CH_STATUS_OK);
    /* Channel 0 of the stem conv output: mean and unbiased variance over 16*28*28 values. Backward
     * wrote the gradient over it (the parameters are unchanged at lr 0): forward again, in
     * evaluation mode, which leaves the statistics be. */
    ch_model *m = t->replicas[0].model;
    const ch_run run = ch_model_run(m, false);
    ch_model_forward(m, &run, 16, t->replicas[0].x);
    const ch_layer *conv = m->root->children[0];
    assert_string_equal(conv->name, "0");
    const size_t hw = 28 * 28, cnt = 16 * hw;
    double s = 0, s2 = 0;
    for (int n = 0; n < 16; n++)
        for (size_t j = 0; j < hw; j++) {
            double v = conv->y[(size_t)n * 64 * hw + j];
            s += v;
            s2 += v * v;
        }
    const double mean = s / cnt, var = (s2 / cnt - mean * mean) * cnt / (cnt - 1);
    assert_true(fabs(rm->data[0] - 0.1 * mean) < 1e-5);
    assert_true(fabs(rv->data[0] - (0.9 + 0.1 * var)) < 1e-4);
    assert_int_equal(*nb->counter, 1);
    ch_trainer_free(t);
    ch_dataset_free(d);
}

static void nan_check_stops_a_diverging_run(void **state)
{
    (void)state;
    ch_dataset *d = tu_synthetic(64, 28, 3);
    ch_train_config cfg = ch_train_config_default();
    cfg.model = "mlp";
    cfg.batch_size = 8;
    cfg.lr = 1e30;
    cfg.nan_check = true;
    cfg.threads = 1;
    ch_trainer *t;
    ch_err err;
    assert_int_equal(ch_trainer_create(&cfg, d, NULL, &t, &err), CH_STATUS_OK);
    ch_epoch_stats s;
    assert_int_equal(ch_trainer_run_epoch(t, &s, &err), CH_STATUS_NUMERIC);
    assert_non_null(strstr(err.msg, "the loss is"));
    ch_trainer_free(t);
    ch_dataset_free(d);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(state_dict_matches_pytorch),
        cmocka_unit_test(resnet18_backward_scratch_is_three_largest_activations),
        cmocka_unit_test(resnet18_sums_copy_nothing_in_backward),
        cmocka_unit_test(mnist_cnn_backward_scratch_is_its_first_pools_gradients),
        cmocka_unit_test(models_on_one_backend_share_its_workspace),
        cmocka_unit_test(resnet18_bf16_keeps_batchnorm_inputs_in_bf16),
        cmocka_unit_test(resnet18_bf16_passes_relu_outputs_in_bf16),
        cmocka_unit_test(resnet18_bf16_passes_conv_grads_in_bf16),
        cmocka_unit_test(default_init_is_pytorchs_and_seeded),
        cmocka_unit_test(normal_init_and_bad_specs),
        cmocka_unit_test(unknown_models_and_impossible_inputs_are_refused),
        cmocka_unit_test(sgd_follows_pytorch_update_rule),
        cmocka_unit_test(same_seed_same_bits_and_uneven_last_batch),
        cmocka_unit_test(batchnorm_running_statistics_follow_pytorch),
        cmocka_unit_test(nan_check_stops_a_diverging_run),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
