/* cohort train: parse flags, load data, train, print one line per epoch, write metrics. */
#include <errno.h>
#include <limits.h>
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli/cli.h"
#include "train/options.h"
#include "train/ps.h"
#include "train/checkpoint.h"
#include "cli/plot.h"
#include "comm/world.h"
#include "core/file.h"
#include "core/status.h"

static const ch_usage train_usage = {
    .head = "usage: cohort train --model NAME --data DIR [options]\n"
            "       cohort train --resume CHECKPOINT --data DIR [options]   (the checkpoint's model)\n"
            "\n"
            "Train a model of the zoo, or your own, on an IDX, CIFAR-10 or ImageFolder data set.\n"
            "\n",
    .tail = "\n"
            "Under mpirun every process is one rank: mpirun -np 2 cohort train ... trains on both,\n"
            "the global batch split over all ranks' devices; rank 0 prints and writes the metrics.\n",
};

typedef struct train_opts {
    ch_opt_values v;            /* every flag (train/options.h) */
    char resumed_model[64];     /* the checkpoint's model, when --resume stands for --model */
} train_opts;

/* Returns -1 to go on, else the exit code. */
static int parse_train(int argc, char **argv, train_opts *o)
{
    *o = (train_opts){ 0 };
    const int rc = ch_flags_parse(CH_CMD_TRAIN, "train", &train_usage, argc, argv, &o->v);
    if (rc >= 0) return rc;
    const ch_cli_values *c = &o->v.cli;
    if ((!o->v.cfg.model && !c->resume && !c->resume_latest && !c->resume_auto) || !c->data) {
        ch_cli_usage("cohort train: --model (or --resume) and --data are required (see cohort train --help)\n");
        return CH_EXIT_USAGE;
    }
    if ((c->resume_latest || c->resume_auto) && !o->v.cfg.checkpoint_dir) {
        ch_cli_usage("cohort train: --resume %s needs --checkpoint-dir\n", c->resume_auto ? "auto" : "without a PATH");
        return CH_EXIT_USAGE;
    }
    if ((o->v.cfg.checkpoint_every || o->v.cfg.keep) && !o->v.cfg.checkpoint_dir) {
        ch_cli_usage("cohort train: --checkpoint-every and --keep need --checkpoint-dir\n");
        return CH_EXIT_USAGE;
    }
    return -1;
}

/* "epoch 3, loss ..., 14630 img/s on [cpu:0, cpu:1]" (" x 2 ranks" after the devices of a job,
 * " x 2 workers + 1 parameter server (sync)" with servers). */
static void format_epoch(char *line, size_t len, const ch_epoch_stats *s, const ch_trainer *t)
{
    const char *devices = ch_trainer_devices(t);
    char ranks[80] = "";
    int servers = 0;
    const char *ps = ch_trainer_ps(t, &servers);
    if (ps)
        snprintf(ranks, sizeof ranks, " x %d worker%s + %d parameter server%s (%s)", ch_world_size() - servers,
                 ch_world_size() - servers > 1 ? "s" : "", servers, servers > 1 ? "s" : "", ps);
    else if (ch_world_size() > 1)
        snprintf(ranks, sizeof ranks, " x %d ranks", ch_world_size());
    /* A loss that is not finite means the run diverged: say so where the user looks. */
    const char *diverged = isfinite(s->loss) ? "" : " (not finite: training diverged; a lower --lr or "
                                                   "--nan-check to stop at once)";
    snprintf(line, len,
             "epoch %d, loss %.4f%s, train acc %.4f, test acc %.4f, time %.1f sec, %.0f img/s on [%s]%s",
             s->epoch, s->loss, diverged, s->train_acc, s->test_acc, s->time_s, s->images_per_s, devices, ranks);
}

