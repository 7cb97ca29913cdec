/* cohort eval: test loss and accuracy of a checkpoint (or a safetensors state_dict) on a data set's
 * test split, on any number of devices and ranks; --per-class adds a table. */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "comm/world.h"
#include "core/status.h"
#include "data/augment.h"
#include "graph/graph.h"
#include "graph/graph_json.h"
#include "train/checkpoint.h"

static const char eval_usage[] =
    "usage: cohort eval --checkpoint PATH --data DIR [options]\n"
    "\n"
    "Evaluate a checkpoint on the test split of DIR (t10k- IDX files, CIFAR-10's test_batch.bin\n"
    "or an ImageFolder's DIR/val).\n"
    "\n"
    "  --checkpoint PATH     a checkpoint directory (DIR/epoch-0003), a --checkpoint-dir (its\n"
    "                        latest), or a safetensors state_dict file (then --model is needed;\n"
    "                        a PyTorch `module.` prefix is stripped)\n"
    "  --data DIR            the data set (IDX, CIFAR-10 binary or ImageFolder)\n"
    "  --dataset KIND        auto | idx | cifar10 | imagefolder (default auto)\n"
    "  --image-size N        ImageFolder: Resize(N*256/224) + CenterCrop(N) (default: the\n"
    "                        checkpoint's input size; 224 for a bare safetensors file)\n"
    "  --skip-bad-images     ImageFolder: replace files that do not decode, and count them\n"
    "  --normalize SPEC      input normalization (default: the checkpoint's; needed for a bare\n"
    "                        .safetensors trained with one)\n"
    "  --model NAME          the architecture, for a bare safetensors file\n"
    "  --devices LIST        devices to evaluate on (default cpu:0); also under mpirun\n"
    "  --threads T           compute threads in all (default: all cores)\n"
    "  -b, --batch-size B    evaluation batch over all devices (default 256)\n"
    "  --test-limit N        the first N test samples only\n"
    "  --per-class           a table of accuracy per class\n"
    "  --allow-nonfinite     evaluate weights holding NaN/Inf or a negative running_var\n"
    "  -h, --help            this text\n";

typedef struct eval_opts {
    const char *checkpoint, *data, *model, *devices, *dataset, *normalize;
    long threads, batch, test_limit, image_size;
    bool per_class, skip_bad, allow_nonfinite;
} eval_opts;

static int parse_eval(int argc, char **argv, eval_opts *o)
{
    static const struct option opts[] = {
        { "checkpoint", required_argument, NULL, 'c' }, { "data", required_argument, NULL, 'd' },
        { "model", required_argument, NULL, 'm' },      { "devices", required_argument, NULL, 'D' },
        { "threads", required_argument, NULL, 't' },    { "batch-size", required_argument, NULL, 'b' },
        { "test-limit", required_argument, NULL, 'l' }, { "per-class", no_argument, NULL, 'p' },
        { "dataset", required_argument, NULL, 'k' },   { "help", no_argument, NULL, 'h' },
        { "normalize", required_argument, NULL, 'n' },  { "image-size", required_argument, NULL, 'i' },
        { "skip-bad-images", no_argument, NULL, 's' }, { "allow-nonfinite", no_argument, NULL, 'a' },
        { NULL, 0, NULL, 0 },
    };
    *o = (eval_opts){ .batch = 256 };
    optind = 1;
    opterr = 0;
    int c;
    while ((c = getopt_long(argc, argv, ":b:h", opts, NULL)) != -1) {
        switch (c) {
        case 'c': o->checkpoint = optarg; break;
        case 'd': o->data = optarg; break;
        case 'm': o->model = optarg; break;
        case 'D': o->devices = optarg; break;
        case 't': if (!ch_arg_int("eval", "threads", optarg, 1, 1024, &o->threads)) return CH_EXIT_USAGE; break;
        case 'b': if (!ch_arg_int("eval", "batch-size", optarg, 1, 1 << 20, &o->batch)) return CH_EXIT_USAGE; break;
        case 'l': if (!ch_arg_int("eval", "test-limit", optarg, 1, __LONG_MAX__, &o->test_limit)) return CH_EXIT_USAGE; break;
        case 'p': o->per_class = true; break;
        case 'k': o->dataset = optarg; break;
        case 'n': o->normalize = optarg; break;
        case 'i': if (!ch_arg_int("eval", "image-size", optarg, 8, 4096, &o->image_size)) return CH_EXIT_USAGE; break;
        case 's': o->skip_bad = true; break;
        case 'a': o->allow_nonfinite = true; break;
        case 'h': fputs(eval_usage, stdout); return CH_EXIT_OK;
        default: ch_cli_usage("cohort eval: unknown or incomplete option (see cohort eval --help)\n"); return CH_EXIT_USAGE;
        }
    }
    if (optind < argc) {
        ch_cli_usage("cohort eval: unexpected argument '%s'\n", argv[optind]);
        return CH_EXIT_USAGE;
    }
    if (!o->checkpoint || !o->data) {
        ch_cli_usage("cohort eval: --checkpoint and --data are required (see cohort eval --help)\n");
        return CH_EXIT_USAGE;
    }
    return -1;
}

