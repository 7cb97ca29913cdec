/* trainer.json's position as --resume reads it: parsed strictly (duplicate keys, types, whole
 * numbers, ranges) and checked against the run it will continue, with no trainer needed, so that
 * the checks can be fuzzed alone (fuzz/fuzz_trainer_json.c). */
#include "train/position.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "io/json.h"

static const cJSON *field(const cJSON *j, const char *key) { return cJSON_GetObjectItemCaseSensitive(j, key); }

/* A metric: a number, or "nan", "inf", "-inf" for one that was not finite (JSON has no NaN;
 * cJSON would write null, which could not be told from a missing value). */
cJSON *ch_position_metric_item(double v)
{
    if (isfinite(v)) return cJSON_CreateNumber(v);
    return cJSON_CreateString(isnan(v) ? "nan" : v > 0 ? "inf" : "-inf");
}

static ch_status metric(const char *path, const cJSON *j, const char *key, double lo, double hi, double *out,
                        ch_err *err)
{
    const cJSON *v = field(j, key);
    if (cJSON_IsString(v)) {
        const char *t = v->valuestring;
        if (strcmp(t, "nan") == 0) *out = NAN;
        else if (strcmp(t, "inf") == 0) *out = INFINITY;
        else if (strcmp(t, "-inf") == 0) *out = -INFINITY;
        else return ch_fail(err, CH_STATUS_BAD_INPUT, "%s: '%s' is \"%.40s\", expected a number, nan or inf", path, key, t);
        return CH_STATUS_OK;
    }
    if (cJSON_IsNull(v)) { /* what cohort 0.x wrote for a non-finite value */
        *out = NAN;
        return CH_STATUS_OK;
    }
    return ch_json_number(path, j, key, lo, hi, out, err);
}

cJSON *ch_position_parse_doc(const char *text, size_t len, const char *path, ch_err *err)
{
    cJSON *j = cJSON_ParseWithLength(text, len);
    double v = 0;
    const char *dup = cJSON_IsObject(j) ? ch_json_duplicate_key(j) : NULL;
    ch_status st = !cJSON_IsObject(j) ? ch_fail(err, CH_STATUS_BAD_INPUT, "%s: not a JSON object", path)
                 : dup ? ch_fail(err, CH_STATUS_BAD_INPUT, "%s: the key '%.200s' appears twice", path, dup)
                       : ch_json_number(path, j, "format_version", 1, 1e9, &v, err);
    if (st == CH_STATUS_OK && v > CH_POSITION_FORMAT)
        st = ch_fail(err, CH_STATUS_BAD_INPUT, "%s: format version %g is newer than this cohort reads (%d)",
                     path, v, CH_POSITION_FORMAT);
    if (st == CH_STATUS_OK) return j;
    cJSON_Delete(j);
    return NULL;
}

static ch_status check_identity(const ch_ckpt_expect *e, const char *path, const cJSON *j, ch_err *err)
{
    double v = 0;
    const cJSON *model = field(j, "model");
    if (!cJSON_IsString(model))
        return ch_fail(err, CH_STATUS_BAD_INPUT, "%s: no model name", path);
    if (strcmp(model->valuestring, e->model) != 0)
        return ch_fail(err, CH_STATUS_BAD_INPUT, "%s: a checkpoint of %.64s, but the model is %s", path,
                       model->valuestring, e->model);
    CH_TRY(ch_json_number(path, j, "classes", 1, 1e9, &v, err));
    if (v != e->classes)
        return ch_fail(err, CH_STATUS_BAD_INPUT, "%s: written for %g classes, the data has %d", path, v, e->classes);
    return CH_STATUS_OK;
}

/* Where the run stood. Every number is checked for type, integrality and range against the data
 * and the configuration it will index: a hand-edited or damaged file is refused, never cast. */
