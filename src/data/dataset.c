/* Data set accessors and batch assembly. */
#include "data/dataset.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/file.h"
#include "core/status.h"
#include "data/folder.h"

ch_status ch_dataset_from_memory(size_t n, int c, int h, int w, int classes, const uint8_t *images,
                                 const uint8_t *labels, ch_dataset **out, ch_err *err)
{
    if (c < 1 || h < 1 || w < 1 || c > 4096 || h > 65536 || w > 65536 || classes < 2 || classes > 256)
        return ch_fail(err, CH_STATUS_BAD_INPUT, "data set of %dx%dx%d samples with %d classes: "
                       "sizes must be >= 1 and classes 2..256", c, h, w, classes);
    const size_t per = (size_t)c * (size_t)h * (size_t)w;
    if (n > SIZE_MAX / per) return ch_fail(err, CH_STATUS_BAD_INPUT, "data set of %zu samples is too large", n);
    for (size_t i = 0; i < n; i++)
        if (labels[i] >= classes)
            return ch_fail(err, CH_STATUS_BAD_INPUT, "label %d of sample %zu is not below %d classes",
                           labels[i], i, classes);
    ch_dataset *d = calloc(1, sizeof *d);
    CH_CHECK_ALLOC(err, d);
    *d = (ch_dataset){ .n = n, .c = c, .h = h, .w = w, .classes = classes };
    d->images = malloc(n * per + 1);
    d->labels = malloc((n + 1) * sizeof *d->labels);
    if (!d->images || !d->labels) {
        ch_dataset_free(d);
        return CH_SYS_FAIL(err, "allocation of a data set");
    }
    if (n) memcpy(d->images, images, n * per);
    for (size_t i = 0; i < n; i++) d->labels[i] = labels[i];
    *out = d;
    return CH_STATUS_OK;
}

ch_status ch_dataset_load(const char *dir, const char *kind, ch_split split, const ch_folder_options *o,
                          ch_dataset **out, ch_err *err)
{
    CH_TRY(ch_file_check_dir(dir, NULL, err));
    if (!kind || strcmp(kind, "auto") == 0) {
        char probe[4200];
        snprintf(probe, sizeof probe, "%s/t10k-labels-idx1-ubyte", dir);
        bool idx = access(probe, F_OK) == 0;
        snprintf(probe, sizeof probe, "%s/t10k-labels-idx1-ubyte.gz", dir);
        idx = idx || access(probe, F_OK) == 0;
        kind = idx ? "idx" : ch_cifar_present(dir) ? "cifar10" : ch_folder_present(dir) ? "imagefolder" : NULL;
        if (!kind)
            return ch_fail(err, CH_STATUS_BAD_INPUT, "%s: no data set found (IDX t10k-* files, CIFAR-10 "
                           "test_batch.bin or an ImageFolder's train/ folder; --dataset names the kind)", dir);
    }
    const size_t limit = o ? o->limit : 0;
    if (strcmp(kind, "idx") == 0) return ch_idx_load(dir, split, limit, out, err);
    if (strcmp(kind, "cifar10") == 0) return ch_cifar_load(dir, split, limit, out, err);
    if (strcmp(kind, "imagefolder") == 0) return ch_dataset_load_folder(dir, split, o, out, err);
    return ch_fail(err, CH_STATUS_BAD_INPUT, "unknown data set kind '%s' (expected idx, cifar10 or imagefolder)", kind);
}

size_t ch_dataset_size(const ch_dataset *d) { return d->n; }
int ch_dataset_classes(const ch_dataset *d) { return d->classes; }

void ch_dataset_shape(const ch_dataset *d, int *c, int *h, int *w)
{
    *c = d->c;
    *h = d->h;
    *w = d->w;
}

void ch_dataset_truncate(ch_dataset *d, size_t n)
{
    if (n > 0 && n < d->n) d->n = n;
}

void ch_dataset_free(ch_dataset *d)
{
    if (!d) return;
    free(d->images);
    free(d->labels);
    ch_folder_free(d->folder);
    free(d);
}