static bool is_file(const char *path)
{
    const size_t n = strlen(path);
    return n > 12 && strcmp(path + n - 12, ".safetensors") == 0;
}

static void print_result(ch_trainer *t, double loss, double acc, size_t n, const int64_t *hits,
                         const int64_t *counts, int classes, bool per_class)
{
    if (ch_world_rank() != 0) return;
    char ranks[32] = "";
    if (ch_world_size() > 1) snprintf(ranks, sizeof ranks, " x %d ranks", ch_world_size());
    printf("test loss %.4f, test acc %.4f (%zu images) on [%s]%s\n", loss, acc, n,
           ch_trainer_devices(t), ranks);
    if (per_class) {
        printf("%-6s %8s %8s %9s\n", "class", "images", "correct", "accuracy");
        for (int c = 0; c < classes; c++)
            printf("%-6d %8lld %8lld %9.4f\n", c, (long long)counts[c], (long long)hits[c],
                   counts[c] ? (double)hits[c] / (double)counts[c] : 0.0);
    }
    fflush(stdout);
}

static ch_status evaluate_graph(const eval_opts *o, const ch_graph *g, ch_dataset *test, ch_err *err);

/* --model X.onnx beside a checkpoint directory: X's graph must be the one the checkpoint keeps in
 * graph.json, up to the graph's name, which an import takes from the file's (a zoo checkpoint is
 * refused by name in evaluate_graph). */
static ch_status check_same_graph(const eval_opts *o, ch_graph *given, const ch_graph *kept, ch_err *err)
{
    if (!given || !kept) return CH_STATUS_OK;
    snprintf(given->name, sizeof given->name, "%s", kept->name);
    uint64_t a, b;
    CH_TRY(ch_graph_fingerprint(given, &a, err));
    CH_TRY(ch_graph_fingerprint(kept, &b, err));
    if (a != b)
        return ch_fail(err, CH_STATUS_BAD_INPUT, "%s: the checkpoint's model (its graph.json, '%s') is not %s's graph; "
                       "leave --model out to evaluate the checkpoint's own", o->checkpoint, kept->name, o->model);
    return CH_STATUS_OK;
}

/* The model: a checkpoint's graph.json or zoo name, which --model, when given, must match; for a
 * bare file, --model (a name or an ONNX file, whose weights are then replaced by the file's). */
static ch_status evaluate(const eval_opts *o, ch_dataset *test, ch_err *err)
{
    ch_graph *given = NULL, *g = NULL;
    /* An ONNX --model is read in every case: a missing or broken file is an error, never ignored. */
    ch_status st = o->model ? ch_cli_model(o->model, &given, err) : CH_STATUS_OK;
    if (st == CH_STATUS_OK && is_file(o->checkpoint)) {
        g = given;
        given = NULL;
    } else if (st == CH_STATUS_OK) {
        st = ch_checkpoint_graph(o->checkpoint, &g, err);
        if (st == CH_STATUS_OK) st = check_same_graph(o, given, g, err);
    }
    if (st == CH_STATUS_OK) st = evaluate_graph(o, g, test, err);
    ch_graph_free(given);
    ch_graph_free(g);
    return st;
}

