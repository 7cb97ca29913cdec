/* What workers and parameter servers say to each other (ps.c, ps_server.c), and the state they
 * keep. Not part of the interface (train/ps.h).
 *
 * Messages (tag: bytes), each between two ranks arriving in the order sent:
 *   SET_HDR, SET_DATA -> ACK   rank 0 -> server: ch_ps_state_hdr, then the shard's parameters
 *                       followed by nstate buffers of optimizer state (the start, and every
 *                       checkpoint loaded); the answer, int64 0, once the server holds them
 *   PUSH_HDR, PUSH_DATA worker -> server: ch_ps_push_hdr, then its n gradient values
 *   PARAMS              server -> worker: the shard's parameters (a pull's answer)
 *   CLAIM -> UNIT       worker -> first server: int64 epoch; the answer: int64 unit, -1 when done
 *   FLUSH               worker -> server: int64 0, the worker's epoch is over (async)
 *   GET -> STATE_HDR, STATE_DATA   rank 0 -> server: int64 0; the answer: ch_ps_state_hdr, then
 *                       nstate buffers of optimizer state
 *   STOP                worker -> server: int64 0, the worker is done
 *   ABANDON             rank 0 -> server: int64 ch_status; the workers end the job together on an
 *                       error each of them holds (a checkpoint rank 0 refused, a bad setting), so
 *                       no start, push or stop will come: the server ends quietly with that status */
#ifndef CH_TRAIN_PS_WIRE_H
#define CH_TRAIN_PS_WIRE_H

#include "train/ps.h"

enum {
    CH_PS_TAG_SET_HDR = 1, CH_PS_TAG_SET_DATA, CH_PS_TAG_PUSH_HDR, CH_PS_TAG_PUSH_DATA, CH_PS_TAG_PARAMS,
    CH_PS_TAG_CLAIM, CH_PS_TAG_UNIT, CH_PS_TAG_FLUSH, CH_PS_TAG_GET, CH_PS_TAG_STATE_HDR, CH_PS_TAG_STATE_DATA,
    CH_PS_TAG_STOP, CH_PS_TAG_ACK, CH_PS_TAG_ABANDON,
};

typedef struct ch_ps_push_hdr {
    uint64_t lo, n;     /* the values' place in the flat gradient buffer */
    uint64_t step;      /* the worker's global step (0-based) */
    double lr;          /* the schedule's learning rate for it */
} ch_ps_push_hdr;

typedef struct ch_ps_state_hdr {
    uint64_t nparams;
    int64_t steps;      /* the optimizer's update count */
    int32_t nstate;     /* optimizer state buffers that follow */
    int32_t pad;
} ch_ps_state_hdr;

/* One bucket's push in flight: a header and a data message to each server it touches. */
typedef struct ch_ps_record {
    ch_ps_push_hdr hdr[CH_PS_MAX_SERVERS];
    ch_request req[2 * CH_PS_MAX_SERVERS];
    int dest[2 * CH_PS_MAX_SERVERS];    /* the server rank of each request */
    int nreq;
} ch_ps_record;

struct ch_ps {
    ch_ps_config cfg;
    int rank, size, workers;
    ch_mpi_group *g;        /* every rank: the pushes, pulls and requests */
    /* worker side */
    size_t nparams;
    uint64_t step;          /* what the next pushes carry */
    double lr;
    ch_ps_record *records;  /* this step's pushes, nrecords at most */
    int nrecords, next_record;
};

#endif
