/* cohort train: parse flags, load data, train, print one line per epoch, write metrics. */
#include <errno.h>
#include <limits.h>
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli/cli.h"
#include "train/ps.h"
#include "train/checkpoint.h"
#include "cli/plot.h"
#include "comm/world.h"
#include "core/file.h"
#include "core/status.h"

static const char train_usage[] =
    "usage: cohort train --model NAME --data DIR [options]\n"
    "       cohort train --resume CHECKPOINT --data DIR [options]   (the checkpoint's model)\n"
    "\n"
    "Train a model of the zoo on an IDX, CIFAR-10 or ImageFolder data set.\n"
    "\n"
    "  --model NAME          lenet | mnist-cnn | resnet18 | mlp | linear | resnet18-imagenet, or your own\n"
    "                        model as FILE.onnx, exported by PyTorch in training mode (see the README)\n"
    "  --data DIR            the data set: IDX files (train-/t10k- images and labels, .gz or\n"
    "                        raw), CIFAR-10 binary batches (data_batch_N.bin, test_batch.bin)\n"
    "                        or an ImageFolder (DIR/train/CLASS/*.png|jpg, DIR/val/CLASS/...)\n"
    "  --dataset KIND        auto | idx | cifar10 | imagefolder (default auto: what DIR holds)\n"
    "  --image-size N        ImageFolder: RandomResizedCrop(N) for training, Resize(N*256/224)\n"
    "                        + CenterCrop(N) for evaluation (default 224)\n"
    "  --skip-bad-images     ImageFolder: replace a file that does not decode by the next\n"
    "                        sample and count it (default: stop with an error naming it)\n"
    "  -j, --workers N       loader threads that decode and augment the next batches ahead\n"
    "                        of the step (default 0: each device gathers its own slice)\n"
    "  --epochs N            epochs to train (default 10)\n"
    "  -b, --batch-size B    global batch size (default 256)\n"
    "  --accum-steps K       run each device's part of a batch in K micro-batches and sync\n"
    "                        the summed gradient once (memory of one micro-batch; default 1)\n"
    "  --shares auto|W0,W1,...  each rank's part of every batch: one whole number per rank\n"
    "                        (3,1: rank 0 takes 3/4), or auto from measured step times\n"
    "                        (default: equal); gradients stay exact\n"
    "  --lr X                learning rate (default 0.1)\n"
    "  --optimizer NAME      sgd | adam | adamw | adagrad, PyTorch's rules (default sgd)\n"
    "  --momentum M          SGD momentum (default 0)\n"
    "  --nesterov            Nesterov momentum\n"
    "  --dampening D         SGD momentum dampening (default 0)\n"
    "  --betas B1,B2         Adam/AdamW betas (default 0.9,0.999)\n"
    "  --eps E               Adam/AdamW/Adagrad epsilon (default 1e-8; Adagrad 1e-10)\n"
    "  --schedule NAME       constant | step | multistep | cosine, per epoch (default constant)\n"
    "  --step-size N         step: epochs between decays\n"
    "  --gamma G             step, multistep: decay factor (default 0.1)\n"
    "  --milestones LIST     multistep: epochs, like 30,60,90\n"
    "  --t-max N             cosine: epochs to the lowest rate (default --epochs)\n"
    "  --eta-min X           cosine: the lowest rate (default 0)\n"
    "  --warmup-epochs N     linear warmup per step over N epochs first (default 0)\n"
    "  --scale-lr            linear scaling rule: lr x global batch / 256\n"
    "  --random-crop PAD     training: zero-pad by PAD, crop back at a random place\n"
    "  --random-flip         training: flip horizontally with probability 1/2\n"
    "  --normalize SPEC      imagenet | MEAN/STD per channel, like 0.49,0.48,0.45/0.25,0.24,0.26\n"
    "                        (default: none; imagenet for an ImageFolder)\n"
    "  --weight-decay W      L2 weight decay, also --wd (default 0)\n"
    "  --init SPEC           default (PyTorch's) | normal:STD (weights N(0,STD), biases 0) | file (an\n"
    "                        ONNX model's own weights: what it starts from unless told)\n"
    "  --seed S              seed of every random choice (default 0)\n"
    "  --devices LIST        devices, one model replica each: cpu:0,cpu:1 | cpu:0-3 | cpu*4\n"
    "                        (default cpu:0); the global batch is split across them\n"
    "  --threads T           compute threads in all, shared out among the devices\n"
    "                        (default: all cores; each device gets at least one)\n"
    "  --sync-bn             BatchNorm batch statistics over the whole global batch\n"
    "                        (default: each device's own slice, as PyTorch DDP)\n"
    "  --precision P         fp32 (default); bf16 is refused (see cohort info)\n"
    "  --bucket-mb M         gradient sync bucket size in MiB (default 25)\n"
    "  --grad-compress C     none | bf16 | bf16-ef: gradients travel between ranks as bf16\n"
    "                        (half the bytes), summed in fp32; -ef adds error feedback\n"
    "                        (default none)\n"
    "  --zero 1              shard the optimizer state over the replicas of the job (ZeRO\n"
    "                        stage 1): the same result, its memory divided (default 0)\n"
    "  --ps-servers S        the last S ranks become parameter servers: they hold the\n"
    "                        parameters and optimizer state in shards; the others train\n"
    "  --ps-mode M           sync (default: the allreduce result) | async (pushes applied on\n"
    "                        arrival; fast workers take more of the epoch)\n"
    "  --staleness N         async: a worker runs at most N steps ahead of the slowest\n"
    "  --timeout SECONDS     end the job when an exchange between ranks takes longer\n"
    "                        (a stuck or lost rank; default 300)\n"
    "  --log-dir DIR         every rank writes its own log to DIR/workerlog.RANK\n"
    "  --checkpoint-dir DIR  write a checkpoint DIR/epoch-NNNN after every epoch\n"
    "  --checkpoint-every N  also DIR/step-NNNNNNNN every N steps\n"
    "  --keep K              keep only the newest K checkpoints (default: all)\n"
    "  --resume auto         continue from the latest checkpoint in --checkpoint-dir when there\n"
    "                        is one, else start: the same command, run again after a failure\n"
    "  --resume [PATH]       continue from PATH (a checkpoint) or from the latest one in\n"
    "                        --checkpoint-dir; --epochs counts the epochs in all\n"
    "  --overwrite           a fresh run may replace the checkpoints --checkpoint-dir holds\n"
    "                        (without it, and without --resume, such a folder is refused)\n"
    "  --train-limit N       use only the first N training samples\n"
    "  --test-limit N        evaluate on the first N test samples only\n"
    "  --metrics FILE        append one JSON object per epoch (JSON Lines)\n"
    "  --plot FILE.svg       after every epoch, redraw the training curves as an SVG chart\n"
    "  --trace FILE.json     a timeline (Chrome trace format) of the first steps: data, forward,\n"
    "                        backward per layer, each bucket's sync, optimizer; per rank and device\n"
    "  --trace-steps N       steps in the trace (default 20)\n"
    "  --nan-check           stop with an error when the loss is not finite\n"
    "  --allow-nonfinite     resume from a checkpoint holding NaN/Inf or a negative running_var\n"
    "  --progress MODE       auto | bar | lines | none: progress inside an epoch on stderr;\n"
    "                        auto draws a bar on a terminal and prints lines elsewhere (batch\n"
    "                        logs, mpirun, srun) (default auto)\n"
    "  --progress-interval S lines: at most one every S seconds (default 10)\n"
    "  --no-progress         the same as --progress none\n"
    "  --dry-run             print the model summary and the data and device plan, then exit\n"
    "  -h, --help            this text\n"
    "\n"
    "Under mpirun every process is one rank: mpirun -np 2 cohort train ... trains on both,\n"
    "the global batch split over all ranks' devices; rank 0 prints and writes the metrics.\n";

