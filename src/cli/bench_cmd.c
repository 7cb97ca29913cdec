/* cohort bench train: images/second of training (or evaluation) steps on synthetic data of the
 * model's input shape, after warm-up steps. Used by bench/train_throughput. */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "train/options.h"
#include "graph/graph.h"
#include "comm/world.h"
#include "core/clock.h"
#include "core/rng.h"
#include "data/dataset.h"

static const char bench_others[] =
    "       cohort bench allreduce [--devices LIST|D] [--min-bytes B] [--max-bytes B]  (also mpirun)\n"
    "                              [--compress none|bf16|bf16-ef]  (mpirun)\n"
    "       cohort bench loader --data DIR [-j N] [--image-size N] [-b B] [--limit N]\n"
    "allreduce: size, count, time, algbw and busbw (GB/s) from 8 B to 256 MiB by default, every\n"
    "result checked: the local communicator with one thread per device (--devices as for train,\n"
    "cpu:0,cpu:1 or 'cpu*4', or a count; default 2) or, under mpirun, the one training uses\n"
    "between ranks (those devices on each rank, default 1). --compress bf16 adds the compressed\n"
    "exchange of train's --grad-compress next to fp32 at every size: its time, its algbw (fp32\n"
    "bytes over time) and the speed-up.\n";

static const ch_usage bench_usage = {
    .head = "usage: cohort bench train --model NAME|FILE.onnx [options]\n"
            "train: times N training steps (or forward-only evaluation batches with --eval) on synthetic\n"
            "inputs of the model's shape (1x28x28 and 10 classes for the zoo) and prints images/second (of\n"
            "the whole job under mpirun; rank 0 prints).\n"
            "\n",
    .tail = bench_others,
};

/* Random pixels and labels: throughput does not depend on the values. */
/* n random images of the model's input shape (MNIST's for the zoo, the graph's for a file). */
static ch_dataset *synthetic(size_t n, const ch_graph *g)
{
    ch_dataset *d = calloc(1, sizeof *d);
    if (!d) return NULL;
    *d = (ch_dataset){ .n = n, .c = 1, .h = 28, .w = 28, .classes = 10 };
    if (g) {
        const ch_gtensor *x = &g->tensors[g->input], *y = &g->tensors[g->output];
        *d = (ch_dataset){ .n = n, .c = x->dims[0], .h = x->dims[1], .w = x->dims[2], .classes = y->dims[0] };
    }
    const size_t per = (size_t)d->c * (size_t)d->h * (size_t)d->w;
    if (d->classes > 65535 || per > ((size_t)1 << 31) / n) {
        free(d);
        return NULL;
    }
    d->images = malloc(n * per);
    d->labels = malloc(n * sizeof *d->labels);
    if (!d->images || !d->labels) {
        ch_dataset_free(d);
        return NULL;
    }
    ch_rng r;
    ch_rng_init(&r, 1, CH_RNG_STREAM_TEST, 0);
    for (size_t i = 0; i < n * per; i++) d->images[i] = (uint8_t)ch_rng_u32(&r);
    for (size_t i = 0; i < n; i++) d->labels[i] = (uint16_t)ch_rng_below(&r, (uint32_t)d->classes);
    return d;
}

static int run_bench(ch_trainer *t, ch_dataset *d, int batch, bool skip_sync, int steps, int warmup,
                     bool eval)
{
    uint32_t *idx = malloc(sizeof *idx * (size_t)batch);
    if (!idx) {
        fprintf(stderr, "cohort bench: out of memory for the batch's indices\n");
        return CH_EXIT_FAIL;
    }
    ch_rng_identity(idx, (uint32_t)batch);
    ch_err err;
    double t0 = 0;
    ch_status st = CH_STATUS_OK;
    for (int i = 0; i < warmup + steps && st == CH_STATUS_OK; i++) {
        if (i == warmup) t0 = ch_clock_s();
        if (eval) {
            double l, a;
            st = ch_trainer_evaluate(t, d, &l, &a, &err);
        } else {
            double l;
            int64_t c;
            st = ch_trainer_step(t, idx, batch, &l, &c, &err);
        }
    }
    free(idx);
    double el = ch_clock_s() - t0;
    if (st == CH_STATUS_OK) st = ch_trainer_max_over_ranks(t, &el, &err);
    if (st != CH_STATUS_OK) return ch_exit_for("bench", st, &err);
    const char *compress = ch_trainer_grad_compress(t);
    if (ch_world_rank() == 0)
        printf("model=%s batch=%d ranks=%d devices=%d threads=%d mode=%s%s%s%s steps=%d time=%.3f img/s=%.1f "
               "step_ms=%.1f\n", ch_trainer_model_name(t), batch, ch_trainer_procs(t), ch_trainer_device_list(t)->count,
               ch_trainer_threads(t), eval ? "eval" : "train", skip_sync ? " sync=skipped" : "",
               strcmp(compress, "none") ? " grad_compress=" : "", strcmp(compress, "none") ? compress : "", steps, el,
               (double)steps * batch / el, 1e3 * el / (double)steps);
    return CH_EXIT_OK;
}

int ch_cmd_bench(int argc, char **argv)
{
    if (argc >= 2 && strcmp(argv[1], "allreduce") == 0) return ch_cmd_bench_allreduce(argc - 1, argv + 1);
    if (argc >= 2 && strcmp(argv[1], "loader") == 0) return ch_cmd_bench_loader(argc - 1, argv + 1);
    if (argc < 2 || strcmp(argv[1], "train") != 0) {
        FILE *f = argc < 2 ? stderr : stdout;
        fputs("usage: cohort bench train --model NAME|FILE.onnx [options]   (cohort bench train --help)\n", f);
        fputs(bench_others, f);
        return argc >= 2 && (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0)
                   ? CH_EXIT_OK : CH_EXIT_USAGE;
    }
    ch_opt_values v;
    const int parsed = ch_flags_parse(CH_CMD_BENCH, "bench", &bench_usage, argc - 1, argv + 1, &v);
    if (parsed >= 0) return parsed;
    ch_train_config cfg = v.cfg;
    const long steps = v.cli.steps, warmup = v.cli.warmup;
    const bool eval = v.cli.eval_only, skip_sync = v.cli.skip_sync;
    ch_err err;
    ch_graph *g = NULL;
    if (ch_cli_model(cfg.model ? cfg.model : "lenet", &g, &err) != CH_STATUS_OK)
        return ch_exit_for("bench", CH_STATUS_BAD_INPUT, &err);
    cfg.graph = g;
    ch_dataset *d = synthetic((size_t)cfg.batch_size, g);
    if (!d) {
        fprintf(stderr, "cohort bench: out of memory for the synthetic batch\n");
        ch_graph_free(g);
        return CH_EXIT_FAIL;
    }
    ch_trainer *t = NULL;
    ch_status st = ch_trainer_create(&cfg, d, NULL, &t, &err);
    ch_graph_free(g);
    int rc = st == CH_STATUS_OK ? CH_EXIT_OK : ch_exit_for("bench", st, &err);
    if (rc == CH_EXIT_OK) {
        ch_trainer_set_skip_sync(t, skip_sync);
        rc = run_bench(t, d, cfg.batch_size, skip_sync, (int)steps, (int)warmup, eval);
    }
    ch_trainer_free(t);
    ch_dataset_free(d);
    return rc;
}
