/* safetensors: what is written reads back the same (names, dtypes, shapes, bytes, metadata), and
 * every kind of damaged or crafted file is a one-line error naming the file (and the tensor), never
 * a crash or an out-of-bounds read. */
#include "test_util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "io/safetensors.h"

static char dir[256];

static int setup(void **state)
{
    (void)state;
    tu_mkdtemp(dir, sizeof dir);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    tu_rmdir(dir);
    return 0;
}

static void test_round_trip(void **state)
{
    (void)state;
    const float w[6] = { 1, -2, 3.5f, 0, 1e-7f, -1e7f };
    const int64_t count = 1234567890123LL;
    const ch_st_tensor ts[3] = {
        { .name = "0.weight", .dtype = CH_ST_F32, .ndim = 2, .shape = { 2, 3 }, .data = w, .nbytes = sizeof w },
        { .name = "1.num_batches_tracked", .dtype = CH_ST_I64, .ndim = 0, .data = &count, .nbytes = 8 },
        { .name = "empty", .dtype = CH_ST_F32, .ndim = 1, .shape = { 0 }, .data = w, .nbytes = 0 },
    };
    const char *const meta[][2] = { { "format", "pt" }, { "model", "lenet" } };
    char path[512];
    snprintf(path, sizeof path, "%s/a.safetensors", dir);
    ch_err err;
    assert_int_equal(ch_st_write(path, ts, 3, meta, 2, &err), CH_STATUS_OK);
    ch_st_file *f = NULL;
    assert_int_equal(ch_st_read(path, &f, &err), CH_STATUS_OK);
    assert_int_equal(f->ntensors, 3);
    for (int i = 0; i < 3; i++) {
        const ch_st_tensor *t = ch_st_find(f, ts[i].name);
        assert_non_null(t);
        assert_int_equal(t->dtype, ts[i].dtype);
        assert_int_equal(t->ndim, ts[i].ndim);
        for (int d = 0; d < t->ndim; d++) assert_int_equal(t->shape[d], ts[i].shape[d]);
        assert_int_equal(t->nbytes, ts[i].nbytes);
        if (t->nbytes) assert_memory_equal(t->data, ts[i].data, t->nbytes);
    }
    assert_string_equal(ch_st_meta(f, "model"), "lenet");
    assert_string_equal(ch_st_meta(f, "format"), "pt");
    assert_null(ch_st_meta(f, "nothing"));
    /* The data section starts 8-byte aligned (the header is padded with spaces). */
    uint64_t hlen;
    memcpy(&hlen, f->image, 8);
    assert_int_equal(hlen % 8, 0);
    ch_st_free(f);
}

/* A file of an 8-byte length, the header text and data_len bytes of data. */
static void write_raw(const char *name, const char *header, size_t data_len, int64_t fake_len)
{
    const size_t hl = strlen(header);
    unsigned char *buf = calloc(8 + hl + data_len + 1, 1);
    assert_non_null(buf);
    const uint64_t len = fake_len >= 0 ? (uint64_t)fake_len : hl;
    for (int i = 0; i < 8; i++) buf[i] = (unsigned char)(len >> (8 * i));
    memcpy(buf + 8, header, hl);
    tu_write_file(dir, name, buf, 8 + hl + data_len, 0);
    free(buf);
}

static void expect_error(const char *name, const char *needle)
{
    char path[512];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    ch_st_file *f = NULL;
    ch_err err;
    assert_int_equal(ch_st_read(path, &f, &err), CH_STATUS_BAD_INPUT);
    assert_null(f);
    if (!strstr(err.msg, needle) || !strstr(err.msg, path)) fail_msg("%s: got '%s', want '%s'", name, err.msg, needle);
}

