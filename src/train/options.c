/* The option table (options.h): the rows, in the order of help's sections, and what reads them
 * inside the library (values, defaults, the configuration's ranges). */
#include "train/options.h"

#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "train/ps.h"

#include <cjson/cJSON.h>

static bool parse_shares(const char *arg, ch_opt_values *v, char *why, size_t len);
static bool parse_betas(const char *arg, ch_opt_values *v, char *why, size_t len);
static void show_betas(const ch_train_config *c, char *buf, size_t len);
static bool parse_resume(const char *arg, ch_opt_values *v, char *why, size_t len);
static bool parse_no_progress(const char *arg, ch_opt_values *v, char *why, size_t len);

#define CFG(f) .where = CH_IN_CFG, .offset = offsetof(ch_train_config, f)
#define FOLDER(f) .where = CH_IN_FOLDER, .offset = offsetof(ch_folder_options, f)
#define CLI(f) .where = CH_IN_CLI, .offset = offsetof(ch_cli_values, f)
#define T CH_CMD_TRAIN
#define E CH_CMD_EVAL
#define B CH_CMD_BENCH

static const ch_opt table[] = {
    /* MODEL AND DATA */
    { .name = "model", .cmds = T, .type = CH_OPT_STR, CFG(model), .section = CH_SEC_DATA, .arg = "NAME|FILE.onnx",
      .brief = "lenet | mnist-cnn | resnet18 | mlp | linear | resnet18-imagenet, or your own model as FILE.onnx, "
               "exported by PyTorch in training mode (see the README)",
      .more = "resnet18-imagenet is torchvision's ResNet-18, for RGB images. FILE.onnx: torch.onnx.export in "
              "training mode with the batch dynamic; the README gives the call",
      .dflt = "required, or --resume" },
    { .name = "model", .cmds = B, .type = CH_OPT_STR, CFG(model), .section = CH_SEC_DATA, .arg = "NAME|FILE.onnx",
      .brief = "the model to time: a name of the zoo or FILE.onnx" },
    { .name = "model", .cmds = E, .type = CH_OPT_STR, CFG(model), .section = CH_SEC_DATA, .arg = "NAME|FILE.onnx",
      .brief = "the architecture, for a bare safetensors file; beside a checkpoint directory, a model that "
               "must be the checkpoint's", .dflt = "" },
    { .name = "checkpoint", .cmds = E, .type = CH_OPT_STR, CLI(checkpoint), .section = CH_SEC_DATA, .arg = "PATH",
      .brief = "a checkpoint directory (DIR/epoch-0003), a --checkpoint-dir (its latest), or a safetensors "
               "state_dict file (then --model is needed; a PyTorch `module.` prefix is stripped)",
      .dflt = "required" },
    { .name = "data", .cmds = T | E, .type = CH_OPT_STR, CLI(data), .agree = CH_AGREE_NONE, .section = CH_SEC_DATA,
      .arg = "DIR",
      .brief = "the data set: IDX files (train-/t10k- images and labels, .gz or raw), CIFAR-10 binary batches "
               "(data_batch_N.bin, test_batch.bin) or an ImageFolder (DIR/train/CLASS/*.png|jpg, "
               "DIR/val/CLASS/...)",
      .more = "CIFAR-10's batches may also be in DIR/cifar-10-batches-bin; an ImageFolder's files may be at "
              "any depth, classes sorted by name (torchvision's ImageFolder). Every rank reads its own copy: "
              "the ranks compare what they read",
      .dflt = "required" },
    { .name = "dataset", .cmds = T | E, .type = CH_OPT_STR, CLI(dataset), .section = CH_SEC_DATA, .arg = "KIND",
      .brief = "auto | idx | cifar10 | imagefolder", .dflt = "auto: what DIR holds" },
    { .name = "image-size", .cmds = T, .type = CH_OPT_INT, FOLDER(image_size), .lo = 8, .hi = 4096,
      .section = CH_SEC_DATA, .arg = "N",
      .brief = "ImageFolder: RandomResizedCrop(N) for training, Resize(N*256/224) + CenterCrop(N) for evaluation",
      .more = "RandomResizedCrop takes scale 0.08-1, ratio 3/4-4/3, bilinear; images are decoded when a batch "
              "needs them" },
    { .name = "image-size", .cmds = E, .type = CH_OPT_INT, FOLDER(image_size), .lo = 8, .hi = 4096,
      .section = CH_SEC_DATA, .arg = "N", .brief = "ImageFolder: Resize(N*256/224) + CenterCrop(N)",
      .dflt = "the checkpoint's input size; 224 for a bare safetensors file" },
    { .name = "skip-bad-images", .cmds = T | E, .type = CH_OPT_FLAG, FOLDER(skip_bad_images), .section = CH_SEC_DATA,
      .brief = "ImageFolder: replace a file that does not decode by the next sample and count it",
      .dflt = "stop with an error naming the file" },
    { .name = "workers", .short_name = 'j', .cmds = T, .type = CH_OPT_INT, CFG(loader_workers), .lo = 0, .hi = 64,
      .agree = CH_AGREE_NONE, .section = CH_SEC_DATA, .arg = "N",
      .brief = "loader threads that decode and augment the next batches ahead of the step",
      .more = "They fill a ring of 2 batch buffers; the results do not depend on N",
      .dflt = "0: each device gathers its own slice" },
    { .name = "train-limit", .cmds = T, .type = CH_OPT_LONG, CLI(train_limit), .lo = 1, .hi = (double)LONG_MAX,
      .section = CH_SEC_DATA, .arg = "N", .brief = "use only the first N training samples", .dflt = "all" },
    { .name = "test-limit", .cmds = T | E, .type = CH_OPT_LONG, CLI(test_limit), .lo = 1, .hi = (double)LONG_MAX,
      .section = CH_SEC_DATA, .arg = "N", .brief = "evaluate on the first N test samples only", .dflt = "all" },
    { .name = "init", .record = "init", .cmds = T, .type = CH_OPT_STR, CFG(init), .agree = CH_AGREE_VALUE, .section = CH_SEC_DATA,
      .arg = "SPEC",
      .brief = "default (PyTorch's) | normal:STD (weights N(0,STD), biases 0) | file (an ONNX model's own "
               "weights: what it starts from unless told)", .dflt = "" },
    { .name = "seed", .cmds = T, .type = CH_OPT_U64, CFG(seed), .lo = 0, .hi = (double)LONG_MAX,
      .agree = CH_AGREE_VALUE, .section = CH_SEC_DATA, .arg = "S", .brief = "seed of every random choice",
      .more = "the same command gives the same bits" },
    { .name = "shuffle", .cmds = T, .type = CH_OPT_CHOICE, CFG(in_order), .choices = "on|off",
      .agree = CH_AGREE_VALUE, .section = CH_SEC_DATA, .arg = "on|off",
      .brief = "off: every epoch takes the training samples in the data set's order, to compare a step with "
               "a program that does not shuffle",
      .more = "on: a permutation of the training set per epoch, keyed by (seed, epoch)" },

    /* OPTIMISATION */
    { .name = "epochs", .cmds = T, .type = CH_OPT_INT, CFG(epochs), .lo = 0, .hi = 1000000,
      .agree = CH_AGREE_VALUE, .section = CH_SEC_OPTIM, .arg = "N", .brief = "epochs to train",
      .more = "in all, counting those of a resumed checkpoint" },
    { .name = "batch-size", .record = "batch_size", .short_name = 'b', .cmds = T | E | B, .type = CH_OPT_INT, CFG(batch_size), .lo = 1,
      .hi = 1 << 20, .agree = CH_AGREE_VALUE, .section = CH_SEC_OPTIM, .arg = "B",
      .brief = "global batch size, split across every device of every rank" },
    { .name = "accum-steps", .cmds = T | B, .type = CH_OPT_INT, CFG(accum_steps), .lo = 1, .hi = 4096,
      .agree = CH_AGREE_VALUE, .section = CH_SEC_OPTIM, .arg = "K", .unset_ok = true,
      .brief = "run each device's part of a batch in K micro-batches and sync the summed gradient once",
      .more = "(DDP's no_sync); -b stays the global batch, memory holds one micro-batch (BatchNorm: per "
              "micro-batch, as PyTorch; exact for models without it)", .dflt = "1" },
    { .name = "shares", .cmds = T, .type = CH_OPT_SPECIAL, .parse = parse_shares, CFG(shares), .agree = CH_AGREE_VALUE,
      .section = CH_SEC_OPTIM, .arg = "auto|W0,W1,...",
      .brief = "each rank's part of every batch: one whole number per rank (3,1: rank 0 takes 3/4), or auto "
               "from measured step times; gradients stay exact",
      .more = "auto re-balances from each rank's step time after 20 steps and at every epoch end, and is not "
              "bit-reproducible", .dflt = "equal" },
    { .name = "lr", .record = "lr", .cmds = T, .type = CH_OPT_DOUBLE, CFG(lr), .lo = 0, .hi = 1e30, .agree = CH_AGREE_VALUE,
      .section = CH_SEC_OPTIM, .arg = "X", .brief = "learning rate" },
    { .name = "optimizer", .cmds = T, .type = CH_OPT_STR, CFG(optimizer), .agree = CH_AGREE_VALUE,
      .section = CH_SEC_OPTIM, .arg = "NAME", .brief = "sgd | adam | adamw | adagrad, PyTorch's rules",
      .more = "(torch.optim)", .dflt = "sgd" },
    { .name = "momentum", .record = "momentum", .cmds = T, .type = CH_OPT_DOUBLE, CFG(momentum), .lo = 0, .hi = 0.999999,
      .agree = CH_AGREE_VALUE, .section = CH_SEC_OPTIM, .arg = "M", .brief = "SGD momentum, PyTorch semantics" },
    { .name = "nesterov", .record = "nesterov", .cmds = T, .type = CH_OPT_FLAG, CFG(nesterov), .agree = CH_AGREE_VALUE,
      .section = CH_SEC_OPTIM, .brief = "Nesterov momentum", .dflt = "off" },
    { .name = "dampening", .record = "dampening", .cmds = T, .type = CH_OPT_DOUBLE, CFG(dampening), .lo = 0, .hi = 1,
      .agree = CH_AGREE_VALUE, .section = CH_SEC_OPTIM, .arg = "D", .brief = "SGD momentum dampening" },
    { .name = "betas", .record = "beta1,beta2", .cmds = T, .type = CH_OPT_SPECIAL, .parse = parse_betas, .show = show_betas, CFG(beta1),
      .agree = CH_AGREE_VALUE,
      .section = CH_SEC_OPTIM, .arg = "B1,B2", .brief = "Adam/AdamW betas, each in [0, 1)", .dflt = "0.9,0.999" },
    { .name = "eps", .record = "eps", .cmds = T, .type = CH_OPT_DOUBLE, CFG(eps), .lo = 0, .hi = 1, .agree = CH_AGREE_VALUE,
      .section = CH_SEC_OPTIM, .arg = "E", .brief = "Adam/AdamW/Adagrad epsilon", .dflt = "1e-8; Adagrad 1e-10" },
    { .name = "weight-decay", .record = "weight_decay", .alias = "wd", .cmds = T, .type = CH_OPT_DOUBLE, CFG(weight_decay), .lo = 0,
      .hi = 1e3, .agree = CH_AGREE_VALUE, .section = CH_SEC_OPTIM, .arg = "W", .brief = "L2 weight decay",
      .more = "AdamW: decoupled", .dflt = "0; AdamW 0.01" },
    { .name = "schedule", .cmds = T, .type = CH_OPT_STR, CFG(schedule), .agree = CH_AGREE_VALUE,
      .section = CH_SEC_OPTIM, .arg = "NAME", .brief = "constant | step | multistep | cosine, per epoch",
      .more = "PyTorch's StepLR, MultiStepLR, CosineAnnealingLR stepped once per epoch", .dflt = "constant" },
    { .name = "step-size", .cmds = T, .type = CH_OPT_INT, CFG(step_size), .lo = 1, .hi = 1000000,
      .agree = CH_AGREE_VALUE, .section = CH_SEC_OPTIM, .arg = "N", .unset_ok = true,
      .brief = "step: epochs between decays", .dflt = "required by step" },
    { .name = "gamma", .cmds = T, .type = CH_OPT_DOUBLE, CFG(gamma), .lo = 1e-9, .hi = 1e3, .agree = CH_AGREE_VALUE,
      .section = CH_SEC_OPTIM, .arg = "G", .brief = "step, multistep: decay factor" },
    { .name = "milestones", .cmds = T, .type = CH_OPT_STR, CFG(milestones), .agree = CH_AGREE_VALUE,
      .section = CH_SEC_OPTIM, .arg = "LIST", .brief = "multistep: increasing epochs, like 30,60,90",
      .dflt = "required by multistep" },
    { .name = "t-max", .cmds = T, .type = CH_OPT_INT, CFG(t_max), .lo = 1, .hi = 1000000, .agree = CH_AGREE_VALUE,
      .section = CH_SEC_OPTIM, .arg = "N", .unset_ok = true, .brief = "cosine: epochs to the lowest rate",
      .dflt = "--epochs" },
    { .name = "eta-min", .cmds = T, .type = CH_OPT_DOUBLE, CFG(eta_min), .lo = 0, .hi = 1e6, .agree = CH_AGREE_VALUE,
      .section = CH_SEC_OPTIM, .arg = "X", .brief = "cosine: the lowest rate" },
    { .name = "warmup-epochs", .cmds = T, .type = CH_OPT_INT, CFG(warmup_epochs), .lo = 0, .hi = 1000000,
      .agree = CH_AGREE_VALUE, .section = CH_SEC_OPTIM, .arg = "N",
      .brief = "linear warmup per step over N epochs first",
      .more = "from lr/(N x steps) up to lr; then the schedule starts at its epoch 0" },
    { .name = "scale-lr", .cmds = T, .type = CH_OPT_FLAG, CFG(scale_lr), .agree = CH_AGREE_VALUE,
      .section = CH_SEC_OPTIM, .brief = "linear scaling rule: lr x global batch / 256", .dflt = "off" },
    { .name = "random-crop", .cmds = T, .type = CH_OPT_INT, CFG(random_crop), .lo = 0, .hi = 1024,
      .agree = CH_AGREE_VALUE, .section = CH_SEC_OPTIM, .arg = "PAD",
      .brief = "training: zero-pad by PAD, crop back at a random place",
      .more = "(torchvision's RandomCrop(size, padding=PAD))", .dflt = "0: none" },
    { .name = "random-flip", .cmds = T, .type = CH_OPT_FLAG, CFG(random_flip), .agree = CH_AGREE_VALUE,
      .section = CH_SEC_OPTIM, .brief = "training: flip horizontally with probability 1/2", .dflt = "off" },
    { .name = "normalize", .record = "normalize", .cmds = T, .type = CH_OPT_STR, CFG(normalize), .agree = CH_AGREE_VALUE,
      .section = CH_SEC_OPTIM, .arg = "SPEC",
      .brief = "imagenet | MEAN/STD per channel, like 0.49,0.48,0.45/0.25,0.24,0.26",
      .more = "x = (pixel / 255 - mean) / std, training and evaluation",
      .dflt = "pixel / 255; imagenet for an ImageFolder" },
    { .name = "normalize", .cmds = E, .type = CH_OPT_STR, CFG(normalize), .section = CH_SEC_OPTIM, .arg = "SPEC",
      .brief = "input normalization", .more = "needed for a bare .safetensors trained with one",
      .dflt = "the checkpoint's" },
    { .name = "nan-check", .cmds = T, .type = CH_OPT_FLAG, CFG(nan_check), .agree = CH_AGREE_VALUE,
      .section = CH_SEC_OPTIM, .brief = "stop with an error when the loss is not finite", .dflt = "off" },
    { .name = "allow-nonfinite", .cmds = T | E, .type = CH_OPT_FLAG, CFG(allow_nonfinite), .section = CH_SEC_OPTIM,
      .brief = "take a checkpoint holding NaN/Inf or a negative running_var",
      .dflt = "refused, naming the tensor" },

    /* DEVICES AND PROCESSES */
    { .name = "devices", .cmds = T | E | B, .type = CH_OPT_STR, CFG(devices), .section = CH_SEC_DEVICES,
      .arg = "LIST", .brief = "devices, one model replica each: cpu:0,cpu:1 | cpu:0-3 | cpu*4 | cuda:local",
      .more = "The global batch is split across them; under mpirun every rank has these devices, and "
              "cuda:local is each rank's own GPU, numbered by its local rank on its host" },
    { .name = "threads", .cmds = T | E | B, .type = CH_OPT_INT, CFG(threads), .lo = 1, .hi = 1024,
      .agree = CH_AGREE_NONE, .section = CH_SEC_DEVICES, .arg = "T", .unset_ok = true,
      .brief = "compute threads in all, shared out among the devices, at least one each",
      .dflt = "the cores this process may use, divided by the ranks on the host" },
    { .name = "sync-bn", .record = "sync_bn", .cmds = T | B, .type = CH_OPT_FLAG, CFG(sync_bn), .agree = CH_AGREE_VALUE,
      .section = CH_SEC_DEVICES, .brief = "BatchNorm batch statistics over the whole global batch",
      .dflt = "each device's own slice, as PyTorch DDP" },
    { .name = "precision", .cmds = T | E | B, .type = CH_OPT_STR, CFG(precision), .section = CH_SEC_DEVICES,
      .arg = "P", .brief = "fp32 | bf16: convolutions and large Linear layers multiply in bf16 where that is the faster",
      .more = "BatchNorm inputs are kept in bf16 from forward to backward, and a BatchNorm + ReLU output "
              "that a 3x3 Winograd convolution alone reads passes to it in bf16 (COHORT_BF16_INPUTS=off "
              "keeps it fp32); weights, gradients, optimizer "
              "state, BatchNorm statistics and the other activations stay fp32. Where the CPU's bf16 "
              "products run no faster than fp32 ones (Intel without AMX) the products stay fp32 "
              "(cohort info says; COHORT_BF16_PRODUCTS=on|off overrides). Refused on a CPU without native "
              "bf16, and on cuda devices (the CUDA plugin has no bf16 kernels yet). eval computes in fp32 unless given bf16, whatever the checkpoint was trained in",
      .dflt = "fp32" },
    { .name = "bucket-mb", .cmds = T, .type = CH_OPT_DOUBLE, CFG(bucket_mb), .lo = 0.001, .hi = 4096,
      .agree = CH_AGREE_VALUE, .section = CH_SEC_DEVICES, .arg = "M", .unset_ok = true,
      .brief = "gradient sync bucket size in MiB" },
    { .name = "grad-compress", .cmds = T | B, .type = CH_OPT_STR, CFG(grad_compress), .agree = CH_AGREE_VALUE,
      .section = CH_SEC_DEVICES, .arg = "C",
      .brief = "none | bf16 | bf16-ef: gradients travel between ranks as bf16 (half the bytes), summed in "
               "fp32; -ef adds error feedback",
      .more = "The owner of each chunk sums in rank order, so every rank gets the same bits; the error "
              "feedback is not in checkpoints. Replicas inside a process stay fp32", .dflt = "none" },
    { .name = "zero", .cmds = T, .type = CH_OPT_INT, CFG(zero), .lo = 0, .hi = 1, .agree = CH_AGREE_VALUE,
      .section = CH_SEC_DEVICES, .arg = "1",
      .brief = "shard the optimizer state over the replicas of the job (ZeRO stage 1): the same result, its "
               "memory divided",
      .more = "Each replica updates its shard of the parameters and the shards are gathered; checkpoints "
              "hold the whole state (resume with or without it)" },
    { .name = "ps-servers", .cmds = T, .type = CH_OPT_INT, CFG(ps_servers), .lo = 1, .hi = CH_PS_MAX_SERVERS,
      .agree = CH_AGREE_VALUE, .section = CH_SEC_DEVICES, .arg = "S", .unset_ok = true,
      .brief = "the last S ranks become parameter servers: they hold the parameters and optimizer state in "
               "shards; the others train",
      .more = "Workers push each gradient bucket to its servers as backward completes it and pull the "
              "updated parameters before the next step. Checkpoints hold the whole state (resume with or "
              "without servers)", .dflt = "none" },
    { .name = "ps-mode", .cmds = T, .type = CH_OPT_STR, CFG(ps_mode), .agree = CH_AGREE_VALUE,
      .section = CH_SEC_DEVICES, .arg = "M",
      .brief = "sync: the allreduce result | async: pushes applied on arrival; fast workers take more of the "
               "epoch",
      .more = "sync sums every worker's push of a step in worker order and updates once (float rounding)",
      .dflt = "sync" },
    { .name = "staleness", .cmds = T, .type = CH_OPT_INT, CFG(staleness), .lo = 0, .hi = 1000000,
      .agree = CH_AGREE_VALUE, .section = CH_SEC_DEVICES, .arg = "N",
      .brief = "async: a worker runs at most N steps ahead of the slowest", .dflt = "no bound" },
    { .name = "timeout", .cmds = T, .type = CH_OPT_DOUBLE, CFG(timeout_s), .lo = 0.1, .hi = 1e6,
      .agree = CH_AGREE_NONE, .section = CH_SEC_DEVICES, .arg = "SECONDS", .unset_ok = true,
      .brief = "end the job when an exchange between ranks takes longer (a stuck or lost rank)" },
    { .name = "log-dir", .cmds = T, .type = CH_OPT_STR, CLI(log_dir), .agree = CH_AGREE_NONE,
      .section = CH_SEC_DEVICES, .arg = "DIR", .brief = "every rank writes its own log to DIR/workerlog.RANK",
      .more = "rank, host, pid, devices, share of the data, epoch lines, errors" },

    /* CHECKPOINTS */
    { .name = "checkpoint-dir", .cmds = T, .type = CH_OPT_STR, CFG(checkpoint_dir), .agree = CH_AGREE_GIVEN,
      .section = CH_SEC_CHECKPOINTS, .arg = "DIR", .brief = "write a checkpoint DIR/epoch-NNNN after every epoch",
      .more = "(model.safetensors, optimizer.safetensors, trainer.json), atomically, and point DIR/latest at it" },
    { .name = "checkpoint-every", .cmds = T, .type = CH_OPT_INT, CFG(checkpoint_every), .lo = 1, .hi = 1 << 30,
      .agree = CH_AGREE_VALUE, .section = CH_SEC_CHECKPOINTS, .arg = "N", .unset_ok = true,
      .brief = "also DIR/step-NNNNNNNN every N steps", .dflt = "epoch ends only" },
    { .name = "keep", .cmds = T, .type = CH_OPT_INT, CFG(keep), .lo = 1, .hi = 1000000, .agree = CH_AGREE_NONE,
      .section = CH_SEC_CHECKPOINTS, .arg = "K", .unset_ok = true, .brief = "keep only the newest K checkpoints",
      .dflt = "all" },
    { .name = "resume", .cmds = T, .type = CH_OPT_SPECIAL, .parse = parse_resume, CLI(resume), .agree = CH_AGREE_GIVEN,
      .section = CH_SEC_CHECKPOINTS, .arg = "[PATH|auto]", .optional_arg = true,
      .brief = "continue from PATH (a checkpoint) or from the latest one in --checkpoint-dir; --epochs counts "
               "the epochs in all. auto: from the latest when there is one, else start fresh",
      .more = "With the same devices and ranks, bit for bit. auto is the same command run again after a "
              "failure (a restart loop, Slurm --requeue)", .dflt = "" },
    { .name = "overwrite", .cmds = T, .type = CH_OPT_FLAG, CLI(overwrite), .section = CH_SEC_CHECKPOINTS,
      .brief = "a fresh run may replace the checkpoints --checkpoint-dir holds",
      .dflt = "without it, and without --resume, such a folder is refused" },

    /* OUTPUT */
    { .name = "metrics", .cmds = T, .type = CH_OPT_STR, CLI(metrics), .agree = CH_AGREE_NONE,
      .section = CH_SEC_OUTPUT, .arg = "FILE", .brief = "append one JSON object per epoch (JSON Lines)",
      .more = "epoch, loss, train_acc, test_acc, time_s, images_per_s, devices, ranks" },
    { .name = "plot", .cmds = T, .type = CH_OPT_STR, CLI(plot), .agree = CH_AGREE_NONE, .section = CH_SEC_OUTPUT,
      .arg = "FILE.svg", .brief = "after every epoch, redraw the training curves as an SVG chart",
      .more = "train loss, train accuracy and test accuracy per epoch (cohort plot compares several runs)" },
    { .name = "trace", .cmds = T, .type = CH_OPT_STR, CFG(trace), .agree = CH_AGREE_GIVEN, .section = CH_SEC_OUTPUT,
      .arg = "FILE.json",
      .brief = "a timeline (Chrome trace format) of the first steps: data, forward, backward per layer, each "
               "bucket's sync, optimizer; per rank and device",
      .more = "(chrome://tracing, Perfetto). Every rank's part reaches rank 0 over MPI, which alone writes "
              "FILE.json" },
    { .name = "trace-steps", .cmds = T, .type = CH_OPT_INT, CFG(trace_steps), .lo = 1, .hi = 100000,
      .agree = CH_AGREE_VALUE, .section = CH_SEC_OUTPUT, .arg = "N", .brief = "steps in the trace" },
    { .name = "progress", .cmds = T, .type = CH_OPT_CHOICE, CLI(progress), .choices = "auto|bar|lines|none",
      .section = CH_SEC_OUTPUT, .arg = "MODE",
      .brief = "auto | bar | lines | none: progress inside an epoch on stderr; auto draws a bar on a terminal "
               "and prints lines elsewhere (batch logs, mpirun, srun)",
      .more = "Lines say \"progress: epoch E/N, step S/T (P%), loss, acc, img/s, elapsed, ETA\" (rank 0)" },
    { .name = "progress-interval", .cmds = T, .type = CH_OPT_DOUBLE, CLI(progress_interval), .lo = 0.1,
      .hi = 86400, .section = CH_SEC_OUTPUT, .arg = "S", .brief = "lines: at most one every S seconds" },
    { .name = "no-progress", .cmds = T, .type = CH_OPT_SPECIAL, .parse = parse_no_progress, CLI(progress),
      .section = CH_SEC_OUTPUT,
      .brief = "the same as --progress none", .dflt = "" },
    { .name = "dry-run", .cmds = T, .type = CH_OPT_FLAG, CLI(dry_run), .section = CH_SEC_OUTPUT,
      .brief = "print the model summary and the data and device plan, then exit",
      .more = "(layers, output shapes, parameters, FLOPs per image, memory per replica)", .dflt = "" },
    { .name = "per-class", .cmds = E, .type = CH_OPT_FLAG, CLI(per_class), .section = CH_SEC_OUTPUT,
      .brief = "a table of accuracy per class", .dflt = "" },

    /* BENCH */
    { .name = "steps", .cmds = B, .type = CH_OPT_LONG, CLI(steps), .lo = 1, .hi = 1000000, .section = CH_SEC_BENCH,
      .arg = "N", .brief = "steps timed" },
    { .name = "warmup", .cmds = B, .type = CH_OPT_LONG, CLI(warmup), .lo = 0, .hi = 1000000,
      .section = CH_SEC_BENCH, .arg = "W", .brief = "steps run before the timing starts" },
    { .name = "eval", .cmds = B, .type = CH_OPT_FLAG, CLI(eval_only), .section = CH_SEC_BENCH,
      .brief = "time forward-only evaluation batches", .dflt = "" },
    { .name = "skip-sync", .cmds = B, .type = CH_OPT_FLAG, CLI(skip_sync), .section = CH_SEC_BENCH,
      .brief = "leave out the gradient sync (the model does not train correctly then): what the sync costs",
      .dflt = "" },
};

