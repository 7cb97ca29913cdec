/* Optimizers and learning-rate schedules against PyTorch:
 *  - five steps of SGD (plain, momentum with dampening, Nesterov, weight decay), Adam (defaults;
 *    other betas, eps and L2), AdamW and Adagrad (defaults; lr decay, weight decay, initial
 *    accumulator) give the parameters torch.optim gives (fixture: fixtures/optim_steps.txt, written
 *    by fixtures/make_optim_steps.py), within 1e-6;
 *  - the optimizers' state buffers carry PyTorch's names;
 *  - StepLR, MultiStepLR and CosineAnnealingLR stepped per epoch give PyTorch's rate for 14 epochs
 *    (fixture: fixtures/schedules.txt, by fixtures/make_schedules.py), within 1e-9 relative;
 *  - the linear warmup follows its formula per iteration, then hands over to the main schedule at
 *    its epoch 0; bad schedule settings are clean errors. */
#include "test_util.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "optim/optim.h"
#include "optim/schedule.h"

enum { N = 6 };
static const double P0[N] = { 0.5, -1.2, 0.3, 2.0, -0.7, 0.05 };

static double grad(int i, int t) { return sin(1.3 * i + 0.7 * t) * (1 + 0.1 * t); }

static void optimizers_match_pytorch(void **state)
{
    (void)state;
    FILE *f = fopen(COHORT_FIXTURES "/optim_steps.txt", "r");
    assert_non_null(f);
    char line[512], kind[16];
    int configs = 0, steps = 0;
    ch_optim o = { 0 };
    ch_real p[N], g[N];
    double lr = 0;
    while (fgets(line, sizeof line, f)) {
        ch_optim_config c;
        int nesterov, t;
        double v[N];
        if (sscanf(line, "config %15s %lf %lf %lf %d %lf %lf %lf %lf %lf %lf", kind, &lr, &c.momentum,
                   &c.dampening, &nesterov, &c.weight_decay, &c.beta1, &c.beta2, &c.eps, &c.lr_decay,
                   &c.initial_accumulator) == 11) {
            ch_optim_free(&o);
            ch_err err;
            assert_int_equal(ch_optim_kind_parse(kind, &c.kind, &err), CH_STATUS_OK);
            c.nesterov = nesterov != 0;
            assert_int_equal(ch_optim_init(&o, N, &c, ch_backend_host(), &err), CH_STATUS_OK);
            for (int i = 0; i < N; i++) p[i] = (ch_real)P0[i];
            configs++;
            continue;
        }
        assert_int_equal(sscanf(line, "step %d %lf %lf %lf %lf %lf %lf", &t, &v[0], &v[1], &v[2], &v[3], &v[4], &v[5]), 7);
        for (int i = 0; i < N; i++) g[i] = (ch_real)grad(i, t - 1);
        ch_optim_step(&o, lr, p, g, 1);
        for (int i = 0; i < N; i++)
            if (fabs(p[i] - v[i]) > 1e-6 * fmax(1, fabs(v[i])))
                fail_msg("%s (config %d) step %d: parameter %d is %.9g, PyTorch %.9g", kind, configs, t, i, (double)p[i], v[i]);
        steps++;
    }
    fclose(f);
    ch_optim_free(&o);
    assert_int_equal(configs, 8);
    assert_int_equal(steps, 40);
}

