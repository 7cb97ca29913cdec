/* Data parallelism inside one process: D replicas must compute what one device computes.
 * - one step on D = 1..4 devices, even and uneven splits (one with a replica of 0 samples), gives the
 *   one-device gradient of the whole batch (lenet, mnist-cnn, resnet18 with sync-BN);
 * - resnet18 with per-replica BatchNorm gives the sum of the slices' gradients, each slice computed
 *   alone, and running statistics averaged by slice size;
 * - after 20 steps on 2 devices the replicas' parameters, buffers and momentum are bit-identical;
 * - every job shape (1-4 devices, batch 1-5, epochs whose last batch holds 1-3 samples, so that
 *   replicas often have no sample at all) ends an epoch with the one-device parameters;
 * - a failing replica stops the others: an error, never a hang. */
#include "test_util.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/rng.h"
#include "data/dataset.h"
#include "models/zoo.h"
#include "nn/model.h"
#include "train/trainer.h"

static ch_trainer *make(const char *model, const ch_dataset *d, const char *devices, int batch,
                        double lr, bool sync_bn)
{
    ch_train_config cfg = ch_train_config_default();
    cfg.model = model;
    cfg.batch_size = batch;
    cfg.lr = lr;
    cfg.seed = 7;
    cfg.threads = 2;
    cfg.devices = tu_devices(devices);
    cfg.sync_bn = sync_bn;
    cfg.bucket_mb = 0.05;   /* several buckets even for lenet: the bucket path is exercised */
    ch_trainer *t = NULL;
    ch_err err;
    if (ch_trainer_create(&cfg, d, NULL, &t, &err) != CH_STATUS_OK) fail_msg("%s", err.msg);
    assert_string_equal(t->replicas[0].be->ops->name, tu_backend);
    return t;
}

/* One step with lr 0: the parameters stay, the synced gradient stays in every replica. */
static void step_once(ch_trainer *t, int n, double *loss)
{
    uint32_t idx[64];
    for (int i = 0; i < n; i++) idx[i] = (uint32_t)(i * 3 % n);
    int64_t correct;
    ch_err err;
    if (ch_trainer_step(t, idx, n, loss, &correct, &err) != CH_STATUS_OK) fail_msg("%s", err.msg);
}

/* tu_grad_error of two models' gradients, each in its own memory. */
static double grad_error(const ch_model *ref, const ch_model *a, const ch_model *b)
{
    ch_real *ha = tu_down(a, a->grads, ref->nparams), *hb = tu_down(b, b->grads, ref->nparams);
    const double e = tu_grad_error(ref, ha, hb);
    free(ha);
    free(hb);
    return e;
}

static void assert_replicas_identical(const ch_trainer *t)
{
    const ch_model *m0 = t->replicas[0].model;
    for (int r = 1; r < t->nreplicas; r++) {
        const ch_model *m = t->replicas[r].model;
        tu_assert_same_bits(m, m->params, m0, m0->params, m0->nparams, "replicas' parameters");
        tu_assert_same_bits(m, m->grads, m0, m0->grads, m0->nparams, "replicas' gradients");
        if (m0->nbuffers) tu_assert_same_bits(m, m->buffers, m0, m0->buffers, m0->nbuffers, "replicas' buffers");
        if (m0->ncounters)
            assert_memory_equal(m->counters, m0->counters, sizeof(int64_t) * (size_t)m0->ncounters);
    }
}

static void check_equivalence(const char *model, int size, bool sync_bn, double tol)
{
    ch_dataset *d = tu_synthetic(64, size, 11);
    double worst = 0;
#ifdef CH_REAL_DOUBLE
    /* resnet18's replicas in double take most of a minute to set up: the uneven and the empty. */
    static const int batches[] = { 10, 3 };       /* 5,5; 4,3,3 and 3,3,2,2; 1,1,1,0 */
#else
    static const int batches[] = { 12, 10, 3 };   /* even for D = 1..4; 4,3,3 and 3,3,2,2; 1,1,1,0 */
#endif
    for (size_t b = 0; b < sizeof batches / sizeof *batches; b++) {
        const int n = batches[b];
        ch_trainer *one = make(model, d, "cpu:0", n, 0, false);
        double l1;
        step_once(one, n, &l1);
        const ch_model *m1 = one->replicas[0].model;
        for (int D = 2; D <= 4; D++) {
            char devices[32];
            snprintf(devices, sizeof devices, "cpu*%d", D);
            ch_trainer *many = make(model, d, devices, n, 0, sync_bn);
            double ld;
            step_once(many, n, &ld);
            assert_replicas_identical(many);
            const double e = grad_error(m1, many->replicas[0].model, m1);
            worst = fmax(worst, e);
            if (e > tol || fabs(ld - l1) > 1e-5 * fabs(l1))
                fail_msg("%s batch %d on %d devices: gradient error %.3g, loss %.9g vs %.9g", model,
                         n, D, e, ld, l1);
            if (sync_bn && m1->nbuffers) {
                /* Running statistics come from the global batch's statistics, as on one device. */
                const ch_model *mm = many->replicas[0].model;
                ch_real *hb = tu_down(mm, mm->buffers, m1->nbuffers), *h1 = tu_down(m1, m1->buffers, m1->nbuffers);
                const double eb = tu_max_norm_err(hb, h1, m1->nbuffers);
                free(hb);
                free(h1);
                if (eb > 1e-5) fail_msg("%s batch %d on %d devices: running stats error %.3g", model, n, D, eb);
            }
            ch_trainer_free(many);
        }
        ch_trainer_free(one);
    }
    print_message("%s%s: worst relative gradient error over D = 2..4, batches of %d to 3: %.2e\n",
                  model, sync_bn ? " (sync-BN)" : "", batches[0], worst);
    ch_dataset_free(d);
}

