/* Augmentation: RandomCrop with padding and RandomHorizontalFlip as torchvision defines them, and
 * Normalize; the random choices are a function of (seed, epoch, sample) alone. */
#include "test_util.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "data/augment.h"
#include "data/dataset.h"

enum { C = 3, H = 6, W = 5, N = 64 };

static ch_dataset *make(void)
{
    ch_dataset *d = tu_synthetic(N, 4, 3);
    free(d->images);
    d->c = C, d->h = H, d->w = W;
    d->images = malloc((size_t)N * C * H * W);
    assert_non_null(d->images);
    for (size_t i = 0; i < (size_t)N * C * H * W; i++) d->images[i] = (uint8_t)(1 + (i * 37) % 250);
    return d;
}

/* Does out equal sample i shifted by (dy, dx), flipped or not, zeros outside? */
static bool is_window(const ch_dataset *d, uint32_t i, const ch_real *out, int dy, int dx, bool flip)
{
    const uint8_t *src = d->images + (size_t)i * C * H * W;
    for (int c = 0; c < C; c++)
        for (int y = 0; y < H; y++)
            for (int x = 0; x < W; x++) {
                const int sy = y + dy, sx = (flip ? W - 1 - x : x) + dx;
                const int v = sy >= 0 && sy < H && sx >= 0 && sx < W ? src[(c * H + sy) * W + sx] : 0;
                if (fabs(out[(c * H + y) * W + x] - v / 255.0) > 1e-6) return false;
            }
    return true;
}

static void crop_and_flip_are_torchvisions(void **state)
{
    (void)state;
    ch_dataset *d = make();
    const ch_augment a = { .crop_padding = 1, .flip = true };
    ch_err err;
    uint32_t idx[N];
    for (int i = 0; i < N; i++) idx[i] = (uint32_t)i;
    ch_real *x = malloc(sizeof(ch_real) * N * C * H * W), *one = malloc(sizeof(ch_real) * C * H * W);
    int32_t labels[N], l1;
    assert_non_null(x);
    assert_non_null(one);
    assert_int_equal(ch_augment_gather(&a, d, idx, N, true, 9, 2, x, labels, &err), CH_STATUS_OK);
    int seen[3][3][2] = { { { 0 } } };
    for (int i = 0; i < N; i++) {
        const ch_real *out = x + (size_t)i * C * H * W;
        int found = 0;
        for (int dy = -1; dy <= 1; dy++)
            for (int dx = -1; dx <= 1; dx++)
                for (int f = 0; f < 2; f++)
                    if (is_window(d, (uint32_t)i, out, dy, dx, f)) {
                        seen[dy + 1][dx + 1][f]++;
                        found = 1;
                    }
        assert_true(found);
        assert_int_equal(labels[i], d->labels[i]);
        /* The same sample alone, in another batch position: the same choice. */
        assert_int_equal(ch_augment_gather(&a, d, &idx[i], 1, true, 9, 2, one, &l1, &err), CH_STATUS_OK);
        assert_memory_equal(one, out, sizeof(ch_real) * C * H * W);
    }
    int kinds = 0;
    for (int dy = 0; dy < 3; dy++)
        for (int dx = 0; dx < 3; dx++)
            for (int f = 0; f < 2; f++) kinds += seen[dy][dx][f] > 0;
    assert_true(kinds >= 14);   /* 18 possible choices over 64 samples */
    /* Another epoch draws other choices; evaluation draws none. */
    assert_int_equal(ch_augment_gather(&a, d, idx, N, true, 9, 3, x, labels, &err), CH_STATUS_OK);
    ch_real *e2 = malloc(sizeof(ch_real) * N * C * H * W);
    assert_non_null(e2);
    assert_int_equal(ch_augment_gather(&a, d, idx, N, true, 9, 2, e2, labels, &err), CH_STATUS_OK);
    assert_true(memcmp(x, e2, sizeof(ch_real) * N * C * H * W) != 0);
    assert_int_equal(ch_augment_gather(&a, d, idx, N, false, 9, 2, e2, labels, &err), CH_STATUS_OK);
    for (int i = 0; i < N; i++) assert_true(is_window(d, (uint32_t)i, e2 + (size_t)i * C * H * W, 0, 0, false));
    free(x);
    free(one);
    free(e2);
    ch_dataset_free(d);
}

static void normalize_is_torchvisions(void **state)
{
    (void)state;
    ch_dataset *d = make();
    ch_augment a = { 0 };
    ch_err err;
    assert_int_equal(ch_augment_parse_normalize(&a, "0.5,0.25,0.1/0.5,0.2,0.3", C, &err), CH_STATUS_OK);
    uint32_t i0 = 5;
    ch_real x[C * H * W];
    int32_t l;
    assert_int_equal(ch_augment_gather(&a, d, &i0, 1, false, 0, 0, x, &l, &err), CH_STATUS_OK);
    const double m[3] = { 0.5, 0.25, 0.1 }, s[3] = { 0.5, 0.2, 0.3 };
    for (int c = 0; c < C; c++)
        for (int k = 0; k < H * W; k++) {
            const double v = d->images[(size_t)i0 * C * H * W + c * H * W + k] / 255.0;
            assert_true(fabs(x[c * H * W + k] - (v - m[c]) / s[c]) < 1e-5);
        }
    assert_int_equal(ch_augment_parse_normalize(&a, "imagenet", C, &err), CH_STATUS_OK);
    assert_true(a.mean[1] == 0.456 && a.std[2] == 0.225);
    assert_int_equal(ch_augment_parse_normalize(&a, "imagenet", 1, &err), CH_STATUS_BAD_INPUT);
    assert_int_equal(ch_augment_parse_normalize(&a, "0.5,0.5/0.1", C, &err), CH_STATUS_BAD_INPUT);
    assert_int_equal(ch_augment_parse_normalize(&a, "0.5/0", C, &err), CH_STATUS_BAD_INPUT);
    assert_int_equal(ch_augment_parse_normalize(&a, "0.5", C, &err), CH_STATUS_BAD_INPUT);
    ch_dataset_free(d);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(crop_and_flip_are_torchvisions),
        cmocka_unit_test(normalize_is_torchvisions),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
