/* The IDX reader: a valid set loads (raw and gzip); every kind of bad file is a clean
 * CH_STATUS_BAD_INPUT whose message names the file. */
#include "test_util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "data/dataset.h"

enum { N = 5, ROWS = 4, COLS = 3 };

static size_t images_blob(uint8_t *buf, uint32_t magic, uint32_t n, uint32_t rows, uint32_t cols,
                          size_t data_len)
{
    const uint32_t h[4] = { magic, n, rows, cols };
    for (int i = 0; i < 4; i++) {
        buf[4 * i] = (uint8_t)(h[i] >> 24);
        buf[4 * i + 1] = (uint8_t)(h[i] >> 16);
        buf[4 * i + 2] = (uint8_t)(h[i] >> 8);
        buf[4 * i + 3] = (uint8_t)h[i];
    }
    for (size_t i = 0; i < data_len; i++) buf[16 + i] = (uint8_t)(i * 7);
    return 16 + data_len;
}

static size_t labels_blob(uint8_t *buf, uint32_t n, size_t data_len, uint8_t bad_label)
{
    const uint32_t h[2] = { 0x801, n };
    for (int i = 0; i < 2; i++) {
        buf[4 * i] = (uint8_t)(h[i] >> 24);
        buf[4 * i + 1] = (uint8_t)(h[i] >> 16);
        buf[4 * i + 2] = (uint8_t)(h[i] >> 8);
        buf[4 * i + 3] = (uint8_t)h[i];
    }
    for (size_t i = 0; i < data_len; i++) buf[8 + i] = (uint8_t)(i % 10);
    if (bad_label && data_len) buf[8 + data_len - 1] = bad_label;
    return 8 + data_len;
}

/* Write a train split with the given image and label blobs; returns the load status. */
static ch_status load(const uint8_t *img, size_t il, const uint8_t *lab, size_t ll, int gz,
                      ch_err *err, ch_dataset **out)
{
    char dir[64];
    tu_mkdtemp(dir, sizeof dir);
    tu_write_file(dir, gz ? "train-images-idx3-ubyte.gz" : "train-images-idx3-ubyte", img, il, gz);
    if (lab) tu_write_file(dir, gz ? "train-labels-idx1-ubyte.gz" : "train-labels-idx1-ubyte", lab, ll, gz);
    ch_dataset *d = NULL;
    ch_status st = ch_dataset_load_idx(dir, CH_SPLIT_TRAIN, &d, err);
    if (out) *out = d; else ch_dataset_free(d);
    tu_rmdir(dir);
    return st;
}

static void expect_error(ch_status st, const ch_err *err, const char *needle)
{
    assert_int_equal(st, CH_STATUS_BAD_INPUT);
    if (!strstr(err->msg, needle)) fail_msg("message '%s' lacks '%s'", err->msg, needle);
    assert_null(strchr(err->msg, '\n'));
}

static uint8_t img[4096], lab[512];

static void valid_files_load_raw_and_gzip(void **state)
{
    (void)state;
    for (int gz = 0; gz < 2; gz++) {
        size_t il = images_blob(img, 0x803, N, ROWS, COLS, N * ROWS * COLS);
        size_t ll = labels_blob(lab, N, N, 0);
        ch_err err;
        ch_dataset *d;
        assert_int_equal(load(img, il, lab, ll, gz, &err, &d), CH_STATUS_OK);
        assert_int_equal(ch_dataset_size(d), N);
        int c, h, w;
        ch_dataset_shape(d, &c, &h, &w);
        assert_int_equal(c, 1);
        assert_int_equal(h, ROWS);
        assert_int_equal(w, COLS);
        assert_int_equal(d->images[7], 49);
        assert_int_equal(d->labels[3], 3);
        ch_dataset_free(d);
    }
}

static void truncated_images_are_refused(void **state)
{
    (void)state;
    for (int gz = 0; gz < 2; gz++) {
        size_t il = images_blob(img, 0x803, N, ROWS, COLS, N * ROWS * COLS - 5);
        size_t ll = labels_blob(lab, N, N, 0);
        ch_err err;
        expect_error(load(img, il, lab, ll, gz, &err, NULL), &err, "truncated");
        expect_error(load(img, 10, lab, ll, gz, &err, NULL), &err, "train-images");
    }
}

