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
        char raw[sizeof err->msg];
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(raw, sizeof raw, fmt, ap);
        va_end(ap);
        /* One line, whatever a file name holds: control characters are written escaped. */
        size_t o = 0;
        for (const unsigned char *c = (const unsigned char *)raw; *c && o + 5 < sizeof err->msg; c++) {
            if (*c >= 0x20 && *c != 0x7f) err->msg[o++] = (char)*c;
            else o += (size_t)snprintf(err->msg + o, sizeof err->msg - o, *c == '\n' ? "\\n" : *c == '\t' ? "\\t" : "\\x%02x", *c);
        }
        err->msg[o] = 0;
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
