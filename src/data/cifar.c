/* CIFAR-10 binary version: data_batch_1.bin .. data_batch_5.bin (training) and test_batch.bin, in
 * DIR or in DIR/cifar-10-batches-bin. Each record is a label byte (0-9) then 3072 pixel bytes: the
 * 32x32 red plane, then green, then blue (exactly cohort's (c, h, w) layout). Validated: every file
 * present and readable, a whole number of records, every label below 10. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/file.h"
#include "core/status.h"
#include "data/dataset.h"

enum { SIDE = 32, PIXELS = 3 * SIDE * SIDE, RECORD = 1 + PIXELS, CLASSES = 10, MAX_RECORDS = 1 << 24 };

/* DIR itself, or DIR/cifar-10-batches-bin (as the archive unpacks), whichever holds the files. */
static void cifar_root(const char *dir, char *out, size_t len)
{
    snprintf(out, len, "%s/cifar-10-batches-bin/test_batch.bin", dir);
    if (access(out, F_OK) == 0) snprintf(out, len, "%s/cifar-10-batches-bin", dir);
    else snprintf(out, len, "%s", dir);
}

bool ch_cifar_present(const char *dir)
{
    char root[4096], path[4200];
    cifar_root(dir, root, sizeof root);
    snprintf(path, sizeof path, "%s/test_batch.bin", root);
    return access(path, F_OK) == 0;
}

static ch_status file_records(const char *path, FILE **out, size_t *records, ch_err *err)
{
    uint64_t size = 0;
    const int fd = ch_file_open_input(path, &size, err);
    if (fd < 0) return CH_STATUS_BAD_INPUT;
    if (size == 0 || size % RECORD != 0) {
        close(fd);
        return ch_fail(err, CH_STATUS_BAD_INPUT, "%s: %llu bytes is not a whole number of %d-byte CIFAR-10 "
                       "records (truncated or not CIFAR-10)", path, (unsigned long long)size, RECORD);
    }
    FILE *f = fdopen(fd, "rb");
    if (!f) {
        close(fd);
        return ch_fail(err, CH_STATUS_SYSTEM, "%s: fdopen failed (%s)", path, strerror(errno));
    }
    *out = f;
    *records = (size_t)(size / RECORD);
    return CH_STATUS_OK;
}

/* Append the records of path to d (grown to hold them), at most `room` of them. */
static ch_status read_file(const char *path, size_t room, ch_dataset *d, ch_err *err)
{
    FILE *f = NULL;
    size_t n = 0;
    CH_TRY(file_records(path, &f, &n, err));
    if (n > room) n = room;
    ch_status st = CH_STATUS_OK;
    if (d->n + n > MAX_RECORDS) st = ch_fail(err, CH_STATUS_BAD_INPUT, "%s: too many records", path);
    uint8_t *img = st == CH_STATUS_OK ? realloc(d->images, (d->n + n) * PIXELS) : NULL;
    if (img) d->images = img;
    uint16_t *lab = img ? realloc(d->labels, (d->n + n) * sizeof *lab) : NULL;
    if (lab) d->labels = lab;
    if (st == CH_STATUS_OK && (!img || !lab))
        st = ch_fail(err, CH_STATUS_BAD_INPUT, "%s: %zu records (%zu bytes) do not fit in memory (allocation "
                     "failed; --train-limit/--test-limit read fewer)", path, d->n + n, (d->n + n) * PIXELS);
    uint8_t rec[RECORD];
    for (size_t i = 0; st == CH_STATUS_OK && i < n; i++) {
        if (fread(rec, 1, RECORD, f) != RECORD)
            st = ch_fail(err, CH_STATUS_BAD_INPUT, "%s: read failed at record %zu", path, i);
        else if (rec[0] >= CLASSES)
            st = ch_fail(err, CH_STATUS_BAD_INPUT, "%s: label %d of record %zu is not below 10", path, rec[0], i);
        else {
            d->labels[d->n + i] = rec[0];
            memcpy(d->images + (d->n + i) * PIXELS, rec + 1, PIXELS);
        }
    }
    fclose(f);
    if (st == CH_STATUS_OK) d->n += n;
    return st;
}

ch_status ch_dataset_load_cifar10(const char *dir, ch_split split, ch_dataset **out, ch_err *err)
{
    return ch_cifar_load(dir, split, 0, out, err);
}

ch_status ch_cifar_load(const char *dir, ch_split split, size_t limit, ch_dataset **out, ch_err *err)
{
    const size_t cap = limit ? limit : SIZE_MAX;
    char root[4096], path[4200];
    cifar_root(dir, root, sizeof root);
    ch_dataset *d = calloc(1, sizeof *d);
    CH_CHECK_ALLOC(err, d);
    *d = (ch_dataset){ .c = 3, .h = SIDE, .w = SIDE, .classes = CLASSES };
    ch_status st = CH_STATUS_OK;
    if (split == CH_SPLIT_TEST) {
        snprintf(path, sizeof path, "%s/test_batch.bin", root);
        st = read_file(path, cap, d, err);
    } else {
        for (int b = 1; b <= 5 && st == CH_STATUS_OK && d->n < cap; b++) {
            snprintf(path, sizeof path, "%s/data_batch_%d.bin", root, b);
            st = read_file(path, cap - d->n, d, err);
        }
    }
    if (st != CH_STATUS_OK) {
        ch_dataset_free(d);
        return st;
    }
    *out = d;
    return CH_STATUS_OK;
}
