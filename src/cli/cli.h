/* The cohort program's subcommands and shared helpers. */
#ifndef CH_CLI_H
#define CH_CLI_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "cohort.h"

/* Exit codes: 0 success, 1 runtime failure, 2 bad input (flags, files). */
enum { CH_EXIT_OK = 0, CH_EXIT_FAIL = 1, CH_EXIT_USAGE = 2 };

int ch_cmd_train(int argc, char **argv);
int ch_cmd_info(int argc, char **argv);
int ch_cmd_eval(int argc, char **argv);
int ch_cmd_export(int argc, char **argv);
int ch_cmd_help(int argc, char **argv);
int ch_cmd_plot(int argc, char **argv);
int ch_cmd_bench(int argc, char **argv);
int ch_cmd_bench_allreduce(int argc, char **argv);
int ch_cmd_bench_loader(int argc, char **argv);

/* --model: a name of the zoo (*g NULL), or an ONNX file (a name ending in .onnx) imported as a
 * graph the caller frees. */
ch_status ch_cli_model(const char *model, ch_graph **g, ch_err *err);
bool ch_cli_is_onnx(const char *model);


/* Strict number parsing for flags: the whole string, within [lo, hi]; on failure prints one line
 * "cohort CMD: --FLAG 'VALUE': expected ..." and returns false. */
bool ch_arg_int(const char *cmd, const char *flag, const char *s, long lo, long hi, long *out);
bool ch_arg_double(const char *cmd, const char *flag, const char *s, double lo, double hi,
                   double *out);
/* A line refusing a flag (printf's format, ending in a newline). In a job of several ranks only
 * rank 0 prints it at once; the others hold it for ch_cli_parsed. */
void ch_cli_usage(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* After a subcommand parsed its flags, rc its verdict (< 0 or CH_EXIT_OK: accepted; else the exit
 * code). Collective in a job of several ranks: when every rank refused, rank 0's line is the one
 * shown and every rank exits with rc; when some did, rank 0 shows the first one's line, naming its
 * rank and host, and every rank exits cleanly; when none did, returns rc. Alone: returns rc. */
int ch_cli_parsed(const char *cmd, int rc, double timeout_s);
/* "cohort CMD: left out N WHICH entries named like an image that are no regular file (the first:
 * ...)" on stderr (rank 0) and in the worker log, when the ImageFolder d left any out. */
void ch_cli_report_left_out(const char *cmd, const ch_dataset *d, const char *which);
/* Map a library status to an exit code after printing "cohort CMD: MESSAGE". In a job of several
 * ranks it names the rank and host, and ends the whole job (ch_world_abort) instead of returning. */
int ch_exit_for(const char *cmd, ch_status st, const ch_err *err);
/* In a job of several ranks, before anything else: every rank must run the same cohort with the
 * same command and flags, less those the option table lets differ per host (CH_AGREE_NONE: --data,
 * --threads, -j, --timeout, --log-dir, the output files) and those that need only be given
 * everywhere (CH_AGREE_GIVEN: --resume's path, --checkpoint-dir, --trace). Returns -1 to go on; on
 * a difference rank 0 prints one line naming the first differing flag and the ranks, and every
 * rank exits 2. argv[0] is the command. */
int ch_cli_join(int argc, char **argv);

/* The option table's command line (flags.c over train/options.h). A command's --help: head, the
 * rows of the command, tail. */
typedef struct ch_usage { const char *head, *tail; } ch_usage;
struct ch_opt_values;
/* Parse argv (argv[0]: the command) into v, after every field's default for cmd (CH_CMD_*).
 * Returns -1 to go on; CH_EXIT_OK after printing the usage (-h, --help); CH_EXIT_USAGE after one
 * line naming the refused flag (ch_cli_usage). */
int ch_flags_parse(unsigned cmd, const char *name, const ch_usage *u, int argc, char **argv,
                   struct ch_opt_values *v);
void ch_flags_usage(FILE *f, unsigned cmd, const ch_usage *u);
/* The option sections of cohort help CMD: every row of cmd under its section's title. */
void ch_flags_manual(FILE *f, unsigned cmd);
/* flag ("--data", "-j") was on the command line. */
bool ch_flags_given(const struct ch_opt_values *v, const char *flag, unsigned cmd);
/* For the join: what the ranks must share of flag ("--x" or "-x"; ch_opt_agree), and whether
 * the word after it, next, is its value. */
int ch_flags_agreement(const char *flag);
bool ch_flags_takes_value(const char *flag, const char *next);

/* Progress inside an epoch on stderr (--progress): a bar redrawn in place, or a line every interval
 * (batch logs); auto: the bar on a terminal, lines elsewhere. */
typedef enum ch_progress_mode { CH_PROGRESS_AUTO, CH_PROGRESS_BAR, CH_PROGRESS_LINES, CH_PROGRESS_NONE } ch_progress_mode;

typedef struct ch_progress {
    ch_progress_mode mode;  /* resolved: BAR, LINES or NONE */
    double interval_s;      /* lines: the least time between two */
    double last_draw;
    int epoch, epochs;
} ch_progress;

/* "auto" | "bar" | "lines" | "none". */
bool ch_progress_parse(const char *s, ch_progress_mode *out);
/* Only root draws (rank 0); interval_s <= 0: 10 s. */
void ch_progress_init(ch_progress *p, ch_progress_mode mode, double interval_s, bool root);
/* An epoch (1-based) starts: lines count their interval from here. */
void ch_progress_epoch(ch_progress *p, int epoch);
/* Matches ch_progress_fn; user is a ch_progress. */
void ch_progress_update(void *user, int step, int steps, double loss, double acc, size_t images,
                        double elapsed_s);
void ch_progress_clear(ch_progress *p);

#endif
