/* cohort eval: test loss and accuracy of a checkpoint (or a safetensors state_dict) on a data set's
 * test split, on any number of devices and ranks; --per-class adds a table. */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "train/options.h"
#include "comm/world.h"
#include "core/status.h"
#include "data/augment.h"
#include "graph/graph.h"
#include "graph/graph_json.h"
#include "train/checkpoint.h"
#include "train/trainer.h"

static const ch_usage eval_usage = {
    .head = "usage: cohort eval --checkpoint PATH --data DIR [options]\n"
            "\n"
            "Evaluate a checkpoint on the test split of DIR (t10k- IDX files, CIFAR-10's test_batch.bin\n"
            "or an ImageFolder's DIR/val).\n"
            "\n",
};

typedef struct eval_opts {
    ch_opt_values v;    /* every flag (train/options.h) */
} eval_opts;

static int parse_eval(int argc, char **argv, eval_opts *o)
{
    const int rc = ch_flags_parse(CH_CMD_EVAL, "eval", &eval_usage, argc, argv, &o->v);
    if (rc >= 0) return rc;
    if (!o->v.cli.checkpoint || !o->v.cli.data) {
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

static void print_result(ch_trainer *t, bool bf16, double loss, double acc, size_t n,
                         const int64_t *hits, const int64_t *counts, int classes, bool per_class)
{
    if (ch_world_rank() != 0) return;
    char ranks[32] = "";
    if (ch_world_size() > 1) snprintf(ranks, sizeof ranks, " x %d ranks", ch_world_size());
    printf("test loss %.4f, test acc %.4f (%zu images) on [%s]%s%s\n", loss, acc, n,
           ch_trainer_devices(t), ranks,
           !bf16 ? "" : ch_trainer_bf16_layers(t) ? ", bf16 products" : ", --precision bf16 (products fp32 here)");
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
                       "leave --model out to evaluate the checkpoint's own", o->v.cli.checkpoint, kept->name, o->v.cfg.model);
    return CH_STATUS_OK;
}

/* The model: a checkpoint's graph.json or zoo name, which --model, when given, must match; for a
 * bare file, --model (a name or an ONNX file, whose weights are then replaced by the file's). */
static ch_status evaluate(const eval_opts *o, ch_dataset *test, ch_err *err)
{
    ch_graph *given = NULL, *g = NULL;
    /* An ONNX --model is read in every case: a missing or broken file is an error, never ignored. */
    ch_status st = o->v.cfg.model ? ch_cli_model(o->v.cfg.model, &given, err) : CH_STATUS_OK;
    if (st == CH_STATUS_OK && is_file(o->v.cli.checkpoint)) {
        g = given;
        given = NULL;
    } else if (st == CH_STATUS_OK) {
        st = ch_checkpoint_graph(o->v.cli.checkpoint, &g, err);
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
    if (is_file(o->v.cli.checkpoint)) {
        if (!o->v.cfg.model)
            return ch_fail(err, CH_STATUS_BAD_INPUT, "%s: a bare safetensors file needs --model", o->v.cli.checkpoint);
        snprintf(model, sizeof model, "%s", o->v.cfg.model);
        snprintf(weights, sizeof weights, "%s", o->v.cli.checkpoint);
    } else {
        char dir[4096];
        int side;
        CH_TRY(ch_checkpoint_peek(o->v.cli.checkpoint, model, sizeof model, &classes, normalize, sizeof normalize,
                                  &side, err));
        CH_TRY(ch_checkpoint_resolve(o->v.cli.checkpoint, dir, sizeof dir, err));
        if (o->v.cfg.model && strcmp(o->v.cfg.model, model) != 0 && !(g && ch_cli_is_onnx(o->v.cfg.model)))
            return ch_fail(err, CH_STATUS_BAD_INPUT, "%s: a checkpoint of %s, not %s", dir, model, o->v.cfg.model);
        if (snprintf(weights, sizeof weights, "%s/model.safetensors", dir) >= (int)sizeof weights)
            return ch_fail(err, CH_STATUS_BAD_INPUT, "%s: path too long", dir);
        if (classes != ch_dataset_classes(test))
            return ch_fail(err, CH_STATUS_BAD_INPUT, "%s: a model for %d classes, the data has %d", dir,
                           classes, ch_dataset_classes(test));
    }
    if (!o->v.cfg.normalize && normalize[0]) {
        /* The checkpoint's own setting, checked here so that a bad one is named as trainer.json's
         * and not as a flag the user never gave. */
        int c, h, w;
        ch_dataset_shape(test, &c, &h, &w);
        ch_augment a = { 0 };
        ch_err why;
        if (ch_augment_parse_normalize(&a, normalize, c, &why) != CH_STATUS_OK)
            return ch_fail(err, CH_STATUS_BAD_INPUT, "%s: trainer.json's config.normalize '%.100s' does not fit "
                           "this data (%.500s); --normalize overrides it", o->v.cli.checkpoint, normalize, why.msg);
    }
    /* --devices, --threads, -b, --allow-nonfinite and --precision as given: fp32 unless told, so
     * that a bf16-trained checkpoint's figures do not depend on the CPU that evaluates it. */
    ch_train_config cfg = o->v.cfg;
    cfg.model = model;
    cfg.graph = g;
    cfg.normalize = o->v.cfg.normalize ? o->v.cfg.normalize : normalize[0] ? normalize : NULL;
    ch_trainer *t = NULL;
    /* The test set stands in as the training set: it only fixes the shapes. */
    CH_TRY(ch_trainer_create(&cfg, test, test, &t, err));
    const int K = ch_dataset_classes(test);
    int64_t *hits = calloc((size_t)K, sizeof *hits), *counts = calloc((size_t)K, sizeof *counts);
    double loss = 0, acc = 0;
    ch_status st = hits && counts ? CH_STATUS_OK : CH_SYS_FAIL(err, "allocation of class tallies");
    if (st == CH_STATUS_OK) st = ch_trainer_load_weights(t, weights, err);
    if (st == CH_STATUS_OK) st = ch_trainer_evaluate_classes(t, test, &loss, &acc, hits, counts, err);
    if (st == CH_STATUS_OK) print_result(t, ch_trainer_bf16(&cfg), loss, acc, ch_dataset_size(test), hits, counts, K,
                                           o->v.cli.per_class);
    free(hits);
    free(counts);
    ch_trainer_free(t);
    return st;
}

/* The ImageFolder evaluation size: --image-size, else the checkpoint's input side, else 224. */
static int folder_image_size(const eval_opts *o)
{
    if (ch_flags_given(&o->v, "--image-size", CH_CMD_EVAL)) return o->v.folder.image_size;
    char model[64], normalize[256];
    int classes, side = 0;
    ch_err ignored;
    if (!is_file(o->v.cli.checkpoint) &&
        ch_checkpoint_peek(o->v.cli.checkpoint, model, sizeof model, &classes, normalize, sizeof normalize, &side,
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
    const ch_folder_options folder = { .image_size = folder_image_size(&o), .skip_bad_images = o.v.folder.skip_bad_images,
                                       .limit = (size_t)o.v.cli.test_limit };
    ch_status st = ch_dataset_load(o.v.cli.data, o.v.cli.dataset, CH_SPLIT_TEST, &folder, &test, &err);
    if (st == CH_STATUS_OK) {
        ch_cli_report_left_out("eval", test, "test");
        ch_dataset_truncate(test, (size_t)o.v.cli.test_limit);
        st = evaluate(&o, test, &err);
    }
    char first[512];
    const size_t skipped = ch_dataset_skipped(test, first, sizeof first);
    if (skipped) fprintf(stderr, "cohort eval: skipped %zu image%s that did not decode (the first: %s)\n", skipped,
                         skipped == 1 ? "" : "s", first);
    ch_dataset_free(test);
    return ch_exit_for("eval", st, &err);
}
