/* Compressed sums between ranks (--grad-compress bf16): a reduce-scatter and an allgather by
 * pairwise exchange, with bf16 on the wire and fp32 arithmetic.
 *
 * The buffer is cut into one chunk per rank. Every rank rounds its values to bf16 and sends each
 * other rank that rank's chunk (P - 1 messages, all posted at once); the owner of a chunk adds the
 * P contributions in fp32 in rank order, its own rounded like the others, rounds the total to bf16
 * and sends it to every rank, which decodes all chunks. So the result is
 *     bf16(sum over r = 0..P-1 of bf16(x_r))   (fp32 additions, in rank order)
 * on every rank, bit for bit, whatever the chunking, the timing or the owner, and each rank sends
 * 2 (P - 1) / P x n bf16 values: half of what a fp32 ring allreduce sends. Pairwise exchange rather
 * than a ring because a ring's partial sums would be rounded to bf16 at every hop (P - 1 roundings
 * of a growing value) where here each value is rounded once on the way in and once on the way out.
 * Open MPI 4.1 has no bf16 type, and a user-defined MPI_Op runs outside our control of order and
 * threads, so the exchange is point to point (MPI_Isend/MPI_Irecv on the group's communicator).
 *
 * Error feedback: what rounding a rank's contribution took (x - bf16(x)) is kept per element and
 * added to that element's next contribution; the owner does the same for the rounded totals. The
 * rounding error then does not accumulate over steps (Seide et al. 2014; Karimireddy et al. 2019). */
#include <stdlib.h>
#include <string.h>

#include "comm/mpi_group.h"
#include "comm/world.h"
#include "core/bf16.h"

struct ch_bf16_sum {
    ch_real *buf;
    size_t n, at;
    int tag;
    int phase;            /* 1: contributions in flight; 2: totals in flight */
    uint16_t *wire;       /* n: this rank's contribution, then every chunk's total */
    uint16_t *theirs;     /* (P - 1) x this rank's chunk: the other ranks' contributions to it */
    MPI_Request *reqs;    /* 2 (P - 1): receives, then sends */
};

static size_t chunk_lo(size_t n, int P, int k) { return n * (size_t)k / (size_t)P; }
static size_t chunk_len(size_t n, int P, int k) { return chunk_lo(n, P, k + 1) - chunk_lo(n, P, k); }

static void sum_free(ch_bf16_sum *x)
{
    if (!x) return;
    free(x->wire);
    free(x->theirs);
    free(x->reqs);
    free(x);
}

/* x (+ what rounding took last time) to bf16; keep what rounding takes now. */
static void encode(const ch_real *x, size_t n, size_t at, uint16_t *out, float *fb)
{
    if (!fb) {
        for (size_t i = 0; i < n; i++) out[i] = ch_bf16_from_float((float)x[i]);
        return;
    }
    for (size_t i = 0; i < n; i++) {
        const float v = (float)x[i] + fb[at + i];
        out[i] = ch_bf16_from_float(v);
        fb[at + i] = v - ch_bf16_to_float(out[i]);
    }
}

/* The P - 1 receives into recv[i - 1] from rank me - i and the P - 1 sends of send[me + i], i = 1..P-1.
 * recv_len and send_at/send_len give each peer's part. Called with the world lock held. */
static int post(ch_comm *c, ch_bf16_sum *x, uint16_t *recv_base, bool recv_per_peer, size_t recv_len,
                int tag)
{
    struct ch_mpi_group *g = c->group;
    const int P = c->size, me = c->rank;
    for (int i = 1; i < P; i++) {
        const int from = (me - i + P) % P, to = (me + i) % P;
        /* Phase 1: peers' contributions to my chunk, side by side; phase 2: each peer's total
         * lands at its chunk. Phase 1 sends peer `to` its chunk of mine; phase 2 sends my total. */
        uint16_t *rbuf = recv_per_peer ? recv_base + (size_t)(i - 1) * recv_len : x->wire + chunk_lo(x->n, P, from);
        const size_t rlen = recv_per_peer ? recv_len : chunk_len(x->n, P, from);
        const uint16_t *sbuf = recv_per_peer ? x->wire + chunk_lo(x->n, P, to) : x->wire + chunk_lo(x->n, P, me);
        const size_t slen = recv_per_peer ? chunk_len(x->n, P, to) : chunk_len(x->n, P, me);
        int rc = MPI_Irecv(rbuf, (int)rlen, MPI_UINT16_T, from, tag, g->comm, &x->reqs[i - 1]);
        if (rc == MPI_SUCCESS)
            rc = MPI_Isend(sbuf, (int)slen, MPI_UINT16_T, to, tag, g->comm, &x->reqs[P - 1 + i - 1]);
        if (rc != MPI_SUCCESS) return rc;
    }
    return MPI_SUCCESS;
}

