/* Strict JSON over cJSON: what cJSON lets through and a reader of user files must not. */
#ifndef CH_IO_JSON_H
#define CH_IO_JSON_H

#include <cjson/cJSON.h>
#include <stdint.h>

#include "core/status.h"

/* The first key that appears twice in one object anywhere in j (cJSON keeps both, and a lookup
 * would silently take the first), or NULL. Objects nested deeper than 64 levels count as a
 * duplicate of "(nesting)", so that a hostile file cannot exhaust the stack. */
const char *ch_json_duplicate_key(const cJSON *j);

/* j[key] as a number in lo..hi, or BAD_INPUT naming path and key (missing, not a number, out of
 * range). */
ch_status ch_json_number(const char *path, const cJSON *j, const char *key, double lo, double hi, double *out,
                         ch_err *err);
/* The same for a count or index: a whole number in lo..hi (keep both below 2^53). */
ch_status ch_json_whole(const char *path, const cJSON *j, const char *key, double lo, double hi, uint64_t *out,
                        ch_err *err);

#endif
