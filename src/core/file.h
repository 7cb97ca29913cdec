/* Reading a whole file into memory, with a size limit, for the readers that parse a file at once
 * (safetensors, checkpoint metadata, encoded images). */
#ifndef CH_FILE_H
#define CH_FILE_H

#include "core/status.h"

#include <stddef.h>
#include <stdint.h>

/* The file at path (at most limit bytes) in a new buffer the caller frees, *len bytes long and
 * followed by a 0 byte, so text can be read as a string. A file over the limit is BAD_INPUT. */
ch_status ch_file_read(const char *path, size_t limit, uint8_t **data, size_t *len, ch_err *err);

#endif