ch_status ch_bf16_sum_start(ch_comm *c, ch_real *buf, size_t n, ch_bf16_sum **out, ch_err *err)
{
    struct ch_mpi_group *g = c->group;
    const int P = c->size, me = c->rank;
    const bool fb = g->compress == CH_COMPRESS_BF16_EF;
    if (fb && (c->at > g->fb_n || n > g->fb_n - c->at))
        return ch_fail(err, CH_STATUS_BAD_INPUT, "compressed sum of elements [%zu, %zu): the error feedback "
                       "covers %zu", c->at, c->at + n, g->fb_n);
    const size_t mine = chunk_len(n, P, me);
    ch_bf16_sum *x = calloc(1, sizeof *x);
    if (x) {
        x->wire = malloc(sizeof(uint16_t) * (n ? n : 1));
        x->theirs = malloc(sizeof(uint16_t) * ((size_t)(P - 1) * mine + 1));
        x->reqs = malloc(sizeof(MPI_Request) * 2 * (size_t)(P > 1 ? P - 1 : 1));
    }
    if (!x || !x->wire || !x->theirs || !x->reqs) {
        sum_free(x);
        return ch_fail(err, CH_STATUS_SYSTEM, "out of memory for a compressed sum of %zu values", n);
    }
    x->buf = buf;
    x->n = n;
    x->at = c->at;
    x->phase = 1;
    encode(buf, n, c->at, x->wire, fb ? g->fb_sent : NULL);
    ch_world_lock();
    x->tag = g->tag;
    g->tag = (g->tag + 2) % 32766;   /* MPI_TAG_UB is at least 32767 */
    const int rc = post(c, x, x->theirs, true, mine, x->tag);
    ch_world_unlock();
    /* On failure the posted requests keep the buffers: x is left behind, as the job is ending. */
    if (rc != MPI_SUCCESS) return ch_mpi_fail(err, "MPI_Isend/MPI_Irecv (compressed sum)", rc);
    *out = x;
    return CH_STATUS_OK;
}

/* Phase 1 is in: this rank's chunk is the rank-order fp32 sum of every rank's bf16 values, rounded
 * to bf16 (with the owner's feedback), into wire. The sum runs in buf's own chunk, whose fp32
 * values were encoded already and are overwritten by the result anyway: rank by rank over the
 * whole chunk, so each pass is a plain vector loop. */
static void total_my_chunk(ch_comm *c, ch_bf16_sum *x)
{
    struct ch_mpi_group *g = c->group;
    const int P = c->size, me = c->rank;
    const size_t lo = chunk_lo(x->n, P, me), len = chunk_len(x->n, P, me);
    ch_real *acc = x->buf + lo;
    for (int r = 0; r < P; r++) {
        /* Rank r's contribution: mine in wire, the others' in their slots (rank me - i in slot i - 1). */
        const uint16_t *h = r == me ? x->wire + lo : x->theirs + (size_t)((me - r + P) % P - 1) * len;
        if (r == 0)
            for (size_t i = 0; i < len; i++) acc[i] = (ch_real)ch_bf16_to_float(h[i]);
        else
            for (size_t i = 0; i < len; i++) acc[i] = (ch_real)((float)acc[i] + ch_bf16_to_float(h[i]));
    }
    uint16_t *out = x->wire + lo;
    if (g->compress != CH_COMPRESS_BF16_EF) {
        for (size_t i = 0; i < len; i++) out[i] = ch_bf16_from_float((float)acc[i]);
        return;
    }
    float *fb = g->fb_summed + x->at + lo;
    for (size_t i = 0; i < len; i++) {
        const float v = (float)acc[i] + fb[i];
        out[i] = ch_bf16_from_float(v);
        fb[i] = v - ch_bf16_to_float(out[i]);
    }
}

ch_status ch_bf16_sum_test(ch_comm *c, ch_bf16_sum *x, const char *what, double t0, bool check_clock,
                           bool *done, ch_err *err)
{
    struct ch_mpi_group *g = c->group;
    const int nreq = 2 * (c->size - 1);
    int flag = 0;
    ch_world_lock();
    int rc = MPI_Testall(nreq, x->reqs, &flag, MPI_STATUSES_IGNORE);
    ch_world_unlock();
    *done = false;
    if (rc != MPI_SUCCESS) return ch_mpi_fail(err, "MPI_Testall (compressed sum)", rc);
    if (!flag) return ch_mpi_still_waiting(g, what, "compressed sum", t0, check_clock, err);
    if (x->phase == 1) {
        total_my_chunk(c, x);
        x->phase = 2;
        ch_world_lock();
        rc = post(c, x, NULL, false, 0, x->tag + 1);
        ch_world_unlock();
        if (rc != MPI_SUCCESS) return ch_mpi_fail(err, "MPI_Isend/MPI_Irecv (compressed sum)", rc);
        return CH_STATUS_OK;
    }
    for (size_t i = 0; i < x->n; i++) x->buf[i] = (ch_real)ch_bf16_to_float(x->wire[i]);
    sum_free(x);
    *done = true;
    return CH_STATUS_OK;
}
