/* A checkpoint folder as a place to write: made if need be, checked writable, locked by one cohort
 * at a time (flock on DIR/.cohort-lock, which holds the writer's pid for the message another one
 * gets), and cleared of what a save killed half-way left behind. */
#include "train/checkpoint.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <sys/file.h>
#include <unistd.h>

#include "core/file.h"

#define MARK CH_CHECKPOINT_MARK

/* What a save that was killed half-way leaves behind (never a checkpoint anyone points at). The
 * caller holds the folder's lock, so no other cohort is saving here. */
static void remove_leftovers(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *e;
    char p[PATH_MAX];
    while ((e = readdir(d))) {
        const char *n = e->d_name;
        const bool tmp = strncmp(n, MARK "tmp-", 12) == 0 || strncmp(n, MARK "old-", 12) == 0;
        if (!tmp && strncmp(n, MARK "latest.", 15) != 0) continue;
        if (snprintf(p, sizeof p, "%s/%s", dir, n) >= (int)sizeof p) continue;
        if (tmp) ch_file_remove_flat_dir(p);
        else unlink(p);
    }
    closedir(d);
}

ch_status ch_checkpoint_prepare(const char *dir, ch_err *err)
{
    CH_TRY(ch_checkpoint_check_path(dir, err));
    CH_TRY(ch_file_make_dirs(dir, "--checkpoint-dir", err));
    CH_TRY(ch_file_check_dir(dir, "--checkpoint-dir", err));
    if (access(dir, W_OK) != 0)
        return ch_fail(err, CH_STATUS_BAD_INPUT, "--checkpoint-dir %s: not writable (%s)", dir, strerror(errno));
    return CH_STATUS_OK;
}

ch_status ch_checkpoint_lock(const char *dir, int *fd, ch_err *err)
{
    CH_TRY(ch_checkpoint_prepare(dir, err));
    char path[PATH_MAX];
    if (snprintf(path, sizeof path, "%s/" MARK "lock", dir) >= (int)sizeof path)
        return ch_fail(err, CH_STATUS_BAD_INPUT, "--checkpoint-dir %.80s...: path too long", dir);
    *fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0666);
    if (*fd < 0)
        return ch_fail(err, CH_STATUS_BAD_INPUT, "--checkpoint-dir %s: cannot open its lock file (%s)", dir,
                       strerror(errno));
    if (flock(*fd, LOCK_EX | LOCK_NB) != 0) {
        const int e = errno;
        char who[32] = "";
        const ssize_t n = pread(*fd, who, sizeof who - 1, 0);
        who[n > 0 ? n : 0] = 0;
        who[strcspn(who, "\n")] = 0;
        close(*fd);
        *fd = -1;
        if (e == EWOULDBLOCK)
            return ch_fail(err, CH_STATUS_BAD_INPUT, "--checkpoint-dir %s: another cohort (pid %s) is writing "
                           "checkpoints there", dir, who[0] ? who : "?");
        return ch_fail(err, CH_STATUS_SYSTEM, "--checkpoint-dir %s: cannot lock (%s)", dir, strerror(e));
    }
    char pid[32];
    const int len = snprintf(pid, sizeof pid, "%ld\n", (long)getpid());
    if (ftruncate(*fd, 0) != 0 || pwrite(*fd, pid, (size_t)len, 0) != len) { /* only informative */ }
    remove_leftovers(dir);
    return CH_STATUS_OK;
}

void ch_checkpoint_unlock(int fd)
{
    if (fd >= 0) close(fd);
}
