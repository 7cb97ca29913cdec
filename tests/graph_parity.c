/* Graphs against PyTorch (graph_parity.sh drives it).
 *
 *   graph_parity step DIR MODEL DEVICES [sync-bn]
 *       The model of graph_models.c from DIR/MODEL.init.safetensors (PyTorch's initial weights), or
 *       with MODEL onnx:M, the graph and weights of DIR/M.onnx (PyTorch's export of the same model),
 *       or with zoo:M the zoo's model M (its graph made by the trainer from the name),
 *       one SGD step (lr 0.05, momentum 0.9, weight decay 1e-4) on DIR/data's 32 training images
 *       in one batch on DEVICES (over every MPI rank when started by mpirun): the parameters and
 *       BatchNorm buffers must be PyTorch's (DIR/MODEL.after.safetensors, computed in double) within
 *       1e-4 of each tensor's largest value (at least 0.05), num_batches_tracked exactly. Rank 0 exports the state_dict to
 *       DIR/MODEL.cohort.safetensors and prints "correct N": the test images it classifies right.
 *   graph_parity learn DATA MODEL TEST_MIN TRAIN_MIN
 *       3 epochs on 8000 Fashion-MNIST images (DATA/fashion-mnist): the best epoch's test accuracy
 *       on 2000 must reach TEST_MIN, and the last epoch's training accuracy TRAIN_MIN. MODEL: a
 *       model of graph_models.c, or onnx:FILE, an exported one from its file's weights. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cohort.h"
#include "graph_models.h"
#include "io/safetensors.h"

static int die(const ch_err *err)
{
    fprintf(stderr, "graph_parity: %s\n", err->msg);
    return 1;
}

/* Every tensor of PyTorch's file is in cohort's with its shape and values; nothing more. */
/* The tolerance for model's step: 1e-4, or what DIR/MODEL.tol says (graph_parity.py writes it for
 * the zoo's ResNet-18, where 18 layers of float32 rounding amplified through small BatchNorm
 * batches, and Winograd F(4x4, 3x3) on AVX-512, reach 1.5e-3: four times PyTorch's own float32
 * step's distance from the exact one). */
static double tolerance(const char *dir, const char *model)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/%s.tol", dir, model);
    FILE *f = fopen(path, "r");
    double tol = 1e-4;
    if (f && (fscanf(f, "%lf", &tol) != 1 || !(tol >= 1e-4 && tol <= 1e-2))) {
        printf("FAIL: %s holds no tolerance in [1e-4, 1e-2]\n", path);
        tol = 0;
    }
    if (f) fclose(f);
    return tol;
}

static int compare(const char *mine, const char *theirs, double tol)
{
    ch_err err;
    ch_st_file *a, *b;
    if (ch_st_read(mine, &a, &err) != CH_STATUS_OK || ch_st_read(theirs, &b, &err) != CH_STATUS_OK)
        return die(&err);
    int bad = 0;
    double worst = 0;
    const char *worst_name = "";
    if (a->ntensors != b->ntensors) {
        printf("FAIL: %d tensors, PyTorch has %d\n", a->ntensors, b->ntensors);
        bad++;
    }
    for (int i = 0; i < b->ntensors; i++) {
        const ch_st_tensor *t = &b->tensors[i], *u = ch_st_find(a, t->name);
        if (!u || u->dtype != t->dtype || u->nbytes != t->nbytes || u->ndim != t->ndim) {
            printf("FAIL: %s missing or of another type/shape\n", t->name);
            bad++;
            continue;
        }
        if (t->dtype == CH_ST_I64) {
            if (memcmp(u->data, t->data, t->nbytes) != 0) {
                printf("FAIL: %s differs\n", t->name);
                bad++;
            }
            continue;
        }
        const float *x = u->data, *y = t->data;
        double diff = 0, scale = 0;
        for (size_t j = 0; j < t->nbytes / sizeof(float); j++) {
            diff = fmax(diff, fabs((double)x[j] - y[j]));
            scale = fmax(scale, fabs((double)y[j]));
        }
        /* Small tensors are judged against 0.05: a BatchNorm bias after one step is ~1e-3, and its
         * gradient a sum cancelled 100-3000 fold, so float rounding moves it by 1e-3 of itself
         * (PyTorch's own two float32 convolutions, mkldnn and THNN, differ by 1.1e-3 on
         * resnet's layer1.0.bn1.bias); a wrong or missing term moves it by its whole size. */
        const double rel = diff / fmax(scale, 0.05);
        if (rel > worst) {
            worst = rel;
            worst_name = t->name;
        }
        if (!(rel <= tol)) {
            printf("FAIL: %s: %.3g of its largest value from PyTorch's\n", t->name, rel);
            bad++;
        }
    }
    printf("%d tensors, worst %.3g (%s), tolerance %.3g\n", b->ntensors, worst, worst_name, tol);
    ch_st_free(a);
    ch_st_free(b);
    return bad ? 1 : 0;
}