static bool write_metrics(FILE *f, const ch_epoch_stats *s, const ch_device_list *devices, const char *shares,
                          const char *compress, const ch_trainer *t)
{
    /* JSON has no NaN: a diverged epoch's loss is null. */
    char loss[32] = "null";
    if (isfinite(s->loss)) snprintf(loss, sizeof loss, "%.6f", s->loss);
    fprintf(f,
            "{\"epoch\": %d, \"loss\": %s, \"train_acc\": %.6f, \"test_acc\": %.6f, "
            "\"time_s\": %.4f, \"images_per_s\": %.2f, \"lr\": %.8g, \"data_wait_s\": %.4f, \"devices\": [",
            s->epoch, loss, s->train_acc, s->test_acc, s->time_s, s->images_per_s, s->lr, s->data_wait_s);
    for (int i = 0; i < devices->count; i++) {
        char name[32];
        ch_device_name(&devices->dev[i], name, sizeof name);
        fprintf(f, "%s\"%s\"", i ? ", " : "", name);
    }
    fprintf(f, "], \"ranks\": %d", ch_world_size());
    if (*shares) fprintf(f, ", \"shares\": [%s]", shares);
    if (strcmp(compress, "none") != 0) fprintf(f, ", \"grad_compress\": \"%s\"", compress);
    fprintf(f, ", \"optimizer_bytes\": %zu", ch_trainer_optimizer_bytes(t));
    if (ch_trainer_zero(t)) fprintf(f, ", \"zero\": %d", ch_trainer_zero(t));
    int servers = 0;
    const char *ps = ch_trainer_ps(t, &servers);
    if (ps) fprintf(f, ", \"ps_servers\": %d, \"ps_mode\": \"%s\"", servers, ps);
    fprintf(f, "}\n");
    return fflush(f) == 0 && !ferror(f);
}

/* Redraw the chart with the epochs so far (rank 0). */
static int redraw_plot(const train_opts *o, ch_trainer *t, ch_plot_run *curve, const ch_epoch_stats *s)
{
    ch_err err;
    char title[256];
    char ranks[32] = "";
    if (ch_world_size() > 1) snprintf(ranks, sizeof ranks, " x %d ranks", ch_world_size());
    snprintf(title, sizeof title, "%s on [%s]%s, batch %d, lr %g", o->v.cfg.model, ch_trainer_devices(t), ranks,
             o->v.cfg.batch_size, o->v.cfg.lr);
    ch_status st = ch_plot_add(curve, s->epoch, s->loss, s->train_acc, s->test_acc, &err);
    if (st == CH_STATUS_OK) st = ch_plot_write_svg(o->v.cli.plot, title, curve, 1, &err);
    return st == CH_STATUS_OK ? CH_EXIT_OK : ch_exit_for("train", st, &err);
}

static int run_epochs(const train_opts *o, ch_trainer *t, FILE *metrics, ch_plot_run *curve);

/* --skip-bad-images: how many files were replaced, said once at the end (by every rank: each
 * decodes its own share). */
void ch_cli_report_left_out(const char *cmd, const ch_dataset *d, const char *which)
{
    char first[1100], line[1400];
    const size_t n = ch_dataset_left_out(d, first, sizeof first);
    if (!n) return;
    snprintf(line, sizeof line, "cohort %s: left out %zu %s entr%s named like an image that %s no regular file (the "
             "first: %.1000s)", cmd, n, which, n == 1 ? "y" : "ies", n == 1 ? "is" : "are", first);
    if (ch_world_rank() == 0) fprintf(stderr, "%s\n", line);
    ch_world_log(line);
}

static void report_skipped(const ch_dataset *train, const ch_dataset *test)
{
    const ch_dataset *sets[2] = { train, test };
    const char *names[2] = { "training", "test" };
    for (int i = 0; i < 2; i++) {
        char first[512];
        const size_t n = ch_dataset_skipped(sets[i], first, sizeof first);
        if (!n) continue;
        char line[800];
        snprintf(line, sizeof line, "cohort train: skipped %zu %s image%s that did not decode (the first: %.500s)",
                 n, names[i], n == 1 ? "" : "s", first);
        fprintf(stderr, "%s\n", line);
        ch_world_log(line);
    }
}