typedef struct train_opts {
    ch_train_config cfg;
    const char *data, *metrics, *log_dir, *resume, *plot, *dataset;
    ch_folder_options folder;
    bool resume_latest;
    bool resume_auto;
    bool overwrite;             /* a fresh run may replace the checkpoints in --checkpoint-dir */
    long train_limit, test_limit;
    ch_progress_mode progress;
    double progress_interval;
    bool dry_run;
    char resumed_model[64];     /* the checkpoint's model, when --resume stands for --model */
} train_opts;

enum {
    OPT_MODEL = 256, OPT_DATA, OPT_EPOCHS, OPT_LR, OPT_MOMENTUM, OPT_NESTEROV, OPT_WD, OPT_INIT,
    OPT_SEED, OPT_THREADS, OPT_TRAIN_LIMIT, OPT_TEST_LIMIT, OPT_METRICS, OPT_NAN_CHECK,
    OPT_NO_PROGRESS, OPT_PROGRESS, OPT_PROGRESS_INTERVAL, OPT_DEVICES, OPT_SYNC_BN, OPT_BUCKET_MB, OPT_TIMEOUT, OPT_LOG_DIR,
    OPT_CKPT_DIR, OPT_CKPT_EVERY, OPT_KEEP, OPT_RESUME, OPT_DRY_RUN, OPT_PLOT, OPT_TRACE,
    OPT_TRACE_STEPS, OPT_OPTIMIZER, OPT_DAMPENING, OPT_BETAS, OPT_EPS, OPT_SCHEDULE, OPT_STEP_SIZE,
    OPT_GAMMA, OPT_MILESTONES, OPT_T_MAX, OPT_ETA_MIN, OPT_WARMUP, OPT_SCALE_LR, OPT_DATASET,
    OPT_RANDOM_CROP, OPT_RANDOM_FLIP, OPT_NORMALIZE, OPT_IMAGE_SIZE, OPT_SKIP_BAD, OPT_ALLOW_NONFINITE,
    OPT_PRECISION, OPT_ACCUM, OPT_SHARES, OPT_GRAD_COMPRESS, OPT_ZERO, OPT_PS_SERVERS, OPT_PS_MODE, OPT_STALENESS,
    OPT_OVERWRITE,
};

