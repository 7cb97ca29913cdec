/* The option table: every flag of cohort train, eval and bench train, declared once with its name,
 * type, range, help text, the field it sets, the commands that take it and whether the ranks of a
 * job must agree on it. The command line's parser, usage text and manual page (src/cli/flags.c),
 * the library's checks of a ch_train_config, the ranks' agreement on a job's settings and the
 * join's comparison of every rank's flags all read this table, so a range cannot drift between
 * them. Defaults stay where the library declares them (ch_train_config_default,
 * ch_folder_options_default); ch_opt_defaults adds the command line's own. */
#ifndef CH_TRAIN_OPTIONS_H
#define CH_TRAIN_OPTIONS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

#include "cohort.h"

/* The commands a flag belongs to. */
enum { CH_CMD_TRAIN = 1, CH_CMD_EVAL = 2, CH_CMD_BENCH = 4 };

typedef enum ch_opt_type {
    CH_OPT_INT,     /* int field, whole number in [lo, hi] */
    CH_OPT_LONG,    /* long field */
    CH_OPT_U64,     /* uint64_t field */
    CH_OPT_DOUBLE,  /* double field, finite, in [lo, hi] */
    CH_OPT_STR,     /* const char * field: the argument itself (checked where it is used) */
    CH_OPT_FLAG,    /* bool field, set true; no argument */
    CH_OPT_CHOICE,  /* int field: the index of the argument in choices ("auto|bar|lines|none") */
    CH_OPT_SPECIAL, /* the row's own parser (parse; show where the value is more than one field) */
} ch_opt_type;

/* Whether the ranks of a job must run with the same value. */
typedef enum ch_opt_agree {
    CH_AGREE_FLAGS,  /* the same flag text on every rank (the join compares it); the trainer compares
                      * what it leads to, where that matters (the data's contents, the graph) */
    CH_AGREE_VALUE,  /* the same text, and the trainer compares the field's value in the configuration */
    CH_AGREE_GIVEN,  /* given on every rank or on none; the value (a path) may differ */
    CH_AGREE_NONE,   /* may differ per host: where it keeps things, how hard it works, what rank 0 alone
                      * writes */
} ch_opt_agree;

/* Where a row's field lives. */
typedef enum ch_opt_where { CH_IN_CFG, CH_IN_FOLDER, CH_IN_CLI } ch_opt_where;

/* The manual's sections, in order. */
typedef enum ch_opt_section {
    CH_SEC_DATA, CH_SEC_OPTIM, CH_SEC_DEVICES, CH_SEC_CHECKPOINTS, CH_SEC_OUTPUT, CH_SEC_BENCH, CH_SEC_COUNT
} ch_opt_section;

/* What the command line sets beside the library's configuration. */
typedef struct ch_cli_values {
    const char *data, *dataset, *metrics, *log_dir, *plot, *resume, *checkpoint;
    bool resume_latest, resume_auto; /* --resume without PATH; --resume auto */
    bool overwrite, dry_run, per_class, eval_only, skip_sync;
    long train_limit, test_limit, steps, warmup;
    int progress;                   /* ch_progress_mode */
    double progress_interval;
} ch_cli_values;

enum { CH_OPT_MAX = 128 };

struct ch_opt_values;

typedef struct ch_opt_values {
    ch_train_config cfg;
    ch_folder_options folder;
    ch_cli_values cli;
    bool given[CH_OPT_MAX];         /* by row index: the flag was on the command line */
} ch_opt_values;

typedef struct ch_opt {
    const char *name;       /* the long flag, without "--" */
    char short_name;        /* 'b' for -b, or 0 */
    const char *alias;      /* a second long name ("wd"), or NULL */
    unsigned cmds;          /* CH_CMD_* */
    ch_opt_type type;
    ch_opt_where where;
    size_t offset;          /* of the field inside cfg, folder or cli */
    double lo, hi;          /* numeric rows: the range, inclusive */
    const char *choices;    /* CH_OPT_CHOICE: "a|b|c" */
    ch_opt_agree agree;
    ch_opt_section section;
    const char *arg;        /* the argument's name in help ("N", "DIR"), NULL for a flag */
    const char *brief;      /* the usage line(s) of --help */
    const char *more;       /* the manual adds this after brief, or NULL */
    const char *dflt;       /* the default as said in help; NULL: the field's default value (numbers,
                             * strings), "" for none to say */
    bool optional_arg;      /* --resume [PATH]: a following word that is no flag is the argument */
    /* CH_OPT_SPECIAL: sets the row's fields from arg (NULL: absent), or says why not; show: the
     * value as the ranks compare it, where it is not the one field at offset (--betas). */
    bool (*parse)(const char *arg, struct ch_opt_values *v, char *why, size_t len);
    void (*show)(const ch_train_config *c, char *buf, size_t len);
    bool unset_ok;          /* the library takes 0 for this field as "not set" (the CLI does not) */
    /* The key of the value in a checkpoint's trainer.json "config" record, or NULL: not recorded. A
     * special row's field is consecutive doubles, one key each: "beta1,beta2". */
    const char *record;
} ch_opt;

/* The table, and its number of rows. */
const ch_opt *ch_opt_table(int *count);
/* The row of flag name (long, without "--", or an alias; or "-b" style short) for command cmd
 * (0: any command), or NULL. Its index in *index when index is not NULL. */
const ch_opt *ch_opt_find(const char *name, unsigned cmd, int *index);
/* Every field's default for command cmd: the library's configuration and folder options, the
 * command line's own (bench: lr 0.01, 20 steps after 3 of warm-up). */
void ch_opt_defaults(unsigned cmd, ch_opt_values *v);
/* The whole string s a number in [lo, hi] (whole: an integer), not blank-led, finite: flags' and the
 * other commands' numbers alike. */
bool ch_opt_read_number(const char *s, bool whole, double lo, double hi, double *out);
/* Set row o's field from arg (NULL for a flag, or an absent optional argument). On a refusal, the
 * reason after "--NAME 'ARG': " in why, and false. */
bool ch_opt_set(const ch_opt *o, const char *arg, ch_opt_values *v, char *why, size_t len);
/* A configuration field's value as text ("(none)" for a NULL string), for the ranks' agreement;
 * o must be a CH_IN_CFG row. */
void ch_opt_show(const ch_opt *o, const ch_train_config *c, char *buf, size_t len);
/* The default as help says it ("256", "off", ...), empty when there is none to say. */
void ch_opt_default_text(const ch_opt *o, unsigned cmd, char *buf, size_t len);
struct cJSON;
/* Into obj, every recorded row's value in c (its record key): numbers, true/false, strings or null.
 * c is the configuration as the run uses it (the optimizer's defaults filled in). */
void ch_opt_record_config(const ch_train_config *c, struct cJSON *obj);
/* Every numeric field of c within its flag's range (or at its library default, or 0 where the
 * library takes 0 as not set): the library's check of a configuration a C caller filled. */
ch_status ch_opt_check_config(const ch_train_config *c, ch_err *err);

#endif
