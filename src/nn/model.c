/* Model assembly: offsets, flat buffers, names, initialisation and planning. */
#include "nn/model.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/rng.h"

/* Walk the tree in module order, calling visit on every layer with its dotted path. */
typedef void (*visit_fn)(ch_model *m, ch_layer *l, const char *path);

static void walk(ch_model *m, ch_layer *l, const char *path, visit_fn visit)
{
    visit(m, l, path);
    for (int i = 0; i < l->nchildren; i++) {
        char sub[CH_NAME_MAX];
        int w = snprintf(sub, sizeof sub, "%s%s%s", path, path[0] ? "." : "", l->children[i]->name);
        CH_ASSERT(w > 0 && w < (int)sizeof sub);
        walk(m, l->children[i], sub, visit);
    }
}

static void count_tensors(ch_model *m, ch_layer *l, const char *path)
{
    (void)path;
    /* A tied layer's parameters are its earlier twin's: only a private gradient (offsets into
     * tied_grads). Its buffers and counter are the twin's too (a BatchNorm called twice moves the
     * same running statistics twice a step, as PyTorch's does). */
    for (int i = 0; l->tied_to && i < l->nparams; i++) {
        l->params[i].offset = m->ntied;
        m->ntied += l->params[i].count;
    }
    for (int i = 0; !l->tied_to && i < l->nparams; i++) {
        l->params[i].offset = m->nparams;
        m->nparams += l->params[i].count;
    }
    for (int i = 0; !l->tied_to && i < l->nbuffers; i++) {
        l->buffers[i].offset = m->nbuffers;
        m->nbuffers += l->buffers[i].count;
    }
    /* PyTorch's BatchNorm counts its batches; no other module has a counter. */
    const bool counts = ch_layer_is_batchnorm(l) && !l->tied_to;
    m->ncounters += counts;
    m->ntensors += l->tied_to ? 0 : l->nparams + l->nbuffers + counts;
}

static void add_ref(ch_model *m, const char *path, const char *suffix, ch_tensor_kind kind,
                    const ch_tensor_spec *spec, ch_real *data, int64_t *counter)
{
    ch_tensor_ref *t = &m->tensors[m->ntensors++];
    int w = snprintf(t->name, sizeof t->name, "%s%s%s", path, path[0] ? "." : "", suffix);
    CH_ASSERT(w > 0 && w < (int)sizeof t->name);
    t->kind = kind;
    t->spec = spec;
    t->data = data;
    t->counter = counter;
}

static void bind_tensors(ch_model *m, ch_layer *l, const char *path)
{
    for (int i = 0; l->tied_to && i < l->nparams; i++) {
        l->p[i] = l->tied_to->p[i];   /* bound before: the twin comes earlier in module order */
        l->g[i] = m->tied_grads + l->params[i].offset;
    }
    if (l->tied_to) {
        for (int i = 0; i < l->nbuffers; i++) l->b[i] = l->tied_to->b[i];
        l->num_batches_tracked = l->tied_to->num_batches_tracked;
        return;
    }
    for (int i = 0; i < l->nparams; i++) {
        l->p[i] = m->params + l->params[i].offset;
        l->g[i] = m->grads + l->params[i].offset;
        add_ref(m, path, l->params[i].suffix, CH_TENSOR_PARAM, &l->params[i], l->p[i], NULL);
    }
    for (int i = 0; i < l->nbuffers; i++) {
        l->b[i] = m->buffers + l->buffers[i].offset;
        add_ref(m, path, l->buffers[i].suffix, CH_TENSOR_BUFFER, &l->buffers[i], l->b[i], NULL);
    }
    if (ch_layer_is_batchnorm(l)) {
        l->num_batches_tracked = &m->counters[m->ncounters++];
        add_ref(m, path, "num_batches_tracked", CH_TENSOR_COUNTER, NULL, NULL,
                l->num_batches_tracked);
    }
}

/* Replica memory for count values (at least one). */
static ch_real *alloc_reals(const ch_backend *be, size_t count)
{
    return count <= SIZE_MAX / sizeof(ch_real) ? ch_backend_alloc(be, sizeof(ch_real) * (count ? count : 1)) : NULL;
}