static void lenet_gradients_match_one_device(void **state)
{
    (void)state;
    check_equivalence("lenet", 28, false, 1e-5);
}

static void mnist_cnn_gradients_match_one_device(void **state)
{
    (void)state;
    check_equivalence("mnist-cnn", 28, false, 1e-5);
}

#ifdef CH_REAL_DOUBLE
static void resnet18_sync_bn_gradients_match_one_device(void **state)
{
    (void)state;
    /* In double (test_parallel_f64), for the reason every_job_shape_gives_one_device_parameters
     * gives: in float, batch 3 on 3 devices is sync-BN over one sample per device with 2x2 planes
     * in the last stage, and how a split's kernels round decides whether a pre-activation within
     * rounding of zero flips its ReLU mask (it passed at 1.2e-5 of 1e-4 on an AVX-512 Zen 5 and at
     * 7.5e-5 on a Zen 3, where one device at 1 and at 2 threads already differed by 3.8e-5). In
     * double: seen 3.8e-13; measured in float, a missing sync-BN exchange is off by > 1e-3 and a
     * member left out of the local gradient sum by 3.2. */
    check_equivalence("resnet18", 12, true, 1e-9);
}
#endif

static void resnet18_per_replica_bn_matches_per_slice_reference(void **state)
{
    (void)state;
    ch_dataset *d = tu_synthetic(32, 12, 5);
    for (int D = 2; D <= 3; D++) {
        const int n = 10;
        char devices[32];
        snprintf(devices, sizeof devices, "cpu*%d", D);
        ch_trainer *t = make("resnet18", d, devices, n, 0, false);
        double l;
        step_once(t, n, &l);
        assert_replicas_identical(t);
        uint32_t idx[64];
        for (int i = 0; i < n; i++) idx[i] = (uint32_t)(i * 3 % n);
        const ch_model *mt = t->replicas[0].model;
        ch_real *g, *b;
        ch_model *ref;
        tu_per_slice_reference(d, idx, n, D, false, &g, &b, &ref);
        ch_real *hg = tu_down(mt, mt->grads, mt->nparams), *hb = tu_down(mt, mt->buffers, mt->nbuffers);
        const double e = tu_grad_error(ref, hg, g);
        const double eb = tu_max_norm_err(hb, b, mt->nbuffers);
        free(hb);
        /* 3e-5: the slices' sums differ from the per-slice reference's in order only; with the
         * 3x3 layers in Winograd F(4x4, 3x3) (its weight gradient rounds to ~4e-6 relative) the
         * worst seen was 1.01e-5, below 1e-5 with im2col. A replica left out of the sum: 0.79. */
        if (e > 3e-5 || eb > 1e-5)
            fail_msg("per-replica BN on %d devices: gradient error %.3g, running stats error %.3g", D, e, eb);
        /* And it is not the sync-BN answer: the slices' statistics differ from the batch's. */
        ch_trainer *one = make("resnet18", d, "cpu:0", n, 0, false);
        step_once(one, n, &l);
        ch_real *h1 = tu_down(one->replicas[0].model, one->replicas[0].model->grads, mt->nparams);
        assert_true(tu_grad_error(ref, hg, h1) > 1e-3);
        free(h1);
        free(hg);
        ch_trainer_free(one);
        ch_model_free(ref);
        free(g);
        free(b);
        ch_trainer_free(t);
    }
    ch_dataset_free(d);
}

