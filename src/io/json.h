/* Strict JSON over cJSON: what cJSON lets through and a reader of user files must not. */
#ifndef CH_IO_JSON_H
#define CH_IO_JSON_H

#include <cjson/cJSON.h>

/* The first key that appears twice in one object anywhere in j (cJSON keeps both, and a lookup
 * would silently take the first), or NULL. Objects nested deeper than 64 levels count as a
 * duplicate of "(nesting)", so that a hostile file cannot exhaust the stack. */
const char *ch_json_duplicate_key(const cJSON *j);

#endif
