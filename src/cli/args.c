/* Flag value parsing and status-to-exit-code mapping shared by the subcommands. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "comm/world.h"
#include "train/options.h"

#include <stdarg.h>

/* A refused flag's line on a rank other than 0 of a job: held until ch_cli_parsed knows whether
 * every rank refused it (then rank 0's line is the one shown) or only some (then the first of
 * them's, sent to rank 0 to print). One per process, like argv. */
static char held_line[1024];

void ch_cli_usage(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    if (ch_world_size() > 1 && ch_world_rank() != 0) vsnprintf(held_line, sizeof held_line, fmt, ap);
    else vfprintf(stderr, fmt, ap);
    va_end(ap);
}

int ch_cli_parsed(const char *cmd, int rc, double timeout_s)
{
    if (ch_world_size() == 1) return rc;
    ch_err err = { 0 };
    const ch_status mine = rc >= 0 && rc != CH_EXIT_OK ? CH_STATUS_BAD_INPUT : CH_STATUS_OK;
    if (mine != CH_STATUS_OK) {
        /* The held line without its "cohort CMD: ", which ch_exit_for puts back. */
        char who[64];
        snprintf(who, sizeof who, "cohort %s: ", cmd);
        const char *line = held_line[0] ? held_line : "a flag was refused";
        if (strncmp(line, who, strlen(who)) == 0) line += strlen(who);
        ch_fail(&err, mine, "%.*s", (int)strcspn(line, "\n"), line);
    }
    const ch_status st = ch_world_fail_together("start", mine, timeout_s, &err);
    if (st == CH_STATUS_OK) return rc;
    /* Every rank knows the job is over. Rank 0 says why, unless it refused a flag itself: then
     * ch_cli_usage printed its line already. */
    if (err.on_every_rank && mine != CH_STATUS_OK) ch_world_exit(rc);
    return ch_exit_for(cmd, st, &err);
}

/* The option table's reader, for the flags of the commands it does not cover (bench allreduce and
 * loader, plot). Whole numbers are read again exactly: a double holds a long only to 2^53. */
bool ch_arg_int(const char *cmd, const char *flag, const char *s, long lo, long hi, long *out)
{
    double v;
    if (!ch_opt_read_number(s, true, (double)lo, (double)hi, &v)) {
        ch_cli_usage("cohort %s: --%s '%s': expected an integer in %ld..%ld\n", cmd, flag, s,
                lo, hi);
        return false;
    }
    *out = strtol(s, NULL, 10);
    return true;
}

bool ch_arg_double(const char *cmd, const char *flag, const char *s, double lo, double hi,
                   double *out)
{
    double v;
    if (!ch_opt_read_number(s, false, lo, hi, &v)) {
        ch_cli_usage("cohort %s: --%s '%s': expected a number in [%g, %g]\n", cmd, flag, s, lo,
                hi);
        return false;
    }
    *out = v;
    return true;
}

bool ch_cli_is_onnx(const char *model)
{
    const size_t n = strlen(model);
    return n > 5 && strcmp(model + n - 5, ".onnx") == 0;
}

ch_status ch_cli_model(const char *model, ch_graph **g, ch_err *err)
{
    *g = NULL;
    return ch_cli_is_onnx(model) ? ch_graph_load_onnx(model, g, err) : CH_STATUS_OK;
}

int ch_exit_for(const char *cmd, ch_status st, const ch_err *err)
{
    if (st == CH_STATUS_OK) return CH_EXIT_OK;
    const int code = st == CH_STATUS_BAD_INPUT ? CH_EXIT_USAGE : CH_EXIT_FAIL;
    if (ch_world_size() == 1) {
        /* A message of several lines (the importer's unsupported operators): each its own. */
        for (const char *line = err->msg; *line;) {
            const int n = (int)strcspn(line, "\n");
            fprintf(stderr, "cohort %s: %.*s\n", cmd, n, line);
            line += n + (line[n] == '\n');
        }
        return code;
    }
    if (err->on_every_rank) {
        /* Every rank holds the same verdict: one line from rank 0, and a clean exit everywhere. */
        char line[1200];
        snprintf(line, sizeof line, "cohort %s: %s", cmd, err->msg);
        if (err->speaks) fprintf(stderr, "%s\n", line);
        ch_world_log(line);
        ch_world_exit(code);
    }
    /* One rank failing leaves the others waiting for it: name the rank and end the whole job. */
    char who[64];
    snprintf(who, sizeof who, "cohort %s", cmd);
    ch_world_fatal_as(who, code, err->msg);
}

static double timeout_in(int argc, char **argv)
{
    for (int i = 1; i + 1 < argc; i++)
        if (strcmp(argv[i], "--timeout") == 0) {
            const double v = strtod(argv[i + 1], NULL);
            if (v > 0 && v < 1e6) return v;
        }
    return 300;
}

int ch_cli_join(int argc, char **argv)
{
    if (ch_world_size() == 1) return -1;
    enum { MAX = 256 };
    const char *names[MAX], *values[MAX];
    static char split[MAX][64];
    int n = 0;
    names[n] = "the cohort version";
    values[n++] = ch_version();
    const char *option = "the command";
    for (int i = 0; i < argc && n < MAX; i++) {
        const char *tok = argv[i];
        if (tok[0] == '-' && tok[1]) {
            const char *eq = strchr(tok, '=');
            if (eq) {
                snprintf(split[n], sizeof split[n], "%.*s", (int)(eq - tok), tok);
                tok = split[n];
            }
            option = tok;
            /* The option table says what the ranks share of it (train/options.h). */
            const int agree = ch_flags_agreement(tok);
            if (agree == CH_AGREE_NONE || agree == CH_AGREE_GIVEN) {
                if (!eq && i + 1 < argc && ch_flags_takes_value(tok, argv[i + 1])) i++;   /* and its value */
                option = "the command";
                if (agree == CH_AGREE_NONE) continue;
                names[n] = tok;     /* given here: so it must be everywhere */
                values[n++] = "given";
                continue;
            }
            names[n] = "the flags";
            values[n++] = tok;
            continue;
        }
        names[n] = option;
        values[n++] = tok;
    }
    ch_err err;
    const ch_status st = ch_world_agree("start", names, values, n, timeout_in(argc, argv), &err);
    return st == CH_STATUS_OK ? -1 : ch_exit_for(argv[0], st, &err);
}
