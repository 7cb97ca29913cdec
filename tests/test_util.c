/* Helpers shared by the unit tests. */
#include "test_util.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

#include "core/rng.h"
#include "data/augment.h"
#include "kernels/backend.h"
#include "kernels/cpu/cpu.h"
#include "models/zoo.h"
#include "nn/model.h"
#include "data/dataset.h"
#include "train/trainer.h"

const char *tu_backend = "cpu";

void tu_take_backend(int *argc, char **argv)
{
    static const char flag[] = "--backend=";
    if (*argc < 2 || strncmp(argv[1], flag, sizeof flag - 1) != 0) return;
    tu_backend = argv[1] + sizeof flag - 1;
    /* On a GPU, cuDNN chooses its algorithms per shape and batch, so a batch and its slices round
     * differently (measured on an H100: 1.3e-4 between mnist-cnn's 2-replica and 1-replica
     * gradients). The tests compare those: one set of algorithms for every batch, as the CPU has. */
    if (strcmp(tu_backend, "cuda") == 0) setenv("COHORT_CUDNN_ALGOS", "fixed", 0);
    for (int i = 1; i < *argc; i++) argv[i] = argv[i + 1];   /* argv[argc] is NULL */
    (*argc)--;
}

const char *tu_devices(const char *cpu_list)
{
    enum { SLOTS = 16, LEN = 256 };
    static char ring[SLOTS][LEN];
    static unsigned next;
    char *out = ring[next++ % SLOTS];
    size_t o = 0;
    for (const char *p = cpu_list; *p;) {
        const bool starts = p == cpu_list || p[-1] == ',' || p[-1] == ' ';
        const bool cpu = starts && strncmp(p, "cpu", 3) == 0;
        const char *piece = cpu ? tu_backend : p;
        const size_t len = cpu ? strlen(tu_backend) : 1;
        if (o + len >= LEN) fail_msg("tu_devices: '%s' is too long for %s", cpu_list, tu_backend);
        memcpy(out + o, piece, len);
        o += len;
        p += cpu ? 3 : 1;
    }
    out[o] = '\0';
    return out;
}

void tu_fill_uniform(ch_real *x, size_t n, double lo, double hi, uint64_t seed)
{
    ch_rng r;
    ch_rng_init(&r, seed, CH_RNG_STREAM_TEST, 0);
    for (size_t i = 0; i < n; i++) x[i] = (ch_real)(lo + (hi - lo) * ch_rng_uniform(&r));
}

ch_real *tu_uniform(size_t n, uint64_t seed)
{
    ch_real *p = malloc(sizeof(ch_real) * (n ? n : 1));
    assert_non_null(p);
    tu_fill_uniform(p, n, -1, 1, seed);
    return p;
}

double tu_worse(double worst, double e)
{
    if (isnan(worst) || isnan(e)) return NAN;
    return e > worst ? e : worst;
}

double tu_max_rel_err(const ch_real *a, const ch_real *b, size_t n, double floor)
{
    double worst = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - b[i]);
        double m = fmax(fmax(fabs((double)a[i]), fabs((double)b[i])), floor);
        worst = tu_worse(worst, d / m);
    }
    return worst;
}

double tu_max_norm_err(const ch_real *a, const ch_real *b, size_t n)
{
    double diff = 0, scale = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - b[i]);
        diff = tu_worse(diff, d);
        scale = fmax(scale, fabs((double)b[i]));
    }
    return scale > 0 ? diff / scale : diff;
}

double tu_max_norm_err_f32(const float *a, const float *b, size_t n)
{
    double diff = 0, scale = 0;
    for (size_t i = 0; i < n; i++) {
        const double d = fabs((double)a[i] - b[i]);
        diff = tu_worse(diff, d);
        scale = fmax(scale, fabs((double)b[i]));
    }
    return scale > 0 ? diff / scale : diff;
}

void tu_mkdtemp(char *buf, size_t len)
{
    snprintf(buf, len, "/tmp/cohort-test-XXXXXX");
    assert_non_null(mkdtemp(buf));
}

