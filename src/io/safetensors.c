/* safetensors reading and writing. What reading checks, each failure one line naming the file and,
 * where there is one, the tensor:
 *  - the file holds at least the 8-byte length; the header length is at most 100 MiB and fits the file;
 *  - the header is a JSON object; "__metadata__", if present, maps strings to strings;
 *  - every tensor: a name of at most 255 bytes, used once; a known dtype; a shape of at most 8
 *    non-negative integers whose product times the dtype size does not overflow; data_offsets
 *    [begin, end] integers inside the data section with end - begin equal to that size;
 *  - the tensors' byte ranges do not overlap and cover the data section without holes (the format
 *    requires it, and a hole or an overlap means a damaged or crafted file). */
#include "io/safetensors.h"

#include "io/json.h"

#include "core/file.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

_Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "safetensors data is little-endian");

static const struct { const char *name; size_t size; } dtypes[CH_ST_NDTYPES] = {
    [CH_ST_BOOL] = { "BOOL", 1 }, [CH_ST_U8] = { "U8", 1 },   [CH_ST_I8] = { "I8", 1 },
    [CH_ST_I16] = { "I16", 2 },   [CH_ST_U16] = { "U16", 2 }, [CH_ST_F16] = { "F16", 2 },
    [CH_ST_BF16] = { "BF16", 2 }, [CH_ST_I32] = { "I32", 4 }, [CH_ST_U32] = { "U32", 4 },
    [CH_ST_F32] = { "F32", 4 },   [CH_ST_F64] = { "F64", 8 }, [CH_ST_I64] = { "I64", 8 },
    [CH_ST_U64] = { "U64", 8 },
};

enum { MAX_HEADER = 100 << 20 };

const char *ch_st_dtype_name(ch_st_dtype d) { return d < CH_ST_NDTYPES ? dtypes[d].name : "?"; }
size_t ch_st_dtype_size(ch_st_dtype d) { return d < CH_ST_NDTYPES ? dtypes[d].size : 0; }

/* ---- writing ------------------------------------------------------------------------------ */

static cJSON *tensor_json(const ch_st_tensor *t, size_t begin)
{
    cJSON *o = cJSON_CreateObject(), *shape = cJSON_CreateArray(), *offs = cJSON_CreateArray();
    if (!o || !shape || !offs) {
        cJSON_Delete(o);
        cJSON_Delete(shape);
        cJSON_Delete(offs);
        return NULL;
    }
    cJSON_AddItemToObject(o, "dtype", cJSON_CreateString(ch_st_dtype_name(t->dtype)));
    for (int i = 0; i < t->ndim; i++) cJSON_AddItemToArray(shape, cJSON_CreateNumber((double)t->shape[i]));
    cJSON_AddItemToObject(o, "shape", shape);
    cJSON_AddItemToArray(offs, cJSON_CreateNumber((double)begin));
    cJSON_AddItemToArray(offs, cJSON_CreateNumber((double)(begin + t->nbytes)));
    cJSON_AddItemToObject(o, "data_offsets", offs);
    return o;
}

/* The header text, padded with spaces to a multiple of 8 bytes (so the data is aligned). */
static char *header_text(const ch_st_tensor *t, int n, const char *const (*meta)[2], int nmeta,
                         size_t *len)
{
    cJSON *root = cJSON_CreateObject();
    if (!root) return NULL;
    if (nmeta > 0) {
        cJSON *m = cJSON_AddObjectToObject(root, "__metadata__");
        for (int i = 0; m && i < nmeta; i++) cJSON_AddStringToObject(m, meta[i][0], meta[i][1]);
    }
    size_t at = 0;
    for (int i = 0; i < n; i++) {
        cJSON *o = tensor_json(&t[i], at);
        if (!o) {
            cJSON_Delete(root);
            return NULL;
        }
        cJSON_AddItemToObject(root, t[i].name, o);
        at += t[i].nbytes;
    }
    char *text = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    if (!text) return NULL;
    const size_t raw = strlen(text), padded = (raw + 7) / 8 * 8;
    char *out = realloc(text, padded + 1);
    if (!out) {
        free(text);
        return NULL;
    }
    memset(out + raw, ' ', padded - raw);
    out[padded] = 0;
    *len = padded;
    return out;
}

static ch_status write_all(FILE *f, const void *p, size_t n, const char *path, ch_err *err)
{
    if (n && fwrite(p, 1, n, f) != n)
        return ch_fail(err, CH_STATUS_SYSTEM, "%s: write failed (%s)", path, strerror(errno));
    return CH_STATUS_OK;
}