static int run_training(const train_opts *o, ch_trainer *t, FILE *metrics)
{
    ch_plot_run curve = { 0 };
    int rc = run_epochs(o, t, metrics, &curve);
    ch_plot_run_free(&curve);
    /* A run shorter than --trace-steps writes what it has. */
    ch_err err;
    if (rc == CH_EXIT_OK && o->v.cfg.trace) rc = ch_exit_for("train", ch_trainer_write_trace(t, &err), &err);
    return rc;
}

/* --shares: every rank logs the shares in use and its part; rank 0 says when auto moved them. */
static void report_shares(const ch_trainer *t, const ch_epoch_stats *s, const char *shares, char *last, bool root)
{
    size_t train_n, test_n;
    ch_trainer_share(t, &train_n, &test_n);
    char line[512];
    snprintf(line, sizeof line, "epoch %d ended with shares %s, at which this rank trains on %zu samples per epoch", s->epoch,
             shares, train_n);
    ch_world_log(line);
    if (root && *last && strcmp(last, shares) != 0) printf("shares now %s (were %s)\n", shares, last);
    snprintf(last, 256, "%s", shares);
}

static int run_epochs(const train_opts *o, ch_trainer *t, FILE *metrics, ch_plot_run *curve)
{
    char last_shares[256];
    ch_trainer_shares(t, last_shares, sizeof last_shares);
    ch_progress bar;
    const bool root = ch_world_rank() == 0;
    ch_progress_init(&bar, (ch_progress_mode)o->v.cli.progress, o->v.cli.progress_interval, root);
    bar.epochs = o->v.cfg.epochs;
    ch_trainer_set_progress(t, ch_progress_update, &bar);
    if (root && ch_trainer_epochs_done(t) >= o->v.cfg.epochs) {
        if (o->v.cli.resume || o->v.cli.resume_latest || o->v.cli.resume_auto)
            printf("cohort train: the checkpoint has %d epochs done and --epochs is %d: nothing to train\n",
                   ch_trainer_epochs_done(t), o->v.cfg.epochs);
        else
            printf("cohort train: --epochs %d: nothing to train\n", o->v.cfg.epochs);
    }
    for (int e = ch_trainer_epochs_done(t); e < o->v.cfg.epochs; e++) {
        ch_progress_epoch(&bar, e + 1);
        ch_epoch_stats s;
        ch_err err;
        ch_status st = ch_trainer_run_epoch(t, &s, &err);
        ch_progress_clear(&bar);
        if (st != CH_STATUS_OK) return ch_exit_for("train", st, &err);
        char line[400];
        format_epoch(line, sizeof line, &s, t);
        ch_world_log(line);
        if (root) {
            puts(line);
            fflush(stdout);
            if (o->v.cli.plot && redraw_plot(o, t, curve, &s) != CH_EXIT_OK) return CH_EXIT_FAIL;
        }
        char shares[256];
        if (ch_trainer_shares(t, shares, sizeof shares)) report_shares(t, &s, shares, last_shares, root);
        if (metrics && !write_metrics(metrics, &s, ch_trainer_device_list(t), shares, ch_trainer_grad_compress(t), t)) {
            fprintf(stderr, "cohort train: %s: write failed\n", o->v.cli.metrics);
            return CH_EXIT_FAIL;
        }
    }
    return CH_EXIT_OK;
}

/* DIR/workerlog.RANK, truncated: this run's log of this rank (Paddle's launch convention). */
static ch_status open_worker_log(const char *dir, FILE **out, ch_err *err)
{
    if (mkdir(dir, 0777) != 0 && errno != EEXIST)
        return ch_fail(err, CH_STATUS_BAD_INPUT, "--log-dir %s: cannot create (%s)", dir, strerror(errno));
    char path[4096];
    snprintf(path, sizeof path, "%s/workerlog.%d", dir, ch_world_rank());
    if (!(*out = fopen(path, "w")))
        return ch_fail(err, CH_STATUS_BAD_INPUT, "%s: cannot open for writing (%s)", path, strerror(errno));
    ch_world_set_log(*out);
    return CH_STATUS_OK;
}