#undef T
#undef E
#undef B

const ch_opt *ch_opt_table(int *count)
{
    *count = (int)(sizeof table / sizeof *table);
    return table;
}

const ch_opt *ch_opt_find(const char *name, unsigned cmd, int *index)
{
    const bool dash = name[0] == '-' && name[1] && name[1] != '-' && !name[2];
    for (int i = 0; i < (int)(sizeof table / sizeof *table); i++) {
        const ch_opt *o = &table[i];
        if (cmd && !(o->cmds & cmd)) continue;
        const bool hit = dash ? o->short_name == name[1]
                              : strcmp(o->name, name) == 0 || (o->alias && strcmp(o->alias, name) == 0);
        if (!hit) continue;
        if (index) *index = i;
        return o;
    }
    return NULL;
}

void ch_opt_defaults(unsigned cmd, ch_opt_values *v)
{
    *v = (ch_opt_values){ .cfg = ch_train_config_default(), .folder = ch_folder_options_default(),
                          .cli = { .progress_interval = 10, .steps = 20, .warmup = 3 } };
    /* train and eval: the model comes from --model or from the checkpoint. */
    if (cmd != CH_CMD_BENCH) v->cfg.model = NULL;
    else v->cfg.lr = 0.01;
}

static void *field(const ch_opt *o, ch_opt_values *v)
{
    char *base = o->where == CH_IN_CFG ? (char *)&v->cfg : o->where == CH_IN_FOLDER ? (char *)&v->folder
                                                                                    : (char *)&v->cli;
    return base + o->offset;
}

