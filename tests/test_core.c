/* Core: the counter-based RNG, status helpers and whole-file reads. */
#include "test_util.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/file.h"
#include "core/rng.h"
#include "core/status.h"
#include "train/shares.h"

static void rng_is_a_pure_function_of_key_and_counter(void **state)
{
    (void)state;
    uint32_t a[4], b[4], c[4];
    ch_philox(42, 1, 7, a);
    ch_philox(42, 1, 7, b);
    ch_philox(42, 2, 7, c);
    assert_memory_equal(a, b, sizeof a);
    assert_memory_not_equal(a, c, sizeof a);
    ch_philox(43, 1, 7, c);
    assert_memory_not_equal(a, c, sizeof a);
}

static void rng_uniform_and_normal_have_the_right_moments(void **state)
{
    (void)state;
    ch_rng r;
    ch_rng_init(&r, 5, CH_RNG_STREAM_TEST, 0);
    const int n = 200000;
    double su = 0, sn = 0, sn2 = 0;
    for (int i = 0; i < n; i++) {
        double u = ch_rng_uniform(&r);
        assert_true(u >= 0 && u < 1);
        su += u;
        double z = ch_rng_normal(&r);
        sn += z;
        sn2 += z * z;
    }
    assert_true(fabs(su / n - 0.5) < 0.005);
    assert_true(fabs(sn / n) < 0.01);
    assert_true(fabs(sn2 / n - 1) < 0.02);
}

static void permutation_is_a_permutation_and_depends_on_the_seed(void **state)
{
    (void)state;
    enum { N = 1000 };
    uint32_t p[N], q[N];
    char seen[N] = { 0 };
    ch_rng r;
    ch_rng_init(&r, 1, CH_RNG_STREAM_SHUFFLE, 0);
    ch_rng_permutation(&r, p, N);
    for (int i = 0; i < N; i++) {
        assert_true(p[i] < N);
        assert_false(seen[p[i]]);
        seen[p[i]] = 1;
    }
    ch_rng_init(&r, 2, CH_RNG_STREAM_SHUFFLE, 0);
    ch_rng_permutation(&r, q, N);
    assert_memory_not_equal(p, q, sizeof p);
}

static void below_is_in_range_and_covers_it(void **state)
{
    (void)state;
    ch_rng r;
    ch_rng_init(&r, 9, CH_RNG_STREAM_TEST, 0);
    int hist[7] = { 0 };
    for (int i = 0; i < 70000; i++) {
        uint32_t v = ch_rng_below(&r, 7);
        assert_true(v < 7);
        hist[v]++;
    }
    for (int i = 0; i < 7; i++) assert_true(abs(hist[i] - 10000) < 500);
}

static void fail_formats_the_message(void **state)
{
    (void)state;
    ch_err err;
    assert_int_equal(ch_fail(&err, CH_STATUS_BAD_INPUT, "file %s line %d", "x.idx", 3),
                     CH_STATUS_BAD_INPUT);
    assert_string_equal(err.msg, "file x.idx line 3");
    assert_int_equal(ch_fail(NULL, CH_STATUS_SYSTEM, "ignored"), CH_STATUS_SYSTEM);
}

/* A whole file comes back byte for byte and 0-terminated; over the limit or missing: BAD_INPUT
 * with the path in the message. */
static void file_read_returns_the_bytes_and_enforces_the_limit(void **state)
{
    (void)state;
    char path[] = "/tmp/cohort_test_core_XXXXXX";
    const int fd = mkstemp(path);
    assert_true(fd >= 0);
    FILE *f = fdopen(fd, "wb");
    assert_non_null(f);
    const char body[] = "abc\0def";   /* an inner 0 byte too */
    assert_int_equal(fwrite(body, 1, 7, f), 7);
    assert_int_equal(fclose(f), 0);
    uint8_t *data = NULL;
    size_t len = 0;
    ch_err err;
    assert_int_equal(ch_file_read(path, 7, &data, &len, &err), CH_STATUS_OK);
    assert_int_equal(len, 7);
    assert_memory_equal(data, body, 7);
    assert_int_equal(data[7], 0);
    free(data);
    assert_int_equal(ch_file_read(path, 6, &data, &len, &err), CH_STATUS_BAD_INPUT);
    assert_non_null(strstr(err.msg, "7 bytes, more than the limit of 6"));
    assert_int_equal(remove(path), 0);
    assert_int_equal(ch_file_read(path, 7, &data, &len, &err), CH_STATUS_BAD_INPUT);
    assert_non_null(strstr(err.msg, "cannot open"));
}