/* 20 steps with momentum, weight decay and an uneven last batch: the replicas never drift apart. */
static void replicas_stay_bit_identical(void **state)
{
    (void)state;
    static const struct { const char *model; int size; } cases[] = { { "lenet", 28 }, { "resnet18", 12 } };
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        ch_dataset *d = tu_synthetic(150, cases[c].size, 3);
        ch_train_config cfg = ch_train_config_default();
        cfg.model = cases[c].model;
        cfg.batch_size = 15;    /* 150 / 15 = 10 steps an epoch, 8 + 7 samples per replica */
        cfg.lr = 0.05;
        cfg.momentum = 0.9;
        cfg.weight_decay = 5e-4;
        cfg.threads = 2;
        cfg.devices = tu_devices("cpu:0,cpu:1");
        cfg.bucket_mb = 0.1;
        ch_trainer *t;
        ch_err err;
        if (ch_trainer_create(&cfg, d, d, &t, &err) != CH_STATUS_OK) fail_msg("%s", err.msg);
        ch_epoch_stats s;
        for (int e = 0; e < 2; e++)
            if (ch_trainer_run_epoch(t, &s, &err) != CH_STATUS_OK) fail_msg("%s", err.msg);
        assert_int_equal(t->step, 20);
        assert_replicas_identical(t);
        const ch_replica *a = &t->replicas[0], *b = &t->replicas[1];
        tu_assert_same_bits(a->model, a->opt.state[0], b->model, b->opt.state[0], a->opt.n, "replicas' momentum");
        /* Learning happened (the parameters moved away from their start and the data is easy; chance
         * is 0.1). In training accuracy or in test accuracy: after 20 steps resnet18's eval-mode
         * accuracy rests on BatchNorm running averages still 12% from their start (momentum 0.1),
         * and on an AVX-512 CPU (Winograd kernels) it measured 0.16 while the second epoch trained
         * at 0.41; lenet, the other way round, tests at 0.79 after a second epoch at 0.19. */
        print_message("%s: epoch 2 train acc %.3f, test acc %.3f\n", cases[c].model, s.train_acc, s.test_acc);
        assert_true(s.train_acc > 0.3 || s.test_acc > 0.3);
        ch_trainer_free(t);
        ch_dataset_free(d);
    }
}

/* The lazy backend (kernels/lazy/: memory the host cannot read, work run only when something waits
 * for it) gives the CPU backend's bits: every epoch figure, and every parameter, buffer and
 * optimizer state. A wait left out in a step (before the loss is read, before a bucket's
 * download, before the optimizer) reads values not yet computed, and shows here. */
static void lazy_backend_gives_the_cpu_bits(void **state)
{
    (void)state;
    static const struct { const char *model; int size; bool sync_bn; int accum, devices; } cases[] = {
        { "lenet", 28, false, 1, 2 }, { "resnet18", 12, true, 2, 2 }, { "resnet18", 12, false, 1, 2 },
        { "lenet", 28, false, 1, 1 },   /* no gradient sync: nothing waits on the step but the host */
    };
    /* Under the sanitizers (COHORT_SANITIZED=1) the plain resnet18 case is left to the release pass:
     * 30 s there, and the sync-BN case runs the same layers and more. */
    const bool sanitized = tu_sanitized();
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        if (sanitized && strcmp(cases[c].model, "resnet18") == 0 && !cases[c].sync_bn) continue;
        ch_dataset *d = tu_synthetic(26, cases[c].size, 9);
        const ch_train_config cfg = tu_lazy_job(cases[c].model, cases[c].sync_bn, cases[c].accum, 1);
        const double loss = tu_lazy_gives_cpu_bits(&cfg, d, cases[c].devices, NULL);
        print_message("%s%s, accum %d: 2 epochs on cpu*%d and lazy*%d, the same bits (loss %.6f)\n", cases[c].model,
                      cases[c].sync_bn ? " sync-BN" : "", cases[c].accum, cases[c].devices, cases[c].devices, loss);
        ch_dataset_free(d);
    }
}

/* A BatchNorm's fused ReLU whose output is the model's (graph/exec.c): its dy is the loss's, not a
 * block the BatchNorm could read, so the ReLU's backward runs apart, its forward in the BatchNorm.
 * The lazy backend (no fused kernels) gives the same bits. */
static void fused_relu_at_the_output_gives_the_cpu_bits(void **state)
{
    (void)state;
    ch_graph *g;
    ch_err err;
    assert_int_equal(ch_graph_create("relu-out", &g, &err), CH_STATUS_OK);
    const ch_batchnorm_args bn = { .eps = 1e-3, .momentum = 0.3 };
    int x = ch_graph_flatten(g, "flat", ch_graph_input(g, "x", 1, 12, 12));
    x = ch_graph_relu(g, "relu", ch_graph_batchnorm1d(g, "bn", ch_graph_linear(g, "fc", x, 10, true), &bn));
    assert_int_equal(ch_graph_output(g, x), CH_STATUS_OK);
    ch_dataset *d = tu_synthetic(26, 12, 9);
    ch_train_config cfg = tu_lazy_job(NULL, false, 1, 1);
    cfg.graph = g;
    const double loss = tu_lazy_gives_cpu_bits(&cfg, d, 2, NULL);
    print_message("BatchNorm1d + ReLU as the output: 2 epochs on cpu*2 and lazy*2, the same bits (loss %.6f)\n", loss);
    ch_dataset_free(d);
    ch_graph_free(g);
}

