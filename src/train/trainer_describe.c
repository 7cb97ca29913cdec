/* ch_trainer_describe (cohort.h), what cohort train --dry-run prints: the model summary (layers,
 * output shapes, parameters, FLOPs per image, memory plan) and the data and device plan of the run,
 * from a trainer that has been set up but has not trained. FLOPs count a multiply-add as 2; training costs about 3x the forward pass (forward,
 * data gradient, weight gradient). */
#include <stdio.h>
#include <string.h>

#include "kernels/cpu/cpu.h"
#include "nn/model.h"
#include "train/trainer.h"

/* --shares: each rank's share and its part of a full batch (the first 8 ranks). */
static void print_shares(FILE *out, const ch_trainer *t, int B)
{
    char text[256];
    if (!ch_trainer_shares(t, text, sizeof text)) return;
    fprintf(out, "shares: %s%s; of a batch of %d,", t->shares.automatic ? "auto, starting at " : "", text, B);
    const int D = t->nreplicas;
    for (int r = 0; r < t->procs && r < 8; r++) {
        int part = 0;
        for (int d = 0; d < D; d++) part += t->scratch[r * D + d];
        fprintf(out, "%s rank %d takes %d", r ? "," : "", r, part);
    }
    fprintf(out, "%s\n", t->procs > 8 ? ", ..." : "");
    if (t->shares.automatic)
        fprintf(out, "shares auto: re-balanced from each rank's step time after %d steps, then at every epoch end; "
               "a slice larger than the model's plan (%d samples) runs as more micro-batches\n", CH_SHARES_PROBE + 2,
               t->spec.max_micro);
}

static size_t shape_size(ch_shape3 s) { return (size_t)s.c * (size_t)s.h * (size_t)s.w; }

static size_t layer_params(const ch_layer *l)
{
    size_t n = 0;
    for (int i = 0; !l->tied_to && i < l->nparams; i++) n += l->params[i].count;
    return n;
}

/* Forward FLOPs per image of a leaf layer. */
static double layer_flops(const ch_layer *l)
{
    const double out = (double)shape_size(l->out);
    if (strcmp(l->ops->kind, "Conv2d") == 0) {
        const int64_t *w = l->params[0].dims;   /* [cout, cin, k, k] */
        return out * 2.0 * (double)(w[1] * w[2] * w[3]) + (l->nparams > 1 ? out : 0);
    }
    if (strcmp(l->ops->kind, "Linear") == 0) return 2.0 * (double)shape_size(l->in) * l->out.c + l->out.c;
    if (strcmp(l->ops->kind, "MaxPool2d") == 0 || strcmp(l->ops->kind, "AvgPool2d") == 0 ||
        strcmp(l->ops->kind, "AdaptiveAvgPool2d") == 0)
        return (double)shape_size(l->in);
    if (ch_layer_is_batchnorm(l)) return 2.0 * out;
    if (strcmp(l->ops->kind, "Add") == 0 || strcmp(l->ops->kind, "Mul") == 0) return out;
    if (strcmp(l->ops->kind, "ReLU") == 0 || strcmp(l->ops->kind, "Dropout") == 0) return out;
    return 0;
}

typedef struct totals {
    double flops;
    size_t act_elems;
} totals;

static void walk(FILE *out, const ch_layer *l, const char *prefix, int depth, totals *t, bool print)
{
    /* Module paths as PyTorch names them ("resnet_block2.0.conv1"); truncation only shortens the
     * printed name. */
    char path[160];
    int len = depth == 0 ? snprintf(path, sizeof path, "(model)")
              : prefix[0] ? snprintf(path, sizeof path, "%s.%s", prefix, l->name)
                          : snprintf(path, sizeof path, "%s", l->name);
    if (len < 0) path[0] = 0;
    const double f = layer_flops(l);
    t->flops += f;
    if (l->y_owned) t->act_elems += shape_size(l->out);
    if (print && depth > 0) {
        char shape[48];
        snprintf(shape, sizeof shape, "%dx%dx%d", l->out.c, l->out.h, l->out.w);
        fprintf(out, "  %-32s %-18s %-12s %10zu %12.3f\n", path, l->ops->kind, shape, layer_params(l), f / 1e6);
    }
    for (int i = 0; i < l->nchildren; i++) walk(out, l->children[i], depth ? path : "", depth + 1, t, print);
}

