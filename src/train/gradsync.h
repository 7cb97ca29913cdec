/* Bucketed gradient sync for one replica, overlapped with backward.
 * The flat gradient buffer is cut into buckets of whole tensors, from the last parameters to the
 * first (backward writes them in that order), each about bucket_elems long. Backward reports each
 * finished tensor (ch_gradsync_ready, the ch_run grads_ready hook); when a bucket's tensors are all
 * in, it goes to this replica's sync thread, which starts its sum over the group at once while
 * backward goes on: nonblocking (MPI_Iallreduce) where the communicator can, several buckets in
 * flight, completed oldest first; otherwise (the local communicator) one at a time. Every member
 * sees the same readiness order (same model, same code), so the members' collectives match up.
 *
 * On a backend with streams the order is kept by events, as on a GPU: a bucket's last gradient
 * records `ready` on the compute stream; its download to the host mirror (staged) waits on that
 * event on the transfer stream, or the host waits for it (in place); its upload back records
 * `summed` on the transfer stream, and ch_gradsync_finish makes the compute stream, where the
 * optimizer runs next, wait on every bucket's `summed`. */
#ifndef CH_TRAIN_GRADSYNC_H
#define CH_TRAIN_GRADSYNC_H

#include "comm/comm.h"
#include "core/trace.h"
#include "nn/model.h"

typedef struct ch_gradsync ch_gradsync;

/* The staging policy, one rule for every collective over replica memory: c works on it in place
 * when it is host memory (the CPU backend) or memory c reads itself (its ops' device_memory names
 * the backend); otherwise the caller stages it through a host mirror: download, the collective,
 * upload. */
bool ch_comm_stages(const ch_comm *c, const ch_backend *be);

/* comm and m->grads are borrowed. Starts the sync thread. */
ch_status ch_gradsync_create(ch_comm *comm, ch_model *m, size_t bucket_elems, ch_gradsync **out,
                             ch_err *err);
/* A new step (0-based, for the timeout message): every bucket is waiting for its tensors. */
void ch_gradsync_begin(ch_gradsync *s, uint64_t step);
/* ch_grads_ready_fn: grads[offset, offset + count) are final. user is the ch_gradsync. */
void ch_gradsync_ready(void *user, size_t offset, size_t count);
/* Hand over any bucket not yet complete (a layer that reported nothing), then wait until every
 * bucket is summed. Fails when the group was aborted. */
ch_status ch_gradsync_finish(ch_gradsync *s, ch_err *err);
int ch_gradsync_buckets(const ch_gradsync *s);
/* Record each bucket's sum as a span on track (the sync thread's own) from the next
 * ch_gradsync_begin on; NULL stops recording. */
void ch_gradsync_set_trace(ch_gradsync *s, ch_trace_track *track);
/* Stop and join the sync thread. NULL is a no-op. */
void ch_gradsync_free(ch_gradsync *s);

#endif
