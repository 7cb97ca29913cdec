/* libFuzzer harness over the safetensors reader (header length, JSON header with cJSON, dtypes,
 * shapes, offsets, layout, metadata, duplicate keys). Any input must give a clean status, never a
 * crash, a leak or undefined behaviour; what parses must describe bytes inside the file. Built and
 * run by scripts/fuzz. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "io/safetensors.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    unsigned char *copy = malloc(size ? size : 1);
    if (!copy) return 0;
    memcpy(copy, data, size);
    ch_err err;
    ch_st_file *f = NULL;
    if (ch_st_parse(copy, size, "fuzz", &f, &err) != CH_STATUS_OK) return 0;
    for (int i = 0; i < f->ntensors; i++) {
        const ch_st_tensor *t = &f->tensors[i];
        const unsigned char *p = t->data;
        if (t->nbytes && (p < f->image || p + t->nbytes > f->image + f->len)) abort();
        if (ch_st_find(f, t->name) != t) abort();   /* names are unique */
    }
    ch_st_free(f);
    return 0;
}