/* Same-shaped sums over a BatchNorm's output in place (graph/exec.c, bn_add_forward): the sum does
 * the BatchNorm's normalising pass with the other operand, and the in-place ReLU after it where
 * there is one. Here: a downsampling block whose shortcut's BatchNorm comes after bn2 (bn2's pass
 * waits for the sum, past the shortcut), the shortcut's output remade for the sum; a sum with the
 * BatchNorm as its second operand and no ReLU after it (MobileNetV2's); eps and momentum not
 * PyTorch's. The lazy backend (no fused kernel) runs them apart and must give the CPU's bits. */
static ch_graph *bn_sums_graph(void)
{
    ch_graph *g;
    ch_err err;
    if (ch_graph_create("bn-sums", &g, &err) != CH_STATUS_OK) fail_msg("%s", err.msg);
    const ch_batchnorm_args bn = { .eps = 1e-3, .momentum = 0.3 };
    const int x = ch_graph_input(g, "x", 1, 12, 12);
    int y = ch_graph_conv2d(g, "conv1", x, &(ch_conv2d_args){ .out_channels = 8, .kernel = 3, .padding = 1 });
    y = ch_graph_relu(g, "relu1", ch_graph_batchnorm2d(g, "bn1", y, &bn));
    y = ch_graph_batchnorm2d(g, "bn2", ch_graph_conv2d(g, "conv2", y, &(ch_conv2d_args){ .out_channels = 8, .kernel = 3,
                                                                                        .padding = 1, .no_bias = true }), &bn);
    int s = ch_graph_conv2d(g, "down", x, &(ch_conv2d_args){ .out_channels = 8, .kernel = 1, .no_bias = true });
    s = ch_graph_batchnorm2d(g, "down_bn", s, &bn);
    const int h = ch_graph_relu(g, "relu2", ch_graph_add(g, "add1", y, s));
    y = ch_graph_conv2d(g, "conv3", h, &(ch_conv2d_args){ .out_channels = 8, .kernel = 3, .padding = 1 });
    y = ch_graph_add(g, "add2", h, ch_graph_batchnorm2d(g, "bn3", y, &bn));
    y = ch_graph_linear(g, "fc", ch_graph_flatten(g, "flat", y), 10, true);
    if (ch_graph_output(g, y) != CH_STATUS_OK) fail_msg("bn-sums");
    return g;
}

/* The sum's BatchNorm reads, at the sum's place, a BatchNorm output that is not kept (remade in
 * backward): its block in forward must live until the sum, past bn_b's own remade output. */
static ch_graph *bn_chain_sum_graph(void)
{
    ch_graph *g;
    ch_err err;
    if (ch_graph_create("bn-chain-sum", &g, &err) != CH_STATUS_OK) fail_msg("%s", err.msg);
    const ch_batchnorm_args bn = { .eps = 1e-3, .momentum = 0.3 };
    const int x = ch_graph_flatten(g, "flat", ch_graph_input(g, "x", 1, 12, 12));
    int a = ch_graph_batchnorm1d(g, "bn_a0", ch_graph_linear(g, "fc1", x, 96, true), &bn);
    a = ch_graph_batchnorm1d(g, "bn_a", a, &bn);
    const int b = ch_graph_batchnorm1d(g, "bn_b", ch_graph_linear(g, "fc2", x, 96, false), &bn);
    const int h = ch_graph_relu(g, "relu", ch_graph_add(g, "sum", a, b));
    if (ch_graph_output(g, ch_graph_linear(g, "fc3", h, 10, true)) != CH_STATUS_OK) fail_msg("bn-chain-sum");
    return g;
}

static void bn_sums_give_the_cpu_bits(void **state)
{
    (void)state;
    ch_graph *(*const make[])(void) = { bn_sums_graph, bn_chain_sum_graph };
    const char *what[] = { "two blocks", "a remade input" };
    ch_dataset *d = tu_synthetic(26, 12, 9);
    for (int i = 0; i < 2; i++) {
        ch_graph *g = make[i]();
        ch_train_config cfg = tu_lazy_job(NULL, false, 1, 1);
        cfg.graph = g;
        const double loss = tu_lazy_gives_cpu_bits(&cfg, d, 2, NULL);
        print_message("BatchNorm + sum (+ ReLU), %s: 2 epochs on cpu*2 and lazy*2, the same bits (loss %.6f)\n",
                      what[i], loss);
        ch_graph_free(g);
    }
    ch_dataset_free(d);
}

/* Data sizes for batch B: whole batches only, and a last batch of 1, 2 or 3 samples. */
static int shape_sizes(int B, int out[4])
{
    int k = 0;
    out[k++] = 2 * B;
    for (int r = 1; r <= 3 && r < B; r++) out[k++] = 2 * B + r;
    return k;
}

