/* Progress inside an epoch, on stderr, by rank 0. Two forms:
 *  - bar: one line redrawn in place at most five times a second, for a terminal;
 *  - lines: a plain line every --progress-interval seconds at most, for batch logs (mpirun, srun and
 *    sbatch send stderr to files or pipes, where a redrawn bar is one ever-growing line of \r).
 * auto takes the bar on a terminal and lines elsewhere. */
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "cli/cli.h"
#include "core/clock.h"

bool ch_progress_parse(const char *s, ch_progress_mode *out)
{
    static const char *const names[] = { "auto", "bar", "lines", "none" };
    for (int i = 0; i < 4; i++)
        if (strcmp(s, names[i]) == 0) {
            *out = (ch_progress_mode)i;
            return true;
        }
    return false;
}

void ch_progress_init(ch_progress *p, ch_progress_mode mode, double interval_s, bool root)
{
    if (mode == CH_PROGRESS_AUTO) mode = isatty(STDERR_FILENO) ? CH_PROGRESS_BAR : CH_PROGRESS_LINES;
    *p = (ch_progress){ .mode = root ? mode : CH_PROGRESS_NONE, .interval_s = interval_s > 0 ? interval_s : 10 };
}

void ch_progress_epoch(ch_progress *p, int epoch)
{
    p->epoch = epoch;
    p->last_draw = ch_clock_s();   /* the first line comes one interval into the epoch */
}

static void draw_bar(const ch_progress *p, int step, int steps, double loss, double acc, double rate, double eta)
{
    enum { WIDTH = 24 };
    char bar[WIDTH + 1];
    const int fill = steps ? (int)((long)WIDTH * step / steps) : WIDTH;
    for (int i = 0; i < WIDTH; i++) bar[i] = i < fill ? '=' : (i == fill ? '>' : ' ');
    bar[WIDTH] = '\0';
    fprintf(stderr, "\r\033[Kepoch %d/%d [%s] %d/%d loss %.4f acc %.4f %.0f img/s ETA %.0fs",
            p->epoch, p->epochs, bar, step, steps, loss, acc, rate, eta);
}

void ch_progress_update(void *user, int step, int steps, double loss, double acc, size_t images,
                        double elapsed_s)
{
    ch_progress *p = user;
    if (p->mode == CH_PROGRESS_NONE) return;
    const double t = ch_clock_s();
    const double rate = elapsed_s > 0 ? images / elapsed_s : 0;
    const double eta = step ? elapsed_s * (steps - step) / step : 0;
    if (p->mode == CH_PROGRESS_BAR) {
        if (step < steps && t - p->last_draw < 0.2) return;
        p->last_draw = t;
        draw_bar(p, step, steps, loss, acc, rate, eta);
    } else {
        /* Never more often than the interval; the epoch's line says when it ends. */
        if (step >= steps || t - p->last_draw < p->interval_s) return;
        p->last_draw = t;
        fprintf(stderr, "progress: epoch %d/%d, step %d/%d (%.1f%%), loss %.4f, acc %.4f, %.0f img/s, "
                "elapsed %.1f s, ETA %.0f s\n", p->epoch, p->epochs, step, steps,
                steps ? 100.0 * step / steps : 100.0, loss, acc, rate, elapsed_s, eta);
    }
    fflush(stderr);
}

void ch_progress_clear(ch_progress *p)
{
    if (p->mode != CH_PROGRESS_BAR) return;
    fprintf(stderr, "\r\033[K");
    fflush(stderr);
}
