/* IDX files (LeCun's MNIST format), raw or gzip: zlib's gzread reads both.
 * Layout: magic (0x00 0x00 type ndim), ndim big-endian uint32 dimensions, then the data.
 * We accept type 0x08 (uint8): images with ndim 3 (n, rows, cols), labels with ndim 1 (n).
 * Everything is validated before use: magic, dimensions, the exact data length (no short read, no
 * trailing bytes), the image/label count match and every label's range. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zlib.h>

#include "core/file.h"
#include "core/status.h"
#include "data/dataset.h"

enum { IDX_MAX_DIM = 1 << 16, IDX_MAX_COUNT = 1 << 28, IDX_CLASSES = 10 };

/* Find DIR/NAME or DIR/NAME.gz; path receives the one found. */
static ch_status find_file(const char *dir, const char *name, char *path, size_t len, ch_err *err)
{
    snprintf(path, len, "%s/%s.gz", dir, name);
    if (access(path, R_OK) == 0) return CH_STATUS_OK;
    snprintf(path, len, "%s/%s", dir, name);
    if (access(path, R_OK) == 0) return CH_STATUS_OK;
    return ch_fail(err, CH_STATUS_BAD_INPUT, "%s/%s(.gz): no such readable file", dir, name);
}

static ch_status read_exact(gzFile f, const char *path, void *buf, size_t len, const char *what,
                            ch_err *err)
{
    size_t got = 0;
    while (got < len) {
        unsigned chunk = len - got > (1u << 30) ? (1u << 30) : (unsigned)(len - got);
        int r = gzread(f, (char *)buf + got, chunk);
        if (r < 0) {
            int zerr;
            const char *msg = gzerror(f, &zerr);
            return ch_fail(err, CH_STATUS_BAD_INPUT, "%s: corrupt data while reading %s (%s)",
                           path, what, msg);
        }
        if (r == 0) break;
        got += (size_t)r;
    }
    if (got != len)
        return ch_fail(err, CH_STATUS_BAD_INPUT,
                       "%s: truncated: %s needs %zu bytes, file has %zu", path, what, len, got);
    return CH_STATUS_OK;
}

