/* Flag value parsing and status-to-exit-code mapping shared by the subcommands. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "cli/cli.h"
#include "comm/world.h"

bool ch_arg_int(const char *cmd, const char *flag, const char *s, long lo, long hi, long *out)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end != '\0' || v < lo || v > hi) {
        fprintf(stderr, "cohort %s: --%s '%s': expected an integer in %ld..%ld\n", cmd, flag, s,
                lo, hi);
        return false;
    }
    *out = v;
    return true;
}

bool ch_arg_double(const char *cmd, const char *flag, const char *s, double lo, double hi,
                   double *out)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end != '\0' || !isfinite(v) || v < lo || v > hi) {
        fprintf(stderr, "cohort %s: --%s '%s': expected a number in [%g, %g]\n", cmd, flag, s, lo,
                hi);
        return false;
    }
    *out = v;
    return true;
}

int ch_exit_for(const char *cmd, ch_status st, const ch_err *err)
{
    if (st == CH_STATUS_OK) return CH_EXIT_OK;
    const int code = st == CH_STATUS_BAD_INPUT ? CH_EXIT_USAGE : CH_EXIT_FAIL;
    if (ch_world_size() == 1) {
        fprintf(stderr, "cohort %s: %s\n", cmd, err->msg);
        return code;
    }
    /* One rank failing leaves the others waiting for it: name the rank and end the whole job. */
    char who[64];
    snprintf(who, sizeof who, "cohort %s", cmd);
    ch_world_fatal_as(who, code, err->msg);
}