static ch_status read_position(const ch_ckpt_expect *e, const char *path, const cJSON *j,
                               ch_ckpt_position *p, double *opt_steps_out, ch_err *err)
{
    enum { MAX_EPOCHS = 1000000 };
    const double exact = 9007199254740992.0; /* 2^53 */
    uint64_t v = 0;
    /* Seeds are 64-bit; below 2^64 the cast is defined (the largest double under 2^64 is 2^64 - 2^11). */
    double sd = 0;
    CH_TRY(ch_json_number(path, j, "seed", 0, 18446744073709549568.0, &sd, err));
    if (sd != floor(sd))
        return ch_fail(err, CH_STATUS_BAD_INPUT, "%s: 'seed' is %g, expected a whole number", path, sd);
    const uint64_t seed = (uint64_t)sd;
    if (seed != e->seed)
        return ch_fail(err, CH_STATUS_BAD_INPUT, "%s: trained with --seed %llu, this run has --seed %llu "
                       "(the data order depends on it)", path, (unsigned long long)seed, (unsigned long long)e->seed);
    CH_TRY(ch_json_whole(path, j, "epoch", 0, MAX_EPOCHS, &v, err));
    p->epoch = (int)v;
    CH_TRY(ch_json_whole(path, j, "global_step", 0, exact, &p->global_step, err));
    uint64_t opt_steps = 0;
    CH_TRY(ch_json_whole(path, j, "optimizer_steps", 0, exact, &opt_steps, err));
    *opt_steps_out = (double)opt_steps;
    const cJSON *kind = field(j, "optimizer");
    const char *mine = e->optimizer;
    if (!cJSON_IsString(kind))
        return ch_fail(err, CH_STATUS_BAD_INPUT, "%s: 'optimizer' is missing or not a string", path);
    if (strcmp(kind->valuestring, mine) != 0)
        return ch_fail(err, CH_STATUS_BAD_INPUT, "%s: trained with --optimizer %s, this run has %s", path,
                       kind->valuestring, mine);
    const cJSON *order = field(j, "data_order");
    uint64_t n = 0;
    CH_TRY(ch_json_whole(path, order, "train_samples", 1, exact, &n, err));
    CH_TRY(ch_json_whole(path, order, "samples_seen", 0, exact, &p->seen_in_epoch, err));
    uint64_t step = 0;
    CH_TRY(ch_json_whole(path, j, "step_in_epoch", 0, exact, &step, err));
    if (p->seen_in_epoch > 0) {
        /* Inside an epoch: the rest of its order is a permutation of the same training set, cut
         * into the same batches. */
        const size_t B = (size_t)e->batch_size;
        double b = 0;
        CH_TRY(ch_json_number(path, field(j, "config"), "batch_size", 1, 1 << 20, &b, err));
        if (n != e->train_samples)
            return ch_fail(err, CH_STATUS_BAD_INPUT, "%s: stopped inside an epoch of %llu training samples, "
                           "this run has %zu (same data and --train-limit needed to finish that epoch)",
                           path, (unsigned long long)n, e->train_samples);
        if ((size_t)b != B)
            return ch_fail(err, CH_STATUS_BAD_INPUT, "%s: stopped inside an epoch with --batch-size %.0f, this "
                           "run has %zu: resume with -b %.0f, or from an epoch checkpoint", path, b, B, b);
        if (p->seen_in_epoch >= n || p->seen_in_epoch != step * B || step > p->global_step)
            return ch_fail(err, CH_STATUS_BAD_INPUT, "%s: samples_seen %llu and step_in_epoch %llu do not fit "
                           "an epoch of %llu samples in batches of %zu", path,
                           (unsigned long long)p->seen_in_epoch, (unsigned long long)step,
                           (unsigned long long)n, B);
    } else if (step != 0) {
        return ch_fail(err, CH_STATUS_BAD_INPUT, "%s: step_in_epoch %llu with no sample of the epoch seen", path,
                       (unsigned long long)step);
    }
    p->step_in_epoch = (int)step;
    uint64_t hits = 0;
    CH_TRY(metric(path, order, "loss_sum", -1e300, 1e300, &p->loss_sum, err));
    CH_TRY(ch_json_whole(path, order, "correct", 0, (double)p->seen_in_epoch, &hits, err));
    p->hits = (double)hits;
    const cJSON *last = field(j, "last_epoch");
    CH_TRY(metric(path, last, "train_loss", -1, 1e300, &p->train_loss, err));
    CH_TRY(ch_json_number(path, last, "train_acc", -1, 1, &p->train_acc, err));
    CH_TRY(metric(path, last, "test_loss", -1, 1e300, &p->test_loss, err));
    return ch_json_number(path, last, "test_acc", -1, 1, &p->test_acc, err);
}

ch_status ch_checkpoint_parse_position(const char *text, size_t len, const char *path, const ch_ckpt_expect *e,
                                       ch_ckpt_position *pos, double *opt_steps, ch_err *err)
{
    cJSON *j = ch_position_parse_doc(text, len, path, err);
    if (!j) return CH_STATUS_BAD_INPUT;
    ch_status st = check_identity(e, path, j, err);
    if (st == CH_STATUS_OK) st = read_position(e, path, j, pos, opt_steps, err);
    cJSON_Delete(j);
    return st;
}

