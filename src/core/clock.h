/* Monotonic time for timings and progress. */
#ifndef CH_CLOCK_H
#define CH_CLOCK_H

/* Seconds on the monotonic clock (arbitrary origin). */
double ch_clock_s(void);
/* The pause between two polls of something another thread or process will finish (round counts
 * the polls so far): yield the CPU at first, then nap 20 us, then 200 us, so a waiting thread
 * answers within a nap and leaves the cores to the compute threads. */
void ch_poll_pause(int round);

#endif
