/* ImageFolder data sets: the file list, and decoding one sample on demand. */
#ifndef CH_DATA_FOLDER_H
#define CH_DATA_FOLDER_H

#include <stdatomic.h>
#include <stdbool.h>

#include "core/status.h"
#include "data/dataset.h"
#include "data/image.h"

struct ch_folder {
    char *root;             /* DIR/train or DIR/val */
    char **paths;           /* one per sample (all of them, also past a truncation), owned */
    size_t npaths;
    char **class_names;     /* classes, sorted */
    int nclasses;
    int image_size;
    bool skip_bad;
    atomic_uchar *bad;      /* per file: it failed to decode (skip_bad only) */
    atomic_size_t skipped;  /* distinct files replaced because they did not decode */
    atomic_flag first_taken;
    char first_bad[1024];    /* the first replaced file's message */
    size_t left_out;         /* entries named like images that are no regular files */
    char first_left_out[1024];  /* the first of them, and what it is */
};

/* The largest file read as an image (a guard against reading a huge non-image into memory). */
#define CH_FOLDER_MAX_FILE_BYTES ((size_t)256 << 20)

/* True when DIR/train holds at least one folder (a quick look for auto-detection). */
bool ch_folder_present(const char *dir);

/* Sample i of d decoded to RGB; with skip_bad, a sample that does not decode is replaced by the
 * next one (i+1, i+2, ...) that does, and *label is that sample's. The caller frees img->rgb. */
ch_status ch_folder_decode(const ch_dataset *d, uint32_t i, ch_image *img, int *label, ch_err *err);

void ch_folder_free(ch_folder *f);

#endif
