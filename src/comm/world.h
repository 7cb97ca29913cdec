/* The process's place in the job (the public face, ch_world_*, is in cohort.h): rank, size, the
 * ranks on this host, the host name, and the one lock every MPI call is made under.
 * cohort asks MPI for MPI_THREAD_SERIALIZED and serialises its calls itself: the calls come from a
 * few threads (a replica's compute thread, its gradient sync thread, the main thread), every wait
 * is a poll with MPI_Test, so the lock is only ever held for one short call. */
#ifndef CH_COMM_WORLD_H
#define CH_COMM_WORLD_H

#include <stdbool.h>
#include <stdio.h>

#include "core/status.h"

/* True when MPI was initialised (started by mpirun or another MPI launcher). */
bool ch_world_mpi(void);
void ch_world_lock(void);
void ch_world_unlock(void);
/* Print "cohort: rank R of N (HOST): MSG" to stderr and to the worker log, then end the whole
 * job with code. For failures after which the ranks can no longer agree (a timed-out collective). */
/* Where ch_world_fatal and ch_world_log also write (the worker log of --log-dir); NULL: nowhere. */
void ch_world_set_log(FILE *log);
void ch_world_log(const char *line);
_Noreturn void ch_world_fatal(int code, const char *msg);
/* The same with another speaker than "cohort" ("cohort train"). */
_Noreturn void ch_world_fatal_as(const char *who, int code, const char *msg);

/* Collective over every rank (alone, or without MPI: returns st): each rank's verdict st on
 * something every rank checks alike (settings the ranks agreed on). Every rank failed: st with
 * err->on_every_rank, rank 0 saying it. Some failed: each keeps its own status, the others take
 * the first failing rank's, and every rank's err holds that rank's message with its rank and host,
 * err->on_every_rank and rank 0 the speaker, so the job ends cleanly (no MPI_Abort to race the
 * failing rank's line). Only the exchange failing leaves err a single rank's. */
ch_status ch_world_fail_together(const char *what, ch_status st, double timeout_s, ch_err *err);

#endif
