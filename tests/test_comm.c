/* The local communicator: sums equal the serial sum in member order, every member holds the same
 * bits, broadcast copies the root, and an aborting member releases the others (no hang). */
#include "test_util.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "comm/comm.h"
#include "graph/graph.h"
#include "kernels/backend.h"
#include "models/zoo.h"
#include "nn/model.h"
#include "train/gradsync.h"

typedef struct member {
    ch_comm comm;
    ch_real *buf;
    size_t n;
    int abort_at;           /* collective index at which this member aborts instead; -1: never */
    ch_status st[3];
    char msg[3][512];
} member;

static ch_real value(int rank, size_t i) { return (ch_real)((double)(rank + 1) * 0.1 + (double)(i % 97) * 1e-3); }

static void *run_member(void *arg)
{
    member *m = arg;
    for (size_t i = 0; i < m->n; i++) m->buf[i] = value(m->comm.rank, i);
    ch_err err = { .msg = "" };
    if (m->abort_at == 0) {
        m->comm.ops->abort(&m->comm, "injected failure");
        return NULL;
    }
    m->st[0] = ch_comm_allreduce_sum(&m->comm, m->buf, m->n, &err);
    memcpy(m->msg[0], err.msg, sizeof err.msg);
    if (m->st[0] != CH_STATUS_OK) return NULL;
    if (m->abort_at == 1) {
        m->comm.ops->abort(&m->comm, "injected failure");
        return NULL;
    }
    m->st[1] = ch_comm_barrier(&m->comm, &err);
    memcpy(m->msg[1], err.msg, sizeof err.msg);
    return NULL;
}

static void run_group(int size, size_t n, int aborter, int abort_at, member *ms)
{
    ch_local_group *g;
    ch_err err;
    assert_int_equal(ch_local_group_create(size, &g, &err), CH_STATUS_OK);
    pthread_t th[8];
    for (int r = 0; r < size; r++) {
        memset(&ms[r], 0, sizeof ms[r]);
        ch_local_comm_init(&ms[r].comm, g, r);
        ms[r].n = n;
        ms[r].buf = malloc(sizeof(ch_real) * (n ? n : 1));
        assert_non_null(ms[r].buf);
        ms[r].abort_at = r == aborter ? abort_at : -1;
        assert_int_equal(pthread_create(&th[r], NULL, run_member, &ms[r]), 0);
    }
    for (int r = 0; r < size; r++) assert_int_equal(pthread_join(th[r], NULL), 0);
    ch_local_group_free(g);
}

static void allreduce_equals_the_serial_sum_on_every_member(void **state)
{
    (void)state;
    const size_t sizes[] = { 0, 1, 7, 1000, 100003 };
    member ms[8];
    for (int d = 1; d <= 4; d++)
        for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
            const size_t n = sizes[k];
            run_group(d, n, -1, -1, ms);
            for (int r = 0; r < d; r++) {
                assert_int_equal(ms[r].st[0], CH_STATUS_OK);
                assert_int_equal(ms[r].st[1], CH_STATUS_OK);
            }
            for (size_t i = 0; i < n; i++) {
                ch_real s = value(0, i);
                for (int r = 1; r < d; r++) s += value(r, i);
                assert_memory_equal(&ms[0].buf[i], &s, sizeof s);
            }
            for (int r = 1; r < d; r++) assert_memory_equal(ms[r].buf, ms[0].buf, sizeof(ch_real) * n);
            for (int r = 0; r < d; r++) free(ms[r].buf);
        }
}

typedef struct bcast_arg {
    ch_comm comm;
    ch_real buf[33];
    unsigned char bytes[16];
    ch_status st, st_bytes;
} bcast_arg;

/* 33 values from member 2, then 13 bytes (no whole number of values) from member 1. */
static void *run_bcast(void *arg)
{
    bcast_arg *b = arg;
    for (int i = 0; i < 33; i++) b->buf[i] = (ch_real)(b->comm.rank * 100 + i);
    for (int i = 0; i < 16; i++) b->bytes[i] = (unsigned char)(b->comm.rank * 40 + i);
    ch_err err;
    b->st = ch_comm_broadcast(&b->comm, b->buf, 33, 2, &err);
    b->st_bytes = ch_comm_broadcast_bytes(&b->comm, b->bytes, 13, 1, &err);
    return NULL;
}

static void broadcast_copies_the_root(void **state)
{
    (void)state;
    ch_local_group *g;
    ch_err err;
    assert_int_equal(ch_local_group_create(3, &g, &err), CH_STATUS_OK);
    bcast_arg a[3];
    pthread_t th[3];
    for (int r = 0; r < 3; r++) {
        ch_local_comm_init(&a[r].comm, g, r);
        assert_int_equal(pthread_create(&th[r], NULL, run_bcast, &a[r]), 0);
    }
    for (int r = 0; r < 3; r++) assert_int_equal(pthread_join(th[r], NULL), 0);
    for (int r = 0; r < 3; r++) {
        assert_int_equal(a[r].st, CH_STATUS_OK);
        for (int i = 0; i < 33; i++) assert_true(a[r].buf[i] == (ch_real)(200 + i));
        assert_int_equal(a[r].st_bytes, CH_STATUS_OK);
        for (int i = 0; i < 16; i++) assert_int_equal(a[r].bytes[i], (i < 13 ? 1 : r) * 40 + i);
    }
    ch_local_group_free(g);
}