static ch_status write_body(FILE *f, const char *path, const char *hdr, size_t hlen,
                            const ch_st_tensor *t, int n, ch_err *err)
{
    unsigned char len8[8];
    for (int i = 0; i < 8; i++) len8[i] = (unsigned char)((uint64_t)hlen >> (8 * i));
    CH_TRY(write_all(f, len8, 8, path, err));
    CH_TRY(write_all(f, hdr, hlen, path, err));
    for (int i = 0; i < n; i++) CH_TRY(write_all(f, t[i].data, t[i].nbytes, path, err));
    if (fflush(f) != 0 || (fsync(fileno(f)) != 0 && errno != EINVAL))
        return ch_fail(err, CH_STATUS_SYSTEM, "%s: flush to disk failed (%s)", path, strerror(errno));
    return CH_STATUS_OK;
}

ch_status ch_st_write_to(FILE *f, const char *path, const ch_st_tensor *t, int n,
                         const char *const (*meta)[2], int nmeta, ch_err *err)
{
    size_t hlen = 0;
    char *hdr = header_text(t, n, meta, nmeta, &hlen);
    if (!hdr) return CH_SYS_FAIL(err, "building the safetensors header");
    ch_status st = write_body(f, path, hdr, hlen, t, n, err);
    free(hdr);
    return st;
}

ch_status ch_st_write(const char *path, const ch_st_tensor *t, int n, const char *const (*meta)[2],
                      int nmeta, ch_err *err)
{
    FILE *f = fopen(path, "wb");
    if (!f) return ch_fail(err, CH_STATUS_SYSTEM, "%s: cannot create (%s)", path, strerror(errno));
    ch_status st = ch_st_write_to(f, path, t, n, meta, nmeta, err);
    if (fclose(f) != 0 && st == CH_STATUS_OK)
        st = ch_fail(err, CH_STATUS_SYSTEM, "%s: close failed (%s)", path, strerror(errno));
    return st;
}

/* ---- reading ------------------------------------------------------------------------------ */

static bool as_index(const cJSON *v, double max, uint64_t *out)
{
    if (!cJSON_IsNumber(v)) return false;
    const double d = v->valuedouble;
    if (!(d >= 0 && d <= max) || d != floor(d)) return false;
    *out = (uint64_t)d;
    return true;
}

static ch_status parse_dtype(const char *path, const char *name, const cJSON *v, ch_st_dtype *out,
                             ch_err *err)
{
    if (cJSON_IsString(v))
        for (int d = 0; d < CH_ST_NDTYPES; d++)
            if (strcmp(v->valuestring, dtypes[d].name) == 0) {
                *out = (ch_st_dtype)d;
                return CH_STATUS_OK;
            }
    return ch_fail(err, CH_STATUS_BAD_INPUT, "%s: tensor '%s': unknown dtype %s", path, name,
                   cJSON_IsString(v) ? v->valuestring : "(not a string)");
}

