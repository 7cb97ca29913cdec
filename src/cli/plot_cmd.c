/* cohort plot: several runs' --metrics files in one chart (for example 1 device against 2). */
#include <getopt.h>
#include <stdio.h>
#include <string.h>

#include "cli/cli.h"
#include "cli/plot.h"

static const char plot_usage[] =
    "usage: cohort plot METRICS.jsonl [METRICS.jsonl ...] -o OUT.svg [--title TEXT]\n"
    "\n"
    "Draw the train loss, train accuracy and test accuracy per epoch of up to 8 runs (the files\n"
    "`cohort train --metrics` writes) in one SVG chart; each run is labelled with its file name.\n";

/* "runs/two-devices.jsonl" -> "two-devices" */
static void label_of(const char *path, char *out, size_t len)
{
    const char *base = strrchr(path, '/');
    base = base ? base + 1 : path;
    snprintf(out, len, "%s", base);
    char *dot = strrchr(out, '.');
    if (dot && dot != out) *dot = 0;
}

int ch_cmd_plot(int argc, char **argv)
{
    static const struct option opts[] = {
        { "out", required_argument, NULL, 'o' }, { "title", required_argument, NULL, 't' },
        { "help", no_argument, NULL, 'h' },       { NULL, 0, NULL, 0 },
    };
    const char *out = NULL, *title = "training curves";
    optind = 1;
    opterr = 0;
    int c;
    while ((c = getopt_long(argc, argv, ":o:h", opts, NULL)) != -1) {
        if (c == 'o') out = optarg;
        else if (c == 't') title = optarg;
        else if (c == 'h') {
            fputs(plot_usage, stdout);
            return CH_EXIT_OK;
        } else {
            fprintf(stderr, "cohort plot: unknown or incomplete option (see cohort plot --help)\n");
            return CH_EXIT_USAGE;
        }
    }
    const int nruns = argc - optind;
    if (!out || nruns < 1 || nruns > CH_PLOT_MAX_RUNS) {
        fprintf(stderr, "cohort plot: give 1 to %d metrics files and -o OUT.svg (see cohort plot --help)\n", CH_PLOT_MAX_RUNS);
        return CH_EXIT_USAGE;
    }
    ch_plot_run runs[CH_PLOT_MAX_RUNS] = { 0 };
    ch_err err;
    ch_status st = CH_STATUS_OK;
    for (int i = 0; i < nruns && st == CH_STATUS_OK; i++) {
        char label[128];
        label_of(argv[optind + i], label, sizeof label);
        st = ch_plot_read_metrics(argv[optind + i], label, &runs[i], &err);
    }
    if (st == CH_STATUS_OK) st = ch_plot_write_svg(out, title, runs, nruns, &err);
    for (int i = 0; i < nruns; i++) ch_plot_run_free(&runs[i]);
    return ch_exit_for("plot", st, &err);
}
