/* Image decoding and resampling against Pillow (the decoder and resizer behind torchvision's
 * ImageFolder), the ImageFolder evaluation transform, RandomResizedCrop's windows, the threaded
 * loader's bits, and clean refusals of damaged files. The Pillow answers are written at test time
 * by make_image_fixtures.py into $COHORT_IMAGE_FIXTURES. */
#include "test_util.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/file.h"
#include "data/augment.h"
#include "data/dataset.h"
#include "data/folder.h"
#include "data/image.h"
#include "data/loader.h"

static const char *fixtures(void)
{
    const char *dir = getenv("COHORT_IMAGE_FIXTURES");
    if (!dir) fail_msg("COHORT_IMAGE_FIXTURES is not set (ctest sets it)");
    return dir;
}

static uint8_t *slurp(const char *name, size_t *len)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", fixtures(), name);
    uint8_t *data;
    ch_err err;
    if (ch_file_read(path, (size_t)1 << 30, &data, len, &err) != CH_STATUS_OK) fail_msg("%s", err.msg);
    return data;
}

static ch_image decode_fixture(const char *name)
{
    size_t len;
    uint8_t *data = slurp(name, &len);
    ch_image img;
    ch_err err;
    if (ch_image_decode(data, len, name, CH_IMAGE_MAX_PIXELS, &img, &err) != CH_STATUS_OK) fail_msg("%s", err.msg);
    free(data);
    return img;
}

/* Every form (gray, RGB, RGBA, gray + alpha, palette PNG; RGB and gray JPEG) decodes to exactly
 * Pillow's convert("RGB") bytes. */
static void decodes_as_pillow(void **state)
{
    (void)state;
    char path[4096];
    snprintf(path, sizeof path, "%s/files.txt", fixtures());
    FILE *f = fopen(path, "r");
    assert_non_null(f);
    char name[256];
    int w, h, files = 0;
    while (fscanf(f, "%255s %d %d", name, &w, &h) == 3) {
        ch_image img = decode_fixture(name);
        assert_int_equal(img.w, w);
        assert_int_equal(img.h, h);
        char ref[300];
        snprintf(ref, sizeof ref, "%s.rgb", name);
        size_t len;
        uint8_t *want = slurp(ref, &len);
        assert_int_equal(len, (size_t)w * h * 3);
        size_t differ = 0;
        for (size_t i = 0; i < len; i++) differ += img.rgb[i] != want[i];
        if (differ) fail_msg("%s: %zu of %zu bytes differ from Pillow's", name, differ, len);
        free(want);
        free(img.rgb);
        files++;
    }
    fclose(f);
    assert_int_equal(files, 8);
}

/* Pillow's bilinear resize of a box, shrinking (antialiased) and enlarging: within 1 of each byte
 * (Pillow rounds to 8 bits between its two passes; cohort keeps floats). */
static void resamples_as_pillow(void **state)
{
    (void)state;
    ch_image src = decode_fixture("rgb.png");
    char path[4096];
    snprintf(path, sizeof path, "%s/resize.txt", fixtures());
    FILE *f = fopen(path, "r");
    assert_non_null(f);
    int x0, y0, x1, y1, ow, oh, cases = 0;
    char file[256];
    while (fscanf(f, "%d %d %d %d %d %d %255s", &x0, &y0, &x1, &y1, &ow, &oh, file) == 7) {
        size_t len;
        uint8_t *want = slurp(file, &len);
        assert_int_equal(len, (size_t)ow * oh * 3);
        uint8_t *got = malloc(len);
        assert_non_null(got);
        ch_err err;
        assert_int_equal(ch_image_resample(&src, x0, y0, x1 - x0, y1 - y0, ow, oh, got, &err), CH_STATUS_OK);
        int worst = 0;
        for (size_t i = 0; i < len; i++) {
            const int d = abs((int)got[i] - (int)want[i]);
            worst = d > worst ? d : worst;
        }
        if (worst > 1) fail_msg("%s: a byte differs from Pillow's by %d", file, worst);
        free(got);
        free(want);
        cases++;
    }
    fclose(f);
    assert_int_equal(cases, 5);
    free(src.rgb);
}

/* The evaluation transform of an ImageFolder (Resize(73) + CenterCrop(64)) is torchvision's. */
static void folder_eval_is_resize_center_crop(void **state)
{
    (void)state;
    char dir[4096];
    snprintf(dir, sizeof dir, "%s/folder", fixtures());
    ch_dataset *d;
    ch_err err;
    const ch_folder_options o = { .image_size = 64 };
    if (ch_dataset_load_folder(dir, CH_SPLIT_TEST, &o, &d, &err) != CH_STATUS_OK) fail_msg("%s", err.msg);
    assert_int_equal(d->n, 1);
    assert_int_equal(d->classes, 2);
    ch_real *x = malloc(sizeof(ch_real) * 3 * 64 * 64);
    assert_non_null(x);
    int32_t label = -1;
    const uint32_t i0 = 0;
    const ch_augment plain = { .crop_padding = -1 };
    assert_int_equal(ch_augment_gather(&plain, d, &i0, 1, false, 0, 0, x, &label, &err), CH_STATUS_OK);
    assert_int_equal(label, 0);
    size_t len;
    uint8_t *want = slurp("center.rgb", &len);
    assert_int_equal(len, (size_t)64 * 64 * 3);
    int worst = 0;
    for (int c = 0; c < 3; c++)
        for (int p = 0; p < 64 * 64; p++) {
            const int got = (int)lround(x[c * 64 * 64 + p] * 255.0);
            const int dlt = abs(got - want[p * 3 + c]);
            worst = dlt > worst ? dlt : worst;
        }
    if (worst > 1) fail_msg("center crop: a value differs from torchvision's by %d / 255", worst);
    free(want);
    free(x);
    ch_dataset_free(d);
}