ch_status ch_model_create_from(const char *arch, ch_layer *root, int classes, const ch_backend *be,
                               ch_model **out, ch_err *err)
{
    ch_model *m = calloc(1, sizeof *m);
    if (!m) {
        ch_layer_free(root);
        return CH_SYS_FAIL(err, "calloc of model");
    }
    snprintf(m->arch, sizeof m->arch, "%s", arch);
    m->be = be;
    m->root = root;
    m->input = root->in;
    m->classes = classes;
    walk(m, root, "", count_tensors);
    m->params = alloc_reals(be, m->nparams);
    m->grads = alloc_reals(be, m->nparams);
    m->buffers = alloc_reals(be, m->nbuffers);
    m->tied_grads = alloc_reals(be, m->ntied);
    m->counters = calloc((size_t)m->ncounters + 1, sizeof(int64_t));
    m->tensors = calloc((size_t)m->ntensors + 1, sizeof(ch_tensor_ref));
    if (!m->params || !m->grads || !m->buffers || !m->tied_grads || !m->counters || !m->tensors) {
        ch_model_free(m);
        return CH_SYS_FAIL(err, "allocation of model buffers");
    }
    m->ntensors = m->ncounters = 0;
    walk(m, root, "", bind_tensors);
    *out = m;
    return CH_STATUS_OK;
}

static ch_status parse_init(const char *init, double *normal_std, ch_err *err)
{
    *normal_std = 0;
    /* "file": random values first, then the graph's (ch_model_load_initial) over them. */
    if (!init || strcmp(init, "default") == 0 || strcmp(init, "file") == 0) return CH_STATUS_OK;
    char *end;
    if (strncmp(init, "normal:", 7) == 0) {
        *normal_std = strtod(init + 7, &end);
        /* Weights of N(0, 1e3) already overflow a float activation in a few layers. */
        if (end != init + 7 && *end == '\0' && *normal_std > 0 && *normal_std <= 1e3)
            return CH_STATUS_OK;
    }
    return ch_fail(err, CH_STATUS_BAD_INPUT,
                   "--init '%s': expected 'default', 'file' or 'normal:STD' with 0 < STD <= 1000", init);
}

static void init_tensor(ch_real *data, const ch_tensor_spec *s, double normal_std, ch_rng *rng)
{
    const double bound = s->fan_in > 0 ? 1.0 / sqrt((double)s->fan_in) : 0;
    for (size_t i = 0; i < s->count; i++) {
        double v = 0;
        switch (s->role) {
        case CH_ROLE_WEIGHT:
            v = normal_std > 0 ? normal_std * ch_rng_normal(rng)
                               : bound * (2 * ch_rng_uniform(rng) - 1);
            break;
        case CH_ROLE_BIAS:
            v = normal_std > 0 ? 0 : bound * (2 * ch_rng_uniform(rng) - 1);
            break;
        case CH_ROLE_ONES: v = 1; break;
        case CH_ROLE_ZEROS: v = 0; break;
        }
        data[i] = (ch_real)v;
    }
}

/* The largest parameter or buffer tensor (values): the size of a host staging copy. */
static size_t largest_tensor(const ch_model *m)
{
    size_t most = 1;
    for (int i = 0; i < m->ntensors; i++)
        if (m->tensors[i].spec && m->tensors[i].spec->count > most) most = m->tensors[i].spec->count;
    return most;
}

ch_status ch_model_init_params(ch_model *m, const char *init, uint64_t seed, ch_err *err)
{
    double normal_std;
    CH_TRY(parse_init(init, &normal_std, err));
    ch_real *host = malloc(sizeof(ch_real) * largest_tensor(m));
    CH_CHECK_ALLOC(err, host);
    for (int i = 0; i < m->ntensors; i++) {
        const ch_tensor_ref *t = &m->tensors[i];
        if (t->kind == CH_TENSOR_COUNTER) {
            *t->counter = 0;
            continue;
        }
        /* Each tensor draws from its own counter range: adding a layer does not reshuffle others. */
        ch_rng rng;
        ch_rng_init(&rng, seed, CH_RNG_STREAM_INIT, (uint64_t)i << 40);
        init_tensor(host, t->spec, normal_std, &rng);
        ch_backend_upload(m->be, t->data, host, sizeof(ch_real) * t->spec->count);
    }
    free(host);
    return CH_STATUS_OK;
}

static ch_status plan(ch_model *m, int max_batch, int nthreads, ch_err *err)
{
    ch_plan pl = { .be = m->be, .k = m->be->k, .max_batch = max_batch, .nthreads = nthreads, .bf16 = m->bf16 };
    CH_TRY(ch_layer_plan_tree(m->root, &pl, err));
    m->ws_len = pl.ws_need;
    m->saved_bytes = pl.saved_bytes;
    m->keep_bytes = pl.keep_bytes;
    m->convs = pl.convs;
    m->bf16_convs = pl.bf16_convs;
    m->linears = pl.linears;
    m->bf16_linears = pl.bf16_linears;
    m->bf16_kept = pl.bf16_kept;
    m->bf16_direct = pl.bf16_direct;
    m->bf16_inputs = pl.bf16_inputs;
    m->bf16_grads = pl.bf16_grads;
    CH_TRY(ch_backend_reserve_workspace(m->be, m->ws_len, err));
    m->scratch_len = m->root->scratch_need;
    m->scratch = alloc_reals(m->be, m->scratch_len);
    CH_CHECK_ALLOC(err, m->scratch);
    return CH_STATUS_OK;
}