void tu_rmdir(const char *dir)
{
    char cmd[512];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    assert_int_equal(system(cmd), 0);
}

void tu_write_file(const char *dir, const char *name, const void *data, size_t len, int gz)
{
    char path[512];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    if (gz) {
        gzFile f = gzopen(path, "wb");
        assert_non_null(f);
        if (len) assert_int_equal(gzwrite(f, data, (unsigned)len), (int)len);
        assert_int_equal(gzclose(f), Z_OK);
    } else {
        FILE *f = fopen(path, "wb");
        assert_non_null(f);
        if (len) assert_int_equal(fwrite(data, 1, len, f), len);
        assert_int_equal(fclose(f), 0);
    }
}

struct ch_dataset *tu_synthetic(size_t n, int size, uint64_t seed)
{
    ch_dataset *d = calloc(1, sizeof *d);
    assert_non_null(d);
    const size_t px = (size_t)size * size;
    *d = (ch_dataset){ .n = n, .c = 1, .h = size, .w = size, .classes = 10 };
    d->images = malloc(n * px);
    d->labels = malloc(n * sizeof *d->labels);
    assert_true(d->images && d->labels);
    ch_rng r;
    ch_rng_init(&r, seed, CH_RNG_STREAM_TEST, 0);
    for (size_t i = 0; i < n; i++) {
        d->labels[i] = (uint16_t)ch_rng_below(&r, 10);
        for (size_t p = 0; p < px; p++)
            d->images[i * px + p] = (uint8_t)((int)(p % (size_t)size) * 10 / size == d->labels[i]
                                                  ? 200 : ch_rng_below(&r, 60));
    }
    return d;
}

struct ch_dataset *tu_identical(size_t n, int size, uint64_t seed)
{
    ch_dataset *d = tu_synthetic(n, size, seed);
    const size_t px = (size_t)size * size;
    for (size_t i = 1; i < n; i++) {
        memcpy(d->images + i * px, d->images, px);
        d->labels[i] = d->labels[0];
    }
    return d;
}

double tu_grad_error(const struct ch_model *m, const ch_real *a, const ch_real *b)
{
    double total = 0;
    for (size_t i = 0; i < m->nparams; i++) total += (double)b[i] * b[i];
    const double floor = 1e-2 * sqrt(total);
    double worst = 0;
    for (int t = 0; t < m->ntensors; t++) {
        const ch_tensor_ref *r = &m->tensors[t];
        if (r->kind != CH_TENSOR_PARAM) continue;
        double d2 = 0, n2 = 0;
        for (size_t i = r->spec->offset; i < r->spec->offset + r->spec->count; i++) {
            d2 += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
            n2 += (double)b[i] * b[i];
        }
        const double e = sqrt(d2) / fmax(sqrt(n2), floor);
        if (e > worst) worst = e;
    }
    return worst;
}

