/* The trainer's configuration: every check of a ch_train_config that needs no other rank (so
 * every rank that agreed on its settings gives the same verdict), and what it makes of it: the
 * optimizer, the schedule, the injected fault of the failure tests. */
#include "train/trainer.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/world.h"
#include "core/cpu.h"
#include "kernels/cpu/cpu.h"
#include "graph/graph.h"
#include "train/options.h"
#include "train/ps.h"

/* fp32, or bf16 where the CPU has it natively (or emulated, for tests: COHORT_BF16=emulate). The
 * CUDA plugin has no bf16 kernels: on cuda devices bf16 would train in fp32 while the user thinks
 * otherwise, so it is refused there, whatever the host CPU has. */
static ch_status check_precision(const char *p, const char *devices, ch_err *err)
{
    if (!p || strcmp(p, "fp32") == 0) return CH_STATUS_OK;
    if (strcmp(p, "bf16") != 0)
        return ch_fail(err, CH_STATUS_BAD_INPUT, "--precision '%s': expected fp32 or bf16", p);
    ch_device_list devs;
    CH_TRY(ch_device_list_parse(devices ? devices : "cpu:0", &devs, err));
    if (devs.count && devs.dev[0].kind == CH_DEVICE_CUDA)
        return ch_fail(err, CH_STATUS_BAD_INPUT, "--precision bf16: the CUDA plugin has no bf16 kernels yet, so "
                       "cuda devices compute in fp32 only: use --precision fp32 (bf16 runs on CPUs with native bf16)");
    const char *emulate = getenv("COHORT_BF16");
    if (ch_cpu_bf16_emulate_mode(emulate) < 0)
        return ch_fail(err, CH_STATUS_BAD_INPUT, "COHORT_BF16='%s': expected emulate (or unset)", emulate);
    char isa[32];
    if (!ch_cpu_bf16_runs(isa, sizeof isa))
        return ch_fail(err, CH_STATUS_BAD_INPUT, "--precision bf16 needs a CPU with native bf16 (AVX512-BF16 or "
                       "AMX); this one offers %s, where bf16 would run slower than fp32: use fp32", isa);
    const char *products = getenv("COHORT_BF16_PRODUCTS");
    if (ch_cpu_bf16_products_mode(products) == -2)
        return ch_fail(err, CH_STATUS_BAD_INPUT, "COHORT_BF16_PRODUCTS='%s': expected on, off or auto", products);
    const char *inputs = getenv("COHORT_BF16_INPUTS");
    if (ch_cpu_bf16_products_mode(inputs) == -2)
        return ch_fail(err, CH_STATUS_BAD_INPUT, "COHORT_BF16_INPUTS='%s': expected on, off or auto", inputs);
    return CH_STATUS_OK;
}

/* --ps-servers and what it cannot go with. */
static ch_status check_ps(const ch_train_config *c, ch_err *err)
{
    ch_ps_mode mode;
    if (!ch_ps_mode_parse(c->ps_mode, &mode))
        return ch_fail(err, CH_STATUS_BAD_INPUT, "--ps-mode '%s': expected sync or async", c->ps_mode);
    if (c->ps_servers == 0) {
        if (mode == CH_PS_ASYNC || c->staleness >= 0)
            return ch_fail(err, CH_STATUS_BAD_INPUT, "--ps-mode and --staleness need --ps-servers");
        return CH_STATUS_OK;
    }
    if (c->local_only || ch_world_size() <= c->ps_servers)
        return ch_fail(err, CH_STATUS_BAD_INPUT, "--ps-servers %d needs more ranks than servers (mpirun -np N with "
                       "N > %d: the others train)", c->ps_servers, c->ps_servers);
    if (c->zero)
        return ch_fail(err, CH_STATUS_BAD_INPUT, "--zero 1 with --ps-servers: the servers already hold the optimizer "
                       "state in shards");
    if (c->grad_compress && strcmp(c->grad_compress, "none") != 0)
        return ch_fail(err, CH_STATUS_BAD_INPUT, "--grad-compress with --ps-servers: gradients go to the servers "
                       "as fp32");
    if (mode == CH_PS_SYNC && c->staleness >= 0)
        return ch_fail(err, CH_STATUS_BAD_INPUT, "--staleness is for --ps-mode async");
    if (mode == CH_PS_SYNC) return CH_STATUS_OK;
    const char *refused = c->sync_bn ? "--sync-bn (a collective every step)"
                          : c->shares && *c->shares ? "--shares (workers claim the work as they go)"
                          : c->checkpoint_every > 0 ? "--checkpoint-every (checkpoints come at epoch ends)"
                          : c->loader_workers > 0 ? "-j (the loader plans a fixed part of every step)"
                          : c->trace ? "--trace (the ranks merge their parts after the same steps)" : NULL;
    if (refused) return ch_fail(err, CH_STATUS_BAD_INPUT, "--ps-mode async does not go with %s", refused);
    ch_device_list devs;
    CH_TRY(ch_device_list_parse(c->devices ? c->devices : "cpu:0", &devs, err));
    if (devs.count > 1)
        return ch_fail(err, CH_STATUS_BAD_INPUT, "--ps-mode async: one device per worker rank (give each device "
                       "its own rank)");
    return CH_STATUS_OK;
}

bool ch_trainer_bf16(const ch_train_config *c) { return c->precision && strcmp(c->precision, "bf16") == 0; }