static bool starts_number(const char *s) { return *s == '-' || *s == '+' || *s == '.' || (*s >= '0' && *s <= '9'); }

/* A blank-led or empty one is refused: strtod and strtol would skip the blanks. */
bool ch_opt_read_number(const char *s, bool whole, double lo, double hi, double *out)
{
    char *end;
    errno = 0;
    double v;
    if (whole) {
        const long long n = strtoll(s, &end, 10);
        v = (double)n;
        if (!errno && (n < (long long)lo || (double)n > hi)) errno = ERANGE;
    } else {
        v = strtod(s, &end);
        if (!errno && (!isfinite(v) || v < lo || v > hi)) errno = ERANGE;
    }
    if (errno || end == s || *end || !starts_number(s)) return false;
    *out = v;
    return true;
}

/* An integer option's bound as printed: (double)LONG_MAX is 2^63, one past the largest long. */
static long long whole_bound(double b)
{
    return b >= 0x1p63 ? LLONG_MAX : b <= -0x1p63 ? LLONG_MIN : (long long)b;
}

static bool set_number(const ch_opt *o, const char *arg, void *f, char *why, size_t len)
{
    const bool whole = o->type != CH_OPT_DOUBLE;
    double v;
    if (!ch_opt_read_number(arg, whole, o->lo, o->hi, &v)) {
        if (whole) snprintf(why, len, "expected an integer in %lld..%lld", whole_bound(o->lo), whole_bound(o->hi));
        else snprintf(why, len, "expected a number in [%g, %g]", o->lo, o->hi);
        return false;
    }
    /* Whole numbers are re-read exactly: a double holds a long only to 2^53. */
    switch (o->type) {
    case CH_OPT_INT: *(int *)f = (int)v; break;
    case CH_OPT_LONG: *(long *)f = strtol(arg, NULL, 10); break;
    case CH_OPT_U64: *(uint64_t *)f = (uint64_t)strtoll(arg, NULL, 10); break;
    default: *(double *)f = v; break;
    }
    return true;
}

