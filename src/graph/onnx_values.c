/* The ONNX importer's value table and tensor decoding (see onnx_values.h). Everything here reads
 * untrusted bytes: every size is bounded before it is multiplied or used. */
#include "graph/onnx_values.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* A tensor of more than 2^31 elements (8 GiB of floats) is no CNN this trainer can hold. */
static const double max_elems = 2147483648.0;

static uint64_t hash(const char *s)
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 0x100000001b3ull;
    return h;
}

void ch_ovals_free(ch_ovals *t)
{
    free(t->v);
    free(t->slot);
    *t = (ch_ovals){ 0 };
}

ch_oval *ch_ovals_find(const ch_ovals *t, const char *name)
{
    if (!t->nslots || !name) return NULL;
    for (size_t k = hash(name) & (t->nslots - 1);; k = (k + 1) & (t->nslots - 1)) {
        if (t->slot[k] < 0) return NULL;
        if (strcmp(t->v[t->slot[k]].name, name) == 0) return &t->v[t->slot[k]];
    }
}

static ch_status grow(ch_ovals *t, ch_err *err)
{
    if (t->n == t->cap) {
        const size_t cap = t->cap ? 2 * t->cap : 64;
        ch_oval *v = realloc(t->v, sizeof *v * cap);
        CH_CHECK_ALLOC(err, v);
        t->v = v;
        t->cap = cap;
    }
    if (2 * (t->n + 1) > t->nslots) { /* at most half full: probes stay short */
        const size_t ns = t->nslots ? 2 * t->nslots : 128;
        int32_t *s = malloc(sizeof *s * ns);
        CH_CHECK_ALLOC(err, s);
        for (size_t k = 0; k < ns; k++) s[k] = -1;
        for (size_t i = 0; i < t->n; i++) {
            size_t k = hash(t->v[i].name) & (ns - 1);
            while (s[k] >= 0) k = (k + 1) & (ns - 1);
            s[k] = (int32_t)i;
        }
        free(t->slot);
        t->slot = s;
        t->nslots = ns;
    }
    return CH_STATUS_OK;
}

ch_oval *ch_ovals_add(ch_ovals *t, const char *name, ch_oval_kind kind, ch_err *err)
{
    if (!name || !name[0]) {
        ch_fail(err, CH_STATUS_BAD_INPUT, "a value without a name");
        return NULL;
    }
    if (ch_ovals_find(t, name)) {
        ch_fail(err, CH_STATUS_BAD_INPUT, "value '%.200s' is defined twice", name);
        return NULL;
    }
    if (t->n >= (1u << 24)) {
        ch_fail(err, CH_STATUS_BAD_INPUT, "more than %u values", 1u << 24);
        return NULL;
    }
    if (grow(t, err) != CH_STATUS_OK) return NULL;
    ch_oval *v = &t->v[t->n];
    *v = (ch_oval){ .name = name, .kind = kind, .tensor = -1 };
    size_t k = hash(name) & (t->nslots - 1);
    while (t->slot[k] >= 0) k = (k + 1) & (t->nslots - 1);
    t->slot[k] = (int32_t)t->n++;
    return v;
}

ch_status ch_onnx_tensor_count(const Onnx__TensorProto *t, const char *what, size_t *count, ch_err *err)
{
    if (t->has_data_location && t->data_location == ONNX__TENSOR_PROTO__DATA_LOCATION__EXTERNAL)
        return ch_fail(err, CH_STATUS_BAD_INPUT, "%s keeps its data in an external file, which cohort does not read: "
                       "export the model as one file (under 2 GiB)", what);
    if (t->segment) return ch_fail(err, CH_STATUS_BAD_INPUT, "%s is a segment of a tensor", what);
    if (t->n_dims > 8) return ch_fail(err, CH_STATUS_BAD_INPUT, "%s has %zu dimensions", what, t->n_dims);
    double n = 1;
    for (size_t i = 0; i < t->n_dims; i++) {
        if (t->dims[i] < 0 || t->dims[i] > (1 << 30))
            return ch_fail(err, CH_STATUS_BAD_INPUT, "%s: dimension %zu is %lld", what, i, (long long)t->dims[i]);
        n *= (double)t->dims[i];
        if (n > max_elems) return ch_fail(err, CH_STATUS_BAD_INPUT, "%s has more than 2^31 elements", what);
    }
    *count = (size_t)n;
    return CH_STATUS_OK;
}

