/* Whole-file reads: see file.h. */
#include "core/file.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

ch_status ch_file_read(const char *path, size_t limit, uint8_t **data, size_t *len, ch_err *err)
{
    FILE *f = fopen(path, "rb");
    if (!f) return ch_fail(err, CH_STATUS_BAD_INPUT, "%s: cannot open (%s)", path, strerror(errno));
    ch_status st = CH_STATUS_OK;
    long size = -1;
    if (fseek(f, 0, SEEK_END) == 0) size = ftell(f);
    if (size < 0 || fseek(f, 0, SEEK_SET) != 0)
        st = ch_fail(err, CH_STATUS_BAD_INPUT, "%s: cannot read its size (%s)", path, strerror(errno));
    else if ((size_t)size > limit)
        st = ch_fail(err, CH_STATUS_BAD_INPUT, "%s: %ld bytes, more than the limit of %zu", path, size, limit);
    uint8_t *buf = NULL;
    if (st == CH_STATUS_OK && !(buf = malloc((size_t)size + 1))) st = CH_SYS_FAIL(err, "allocation of a file buffer");
    if (st == CH_STATUS_OK && fread(buf, 1, (size_t)size, f) != (size_t)size)
        st = ch_fail(err, CH_STATUS_BAD_INPUT, "%s: read failed (%s)", path, ferror(f) ? strerror(errno) : "short read");
    fclose(f);
    if (st != CH_STATUS_OK) {
        free(buf);
        return st;
    }
    buf[size] = 0;
    *data = buf;
    *len = (size_t)size;
    return CH_STATUS_OK;
}