static void test_bad_files(void **state)
{
    (void)state;
    tu_write_file(dir, "short", "abcd", 4, 0);
    expect_error("short", "too short");
    write_raw("huge_len", "{}", 0, (int64_t)1 << 40);
    expect_error("huge_len", "header length 1099511627776 does not fit");
    write_raw("past_end", "{}", 0, 100);
    expect_error("past_end", "does not fit");
    write_raw("not_json", "{\"a\": ", 0, -1);
    expect_error("not_json", "not a JSON object");
    write_raw("array", "[1, 2]", 0, -1);
    expect_error("array", "not a JSON object");
    write_raw("dtype", "{\"w\":{\"dtype\":\"F8\",\"shape\":[1],\"data_offsets\":[0,1]}}", 1, -1);
    expect_error("dtype", "tensor 'w': unknown dtype F8");
    write_raw("neg", "{\"w\":{\"dtype\":\"F32\",\"shape\":[-1],\"data_offsets\":[0,4]}}", 4, -1);
    expect_error("neg", "tensor 'w': shape entry 0 is not a size");
    write_raw("frac", "{\"w\":{\"dtype\":\"F32\",\"shape\":[1.5],\"data_offsets\":[0,4]}}", 4, -1);
    expect_error("frac", "shape entry 0 is not a size");
    write_raw("overflow", "{\"w\":{\"dtype\":\"F32\",\"shape\":[1099511627776,1099511627776,1099511627776],\"data_offsets\":[0,4]}}", 4, -1);
    expect_error("overflow", "tensor 'w': shape too large (overflows)");
    write_raw("dims", "{\"w\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,1,1,1,1,1],\"data_offsets\":[0,4]}}", 4, -1);
    expect_error("dims", "at most 8");
    write_raw("beyond", "{\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 4, -1);
    expect_error("beyond", "tensor 'w': data_offsets must be [begin, end] inside the 4 data bytes");
    write_raw("reversed", "{\"w\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[4,0]}}", 4, -1);
    expect_error("reversed", "data_offsets");
    write_raw("mismatch", "{\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,4]}}", 4, -1);
    expect_error("mismatch", "tensor 'w': 4 data bytes, but its dtype and shape need 8");
    write_raw("overlap", "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                         "\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", 8, -1);
    expect_error("overlap", "overlaps");
    write_raw("hole", "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", 8, -1);
    expect_error("hole", "4 unused data bytes before tensor 'a'");
    write_raw("trailing", "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 8, -1);
    expect_error("trailing", "4 data bytes after the last tensor");
    write_raw("twice", "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
                       "\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", 8, -1);
    expect_error("twice", "the header has the key 'a' twice");
    /* Two __metadata__ objects once overflowed the metadata list (ASan: heap-buffer-overflow). */
    write_raw("meta2", "{\"__metadata__\":{\"a\":\"1\"},\"__metadata__\":{\"b\":\"2\",\"c\":\"3\",\"d\":\"4\"}}", 0, -1);
    expect_error("meta2", "the header has the key '__metadata__' twice");
    write_raw("metakey", "{\"__metadata__\":{\"a\":\"1\",\"a\":\"2\"}}", 0, -1);
    expect_error("metakey", "the header has the key 'a' twice");
    write_raw("innerkey", "{\"w\":{\"dtype\":\"F32\",\"dtype\":\"F64\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4, -1);
    expect_error("innerkey", "the header has the key 'dtype' twice");
    write_raw("meta", "{\"__metadata__\":{\"k\":1}}", 0, -1);
    expect_error("meta", "__metadata__ entry 'k'");
    /* Found by fuzz_safetensors: an offset past 2^64 was cast to an integer (undefined). */
    write_raw("hugeoff", "{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[444444444444444444444444,4]}}", 4, -1);
    expect_error("hugeoff", "data_offsets");
    write_raw("offsets", "{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":\"0-4\"}}", 4, -1);
    expect_error("offsets", "data_offsets");
    char path[512];
    snprintf(path, sizeof path, "%s/missing", dir);
    ch_err err;
    ch_st_file *f = NULL;
    assert_int_equal(ch_st_read(path, &f, &err), CH_STATUS_BAD_INPUT);
    assert_non_null(strstr(err.msg, "cannot open"));
}

/* Every truncation of a valid file is an error, never a crash. */
static void test_every_truncation(void **state)
{
    (void)state;
    const float w[4] = { 1, 2, 3, 4 };
    const ch_st_tensor t = { .name = "w", .dtype = CH_ST_F32, .ndim = 1, .shape = { 4 }, .data = w, .nbytes = 16 };
    char path[512];
    snprintf(path, sizeof path, "%s/full.safetensors", dir);
    ch_err err;
    assert_int_equal(ch_st_write(path, &t, 1, NULL, 0, &err), CH_STATUS_OK);
    FILE *fp = fopen(path, "rb");
    assert_non_null(fp);
    unsigned char buf[512];
    const size_t n = fread(buf, 1, sizeof buf, fp);
    fclose(fp);
    for (size_t cut = 0; cut < n; cut++) {
        tu_write_file(dir, "cut", buf, cut, 0);
        snprintf(path, sizeof path, "%s/cut", dir);
        ch_st_file *f = NULL;
        assert_int_equal(ch_st_read(path, &f, &err), CH_STATUS_BAD_INPUT);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_round_trip),
        cmocka_unit_test(test_bad_files),
        cmocka_unit_test(test_every_truncation),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