ch_status ch_onnx_tensor_floats(const Onnx__TensorProto *t, const char *what, float **out, size_t *count,
                                ch_err *err)
{
    size_t n;
    CH_TRY(ch_onnx_tensor_count(t, what, &n, err));
    if (t->data_type != ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT)
        return ch_fail(err, CH_STATUS_BAD_INPUT, "%s has data type %d; weights must be float32 (1)", what,
                       (int)t->data_type);
    float *v = malloc(sizeof(float) * (n ? n : 1));
    CH_CHECK_ALLOC(err, v);
    if (t->has_raw_data && t->raw_data.len == n * sizeof(float)) {
        if (n) memcpy(v, t->raw_data.data, n * sizeof(float)); /* little-endian, as ONNX stores it */
    } else if (!t->has_raw_data && t->n_float_data == n) {
        if (n) memcpy(v, t->float_data, n * sizeof(float));
    } else {
        free(v);
        return ch_fail(err, CH_STATUS_BAD_INPUT, "%s: its shape has %zu elements, its data %zu", what, n,
                       t->has_raw_data ? t->raw_data.len / sizeof(float) : t->n_float_data);
    }
    *out = v;
    *count = n;
    return CH_STATUS_OK;
}

/* Element k of a small tensor's data as a double, by type; false when it is not there. */
static bool element(const Onnx__TensorProto *t, size_t k, double *x, int64_t *i)
{
    const size_t raw = t->has_raw_data ? t->raw_data.len : 0;
    const uint8_t *p = t->raw_data.data;
    switch (t->data_type) {
    case ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT: {
        float f;
        if (t->has_raw_data) {
            if ((k + 1) * 4 > raw) return false;
            memcpy(&f, p + 4 * k, 4);
        } else if (k < t->n_float_data) f = t->float_data[k];
        else return false;
        *x = f;
        *i = isfinite(f) && fabs(f) < 9e18 ? (int64_t)f : 0;
        return true;
    }
    case ONNX__TENSOR_PROTO__DATA_TYPE__DOUBLE:
        if (t->has_raw_data) {
            if ((k + 1) * 8 > raw) return false;
            memcpy(x, p + 8 * k, 8);
        } else if (k < t->n_double_data) *x = t->double_data[k];
        else return false;
        *i = isfinite(*x) && fabs(*x) < 9e18 ? (int64_t)*x : 0;
        return true;
    case ONNX__TENSOR_PROTO__DATA_TYPE__INT64:
        if (t->has_raw_data) {
            if ((k + 1) * 8 > raw) return false;
            memcpy(i, p + 8 * k, 8);
        } else if (k < t->n_int64_data) *i = t->int64_data[k];
        else return false;
        *x = (double)*i;
        return true;
    case ONNX__TENSOR_PROTO__DATA_TYPE__INT32:
    case ONNX__TENSOR_PROTO__DATA_TYPE__BOOL: {
        const size_t w = t->data_type == ONNX__TENSOR_PROTO__DATA_TYPE__BOOL ? 1 : 4;
        if (t->has_raw_data) {
            if ((k + 1) * w > raw) return false;
            int32_t v = 0;
            if (w == 1) v = p[k];
            else memcpy(&v, p + 4 * k, 4);
            *i = v;
        } else if (k < t->n_int32_data) *i = t->int32_data[k];
        else return false;
        *x = (double)*i;
        return true;
    }
    default: return false;
    }
}

ch_status ch_onnx_tensor_const(const Onnx__TensorProto *t, const char *what, ch_oval *v, ch_err *err)
{
    size_t n;
    CH_TRY(ch_onnx_tensor_count(t, what, &n, err));
    if (t->n_dims > 1 || n > CH_ONNX_CONST_MAX)
        return ch_fail(err, CH_STATUS_BAD_INPUT, "%s: a constant of %zu values in %zu dimensions; cohort folds only "
                       "scalars and short vectors (shape arithmetic, bounds)", what, n, t->n_dims);
    v->kind = CH_OVAL_CONST;
    v->rank = (int)t->n_dims;
    v->n = (int)n;
    v->is_float = t->data_type == ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT ||
                  t->data_type == ONNX__TENSOR_PROTO__DATA_TYPE__DOUBLE;
    for (size_t k = 0; k < n; k++)
        if (!element(t, k, &v->f[k], &v->i[k]))
            return ch_fail(err, CH_STATUS_BAD_INPUT, "%s: data type %d, or fewer values than its shape's %zu", what,
                           (int)t->data_type, n);
    return CH_STATUS_OK;
}
