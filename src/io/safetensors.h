/* safetensors files (https://github.com/huggingface/safetensors): an 8-byte little-endian header
 * length N, N bytes of JSON (name -> {dtype, shape, data_offsets}, plus "__metadata__", a map of
 * strings), then the raw little-endian data. The JSON is written and parsed with cJSON; reading
 * validates everything a hostile or damaged file could get wrong (see safetensors.c). */
#ifndef CH_IO_SAFETENSORS_H
#define CH_IO_SAFETENSORS_H

#include <stddef.h>
#include <stdio.h>
#include <stdint.h>

#include "core/status.h"

typedef enum ch_st_dtype {
    CH_ST_BOOL, CH_ST_U8, CH_ST_I8, CH_ST_I16, CH_ST_U16, CH_ST_F16, CH_ST_BF16, CH_ST_I32,
    CH_ST_U32, CH_ST_F32, CH_ST_F64, CH_ST_I64, CH_ST_U64, CH_ST_NDTYPES
} ch_st_dtype;

enum { CH_ST_MAX_DIMS = 8, CH_ST_NAME_MAX = 256 };

typedef struct ch_st_tensor {
    char name[CH_ST_NAME_MAX];
    ch_st_dtype dtype;
    int ndim;                       /* 0: a scalar */
    int64_t shape[CH_ST_MAX_DIMS];
    const void *data;               /* writing: the caller's bytes; reading: inside the file image */
    size_t nbytes;
} ch_st_tensor;

typedef struct ch_st_file {
    int ntensors;
    ch_st_tensor *tensors;          /* in file order */
    int nmeta;
    char (*meta)[2][256];           /* __metadata__ key/value pairs */
    unsigned char *image;           /* the whole file, owned */
    size_t len;
} ch_st_file;

const char *ch_st_dtype_name(ch_st_dtype d);
size_t ch_st_dtype_size(ch_st_dtype d);

/* Write tensors in the given order, with metadata pairs meta[i][0] -> meta[i][1], to path, then
 * fsync it. Not atomic by itself: callers write a temporary name and rename. */
ch_status ch_st_write(const char *path, const ch_st_tensor *t, int n, const char *const (*meta)[2],
                      int nmeta, ch_err *err);
/* The same into an open stream (path names it in messages); the caller closes it. */
ch_status ch_st_write_to(FILE *f, const char *path, const ch_st_tensor *t, int n,
                         const char *const (*meta)[2], int nmeta, ch_err *err);
/* Read and validate path. Errors name the file (and the tensor). */
/* The same over a file already in memory: image (len bytes, malloc'd) becomes the file's, freed
 * with it, or at once on failure. path names it in messages. */
ch_status ch_st_parse(unsigned char *image, size_t len, const char *path, ch_st_file **out, ch_err *err);
ch_status ch_st_read(const char *path, ch_st_file **out, ch_err *err);
const ch_st_tensor *ch_st_find(const ch_st_file *f, const char *name);
/* The metadata value for key, or NULL. */
const char *ch_st_meta(const ch_st_file *f, const char *key);
void ch_st_free(ch_st_file *f);

#endif