static uint32_t be32(const uint8_t *p)
{
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

/* The first `want` bytes of the data into a buffer grown as the bytes arrive, so a header that
 * claims more than the file holds costs only what the file holds. */
static ch_status read_growing(gzFile f, const char *path, size_t want, uint8_t **data, ch_err *err)
{
    enum { FIRST = 64 << 20 };
    size_t cap = want < FIRST ? want : FIRST, got = 0;
    uint8_t *buf = malloc(cap ? cap : 1);
    ch_status st = buf ? CH_STATUS_OK : CH_STATUS_SYSTEM;
    while (st == CH_STATUS_OK && got < want) {
        if (got == cap) {
            const size_t grown = cap > want / 2 ? want : 2 * cap;
            uint8_t *p = realloc(buf, grown);
            if (!p) {
                st = CH_STATUS_SYSTEM;
                break;
            }
            buf = p;
            cap = grown;
        }
        st = read_exact(f, path, buf + got, cap - got, "the data", err);
        if (st == CH_STATUS_BAD_INPUT && strstr(err->msg, "truncated"))
            ch_fail(err, CH_STATUS_BAD_INPUT, "%s: truncated: %zu data bytes declared, the file holds fewer",
                    path, want);
        got = cap;
    }
    if (st == CH_STATUS_SYSTEM)
        ch_fail(err, CH_STATUS_BAD_INPUT, "%s: %zu bytes of data do not fit in memory (allocation failed; "
                "--train-limit/--test-limit read fewer samples)", path, want);
    if (st != CH_STATUS_OK) {
        free(buf);
        return st;
    }
    *data = buf;
    return CH_STATUS_OK;
}

/* Read an IDX file of ndim dimensions into *data (owned by the caller); dims receives them, and
 * dims[0] becomes the number of items read: at most limit (0: all) of the *declared. */
static ch_status read_idx(const char *path, int ndim, size_t limit, uint32_t *dims, uint32_t *declared,
                          uint8_t **data, ch_err *err)
{
    const int fd = ch_file_open_input(path, NULL, err);
    if (fd < 0) return CH_STATUS_BAD_INPUT;
    gzFile f = gzdopen(fd, "rb");
    if (!f) {
        close(fd);
        return ch_fail(err, CH_STATUS_SYSTEM, "%s: cannot read (gzdopen failed)", path);
    }
    uint8_t head[4 + 4 * 3];
    ch_status st = read_exact(f, path, head, 4 + 4 * (size_t)ndim, "the header", err);
    size_t total = 1;
    if (st == CH_STATUS_OK && (head[0] != 0 || head[1] != 0 || head[2] != 0x08 || head[3] != ndim))
        st = ch_fail(err, CH_STATUS_BAD_INPUT,
                     "%s: bad magic %02x%02x%02x%02x, expected 000008%02x (uint8, %d dimensions)",
                     path, head[0], head[1], head[2], head[3], ndim, ndim);
    for (int i = 0; st == CH_STATUS_OK && i < ndim; i++) {
        dims[i] = be32(head + 4 + 4 * i);
        const uint32_t most = i == 0 ? IDX_MAX_COUNT : IDX_MAX_DIM;
        if (dims[i] == 0 || dims[i] > most)
            st = ch_fail(err, CH_STATUS_BAD_INPUT, "%s: dimension %d is %u, expected 1..%u", path,
                         i, dims[i], most);
        total *= dims[i];
    }
    *data = NULL;
    *declared = dims[0];
    const bool part = st == CH_STATUS_OK && limit > 0 && limit < dims[0];
    if (part) {
        total = total / dims[0] * limit;
        dims[0] = (uint32_t)limit;
    }
    if (st == CH_STATUS_OK) st = read_growing(f, path, total, data, err);
    if (st == CH_STATUS_OK && !part) {
        uint8_t extra;
        int r = gzread(f, &extra, 1);
        if (r != 0)
            st = ch_fail(err, CH_STATUS_BAD_INPUT,
                         "%s: %s after the %zu data bytes the header declares", path,
                         r > 0 ? "trailing bytes" : "corrupt data", total);
    }
    gzclose(f);
    if (st != CH_STATUS_OK) {
        free(*data);
        *data = NULL;
    }
    return st;
}

ch_status ch_dataset_load_idx(const char *dir, ch_split split, ch_dataset **out, ch_err *err)
{
    return ch_idx_load(dir, split, 0, out, err);
}

ch_status ch_idx_load(const char *dir, ch_split split, size_t limit, ch_dataset **out, ch_err *err)
{
    const char *prefix = split == CH_SPLIT_TRAIN ? "train" : "t10k";
    char ipath[4096], lpath[4096], name[64];
    snprintf(name, sizeof name, "%s-images-idx3-ubyte", prefix);
    CH_TRY(find_file(dir, name, ipath, sizeof ipath, err));
    snprintf(name, sizeof name, "%s-labels-idx1-ubyte", prefix);
    CH_TRY(find_file(dir, name, lpath, sizeof lpath, err));

    ch_dataset *d = calloc(1, sizeof *d);
    CH_CHECK_ALLOC(err, d);
    uint32_t idims[3], ldims[1], ideclared = 0, ldeclared = 0;
    uint8_t *labels8 = NULL;
    ch_status st = read_idx(ipath, 3, limit, idims, &ideclared, &d->images, err);
    if (st == CH_STATUS_OK) st = read_idx(lpath, 1, limit, ldims, &ldeclared, &labels8, err);
    if (st == CH_STATUS_OK && !(d->labels = malloc(((size_t)ldims[0] + 1) * sizeof *d->labels)))
        st = CH_SYS_FAIL(err, "allocation of labels");
    for (uint32_t i = 0; st == CH_STATUS_OK && i < ldims[0]; i++) d->labels[i] = labels8[i];
    free(labels8);
    if (st == CH_STATUS_OK && ideclared != ldeclared)
        st = ch_fail(err, CH_STATUS_BAD_INPUT, "%s: %u labels, but %s has %u images", lpath,
                     ldeclared, ipath, ideclared);
    for (uint32_t i = 0; st == CH_STATUS_OK && i < ldims[0]; i++)
        if (d->labels[i] >= IDX_CLASSES)
            st = ch_fail(err, CH_STATUS_BAD_INPUT, "%s: label %u of sample %u, expected 0..%d",
                         lpath, d->labels[i], i, IDX_CLASSES - 1);
    if (st != CH_STATUS_OK) {
        ch_dataset_free(d);
        return st;
    }
    d->n = idims[0];
    d->c = 1;
    d->h = (int)idims[1];
    d->w = (int)idims[2];
    d->classes = IDX_CLASSES;
    *out = d;
    return CH_STATUS_OK;
}