static bool set_choice(const ch_opt *o, const char *arg, int *f, char *why, size_t len)
{
    const char *c = o->choices;
    for (int i = 0; *c; i++) {
        const size_t n = strcspn(c, "|");
        if (strlen(arg) == n && strncmp(arg, c, n) == 0) {
            *f = i;
            return true;
        }
        c += n + (c[n] == '|');
    }
    /* "expected auto, bar, lines or none" */
    size_t at = (size_t)snprintf(why, len, "expected ");
    for (c = o->choices; *c && at < len;) {
        const size_t n = strcspn(c, "|");
        const char *sep = c == o->choices ? "" : c[n] ? ", " : " or ";
        at += (size_t)snprintf(why + at, len - at, "%s%.*s", sep, (int)n, c);
        c += n + (c[n] == '|');
    }
    return false;
}

/* --betas B1,B2: two numbers in [0, 1). */
static bool parse_betas(const char *arg, ch_opt_values *v, char *why, size_t len)
{
    char a[64], b[64];
    const char *comma = strchr(arg, ',');
    double b1, b2;
    if (comma && (size_t)(comma - arg) < sizeof a && strlen(comma + 1) < sizeof b) {
        snprintf(a, sizeof a, "%.*s", (int)(comma - arg), arg);
        snprintf(b, sizeof b, "%s", comma + 1);
        if (ch_opt_read_number(a, false, 0, 0.999999999, &b1) && ch_opt_read_number(b, false, 0, 0.999999999, &b2)) {
            v->cfg.beta1 = b1;
            v->cfg.beta2 = b2;
            return true;
        }
    }
    snprintf(why, len, "expected B1,B2, each a number in [0, 1) (for example 0.9,0.999)");
    return false;
}