static double mib(double bytes) { return bytes / (1 << 20); }

/* --ps-servers: who serves what, and how the workers and servers talk. */

/* --precision bf16's line: which layers multiply in bf16, and what is kept in bf16. */
static void describe_bf16(FILE *out, const ch_model *m)
{
    char convs[200] = "", linears[100] = "", kept[240] = "", inputs[160] = "", grads[160] = "";
    if (m->convs)
        snprintf(convs, sizeof convs, "%d of %d convolutions (where bf16 is the faster: direct, or a 3x3 "
                 "Winograd's point products; 1x1 only strided; 16 channels or more)", m->bf16_convs, m->convs);
    if (m->linears)
        snprintf(linears, sizeof linears, "%s%d of %d Linear layers (2^26 multiply-adds a pass or more)",
                 m->convs ? " and " : "", m->bf16_linears, m->linears);
    if (m->bf16_kept)
        snprintf(kept, sizeof kept, "; BatchNorm inputs kept in bf16 from forward to backward (%.2f MiB of the "
                 "saved, %.2f MiB of it written in bf16 by the convolutions before them)",
                 mib((double)m->bf16_kept * 2), mib((double)m->bf16_direct * 2));
    if (m->bf16_inputs)
        snprintf(inputs, sizeof inputs, "; BatchNorm + ReLU outputs passed in bf16 to the convolutions that read "
                 "them (%.2f MiB a batch)", mib((double)m->bf16_inputs * 2));
    if (m->bf16_grads)
        snprintf(grads, sizeof grads, "; the gradients of %.2f MiB of those kept inputs passed in bf16 from the "
                 "BatchNorms to the convolutions that made them", mib((double)m->bf16_grads * 2));
    fprintf(out, "precision: bf16 products in %s%s, fp32 sums%s%s%s; weights, gradients, optimizer state, BatchNorm "
            "statistics and %sactivations fp32%s\n", m->convs || m->linears ? convs : "no layer", linears, kept,
            inputs, grads, m->bf16_kept || m->bf16_inputs ? "other " : "",
            m->bf16_convs || m->bf16_linears || m->bf16_kept ? "" : ": none of this model's layers is one, so it trains as in fp32");
    /* The CPU kernels (and the test backends wrapping them) keep fp32 products where bf16 ones
     * are no faster (ch_cpu_bf16_products); say so, since the line above then counts none. */
    char why[160];
    if ((m->convs || m->linears) && m->be->k->conv2d_in_bf16 && !ch_cpu_bf16_products(why, sizeof why))
        fprintf(out, "  products stay fp32 here: %s (COHORT_BF16_PRODUCTS=on multiplies in bf16 anyway)\n", why);
}
static void print_servers(FILE *out, const ch_trainer *t, size_t P)
{
    int S = 0;
    const char *mode = ch_trainer_ps(t, &S);
    if (!mode) return;
    const int W = t->procs;
    fprintf(out, "parameter servers (--ps-servers %d, %s): worker ranks 0..%d train; server rank%s %d", S, mode, W - 1,
           S > 1 ? "s" : "", W);
    if (S > 1) fprintf(out, "..%d", W + S - 1);
    fprintf(out, " hold the parameters and the optimizer state in shards:");
    for (int s = 0; s < S; s++)
        fprintf(out, "%s rank %d [%zu, %zu)", s ? "," : "", W + s, ch_shard_lo(P, S, s), ch_shard_lo(P, S, s + 1));
    fprintf(out, "\n  each step a worker pushes its gradient buckets to their servers as backward completes them and "
           "pulls the updated parameters; %s\n",
           strcmp(mode, "sync") == 0
               ? "a server sums every worker's push of the step in worker order and updates once"
               : "a server applies each push on arrival; workers claim the epoch's work from the first server");
    if (strcmp(mode, "async") == 0)
        fprintf(out, "  staleness: %s\n", t->cfg.staleness >= 0 ? "bounded (--staleness)" : "unbounded");
}