/* Shape and offsets of one tensor; data is the start of the data section (dlen bytes). */
static ch_status parse_tensor(const char *path, const cJSON *item, const unsigned char *data,
                              size_t dlen, ch_st_tensor *t, size_t *begin, ch_err *err)
{
    const char *name = item->string;
    if (strlen(name) >= CH_ST_NAME_MAX)
        return ch_fail(err, CH_STATUS_BAD_INPUT, "%s: a tensor name of %zu bytes (at most %d)", path,
                       strlen(name), CH_ST_NAME_MAX - 1);
    snprintf(t->name, sizeof t->name, "%s", name);
    if (!cJSON_IsObject(item))
        return ch_fail(err, CH_STATUS_BAD_INPUT, "%s: tensor '%s' is not a JSON object", path, name);
    CH_TRY(parse_dtype(path, name, cJSON_GetObjectItemCaseSensitive(item, "dtype"), &t->dtype, err));
    const cJSON *shape = cJSON_GetObjectItemCaseSensitive(item, "shape");
    const int nd = cJSON_IsArray(shape) ? cJSON_GetArraySize(shape) : -1;
    if (nd < 0 || nd > CH_ST_MAX_DIMS)
        return ch_fail(err, CH_STATUS_BAD_INPUT, "%s: tensor '%s': shape must be a list of at most %d sizes",
                       path, name, CH_ST_MAX_DIMS);
    t->ndim = nd;
    uint64_t bytes = dtypes[t->dtype].size;
    for (int i = 0; i < nd; i++) {
        uint64_t d;
        if (!as_index(cJSON_GetArrayItem(shape, i), 9007199254740992.0, &d))
            return ch_fail(err, CH_STATUS_BAD_INPUT, "%s: tensor '%s': shape entry %d is not a size", path, name, i);
        t->shape[i] = (int64_t)d;
        if (__builtin_mul_overflow(bytes, d, &bytes))
            return ch_fail(err, CH_STATUS_BAD_INPUT, "%s: tensor '%s': shape too large (overflows)", path, name);
    }
    const cJSON *offs = cJSON_GetObjectItemCaseSensitive(item, "data_offsets");
    uint64_t b, e;
    if (!cJSON_IsArray(offs) || cJSON_GetArraySize(offs) != 2 || !as_index(cJSON_GetArrayItem(offs, 0), 9007199254740992.0, &b) ||
        !as_index(cJSON_GetArrayItem(offs, 1), 9007199254740992.0, &e) || b > e || e > dlen)
        return ch_fail(err, CH_STATUS_BAD_INPUT,
                       "%s: tensor '%s': data_offsets must be [begin, end] inside the %zu data bytes "
                       "(is the file truncated?)", path, name, dlen);
    if (e - b != bytes)
        return ch_fail(err, CH_STATUS_BAD_INPUT,
                       "%s: tensor '%s': %llu data bytes, but its dtype and shape need %llu", path, name,
                       (unsigned long long)(e - b), (unsigned long long)bytes);
    t->data = data + b;
    t->nbytes = (size_t)bytes;
    *begin = (size_t)b;
    return CH_STATUS_OK;
}

static ch_status parse_meta(const char *path, const cJSON *m, ch_st_file *f, ch_err *err)
{
    if (!cJSON_IsObject(m) || f->meta)
        return ch_fail(err, CH_STATUS_BAD_INPUT, "%s: __metadata__ is not one object", path);
    const int n = cJSON_GetArraySize(m);
    f->meta = calloc((size_t)n + 1, sizeof *f->meta);
    CH_CHECK_ALLOC(err, f->meta);
    for (const cJSON *kv = m->child; kv; kv = kv->next) {
        if (!cJSON_IsString(kv) || strlen(kv->string) > 255 || strlen(kv->valuestring) > 255)
            return ch_fail(err, CH_STATUS_BAD_INPUT,
                           "%s: __metadata__ entry '%.64s' is not a string of at most 255 bytes", path, kv->string);
        snprintf(f->meta[f->nmeta][0], 256, "%s", kv->string);
        snprintf(f->meta[f->nmeta][1], 256, "%s", kv->valuestring);
        f->nmeta++;
    }
    return CH_STATUS_OK;
}

typedef struct span { size_t begin, end; int index; } span;

static int by_begin(const void *a, const void *b)
{
    const span *x = a, *y = b;
    return x->begin < y->begin ? -1 : x->begin > y->begin ? 1 : (x->end > y->end) - (x->end < y->end);
}

static int by_name(const void *a, const void *b)
{
    return strcmp(((const ch_st_tensor *)a)->name, ((const ch_st_tensor *)b)->name);
}

/* The byte ranges tile [0, dlen) exactly; names are unique. */
static ch_status check_layout(const char *path, ch_st_file *f, span *spans, size_t dlen, ch_err *err)
{
    qsort(spans, (size_t)f->ntensors, sizeof *spans, by_begin);
    size_t at = 0;
    for (int i = 0; i < f->ntensors; i++) {
        const char *name = f->tensors[spans[i].index].name;
        if (spans[i].begin < at)
            return ch_fail(err, CH_STATUS_BAD_INPUT, "%s: tensor '%s' overlaps another tensor's data", path, name);
        if (spans[i].begin > at)
            return ch_fail(err, CH_STATUS_BAD_INPUT, "%s: %zu unused data bytes before tensor '%s'", path,
                           spans[i].begin - at, name);
        at = spans[i].end;
    }
    if (at != dlen)
        return ch_fail(err, CH_STATUS_BAD_INPUT, "%s: %zu data bytes after the last tensor", path, dlen - at);
    ch_st_tensor *sorted = malloc(sizeof *sorted * (size_t)(f->ntensors + 1));
    CH_CHECK_ALLOC(err, sorted);
    memcpy(sorted, f->tensors, sizeof *sorted * (size_t)f->ntensors);
    qsort(sorted, (size_t)f->ntensors, sizeof *sorted, by_name);
    ch_status st = CH_STATUS_OK;
    for (int i = 1; i < f->ntensors && st == CH_STATUS_OK; i++)
        if (strcmp(sorted[i - 1].name, sorted[i].name) == 0)
            st = ch_fail(err, CH_STATUS_BAD_INPUT, "%s: tensor '%s' appears twice", path, sorted[i].name);
    free(sorted);
    return st;
}

