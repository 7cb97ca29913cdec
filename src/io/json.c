/* Strict JSON checks: see json.h. */
#include "io/json.h"

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
