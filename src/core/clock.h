/* Monotonic time for timings and progress. */
#ifndef CH_CLOCK_H
#define CH_CLOCK_H

/* Seconds on the monotonic clock (arbitrary origin). */
double ch_clock_s(void);

#endif