static ch_trainer *shape_trainer(const char *model, const ch_dataset *d, const char *devices,
                                 int batch, int accum, double lr, bool sync_bn, bool local_only,
                                 const char *shares)
{
    ch_device_list l;
    ch_err err;
    if (ch_device_list_parse(tu_devices(devices), &l, &err) != CH_STATUS_OK) fail_msg("%s", err.msg);
    ch_train_config cfg = ch_train_config_default();
    cfg.model = model;
    ch_graph *g = NULL;
    if (strcmp(model, TU_BN_NET) == 0) { /* BatchNorm over whole planes: never a plane of one pixel */
        if (ch_graph_create(TU_BN_NET, &g, &err) != CH_STATUS_OK) fail_msg("%s", err.msg);
        int x = ch_graph_input(g, "x", d->c, d->h, d->w);
        x = ch_graph_conv2d(g, "conv", x, &(ch_conv2d_args){ .out_channels = 8, .kernel = 3, .padding = 1 });
        x = ch_graph_relu(g, "relu", ch_graph_batchnorm2d(g, "bn", x, &(ch_batchnorm_args){ .eps = 1e-3, .momentum = 0.3 }));
        ch_graph_output(g, ch_graph_linear(g, "fc", ch_graph_flatten(g, "flat", ch_graph_global_avg_pool(g, "gap", x)),
                                           d->classes, true));
        cfg.graph = g;
        cfg.model = NULL;
    }
    cfg.batch_size = batch;
    cfg.accum_steps = accum;
    cfg.lr = lr;
    cfg.momentum = 0.9;
    cfg.seed = 3;
    cfg.threads = l.count;   /* one thread per replica, as the reference: sums differ only by the split */
    cfg.devices = tu_devices(devices);
    cfg.sync_bn = sync_bn;
    cfg.bucket_mb = 0.05;
    cfg.local_only = local_only;
    cfg.shares = shares;
    cfg.timeout_s = 120;
    ch_trainer *t = NULL;
    const ch_status st = ch_trainer_create(&cfg, d, NULL, &t, &err);
    ch_graph_free(g);   /* the trainer keeps what it needs */
    if (st != CH_STATUS_OK) fail_msg("%s", err.msg);
    if (strcmp(t->replicas[0].be->ops->name, tu_backend) != 0)
        fail_msg("the job runs on %s, not on --backend=%s", t->replicas[0].be->ops->name, tu_backend);
    return t;
}

double tu_job_shape_error(const char *model, const ch_dataset *d, const char *devices, int batch,
                          double lr, bool sync_bn, bool local_only)
{
    return tu_accum_error(model, d, devices, batch, 1, lr, sync_bn, local_only);
}

static double pair_error(ch_trainer *one, ch_trainer *job, int epochs, char *shares_out, size_t len, size_t *mine,
                         tu_gaps *gaps);

double tu_accum_error(const char *model, const ch_dataset *d, const char *devices, int batch, int accum,
                      double lr, bool sync_bn, bool local_only)
{
    return tu_accum_gaps(model, d, devices, batch, accum, lr, sync_bn, local_only).params;
}

tu_gaps tu_accum_gaps(const char *model, const ch_dataset *d, const char *devices, int batch, int accum, double lr,
                      bool sync_bn, bool local_only)
{
    ch_trainer *one = shape_trainer(model, d, "cpu:0", batch, 1, lr, sync_bn, true, NULL);
    ch_trainer *job = shape_trainer(model, d, devices, batch, accum, lr, sync_bn, local_only, NULL);
    tu_gaps g;
    g.params = pair_error(one, job, 1, NULL, 0, NULL, &g);
    return g;
}

double tu_shares_error(const char *model, const ch_dataset *d, const char *devices, int batch, const char *shares,
                       int epochs, char *shares_out, size_t len, size_t *mine)
{
    ch_trainer *one = shape_trainer(model, d, "cpu:0", batch, 1, 0.05, false, true, NULL);
    ch_trainer *job = shape_trainer(model, d, devices, batch, 1, 0.05, false, false, shares);
    return pair_error(one, job, epochs, shares_out, len, mine, NULL);
}

/* Train both for epochs; the job's parameters' distance from one's (relative to one's largest),
 * its shares after into shares_out, this rank's training samples per epoch into mine and the last
 * epoch's loss and accuracy gaps into gaps (when given); frees both. */
