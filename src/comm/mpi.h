/* The MPI back end of ch_comm: one group per MPI_Comm_dup of MPI_COMM_WORLD, one member per
 * process. Only usable once ch_world_init found an MPI launcher (ch_world_mpi()). Built when CMake
 * finds MPI; without it the functions below fail cleanly (no group can be made). */
#ifndef CH_COMM_MPI_H
#define CH_COMM_MPI_H

#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "comm/comm.h"

typedef struct ch_mpi_group ch_mpi_group;

/* How a group's float sums travel (--grad-compress). NONE: fp32, MPI_Iallreduce. BF16: each rank's
 * values go out rounded to bf16; the rank that owns a chunk sums everybody's in fp32 in rank order,
 * rounds the total to bf16 and sends it to every rank (a reduce-scatter and an allgather by pairwise
 * exchange): half the bytes of fp32, and the same bits on every rank. BF16_EF: the same, with error
 * feedback (what rounding took is added to the next sum of the same elements). */
typedef enum ch_grad_compress { CH_COMPRESS_NONE, CH_COMPRESS_BF16, CH_COMPRESS_BF16_EF } ch_grad_compress;

/* The flag's words: "none" (or NULL), "bf16", "bf16-ef". */
static inline const char *ch_grad_compress_name(ch_grad_compress how)
{
    return how == CH_COMPRESS_BF16 ? "bf16" : how == CH_COMPRESS_BF16_EF ? "bf16-ef" : "none";
}
static inline bool ch_grad_compress_parse(const char *s, ch_grad_compress *out)
{
    for (int k = CH_COMPRESS_NONE; k <= CH_COMPRESS_BF16_EF; k++)
        if (!s || strcmp(s, ch_grad_compress_name((ch_grad_compress)k)) == 0) {
            *out = (ch_grad_compress)k;
            return true;
        }
    return false;
}

/* Point to point, for the parameter servers (train/ps.c): bytes to or from one rank of a group.
 * A message's tag says what it is; messages between two ranks with one tag arrive in the order
 * they were sent. Started nonblocking and completed by ch_mpi_wait / ch_mpi_test_p2p, polled
 * under the world lock like every collective here. */
typedef struct ch_mpi_msg {
    int source, tag;
    size_t bytes;
} ch_mpi_msg;

/* "10 s (twice --timeout 5)": how a wait of timeout_s stands to the group's --timeout, for messages. */
void ch_mpi_timeout_words(const ch_mpi_group *g, double timeout_s, char *out, size_t len);

#ifdef CH_HAVE_MPI
/* Send or receive bytes (under 2 GiB) to or from rank peer of g with tag; req completes it. */
ch_status ch_mpi_isend(ch_mpi_group *g, const void *buf, size_t bytes, int peer, int tag, ch_request *req,
                       ch_err *err);
ch_status ch_mpi_irecv(ch_mpi_group *g, void *buf, size_t bytes, int peer, int tag, ch_request *req,
                       ch_err *err);
/* Has req completed? No timeout here: the caller decides how long it may wait. */
ch_status ch_mpi_test_p2p(ch_mpi_group *g, ch_request *req, bool *done, ch_err *err);
/* Poll req to the end; after timeout_s the job ends with what (ch_world_fatal). */
ch_status ch_mpi_wait(ch_mpi_group *g, ch_request *req, double timeout_s, const char *what, ch_err *err);
/* Is a message from any rank, with any tag, waiting? *found, and its envelope in *m. */
ch_status ch_mpi_probe(ch_mpi_group *g, bool *found, ch_mpi_msg *m, ch_err *err);
/* A new group over the ranks of g that give the same color (ranks ordered as in g). Collective
 * over g. */
ch_status ch_mpi_group_split(ch_mpi_group *g, int color, ch_mpi_group **out, ch_err *err);
/* A new group over the same ranks as parent (a fresh context: no message of one matches the
 * other's). Collective over parent. */
ch_status ch_mpi_group_dup(ch_mpi_group *parent, ch_mpi_group **out, ch_err *err);
/* A new communicator over all ranks. Collective: every rank calls it, in the same order.
 * timeout_s: how long any one collective may take before the job is ended (see mpi.c). */
ch_status ch_mpi_group_create(double timeout_s, ch_mpi_group **out, ch_err *err);
/* Fill this process's handle (rank and size are the MPI ones). */
void ch_mpi_comm_init(ch_comm *c, ch_mpi_group *g);
void ch_mpi_group_free(ch_mpi_group *g);
/* From now on, this group's allreduce_sum and iallreduce_sum (not the double sums, not broadcasts)
 * are compressed as how says. With error feedback, every call's buffer is the slice [c->at,
 * c->at + n) of one flat buffer of feedback_elems elements (gradient buckets: ch_comm.at is the
 * bucket's offset). Before the group's first collective, on every rank alike. */