static int step(const char *dir, const char *model, const char *devices, bool sync_bn)
{
    ch_err err;
    char path[4096];
    ch_dataset *train, *test;
    snprintf(path, sizeof path, "%s/data", dir);
    if (ch_dataset_load_idx(path, CH_SPLIT_TRAIN, &train, &err) != CH_STATUS_OK ||
        ch_dataset_load_idx(path, CH_SPLIT_TEST, &test, &err) != CH_STATUS_OK)
        return die(&err);
    ch_graph *g = NULL;
    const bool onnx = strncmp(model, "onnx:", 5) == 0, zoo = strncmp(model, "zoo:", 4) == 0;
    const char *form = onnx ? "onnx:" : zoo ? "zoo:" : "";
    model += strlen(form);
    snprintf(path, sizeof path, "%s/%s.onnx", dir, model);
    if (!zoo && (onnx ? ch_graph_load_onnx(path, &g, &err) : tg_build(model, 0.0, &g, &err)) != CH_STATUS_OK)
        return die(&err);
    ch_train_config cfg = ch_train_config_default();
    cfg.graph = g;
    cfg.model = zoo ? model : NULL;
    cfg.devices = devices;
    cfg.sync_bn = sync_bn;
    cfg.batch_size = (int)ch_dataset_size(train);
    cfg.epochs = 1;
    cfg.lr = 0.05;
    cfg.momentum = 0.9;
    cfg.weight_decay = 1e-4;
    ch_trainer *t;
    if (ch_trainer_create(&cfg, train, test, &t, &err) != CH_STATUS_OK) return die(&err);
    ch_graph_free(g);   /* the trainer needs it no longer */
    snprintf(path, sizeof path, "%s/%s.init.safetensors", dir, model);
    ch_epoch_stats s;
    /* An imported graph starts from its file's weights. */
    if ((!onnx && ch_trainer_load_weights(t, path, &err) != CH_STATUS_OK) || ch_trainer_run_epoch(t, &s, &err) != CH_STATUS_OK)
        return die(&err);
    int rc = 0;
    if (ch_world_rank() == 0) {
        snprintf(path, sizeof path, "%s/%s.cohort.safetensors", dir, model);
        if (ch_trainer_export(t, path, &err) != CH_STATUS_OK) return die(&err);
        char theirs[4096];
        snprintf(theirs, sizeof theirs, "%s/%s.after.safetensors", dir, model);
        printf("%s%s on %s%s, %d rank(s): loss %.6f\n", form, model, devices, sync_bn ? " with sync-BN" : "",
               ch_world_size(), s.loss);
        rc = compare(path, theirs, tolerance(dir, model));
        printf("correct %.0f\n", s.test_acc * (double)ch_dataset_size(test));
    }
    ch_trainer_free(t);
    ch_dataset_free(train);
    ch_dataset_free(test);
    return rc;
}

static int learn(const char *data, const char *model, double test_min, double train_min)
{
    ch_err err;
    char path[4096];
    snprintf(path, sizeof path, "%s/fashion-mnist", data);
    ch_dataset *train, *test;
    if (ch_dataset_load_idx(path, CH_SPLIT_TRAIN, &train, &err) != CH_STATUS_OK ||
        ch_dataset_load_idx(path, CH_SPLIT_TEST, &test, &err) != CH_STATUS_OK)
        return die(&err);
    ch_dataset_truncate(train, 8000);
    ch_dataset_truncate(test, 2000);
    ch_graph *g;
    const bool onnx = strncmp(model, "onnx:", 5) == 0;
    if ((onnx ? ch_graph_load_onnx(model + 5, &g, &err) : tg_build(model, 0.2, &g, &err)) != CH_STATUS_OK)
        return die(&err);
    ch_train_config cfg = ch_train_config_default();
    cfg.graph = g;
    cfg.devices = "cpu:0,cpu:1";
    cfg.batch_size = 64;
    cfg.epochs = 3;
    cfg.lr = 0.05;
    cfg.momentum = 0.9;
    ch_trainer *t;
    if (ch_trainer_create(&cfg, train, test, &t, &err) != CH_STATUS_OK) return die(&err);
    ch_epoch_stats s = { 0 };
    double best = 0;   /* the best epoch's test accuracy: BatchNorm's eval mode swings between epochs */
    for (int e = 0; e < cfg.epochs; e++) {
        if (ch_trainer_run_epoch(t, &s, &err) != CH_STATUS_OK) return die(&err);
        printf("%s epoch %d, loss %.4f, train acc %.3f, test acc %.3f, %.0f img/s on [%s]\n", model,
               s.epoch, s.loss, s.train_acc, s.test_acc, s.images_per_s, ch_trainer_devices(t));
        if (s.test_acc > best) best = s.test_acc;
    }
    ch_trainer_free(t);
    ch_graph_free(g);
    ch_dataset_free(train);
    ch_dataset_free(test);
    if (!(best >= test_min)) {
        printf("FAIL: %s best test accuracy %.3f below %.2f\n", model, best, test_min);
        return 1;
    }
    if (!(s.train_acc >= train_min)) {
        printf("FAIL: %s last training accuracy %.3f below %.2f\n", model, s.train_acc, train_min);
        return 1;
    }
    return 0;
}

int main(int argc, char **argv)
{
    ch_err err;
    if (ch_world_init(&argc, &argv, &err) != CH_STATUS_OK) return die(&err);
    int rc = 2;
    if (argc >= 5 && strcmp(argv[1], "step") == 0)
        rc = step(argv[2], argv[3], argv[4], argc > 5 && strcmp(argv[5], "sync-bn") == 0);
    else if (argc == 6 && strcmp(argv[1], "learn") == 0)
        rc = learn(argv[2], argv[3], atof(argv[4]), atof(argv[5]));
    else
        fprintf(stderr, "usage: graph_parity step DIR MODEL DEVICES [sync-bn] | learn DATA MODEL TEST_MIN TRAIN_MIN\n");
    if (rc == 1 && ch_world_size() > 1) ch_world_abort(1);
    ch_world_finalize();
    return rc;
}