static const struct option train_long[] = {
    { "model", required_argument, NULL, OPT_MODEL },
    { "data", required_argument, NULL, OPT_DATA },
    { "epochs", required_argument, NULL, OPT_EPOCHS },
    { "batch-size", required_argument, NULL, 'b' },
    { "lr", required_argument, NULL, OPT_LR },
    { "momentum", required_argument, NULL, OPT_MOMENTUM },
    { "nesterov", no_argument, NULL, OPT_NESTEROV },
    { "weight-decay", required_argument, NULL, OPT_WD },
    { "wd", required_argument, NULL, OPT_WD },
    { "init", required_argument, NULL, OPT_INIT },
    { "seed", required_argument, NULL, OPT_SEED },
    { "threads", required_argument, NULL, OPT_THREADS },
    { "devices", required_argument, NULL, OPT_DEVICES },
    { "sync-bn", no_argument, NULL, OPT_SYNC_BN },
    { "precision", required_argument, NULL, OPT_PRECISION },
    { "accum-steps", required_argument, NULL, OPT_ACCUM },
    { "shares", required_argument, NULL, OPT_SHARES },
    { "grad-compress", required_argument, NULL, OPT_GRAD_COMPRESS },
    { "zero", required_argument, NULL, OPT_ZERO },
    { "ps-servers", required_argument, NULL, OPT_PS_SERVERS },
    { "ps-mode", required_argument, NULL, OPT_PS_MODE },
    { "staleness", required_argument, NULL, OPT_STALENESS },
    { "bucket-mb", required_argument, NULL, OPT_BUCKET_MB },
    { "timeout", required_argument, NULL, OPT_TIMEOUT },
    { "log-dir", required_argument, NULL, OPT_LOG_DIR },
    { "checkpoint-dir", required_argument, NULL, OPT_CKPT_DIR },
    { "checkpoint-every", required_argument, NULL, OPT_CKPT_EVERY },
    { "keep", required_argument, NULL, OPT_KEEP },
    { "resume", optional_argument, NULL, OPT_RESUME },
    { "overwrite", no_argument, NULL, OPT_OVERWRITE },
    { "dry-run", no_argument, NULL, OPT_DRY_RUN },
    { "plot", required_argument, NULL, OPT_PLOT },
    { "trace", required_argument, NULL, OPT_TRACE },
    { "trace-steps", required_argument, NULL, OPT_TRACE_STEPS },
    { "optimizer", required_argument, NULL, OPT_OPTIMIZER },
    { "dampening", required_argument, NULL, OPT_DAMPENING },
    { "betas", required_argument, NULL, OPT_BETAS },
    { "eps", required_argument, NULL, OPT_EPS },
    { "schedule", required_argument, NULL, OPT_SCHEDULE },
    { "step-size", required_argument, NULL, OPT_STEP_SIZE },
    { "gamma", required_argument, NULL, OPT_GAMMA },
    { "milestones", required_argument, NULL, OPT_MILESTONES },
    { "t-max", required_argument, NULL, OPT_T_MAX },
    { "eta-min", required_argument, NULL, OPT_ETA_MIN },
    { "warmup-epochs", required_argument, NULL, OPT_WARMUP },
    { "scale-lr", no_argument, NULL, OPT_SCALE_LR },
    { "dataset", required_argument, NULL, OPT_DATASET },
    { "random-crop", required_argument, NULL, OPT_RANDOM_CROP },
    { "random-flip", no_argument, NULL, OPT_RANDOM_FLIP },
    { "normalize", required_argument, NULL, OPT_NORMALIZE },
    { "image-size", required_argument, NULL, OPT_IMAGE_SIZE },
    { "skip-bad-images", no_argument, NULL, OPT_SKIP_BAD },
    { "workers", required_argument, NULL, 'j' },
    { "train-limit", required_argument, NULL, OPT_TRAIN_LIMIT },
    { "test-limit", required_argument, NULL, OPT_TEST_LIMIT },
    { "metrics", required_argument, NULL, OPT_METRICS },
    { "nan-check", no_argument, NULL, OPT_NAN_CHECK },
    { "allow-nonfinite", no_argument, NULL, OPT_ALLOW_NONFINITE },
    { "no-progress", no_argument, NULL, OPT_NO_PROGRESS },
    { "progress", required_argument, NULL, OPT_PROGRESS },
    { "progress-interval", required_argument, NULL, OPT_PROGRESS_INTERVAL },
    { "help", no_argument, NULL, 'h' },
    { NULL, 0, NULL, 0 },
};

/* --betas B1,B2: two numbers in [0, 1). */
static bool parse_betas(const char *arg, ch_train_config *cfg)
{
    char a[64], b[64];
    const char *comma = strchr(arg, ',');
    if (!comma || (size_t)(comma - arg) >= sizeof a || strlen(comma + 1) >= sizeof b) {
        ch_cli_usage("cohort train: --betas '%s': expected B1,B2 (for example 0.9,0.999)\n", arg);
        return false;
    }
    snprintf(a, sizeof a, "%.*s", (int)(comma - arg), arg);
    snprintf(b, sizeof b, "%s", comma + 1);
    return ch_arg_double("train", "betas", a, 0, 0.999999999, &cfg->beta1) &&
           ch_arg_double("train", "betas", b, 0, 0.999999999, &cfg->beta2);
}