ch_status ch_trainer_check_config(const ch_train_config *c, ch_err *err)
{
    CH_TRY(check_precision(c->precision, c->devices, err));
    if (!c->model && !c->graph) return ch_fail(err, CH_STATUS_BAD_INPUT, "no model given");
    if (c->graph) CH_TRY(ch_graph_status(c->graph, err));
    if (c->init && strcmp(c->init, "file") == 0 && !(c->graph && c->graph->ninits > 0))
        return ch_fail(err, CH_STATUS_BAD_INPUT, "--init file: the model carries no weights (an imported ONNX "
                       "file does)");
    /* Every number within its flag's range: one table for the command line and the library. */
    CH_TRY(ch_opt_check_config(c, err));
    ch_grad_compress how;
    if (!ch_grad_compress_parse(c->grad_compress, &how))
        return ch_fail(err, CH_STATUS_BAD_INPUT, "--grad-compress '%s': expected none, bf16 or bf16-ef",
                       c->grad_compress);
    ch_optim_config oc;
    CH_TRY(ch_trainer_optim_config(c, &oc, err));
    ch_schedule sched;
    CH_TRY(ch_trainer_schedule_config(c, &sched, err));
    return check_ps(c, err);
}

/* COHORT_INJECT_FAULT=alloc:R | error:R:STEP | nan:R:STEP | kill:R:STEP | hang:R:STEP, for the
 * failure tests (R: the global replica index). */
ch_status ch_trainer_parse_fault(ch_fault *f, ch_err *err)
{
    *f = (ch_fault){ 0 };
    const char *s = getenv("COHORT_INJECT_FAULT");
    if (!s || !*s) return CH_STATUS_OK;
    char kind[8];
    int r = -1;
    unsigned long long step = 0;
    const int got = sscanf(s, "%7[a-z]:%d:%llu", kind, &r, &step);
    if (got >= 2 && strcmp(kind, "alloc") == 0) *f = (ch_fault){ CH_FAULT_ALLOC, r, 0 };
    else if (got == 3 && strcmp(kind, "error") == 0) *f = (ch_fault){ CH_FAULT_ERROR, r, step };
    else if (got == 3 && strcmp(kind, "nan") == 0) *f = (ch_fault){ CH_FAULT_NAN, r, step };
    else if (got == 3 && strcmp(kind, "kill") == 0) *f = (ch_fault){ CH_FAULT_KILL, r, step };
    else if (got == 3 && strcmp(kind, "hang") == 0) *f = (ch_fault){ CH_FAULT_HANG, r, step };
    else if (got == 3 && strcmp(kind, "slow") == 0 && step <= 1000000) *f = (ch_fault){ CH_FAULT_SLOW, r, step };
    else
        return ch_fail(err, CH_STATUS_BAD_INPUT,
                       "COHORT_INJECT_FAULT='%s': expected alloc:R, error:R:STEP, nan:R:STEP, "
                       "kill:R:STEP, hang:R:STEP or slow:R:MICROSECONDS_PER_SAMPLE", s);
    return CH_STATUS_OK;
}

/* The optimizer: PyTorch's defaults for the kind, then what the configuration sets. */
ch_status ch_trainer_optim_config(const ch_train_config *c, ch_optim_config *o, ch_err *err)
{
    ch_optim_kind kind = CH_OPTIM_SGD;
    if (c->optimizer) CH_TRY(ch_optim_kind_parse(c->optimizer, &kind, err));
    *o = ch_optim_defaults(kind);
    o->momentum = c->momentum;
    o->dampening = c->dampening;
    o->nesterov = c->nesterov;
    if (kind != CH_OPTIM_ADAMW || c->weight_decay > 0) o->weight_decay = c->weight_decay;
    if (c->beta1 > 0 || c->beta2 > 0) {
        o->beta1 = c->beta1;
        o->beta2 = c->beta2;
    }
    if (c->eps >= 0) o->eps = c->eps;
    if (kind != CH_OPTIM_SGD && (c->momentum != 0 || c->nesterov || c->dampening != 0))
        return ch_fail(err, CH_STATUS_BAD_INPUT, "--momentum, --nesterov and --dampening are for sgd, not %s",
                       c->optimizer);
    return CH_STATUS_OK;
}

/* The schedule; --scale-lr applies the linear scaling rule to its base rate. */
ch_status ch_trainer_schedule_config(const ch_train_config *c, ch_schedule *s, ch_err *err)
{
    *s = (ch_schedule){ .kind = CH_SCHED_CONSTANT, .lr = c->lr, .step_size = c->step_size,
                        .gamma = c->gamma, .t_max = c->t_max, .eta_min = c->eta_min,
                        .warmup_epochs = c->warmup_epochs };
    if (c->scale_lr) s->lr = c->lr * c->batch_size / 256.0;
    if (c->schedule) CH_TRY(ch_schedule_kind_parse(c->schedule, &s->kind, err));
    /* Cosine without --t-max anneals over the run (--epochs counts all epochs, resumed ones too),
     * as CosineAnnealingLR(T_max=epochs) usually is. */
    if (s->kind == CH_SCHED_COSINE && s->t_max < 1) s->t_max = c->epochs > 0 ? c->epochs : 1;
    if (c->milestones) CH_TRY(ch_schedule_parse_milestones(s, c->milestones, err));
    return ch_schedule_check(s, err);
}

void ch_trainer_set_skip_sync(ch_trainer *t, bool skip) { t->spec.skip_sync = skip; }
