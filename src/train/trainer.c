/* The training loop on one device: epoch order, steps, evaluation, metrics. */
#include "train/trainer.h"

#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/clock.h"
#include "core/rng.h"
#include "core/status.h"

ch_train_config ch_train_config_default(void)
{
    return (ch_train_config){ .model = "lenet", .init = "default", .epochs = 10,
                              .batch_size = 256, .lr = 0.1, .seed = 0, .threads = 0 };
}

static ch_status check_config(const ch_train_config *c, ch_err *err)
{
    if (!c->model) return ch_fail(err, CH_STATUS_BAD_INPUT, "no model given");
    if (c->epochs < 0) return ch_fail(err, CH_STATUS_BAD_INPUT, "epochs %d < 0", c->epochs);
    if (c->batch_size < 1 || c->batch_size > (1 << 20))
        return ch_fail(err, CH_STATUS_BAD_INPUT, "batch size %d, expected 1..1048576", c->batch_size);
    if (!(c->lr >= 0) || !isfinite(c->lr))
        return ch_fail(err, CH_STATUS_BAD_INPUT, "learning rate %g, expected a finite value >= 0", c->lr);
    if (!(c->momentum >= 0 && c->momentum < 1))
        return ch_fail(err, CH_STATUS_BAD_INPUT, "momentum %g, expected 0 <= m < 1", c->momentum);
    if (!(c->weight_decay >= 0) || !isfinite(c->weight_decay))
        return ch_fail(err, CH_STATUS_BAD_INPUT, "weight decay %g, expected >= 0", c->weight_decay);
    if (c->threads < 0 || c->threads > 1024)
        return ch_fail(err, CH_STATUS_BAD_INPUT, "threads %d, expected 0..1024", c->threads);
    return CH_STATUS_OK;
}

static ch_status alloc_batch(ch_trainer *t, ch_err *err)
{
    const ch_dataset *d = t->train;
    const size_t per = (size_t)d->c * d->h * d->w, b = (size_t)t->cfg.batch_size;
    t->x = malloc(sizeof(ch_real) * per * b);
    t->labels = malloc(sizeof(int32_t) * b);
    t->dlogits = malloc(sizeof(ch_real) * (size_t)d->classes * b);
    t->perm = malloc(sizeof(uint32_t) * (d->n ? d->n : 1));
    t->eval_idx = malloc(sizeof(uint32_t) * b);
    if (!t->x || !t->labels || !t->dlogits || !t->perm || !t->eval_idx)
        return CH_SYS_FAIL(err, "allocation of batch buffers");
    return CH_STATUS_OK;
}

static ch_status setup(ch_trainer *t, ch_err *err)
{
    const ch_dataset *d = t->train;
    if (d->n == 0) return ch_fail(err, CH_STATUS_BAD_INPUT, "the training set is empty");
    if (t->test && (t->test->c != d->c || t->test->h != d->h || t->test->w != d->w ||
                    t->test->classes != d->classes))
        return ch_fail(err, CH_STATUS_BAD_INPUT, "test set shape %dx%dx%d differs from training set %dx%dx%d",
                       t->test->c, t->test->h, t->test->w, d->c, d->h, d->w);
    CH_TRY(ch_model_create(t->model_name, (ch_shape3){ d->c, d->h, d->w }, d->classes, &t->model, err));
    CH_TRY(ch_model_init_params(t->model, t->init, t->cfg.seed, err));
    CH_TRY(ch_model_plan(t->model, t->k, t->cfg.batch_size, t->nthreads, err));
    CH_TRY(ch_sgd_init(&t->opt, t->model->nparams, t->cfg.lr, t->cfg.momentum, 0,
                       t->cfg.weight_decay, t->cfg.nesterov, err));
    return alloc_batch(t, err);
}

ch_status ch_trainer_create(const ch_train_config *cfg, const ch_dataset *train,
                            const ch_dataset *test, ch_trainer **out, ch_err *err)
{
    CH_TRY(check_config(cfg, err));
    ch_trainer *t = calloc(1, sizeof *t);
    CH_CHECK_ALLOC(err, t);
    t->cfg = *cfg;
    snprintf(t->model_name, sizeof t->model_name, "%s", cfg->model);
    snprintf(t->init, sizeof t->init, "%s", cfg->init ? cfg->init : "default");
    t->cfg.model = t->model_name;
    t->cfg.init = t->init;
    t->train = train;
    t->test = test;
    t->k = ch_kernels_cpu();
    t->nthreads = cfg->threads > 0 ? cfg->threads : ch_cpu_count();
    snprintf(t->devices, sizeof t->devices, "cpu:0");
    ch_status st = setup(t, err);
    if (st != CH_STATUS_OK) {
        ch_trainer_free(t);
        return st;
    }
    *out = t;
    return CH_STATUS_OK;
}

void ch_trainer_set_progress(ch_trainer *t, ch_progress_fn fn, void *user)
{
    t->progress = fn;
    t->progress_user = user;
}