/* Returns -1 to go on, else the exit code. */
static int parse_one(int c, const char *arg, train_opts *o)
{
    ch_train_config *cfg = &o->cfg;
    long v;
    switch (c) {
    case OPT_MODEL: cfg->model = arg; return -1;
    case OPT_DATA: o->data = arg; return -1;
    case OPT_EPOCHS:
        if (!ch_arg_int("train", "epochs", arg, 0, 1000000, &v)) return CH_EXIT_USAGE;
        cfg->epochs = (int)v;
        return -1;
    case 'b':
        if (!ch_arg_int("train", "batch-size", arg, 1, 1 << 20, &v)) return CH_EXIT_USAGE;
        cfg->batch_size = (int)v;
        return -1;
    case OPT_ACCUM:
        if (!ch_arg_int("train", "accum-steps", arg, 1, 4096, &v)) return CH_EXIT_USAGE;
        cfg->accum_steps = (int)v;
        return -1;
    case OPT_LR: return ch_arg_double("train", "lr", arg, 0, 1e6, &cfg->lr) ? -1 : CH_EXIT_USAGE;
    case OPT_MOMENTUM:
        return ch_arg_double("train", "momentum", arg, 0, 0.999999, &cfg->momentum) ? -1 : CH_EXIT_USAGE;
    case OPT_NESTEROV: cfg->nesterov = true; return -1;
    case OPT_WD:
        return ch_arg_double("train", "weight-decay", arg, 0, 1e3, &cfg->weight_decay) ? -1 : CH_EXIT_USAGE;
    case OPT_INIT: cfg->init = arg; return -1;
    case OPT_SEED:
        if (!ch_arg_int("train", "seed", arg, 0, __LONG_MAX__, &v)) return CH_EXIT_USAGE;
        cfg->seed = (uint64_t)v;
        return -1;
    case OPT_THREADS:
        if (!ch_arg_int("train", "threads", arg, 1, 1024, &v)) return CH_EXIT_USAGE;
        cfg->threads = (int)v;
        return -1;
    case OPT_DEVICES: cfg->devices = arg; return -1;
    case OPT_SYNC_BN: cfg->sync_bn = true; return -1;
    case OPT_PRECISION: cfg->precision = arg; return -1;
    case OPT_SHARES:
        /* "" would read as no shares at all: as --accum-steps "" is, it is refused. */
        if (!*arg) {
            ch_cli_usage("cohort train: --shares '': expected auto or one whole number per rank (e.g. 3,1)\n");
            return CH_EXIT_USAGE;
        }
        cfg->shares = arg;
        return -1;
    case OPT_GRAD_COMPRESS: cfg->grad_compress = arg; return -1;
    case OPT_PS_SERVERS:
        if (!ch_arg_int("train", "ps-servers", arg, 1, CH_PS_MAX_SERVERS, &v)) return CH_EXIT_USAGE;
        cfg->ps_servers = (int)v;
        return -1;
    case OPT_PS_MODE: cfg->ps_mode = arg; return -1;
    case OPT_STALENESS:
        if (!ch_arg_int("train", "staleness", arg, 0, 1000000, &v)) return CH_EXIT_USAGE;
        cfg->staleness = (int)v;
        return -1;
    case OPT_ZERO:
        if (!ch_arg_int("train", "zero", arg, 0, 1, &v)) return CH_EXIT_USAGE;
        cfg->zero = (int)v;
        return -1;
    case OPT_BUCKET_MB:
        return ch_arg_double("train", "bucket-mb", arg, 0.001, 4096, &cfg->bucket_mb) ? -1 : CH_EXIT_USAGE;
    case OPT_TIMEOUT:
        return ch_arg_double("train", "timeout", arg, 0.1, 1e6, &cfg->timeout_s) ? -1 : CH_EXIT_USAGE;
    case OPT_LOG_DIR: o->log_dir = arg; return -1;
    case OPT_CKPT_DIR: cfg->checkpoint_dir = arg; return -1;
    case OPT_CKPT_EVERY:
        if (!ch_arg_int("train", "checkpoint-every", arg, 1, 1L << 40, &v)) return CH_EXIT_USAGE;
        cfg->checkpoint_every = (int)(v > 1 << 30 ? 1 << 30 : v);
        return -1;
    case OPT_KEEP:
        if (!ch_arg_int("train", "keep", arg, 1, 1000000, &v)) return CH_EXIT_USAGE;
        cfg->keep = (int)v;
        return -1;
    case OPT_OVERWRITE: o->overwrite = true; return -1;
    case OPT_RESUME:
        /* "auto": the folder's latest checkpoint if there is one, else a fresh start ("./auto" is
         * a checkpoint of that name) */
        o->resume_auto = arg && strcmp(arg, "auto") == 0;
        o->resume = o->resume_auto ? NULL : arg;
        o->resume_latest = arg == NULL;
        return -1;
    case OPT_TRAIN_LIMIT:
        return ch_arg_int("train", "train-limit", arg, 1, __LONG_MAX__, &o->train_limit) ? -1 : CH_EXIT_USAGE;
    case OPT_TEST_LIMIT:
        return ch_arg_int("train", "test-limit", arg, 1, __LONG_MAX__, &o->test_limit) ? -1 : CH_EXIT_USAGE;
    case OPT_METRICS: o->metrics = arg; return -1;
    case OPT_NAN_CHECK: cfg->nan_check = true; return -1;
    case OPT_ALLOW_NONFINITE: cfg->allow_nonfinite = true; return -1;
    case OPT_NO_PROGRESS: o->progress = CH_PROGRESS_NONE; return -1;
    case OPT_PROGRESS:
        if (ch_progress_parse(arg, &o->progress)) return -1;
        ch_cli_usage("cohort train: --progress '%s': expected auto, bar, lines or none\n", arg);
        return CH_EXIT_USAGE;
    case OPT_PROGRESS_INTERVAL:
        return ch_arg_double("train", "progress-interval", arg, 0.1, 86400, &o->progress_interval) ? -1 : CH_EXIT_USAGE;
    case OPT_DRY_RUN: o->dry_run = true; return -1;
    case OPT_PLOT: o->plot = arg; return -1;
    case OPT_OPTIMIZER: cfg->optimizer = arg; return -1;
    case OPT_DAMPENING:
        return ch_arg_double("train", "dampening", arg, 0, 1, &cfg->dampening) ? -1 : CH_EXIT_USAGE;
    case OPT_BETAS: return parse_betas(arg, cfg) ? -1 : CH_EXIT_USAGE;
    case OPT_EPS: return ch_arg_double("train", "eps", arg, 0, 1, &cfg->eps) ? -1 : CH_EXIT_USAGE;
    case OPT_SCHEDULE: cfg->schedule = arg; return -1;
    case OPT_STEP_SIZE:
        if (!ch_arg_int("train", "step-size", arg, 1, 1000000, &v)) return CH_EXIT_USAGE;
        cfg->step_size = (int)v;
        return -1;
    case OPT_GAMMA: return ch_arg_double("train", "gamma", arg, 1e-9, 1e3, &cfg->gamma) ? -1 : CH_EXIT_USAGE;
    case OPT_MILESTONES: cfg->milestones = arg; return -1;
    case OPT_T_MAX:
        if (!ch_arg_int("train", "t-max", arg, 1, 1000000, &v)) return CH_EXIT_USAGE;
        cfg->t_max = (int)v;
        return -1;
    case OPT_ETA_MIN: return ch_arg_double("train", "eta-min", arg, 0, 1e6, &cfg->eta_min) ? -1 : CH_EXIT_USAGE;
    case OPT_WARMUP:
        if (!ch_arg_int("train", "warmup-epochs", arg, 0, 1000000, &v)) return CH_EXIT_USAGE;
        cfg->warmup_epochs = (int)v;
        return -1;
    case OPT_SCALE_LR: cfg->scale_lr = true; return -1;
    case OPT_DATASET: o->dataset = arg; return -1;
    case OPT_RANDOM_CROP:
        if (!ch_arg_int("train", "random-crop", arg, 0, 1024, &v)) return CH_EXIT_USAGE;
        cfg->random_crop = (int)v;
        return -1;
    case OPT_RANDOM_FLIP: cfg->random_flip = true; return -1;
    case OPT_NORMALIZE: cfg->normalize = arg; return -1;
    case OPT_IMAGE_SIZE:
        if (!ch_arg_int("train", "image-size", arg, 8, 4096, &v)) return CH_EXIT_USAGE;
        o->folder.image_size = (int)v;
        return -1;
    case OPT_SKIP_BAD: o->folder.skip_bad_images = true; return -1;
    case 'j':
        if (!ch_arg_int("train", "workers", arg, 0, 64, &v)) return CH_EXIT_USAGE;
        cfg->loader_workers = (int)v;
        return -1;
    case OPT_TRACE: cfg->trace = arg; return -1;
    case OPT_TRACE_STEPS:
        if (!ch_arg_int("train", "trace-steps", arg, 1, 100000, &v)) return CH_EXIT_USAGE;
        cfg->trace_steps = (int)v;
        return -1;
    case 'h': fputs(train_usage, stdout); return CH_EXIT_OK;
    default:
        ch_cli_usage("cohort train: unknown or incomplete option (see cohort train --help)\n");
        return CH_EXIT_USAGE;
    }
}

