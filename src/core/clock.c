/* Monotonic clock. */
#include "core/clock.h"

#include <time.h>

double ch_clock_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}