static void check_job_shapes(const char *model, int side, double lr, bool sync_bn, int max_batch,
                             double tol)
{
    ch_dataset *d = tu_synthetic(16, side, 21);
    double worst = 0;
    for (int B = 1; B <= max_batch; B++) {
        int sizes[4];
        const int k = shape_sizes(B, sizes);
        for (int i = 0; i < k; i++) {
            d->n = (size_t)sizes[i];
            for (int D = 2; D <= 4; D++) {
                char devices[16];
                snprintf(devices, sizeof devices, "cpu*%d", D);
                const double e = tu_job_shape_error(model, d, devices, B, lr, sync_bn, true);
                if (!(e <= tol))
                    fail_msg("%s: %d samples, batch %d, %d devices: parameters %.3g from one device (> %g)",
                             model, sizes[i], B, D, e, tol);
                worst = fmax(worst, e);
            }
        }
    }
    d->n = 16;
    print_message("%s%s: job shapes 1-4 devices x batch 1-%d: worst parameter error %.2e\n", model,
                  sync_bn ? " (sync-BN)" : "", max_batch, worst);
    ch_dataset_free(d);
}

static void every_job_shape_gives_one_device_parameters(void **state)
{
    (void)state;
#ifdef CH_REAL_DOUBLE
    /* Sync-BN job shapes in double (test_parallel_f64), on the BatchNorm net. They ran on resnet18
     * in float (lr 0.002, 5e-4), where BatchNorm over slices of 0-1 samples with 2x2 planes in the
     * last stage meets pre-activations within rounding of zero, and how a kernel rounds depends on
     * the batch it is given (oneDNN picks its GEMM and Winograd kernels by shape): one ReLU mask
     * could flip between a split and one device and move every gradient by ~0.5% (seen on an
     * AVX-512 Zen 5: 1.3e-3 in the parameters after an epoch, 7.6e-4 with im2col alone). In double
     * resnet18's took 155 s of replica set-up; the net's take 0.2 s and end equal in the float
     * parameters (seen 0); the statistics' exchange skipped: 2.2e-2. */
    check_job_shapes(TU_BN_NET, 12, 0.05, true, 3, 1e-6);
#else
    check_job_shapes("linear", 28, 0.05, false, 5, 1e-5);
    check_job_shapes("lenet", 28, 0.05, false, 5, 1e-5);
#endif
}

/* --accum-steps: an epoch of lenet (no BatchNorm) with every device's part of a batch run as K
 * micro-batches equals whole batches on one device, float rounding apart: K dividing the slice,
 * not dividing it, and larger than it (micro-batches of 0 samples); the epoch's reported loss and
 * training accuracy are one device's too (a micro-batch's loss counted twice passed the parameters'
 * check). */
static void accumulation_equals_whole_batches(void **state)
{
    (void)state;
    /* The batch of 10 over 3 devices (micro-batches of 0 to 2 samples) on 200 samples: its 60 steps
     * of 8 micro-batches on 600 took most of this test's 48 s under the sanitizers. */
    static const struct { const char *devices; int batch, accum, samples; } cases[] = {
        { "cpu:0", 256, 4, 600 }, { "cpu:0,cpu:1", 256, 4, 600 }, { "cpu:0,cpu:1", 100, 3, 600 },
        { "cpu*3", 10, 8, 200 },
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        ch_dataset *d = tu_synthetic((size_t)cases[i].samples, 28, 9);
        const tu_gaps g = tu_accum_gaps("lenet", d, cases[i].devices, cases[i].batch, cases[i].accum, 0.05, false,
                                        true);
        print_message("lenet [%s] batch %d in %d micro-batches: parameters %.2e, loss %.2e, accuracy %.2e from whole "
                      "batches\n", cases[i].devices, cases[i].batch, cases[i].accum, g.params, g.loss, g.acc);
        if (!(g.params <= 1e-5 && g.loss <= 1e-5 && g.acc <= 1.0 / cases[i].samples))
            fail_msg("--accum-steps %d, batch %d on [%s]: parameters %.3g (> 1e-5), loss %.3g (> 1e-5) or accuracy "
                     "%.3g (> one sample) from whole batches", cases[i].accum, cases[i].batch, cases[i].devices,
                     g.params, g.loss, g.acc);
        ch_dataset_free(d);
    }
}

/* --sync-bn --accum-steps K on a BatchNorm model: each micro-step's statistics are over that
 * micro-step's samples of every device. On copies of one sample every subset has the same
 * statistics, so 2 devices in K micro-batches equal whole batches on one device, float rounding
 * apart, only when every micro-step counts its own samples (the whole step's count passed every
 * other test: they train lenet, which has no BatchNorm). The model keeps its planes 12x12 (in
 * resnet18 they shrink to one pixel, where copies have no variance and rounding is all there is). */