static int parse_train(int argc, char **argv, train_opts *o)
{
    *o = (train_opts){ .cfg = ch_train_config_default(), .folder = ch_folder_options_default(),
                       .progress = CH_PROGRESS_AUTO, .progress_interval = 10 };
    o->cfg.model = NULL;
    optind = 1;
    opterr = 0;
    int c;
    while ((c = getopt_long(argc, argv, ":b:j:h", train_long, NULL)) != -1) {
        /* --resume PATH, as well as --resume=PATH: a following word that is no option is its PATH. */
        const char *arg = optarg;
        if (c == OPT_RESUME && !arg && optind < argc && argv[optind][0] != '-') arg = argv[optind++];
        int rc = parse_one(c, arg, o);
        if (rc >= 0) return rc;
    }
    if (optind < argc) {
        ch_cli_usage("cohort train: unexpected argument '%s'\n", argv[optind]);
        return CH_EXIT_USAGE;
    }
    if ((!o->cfg.model && !o->resume && !o->resume_latest && !o->resume_auto) || !o->data) {
        ch_cli_usage("cohort train: --model (or --resume) and --data are required (see cohort train --help)\n");
        return CH_EXIT_USAGE;
    }
    if ((o->resume_latest || o->resume_auto) && !o->cfg.checkpoint_dir) {
        ch_cli_usage("cohort train: --resume %s needs --checkpoint-dir\n", o->resume_auto ? "auto" : "without a PATH");
        return CH_EXIT_USAGE;
    }
    if ((o->cfg.checkpoint_every || o->cfg.keep) && !o->cfg.checkpoint_dir) {
        ch_cli_usage("cohort train: --checkpoint-every and --keep need --checkpoint-dir\n");
        return CH_EXIT_USAGE;
    }
    return -1;
}

/* "epoch 3, loss ..., 14630 img/s on [cpu:0, cpu:1]" (" x 2 ranks" after the devices of a job,
 * " x 2 workers + 1 parameter server (sync)" with servers). */