static void an_aborting_member_releases_the_others(void **state)
{
    (void)state;
    member ms[8];
    for (int at = 0; at < 2; at++) {
        run_group(4, 1000, 2, at, ms);   /* member 2 fails before the allreduce, or before the barrier */
        for (int r = 0; r < 4; r++) {
            if (r == 2) continue;
            const int k = at;            /* the collective the others were waiting in */
            assert_int_equal(ms[r].st[k], CH_STATUS_SYSTEM);
            assert_non_null(strstr(ms[r].msg[k], "member 2: injected failure"));
        }
        for (int r = 0; r < 4; r++) free(ms[r].buf);
    }
}

static void bad_group_sizes_are_refused(void **state)
{
    (void)state;
    ch_local_group *g;
    ch_err err;
    assert_int_equal(ch_local_group_create(0, &g, &err), CH_STATUS_BAD_INPUT);
    assert_int_equal(ch_local_group_create(5000, &g, &err), CH_STATUS_BAD_INPUT);
}

/* A communicator that sums nothing and records every bucket it is handed. */
typedef struct recorder {
    ch_real *buf[64];
    size_t n[64], at[64];
    int calls;
} recorder;

static ch_status record_sum(ch_comm *c, ch_real *buf, size_t n, ch_err *err)
{
    (void)err;
    recorder *r = c->group;
    if (r->calls < 64) {
        r->buf[r->calls] = buf;
        r->n[r->calls] = n;
        r->at[r->calls] = c->at;
    }
    r->calls++;
    return CH_STATUS_OK;
}

static ch_status record_none(ch_comm *c, ch_err *err) { (void)c; (void)err; return CH_STATUS_OK; }
static void record_abort(ch_comm *c, const char *why) { (void)c; (void)why; }

/* Error feedback between ranks keeps one residual per gradient, found by ch_comm.at: the gradient
 * sync must say where each bucket starts (lenet in buckets of about 5000 values). */
static void gradient_sync_names_each_buckets_offset(void **state)
{
    (void)state;
    static const ch_comm_ops ops = { .name = "recorder", .allreduce_sum = record_sum, .barrier = record_none,
                                     .abort = record_abort };
    recorder rec = { .calls = 0 };
    ch_comm c = { .ops = &ops, .rank = 0, .size = 2, .group = &rec };
    ch_err err;
    ch_graph *g;
    ch_backend *be;
    ch_model *m;
    ch_gradsync *s;
    assert_int_equal(ch_zoo_graph("lenet", (ch_shape3){ 1, 28, 28 }, 10, &g, &err), CH_STATUS_OK);
    assert_int_equal(ch_backend_create("cpu", 0, 1, &be, &err), CH_STATUS_OK);
    assert_int_equal(ch_model_create_graph(g, (ch_shape3){ 1, 28, 28 }, 10, be, &m, &err), CH_STATUS_OK);
    assert_int_equal(ch_gradsync_create(&c, m, 5000, &s, &err), CH_STATUS_OK);
    ch_gradsync_begin(s, 0);
    for (int i = m->ntensors - 1; i >= 0; i--)
        if (m->tensors[i].kind == CH_TENSOR_PARAM)
            ch_gradsync_ready(s, m->tensors[i].spec->offset, m->tensors[i].spec->count);
    assert_int_equal(ch_gradsync_finish(s, &err), CH_STATUS_OK);
    assert_int_equal(rec.calls, ch_gradsync_buckets(s));
    assert_true(rec.calls > 2 && rec.calls <= 64);
    size_t covered = 0;
    for (int k = 0; k < rec.calls; k++) {
        assert_ptr_equal(rec.buf[k], m->grads + rec.at[k]);   /* the host is the CPU backend's memory */
        covered += rec.n[k];
        /* Buckets go from the last parameters to the first, back to back. */
        if (k > 0) assert_int_equal(rec.at[k] + rec.n[k], rec.at[k - 1]);
    }
    assert_int_equal(rec.at[rec.calls - 1], 0);
    assert_int_equal(covered, m->nparams);
    ch_gradsync_free(s);
    ch_model_free(m);
    ch_backend_free(be);
    ch_graph_free(g);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(allreduce_equals_the_serial_sum_on_every_member),
        cmocka_unit_test(broadcast_copies_the_root),
        cmocka_unit_test(an_aborting_member_releases_the_others),
        cmocka_unit_test(bad_group_sizes_are_refused),
        cmocka_unit_test(gradient_sync_names_each_buckets_offset),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
