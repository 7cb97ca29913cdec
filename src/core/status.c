/* Status helpers: message formatting and the always-on assertion. */
#include "core/status.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

ch_status ch_fail(ch_err *err, ch_status st, const char *fmt, ...)
{
    if (err) {
        err->on_every_rank = false;
        err->speaks = true;
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err->msg, sizeof err->msg, fmt, ap);
        va_end(ap);
    }
    return st;
}

void ch_assert_fail(const char *cond, const char *file, int line)
{
    fprintf(stderr, "cohort: internal error: assertion '%s' failed at %s:%d\n", cond, file, line);
    abort();
}

const char *ch_status_name(ch_status st)
{
    switch (st) {
    case CH_STATUS_OK: return "ok";
    case CH_STATUS_BAD_INPUT: return "bad input";
    case CH_STATUS_SYSTEM: return "system failure";
    case CH_STATUS_NUMERIC: return "numeric failure";
    }
    return "unknown status";
}
