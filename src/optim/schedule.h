/* Learning-rate schedules, as PyTorch's schedulers compute them when stepped once per epoch
 * (the usual `scheduler.step()` after each epoch), with an optional linear warmup stepped per
 * iteration in front (Goyal et al.: from lr/(W x steps) up to lr over W epochs), after which the
 * main schedule starts at its epoch 0 (PyTorch's SequentialLR):
 *   constant:  lr
 *   step:      lr x gamma^floor(e / step_size)                      (StepLR)
 *   multistep: lr x gamma^(number of milestones <= e)               (MultiStepLR)
 *   cosine:    eta_min + (lr - eta_min) (1 + cos(pi e / T_max)) / 2  (CosineAnnealingLR)
 * e is the 0-based epoch of the main schedule. The rate is a pure function of (epoch, iteration),
 * so a checkpoint's position is the schedule's whole state. */
#ifndef CH_OPTIM_SCHEDULE_H
#define CH_OPTIM_SCHEDULE_H

#include "core/status.h"

typedef enum ch_schedule_kind {
    CH_SCHED_CONSTANT, CH_SCHED_STEP, CH_SCHED_MULTISTEP, CH_SCHED_COSINE
} ch_schedule_kind;

enum { CH_SCHED_MAX_MILESTONES = 32 };

typedef struct ch_schedule {
    ch_schedule_kind kind;
    double lr;                  /* the base rate */
    int step_size;              /* step */
    double gamma;               /* step, multistep */
    int milestones[CH_SCHED_MAX_MILESTONES], nmilestones;   /* multistep, increasing */
    int t_max;                  /* cosine */
    double eta_min;             /* cosine */
    int warmup_epochs;          /* 0: none */
} ch_schedule;

/* "constant" | "step" | "multistep" | "cosine". */
ch_status ch_schedule_kind_parse(const char *name, ch_schedule_kind *out, ch_err *err);
const char *ch_schedule_kind_name(ch_schedule_kind k);
/* "30,60,90" into s->milestones (increasing positive integers). */
ch_status ch_schedule_parse_milestones(ch_schedule *s, const char *list, ch_err *err);
ch_status ch_schedule_check(const ch_schedule *s, ch_err *err);
/* The rate for iteration it (0-based) of epoch (0-based, warmup included) with steps iterations
 * per epoch. */
double ch_schedule_lr(const ch_schedule *s, int epoch, long it, long steps);

#endif