/* Who this rank is and what it trains on: the head of its worker log. */
static void log_identity(const ch_trainer *t, const ch_dataset *train, const ch_dataset *test)
{
    size_t train_n, test_n;
    ch_trainer_share(t, &train_n, &test_n);
    char line[1024];
    snprintf(line, sizeof line,
             "rank %d of %d, local rank %d of %d, host %s, pid %ld, devices [%s]; per epoch it "
             "trains on %zu of %zu training samples and evaluates %zu of %zu test samples",
             ch_world_rank(), ch_world_size(), ch_world_local_rank(), ch_world_local_size(),
             ch_world_host(), (long)getpid(), ch_trainer_devices(t), train_n,
             ch_dataset_size(train), test_n, ch_dataset_size(test));
    ch_world_log(line);
    int servers = 0;
    const char *ps = ch_trainer_ps(t, &servers);
    if (ps) {
        snprintf(line, sizeof line, "a worker of %d parameter server%s (%s), ranks %d..%d%s", servers,
                 servers > 1 ? "s" : "", ps, ch_world_size() - servers, ch_world_size() - 1,
                 strcmp(ps, "async") == 0 ? "; async: the samples it trains depend on what it claims" : "");
        ch_world_log(line);
    }
}

/* Every file the run will write, checked before any data is read or any epoch trained: a bad path
 * is one line and exit 2 at once, not after the first epoch. Rank 0 writes the chart and the
 * metrics, and the trace (the other ranks send it their parts over MPI). */
static ch_status check_outputs(const train_opts *o, ch_err *err)
{
    const bool root = ch_world_rank() == 0;
    if (o->v.cli.plot && root) CH_TRY(ch_out_check(o->v.cli.plot, "--plot", err));
    if (o->v.cli.metrics && root && !o->v.cli.dry_run) CH_TRY(ch_out_check(o->v.cli.metrics, "--metrics", err));
    if (o->v.cfg.trace && root) CH_TRY(ch_out_check(o->v.cfg.trace, "--trace", err));
    return CH_STATUS_OK;
}

/* --resume without --model: the checkpoint's model (its graph.json, or a zoo name). */
static ch_status resumed_model(train_opts *o, ch_graph **g, ch_err *err)
{
    const char *path = o->v.cli.resume ? o->v.cli.resume : o->v.cfg.checkpoint_dir;
    if (o->v.cli.resume_auto && !ch_checkpoint_has_latest(path))
        return ch_fail(err, CH_STATUS_BAD_INPUT, "--resume auto: %s has no checkpoint yet, so --model is needed to "
                       "start", path);
    char normalize[256];
    int classes, side;
    CH_TRY(ch_checkpoint_peek(path, o->resumed_model, sizeof o->resumed_model, &classes, normalize, sizeof normalize,
                              &side, err));
    o->v.cfg.model = o->resumed_model;
    return ch_checkpoint_graph(path, g, err);
}

