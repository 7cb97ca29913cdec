/* Optimizer updates for the CPU backend: one OpenMP loop per rule over the flat buffers, each
 * element's update from kernels/optim_body.h (the scalars of the step come computed in u; see
 * optim/optim.h for the rules). */
#include "kernels/cpu/cpu.h"
#include "kernels/optim_body.h"

static void sgd(const ch_kctx *kc, const ch_optim_update *u, size_t n, ch_real *p,
                const ch_real *grad, ch_real *buf)
{
    const ch_real lr = u->lr, wd = u->wd, mom = u->momentum, damp = u->damp;
    const bool first = u->first, nesterov = u->nesterov;
#pragma omp parallel for num_threads(kc->nthreads) schedule(static)
    for (size_t i = 0; i < n; i++) ch_sgd_at(i, lr, wd, mom, damp, first, nesterov, p, grad, buf);
}

static void adam(const ch_kctx *kc, const ch_optim_update *u, size_t n, ch_real *p,
                 const ch_real *grad, ch_real *m1, ch_real *m2)
{
    const bool decoupled = u->decoupled;
    const ch_real b1 = u->b1, b2 = u->b2, eps = u->eps, wd = u->wd, decay = u->decay;
    const ch_real step_size = u->step_size, bc2_sqrt = u->bc2_sqrt;
#pragma omp parallel for num_threads(kc->nthreads) schedule(static)
    for (size_t i = 0; i < n; i++) ch_adam_at(i, decoupled, b1, b2, eps, wd, decay, step_size, bc2_sqrt, p, grad, m1, m2);
}

static void adagrad(const ch_kctx *kc, const ch_optim_update *u, size_t n, ch_real *p,
                    const ch_real *grad, ch_real *sum)
{
    const ch_real wd = u->wd, eps = u->eps, clr = u->lr;
#pragma omp parallel for num_threads(kc->nthreads) schedule(static)
    for (size_t i = 0; i < n; i++) ch_adagrad_at(i, clr, wd, eps, p, grad, sum);
}

void ch_cpu_optim_update(const ch_kctx *kc, const ch_optim_update *u, size_t n, ch_real *p,
                         const ch_real *g, ch_real *s0, ch_real *s1)
{
    switch (u->rule) {
    case CH_UPDATE_SGD: sgd(kc, u, n, p, g, s0); break;
    case CH_UPDATE_ADAM: adam(kc, u, n, p, g, s0, s1); break;
    case CH_UPDATE_ADAGRAD: adagrad(kc, u, n, p, g, s0); break;
    }
}