static void accumulation_with_sync_bn_counts_each_micro_batch(void **state)
{
    (void)state;
    ch_dataset *d = tu_identical(40, 12, 5);
    static const struct { const char *devices; int batch, accum; } cases[] = {
        { "cpu:0,cpu:1", 8, 2 }, { "cpu:0,cpu:1", 12, 3 }, { "cpu:0", 8, 4 },
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        const tu_gaps g = tu_accum_gaps(TU_BN_NET, d, cases[i].devices, cases[i].batch, cases[i].accum, 0.05, true,
                                        true);
        print_message("bn-net --sync-bn [%s] batch %d in %d micro-batches: parameters %.2e, loss %.2e from whole "
                      "batches\n", cases[i].devices, cases[i].batch, cases[i].accum, g.params, g.loss);
        if (!(g.params <= 1e-5 && g.loss <= 1e-5))
            fail_msg("--sync-bn --accum-steps %d, batch %d on [%s]: parameters %.3g, loss %.3g from whole batches "
                     "(> 1e-5)", cases[i].accum, cases[i].batch, cases[i].devices, g.params, g.loss);
    }
    ch_dataset_free(d);
}

/* Every epoch trains on a new permutation of the whole set (seed, epoch), the same on any devices. */
static void every_epoch_reshuffles(void **state)
{
    (void)state;
    ch_dataset *d = tu_synthetic(200, 28, 8);
    uint32_t *orders[2][3];
    for (int k = 0; k < 2; k++) {
        ch_train_config cfg = ch_train_config_default();
        cfg.model = "linear";
        cfg.batch_size = 32;
        cfg.seed = 5;
        cfg.devices = tu_devices(k ? "cpu*3" : "cpu:0");
        ch_trainer *t;
        ch_err err;
        if (ch_trainer_create(&cfg, d, NULL, &t, &err) != CH_STATUS_OK) fail_msg("%s", err.msg);
        for (int e = 0; e < 3; e++) {
            ch_epoch_stats s;
            if (ch_trainer_run_epoch(t, &s, &err) != CH_STATUS_OK) fail_msg("%s", err.msg);
            orders[k][e] = malloc(sizeof(uint32_t) * d->n);
            assert_non_null(orders[k][e]);
            memcpy(orders[k][e], t->perm, sizeof(uint32_t) * d->n);
            /* A permutation: every sample once. */
            uint8_t *seen = calloc(d->n, 1);
            assert_non_null(seen);
            for (size_t i = 0; i < d->n; i++) {
                assert_true(orders[k][e][i] < d->n && !seen[orders[k][e][i]]);
                seen[orders[k][e][i]] = 1;
            }
            free(seen);
        }
        ch_trainer_free(t);
    }
    for (int e = 0; e < 3; e++) {
        for (int f = e + 1; f < 3; f++)
            if (memcmp(orders[0][e], orders[0][f], sizeof(uint32_t) * d->n) == 0)
                fail_msg("epochs %d and %d trained in the same order", e + 1, f + 1);
        assert_memory_equal(orders[0][e], orders[1][e], sizeof(uint32_t) * d->n);
    }
    for (int k = 0; k < 2; k++)
        for (int e = 0; e < 3; e++) free(orders[k][e]);
    ch_dataset_free(d);
}

/* --shuffle off (in_order): an epoch trains on the samples in the data set's order, batch after
 * batch: its parameters are the bits of steps over 0..31, 32..63, ... taken by hand, and differ
 * from a shuffled epoch's. */
static void shuffle_off_trains_in_file_order(void **state)
{
    (void)state;
    ch_dataset *d = tu_synthetic(200, 28, 8);
    ch_real *params[3];
    size_t P = 0;
    for (int k = 0; k < 3; k++) {
        ch_train_config cfg = ch_train_config_default();
        cfg.model = "linear";
        cfg.batch_size = 32;
        cfg.seed = 5;
        cfg.lr = 0.2;
        cfg.momentum = 0.7;
        cfg.devices = tu_devices("cpu:0,cpu:1");
        cfg.in_order = k < 2;
        ch_trainer *t;
        ch_err err;
        if (ch_trainer_create(&cfg, d, NULL, &t, &err) != CH_STATUS_OK) fail_msg("%s", err.msg);
        if (k == 1) {
            uint32_t idx[32];
            for (size_t at = 0; at < d->n; at += 32) {
                const int n = (int)(d->n - at < 32 ? d->n - at : 32);
                for (int i = 0; i < n; i++) idx[i] = (uint32_t)(at + (size_t)i);
                double loss;
                int64_t hits;
                if (ch_trainer_step(t, idx, n, &loss, &hits, &err) != CH_STATUS_OK) fail_msg("%s", err.msg);
            }
        } else {
            ch_epoch_stats s;
            if (ch_trainer_run_epoch(t, &s, &err) != CH_STATUS_OK) fail_msg("%s", err.msg);
        }
        const ch_model *m = t->replicas[0].model;
        P = m->nparams;
        params[k] = tu_down(m, m->params, P);
        ch_trainer_free(t);
    }
    assert_memory_equal(params[0], params[1], sizeof(ch_real) * P);
    assert_memory_not_equal(params[0], params[2], sizeof(ch_real) * P);
    for (int k = 0; k < 3; k++) free(params[k]);
    ch_dataset_free(d);
}