ch_status ch_model_plan(ch_model *m, int max_batch, int nthreads, ch_err *err)
{
    CH_ASSERT(m->max_batch == 0);
    ch_status st = plan(m, max_batch, nthreads, err);
    if (st == CH_STATUS_SYSTEM) {
        /* Planning fails on the system only when an allocation does, and the memory a slice
         * needs grows with it: the batch the user chose is what to change. */
        char why[256];
        snprintf(why, sizeof why, "%.200s", err->msg);
        return ch_fail(err, CH_STATUS_BAD_INPUT, "%s's activations for a slice of %d samples do not fit in "
                       "memory (%s): a smaller -b/--batch-size, or more devices or ranks to share it",
                       m->arch, max_batch, why);
    }
    if (st != CH_STATUS_OK) return st;
    m->max_batch = max_batch;
    m->nthreads = nthreads;
    return CH_STATUS_OK;
}

ch_run ch_model_run(const ch_model *m, bool training)
{
    /* The backend's context, with the thread count the model was planned for (its kernels' per-
     * thread workspace was sized for that many). */
    ch_kctx kc = ch_backend_kctx(m->be);
    kc.nthreads = m->nthreads;
    return (ch_run){ .be = m->be, .k = m->be->k, .kc = kc, .training = training, .scratch = m->scratch,
                     .scratch_len = m->scratch_len };
}

const ch_real *ch_model_forward(ch_model *m, const ch_run *r, int n, const ch_real *x)
{
    CH_ASSERT(n >= 0 && n <= m->max_batch);
    m->root->ops->forward(m->root, r, n, x);
    return m->root->y;
}

void ch_model_backward(ch_model *m, const ch_run *r, int n, const ch_real *x,
                       const ch_real *dlogits)
{
    CH_ASSERT(n >= 0 && n <= m->max_batch);
    m->root->ops->backward(m->root, r, n, x, dlogits, NULL);
}

const ch_tensor_ref *ch_model_find(const ch_model *m, const char *name)
{
    for (int i = 0; i < m->ntensors; i++)
        if (strcmp(m->tensors[i].name, name) == 0) return &m->tensors[i];
    return NULL;
}

ch_status ch_model_write_tensor(ch_model *m, const ch_tensor_ref *t, const float *values, ch_err *err)
{
    return ch_model_upload_floats(m, t->data, values, t->spec->count, err);
}

/* float and ch_real are the same type except in the double-precision test build, which converts
 * through a host copy. */
ch_status ch_model_download_floats_async(const ch_model *m, float *out, const ch_real *dev, size_t n,
                                         ch_err *err)
{
#ifdef CH_REAL_DOUBLE
    ch_real *host = malloc(sizeof(ch_real) * (n ? n : 1));
    CH_CHECK_ALLOC(err, host);
    ch_backend_download(m->be, host, dev, sizeof(ch_real) * n);
    for (size_t i = 0; i < n; i++) out[i] = (float)host[i];
    free(host);
#else
    (void)err;
    ch_backend_download_async(m->be, CH_STREAM_COMPUTE, out, dev, sizeof(ch_real) * n);
#endif
    return CH_STATUS_OK;
}

ch_status ch_model_download_floats(const ch_model *m, float *out, const ch_real *dev, size_t n,
                                   ch_err *err)
{
    CH_TRY(ch_model_download_floats_async(m, out, dev, n, err));
    ch_backend_sync(m->be, CH_STREAM_COMPUTE);
    return CH_STATUS_OK;
}

ch_status ch_model_upload_floats(const ch_model *m, ch_real *dev, const float *values, size_t n,
                                 ch_err *err)
{
#ifdef CH_REAL_DOUBLE
    ch_real *host = malloc(sizeof(ch_real) * (n ? n : 1));
    CH_CHECK_ALLOC(err, host);
    for (size_t i = 0; i < n; i++) host[i] = values[i];
    ch_backend_upload(m->be, dev, host, sizeof(ch_real) * n);
    free(host);
#else
    (void)err;
    ch_backend_upload(m->be, dev, values, sizeof(ch_real) * n);
#endif
    return CH_STATUS_OK;
}

void ch_model_free(ch_model *m)
{
    if (!m) return;
    ch_layer_free(m->root);
    if (m->be) {
        ch_backend_release(m->be, m->params);
        ch_backend_release(m->be, m->grads);
        ch_backend_release(m->be, m->buffers);
        ch_backend_release(m->be, m->tied_grads);
        ch_backend_release(m->be, m->scratch);
    }
    free(m->counters);
    free(m->tensors);
    free(m);
}