static void show_betas(const ch_train_config *c, char *buf, size_t len)
{
    snprintf(buf, len, "%.17g,%.17g", c->beta1, c->beta2);
}

/* "" would read as no shares at all: it is refused as an empty number is. */
static bool parse_shares(const char *arg, ch_opt_values *v, char *why, size_t len)
{
    if (!*arg) {
        snprintf(why, len, "expected auto or one whole number per rank (e.g. 3,1)");
        return false;
    }
    v->cfg.shares = arg;
    return true;
}

/* --resume: "auto" is the folder's latest checkpoint if there is one, else a fresh start ("./auto"
 * is a checkpoint of that name); no PATH: the latest in --checkpoint-dir. */
static bool parse_resume(const char *arg, ch_opt_values *v, char *why, size_t len)
{
    (void)why, (void)len;
    v->cli.resume_auto = arg && strcmp(arg, "auto") == 0;
    v->cli.resume = v->cli.resume_auto ? NULL : arg;
    v->cli.resume_latest = arg == NULL;
    return true;
}

/* The same as --progress none (the index of "none" in its choices). */
static bool parse_no_progress(const char *arg, ch_opt_values *v, char *why, size_t len)
{
    (void)arg;
    return set_choice(ch_opt_find("progress", CH_CMD_TRAIN, NULL), "none", &v->cli.progress, why, len);
}

