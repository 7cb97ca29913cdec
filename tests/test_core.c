/* Core: the counter-based RNG, status helpers and whole-file reads. */
#include "test_util.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "core/cpu.h"
#include "core/file.h"
#include "core/rng.h"
#include "core/status.h"
#include "train/options.h"
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

/* ch_cpu_vendor (CPUID leaf 0's three registers in the order EBX, EDX, ECX) names the maker Linux
 * names in /proc/cpuinfo. */
static void cpu_vendor_is_the_kernels(void **state)
{
    (void)state;
    char mine[13], linux_says[64];
    assert_true(ch_cpu_vendor(mine));
    assert_true(tu_cpuinfo_vendor(linux_says, sizeof linux_says));
    assert_string_equal(mine, linux_says);
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

/* The option table: within one command no name, alias or short name twice; every row has help,
 * and an argument name exactly when it takes one. */
static void option_table_names_are_unique_per_command(void **state)
{
    (void)state;
    int n;
    const ch_opt *t = ch_opt_table(&n);
    assert_true(n > 40 && n <= CH_OPT_MAX);
    const unsigned cmds[] = { CH_CMD_TRAIN, CH_CMD_EVAL, CH_CMD_BENCH };
    for (size_t c = 0; c < 3; c++)
        for (int i = 0; i < n; i++) {
            if (!(t[i].cmds & cmds[c])) continue;
            assert_non_null(t[i].brief);
            assert_true(strlen(t[i].brief) > 8);
            const bool takes = t[i].type != CH_OPT_FLAG && strcmp(t[i].name, "no-progress") != 0;
            assert_int_equal(takes, t[i].arg != NULL);
            /* Every name and alias of row i against every one of row j, both ways. */
            const char *mine[2] = { t[i].name, t[i].alias };
            for (int j = 0; j < n; j++) {
                if (j == i || !(t[j].cmds & cmds[c])) continue;
                const char *theirs[2] = { t[j].name, t[j].alias };
                for (int a = 0; a < 2; a++)
                    for (int b = 0; b < 2; b++)
                        if (mine[a] && theirs[b] && strcmp(mine[a], theirs[b]) == 0)
                            fail_msg("--%s is two flags' name", mine[a]);
                if (t[i].short_name) assert_int_not_equal(t[i].short_name, t[j].short_name);
            }
        }
}

/* One range per flag: the command line's parser (ch_opt_set) and the library's check of a
 * configuration a C caller filled (ch_opt_check_config) take a number at both ends of its row's
 * range and refuse one just outside, naming the flag; the defaults pass the library's check. */
static void option_ranges_are_one_range_for_the_flag_and_the_library(void **state)
{
    (void)state;
    ch_err err;
    const ch_train_config def = ch_train_config_default();
    assert_int_equal(ch_opt_check_config(&def, &err), CH_STATUS_OK);
    int n, checked = 0;
    const ch_opt *t = ch_opt_table(&n);
    for (int i = 0; i < n; i++) {
        const ch_opt *o = &t[i];
        if (o->type != CH_OPT_INT && o->type != CH_OPT_DOUBLE) continue;
        const bool whole = o->type == CH_OPT_INT;
        const double outside[2] = { whole ? o->lo - 1 : o->lo - fmax(1e-9, fabs(o->lo) * 1e-3),
                                    whole ? o->hi + 1 : o->hi + fmax(1e-6, o->hi * 1e-3) };
        const double edges[2] = { o->lo, o->hi };
        char text[64], why[256], flag[64];
        snprintf(flag, sizeof flag, "--%s", o->name);
        for (int k = 0; k < 2; k++) {
            ch_opt_values v;
            ch_opt_defaults(o->cmds & CH_CMD_TRAIN ? CH_CMD_TRAIN : o->cmds, &v);
            snprintf(text, sizeof text, whole ? "%.0f" : "%.17g", edges[k]);
            assert_true(ch_opt_set(o, text, &v, why, sizeof why));
            if (o->where == CH_IN_CFG) assert_int_equal(ch_opt_check_config(&v.cfg, &err), CH_STATUS_OK);
            snprintf(text, sizeof text, whole ? "%.0f" : "%.17g", outside[k]);
            if (ch_opt_set(o, text, &v, why, sizeof why)) fail_msg("%s %s was taken", flag, text);
            if (o->where != CH_IN_CFG) continue;
            /* The library sees the value the flag refused (0 is "not set" where the row says so). */
            ch_train_config c = def;
            if (whole) *(int *)(void *)((char *)&c + o->offset) = (int)outside[k];
            else *(double *)(void *)((char *)&c + o->offset) = outside[k];
            const bool unset = (o->unset_ok && outside[k] == 0) ||
                               (whole ? *(const int *)(const void *)((const char *)&def + o->offset) == (int)outside[k]
                                      : *(const double *)(const void *)((const char *)&def + o->offset) == outside[k]);
            if (unset) continue;
            assert_int_equal(ch_opt_check_config(&c, &err), CH_STATUS_BAD_INPUT);
            assert_non_null(strstr(err.msg, flag));
            checked++;
        }
    }
    assert_true(checked >= 30);
}

/* Blank-led, empty, trailing junk and non-finite values are refused by every numeric row. */
static void option_values_are_whole_strings(void **state)
{
    (void)state;
    const ch_opt *lr = ch_opt_find("lr", CH_CMD_TRAIN, NULL), *b = ch_opt_find("-b", CH_CMD_EVAL, NULL);
    assert_non_null(lr);
    assert_non_null(b);
    assert_ptr_equal(b, ch_opt_find("batch-size", CH_CMD_BENCH, NULL));
    assert_ptr_equal(ch_opt_find("wd", CH_CMD_TRAIN, NULL), ch_opt_find("weight-decay", CH_CMD_TRAIN, NULL));
    ch_opt_values v;
    ch_opt_defaults(CH_CMD_TRAIN, &v);
    char why[256];
    const char *bad[] = { "", " 0.1", "0.1 ", "0.1x", "nan", "inf", "1e999" };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) assert_false(ch_opt_set(lr, bad[i], &v, why, sizeof why));
    assert_true(ch_opt_set(lr, "0.25", &v, why, sizeof why));
    assert_true(v.cfg.lr == 0.25);
    assert_false(ch_opt_set(b, "2.5", &v, why, sizeof why));
    assert_true(ch_opt_set(b, "48", &v, why, sizeof why));
    assert_int_equal(v.cfg.batch_size, 48);
    const ch_opt *progress = ch_opt_find("progress", CH_CMD_TRAIN, NULL);
    assert_false(ch_opt_set(progress, "fancy", &v, why, sizeof why));
    assert_string_equal(why, "expected auto, bar, lines or none");
    assert_true(ch_opt_set(progress, "lines", &v, why, sizeof why));
    assert_int_equal(v.cli.progress, 2);
}

