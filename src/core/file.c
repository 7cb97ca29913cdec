/* Whole-file reads, inputs that must be regular files, atomic outputs: see file.h. */
#include "core/file.h"

#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <fcntl.h>
#include <libgen.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static const char *kind_of(mode_t m)
{
    return S_ISREG(m) ? "a file" : S_ISDIR(m) ? "a directory" : S_ISFIFO(m) ? "a FIFO"
         : S_ISCHR(m) ? "a character device" : S_ISBLK(m) ? "a block device" : S_ISSOCK(m) ? "a socket"
         : "not a regular file";
}

ch_status ch_file_check_dir(const char *path, const char *flag, ch_err *err)
{
    const char *sp = flag ? " " : "";
    if (!flag) flag = "";
    struct stat st;
    if (stat(path, &st) != 0) {
        if (errno == ENOENT || errno == ENOTDIR)
            return ch_fail(err, CH_STATUS_BAD_INPUT, "%s%s%s: no such directory", flag, sp, path);
        return ch_fail(err, CH_STATUS_BAD_INPUT, "%s%s%s: cannot read (%s)", flag, sp, path, strerror(errno));
    }
    if (!S_ISDIR(st.st_mode))
        return ch_fail(err, CH_STATUS_BAD_INPUT, "%s%s%s: not a directory (%s)", flag, sp, path,
                       kind_of(st.st_mode));
    return CH_STATUS_OK;
}

int ch_file_open_input(const char *path, uint64_t *size, ch_err *err)
{
    const int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) {
        ch_fail(err, CH_STATUS_BAD_INPUT, "%s: cannot open (%s)", path, strerror(errno));
        return -1;
    }
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        ch_fail(err, CH_STATUS_BAD_INPUT, "%s: is %s, expected a file", path,
                fstat(fd, &st) == 0 ? kind_of(st.st_mode) : strerror(errno));
        close(fd);
        return -1;
    }
    /* Regular files never block; clear the flag so that reads are plain reads. */
    const int fl = fcntl(fd, F_GETFL);
    if (fl >= 0) fcntl(fd, F_SETFL, fl & ~O_NONBLOCK);
    if (size) *size = (uint64_t)st.st_size;
    return fd;
}

ch_status ch_file_read(const char *path, size_t limit, uint8_t **data, size_t *len, ch_err *err)
{
    uint64_t size = 0;
    const int fd = ch_file_open_input(path, &size, err);
    if (fd < 0) return CH_STATUS_BAD_INPUT;
    ch_status st = CH_STATUS_OK;
    uint8_t *buf = NULL;
    if (size > limit)
        st = ch_fail(err, CH_STATUS_BAD_INPUT, "%s: %llu bytes, more than the limit of %zu", path,
                     (unsigned long long)size, limit);
    else if (!(buf = malloc((size_t)size + 1)))
        st = ch_fail(err, CH_STATUS_SYSTEM, "%s: allocation of %llu bytes to read it failed", path,
                     (unsigned long long)size + 1);
    for (size_t got = 0; st == CH_STATUS_OK && got < size;) {
        const ssize_t n = read(fd, buf + got, (size_t)size - got);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0)
            st = ch_fail(err, CH_STATUS_BAD_INPUT, "%s: read failed (%s)", path, n < 0 ? strerror(errno) : "short read");
        else
            got += (size_t)n;
    }
    close(fd);
    if (st != CH_STATUS_OK) {
        free(buf);
        return st;
    }
    buf[size] = 0;
    *data = buf;
    *len = (size_t)size;
    return CH_STATUS_OK;
}

/* The folder path is in, for the temporary file and the rename. */
static void folder_of(const char *path, char *out, size_t len)
{
    char copy[4096];
    snprintf(copy, sizeof copy, "%s", path);
    snprintf(out, len, "%s", dirname(copy));
}

ch_status ch_out_check(const char *path, const char *flag, ch_err *err)
{
    if (!path[0] || strlen(path) >= sizeof(((ch_out *)0)->path))
        return ch_fail(err, CH_STATUS_BAD_INPUT, "%s '%.200s': not a usable path", flag, path);
    struct stat st;
    if (stat(path, &st) == 0) {
        if (S_ISCHR(st.st_mode)) {
            if (access(path, W_OK) != 0)
                return ch_fail(err, CH_STATUS_BAD_INPUT, "%s %s: cannot write (%s)", flag, path, strerror(errno));
            return CH_STATUS_OK;
        }
        if (!S_ISREG(st.st_mode))
            return ch_fail(err, CH_STATUS_BAD_INPUT, "%s %s: is %s; an output must be a file", flag, path,
                           kind_of(st.st_mode));
    } else if (errno != ENOENT) {
        return ch_fail(err, CH_STATUS_BAD_INPUT, "%s %s: %s", flag, path, strerror(errno));
    }
    char dir[4096];
    folder_of(path, dir, sizeof dir);
    if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode))
        return ch_fail(err, CH_STATUS_BAD_INPUT, "%s %s: the folder %s does not exist", flag, path, dir);
    if (access(dir, W_OK | X_OK) != 0)
        return ch_fail(err, CH_STATUS_BAD_INPUT, "%s %s: cannot write in %s (%s)", flag, path, dir, strerror(errno));
    return CH_STATUS_OK;
}