static void format_epoch(char *line, size_t len, const ch_epoch_stats *s, const ch_trainer *t)
{
    const char *devices = ch_trainer_devices(t);
    char ranks[80] = "";
    int servers = 0;
    const char *ps = ch_trainer_ps(t, &servers);
    if (ps)
        snprintf(ranks, sizeof ranks, " x %d worker%s + %d parameter server%s (%s)", ch_world_size() - servers,
                 ch_world_size() - servers > 1 ? "s" : "", servers, servers > 1 ? "s" : "", ps);
    else if (ch_world_size() > 1)
        snprintf(ranks, sizeof ranks, " x %d ranks", ch_world_size());
    /* A loss that is not finite means the run diverged: say so where the user looks. */
    const char *diverged = isfinite(s->loss) ? "" : " (not finite: training diverged; a lower --lr or "
                                                   "--nan-check to stop at once)";
    snprintf(line, len,
             "epoch %d, loss %.4f%s, train acc %.4f, test acc %.4f, time %.1f sec, %.0f img/s on [%s]%s",
             s->epoch, s->loss, diverged, s->train_acc, s->test_acc, s->time_s, s->images_per_s, devices, ranks);
}

static bool write_metrics(FILE *f, const ch_epoch_stats *s, const ch_device_list *devices, const char *shares,
                          const char *compress, const ch_trainer *t)
{
    /* JSON has no NaN: a diverged epoch's loss is null. */
    char loss[32] = "null";
    if (isfinite(s->loss)) snprintf(loss, sizeof loss, "%.6f", s->loss);
    fprintf(f,
            "{\"epoch\": %d, \"loss\": %s, \"train_acc\": %.6f, \"test_acc\": %.6f, "
            "\"time_s\": %.4f, \"images_per_s\": %.2f, \"lr\": %.8g, \"data_wait_s\": %.4f, \"devices\": [",
            s->epoch, loss, s->train_acc, s->test_acc, s->time_s, s->images_per_s, s->lr, s->data_wait_s);
    for (int i = 0; i < devices->count; i++)
        fprintf(f, "%s\"cpu:%d\"", i ? ", " : "", devices->dev[i].index);
    fprintf(f, "], \"ranks\": %d", ch_world_size());
    if (*shares) fprintf(f, ", \"shares\": [%s]", shares);
    if (strcmp(compress, "none") != 0) fprintf(f, ", \"grad_compress\": \"%s\"", compress);
    fprintf(f, ", \"optimizer_bytes\": %zu", ch_trainer_optimizer_bytes(t));
    if (ch_trainer_zero(t)) fprintf(f, ", \"zero\": %d", ch_trainer_zero(t));
    int servers = 0;
    const char *ps = ch_trainer_ps(t, &servers);
    if (ps) fprintf(f, ", \"ps_servers\": %d, \"ps_mode\": \"%s\"", servers, ps);
    fprintf(f, "}\n");
    return fflush(f) == 0 && !ferror(f);
}

/* Redraw the chart with the epochs so far (rank 0). */
static int redraw_plot(const train_opts *o, ch_trainer *t, ch_plot_run *curve, const ch_epoch_stats *s)
{
    ch_err err;
    char title[256];
    char ranks[32] = "";
    if (ch_world_size() > 1) snprintf(ranks, sizeof ranks, " x %d ranks", ch_world_size());
    snprintf(title, sizeof title, "%s on [%s]%s, batch %d, lr %g", o->cfg.model, ch_trainer_devices(t), ranks,
             o->cfg.batch_size, o->cfg.lr);
    ch_status st = ch_plot_add(curve, s->epoch, s->loss, s->train_acc, s->test_acc, &err);
    if (st == CH_STATUS_OK) st = ch_plot_write_svg(o->plot, title, curve, 1, &err);
    return st == CH_STATUS_OK ? CH_EXIT_OK : ch_exit_for("train", st, &err);
}

static int run_epochs(const train_opts *o, ch_trainer *t, FILE *metrics, ch_plot_run *curve);

/* --skip-bad-images: how many files were replaced, said once at the end (by every rank: each
 * decodes its own share). */
void ch_cli_report_left_out(const char *cmd, const ch_dataset *d, const char *which)
{
    char first[1100], line[1400];
    const size_t n = ch_dataset_left_out(d, first, sizeof first);
    if (!n) return;
    snprintf(line, sizeof line, "cohort %s: left out %zu %s entr%s named like an image that %s no regular file (the "
             "first: %.1000s)", cmd, n, which, n == 1 ? "y" : "ies", n == 1 ? "is" : "are", first);
    if (ch_world_rank() == 0) fprintf(stderr, "%s\n", line);
    ch_world_log(line);
}

static void report_skipped(const ch_dataset *train, const ch_dataset *test)
{
    const ch_dataset *sets[2] = { train, test };
    const char *names[2] = { "training", "test" };
    for (int i = 0; i < 2; i++) {
        char first[512];
        const size_t n = ch_dataset_skipped(sets[i], first, sizeof first);
        if (!n) continue;
        char line[800];
        snprintf(line, sizeof line, "cohort train: skipped %zu %s image%s that did not decode (the first: %.500s)",
                 n, names[i], n == 1 ? "" : "s", first);
        fprintf(stderr, "%s\n", line);
        ch_world_log(line);
    }
}

