/* A one-line progress bar on stderr, redrawn in place at most five times a second, shown only when
 * stderr is a terminal (logs and pipes get the epoch lines alone). */
#include <stdio.h>
#include <unistd.h>

#include "cli/cli.h"
#include "core/clock.h"

void ch_progress_init(ch_progress *p, bool allow)
{
    *p = (ch_progress){ .enabled = allow && isatty(STDERR_FILENO) };
}

void ch_progress_update(void *user, int step, int steps, double loss, double acc, size_t images,
                        double elapsed_s)
{
    ch_progress *p = user;
    if (!p->enabled) return;
    const double t = ch_clock_s();
    if (step < steps && t - p->last_draw < 0.2) return;
    p->last_draw = t;
    enum { WIDTH = 24 };
    char bar[WIDTH + 1];
    const int fill = steps ? (int)((long)WIDTH * step / steps) : WIDTH;
    for (int i = 0; i < WIDTH; i++) bar[i] = i < fill ? '=' : (i == fill ? '>' : ' ');
    bar[WIDTH] = '\0';
    const double rate = elapsed_s > 0 ? images / elapsed_s : 0;
    const double eta = step ? elapsed_s * (steps - step) / step : 0;
    fprintf(stderr, "\r\033[Kepoch %d/%d [%s] %d/%d loss %.4f acc %.4f %.0f img/s ETA %.0fs",
            p->epoch, p->epochs, bar, step, steps, loss, acc, rate, eta);
    fflush(stderr);
}

void ch_progress_clear(ch_progress *p)
{
    if (!p->enabled) return;
    fprintf(stderr, "\r\033[K");
    fflush(stderr);
}
