/* Helpers shared by the unit tests. */
#include "test_util.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

#include "core/rng.h"
#include "nn/model.h"
#include "data/dataset.h"

void tu_fill_uniform(ch_real *x, size_t n, double lo, double hi, uint64_t seed)
{
    ch_rng r;
    ch_rng_init(&r, seed, CH_RNG_STREAM_TEST, 0);
    for (size_t i = 0; i < n; i++) x[i] = (ch_real)(lo + (hi - lo) * ch_rng_uniform(&r));
}

double tu_max_rel_err(const ch_real *a, const ch_real *b, size_t n, double floor)
{
    double worst = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - b[i]);
        double m = fmax(fmax(fabs((double)a[i]), fabs((double)b[i])), floor);
        if (!(d / m <= worst)) worst = d / m;   /* NaN counts as the worst */
    }
    return worst;
}

double tu_max_norm_err(const ch_real *a, const ch_real *b, size_t n)
{
    double diff = 0, scale = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - b[i]);
        if (!(d <= diff)) diff = d;
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
