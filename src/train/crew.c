/* The crew's threads wait on a generation counter: ch_crew_run publishes a job, bumps the
 * generation and waits until every member has reported it done. */
#include "train/crew.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/cpu.h"

typedef struct member {
    struct ch_crew *crew;
    int index;
    int *cpus, ncpus;       /* owned copy */
    pthread_t thread;
    bool started;
} member;

struct ch_crew {
    int size;
    member *members;
    pthread_mutex_t mu;
    pthread_cond_t go, done;
    unsigned long generation;
    int finished;
    bool quit;
    ch_crew_job job;
    void *arg;
};

static void *member_main(void *p)
{
    member *m = p;
    struct ch_crew *c = m->crew;
    if (m->ncpus > 0) {
        /* Pinning is a placement hint: a restricted cpuset must not stop training. */
        ch_err e;
        if (ch_cpu_pin_self(m->cpus, m->ncpus, &e) != CH_STATUS_OK)
            fprintf(stderr, "cohort: warning: replica %d not pinned: %s\n", m->index, e.msg);
    }
    unsigned long seen = 0;
    pthread_mutex_lock(&c->mu);
    for (;;) {
        while (c->generation == seen && !c->quit) pthread_cond_wait(&c->go, &c->mu);
        if (c->quit) break;
        seen = c->generation;
        ch_crew_job job = c->job;
        void *arg = c->arg;
        pthread_mutex_unlock(&c->mu);
        job(arg, m->index);
        pthread_mutex_lock(&c->mu);
        if (++c->finished == c->size) pthread_cond_signal(&c->done);
    }
    pthread_mutex_unlock(&c->mu);
    return NULL;
}

ch_status ch_crew_create(int size, const int *const *cpus, const int *ncpus, ch_crew **out,
                         ch_err *err)
{
    struct ch_crew *c = calloc(1, sizeof *c);
    CH_CHECK_ALLOC(err, c);
    c->members = calloc((size_t)size, sizeof *c->members);
    if (!c->members || pthread_mutex_init(&c->mu, NULL) != 0 ||
        pthread_cond_init(&c->go, NULL) != 0 || pthread_cond_init(&c->done, NULL) != 0) {
        free(c->members);
        free(c);
        return CH_SYS_FAIL(err, "crew allocation");
    }
    c->size = size;
    for (int i = 0; i < size; i++) {
        member *m = &c->members[i];
        m->crew = c;
        m->index = i;
        m->ncpus = ncpus[i];
        if (m->ncpus > 0) {
            m->cpus = malloc(sizeof(int) * (size_t)m->ncpus);
            if (!m->cpus) {
                ch_crew_free(c);
                return CH_SYS_FAIL(err, "allocation of a replica's CPU list");
            }
            memcpy(m->cpus, cpus[i], sizeof(int) * (size_t)m->ncpus);
        }
        if (pthread_create(&m->thread, NULL, member_main, m) != 0) {
            ch_crew_free(c);
            return CH_SYS_FAIL(err, "pthread_create of a replica thread");
        }
        m->started = true;
    }
    *out = c;
    return CH_STATUS_OK;
}

void ch_crew_run(ch_crew *c, ch_crew_job job, void *arg)
{
    pthread_mutex_lock(&c->mu);
    c->job = job;
    c->arg = arg;
    c->finished = 0;
    c->generation++;
    pthread_cond_broadcast(&c->go);
    while (c->finished < c->size) pthread_cond_wait(&c->done, &c->mu);
    pthread_mutex_unlock(&c->mu);
}

void ch_crew_free(ch_crew *c)
{
    if (!c) return;
    pthread_mutex_lock(&c->mu);
    c->quit = true;
    pthread_cond_broadcast(&c->go);
    pthread_mutex_unlock(&c->mu);
    for (int i = 0; i < c->size; i++) {
        if (c->members[i].started) pthread_join(c->members[i].thread, NULL);
        free(c->members[i].cpus);
    }
    pthread_mutex_destroy(&c->mu);
    pthread_cond_destroy(&c->go);
    pthread_cond_destroy(&c->done);
    free(c->members);
    free(c);
}