bool ch_opt_set(const ch_opt *o, const char *arg, ch_opt_values *v, char *why, size_t len)
{
    void *f = field(o, v);
    switch (o->type) {
    case CH_OPT_INT:
    case CH_OPT_LONG:
    case CH_OPT_U64:
    case CH_OPT_DOUBLE: return set_number(o, arg, f, why, len);
    case CH_OPT_STR: *(const char **)f = arg; return true;
    case CH_OPT_FLAG: *(bool *)f = true; return true;
    case CH_OPT_CHOICE: return set_choice(o, arg, f, why, len);
    case CH_OPT_SPECIAL: return o->parse(arg, v, why, len);
    }
    return false;
}

void ch_opt_show(const ch_opt *o, const ch_train_config *c, char *buf, size_t len)
{
    const char *f = (const char *)c + o->offset;
    if (o->show) {
        o->show(c, buf, len);
        return;
    }
    switch (o->type) {
    case CH_OPT_INT:
    case CH_OPT_CHOICE: snprintf(buf, len, "%d", *(const int *)(const void *)f); break;
    case CH_OPT_LONG: snprintf(buf, len, "%ld", *(const long *)(const void *)f); break;
    case CH_OPT_U64: snprintf(buf, len, "%" PRIu64, *(const uint64_t *)(const void *)f); break;
    case CH_OPT_DOUBLE: snprintf(buf, len, "%.17g", *(const double *)(const void *)f); break;
    case CH_OPT_FLAG: snprintf(buf, len, "%d", *(const bool *)(const void *)f); break;
    default: {
        const char *s = *(const char *const *)(const void *)f;
        snprintf(buf, len, "%s", s ? s : "(none)");
    }
    }
}