static int run_training(const train_opts *o, ch_trainer *t, FILE *metrics)
{
    ch_plot_run curve = { 0 };
    int rc = run_epochs(o, t, metrics, &curve);
    ch_plot_run_free(&curve);
    /* A run shorter than --trace-steps writes what it has. */
    ch_err err;
    if (rc == CH_EXIT_OK && o->cfg.trace) rc = ch_exit_for("train", ch_trainer_write_trace(t, &err), &err);
    return rc;
}

/* --shares: every rank logs the shares in use and its part; rank 0 says when auto moved them. */
static void report_shares(const ch_trainer *t, const ch_epoch_stats *s, const char *shares, char *last, bool root)
{
    size_t train_n, test_n;
    ch_trainer_share(t, &train_n, &test_n);
    char line[512];
    snprintf(line, sizeof line, "epoch %d ended with shares %s, at which this rank trains on %zu samples per epoch", s->epoch,
             shares, train_n);
    ch_world_log(line);
    if (root && *last && strcmp(last, shares) != 0) printf("shares now %s (were %s)\n", shares, last);
    snprintf(last, 256, "%s", shares);
}

static int run_epochs(const train_opts *o, ch_trainer *t, FILE *metrics, ch_plot_run *curve)
{
    char last_shares[256];
    ch_trainer_shares(t, last_shares, sizeof last_shares);
    ch_progress bar;
    const bool root = ch_world_rank() == 0;
    ch_progress_init(&bar, o->progress, o->progress_interval, root);
    bar.epochs = o->cfg.epochs;
    ch_trainer_set_progress(t, ch_progress_update, &bar);
    if (root && ch_trainer_epochs_done(t) >= o->cfg.epochs) {
        if (o->resume || o->resume_latest || o->resume_auto)
            printf("cohort train: the checkpoint has %d epochs done and --epochs is %d: nothing to train\n",
                   ch_trainer_epochs_done(t), o->cfg.epochs);
        else
            printf("cohort train: --epochs %d: nothing to train\n", o->cfg.epochs);
    }
    for (int e = ch_trainer_epochs_done(t); e < o->cfg.epochs; e++) {
        ch_progress_epoch(&bar, e + 1);
        ch_epoch_stats s;
        ch_err err;
        ch_status st = ch_trainer_run_epoch(t, &s, &err);
        ch_progress_clear(&bar);
        if (st != CH_STATUS_OK) return ch_exit_for("train", st, &err);
        char line[400];
        format_epoch(line, sizeof line, &s, t);
        ch_world_log(line);
        if (root) {
            puts(line);
            fflush(stdout);
            if (o->plot && redraw_plot(o, t, curve, &s) != CH_EXIT_OK) return CH_EXIT_FAIL;
        }
        char shares[256];
        if (ch_trainer_shares(t, shares, sizeof shares)) report_shares(t, &s, shares, last_shares, root);
        if (metrics && !write_metrics(metrics, &s, ch_trainer_device_list(t), shares, ch_trainer_grad_compress(t), t)) {
            fprintf(stderr, "cohort train: %s: write failed\n", o->metrics);
            return CH_EXIT_FAIL;
        }
    }
    return CH_EXIT_OK;
}

/* DIR/workerlog.RANK, truncated: this run's log of this rank (Paddle's launch convention). */
static ch_status open_worker_log(const char *dir, FILE **out, ch_err *err)
{
    if (mkdir(dir, 0777) != 0 && errno != EEXIST)
        return ch_fail(err, CH_STATUS_BAD_INPUT, "--log-dir %s: cannot create (%s)", dir, strerror(errno));
    char path[4096];
    snprintf(path, sizeof path, "%s/workerlog.%d", dir, ch_world_rank());
    if (!(*out = fopen(path, "w")))
        return ch_fail(err, CH_STATUS_BAD_INPUT, "%s: cannot open for writing (%s)", path, strerror(errno));
    ch_world_set_log(*out);
    return CH_STATUS_OK;
}

/* Who this rank is and what it trains on: the head of its worker log. */
static void log_identity(const ch_trainer *t, const ch_dataset *train, const ch_dataset *test)
{
    size_t train_n, test_n;
    ch_trainer_share(t, &train_n, &test_n);
    char line[1024];
    snprintf(line, sizeof line,
             "rank %d of %d, local rank %d of %d, host %s, pid %ld, devices [%s]; per epoch it "
             "trains on %zu of %zu training samples and evaluates %zu of %zu test samples",
             ch_world_rank(), ch_world_size(), ch_world_local_rank(), ch_world_local_size(),
             ch_world_host(), (long)getpid(), ch_trainer_devices(t), train_n,
             ch_dataset_size(train), test_n, ch_dataset_size(test));
    ch_world_log(line);
    int servers = 0;
    const char *ps = ch_trainer_ps(t, &servers);
    if (ps) {
        snprintf(line, sizeof line, "a worker of %d parameter server%s (%s), ranks %d..%d%s", servers,
                 servers > 1 ? "s" : "", ps, ch_world_size() - servers, ch_world_size() - 1,
                 strcmp(ps, "async") == 0 ? "; async: the samples it trains depend on what it claims" : "");
        ch_world_log(line);
    }
}

/* Every file the run will write, checked before any data is read or any epoch trained: a bad path
 * is one line and exit 2 at once, not after the first epoch. Rank 0 writes the chart and the
 * metrics, and the trace (the other ranks send it their parts over MPI). */
