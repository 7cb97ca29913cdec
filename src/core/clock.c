/* Monotonic clock. */
#include "core/clock.h"

#include <sched.h>
#include <time.h>

double ch_clock_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

void ch_poll_pause(int round)
{
    if (round < 200) {
        sched_yield();
        return;
    }
    const struct timespec ts = { 0, round < 2000 ? 20000 : 200000 };
    nanosleep(&ts, NULL);
}
