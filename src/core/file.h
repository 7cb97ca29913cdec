/* Files the user names: reading a whole input with a size limit (safetensors, checkpoint
 * metadata, encoded images), opening an input that must be a regular file, and writing an output
 * atomically without ever replacing what is not a regular file. */
#ifndef CH_FILE_H
#define CH_FILE_H

#include "core/status.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

/* The file at path (at most limit bytes) in a new buffer the caller frees, *len bytes long and
 * followed by a 0 byte, so text can be read as a string. A file over the limit, or anything but
 * a regular file (a directory, a FIFO, a device), is BAD_INPUT. */
ch_status ch_file_read(const char *path, size_t limit, uint8_t **data, size_t *len, ch_err *err);

/* A read-only descriptor of path, which must be a regular file: it is opened without blocking
 * (a FIFO with no writer would wait forever) and checked with fstat. -1 with err set otherwise.
 * *size (may be NULL) receives its size. The caller closes it. */
int ch_file_open_input(const char *path, uint64_t *size, ch_err *err);

/* path must be a directory that exists: BAD_INPUT "no such directory" where nothing is there, "not
 * a directory (a file)" where something else is, or stat's reason otherwise (a loop of links).
 * flag (like "--checkpoint-dir") leads the message, or NULL for the path alone (library calls). */
ch_status ch_file_check_dir(const char *path, const char *flag, ch_err *err);

/* An output file written as a whole: a new or regular file is written to a temporary file beside
 * it and renamed over it when committed (readers see the old or the new file, never half of
 * one); a character device (/dev/null, a terminal) is written straight; anything else (a
 * directory, a FIFO, a socket) is refused, so that nothing of the user's is replaced. */
typedef struct ch_out {
    FILE *f;
    bool direct;            /* writing straight to a device */
    char path[4096], tmp[4200];
} ch_out;

/* Can path be written as an output? Call before long work, so a bad path fails at once (flag
 * names it in the message, like "--plot"). BAD_INPUT with the reason otherwise. */
ch_status ch_out_check(const char *path, const char *flag, ch_err *err);
ch_status ch_out_open(ch_out *o, const char *path, const char *flag, ch_err *err);
/* Flush, sync and close, then rename into place (BAD_INPUT/SYSTEM on failure; the temporary is
 * removed). The ch_out is closed either way. */
ch_status ch_out_commit(ch_out *o, ch_err *err);
/* Close and remove the temporary: nothing at path changes. */
void ch_out_abandon(ch_out *o);

/* The little file layer of folders cohort writes (checkpoints): mkdir -p of dir (flag names it in
 * the message, BAD_INPUT when a part cannot be made); fsync of a file or folder by path; a small
 * text file written, flushed and synced (not atomically: the caller writes it into a folder it
 * renames into place); and a folder of plain files removed with them (nothing deeper). */
ch_status ch_file_make_dirs(const char *dir, const char *flag, ch_err *err);
ch_status ch_file_sync_path(const char *path, ch_err *err);
ch_status ch_file_write_text(const char *path, const char *text, ch_err *err);
void ch_file_remove_flat_dir(const char *dir);

#endif