void ch_opt_default_text(const ch_opt *o, unsigned cmd, char *buf, size_t len)
{
    if (o->dflt) {
        snprintf(buf, len, "%s", o->dflt);
        return;
    }
    ch_opt_values v;
    ch_opt_defaults(cmd, &v);
    const void *f = field(o, &v);
    buf[0] = '\0';
    switch (o->type) {
    case CH_OPT_INT: snprintf(buf, len, "%d", *(const int *)f); break;
    case CH_OPT_LONG: snprintf(buf, len, "%ld", *(const long *)f); break;
    case CH_OPT_U64: snprintf(buf, len, "%" PRIu64, *(const uint64_t *)f); break;
    case CH_OPT_DOUBLE: snprintf(buf, len, "%g", *(const double *)f); break;
    case CH_OPT_STR: if (*(const char *const *)f) snprintf(buf, len, "%s", *(const char *const *)f); break;
    case CH_OPT_CHOICE: {
        const char *c = o->choices;
        for (int i = 0; i < *(const int *)f && strchr(c, '|'); i++) c = strchr(c, '|') + 1;
        snprintf(buf, len, "%.*s", (int)strcspn(c, "|"), c);
        break;
    }
    default: break;
    }
}

/* A numeric field of the configuration as a double, for its range check. */
static double number_of(const ch_opt *o, const ch_train_config *c)
{
    const void *f = (const char *)c + o->offset;
    switch (o->type) {
    case CH_OPT_INT: return *(const int *)f;
    case CH_OPT_LONG: return (double)*(const long *)f;
    default: return *(const double *)f;
    }
}