ch_status ch_out_open(ch_out *o, const char *path, const char *flag, ch_err *err)
{
    *o = (ch_out){ 0 };
    CH_TRY(ch_out_check(path, flag, err));
    snprintf(o->path, sizeof o->path, "%s", path);
    struct stat st;
    o->direct = stat(path, &st) == 0 && S_ISCHR(st.st_mode);
    if (o->direct) {
        if (!(o->f = fopen(path, "w")))
            return ch_fail(err, CH_STATUS_BAD_INPUT, "%s %s: cannot open (%s)", flag, path, strerror(errno));
        return CH_STATUS_OK;
    }
    snprintf(o->tmp, sizeof o->tmp, "%s.tmp-cohort-%ld", path, (long)getpid());
    const int fd = open(o->tmp, O_WRONLY | O_CREAT | O_TRUNC | O_EXCL | O_CLOEXEC, 0666);
    if (fd < 0 || !(o->f = fdopen(fd, "w"))) {
        if (fd >= 0) close(fd);
        return ch_fail(err, CH_STATUS_BAD_INPUT, "%s %s: cannot create %s (%s)", flag, path, o->tmp, strerror(errno));
    }
    return CH_STATUS_OK;
}

void ch_out_abandon(ch_out *o)
{
    if (o->f) fclose(o->f);
    o->f = NULL;
    if (!o->direct && o->tmp[0]) unlink(o->tmp);
}

ch_status ch_out_commit(ch_out *o, ch_err *err)
{
    bool ok = fflush(o->f) == 0 && !ferror(o->f);
    if (!o->direct) ok = ok && fsync(fileno(o->f)) == 0;
    const int e = errno;
    ok = fclose(o->f) == 0 && ok;
    o->f = NULL;
    if (!ok) {
        ch_out_abandon(o);
        return ch_fail(err, CH_STATUS_SYSTEM, "%s: write failed (%s)", o->path, strerror(e ? e : errno));
    }
    if (o->direct) return CH_STATUS_OK;
    /* The target may have changed since the check: replace only a regular file. */
    struct stat st;
    if (lstat(o->path, &st) == 0 && !S_ISREG(st.st_mode) && !S_ISLNK(st.st_mode)) {
        ch_out_abandon(o);
        return ch_fail(err, CH_STATUS_BAD_INPUT, "%s: is %s now; not replaced", o->path, kind_of(st.st_mode));
    }
    if (rename(o->tmp, o->path) != 0) {
        const int re = errno;
        ch_out_abandon(o);
        return ch_fail(err, CH_STATUS_SYSTEM, "%s: rename failed (%s)", o->path, strerror(re));
    }
    return CH_STATUS_OK;
}

ch_status ch_file_make_dirs(const char *dir, const char *flag, ch_err *err)
{
    char p[PATH_MAX];
    if (snprintf(p, sizeof p, "%s", dir) >= (int)sizeof p)
        return ch_fail(err, CH_STATUS_BAD_INPUT, "%s %.80s...: path too long", flag, dir);
    for (char *s = p + 1;; s++) {
        const bool end = *s == 0;
        if (*s == '/' || end) {
            *s = 0;
            if (mkdir(p, 0777) != 0 && errno != EEXIST)
                return ch_fail(err, CH_STATUS_BAD_INPUT, "%s %s: cannot create %s (%s)", flag, dir, p, strerror(errno));
            if (end) return CH_STATUS_OK;
            *s = '/';
        }
    }
}

ch_status ch_file_sync_path(const char *path, ch_err *err)
{
    const int fd = open(path, O_RDONLY);
    if (fd < 0) return ch_fail(err, CH_STATUS_SYSTEM, "%s: cannot open to sync (%s)", path, strerror(errno));
    const int rc = fsync(fd);
    close(fd);
    if (rc != 0) return ch_fail(err, CH_STATUS_SYSTEM, "%s: fsync failed (%s)", path, strerror(errno));
    return CH_STATUS_OK;
}

ch_status ch_file_write_text(const char *path, const char *text, ch_err *err)
{
    FILE *f = fopen(path, "w");
    if (!f) return ch_fail(err, CH_STATUS_SYSTEM, "%s: cannot create (%s)", path, strerror(errno));
    const size_t n = strlen(text);
    bool ok = fwrite(text, 1, n, f) == n && fflush(f) == 0 && fsync(fileno(f)) == 0;
    ok = fclose(f) == 0 && ok;
    return ok ? CH_STATUS_OK : ch_fail(err, CH_STATUS_SYSTEM, "%s: write failed (%s)", path, strerror(errno));
}

void ch_file_remove_flat_dir(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *e;
    char p[PATH_MAX];
    while ((e = readdir(d)))
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..") &&
            snprintf(p, sizeof p, "%s/%s", dir, e->d_name) < (int)sizeof p)
            unlink(p);
    closedir(d);
    rmdir(dir);
}
