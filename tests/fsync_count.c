/* An LD_PRELOAD shim for tests/fsync.sh: every fsync() is logged (the path of the descriptor) to
 * the file named by $COHORT_FSYNC_LOG, then done. A kill -9 cannot show a missing fsync (the page
 * cache survives it), so the test checks the writer asks for one on every file and folder. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int fsync(int fd)
{
    static int (*real)(int);
    if (!real) real = (int (*)(int))dlsym(RTLD_NEXT, "fsync");
    const char *log = getenv("COHORT_FSYNC_LOG");
    if (log) {
        char link[64], path[PATH_MAX];
        snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
        const ssize_t n = readlink(link, path, sizeof path - 1);
        if (n > 0) {
            path[n] = '\n';
            const int out = open(log, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
            if (out >= 0) {
                if (write(out, path, (size_t)n + 1) < 0) { /* the test will miss it and fail */ }
                close(out);
            }
        }
    }
    return real ? real(fd) : -1;
}