static ch_status check_outputs(const train_opts *o, ch_err *err)
{
    const bool root = ch_world_rank() == 0;
    if (o->plot && root) CH_TRY(ch_out_check(o->plot, "--plot", err));
    if (o->metrics && root && !o->dry_run) CH_TRY(ch_out_check(o->metrics, "--metrics", err));
    if (o->cfg.trace && root) CH_TRY(ch_out_check(o->cfg.trace, "--trace", err));
    return CH_STATUS_OK;
}

/* --resume without --model: the checkpoint's model (its graph.json, or a zoo name). */
static ch_status resumed_model(train_opts *o, ch_graph **g, ch_err *err)
{
    const char *path = o->resume ? o->resume : o->cfg.checkpoint_dir;
    if (o->resume_auto && !ch_checkpoint_has_latest(path))
        return ch_fail(err, CH_STATUS_BAD_INPUT, "--resume auto: %s has no checkpoint yet, so --model is needed to "
                       "start", path);
    char normalize[256];
    int classes, side;
    CH_TRY(ch_checkpoint_peek(path, o->resumed_model, sizeof o->resumed_model, &classes, normalize, sizeof normalize,
                              &side, err));
    o->cfg.model = o->resumed_model;
    return ch_checkpoint_graph(path, g, err);
}

int ch_cmd_train(int argc, char **argv)
{
    train_opts o;
    int rc = parse_train(argc, argv, &o);
    rc = ch_cli_parsed("train", rc, o.cfg.timeout_s > 0 ? o.cfg.timeout_s : 300);
    if (rc >= 0) return rc;
    ch_err err;
    if (check_outputs(&o, &err) != CH_STATUS_OK) return ch_exit_for("train", CH_STATUS_BAD_INPUT, &err);
    ch_dataset *train = NULL, *test = NULL;
    ch_trainer *t = NULL;
    FILE *metrics = NULL, *log = NULL;
    ch_graph *graph = NULL;
    ch_status st = o.log_dir ? open_worker_log(o.log_dir, &log, &err) : CH_STATUS_OK;
    /* An ONNX file is read before the data: a file that will not import fails at once. */
    if (st == CH_STATUS_OK) st = o.cfg.model ? ch_cli_model(o.cfg.model, &graph, &err) : resumed_model(&o, &graph, &err);
    o.cfg.graph = graph;
    /* --train-limit and --test-limit read only what they keep. */
    ch_folder_options train_load = o.folder, test_load = o.folder;
    train_load.limit = (size_t)o.train_limit;
    test_load.limit = (size_t)o.test_limit;
    if (st == CH_STATUS_OK) st = ch_dataset_load(o.data, o.dataset, CH_SPLIT_TRAIN, &train_load, &train, &err);
    if (st == CH_STATUS_OK) st = ch_dataset_load(o.data, o.dataset, CH_SPLIT_TEST, &test_load, &test, &err);
    if (st == CH_STATUS_OK) {
        ch_cli_report_left_out("train", train, "training");
        ch_cli_report_left_out("train", test, "test");
        ch_dataset_truncate(train, (size_t)o.train_limit);
        ch_dataset_truncate(test, (size_t)o.test_limit);
        st = ch_trainer_create(&o.cfg, train, test, &t, &err);
    }
    /* A parameter server's trainer has served the whole job inside ch_trainer_create. */
    const bool server = st == CH_STATUS_OK && ch_trainer_is_ps_server(t);
    if (st == CH_STATUS_OK && !server && (o.resume || o.resume_latest))
        st = ch_trainer_resume(t, o.resume ? o.resume : o.cfg.checkpoint_dir, &err);
    bool resumed = o.resume || o.resume_latest;
    if (st == CH_STATUS_OK && !server && o.resume_auto) {
        st = ch_trainer_resume_auto(t, o.cfg.checkpoint_dir, &resumed, &err);
        /* Without latest, epoch folders there are another run's (or one that lost latest). */
        if (st == CH_STATUS_OK && !resumed) st = ch_trainer_start_fresh(t, o.overwrite, &err);
        if (st == CH_STATUS_OK && ch_world_rank() == 0)
            printf(resumed ? "cohort train: --resume auto: resuming from %s (%d epochs done)\n"
                           : "cohort train: --resume auto: no checkpoint in %s yet, starting fresh\n",
                   o.cfg.checkpoint_dir, ch_trainer_epochs_done(t));
    } else if (st == CH_STATUS_OK && !server && !resumed && !o.dry_run) {
        st = ch_trainer_start_fresh(t, o.overwrite, &err);
    }
    if (st == CH_STATUS_OK && !server) log_identity(t, train, test);
    if (st == CH_STATUS_OK && o.metrics && !o.dry_run && ch_world_rank() == 0 && !(metrics = fopen(o.metrics, "a")))
        st = ch_fail(&err, CH_STATUS_BAD_INPUT, "%s: cannot open for writing (%s)", o.metrics,
                     strerror(errno));
    if (server) {
        rc = CH_EXIT_OK;
    } else if (st == CH_STATUS_OK && o.dry_run) {
        ch_cli_print_summary(t);
        rc = CH_EXIT_OK;
    } else {
        rc = st == CH_STATUS_OK ? run_training(&o, t, metrics) : ch_exit_for("train", st, &err);
        report_skipped(train, test);
    }
    if (metrics) fclose(metrics);
    ch_world_set_log(NULL);
    if (log) fclose(log);
    ch_trainer_free(t);
    ch_graph_free(graph);
    ch_dataset_free(train);
    ch_dataset_free(test);
    return rc;
}