/* cut "text" of n over procs x devices into want (procs * devices counts). */
static void assert_cut(const char *text, int procs, int devices, int n, const int *want)
{
    ch_shares sh;
    ch_err err;
    assert_int_equal(ch_shares_init(&sh, text, procs, devices, &err), CH_STATUS_OK);
    int got[16];
    ch_shares_split(&sh, n, got);
    for (int g = 0; g < procs * devices; g++)
        if (got[g] != want[g]) fail_msg("--shares %s, %d over %dx%d: replica %d gets %d, want %d", text ? text : "(none)", n, procs,
                                        devices, g, got[g], want[g]);
    ch_shares_free(&sh);
}

/* The cut by largest remainders, ties to the lower index (--shares 3,1 on batch 64 leaves no
 * remainder, so the trainer's tests never tried this): 7 over 1,1,1 is 3,2,2; 7 over 3,1 is 5.25 +
 * 1.75, so the leftover goes to the second (smallest remainders would give 6,1); 11 over 5,3,2 is
 * 6,3,2; and every cut sums to n with each part within one of its exact share. */
static void shares_cut_by_largest_remainders(void **state)
{
    (void)state;
    assert_cut("1,1,1", 3, 1, 7, (const int[]){ 3, 2, 2 });
    assert_cut("3,1", 2, 1, 7, (const int[]){ 5, 2 });
    assert_cut("5,3,2", 3, 1, 11, (const int[]){ 6, 3, 2 });
    assert_cut("1,3", 2, 1, 6, (const int[]){ 2, 4 });          /* 1.5 + 4.5: the tie to the lower index */
    assert_cut("3,1", 2, 2, 9, (const int[]){ 4, 3, 1, 1 });    /* 3.375 x 2 + 1.125 x 2 */
    assert_cut(NULL, 3, 1, 8, (const int[]){ 3, 3, 2 });
    static const char *const lists[] = { "3,1", "1,2,4", "7,7,1", "1000000,1", "2,3,5,7" };
    static const int nprocs[] = { 2, 3, 3, 2, 4 };
    for (int l = 0; l < 5; l++)
        for (int devices = 1; devices <= 3; devices++)
            for (int n = 0; n <= 300; n += 7) {
                ch_shares sh;
                ch_err err;
                assert_int_equal(ch_shares_init(&sh, lists[l], nprocs[l], devices, &err), CH_STATUS_OK);
                int got[16], sum = 0;
                ch_shares_split(&sh, n, got);
                double T = 0;
                for (int r = 0; r < nprocs[l]; r++) T += (double)sh.w[r] * devices;
                for (int g = 0; g < nprocs[l] * devices; g++) {
                    const double exact = n * (double)sh.w[g / devices] / T;
                    assert_true(got[g] >= floor(exact) && got[g] <= floor(exact) + 1);
                    sum += got[g];
                }
                assert_int_equal(sum, n);
                ch_shares_free(&sh);
            }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(rng_is_a_pure_function_of_key_and_counter),
        cmocka_unit_test(shares_cut_by_largest_remainders),
        cmocka_unit_test(rng_uniform_and_normal_have_the_right_moments),
        cmocka_unit_test(permutation_is_a_permutation_and_depends_on_the_seed),
        cmocka_unit_test(below_is_in_range_and_covers_it),
        cmocka_unit_test(fail_formats_the_message),
        cmocka_unit_test(file_read_returns_the_bytes_and_enforces_the_limit),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
