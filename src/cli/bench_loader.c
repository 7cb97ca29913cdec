/* cohort bench loader: images/second of the ImageFolder input path alone (read, decode, the
 * training transforms) through the threaded loader with N workers, or with -j 0 in the calling
 * thread as the training step does then. One pass over the training split in a shuffled order. */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "core/clock.h"
#include "core/rng.h"
#include "data/augment.h"
#include "data/dataset.h"
#include "data/loader.h"

static const char loader_usage[] =
    "usage: cohort bench loader --data DIR [-j N] [--image-size N] [-b B] [--limit N]\n"
    "\n"
    "Reads, decodes and augments (RandomResizedCrop, flip, ImageNet normalization) the training\n"
    "images of an ImageFolder once, in batches of B (default 256), with N loader threads (default 1;\n"
    "0: in this thread), and prints images/second. --limit: the first N images only.\n";

typedef struct loader_opts {
    const char *data;
    long workers, image_size, batch, limit;
} loader_opts;

static int parse_loader(int argc, char **argv, loader_opts *o)
{
    static const struct option opts[] = {
        { "data", required_argument, NULL, 'd' },       { "workers", required_argument, NULL, 'j' },
        { "image-size", required_argument, NULL, 'i' }, { "batch-size", required_argument, NULL, 'b' },
        { "limit", required_argument, NULL, 'l' },      { "help", no_argument, NULL, 'h' },
        { NULL, 0, NULL, 0 },
    };
    *o = (loader_opts){ .workers = 1, .image_size = 224, .batch = 256 };
    optind = 1;
    opterr = 0;
    int c;
    while ((c = getopt_long(argc, argv, ":b:j:h", opts, NULL)) != -1) {
        bool ok = true;
        switch (c) {
        case 'd': o->data = optarg; break;
        case 'j': ok = ch_arg_int("bench loader", "workers", optarg, 0, CH_LOADER_MAX_WORKERS, &o->workers); break;
        case 'i': ok = ch_arg_int("bench loader", "image-size", optarg, 8, 4096, &o->image_size); break;
        case 'b': ok = ch_arg_int("bench loader", "batch-size", optarg, 1, 1 << 16, &o->batch); break;
        case 'l': ok = ch_arg_int("bench loader", "limit", optarg, 1, __LONG_MAX__, &o->limit); break;
        case 'h': fputs(loader_usage, stdout); return CH_EXIT_OK;
        default: fprintf(stderr, "cohort bench loader: unknown or incomplete option (see --help)\n"); return CH_EXIT_USAGE;
        }
        if (!ok) return CH_EXIT_USAGE;
    }
    if (!o->data || optind < argc) {
        fprintf(stderr, "cohort bench loader: --data DIR is required, and nothing else (see --help)\n");
        return CH_EXIT_USAGE;
    }
    return -1;
}

/* One pass: through the loader's workers, or gathering here (-j 0). */
static ch_status one_pass(const loader_opts *o, const ch_dataset *d, const ch_augment *a, const uint32_t *perm,
                          ch_err *err)
{
    const int B = (int)o->batch, nb = (int)((d->n + (size_t)B - 1) / (size_t)B);
    const size_t per = (size_t)d->c * d->h * d->w;
    ch_loader_batch *batches = malloc(sizeof *batches * (size_t)nb);
    CH_CHECK_ALLOC(err, batches);
    for (int k = 0; k < nb; k++)
        batches[k] = (ch_loader_batch){ perm + (size_t)k * B, (int)(d->n - (size_t)k * B < (size_t)B ? d->n - (size_t)k * B : (size_t)B) };
    ch_status st = CH_STATUS_OK;
    if (o->workers == 0) {
        ch_real *x = malloc(sizeof(ch_real) * per * (size_t)B);
        int32_t *labels = malloc(sizeof(int32_t) * (size_t)B);
        if (!x || !labels) st = CH_SYS_FAIL(err, "allocation of a batch");
        for (int k = 0; k < nb && st == CH_STATUS_OK; k++)
            st = ch_augment_gather(a, d, batches[k].idx, batches[k].count, true, 1, 0, x, labels, err);
        free(x);
        free(labels);
    } else {
        ch_loader *l = NULL;
        st = ch_loader_create((int)o->workers, B, per, &l, err);
        if (st == CH_STATUS_OK) st = ch_loader_start(l, a, d, 1, 0, batches, nb, err);
        for (int k = 0; k < nb && st == CH_STATUS_OK; k++) {
            const ch_real *x;
            const int32_t *labels;
            st = ch_loader_next(l, &x, &labels, err);
            if (st == CH_STATUS_OK) ch_loader_release(l);
        }
        ch_loader_free(l);
    }
    free(batches);
    return st;
}

int ch_cmd_bench_loader(int argc, char **argv)
{
    loader_opts o;
    int rc = parse_loader(argc, argv, &o);
    if (rc >= 0) return rc;
    ch_err err;
    ch_dataset *d = NULL;
    const ch_folder_options fo = { .image_size = (int)o.image_size };
    ch_status st = ch_dataset_load(o.data, "imagefolder", CH_SPLIT_TRAIN, &fo, &d, &err);
    uint32_t *perm = NULL;
    if (st == CH_STATUS_OK) {
        ch_dataset_truncate(d, (size_t)o.limit);
        if (!(perm = malloc(sizeof *perm * d->n))) st = CH_SYS_FAIL(&err, "allocation of an order");
    }
    ch_augment a = { .crop_padding = -1, .flip = true };
    if (st == CH_STATUS_OK) st = ch_augment_parse_normalize(&a, "imagenet", 3, &err);
    if (st == CH_STATUS_OK) {
        ch_rng r;
        ch_rng_init(&r, 1, CH_RNG_STREAM_SHUFFLE, 0);
        ch_rng_permutation(&r, perm, (uint32_t)d->n);
        const double t0 = ch_clock_s();
        st = one_pass(&o, d, &a, perm, &err);
        const double s = ch_clock_s() - t0;
        if (st == CH_STATUS_OK)
            printf("loader: %zu images %dx%d, -j %ld, batch %ld: %.2f s, %.0f img/s\n", d->n, d->h, d->w,
                   o.workers, o.batch, s, d->n / s);
    }
    free(perm);
    ch_dataset_free(d);
    return ch_exit_for("bench loader", st, &err);
}
