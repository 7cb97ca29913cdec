/* The trainer's trace (--trace): every rank's spans of the first steps, gathered to rank 0 over
 * MPI and written there as one Chrome trace file. */
#include "train/trainer.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/world.h"
#include "core/file.h"
#include "core/trace.h"

static ch_status trace_part(const ch_trainer *t, char **text, size_t *len, ch_err *err)
{
    *text = NULL;
    FILE *f = open_memstream(text, len);
    if (!f) return CH_SYS_FAIL(err, "open_memstream for the trace");
    char process[300];
    snprintf(process, sizeof process, "rank %d (%s)", t->proc, ch_world_host());
    int first = 1;
    ch_trace_track tracks[2 * CH_MAX_DEVICES];
    for (int r = 0; r < t->nreplicas; r++) {
        tracks[2 * r] = t->replicas[r].trace_compute;
        tracks[2 * r + 1] = t->replicas[r].trace_sync;
    }
    ch_trace_write_events(f, tracks, 2 * t->nreplicas, t->proc, process, t->trace_offset_ns, &first);
    const bool ok = !ferror(f);
    if (fclose(f) != 0 || !ok) {
        free(*text);
        *text = NULL;
        return CH_SYS_FAIL(err, "writing the trace in memory");
    }
    return CH_STATUS_OK;
}

/* Rank 0: the file is {"traceEvents": [part 0, part 1, ...]}, written atomically (core/file.h). */
static ch_status write_trace_file(const ch_trainer *t, const char *parts, const size_t *lens, ch_err *err)
{
    ch_out out;
    CH_TRY(ch_out_open(&out, t->trace_path, "--trace", err));
    fputs("{\"displayTimeUnit\": \"ms\", \"traceEvents\": [\n", out.f);
    for (int r = 0, at = 0; r < t->procs; at += (int)lens[r], r++) {
        if (r > 0) fputs(",\n", out.f);
        fwrite(parts + at, 1, lens[r], out.f);
    }
    fputs("\n]}\n", out.f);
    return ch_out_commit(&out, err);
}

/* Every rank's part reaches rank 0 over MPI (no directory the ranks share is needed), which writes
 * the one file. */
ch_status ch_trainer_write_trace(ch_trainer *t, ch_err *err)
{
    if (!t->cfg.trace || t->trace_done) return CH_STATUS_OK;
    t->trace_done = true;
    for (int r = 0; r < t->nreplicas; r++) t->replicas[r].tracing = false;
    char *mine;
    size_t len;
    CH_TRY(trace_part(t, &mine, &len, err));
    ch_status st = CH_STATUS_OK;
    if (t->procs == 1) {
        st = write_trace_file(t, mine, &len, err);
    } else {
        char *all = NULL;
        size_t *lens = calloc((size_t)t->procs, sizeof *lens);
        snprintf(t->main_comm.what, sizeof t->main_comm.what, "writing the trace: every rank's part to rank 0");
        st = lens ? ch_mpi_gather_bytes(&t->main_comm, mine, len, &all, lens, err)
                  : CH_SYS_FAIL(err, "allocation of the trace's part lengths");
        if (st == CH_STATUS_OK && t->proc == 0) st = write_trace_file(t, all, lens, err);
        free(all);
        free(lens);
    }
    free(mine);
    return st;
}
