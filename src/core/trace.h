/* A timeline of spans in the Chrome trace event format (chrome://tracing, Perfetto): complete
 * events ("ph": "X") with a start and a duration, on tracks (a process = a rank, a thread = one
 * replica's compute thread or its gradient sync thread). Each track is written by one thread only,
 * so recording takes no lock; a full track drops further spans and counts them. Times are integer
 * nanoseconds on the monotonic clock, written as microseconds with three decimals, so a span
 * recorded inside another stays inside it in the file. */
#ifndef CH_CORE_TRACE_H
#define CH_CORE_TRACE_H

#include <stdint.h>
#include <stdio.h>

#include "core/status.h"

typedef struct ch_trace_event {
    char name[56];
    const char *cat;        /* static string: "step", "forward", "backward", "sync", ... */
    int64_t t0, t1;         /* ns */
    int64_t arg;            /* step or bucket; -1: none */
    int lane;               /* 0, or another row of the track for spans that overlap in time */
} ch_trace_event;

typedef struct ch_trace_track {
    char name[48];          /* "cpu:0 compute" */
    int tid;
    ch_trace_event *ev;
    int n, cap;
    long dropped;
    int lanes;              /* rows used (1 + the highest lane) */
} ch_trace_track;

/* Nanoseconds on the monotonic clock. */
int64_t ch_trace_now(void);
ch_status ch_trace_track_init(ch_trace_track *t, const char *name, int tid, int cap, ch_err *err);
void ch_trace_track_free(ch_trace_track *t);
/* Record [t0, now) as a span; t may be NULL (not tracing). */
void ch_trace_span(ch_trace_track *t, const char *cat, const char *name, int64_t t0, int64_t arg);
/* The same on another row of the track (thread id tid + 1000 x lane): spans that overlap without
 * nesting, such as gradient buckets in flight together, go on different lanes. */
void ch_trace_span_lane(ch_trace_track *t, const char *cat, const char *name, int64_t t0, int64_t arg,
                        int lane);
/* Write the tracks' events as JSON array elements (no brackets), each preceded by ",\n" unless
 * *first; pid is the rank, offset_ns is added to every time (aligning ranks' clocks). */
void ch_trace_write_events(FILE *f, const ch_trace_track *tracks, int ntracks, int pid,
                           const char *process_name, int64_t offset_ns, int *first);

#endif