static void wrong_magic_is_refused(void **state)
{
    (void)state;
    size_t il = images_blob(img, 0x801, N, ROWS, COLS, N * ROWS * COLS);
    size_t ll = labels_blob(lab, N, N, 0);
    ch_err err;
    expect_error(load(img, il, lab, ll, 1, &err, NULL), &err, "bad magic");
    il = images_blob(img, 0x0D03, N, ROWS, COLS, N * ROWS * COLS);   /* float data */
    expect_error(load(img, il, lab, ll, 0, &err, NULL), &err, "bad magic");
}

static void count_mismatch_is_refused(void **state)
{
    (void)state;
    size_t il = images_blob(img, 0x803, N, ROWS, COLS, N * ROWS * COLS);
    size_t ll = labels_blob(lab, N - 1, N - 1, 0);
    ch_err err;
    expect_error(load(img, il, lab, ll, 1, &err, NULL), &err, "4 labels, but");
}

static void label_out_of_range_is_refused(void **state)
{
    (void)state;
    size_t il = images_blob(img, 0x803, N, ROWS, COLS, N * ROWS * COLS);
    size_t ll = labels_blob(lab, N, N, 10);
    ch_err err;
    expect_error(load(img, il, lab, ll, 1, &err, NULL), &err, "label 10 of sample 4");
}

static void missing_and_empty_files_are_refused(void **state)
{
    (void)state;
    size_t il = images_blob(img, 0x803, N, ROWS, COLS, N * ROWS * COLS);
    ch_err err;
    expect_error(load(img, il, NULL, 0, 1, &err, NULL), &err, "no such readable file");
    size_t ll = labels_blob(lab, N, N, 0);
    expect_error(load(img, 0, lab, ll, 0, &err, NULL), &err, "truncated");
    expect_error(load(img, il, lab, 0, 1, &err, NULL), &err, "train-labels");
}

static void trailing_bytes_and_huge_dimensions_are_refused(void **state)
{
    (void)state;
    size_t il = images_blob(img, 0x803, N, ROWS, COLS, N * ROWS * COLS + 3);
    size_t ll = labels_blob(lab, N, N, 0);
    ch_err err;
    expect_error(load(img, il, lab, ll, 1, &err, NULL), &err, "trailing bytes");
    il = images_blob(img, 0x803, N, 1u << 20, COLS, 16);
    expect_error(load(img, il, lab, ll, 1, &err, NULL), &err, "dimension 1");
    il = images_blob(img, 0x803, 0, ROWS, COLS, 0);
    expect_error(load(img, il, lab, ll, 1, &err, NULL), &err, "dimension 0");
}

static void corrupt_gzip_is_refused(void **state)
{
    (void)state;
    /* A gzip member whose deflate data is garbage. */
    uint8_t junk[64] = { 0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 0, 3 };
    for (size_t i = 10; i < sizeof junk; i++) junk[i] = (uint8_t)(i * 37 + 11);
    size_t ll = labels_blob(lab, N, N, 0);
    ch_err err;
    char dir[64];
    tu_mkdtemp(dir, sizeof dir);
    tu_write_file(dir, "train-images-idx3-ubyte.gz", junk, sizeof junk, 0);
    tu_write_file(dir, "train-labels-idx1-ubyte.gz", lab, ll, 1);
    ch_dataset *d = NULL;
    expect_error(ch_dataset_load_idx(dir, CH_SPLIT_TRAIN, &d, &err), &err, "train-images");
    assert_null(d);
    tu_rmdir(dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(valid_files_load_raw_and_gzip),
        cmocka_unit_test(truncated_images_are_refused),
        cmocka_unit_test(wrong_magic_is_refused),
        cmocka_unit_test(count_mismatch_is_refused),
        cmocka_unit_test(label_out_of_range_is_refused),
        cmocka_unit_test(missing_and_empty_files_are_refused),
        cmocka_unit_test(trailing_bytes_and_huge_dimensions_are_refused),
        cmocka_unit_test(corrupt_gzip_is_refused),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