static double pair_error(ch_trainer *one, ch_trainer *job, int epochs, char *shares_out, size_t len, size_t *mine,
                         tu_gaps *gaps)
{
    ch_epoch_stats s, so;
    ch_err err;
    for (int e = 0; e < epochs; e++) {
        if (ch_trainer_run_epoch(one, &so, &err) != CH_STATUS_OK) fail_msg("%s", err.msg);
        if (ch_trainer_run_epoch(job, &s, &err) != CH_STATUS_OK) fail_msg("%s", err.msg);
    }
    if (gaps) {
        *gaps = (tu_gaps){ .loss = fabs(s.loss - so.loss) / fmax(fabs(so.loss), 1e-30),
                           .acc = fabs(s.train_acc - so.train_acc) };
        if (!(gaps->loss == gaps->loss)) gaps->loss = INFINITY;
    }
    if (shares_out) ch_trainer_shares(job, shares_out, len);
    size_t test_n;
    if (mine) ch_trainer_share(job, mine, &test_n);
    const size_t np = ch_trainer_param_count(one);
    float *a = malloc(sizeof(float) * np), *b = malloc(sizeof(float) * np);
    assert_true(a && b);
    ch_trainer_get_params(job, a);
    ch_trainer_get_params(one, b);
    const double e = tu_max_norm_err_f32(a, b, np);
    free(a);
    free(b);
    ch_trainer_free(job);
    ch_trainer_free(one);
    return e;
}

void (*tu_zoo_planned)(const ch_model *m);

ch_model *tu_zoo_step(ch_backend *be, const char *arch, ch_shape3 in, uint64_t seed, bool bf16, int n,
                      float *g)
{
    ch_model *m;
    ch_err err;
    const size_t per = (size_t)in.c * in.h * in.w;
    if (ch_zoo_model(arch, in, 10, be, &m, &err) != CH_STATUS_OK ||
        ch_model_init_params(m, "default", seed, &err) != CH_STATUS_OK)
        fail_msg("%s", err.msg);
    m->bf16 = bf16;
    if (ch_model_plan(m, n, 2, &err) != CH_STATUS_OK) fail_msg("%s", err.msg);
    if (tu_zoo_planned) tu_zoo_planned(m);
    float *x = malloc(sizeof(float) * n * per), *dl = malloc(sizeof(float) * (size_t)n * 10);
    ch_real *dx = ch_backend_alloc(be, sizeof(ch_real) * n * per);
    ch_real *dd = ch_backend_alloc(be, sizeof(ch_real) * (size_t)n * 10);
    if (!x || !dl || !dx || !dd) fail_msg("tu_zoo_step: out of memory");
    for (size_t i = 0; i < n * per; i++) x[i] = (float)((i * 37) % 101) / 50.0f - 1.0f;
    for (int i = 0; i < n * 10; i++) dl[i] = (float)((i * 13) % 7) / 7.0f - 0.4f;
    if (ch_model_upload_floats(m, dx, x, n * per, &err) != CH_STATUS_OK ||
        ch_model_upload_floats(m, dd, dl, (size_t)n * 10, &err) != CH_STATUS_OK)
        fail_msg("%s", err.msg);
    const ch_run r = ch_model_run(m, true);
    ch_model_forward(m, &r, n, dx);
    ch_model_backward(m, &r, n, dx, dd);
    if (ch_model_download_floats(m, g, m->grads, m->nparams, &err) != CH_STATUS_OK) fail_msg("%s", err.msg);
    ch_backend_release(be, dx);
    ch_backend_release(be, dd);
    free(x), free(dl);
    return m;
}