ch_status ch_trainer_step(ch_trainer *t, const uint32_t *idx, int n, double *loss_sum,
                          int64_t *correct, ch_err *err)
{
    /* oneDNN's GEMM threads by the calling thread's OpenMP setting: keep it at ours. */
    omp_set_num_threads(t->nthreads);
    ch_dataset_gather(t->train, idx, n, t->x, t->labels);
    ch_run r = ch_model_run(t->model, t->k, true);
    r.seed = t->cfg.seed;
    r.step = t->step;
    const ch_real *logits = ch_model_forward(t->model, &r, n, t->x);
    r.k->softmax_xent(&r.kc, n, t->model->classes, logits, t->labels, 1.0 / n, t->dlogits,
                      loss_sum, correct);
    if (t->cfg.nan_check && !isfinite(*loss_sum))
        return ch_fail(err, CH_STATUS_NUMERIC, "step %llu: the loss is %g on cpu:0",
                       (unsigned long long)t->step + 1, *loss_sum);
    ch_model_backward(t->model, &r, n, t->x, t->dlogits);
    ch_sgd_step(&t->opt, t->model->params, t->model->grads, t->nthreads);
    t->step++;
    return CH_STATUS_OK;
}

ch_status ch_trainer_run_epoch(ch_trainer *t, ch_epoch_stats *s, ch_err *err)
{
    const ch_dataset *d = t->train;
    ch_rng rng;
    ch_rng_init(&rng, t->cfg.seed, CH_RNG_STREAM_SHUFFLE, (uint64_t)t->epoch << 40);
    ch_rng_permutation(&rng, t->perm, (uint32_t)d->n);

    const int B = t->cfg.batch_size;
    const int steps = (int)((d->n + (size_t)B - 1) / (size_t)B);
    double loss = 0, t0 = ch_clock_s();
    int64_t hits = 0;
    size_t seen = 0;
    for (int i = 0; i < steps; i++) {
        const int n = (int)((size_t)B < d->n - seen ? (size_t)B : d->n - seen);
        double l;
        int64_t c;
        CH_TRY(ch_trainer_step(t, t->perm + seen, n, &l, &c, err));
        loss += l;
        hits += c;
        seen += (size_t)n;
        if (t->progress)
            t->progress(t->progress_user, i + 1, steps, loss / seen, (double)hits / seen, seen,
                        ch_clock_s() - t0);
    }
    const double elapsed = ch_clock_s() - t0;
    t->epoch++;
    *s = (ch_epoch_stats){ .epoch = t->epoch, .loss = loss / seen,
                           .train_acc = (double)hits / seen, .time_s = elapsed,
                           .images_per_s = seen / (elapsed > 0 ? elapsed : 1e-9),
                           .train_images = seen, .test_acc = -1 };
    if (t->test) {
        double tl;
        CH_TRY(ch_trainer_evaluate(t, t->test, &tl, &s->test_acc, err));
        s->test_images = t->test->n;
    }
    return CH_STATUS_OK;
}

ch_status ch_trainer_evaluate(ch_trainer *t, const ch_dataset *d, double *loss, double *acc,
                              ch_err *err)
{
    omp_set_num_threads(t->nthreads);
    if (d->c != t->train->c || d->h != t->train->h || d->w != t->train->w)
        return ch_fail(err, CH_STATUS_BAD_INPUT, "evaluation data shape %dx%dx%d does not fit the model",
                       d->c, d->h, d->w);
    ch_run r = ch_model_run(t->model, t->k, false);
    const int B = t->cfg.batch_size;
    double lsum = 0;
    int64_t hits = 0;
    for (size_t at = 0; at < d->n; at += (size_t)B) {
        const int n = (int)((size_t)B < d->n - at ? (size_t)B : d->n - at);
        for (int i = 0; i < n; i++) t->eval_idx[i] = (uint32_t)(at + (size_t)i);
        ch_dataset_gather(d, t->eval_idx, n, t->x, t->labels);
        const ch_real *logits = ch_model_forward(t->model, &r, n, t->x);
        double l;
        int64_t c;
        r.k->softmax_xent(&r.kc, n, t->model->classes, logits, t->labels, 1.0, NULL, &l, &c);
        lsum += l;
        hits += c;
    }
    *loss = d->n ? lsum / d->n : 0;
    *acc = d->n ? (double)hits / d->n : 0;
    return CH_STATUS_OK;
}

const char *ch_trainer_devices(const ch_trainer *t) { return t->devices; }
size_t ch_trainer_param_count(const ch_trainer *t) { return t->model->nparams; }

void ch_trainer_get_params(const ch_trainer *t, float *out)
{
    for (size_t i = 0; i < t->model->nparams; i++) out[i] = (float)t->model->params[i];
}

void ch_trainer_free(ch_trainer *t)
{
    if (!t) return;
    ch_model_free(t->model);
    ch_sgd_free(&t->opt);
    free(t->x);
    free(t->labels);
    free(t->dlogits);
    free(t->perm);
    free(t->eval_idx);
    free(t);
}
