/* Optimizers and learning-rate schedules against PyTorch:
 *  - five steps of SGD (plain, momentum with dampening, Nesterov, weight decay), Adam (defaults;
 *    other betas, eps and L2), AdamW and Adagrad (defaults; lr decay, weight decay, initial
 *    accumulator) give the parameters torch.optim gives (fixture: fixtures/optim_steps.txt, written
 *    by fixtures/make_optim_steps.py), within 1e-6;
 *  - the optimizers' state buffers carry PyTorch's names. */
#include "test_util.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "optim/optim.h"

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
            assert_int_equal(ch_optim_init(&o, N, &c, &err), CH_STATUS_OK);
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
        assert_int_equal(ch_optim_init(&o, 3, &c, &err), CH_STATUS_OK);
        assert_int_equal(o.nstate, want[w].n);
        for (int i = 0; i < o.nstate; i++) assert_string_equal(ch_optim_state_name(&o, i), want[w].names[i]);
        ch_optim_free(&o);
    }
    ch_optim_kind k;
    ch_err err;
    assert_int_equal(ch_optim_kind_parse("rmsprop", &k, &err), CH_STATUS_BAD_INPUT);
    assert_non_null(strstr(err.msg, "unknown optimizer 'rmsprop'"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(optimizers_match_pytorch),
        cmocka_unit_test(state_names_are_pytorchs),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
