/* The command line's side of the option table (train/options.h): getopt_long over the rows of a
 * command, the usage text of --help and the option sections of cohort help, and which flags the
 * ranks of a job may give differently. */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "train/options.h"

enum { FIRST_VAL = 1000 };

static const char *const section_titles[CH_SEC_COUNT] = {
    "MODEL AND DATA", "OPTIMISATION", "DEVICES AND PROCESSES", "CHECKPOINTS", "OUTPUT", "TIMING",
};

/* "-b, --batch-size B", "--weight-decay W, --wd W". */
static void flag_words(const ch_opt *o, char *buf, size_t len)
{
    const char *sp = o->arg ? " " : "", *arg = o->arg ? o->arg : "";
    if (o->short_name) snprintf(buf, len, "-%c, --%s%s%s", o->short_name, o->name, sp, arg);
    else if (o->alias) snprintf(buf, len, "--%s%s%s, --%s%s%s", o->name, sp, arg, o->alias, sp, arg);
    else snprintf(buf, len, "--%s%s%s", o->name, sp, arg);
}

/* lead, then text from column col, words wrapped before width. */
static void print_wrapped(FILE *f, const char *lead, int col, int width, const char *text)
{
    int at = fprintf(f, "%s", lead);
    if (at > col - 1) {
        fputc('\n', f);
        at = 0;
    }
    const char *w = text;
    bool first = true;
    while (*w) {
        while (*w == ' ') w++;
        const int n = (int)strcspn(w, " ");
        if (!n) break;
        if (!first && at + 1 + n > width) {
            fputc('\n', f);
            at = 0;
            first = true;
        }
        if (at < col) at += fprintf(f, "%*s", col - at, "");
        else at += fprintf(f, " ");
        at += fprintf(f, "%.*s", n, w);
        first = false;
        w += n;
    }
    fputc('\n', f);
}

/* A row's help: brief, in the manual more after it, then "(default X)". */
static void row_text(const ch_opt *o, unsigned cmd, bool manual, char *buf, size_t len)
{
    char dflt[160];
    ch_opt_default_text(o, cmd, dflt, sizeof dflt);
    const char *more = manual && o->more ? o->more : "";
    /* more goes on as a sentence ("Every rank ..."), a clause ("in all, ...") or an aside ("(DDP's ...)"). */
    const char *join = !*more ? "" : (*more >= 'A' && *more <= 'Z') ? ". " : *more == '(' ? " " : "; ";
    /* "(default 256)", "(default auto: what DIR holds)", "(default: all)", "(required)". */
    const char *say = !*dflt ? "" : strncmp(dflt, "required", 8) == 0 ? " (" : strchr(dflt, ' ') && !strchr(dflt, ':')
                                                                           ? " (default: " : " (default ";
    snprintf(buf, len, "%s%s%s%s%s%s", o->brief, join, more, say, dflt, *dflt ? ")" : "");
}

static void print_row(FILE *f, const ch_opt *o, unsigned cmd, bool manual)
{
    char words[96], lead[104], text[1200];
    flag_words(o, words, sizeof words);
    snprintf(lead, sizeof lead, "%s%s", manual ? "    " : "  ", words);
    row_text(o, cmd, manual, text, sizeof text);
    print_wrapped(f, lead, manual ? 26 : 24, manual ? 100 : 96, text);
}

void ch_flags_usage(FILE *f, unsigned cmd, const ch_usage *u)
{
    fputs(u->head, f);
    int n;
    const ch_opt *t = ch_opt_table(&n);
    for (int i = 0; i < n; i++)
        if (t[i].cmds & cmd) print_row(f, &t[i], cmd, false);
    print_wrapped(f, "  -h, --help", 24, 96, "this text");
    if (u->tail) fputs(u->tail, f);
}

void ch_flags_manual(FILE *f, unsigned cmd)
{
    int n;
    const ch_opt *t = ch_opt_table(&n);
    for (int s = 0; s < CH_SEC_COUNT; s++) {
        bool titled = false;
        for (int i = 0; i < n; i++) {
            if (!(t[i].cmds & cmd) || t[i].section != (ch_opt_section)s) continue;
            if (!titled) fprintf(f, "\n%s\n", section_titles[s]);
            titled = true;
            print_row(f, &t[i], cmd, true);
        }
    }
    print_wrapped(f, "    -h, --help", 26, 100, "the short usage");
}