int ch_cmd_train(int argc, char **argv)
{
    train_opts o;
    int rc = parse_train(argc, argv, &o);
    rc = ch_cli_parsed("train", rc, o.v.cfg.timeout_s > 0 ? o.v.cfg.timeout_s : 300);
    if (rc >= 0) return rc;
    ch_err err;
    if (check_outputs(&o, &err) != CH_STATUS_OK) return ch_exit_for("train", CH_STATUS_BAD_INPUT, &err);
    ch_dataset *train = NULL, *test = NULL;
    ch_trainer *t = NULL;
    FILE *metrics = NULL, *log = NULL;
    ch_graph *graph = NULL;
    ch_status st = o.v.cli.log_dir ? open_worker_log(o.v.cli.log_dir, &log, &err) : CH_STATUS_OK;
    /* An ONNX file is read before the data: a file that will not import fails at once. */
    if (st == CH_STATUS_OK) st = o.v.cfg.model ? ch_cli_model(o.v.cfg.model, &graph, &err) : resumed_model(&o, &graph, &err);
    o.v.cfg.graph = graph;
    /* --train-limit and --test-limit read only what they keep. */
    ch_folder_options train_load = o.v.folder, test_load = o.v.folder;
    train_load.limit = (size_t)o.v.cli.train_limit;
    test_load.limit = (size_t)o.v.cli.test_limit;
    if (st == CH_STATUS_OK) st = ch_dataset_load(o.v.cli.data, o.v.cli.dataset, CH_SPLIT_TRAIN, &train_load, &train, &err);
    if (st == CH_STATUS_OK) st = ch_dataset_load(o.v.cli.data, o.v.cli.dataset, CH_SPLIT_TEST, &test_load, &test, &err);
    if (st == CH_STATUS_OK) {
        ch_cli_report_left_out("train", train, "training");
        ch_cli_report_left_out("train", test, "test");
        ch_dataset_truncate(train, (size_t)o.v.cli.train_limit);
        ch_dataset_truncate(test, (size_t)o.v.cli.test_limit);
        st = ch_trainer_create(&o.v.cfg, train, test, &t, &err);
    }
    /* A parameter server's trainer has served the whole job inside ch_trainer_create. */
    const bool server = st == CH_STATUS_OK && ch_trainer_is_ps_server(t);
    if (st == CH_STATUS_OK && !server && (o.v.cli.resume || o.v.cli.resume_latest))
        st = ch_trainer_resume(t, o.v.cli.resume ? o.v.cli.resume : o.v.cfg.checkpoint_dir, &err);
    bool resumed = o.v.cli.resume || o.v.cli.resume_latest;
    if (st == CH_STATUS_OK && !server && o.v.cli.resume_auto) {
        st = ch_trainer_resume_auto(t, o.v.cfg.checkpoint_dir, &resumed, &err);
        /* Without latest, epoch folders there are another run's (or one that lost latest). */
        if (st == CH_STATUS_OK && !resumed) st = ch_trainer_start_fresh(t, o.v.cli.overwrite, &err);
        if (st == CH_STATUS_OK && ch_world_rank() == 0)
            printf(resumed ? "cohort train: --resume auto: resuming from %s (%d epochs done)\n"
                           : "cohort train: --resume auto: no checkpoint in %s yet, starting fresh\n",
                   o.v.cfg.checkpoint_dir, ch_trainer_epochs_done(t));
    } else if (st == CH_STATUS_OK && !server && !resumed && !o.v.cli.dry_run) {
        st = ch_trainer_start_fresh(t, o.v.cli.overwrite, &err);
    }
    if (st == CH_STATUS_OK && !server) log_identity(t, train, test);
    if (st == CH_STATUS_OK && o.v.cli.metrics && !o.v.cli.dry_run && ch_world_rank() == 0 && !(metrics = fopen(o.v.cli.metrics, "a")))
        st = ch_fail(&err, CH_STATUS_BAD_INPUT, "%s: cannot open for writing (%s)", o.v.cli.metrics,
                     strerror(errno));
    if (server) {
        rc = CH_EXIT_OK;
    } else if (st == CH_STATUS_OK && o.v.cli.dry_run) {
        if (ch_world_rank() == 0) ch_trainer_describe(t, stdout);
        rc = CH_EXIT_OK;
    } else {
        rc = st == CH_STATUS_OK ? run_training(&o, t, metrics) : ch_exit_for("train", st, &err);
        report_skipped(train, test);
    }
    if (metrics) fclose(metrics);
    ch_world_set_log(NULL);
    if (log) fclose(log);
    ch_trainer_free(t);
    ch_graph_free(graph);
    ch_dataset_free(train);
    ch_dataset_free(test);
    return rc;
}