/* --devices scramble:K: every replica computes on the scramble backend (memory not host-visible),
 * lazy:K on the lazy one and cpu:K on the CPU backend, whatever the environment says (the
 * variable that once switched cpu lists to another backend is set here to show it no longer does). */
static void device_kind_picks_the_backend(void **state)
{
    (void)state;
    ch_dataset *d = tu_synthetic(40, 28, 3);
    setenv("COHORT_BACKEND", "scramble", 1);
    const char *lists[3] = { "scramble*2", "cpu:0", "lazy:0,lazy:1" };
    for (int k = 0; k < 3; k++) {
        ch_train_config cfg = ch_train_config_default();
        cfg.model = "linear";
        cfg.batch_size = 8;
        cfg.devices = lists[k];
        ch_trainer *t;
        ch_err err;
        if (ch_trainer_create(&cfg, d, NULL, &t, &err) != CH_STATUS_OK) fail_msg("%s", err.msg);
        const char *want = k == 0 ? "scramble" : k == 2 ? "lazy" : "cpu";
        for (int r = 0; r < t->nreplicas; r++) assert_string_equal(t->replicas[r].be->ops->name, want);
        ch_trainer_free(t);
    }
    unsetenv("COHORT_BACKEND");
    ch_dataset_free(d);
}

static void device_lists_parse_and_reject(void **state)
{
    (void)state;
    ch_device_list l;
    ch_err err;
    char text[128];
    assert_int_equal(ch_device_list_parse("cpu:0,cpu:1", &l, &err), CH_STATUS_OK);
    assert_int_equal(l.count, 2);
    assert_int_equal(ch_device_list_parse("cpu:0-3", &l, &err), CH_STATUS_OK);
    assert_int_equal(l.count, 4);
    assert_int_equal(l.dev[3].index, 3);
    assert_int_equal(ch_device_list_parse("cpu*3", &l, &err), CH_STATUS_OK);
    ch_device_list_format(&l, text, sizeof text);
    assert_string_equal(text, "cpu:0, cpu:1, cpu:2");
    assert_int_equal(ch_device_list_parse("cpu:0, cpu:2-3", &l, &err), CH_STATUS_OK);
    assert_int_equal(l.count, 3);
    /* The test backend's devices: their kind picks the backend. */
    assert_int_equal(ch_device_list_parse("scramble:1,scramble:3", &l, &err), CH_STATUS_OK);
    assert_int_equal(l.dev[1].kind, CH_DEVICE_SCRAMBLE);
    ch_device_list_format(&l, text, sizeof text);
    assert_string_equal(text, "scramble:1, scramble:3");
    /* GPUs parse here whether or not the machine has any (the backend says so when it starts). */
    assert_int_equal(ch_device_list_parse("cuda:0-1", &l, &err), CH_STATUS_OK);
    assert_int_equal(l.dev[1].kind, CH_DEVICE_CUDA);
    ch_device_list_format(&l, text, sizeof text);
    assert_string_equal(text, "cuda:0, cuda:1");
    /* KIND:local is the device of this process's local rank (0 outside mpirun; tests/mpi_local.sh
     * runs it on two ranks). */
    assert_int_equal(ch_device_list_parse("cuda:local", &l, &err), CH_STATUS_OK);
    assert_int_equal(l.count, 1);
    assert_int_equal(l.dev[0].kind, CH_DEVICE_CUDA);
    assert_int_equal(l.dev[0].index, ch_world_local_rank());
    assert_int_equal(ch_device_list_parse("lazy:2, lazy:local", &l, &err), CH_STATUS_OK);
    ch_device_list_format(&l, text, sizeof text);
    assert_string_equal(text, "lazy:2, lazy:0");
    static const char *bad[] = { "", "cpu", "cpu:", "cpu:x", "cpu:0,cpu:0", "cpu:3-1", "cpu*0",
                                 "gpu:0", "cpu:0;cpu:1", "cpu:99", "cpu:0,", "cuda:0,cpu:1", "cpu:0,scramble:1",
                                 "scramble*2,cpu:0", "scrambled:0", "scramble:0,scramble:0", "cpux:0",
                                 "cuda:local-3", "cuda:localx", "cuda:local2", "cpu:local,cpu:0", "cuda:loca",
                                 "cuda:local*2" };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        err.msg[0] = '\0';
        if (ch_device_list_parse(bad[i], &l, &err) != CH_STATUS_BAD_INPUT)
            fail_msg("'%s' was accepted", bad[i]);
        assert_true(strlen(err.msg) > 0);
    }
}