static void state_names_are_pytorchs(void **state)
{
    (void)state;
    static const struct { ch_optim_kind k; int n; const char *names[2]; } want[] = {
        { CH_OPTIM_SGD, 1, { "momentum_buffer" } },
        { CH_OPTIM_ADAM, 2, { "exp_avg", "exp_avg_sq" } },
        { CH_OPTIM_ADAMW, 2, { "exp_avg", "exp_avg_sq" } },
        { CH_OPTIM_ADAGRAD, 1, { "sum" } },
    };
    for (size_t w = 0; w < 4; w++) {
        ch_optim_config c = ch_optim_defaults(want[w].k);
        c.momentum = want[w].k == CH_OPTIM_SGD ? 0.9 : 0;
        ch_optim o;
        ch_err err;
        assert_int_equal(ch_optim_init(&o, 3, &c, ch_backend_host(), &err), CH_STATUS_OK);
        assert_int_equal(o.nstate, want[w].n);
        for (int i = 0; i < o.nstate; i++) assert_string_equal(ch_optim_state_name(&o, i), want[w].names[i]);
        ch_optim_free(&o);
    }
    ch_optim_kind k;
    ch_err err;
    assert_int_equal(ch_optim_kind_parse("rmsprop", &k, &err), CH_STATUS_BAD_INPUT);
    assert_non_null(strstr(err.msg, "unknown optimizer 'rmsprop'"));
}

static void schedules_match_pytorch(void **state)
{
    (void)state;
    FILE *f = fopen(COHORT_FIXTURES "/schedules.txt", "r");
    assert_non_null(f);
    char line[1024];
    int rows = 0;
    while (fgets(line, sizeof line, f)) {
        char name[32];
        int used;
        assert_int_equal(sscanf(line, "%31s%n", name, &used), 1);
        ch_schedule s = { .lr = 0.1, .gamma = 0.5, .step_size = 3 };
        ch_err err;
        assert_int_equal(ch_schedule_kind_parse(name, &s.kind, &err), CH_STATUS_OK);
        if (s.kind == CH_SCHED_MULTISTEP) {
            s.gamma = 0.1;
            assert_int_equal(ch_schedule_parse_milestones(&s, "2,5,9", &err), CH_STATUS_OK);
        }
        if (s.kind == CH_SCHED_COSINE) {
            s.t_max = 6;
            s.eta_min = 0.001;
        }
        assert_int_equal(ch_schedule_check(&s, &err), CH_STATUS_OK);
        const char *p = line + used;
        for (int e = 0; e < 14; e++) {
            double want;
            int n;
            assert_int_equal(sscanf(p, "%lf%n", &want, &n), 1);
            p += n;
            for (long it = 0; it < 7; it += 3) {
                const double got = ch_schedule_lr(&s, e, it, 7);
                if (fabs(got - want) > 1e-9 * want) fail_msg("%s epoch %d: %.12g, PyTorch %.12g", name, e, got, want);
            }
        }
        rows++;
    }
    fclose(f);
    assert_int_equal(rows, 3);
}

static void warmup_then_main_schedule(void **state)
{
    (void)state;
    ch_schedule s = { .kind = CH_SCHED_STEP, .lr = 0.4, .step_size = 2, .gamma = 0.1, .warmup_epochs = 2 };
    const long steps = 5;
    for (int e = 0; e < 2; e++)
        for (long it = 0; it < steps; it++)
            assert_true(fabs(ch_schedule_lr(&s, e, it, steps) - 0.4 * (double)(e * steps + it + 1) / 10) < 1e-15);
    assert_true(ch_schedule_lr(&s, 2, 0, steps) == 0.4);     /* main epoch 0 */
    assert_true(ch_schedule_lr(&s, 3, 4, steps) == 0.4);     /* main epoch 1 */
    assert_true(fabs(ch_schedule_lr(&s, 4, 0, steps) - 0.04) < 1e-15);
    ch_err err;
    ch_schedule bad = { .kind = CH_SCHED_COSINE, .lr = 0.1, .gamma = 0.1 };
    assert_int_equal(ch_schedule_check(&bad, &err), CH_STATUS_BAD_INPUT);
    assert_non_null(strstr(err.msg, "--t-max"));
    assert_int_equal(ch_schedule_parse_milestones(&bad, "5,3", &err), CH_STATUS_BAD_INPUT);
    assert_int_equal(ch_schedule_kind_parse("onecycle", &bad.kind, &err), CH_STATUS_BAD_INPUT);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(optimizers_match_pytorch),
        cmocka_unit_test(state_names_are_pytorchs),
        cmocka_unit_test(schedules_match_pytorch),
        cmocka_unit_test(warmup_then_main_schedule),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
