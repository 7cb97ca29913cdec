/* The trainer's side of parameter servers: a server rank's whole part in the job, rank 0's
 * hand-over of the parameters (and optimizer state) to the servers, and telling them when the
 * workers give up together. */
#include "train/trainer.h"

#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "comm/world.h"
#include "train/ps.h"

/* A server rank's whole part in the job: serve until every worker has stopped. */
ch_status ch_trainer_serve(ch_trainer *t, ch_err *err)
{
    ch_optim_config oc;
    CH_TRY(ch_trainer_optim_config(&t->cfg, &oc, err));
    const int64_t B = t->cfg.batch_size, steps = ((int64_t)t->train->n + B - 1) / B;
    char line[256];
    snprintf(line, sizeof line, "rank %d of %d, host %s, pid %ld: parameter server %d of %d (%s), for %d workers",
             ch_world_rank(), ch_world_size(), ch_world_host(), (long)getpid(), ch_world_rank() - t->procs + 1,
             ch_ps_servers(t->ps), ch_ps_mode_name(ch_ps_mode_of(t->ps)), t->procs);
    ch_world_log(line);
    return ch_ps_serve(t->ps, &oc, steps * t->procs, err);
}

ch_status ch_trainer_ps_barrier(ch_trainer *t, const char *what, ch_err *err)
{
    if (t->procs == 1) return CH_STATUS_OK;
    snprintf(t->main_comm.what, sizeof t->main_comm.what, "%s", what);
    return ch_comm_barrier(&t->main_comm, err);
}

/* Rank 0's host copies of global replica 0's parameters and optimizer state (the state only
 * with_state), then to the servers. */
static ch_status give_servers(ch_trainer *t, bool with_state, ch_err *err)
{
    const ch_replica *r0 = &t->replicas[0];
    const size_t P = r0->model->nparams;
    const int nstate = with_state ? r0->opt.nstate : 0;
    ch_real *params = malloc(sizeof(ch_real) * (P + 1)), *state[CH_OPTIM_MAX_STATE] = { 0 };
    ch_status st = params ? CH_STATUS_OK : CH_SYS_FAIL(err, "allocation of the parameters for the servers");
    for (int b = 0; b < nstate && st == CH_STATUS_OK; b++)
        if (!(state[b] = malloc(sizeof(ch_real) * (P + 1)))) st = CH_SYS_FAIL(err, "allocation of optimizer state");
    if (st == CH_STATUS_OK) {
        ch_backend_download(r0->be, params, r0->model->params, sizeof(ch_real) * P);
        for (int b = 0; b < nstate; b++) ch_backend_download(r0->be, state[b], r0->opt.state[b], sizeof(ch_real) * P);
        st = ch_ps_put_state(t->ps, params, state, nstate, r0->opt.steps, err);
    }
    free(params);
    for (int b = 0; b < CH_OPTIM_MAX_STATE; b++) free(state[b]);
    return st;
}

ch_status ch_trainer_ps_hand_over(ch_trainer *t, bool with_state, const char *what, ch_err *err)
{
    if (t->proc == 0) CH_TRY(give_servers(t, with_state, err));
    return ch_trainer_ps_barrier(t, what, err);
}

ch_status ch_trainer_ps_give_up(ch_trainer *t, ch_status st, const ch_err *err)
{
    /* A failure of one rank ends the job through MPI_Abort; one that every worker holds ends
     * each of them with a clean exit, for which the servers would wait for ever. */
    if (st == CH_STATUS_OK || !t->ps || t->ps_server || !err->on_every_rank || t->abandoned) return st;
    t->abandoned = true;
    ch_err e2;
    if (ch_ps_abandon(t->ps, st, &e2) != CH_STATUS_OK) ch_world_fatal(1, e2.msg);
    return st;
}