static void uneven_split_follows_the_rule(void **state)
{
    (void)state;
    int off, cnt;
    const int want[3][2] = { { 0, 4 }, { 4, 3 }, { 7, 3 } };
    for (int r = 0; r < 3; r++) {
        ch_trainer_slice(10, 3, r, &off, &cnt);
        assert_int_equal(off, want[r][0]);
        assert_int_equal(cnt, want[r][1]);
    }
    ch_trainer_slice(3, 4, 3, &off, &cnt);
    assert_int_equal(cnt, 0);
}

static void failing_replica_stops_everyone(void **state)
{
    (void)state;
    ch_dataset *d = tu_synthetic(64, 28, 9);
    static const struct { const char *fault; ch_status want; const char *says; } cases[] = {
        { "error:2:3", CH_STATUS_SYSTEM, "injected fault on cpu:2" },
        { "nan:1:2", CH_STATUS_NUMERIC, "the loss is nan on cpu:1" },
    };
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        setenv("COHORT_INJECT_FAULT", cases[c].fault, 1);
        ch_train_config cfg = ch_train_config_default();
        cfg.model = "lenet";
        cfg.batch_size = 16;
        cfg.devices = tu_devices("cpu*3");
        cfg.nan_check = true;
        cfg.bucket_mb = 0.05;
        ch_trainer *t;
        ch_err err;
        if (ch_trainer_create(&cfg, d, NULL, &t, &err) != CH_STATUS_OK) fail_msg("%s", err.msg);
        ch_epoch_stats s;
        assert_int_equal(ch_trainer_run_epoch(t, &s, &err), cases[c].want);
        const char *says = tu_devices(cases[c].says);   /* "on lazy:2" under --backend=lazy */
        if (!strstr(err.msg, says)) fail_msg("message '%s' lacks '%s'", err.msg, says);
        /* The trainer refuses to go on from a state where the replicas may disagree. */
        assert_int_not_equal(ch_trainer_run_epoch(t, &s, &err), CH_STATUS_OK);
        assert_non_null(strstr(err.msg, "stopped after a failure"));
        ch_trainer_free(t);
    }
    setenv("COHORT_INJECT_FAULT", "alloc:1", 1);
    ch_train_config cfg = ch_train_config_default();
    cfg.model = "lenet";
    cfg.devices = "cpu*2";
    ch_trainer *t = NULL;
    ch_err err;
    assert_int_equal(ch_trainer_create(&cfg, d, NULL, &t, &err), CH_STATUS_SYSTEM);
    assert_null(t);
    assert_non_null(strstr(err.msg, "cpu:1"));
    unsetenv("COHORT_INJECT_FAULT");
    ch_dataset_free(d);
}

/* An argument runs only the tests whose names match it (a cmocka pattern: "lazy_*"). */
int main(int argc, char **argv)
{
    tu_take_backend(&argc, argv);   /* --backend=lazy: ctest's parallel_lazy */
    if (argc > 1) cmocka_set_test_filter(argv[1]);
    if (argc > 2) cmocka_set_skip_filter(argv[2]);   /* ctest's shorter runs (tests/CMakeLists.txt) */
#ifdef CH_REAL_DOUBLE
    /* test_parallel_f64: the BatchNorm equivalences whose float runs measured rounding. */
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(resnet18_sync_bn_gradients_match_one_device),
        cmocka_unit_test(every_job_shape_gives_one_device_parameters),
    };
#else
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(device_lists_parse_and_reject),
        cmocka_unit_test(uneven_split_follows_the_rule),
        cmocka_unit_test(lenet_gradients_match_one_device),
        cmocka_unit_test(mnist_cnn_gradients_match_one_device),
        cmocka_unit_test(resnet18_per_replica_bn_matches_per_slice_reference),
        cmocka_unit_test(replicas_stay_bit_identical),
        cmocka_unit_test(every_job_shape_gives_one_device_parameters),
        cmocka_unit_test(accumulation_equals_whole_batches),
        cmocka_unit_test(accumulation_with_sync_bn_counts_each_micro_batch),
        cmocka_unit_test(every_epoch_reshuffles),
        cmocka_unit_test(shuffle_off_trains_in_file_order),
        cmocka_unit_test(device_kind_picks_the_backend),
        cmocka_unit_test(failing_replica_stops_everyone),
        cmocka_unit_test(fused_relu_at_the_output_gives_the_cpu_bits),
        cmocka_unit_test(bn_sums_give_the_cpu_bits),
        cmocka_unit_test(lazy_backend_gives_the_cpu_bits),   /* last: see below */
    };
#endif
    size_t n = sizeof tests / sizeof *tests;
#ifndef CH_REAL_DOUBLE
    /* lazy_backend_gives_the_cpu_bits names its devices (cpu*D against lazy*D), so under
     * --backend=lazy (parallel_lazy) it would repeat this program's own run bit for bit: 21 s of
     * CI's release pass. That run leaves it out. */
    if (strcmp(tu_backend, "lazy") == 0) n--;
#endif
    return _cmocka_run_group_tests("test_parallel", tests, n, NULL, NULL);
}