/* getopt_long's tables for cmd: every row's long name (and alias) as FIRST_VAL + its index, short
 * names as themselves, and -h. */
static void getopt_tables(unsigned cmd, struct option *longs, char *shorts)
{
    int n, k = 0;
    const ch_opt *t = ch_opt_table(&n);
    char *s = shorts;
    *s++ = ':';
    for (int i = 0; i < n; i++) {
        if (!(t[i].cmds & cmd)) continue;
        const int has = t[i].optional_arg ? optional_argument : t[i].arg ? required_argument : no_argument;
        longs[k++] = (struct option){ t[i].name, has, NULL, FIRST_VAL + i };
        if (t[i].alias) longs[k++] = (struct option){ t[i].alias, has, NULL, FIRST_VAL + i };
        if (t[i].short_name) {
            *s++ = t[i].short_name;
            if (t[i].arg) *s++ = ':';
        }
    }
    longs[k++] = (struct option){ "help", no_argument, NULL, 'h' };
    longs[k] = (struct option){ NULL, 0, NULL, 0 };
    *s++ = 'h';
    *s = '\0';
}

/* The row getopt_long returned c for. */
static int row_of(int c, unsigned cmd)
{
    if (c >= FIRST_VAL) return c - FIRST_VAL;
    const char name[3] = { '-', (char)c, '\0' };
    int i = -1;
    return ch_opt_find(name, cmd, &i) ? i : -1;
}

int ch_flags_parse(unsigned cmd, const char *name, const ch_usage *u, int argc, char **argv, ch_opt_values *v)
{
    static struct option longs[2 * CH_OPT_MAX + 2];
    char shorts[2 * CH_OPT_MAX + 3];
    getopt_tables(cmd, longs, shorts);
    ch_opt_defaults(cmd, v);
    int n;
    const ch_opt *t = ch_opt_table(&n);
    optind = 1;
    opterr = 0;
    int c;
    while ((c = getopt_long(argc, argv, shorts, longs, NULL)) != -1) {
        if (c == 'h') {
            ch_flags_usage(stdout, cmd, u);
            return CH_EXIT_OK;
        }
        const int i = c == '?' || c == ':' ? -1 : row_of(c, cmd);
        if (i < 0) {
            const char *what = optind > 0 && optind <= argc ? argv[optind - 1] : "";
            ch_cli_usage("cohort %s: unknown or incomplete option '%s' (see cohort %s --help)\n", name, what, name);
            return CH_EXIT_USAGE;
        }
        /* --resume PATH as well as --resume=PATH: a following word that is no flag is its PATH. */
        const char *arg = optarg;
        if (t[i].optional_arg && !arg && optind < argc && argv[optind][0] != '-') arg = argv[optind++];
        char why[256];
        if (!ch_opt_set(&t[i], arg, v, why, sizeof why)) {
            ch_cli_usage("cohort %s: --%s '%s': %s\n", name, t[i].name, arg ? arg : "", why);
            return CH_EXIT_USAGE;
        }
        v->given[i] = true;
    }
    if (optind < argc) {
        ch_cli_usage("cohort %s: unexpected argument '%s'\n", name, argv[optind]);
        return CH_EXIT_USAGE;
    }
    return -1;
}

bool ch_flags_given(const ch_opt_values *v, const char *flag, unsigned cmd)
{
    int i = -1;
    return ch_opt_find(flag[0] == '-' && flag[1] == '-' ? flag + 2 : flag, cmd, &i) && v->given[i];
}

int ch_flags_agreement(const char *flag)
{
    /* cohort export and plot: where they write. */
    if (strcmp(flag, "--out") == 0 || strcmp(flag, "-o") == 0) return CH_AGREE_NONE;
    const ch_opt *o = ch_opt_find(flag[1] == '-' ? flag + 2 : flag, 0, NULL);
    return o ? o->agree : CH_AGREE_FLAGS;
}

bool ch_flags_takes_value(const char *flag, const char *next)
{
    const ch_opt *o = ch_opt_find(flag[1] == '-' ? flag + 2 : flag, 0, NULL);
    if (!o) return strcmp(flag, "--out") == 0 || strcmp(flag, "-o") == 0;
    /* --resume [PATH]: the next word when it is no flag, as the parser reads it. */
    return o->optional_arg ? next[0] != '-' : o->arg != NULL;
}