/* trainer.json's "config" comes from the table's recorded rows: every one, with its value of the
 * configuration given (none at its default), of its type (numbers, true/false, string or null). */
static void option_table_records_the_config(void **state)
{
    (void)state;
    ch_train_config c = ch_train_config_default();
    c.batch_size = 37;
    c.lr = 0.03;
    c.momentum = 0.7;
    c.nesterov = true;
    c.dampening = 0.125;
    c.beta1 = 0.8;
    c.beta2 = 0.95;
    c.eps = 1e-6;
    c.weight_decay = 5e-4;
    c.sync_bn = true;
    c.init = "normal:0.02";
    c.normalize = NULL;
    cJSON *j = cJSON_CreateObject();
    assert_non_null(j);
    ch_opt_record_config(&c, j);
    static const struct { const char *key; double v; } nums[] = {
        { "batch_size", 37 }, { "lr", 0.03 }, { "momentum", 0.7 }, { "dampening", 0.125 }, { "beta1", 0.8 },
        { "beta2", 0.95 }, { "eps", 1e-6 }, { "weight_decay", 5e-4 },
    };
    for (size_t i = 0; i < sizeof nums / sizeof *nums; i++) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, nums[i].key);
        if (!cJSON_IsNumber(v) || v->valuedouble != nums[i].v) fail_msg("config.%s is not %g", nums[i].key, nums[i].v);
    }
    assert_true(cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(j, "nesterov")));
    assert_true(cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(j, "sync_bn")));
    assert_string_equal(cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(j, "init")), "normal:0.02");
    assert_true(cJSON_IsNull(cJSON_GetObjectItemCaseSensitive(j, "normalize")));
    assert_int_equal(cJSON_GetArraySize(j), 12);
    cJSON_Delete(j);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(option_table_records_the_config),
        cmocka_unit_test(rng_is_a_pure_function_of_key_and_counter),
        cmocka_unit_test(shares_cut_by_largest_remainders),
        cmocka_unit_test(rng_uniform_and_normal_have_the_right_moments),
        cmocka_unit_test(permutation_is_a_permutation_and_depends_on_the_seed),
        cmocka_unit_test(below_is_in_range_and_covers_it),
        cmocka_unit_test(fail_formats_the_message),
        cmocka_unit_test(cpu_vendor_is_the_kernels),
        cmocka_unit_test(file_read_returns_the_bytes_and_enforces_the_limit),
        cmocka_unit_test(option_table_names_are_unique_per_command),
        cmocka_unit_test(option_ranges_are_one_range_for_the_flag_and_the_library),
        cmocka_unit_test(option_values_are_whole_strings),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