ch_status ch_mpi_group_set_compress(ch_mpi_group *g, ch_grad_compress how, size_t feedback_elems, ch_err *err);
/* all (count x ranks) <- every rank's mine (count), in rank order, over MPI_COMM_WORLD. Polled like
 * every collective here: after timeout_s the job ends, naming what. */
ch_status ch_mpi_world_allgather_u64(const uint64_t *mine, int count, uint64_t *all, double timeout_s,
                                     const char *what, ch_err *err);
/* Rank 0 of c (an MPI group's handle) receives every rank's bytes: *all (malloc'ed, owned by the
 * caller; NULL elsewhere) holds them in rank order and lens[r] (c->size entries, rank 0 only) their
 * lengths. Each part must stay under 2 GiB (MPI's int counts), and so must their sum. Collective. */
ch_status ch_mpi_gather_bytes(ch_comm *c, const char *mine, size_t len, char **all, size_t *lens, ch_err *err);
#else
static inline ch_status ch_mpi_nompi(ch_err *err)
{
    return ch_fail(err, CH_STATUS_SYSTEM, "cohort was built without MPI");
}
static inline ch_status ch_mpi_isend(ch_mpi_group *g, const void *buf, size_t bytes, int peer, int tag,
                                     ch_request *req, ch_err *err)
{
    (void)g, (void)buf, (void)bytes, (void)peer, (void)tag, (void)req;
    return ch_mpi_nompi(err);
}
static inline ch_status ch_mpi_irecv(ch_mpi_group *g, void *buf, size_t bytes, int peer, int tag, ch_request *req,
                                     ch_err *err)
{
    (void)g, (void)buf, (void)bytes, (void)peer, (void)tag, (void)req;
    return ch_mpi_nompi(err);
}
static inline ch_status ch_mpi_test_p2p(ch_mpi_group *g, ch_request *req, bool *done, ch_err *err)
{
    (void)g, (void)req, (void)done;
    return ch_mpi_nompi(err);
}
static inline ch_status ch_mpi_wait(ch_mpi_group *g, ch_request *req, double timeout_s, const char *what,
                                    ch_err *err)
{
    (void)g, (void)req, (void)timeout_s, (void)what;
    return ch_mpi_nompi(err);
}
static inline ch_status ch_mpi_probe(ch_mpi_group *g, bool *found, ch_mpi_msg *m, ch_err *err)
{
    (void)g, (void)found, (void)m;
    return ch_mpi_nompi(err);
}
static inline ch_status ch_mpi_group_split(ch_mpi_group *g, int color, ch_mpi_group **out, ch_err *err)
{
    (void)g, (void)color, (void)out;
    return ch_mpi_nompi(err);
}
static inline ch_status ch_mpi_group_dup(ch_mpi_group *parent, ch_mpi_group **out, ch_err *err)
{
    (void)parent, (void)out;
    return ch_mpi_nompi(err);
}
static inline ch_status ch_mpi_gather_bytes(ch_comm *c, const char *mine, size_t len, char **all, size_t *lens,
                                            ch_err *err)
{
    (void)c, (void)mine, (void)len, (void)all, (void)lens;
    return ch_fail(err, CH_STATUS_SYSTEM, "cohort was built without MPI");
}
static inline ch_status ch_mpi_group_create(double timeout_s, ch_mpi_group **out, ch_err *err)
{
    (void)timeout_s;
    *out = NULL;
    return ch_fail(err, CH_STATUS_SYSTEM, "cohort was built without MPI");
}
static inline void ch_mpi_comm_init(ch_comm *c, ch_mpi_group *g) { (void)c; (void)g; }
static inline void ch_mpi_group_free(ch_mpi_group *g) { (void)g; }
static inline ch_status ch_mpi_group_set_compress(ch_mpi_group *g, ch_grad_compress how, size_t feedback_elems,
                                                  ch_err *err)
{
    (void)g; (void)how; (void)feedback_elems;
    return ch_fail(err, CH_STATUS_SYSTEM, "cohort was built without MPI");
}
static inline ch_status ch_mpi_world_allgather_u64(const uint64_t *mine, int count, uint64_t *all,
                                                   double timeout_s, const char *what, ch_err *err)
{
    (void)mine; (void)count; (void)all; (void)timeout_s; (void)what;
    return ch_fail(err, CH_STATUS_SYSTEM, "cohort was built without MPI");
}
#endif

#endif
