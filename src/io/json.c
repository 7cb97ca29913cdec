/* Strict JSON checks: see json.h. */
#include "io/json.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static int by_key(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

static const char *duplicate_in(const cJSON *j, int depth)
{
    if (depth > 64) return "(nesting)";
    if (cJSON_IsObject(j)) {
        const int n = cJSON_GetArraySize(j);
        if (n > 1) {
            const char **keys = malloc(sizeof *keys * (size_t)n);
            if (!keys) return "(out of memory)";
            int k = 0;
            for (const cJSON *c = j->child; c; c = c->next) keys[k++] = c->string ? c->string : "";
            qsort(keys, (size_t)k, sizeof *keys, by_key);
            const char *dup = NULL;
            for (int i = 1; i < k && !dup; i++)
                if (strcmp(keys[i - 1], keys[i]) == 0) dup = keys[i];
            free(keys);
            if (dup) return dup;
        }
    }
    if (cJSON_IsObject(j) || cJSON_IsArray(j))
        for (const cJSON *c = j->child; c; c = c->next) {
            const char *d = duplicate_in(c, depth + 1);
            if (d) return d;
        }
    return NULL;
}

const char *ch_json_duplicate_key(const cJSON *j) { return duplicate_in(j, 0); }

ch_status ch_json_number(const char *path, const cJSON *j, const char *key, double lo, double hi,
                             double *out, ch_err *err)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, key);
    if (!cJSON_IsNumber(v))
        return ch_fail(err, CH_STATUS_BAD_INPUT, "%s: '%s' is missing or not a number", path, key);
    if (!(v->valuedouble >= lo && v->valuedouble <= hi))
        return ch_fail(err, CH_STATUS_BAD_INPUT, "%s: '%s' is %g, expected %g..%g", path, key, v->valuedouble, lo, hi);
    *out = v->valuedouble;
    return CH_STATUS_OK;
}

/* A count or index: a whole number in lo..hi (both below 2^53, where doubles are exact). */
ch_status ch_json_whole(const char *path, const cJSON *j, const char *key, double lo, double hi,
                            uint64_t *out, ch_err *err)
{
    double v = 0;
    CH_TRY(ch_json_number(path, j, key, lo, hi, &v, err));
    if (v != floor(v))
        return ch_fail(err, CH_STATUS_BAD_INPUT, "%s: '%s' is %g, expected a whole number", path, key, v);
    *out = (uint64_t)v;
    return CH_STATUS_OK;
}