/* RandomResizedCrop windows: inside the image, area 8%..100% and aspect 3/4..4/3 (up to rounding),
 * a function of (seed, epoch, sample) only, and spread over the whole range. */
static void rrc_windows_are_torchvisions(void **state)
{
    (void)state;
    const int W = 97, H = 61;
    double min_area = 1, max_area = 0;
    int distinct = 0, px = -1;
    for (uint32_t s = 0; s < 2000; s++) {
        int x, y, w, h, x2, y2, w2, h2;
        ch_augment_rrc_window(5, 1, s, W, H, &x, &y, &w, &h);
        ch_augment_rrc_window(5, 1, s, W, H, &x2, &y2, &w2, &h2);
        assert_true(x == x2 && y == y2 && w == w2 && h == h2);
        assert_true(x >= 0 && y >= 0 && w >= 1 && h >= 1 && x + w <= W && y + h <= H);
        const double area = (double)w * h / (W * H), ratio = (double)w / h;
        assert_true(area <= 1.0 && area >= 0.06);
        assert_true(ratio >= 0.70 && ratio <= 1.43);
        min_area = area < min_area ? area : min_area;
        max_area = area > max_area ? area : max_area;
        distinct += x != px;
        px = x;
    }
    assert_true(min_area < 0.12 && max_area > 0.6);
    assert_true(distinct > 1000);
    int a[4], b[4];
    ch_augment_rrc_window(5, 1, 7, W, H, &a[0], &a[1], &a[2], &a[3]);
    ch_augment_rrc_window(5, 2, 7, W, H, &b[0], &b[1], &b[2], &b[3]);
    assert_true(memcmp(a, b, sizeof a) != 0); /* a new epoch, new windows */
}

/* Damaged files are refused with a message naming the file, before any huge allocation. */
static void refuses_bad_files(void **state)
{
    (void)state;
    static const struct { const char *name, *says; } cases[] = {
        { "bad/truncated.png", "not a readable PNG" }, { "bad/truncated.jpg", "not a readable JPEG" },
        { "bad/corrupt.png", "not a readable PNG" },   { "bad/corrupt.jpg", "not a readable JPEG" },
        { "bad/huge.png", "decompression bomb" },      { "bad/huge.jpg", "decompression bomb" },
        { "bad/text.png", "neither a PNG nor a JPEG" }, { "bad/empty.jpg", "neither a PNG nor a JPEG" },
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        size_t len;
        uint8_t *data = slurp(cases[k].name, &len);
        ch_image img = { 0 };
        ch_err err;
        assert_int_equal(ch_image_decode(data, len, cases[k].name, CH_IMAGE_MAX_PIXELS, &img, &err), CH_STATUS_BAD_INPUT);
        assert_null(img.rgb);
        if (!strstr(err.msg, cases[k].name) || !strstr(err.msg, cases[k].says))
            fail_msg("%s: message '%s' should name the file and say '%s'", cases[k].name, err.msg, cases[k].says);
        free(data);
    }
}

/* The loader's batches are the same bits with 1 and 3 workers and as gathering in place. */
static void loader_bits_do_not_depend_on_workers(void **state)
{
    (void)state;
    ch_dataset *d = tu_synthetic(300, 12, 4);
    const ch_augment a = { .crop_padding = 2, .flip = true };
    enum { B = 37, NB = 8 };
    uint32_t perm[B * NB];
    for (uint32_t i = 0; i < B * NB; i++) perm[i] = (i * 113) % 300;
    ch_loader_batch batches[NB];
    for (int k = 0; k < NB; k++) batches[k] = (ch_loader_batch){ perm + k * B, k == NB - 1 ? 5 : B };
    const size_t per = 144;
    ch_real *want = malloc(sizeof(ch_real) * per * B);
    int32_t wl[B];
    assert_non_null(want);
    ch_err err;
    for (int workers = 1; workers <= 3; workers += 2) {
        ch_loader *l;
        assert_int_equal(ch_loader_create(workers, B, per, &l, &err), CH_STATUS_OK);
        assert_int_equal(ch_loader_start(l, &a, d, 11, 3, batches, NB, &err), CH_STATUS_OK);
        for (int k = 0; k < NB; k++) {
            const ch_real *x;
            const int32_t *labels;
            assert_int_equal(ch_loader_next(l, &x, &labels, &err), CH_STATUS_OK);
            assert_int_equal(ch_augment_gather(&a, d, batches[k].idx, batches[k].count, true, 11, 3, want, wl, &err),
                             CH_STATUS_OK);
            assert_memory_equal(x, want, sizeof(ch_real) * per * (size_t)batches[k].count);
            assert_memory_equal(labels, wl, sizeof(int32_t) * (size_t)batches[k].count);
            ch_loader_release(l);
        }
        ch_loader_stop(l);
        /* Stopped early, mid-epoch: the workers end without a consumer. */
        assert_int_equal(ch_loader_start(l, &a, d, 11, 4, batches, NB, &err), CH_STATUS_OK);
        ch_loader_stop(l);
        ch_loader_free(l);
    }
    free(want);
    ch_dataset_free(d);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(decodes_as_pillow),
        cmocka_unit_test(resamples_as_pillow),
        cmocka_unit_test(folder_eval_is_resize_center_crop),
        cmocka_unit_test(rrc_windows_are_torchvisions),
        cmocka_unit_test(refuses_bad_files),
        cmocka_unit_test(loader_bits_do_not_depend_on_workers),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