static ch_status parse_header(const char *path, ch_st_file *f, ch_err *err)
{
    if (f->len < 8)
        return ch_fail(err, CH_STATUS_BAD_INPUT, "%s: %zu bytes, too short for a safetensors file", path, f->len);
    uint64_t hlen = 0;
    for (int i = 0; i < 8; i++) hlen |= (uint64_t)f->image[i] << (8 * i);
    if (hlen > MAX_HEADER || hlen > f->len - 8)
        return ch_fail(err, CH_STATUS_BAD_INPUT,
                       "%s: header length %llu does not fit (file of %zu bytes, limit %d): not a "
                       "safetensors file, or truncated", path, (unsigned long long)hlen, f->len, MAX_HEADER);
    cJSON *root = cJSON_ParseWithLength((const char *)f->image + 8, (size_t)hlen);
    if (!cJSON_IsObject(root)) {
        cJSON_Delete(root);
        return ch_fail(err, CH_STATUS_BAD_INPUT, "%s: the header is not a JSON object", path);
    }
    const char *dup = ch_json_duplicate_key(root);
    if (dup) {
        ch_fail(err, CH_STATUS_BAD_INPUT, "%s: the header has the key '%.200s' twice", path, dup);
        cJSON_Delete(root);
        return CH_STATUS_BAD_INPUT;
    }
    const unsigned char *data = f->image + 8 + hlen;
    const size_t dlen = f->len - 8 - (size_t)hlen;
    const int n = cJSON_GetArraySize(root);
    f->tensors = calloc((size_t)n + 1, sizeof *f->tensors);
    span *spans = calloc((size_t)n + 1, sizeof *spans);
    ch_status st = f->tensors && spans ? CH_STATUS_OK : CH_SYS_FAIL(err, "allocation of the tensor list");
    for (const cJSON *it = root->child; it && st == CH_STATUS_OK; it = it->next) {
        if (strcmp(it->string, "__metadata__") == 0) {
            st = parse_meta(path, it, f, err);
            continue;
        }
        ch_st_tensor *t = &f->tensors[f->ntensors];
        size_t begin = 0;
        st = parse_tensor(path, it, data, dlen, t, &begin, err);
        spans[f->ntensors] = (span){ begin, begin + t->nbytes, f->ntensors };
        f->ntensors++;
    }
    if (st == CH_STATUS_OK) st = check_layout(path, f, spans, dlen, err);
    free(spans);
    cJSON_Delete(root);
    return st;
}

ch_status ch_st_parse(unsigned char *image, size_t len, const char *path, ch_st_file **out, ch_err *err)
{
    ch_st_file *f = calloc(1, sizeof *f);
    if (!f) {
        free(image);
        return CH_SYS_FAIL(err, "allocation of a safetensors file");
    }
    f->image = image;
    f->len = len;
    ch_status st = parse_header(path, f, err);
    if (st != CH_STATUS_OK) {
        ch_st_free(f);
        return st;
    }
    *out = f;
    return CH_STATUS_OK;
}

ch_status ch_st_read(const char *path, ch_st_file **out, ch_err *err)
{
    ch_st_file *f = calloc(1, sizeof *f);
    CH_CHECK_ALLOC(err, f);
    ch_status st = ch_file_read(path, SIZE_MAX, &f->image, &f->len, err);
    if (st == CH_STATUS_OK) st = parse_header(path, f, err);
    if (st != CH_STATUS_OK) {
        ch_st_free(f);
        return st;
    }
    *out = f;
    return CH_STATUS_OK;
}

const ch_st_tensor *ch_st_find(const ch_st_file *f, const char *name)
{
    for (int i = 0; i < f->ntensors; i++)
        if (strcmp(f->tensors[i].name, name) == 0) return &f->tensors[i];
    return NULL;
}

const char *ch_st_meta(const ch_st_file *f, const char *key)
{
    for (int i = 0; i < f->nmeta; i++)
        if (strcmp(f->meta[i][0], key) == 0) return f->meta[i][1];
    return NULL;
}

void ch_st_free(ch_st_file *f)
{
    if (!f) return;
    free(f->tensors);
    free(f->meta);
    free(f->image);
    free(f);
}