void tu_per_slice_reference(const ch_dataset *d, const uint32_t *idx, int n, int D, bool bf16, ch_real **grads_out,
                            ch_real **buffers_out, ch_model **keep)
{
    ch_err err;
    ch_model *m;
    if (ch_zoo_model("resnet18", (ch_shape3){ 1, d->h, d->w }, 10, ch_backend_host(), &m, &err) != CH_STATUS_OK ||
        ch_model_init_params(m, "default", 7, &err) != CH_STATUS_OK)
        fail_msg("%s", err.msg);
    m->bf16 = bf16;
    if (ch_model_plan(m, n, 2, &err) != CH_STATUS_OK) fail_msg("%s", err.msg);
    ch_real *grads = malloc(sizeof(ch_real) * m->nparams), *buffers = malloc(sizeof(ch_real) * m->nbuffers);
    ch_real *start = malloc(sizeof(ch_real) * m->nbuffers);
    ch_real *x = malloc(sizeof(ch_real) * (size_t)n * d->h * d->w), *dl = malloc(sizeof(ch_real) * (size_t)n * 10);
    int32_t *y = malloc(sizeof(int32_t) * (size_t)n);
    assert_true(grads && buffers && start && x && y && dl);
    memcpy(start, m->buffers, sizeof(ch_real) * m->nbuffers);
    memset(grads, 0, sizeof(ch_real) * m->nparams);
    memset(buffers, 0, sizeof(ch_real) * m->nbuffers);
    for (int r = 0; r < D; r++) {
        int off, cnt;
        ch_trainer_slice(n, D, r, &off, &cnt);
        memcpy(m->buffers, start, sizeof(ch_real) * m->nbuffers);
        assert_int_equal(ch_augment_gather(&(ch_augment){ 0 }, d, idx + off, cnt, false, 0, 0, x, y, &err), CH_STATUS_OK);
        ch_run run = ch_model_run(m, true);
        run.global_n = n;
        run.sample_offset = (uint64_t)off;
        const ch_real *logits = ch_model_forward(m, &run, cnt, x);
        double l;
        int64_t c;
        run.k->softmax_xent(&run.kc, cnt, 10, logits, y, 1.0 / n, dl, &l, &c);
        ch_model_backward(m, &run, cnt, x, dl);
        for (size_t i = 0; i < m->nparams; i++) grads[i] += m->grads[i];
        for (size_t i = 0; i < m->nbuffers; i++) buffers[i] += m->buffers[i] * (ch_real)((double)cnt / n);
    }
    free(start);
    free(x);
    free(y);
    free(dl);
    *grads_out = grads;
    *buffers_out = buffers;
    *keep = m;
}

/* Two epochs of cfg's job on devices (d for training and test): the trainer, each epoch's figures
 * in s. */
static ch_trainer *two_epochs(ch_train_config cfg, const ch_dataset *d, const char *devices, ch_epoch_stats *s)
{
    cfg.devices = devices;
    ch_trainer *t;
    ch_err err;
    if (ch_trainer_create(&cfg, d, d, &t, &err) != CH_STATUS_OK) fail_msg("%s", err.msg);
    for (int e = 0; e < 2; e++)
        if (ch_trainer_run_epoch(t, &s[e], &err) != CH_STATUS_OK) fail_msg("%s", err.msg);
    return t;
}

ch_real *tu_down(const ch_model *m, const ch_real *dev, size_t n)
{
    ch_real *h = malloc(sizeof(ch_real) * (n ? n : 1));
    assert_non_null(h);
    ch_backend_download(m->be, h, dev, sizeof(ch_real) * n);
    return h;
}

void tu_assert_same_bits(const ch_model *a, const ch_real *da, const ch_model *b, const ch_real *db, size_t n,
                         const char *what)
{
    ch_real *ha = tu_down(a, da, n), *hb = tu_down(b, db, n);
    if (memcmp(ha, hb, sizeof(ch_real) * n) != 0) fail_msg("%s differ", what);
    free(ha);
    free(hb);
}

ch_train_config tu_lazy_job(const char *model, bool sync_bn, int accum, int threads)
{
    ch_train_config cfg = ch_train_config_default();
    cfg.model = model;
    cfg.batch_size = 10;
    cfg.lr = 0.05;
    cfg.momentum = 0.9;
    cfg.weight_decay = 5e-4;
    cfg.threads = threads;
    cfg.bucket_mb = 0.05;
    cfg.sync_bn = sync_bn;
    cfg.accum_steps = accum;
    return cfg;
}

