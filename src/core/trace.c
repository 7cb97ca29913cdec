/* Chrome trace events: recording spans per track and writing them out (see trace.h). */
#include "core/trace.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

int64_t ch_trace_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

ch_status ch_trace_track_init(ch_trace_track *t, const char *name, int tid, int cap, ch_err *err)
{
    *t = (ch_trace_track){ .tid = tid, .cap = cap };
    snprintf(t->name, sizeof t->name, "%s", name);
    t->ev = malloc(sizeof *t->ev * (size_t)cap);
    CH_CHECK_ALLOC(err, t->ev);
    return CH_STATUS_OK;
}

void ch_trace_track_free(ch_trace_track *t)
{
    if (!t) return;
    free(t->ev);
    t->ev = NULL;
    t->n = t->cap = 0;
}

void ch_trace_span(ch_trace_track *t, const char *cat, const char *name, int64_t t0, int64_t arg)
{
    ch_trace_span_lane(t, cat, name, t0, arg, 0);
}

void ch_trace_span_lane(ch_trace_track *t, const char *cat, const char *name, int64_t t0, int64_t arg,
                        int lane)
{
    if (!t || !t->ev) return;
    const int64_t t1 = ch_trace_now();
    if (t->n == t->cap) {
        t->dropped++;
        return;
    }
    ch_trace_event *e = &t->ev[t->n++];
    snprintf(e->name, sizeof e->name, "%s", name);
    e->cat = cat;
    e->t0 = t0;
    e->t1 = t1;
    e->arg = arg;
    e->lane = lane;
    if (lane + 1 > t->lanes) t->lanes = lane + 1;
}

static void sep(FILE *f, int *first)
{
    if (!*first) fputs(",\n", f);
    *first = 0;
}

/* ns -> "us.nnn": exact, so containment survives the text. */
static void put_us(FILE *f, int64_t ns)
{
    const char *sign = ns < 0 ? "-" : "";
    const int64_t a = ns < 0 ? -ns : ns;
    fprintf(f, "%s%lld.%03lld", sign, (long long)(a / 1000), (long long)(a % 1000));
}

void ch_trace_write_events(FILE *f, const ch_trace_track *tracks, int ntracks, int pid,
                           const char *process_name, int64_t offset_ns, int *first)
{
    sep(f, first);
    fprintf(f, "{\"name\": \"process_name\", \"ph\": \"M\", \"pid\": %d, \"tid\": 0, \"args\": {\"name\": \"%s\"}}",
            pid, process_name);
    for (int k = 0; k < ntracks; k++) {
        const ch_trace_track *t = &tracks[k];
        for (int lane = 0; lane < (t->lanes > 1 ? t->lanes : 1); lane++) {
            const int tid = t->tid + 1000 * lane;
            sep(f, first);
            fprintf(f, "{\"name\": \"thread_name\", \"ph\": \"M\", \"pid\": %d, \"tid\": %d, \"args\": {\"name\": \"%s%s\"}}",
                    pid, tid, t->name, lane ? " (in flight too)" : "");
            sep(f, first);
            fprintf(f, "{\"name\": \"thread_sort_index\", \"ph\": \"M\", \"pid\": %d, \"tid\": %d, \"args\": {\"sort_index\": %d}}",
                    pid, tid, t->tid * 100 + lane);
        }
        for (int i = 0; i < t->n; i++) {
            const ch_trace_event *e = &t->ev[i];
            sep(f, first);
            fprintf(f, "{\"name\": \"%s\", \"cat\": \"%s\", \"ph\": \"X\", \"pid\": %d, \"tid\": %d, \"ts\": ",
                    e->name, e->cat, pid, t->tid + 1000 * e->lane);
            put_us(f, e->t0 + offset_ns);
            fputs(", \"dur\": ", f);
            put_us(f, e->t1 - e->t0);
            if (e->arg >= 0) fprintf(f, ", \"args\": {\"n\": %lld}", (long long)e->arg);
            fputc('}', f);
        }
    }
}