int ch_trainer_bf16_layers(const ch_trainer *t)
{
    const ch_model *m = t->replicas[0].model;
    return m->bf16_convs + m->bf16_linears;
}

void ch_trainer_describe(const ch_trainer *t, FILE *out)
{
    const ch_model *m = t->replicas[0].model;
    const int B = t->cfg.batch_size, D = t->nreplicas, R = t->procs * D;
    const int slice = t->spec.max_slice;
    fprintf(out, "model %s: input %dx%dx%d, %d classes\n", t->model_name, m->input.c, m->input.h,
           m->input.w, m->classes);
    fprintf(out, "  %-32s %-18s %-12s %10s %12s\n", "layer", "kind", "output", "params", "MFLOP/img");
    totals tot = { 0, 0 };
    walk(out, m->root, "", 0, &tot, true);
    const double P = (double)m->nparams;
    fprintf(out, "total: %zu parameters (%.2f MiB), %zu buffer values; forward %.3f MFLOP/image, "
           "training ~%.3f MFLOP/image\n", m->nparams, mib(P * 4), m->nbuffers, tot.flops / 1e6,
           3 * tot.flops / 1e6);
    const double act = (double)tot.act_elems * slice * sizeof(ch_real);
    const ch_optim *o = &t->replicas[0].opt;
    char zero[64] = "";
    if (t->replicas[0].sharded) snprintf(zero, sizeof zero, " (its 1/%d shard, --zero 1)", R);
    fprintf(out, "memory per replica (slice of %d): parameters %.2f MiB, gradients %.2f MiB, optimizer state %.2f MiB%s, "
           "activations %.2f MiB, saved for backward %.2f MiB, backward scratch %.2f MiB, "
           "kernel workspace %.2f MiB, transformed weights kept from forward %.2f MiB\n", slice, mib(P * 4), mib(P * 4),
           o->nstate * mib((double)o->n * sizeof(ch_real)), zero, mib(act), mib((double)m->saved_bytes),
           mib((double)m->scratch_len * sizeof(ch_real)), mib((double)m->ws_len * sizeof(ch_real)),
           mib((double)m->keep_bytes));
    if (t->spec.bf16) describe_bf16(out, m);
    int threads = 0;
    for (int r = 0; r < D; r++) threads += t->replicas[r].nthreads;
    fprintf(out, "devices: %d rank%s x [%s] = %d replica%s; %d compute thread%s in this rank\n", t->procs,
           t->procs > 1 ? "s" : "", t->devices_text, R, R > 1 ? "s" : "", threads, threads > 1 ? "s" : "");
    const size_t n = t->train->n;
    const size_t steps = (n + (size_t)B - 1) / (size_t)B, last = n - (steps - 1) * (size_t)B;
    ch_shares_split(&t->shares, B, t->scratch);
    int cnt_lo = B, cnt_hi = 0;
    for (int g = 0; g < R; g++) {
        cnt_lo = t->scratch[g] < cnt_lo ? t->scratch[g] : cnt_lo;
        cnt_hi = t->scratch[g] > cnt_hi ? t->scratch[g] : cnt_hi;
    }
    fprintf(out, "data: %zu training samples, global batch %d -> %d to %d per replica; %zu steps per epoch "
           "(last batch %zu)", n, B, cnt_lo, cnt_hi, steps, last);
    if (t->test) fprintf(out, "; %zu test samples", t->test->n);
    fprintf(out, "\n");
    print_shares(out, t, B);
    if (t->spec.accum > 1)
        fprintf(out, "accumulation: %d micro-batches per step of up to %d samples per replica; one gradient sync "
               "and one update per step\n", t->spec.accum, t->spec.max_micro);
    size_t share_train, share_test;
    ch_trainer_share(t, &share_train, &share_test);
    if (t->procs > 1)
        fprintf(out, "rank 0 trains on %zu and evaluates %zu samples per epoch\n", share_train, share_test);
    if (R > 1) {
        const int nb = t->replicas[0].sync ? ch_gradsync_buckets(t->replicas[0].sync) : 0;
        fprintf(out, "gradient sync: %.2f MiB in %d bucket%s of up to %g MiB, %s\n", mib(P * 4), nb, nb > 1 ? "s" : "",
               t->cfg.bucket_mb > 0 ? t->cfg.bucket_mb : 25.0,
               t->procs > 1 ? (t->compress != CH_COMPRESS_NONE
                                   ? (D > 1 ? "local reduce + bf16 exchange + local broadcast" : "bf16 exchange between ranks")
                                   : D > 1 ? "local reduce + MPI_Iallreduce + local broadcast"
                                           : "MPI_Iallreduce between ranks")
                            : "local allreduce between threads");
        if (t->procs > 1 && t->compress != CH_COMPRESS_NONE)
            fprintf(out, "gradient compression: %s between ranks (the %.2f MiB of gradients travel as %.2f MiB of bf16, a "
                   "reduce-scatter and an allgather by MPI_Isend/MPI_Irecv; summed in fp32 in rank order, the "
                   "same bits on every rank%s)%s\n",
                   ch_grad_compress_name(t->compress), mib(P * 4), mib(P * 2),
                   t->compress == CH_COMPRESS_BF16_EF ? "; error feedback" : "",
                   D > 1 ? "; replicas of a rank sum in fp32" : "");
    }
    if (t->procs == 1 && t->compress != CH_COMPRESS_NONE)
        fprintf(out, "gradient compression: %s applies between ranks; this job has one, so gradients stay fp32\n",
               ch_grad_compress_name(t->compress));
    if (t->replicas[0].sharded)
        fprintf(out, "optimizer sharding (--zero 1): replica 0 of this rank updates parameters %zu..%zu of %zu; after "
               "each update every replica's shard goes to every replica (%d broadcasts, %.2f MiB)\n",
               t->replicas[0].shard_lo, t->replicas[0].shard_lo + t->replicas[0].shard_n, m->nparams, R, mib(P * 4));
    else if (t->cfg.zero)
        fprintf(out, "optimizer sharding: --zero 1 needs more than one replica; this job has one\n");
    print_servers(out, t, m->nparams);
    const ch_optim_config *oc = &t->spec.optim;
    fprintf(out, "optimizer: %s lr %g", ch_optim_kind_name(oc->kind), t->cfg.lr);
    if (oc->kind == CH_OPTIM_SGD) fprintf(out, ", momentum %g%s", oc->momentum, oc->nesterov ? " (Nesterov)" : "");
    if (oc->kind == CH_OPTIM_ADAM || oc->kind == CH_OPTIM_ADAMW) fprintf(out, ", betas %g, %g, eps %g", oc->beta1, oc->beta2, oc->eps);
    if (oc->kind == CH_OPTIM_ADAGRAD) fprintf(out, ", eps %g", oc->eps);
    fprintf(out, ", weight decay %g; %d epochs; seed %llu\n", oc->weight_decay, t->cfg.epochs, (unsigned long long)t->cfg.seed);
    const ch_schedule *sc = &t->sched;
    fprintf(out, "schedule: %s from lr %g%s", ch_schedule_kind_name(sc->kind), sc->lr, t->cfg.scale_lr ? " (scaled by batch / 256)" : "");
    if (sc->kind == CH_SCHED_STEP) fprintf(out, ", x%g every %d epochs", sc->gamma, sc->step_size);
    if (sc->kind == CH_SCHED_MULTISTEP) fprintf(out, ", x%g at %d milestone epochs", sc->gamma, sc->nmilestones);
    if (sc->kind == CH_SCHED_COSINE) fprintf(out, ", to %g over %d epochs", sc->eta_min, sc->t_max);
    if (sc->warmup_epochs) fprintf(out, "; linear warmup over %d epochs", sc->warmup_epochs);
    fprintf(out, "\n");
    fflush(out);
}

const char *ch_trainer_model_name(const ch_trainer *t) { return t->model_name; }

int ch_trainer_threads(const ch_trainer *t)
{
    int threads = 0;
    for (int r = 0; r < t->nreplicas; r++) threads += t->replicas[r].nthreads;
    return threads;
}

int ch_trainer_procs(const ch_trainer *t) { return t->procs; }