double tu_lazy_gives_cpu_bits(const ch_train_config *cfg, const ch_dataset *d, int D, size_t *bf16_kept)
{
    char on_cpu[16], on_lazy[16];
    snprintf(on_cpu, sizeof on_cpu, "cpu*%d", D);
    snprintf(on_lazy, sizeof on_lazy, "lazy*%d", D);
    ch_epoch_stats sc[2], sl[2];
    /* The lazy backend has no fused BatchNorm + ReLU (it is the fusion tests' unfused reference),
     * so no ReLU output passes to a convolution in bf16 there: the CPU keeps them fp32 too
     * (ch_cpu_bf16_inputs; that path's bits are test_model's). */
    const char *was = getenv("COHORT_BF16_INPUTS");
    char *saved = was ? strdup(was) : NULL;
    setenv("COHORT_BF16_INPUTS", "off", 1);
    ch_trainer *cpu = two_epochs(*cfg, d, on_cpu, sc), *lazy = two_epochs(*cfg, d, on_lazy, sl);
    if (saved) setenv("COHORT_BF16_INPUTS", saved, 1);
    else unsetenv("COHORT_BF16_INPUTS");
    free(saved);
    assert_int_equal(cpu->replicas[0].model->bf16_inputs, 0);
    assert_string_equal(lazy->replicas[0].be->ops->name, "lazy");
    assert_string_equal(cpu->replicas[0].be->ops->name, "cpu");
    for (int e = 0; e < 2; e++)
        if (sc[e].loss != sl[e].loss || sc[e].train_acc != sl[e].train_acc || sc[e].test_acc != sl[e].test_acc)
            fail_msg("%s epoch %d: cpu loss %.9g acc %.4f/%.4f, lazy loss %.9g acc %.4f/%.4f",
                     cfg->model ? cfg->model : "graph", e + 1, sc[e].loss, sc[e].train_acc, sc[e].test_acc,
                     sl[e].loss, sl[e].train_acc, sl[e].test_acc);
    for (int r = 0; r < D; r++) {
        const ch_replica *a = &cpu->replicas[r], *b = &lazy->replicas[r];
        if (a->model->bf16_kept != b->model->bf16_kept) fail_msg("bf16 kept values differ between cpu and lazy");
        tu_assert_same_bits(a->model, a->model->params, b->model, b->model->params, a->model->nparams, "cpu and lazy parameters");
        if (a->model->nbuffers)
            tu_assert_same_bits(a->model, a->model->buffers, b->model, b->model->buffers, a->model->nbuffers,
                                "cpu and lazy buffers");
        tu_assert_same_bits(a->model, a->opt.state[0], b->model, b->opt.state[0], a->opt.n, "cpu and lazy optimizer states");
    }
    if (bf16_kept) *bf16_kept = cpu->replicas[0].model->bf16_kept;
    ch_trainer_free(cpu);
    ch_trainer_free(lazy);
    return sl[1].loss;
}

bool tu_cpuinfo_vendor(char *buf, size_t len)
{
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (!f) return false;
    char line[256];
    bool found = false;
    while (!found && fgets(line, sizeof line, f)) {
        char v[64];
        found = sscanf(line, "vendor_id : %63s", v) == 1;
        if (found) snprintf(buf, len, "%s", v);
    }
    fclose(f);
    return found;
}

bool tu_sanitized(void)
{
    const char *s = getenv("COHORT_SANITIZED");
    return s && strcmp(s, "1") == 0;
}

int tu_bf16_here(bool skip_emulated, const char *why_skip)
{
    char isa[32];
    if (ch_cpu_bf16_native(isa, sizeof isa)) return 0;
    if (!ch_cpu_avx512()) {
        printf("skipped: this CPU has neither native bf16 nor AVX-512 to emulate it (oneDNN's effective ISA: %s)\n",
               isa);
        return 77;
    }
    if (skip_emulated) {
        printf("skipped: no native bf16 here (%s), and %s\n", isa, why_skip);
        return 77;
    }
    setenv("COHORT_BF16", "emulate", 1);
    if (!ch_cpu_bf16_runs(NULL, 0) || !ch_cpu_bf16_emulated()) {
        printf("FAIL: COHORT_BF16=emulate on %s (AVX-512) left bf16 off\n", isa);
        return 1;
    }
    printf("bf16 emulated by oneDNN on %s (no native bf16 here)\n", isa);
    return 0;
}
