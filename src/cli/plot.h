/* Training curves as SVG: train loss, train accuracy and test accuracy per epoch (d2l's plot), for
 * one run or several (`cohort plot a.jsonl b.jsonl -o cmp.svg`). */
#ifndef CH_CLI_PLOT_H
#define CH_CLI_PLOT_H

#include <stdbool.h>

#include "core/status.h"

enum { CH_PLOT_MAX_RUNS = 8, CH_PLOT_MAX_EPOCHS = 100000 };

typedef struct ch_plot_run {
    char label[128];
    int n;                      /* epochs */
    int cap;
    double *epoch, *loss, *train_acc, *test_acc;   /* test_acc < 0: none */
} ch_plot_run;

/* Append one epoch's figures (grows the arrays). */
ch_status ch_plot_add(ch_plot_run *r, int epoch, double loss, double train_acc, double test_acc,
                      ch_err *err);
void ch_plot_run_free(ch_plot_run *r);
/* Read a --metrics file (JSON Lines) into r, labelled label. */
ch_status ch_plot_read_metrics(const char *path, const char *label, ch_plot_run *r, ch_err *err);
/* Write the chart of runs[0..nruns) to path, atomically (a temporary file renamed). */
ch_status ch_plot_write_svg(const char *path, const char *title, const ch_plot_run *runs, int nruns,
                            ch_err *err);

#endif