static ch_status evaluate_graph(const eval_opts *o, const ch_graph *g, ch_dataset *test, ch_err *err)
{
    char model[64], normalize[256] = "";
    int classes = 0;
    char weights[4096];
    if (is_file(o->checkpoint)) {
        if (!o->model)
            return ch_fail(err, CH_STATUS_BAD_INPUT, "%s: a bare safetensors file needs --model", o->checkpoint);
        snprintf(model, sizeof model, "%s", o->model);
        snprintf(weights, sizeof weights, "%s", o->checkpoint);
    } else {
        char dir[4096];
        int side;
        CH_TRY(ch_checkpoint_peek(o->checkpoint, model, sizeof model, &classes, normalize, sizeof normalize,
                                  &side, err));
        CH_TRY(ch_checkpoint_resolve(o->checkpoint, dir, sizeof dir, err));
        if (o->model && strcmp(o->model, model) != 0 && !(g && ch_cli_is_onnx(o->model)))
            return ch_fail(err, CH_STATUS_BAD_INPUT, "%s: a checkpoint of %s, not %s", dir, model, o->model);
        if (snprintf(weights, sizeof weights, "%s/model.safetensors", dir) >= (int)sizeof weights)
            return ch_fail(err, CH_STATUS_BAD_INPUT, "%s: path too long", dir);
        if (classes != ch_dataset_classes(test))
            return ch_fail(err, CH_STATUS_BAD_INPUT, "%s: a model for %d classes, the data has %d", dir,
                           classes, ch_dataset_classes(test));
    }
    if (!o->normalize && normalize[0]) {
        /* The checkpoint's own setting, checked here so that a bad one is named as trainer.json's
         * and not as a flag the user never gave. */
        int c, h, w;
        ch_dataset_shape(test, &c, &h, &w);
        ch_augment a = { 0 };
        ch_err why;
        if (ch_augment_parse_normalize(&a, normalize, c, &why) != CH_STATUS_OK)
            return ch_fail(err, CH_STATUS_BAD_INPUT, "%s: trainer.json's config.normalize '%.100s' does not fit "
                           "this data (%.500s); --normalize overrides it", o->checkpoint, normalize, why.msg);
    }
    ch_train_config cfg = ch_train_config_default();
    cfg.model = model;
    cfg.graph = g;
    cfg.devices = o->devices;
    cfg.threads = (int)o->threads;
    cfg.batch_size = (int)o->batch;
    cfg.allow_nonfinite = o->allow_nonfinite;
    cfg.normalize = o->normalize ? o->normalize : normalize[0] ? normalize : NULL;
    ch_trainer *t = NULL;
    /* The test set stands in as the training set: it only fixes the shapes. */
    CH_TRY(ch_trainer_create(&cfg, test, test, &t, err));
    const int K = ch_dataset_classes(test);
    int64_t *hits = calloc((size_t)K, sizeof *hits), *counts = calloc((size_t)K, sizeof *counts);
    double loss = 0, acc = 0;
    ch_status st = hits && counts ? CH_STATUS_OK : CH_SYS_FAIL(err, "allocation of class tallies");
    if (st == CH_STATUS_OK) st = ch_trainer_load_weights(t, weights, err);
    if (st == CH_STATUS_OK) st = ch_trainer_evaluate_classes(t, test, &loss, &acc, hits, counts, err);
    if (st == CH_STATUS_OK) print_result(t, loss, acc, ch_dataset_size(test), hits, counts, K, o->per_class);
    free(hits);
    free(counts);
    ch_trainer_free(t);
    return st;
}

/* The ImageFolder evaluation size: --image-size, else the checkpoint's input side, else 224. */
static int folder_image_size(const eval_opts *o)
{
    if (o->image_size) return (int)o->image_size;
    char model[64], normalize[256];
    int classes, side = 0;
    ch_err ignored;
    if (!is_file(o->checkpoint) &&
        ch_checkpoint_peek(o->checkpoint, model, sizeof model, &classes, normalize, sizeof normalize, &side,
                           &ignored) == CH_STATUS_OK && side >= 8)
        return side;
    return ch_folder_options_default().image_size;
}

int ch_cmd_eval(int argc, char **argv)
{
    eval_opts o;
    int rc = ch_cli_parsed("eval", parse_eval(argc, argv, &o), 300);
    if (rc >= 0) return rc;
    ch_err err;
    ch_dataset *test = NULL;
    const ch_folder_options folder = { .image_size = folder_image_size(&o), .skip_bad_images = o.skip_bad,
                                       .limit = (size_t)o.test_limit };
    ch_status st = ch_dataset_load(o.data, o.dataset, CH_SPLIT_TEST, &folder, &test, &err);
    if (st == CH_STATUS_OK) {
        ch_cli_report_left_out("eval", test, "test");
        ch_dataset_truncate(test, (size_t)o.test_limit);
        st = evaluate(&o, test, &err);
    }
    char first[512];
    const size_t skipped = ch_dataset_skipped(test, first, sizeof first);
    if (skipped) fprintf(stderr, "cohort eval: skipped %zu image%s that did not decode (the first: %s)\n", skipped,
                         skipped == 1 ? "" : "s", first);
    ch_dataset_free(test);
    return ch_exit_for("eval", st, &err);
}
