/* A crew: one long-lived thread per replica, each pinned to its own CPUs, that runs the jobs the
 * trainer hands out (set up, step, evaluate) and waits in between. Long-lived because each thread
 * keeps its OpenMP team and its first-touched memory from step to step. */
#ifndef CH_TRAIN_CREW_H
#define CH_TRAIN_CREW_H

#include "core/status.h"

typedef struct ch_crew ch_crew;

/* fn(arg, member) runs on member's thread. */
typedef void (*ch_crew_job)(void *arg, int member);

/* size threads; member m is pinned to cpus[m][0..ncpus[m]) (no pinning when ncpus[m] is 0). */
ch_status ch_crew_create(int size, const int *const *cpus, const int *ncpus, ch_crew **out,
                         ch_err *err);
/* Run job on every member at once and return when all have finished it. */
void ch_crew_run(ch_crew *c, ch_crew_job job, void *arg);
/* Stop and join the threads. NULL is a no-op. */
void ch_crew_free(ch_crew *c);

#endif