ch_status ch_opt_check_config(const ch_train_config *c, ch_err *err)
{
    const ch_train_config def = ch_train_config_default();
    for (size_t i = 0; i < sizeof table / sizeof *table; i++) {
        const ch_opt *o = &table[i];
        const bool numeric = o->type == CH_OPT_INT || o->type == CH_OPT_LONG || o->type == CH_OPT_DOUBLE;
        if (o->where != CH_IN_CFG || !numeric) continue;
        const double v = number_of(o, c);
        if (v >= o->lo && v <= o->hi) continue;
        if (v == number_of(o, &def) || (o->unset_ok && v == 0)) continue;
        if (o->type == CH_OPT_DOUBLE)
            return ch_fail(err, CH_STATUS_BAD_INPUT, "--%s %g: expected a number in [%g, %g]", o->name, v, o->lo,
                           o->hi);
        return ch_fail(err, CH_STATUS_BAD_INPUT, "--%s %.0f: expected an integer in %lld..%lld", o->name, v,
                       whole_bound(o->lo), whole_bound(o->hi));
    }
    return CH_STATUS_OK;
}

void ch_opt_record_config(const ch_train_config *c, cJSON *obj)
{
    int n;
    const ch_opt *t = ch_opt_table(&n);
    for (int i = 0; i < n; i++) {
        const ch_opt *o = &t[i];
        if (!o->record || o->where != CH_IN_CFG) continue;
        const void *f = (const char *)c + o->offset;
        switch (o->type) {
        case CH_OPT_INT: cJSON_AddNumberToObject(obj, o->record, *(const int *)f); break;
        case CH_OPT_LONG: cJSON_AddNumberToObject(obj, o->record, (double)*(const long *)f); break;
        case CH_OPT_U64: cJSON_AddNumberToObject(obj, o->record, (double)*(const uint64_t *)f); break;
        case CH_OPT_DOUBLE: cJSON_AddNumberToObject(obj, o->record, *(const double *)f); break;
        case CH_OPT_FLAG: cJSON_AddBoolToObject(obj, o->record, *(const bool *)f); break;
        case CH_OPT_STR: {
            const char *v = *(const char *const *)f;
            if (v) cJSON_AddStringToObject(obj, o->record, v);
            else cJSON_AddNullToObject(obj, o->record);
            break;
        }
        default: {   /* consecutive doubles, one key each */
            char keys[64];
            snprintf(keys, sizeof keys, "%s", o->record);
            const double *d = f;
            for (char *k = strtok(keys, ","); k; k = strtok(NULL, ",")) cJSON_AddNumberToObject(obj, k, *d++);
        }
        }
    }
}
