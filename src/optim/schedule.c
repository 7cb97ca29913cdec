/* Learning-rate schedules (see schedule.h). */
#include "optim/schedule.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

static const char *const names[] = { "constant", "step", "multistep", "cosine" };
static const double PI = 3.14159265358979323846;

ch_status ch_schedule_kind_parse(const char *name, ch_schedule_kind *out, ch_err *err)
{
    for (int k = 0; k < 4; k++)
        if (strcmp(name, names[k]) == 0) {
            *out = (ch_schedule_kind)k;
            return CH_STATUS_OK;
        }
    return ch_fail(err, CH_STATUS_BAD_INPUT, "unknown schedule '%s' (expected constant, step, multistep or cosine)", name);
}

const char *ch_schedule_kind_name(ch_schedule_kind k) { return k <= CH_SCHED_COSINE ? names[k] : "?"; }

ch_status ch_schedule_parse_milestones(ch_schedule *s, const char *list, ch_err *err)
{
    s->nmilestones = 0;
    const char *p = list;
    while (*p) {
        char *end;
        errno = 0;
        const long v = strtol(p, &end, 10);
        const int prev = s->nmilestones ? s->milestones[s->nmilestones - 1] : 0;
        if (end == p || errno || v <= prev || v > 1000000 || (*end && *end != ',') ||
            s->nmilestones == CH_SCHED_MAX_MILESTONES)
            return ch_fail(err, CH_STATUS_BAD_INPUT,
                           "--milestones '%s': expected up to %d increasing positive epochs, like 30,60,90",
                           list, CH_SCHED_MAX_MILESTONES);
        s->milestones[s->nmilestones++] = (int)v;
        p = *end ? end + 1 : end;
    }
    if (s->nmilestones == 0) return ch_fail(err, CH_STATUS_BAD_INPUT, "--milestones '%s': no epochs in it", list);
    return CH_STATUS_OK;
}

ch_status ch_schedule_check(const ch_schedule *s, ch_err *err)
{
    if (s->kind == CH_SCHED_STEP && s->step_size < 1)
        return ch_fail(err, CH_STATUS_BAD_INPUT, "the step schedule needs --step-size >= 1");
    if (s->kind == CH_SCHED_MULTISTEP && s->nmilestones < 1)
        return ch_fail(err, CH_STATUS_BAD_INPUT, "the multistep schedule needs --milestones");
    if (s->kind == CH_SCHED_COSINE && s->t_max < 1)
        return ch_fail(err, CH_STATUS_BAD_INPUT, "the cosine schedule needs --t-max >= 1 (epochs)");
    if (!(s->gamma > 0) || !(s->eta_min >= 0) || s->warmup_epochs < 0)
        return ch_fail(err, CH_STATUS_BAD_INPUT, "gamma must be > 0, eta-min and warmup-epochs >= 0");
    return CH_STATUS_OK;
}

static double main_lr(const ch_schedule *s, int e)
{
    switch (s->kind) {
    case CH_SCHED_STEP: return s->lr * pow(s->gamma, e / s->step_size);
    case CH_SCHED_MULTISTEP: {
        int passed = 0;
        while (passed < s->nmilestones && s->milestones[passed] <= e) passed++;
        return s->lr * pow(s->gamma, passed);
    }
    case CH_SCHED_COSINE:
        return s->eta_min + (s->lr - s->eta_min) * (1 + cos(PI * e / s->t_max)) / 2;
    default: return s->lr;
    }
}

double ch_schedule_lr(const ch_schedule *s, int epoch, long it, long steps)
{
    if (epoch < s->warmup_epochs) {
        const double done = (double)epoch * steps + it + 1, total = (double)s->warmup_epochs * steps;
        return main_lr(s, 0) * (done < total ? done / total : 1);
    }
    return main_lr(s, epoch - s->warmup_epochs);
}
