/* Generic layer plumbing: allocation, specs, children, planning, freeing. */
#include "nn/layer.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

ch_layer *ch_layer_alloc(const ch_layer_ops *ops, const char *name, ch_shape3 in, ch_shape3 out)
{
    ch_layer *l = calloc(1, sizeof *l);
    if (!l) return NULL;
    l->ops = ops;
    snprintf(l->name, sizeof l->name, "%s", name);
    l->in = in;
    l->out = out;
    return l;
}

void *ch_layer_alloc_impl(const ch_layer_ops *ops, const char *name, ch_shape3 in, ch_shape3 out, size_t impl_size,
                          ch_layer **l, ch_err *err)
{
    *l = ch_layer_alloc(ops, name, in, out);
    void *impl = *l ? calloc(1, impl_size) : NULL;
    if (!impl) {
        ch_layer_free(*l);
        *l = NULL;
        CH_SYS_FAIL(err, "allocation of a layer");
        return NULL;
    }
    (*l)->impl = impl;
    return impl;
}

void ch_layer_free(ch_layer *l)
{
    if (!l) return;
    for (int i = 0; i < l->nchildren; i++) ch_layer_free(l->children[i]);
    free(l->children);
    free(l->ins);
    if (l->ops->free_impl) l->ops->free_impl(l);
    free(l->impl);
    if (l->y_owned) ch_backend_release(l->be, l->y);
    free(l->params);
    free(l->buffers);
    free(l->p);
    free(l->g);
    free(l->b);
    free(l);
}

static void fill_spec(ch_tensor_spec *s, const char *suffix, int ndim, const int64_t *dims,
                      ch_init_role role, int fan_in)
{
    CH_ASSERT(ndim >= 1 && ndim <= CH_MAX_DIMS);
    memset(s, 0, sizeof *s);
    s->suffix = suffix;
    s->ndim = ndim;
    s->count = 1;
    for (int i = 0; i < ndim; i++) {
        s->dims[i] = dims[i];
        s->count *= (size_t)dims[i];
    }
    s->role = role;
    s->fan_in = fan_in;
}

/* Grow *a (n elements of size sz) by one; false when it cannot. */
static bool grow(void *a, int n, size_t sz)
{
    void *p = realloc(*(void **)a, sz * (size_t)(n + 1));
    if (p) *(void **)a = p;
    return p != NULL;
}

ch_status ch_layer_add_param(ch_layer *l, const char *suffix, int ndim, const int64_t *dims,
                             ch_init_role role, int fan_in, ch_err *err)
{
    if (!grow(&l->params, l->nparams, sizeof *l->params) || !grow(&l->p, l->nparams, sizeof *l->p) ||
        !grow(&l->g, l->nparams, sizeof *l->g))
        return CH_SYS_FAIL(err, "realloc of a layer's parameter specs");
    l->p[l->nparams] = l->g[l->nparams] = NULL;
    fill_spec(&l->params[l->nparams++], suffix, ndim, dims, role, fan_in);
    return CH_STATUS_OK;
}

ch_status ch_layer_add_buffer(ch_layer *l, const char *suffix, int ndim, const int64_t *dims,
                              ch_init_role role, ch_err *err)
{
    if (!grow(&l->buffers, l->nbuffers, sizeof *l->buffers) || !grow(&l->b, l->nbuffers, sizeof *l->b))
        return CH_SYS_FAIL(err, "realloc of a layer's buffer specs");
    l->b[l->nbuffers] = NULL;
    fill_spec(&l->buffers[l->nbuffers++], suffix, ndim, dims, role, 0);
    return CH_STATUS_OK;
}

ch_status ch_layer_finish(ch_layer *l, ch_status st, ch_layer **out)
{
    if (st != CH_STATUS_OK) {
        ch_layer_free(l);
        return st;
    }
    *out = l;
    return CH_STATUS_OK;
}

ch_status ch_layer_add_child(ch_layer *l, ch_layer *child, ch_err *err)
{
    ch_layer **c = realloc(l->children, sizeof *c * (size_t)(l->nchildren + 1));
    if (!c) {
        ch_layer_free(child);
        return CH_SYS_FAIL(err, "realloc of layer children");
    }
    l->children = c;
    l->children[l->nchildren++] = child;
    return CH_STATUS_OK;
}

ch_status ch_layer_alloc_output(ch_layer *l, const ch_plan *pl, ch_err *err)
{
    l->y = ch_layer_alloc_saved(l, pl, ch_shape3_size(l->out) * (size_t)pl->max_batch,
                                sizeof(ch_real), err);
    if (!l->y) return CH_STATUS_SYSTEM;
    l->y_owned = true;
    return CH_STATUS_OK;
}

void *ch_layer_alloc_saved(ch_layer *l, const ch_plan *pl, size_t count, size_t size, ch_err *err)
{
    l->be = pl->be;
    void *p = count <= SIZE_MAX / size ? ch_backend_alloc(pl->be, count * size) : NULL;
    if (!p) ch_fail(err, CH_STATUS_SYSTEM, "allocation of %s's activations (%zu values) failed", l->name, count);
    return p;
}

void ch_layer_release(const ch_layer *l, void *p)
{
    if (p && l->be) ch_backend_release(l->be, p);
}

void ch_layer_borrow_output(ch_layer *l, ch_real *buf)
{
    if (l->y_owned) ch_backend_release(l->be, l->y);
    l->y = buf;
    l->y_owned = false;
}

ch_status ch_layer_plan_tree(ch_layer *l, ch_plan *pl, ch_err *err)
{
    for (int i = 0; i < l->nchildren; i++) CH_TRY(ch_layer_plan_tree(l->children[i], pl, err));
    CH_TRY(l->ops->plan(l, pl, err));
    l->scratch_need = l->scratch_own + ch_layer_children_need(l);
    return CH_STATUS_OK;
}

size_t ch_layer_children_need(const ch_layer *l)
{
    size_t most = 0;
    for (int i = 0; i < l->nchildren; i++)
        if (l->children[i]->scratch_need > most) most = l->children[i]->scratch_need;
    return most;
}

ch_run ch_run_above(const ch_run *r, const ch_layer *l)
{
    ch_run sub = *r;
    CH_ASSERT(l->scratch_own <= r->scratch_len);
    sub.scratch = r->scratch + l->scratch_own;
    sub.scratch_len = r->scratch_len - l->scratch_own;
    return sub;
}

void ch_run_grads_ready(const ch_run *r, const ch_layer *l)
{
    if (l->tied_to) return;
    for (const ch_layer *t = l->tie_next; t; t = t->tie_next)
        for (int i = 0; i < l->nparams; i++) r->k->add(&r->kc, l->params[i].count, l->g[i], t->g[i], l->g[i]);
    if (!r->grads_ready) return;
    for (int i = 0; i < l->nparams; i++)
        r->grads_ready(r->grads_user, l->params[i].offset, l->params[i].count);
}

void ch_run_comm_failed(const ch_run *r, ch_status st, const ch_err *err)
{
    if (!r->comm_status || *r->comm_status != CH_STATUS_OK) return;
    *r->comm_status = st;
    if (r->comm_err && err) *r->comm_err = *err;
}
