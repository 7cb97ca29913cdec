/* cohort: data-parallel training of convolutional networks, in C.
 *
 * The public API. A program loads data sets, names a model of the zoo and the devices to train it on,
 * and runs a trainer (one replica of the model per device, each global batch split across them):
 *
 *     ch_err err;
 *     ch_dataset *train, *test;
 *     ch_dataset_load_idx("data/fashion-mnist", CH_SPLIT_TRAIN, &train, &err);
 *     ch_dataset_load_idx("data/fashion-mnist", CH_SPLIT_TEST, &test, &err);
 *     ch_train_config cfg = ch_train_config_default();
 *     cfg.model = "lenet";
 *     cfg.devices = "cpu:0,cpu:1";
 *     ch_trainer *t;
 *     ch_trainer_create(&cfg, train, test, &t, &err);
 *     for (int e = 0; e < cfg.epochs; e++) { ch_epoch_stats s; ch_trainer_run_epoch(t, &s, &err); }
 *     ch_trainer_free(t);
 *
 * Conventions: every fallible function returns a ch_status and, on failure, writes one line naming
 * the problem into the caller's ch_err (which may be NULL). Whoever creates an object frees it with the
 * matching _free; _free(NULL) is a no-op. Objects are not shared between threads unless a function
 * says so. Tensors are float32, NCHW. */
#ifndef COHORT_H
#define COHORT_H

#include <stdbool.h>
#include <stdio.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define CH_VERSION "0.1.0"

#ifdef __cplusplus
#define CH_NORETURN [[noreturn]]
#else
#define CH_NORETURN _Noreturn
#endif

typedef enum ch_status {
    CH_STATUS_OK = 0,
    CH_STATUS_BAD_INPUT = 2,   /* the user's input (flag, file, config) is wrong: exit code 2 */
    CH_STATUS_SYSTEM = 3,      /* allocation, I/O or library failure */
    CH_STATUS_NUMERIC = 4,     /* a NaN or infinity where a number was due */
} ch_status;

typedef struct ch_err {
    char msg[1024];
    /* Set by a collective check that every rank of the job failed the same way (ranks that
     * disagree): every rank holds a message, the one rank with `speaks` prints it, and all may
     * exit cleanly. */
    bool on_every_rank, speaks;
} ch_err;

const char *ch_status_name(ch_status st);
const char *ch_version(void);

/* ---- data sets --------------------------------------------------------------------------- */

typedef enum ch_split { CH_SPLIT_TRAIN, CH_SPLIT_TEST } ch_split;

/* A labelled image data set held in memory as uint8 pixels (n, c, h, w) and labels (n). */
typedef struct ch_dataset ch_dataset;

/* Load the IDX files of DIR (train-images-idx3-ubyte[.gz] etc., raw or gzip). Every header field,
 * count and label is validated; a bad file is CH_STATUS_BAD_INPUT with the file named. */
ch_status ch_dataset_load_idx(const char *dir, ch_split split, ch_dataset **out, ch_err *err);
/* A data set from memory: n samples of c x h x w uint8 pixels (images, n*c*h*w bytes, copied) and
 * labels (n bytes, copied), each < classes (checked). */
ch_status ch_dataset_from_memory(size_t n, int c, int h, int w, int classes, const uint8_t *images,
                                 const uint8_t *labels, ch_dataset **out, ch_err *err);
/* CIFAR-10, binary version: data_batch_1..5.bin / test_batch.bin in DIR or
 * DIR/cifar-10-batches-bin; 3x32x32, 10 classes. Validated like the IDX reader. */
ch_status ch_dataset_load_cifar10(const char *dir, ch_split split, ch_dataset **out, ch_err *err);
/* ImageFolder: DIR/train/CLASS/... and DIR/val/CLASS/... (.png, .jpg, .jpeg, any depth), classes
 * sorted by name as torchvision's. Files are decoded when a batch needs them: training samples get
 * RandomResizedCrop(image_size) (scale 0.08-1, ratio 3/4-4/3, bilinear), evaluation samples
 * Resize(image_size x 256/224) + CenterCrop(image_size); both end as 3 x image_size x image_size. */
typedef struct ch_folder_options {
    int image_size;           /* default 224 */
    bool skip_bad_images;     /* a file that does not decode is replaced by the next sample that
                               * does, and counted (ch_dataset_skipped); otherwise it is an error */
    size_t limit;             /* every kind: read only the first N samples (0: all), so that a
                               * subset of a large file costs only its own memory */
} ch_folder_options;

ch_folder_options ch_folder_options_default(void);
ch_status ch_dataset_load_folder(const char *dir, ch_split split, const ch_folder_options *o,
                                 ch_dataset **out, ch_err *err);
/* Load DIR as kind "idx", "cifar10", "imagefolder" (NULL or "auto": whichever DIR holds; IDX when
 * several). o: the ImageFolder options (NULL: the defaults). */
ch_status ch_dataset_load(const char *dir, const char *kind, ch_split split, const ch_folder_options *o,
                          ch_dataset **out, ch_err *err);
/* Files of an ImageFolder replaced because they did not decode, so far (0 for other data sets);
 * first: the first one's message, when there is one. */
size_t ch_dataset_skipped(const ch_dataset *d, char *first, size_t len);
/* Entries of an ImageFolder named like images (.png, .jpg, .jpeg) that are no regular files (a
 * dangling link, a link loop, a FIFO, a folder), left out of it when it was loaded (0 for other
 * data sets); first: the first one and what it is, when there is one. */
size_t ch_dataset_left_out(const ch_dataset *d, char *first, size_t len);
size_t ch_dataset_size(const ch_dataset *d);
int ch_dataset_classes(const ch_dataset *d);
void ch_dataset_shape(const ch_dataset *d, int *c, int *h, int *w);
/* Keep only the first n samples (no-op when n is 0 or >= the size). */
void ch_dataset_truncate(ch_dataset *d, size_t n);
void ch_dataset_free(ch_dataset *d);

/* ---- models ------------------------------------------------------------------------------- */

/* Names of the zoo: "lenet", "mnist-cnn", "resnet18", "mlp", "linear", "resnet18-imagenet".
 * NULL-terminated. */
const char *const *ch_model_names(void);

/* ---- graphs: your own model --------------------------------------------------------------
 * A model is a graph of named operations over tensors whose first (batch) dimension is left open:
 *
 *     ch_graph *g;
 *     ch_graph_create("small-resnet", &g, &err);
 *     int x = ch_graph_input(g, "x", 1, 28, 28);
 *     int y = ch_graph_conv2d(g, "conv1", x, &(ch_conv2d_args){ .out_channels = 16, .kernel = 3,
 *                                                               .padding = 1, .no_bias = true });
 *     y = ch_graph_batchnorm2d(g, "bn1", y, NULL);
 *     y = ch_graph_relu(g, "relu", y);
 *     ...
 *     ch_graph_output(g, ch_graph_linear(g, "fc", y, 10, true));
 *     cfg.graph = g;           (instead of cfg.model)
 *     ... ch_trainer_create(&cfg, ...), then ch_graph_free(g) whenever it suits
 *
 * Node names are the PyTorch module paths ("layer1.0.conv1"): a node's parameters are named
 * NAME.weight, NAME.bias, NAME.running_mean, ..., as in the state_dict of the PyTorch module.
 * Every builder function returns the new tensor's id, or -1 once anything went wrong; the first
 * error is kept (naming the node) and every later call returns -1, so a builder checks once, at
 * the end, with ch_graph_status (ch_trainer_create checks too). Shapes are per sample: (c, h, w)
 * after convolutions, pooling and view, (features) after flatten, linear or mean without keepdim.
 * Weights start at PyTorch's default initialization (cfg.init). */
typedef struct ch_graph ch_graph;

typedef struct ch_conv2d_args {
    int out_channels, kernel;
    int stride, padding, dilation, groups;   /* 0: PyTorch's defaults (1, 0, 1, 1) */
    bool no_bias;                            /* bias=False */
} ch_conv2d_args;

typedef struct ch_pool2d_args {
    int kernel;
    int stride, padding;                     /* stride 0: the kernel size, as PyTorch */
    bool ceil_mode;
    bool exclude_pad;                        /* avg_pool2d's count_include_pad=False */
} ch_pool2d_args;

typedef struct ch_batchnorm_args {
    double eps, momentum;                    /* 0: PyTorch's defaults (1e-5, 0.1) */
} ch_batchnorm_args;

ch_status ch_graph_create(const char *name, ch_graph **out, ch_err *err);
void ch_graph_free(ch_graph *g);
/* The first error of any builder call, or OK. */
ch_status ch_graph_status(const ch_graph *g, ch_err *err);
const char *ch_graph_name(const ch_graph *g);
/* The samples' shape (one input per graph). */
int ch_graph_input(ch_graph *g, const char *name, int c, int h, int w);
int ch_graph_conv2d(ch_graph *g, const char *name, int x, const ch_conv2d_args *a);
/* a: NULL for the defaults. x: (c, h, w), or (features) as BatchNorm1d's (N, C) case. */
int ch_graph_batchnorm2d(ch_graph *g, const char *name, int x, const ch_batchnorm_args *a);
/* BatchNorm1d of a (features) input (the same node as batchnorm2d; the state_dict is the same). */
int ch_graph_batchnorm1d(ch_graph *g, const char *name, int x, const ch_batchnorm_args *a);
/* nn.LayerNorm: each sample normalised over its dimensions from axis on, counting the batch as 0 as
 * ONNX does (of a (c, h, w) tensor: 1 is LayerNorm([c, h, w]), 2 LayerNorm([h, w]), 3 LayerNorm([w]);
 * of a (features) tensor: 1), weight and bias of that shape; or, with CH_LAYER_NORM_CHANNELS, over
 * the channels at every pixel, weight and bias (c) (ConvNeXt's x.permute(0, 2, 3, 1), LayerNorm(c),
 * permute back). eps: 1e-12..1 (nn.LayerNorm's default 1e-5). */
enum { CH_LAYER_NORM_CHANNELS = 0 };
int ch_graph_layer_norm(ch_graph *g, const char *name, int x, int axis, double eps);
/* nn.ConvTranspose2d(in, a->out_channels, a->kernel, stride, padding, output_padding, groups, bias,
 * dilation): weight (c, out_channels / groups, k, k). output_padding is below the stride or the
 * dilation. */
int ch_graph_conv_transpose2d(ch_graph *g, const char *name, int x, const ch_conv2d_args *a, int output_padding);
/* A module called twice: node `node`'s operation again, on x, with the same parameters (one set:
 * their gradients are summed; checkpoints keep it once, under node's names). node is a conv2d,
 * conv_transpose2d, linear, layer_norm or batchnorm node made before (one whose reuse is named
 * resolves to the first); x must give parameters of the same shapes. A reused BatchNorm also
 * shares its running statistics and batch counter, which each call moves in turn, as PyTorch's
 * module called twice does. */
int ch_graph_reuse(ch_graph *g, const char *name, const char *node, int x);
int ch_graph_relu(ch_graph *g, const char *name, int x);
int ch_graph_leaky_relu(ch_graph *g, const char *name, int x, double negative_slope);
int ch_graph_relu6(ch_graph *g, const char *name, int x);
int ch_graph_clip(ch_graph *g, const char *name, int x, double min, double max);
int ch_graph_sigmoid(ch_graph *g, const char *name, int x);
int ch_graph_tanh(ch_graph *g, const char *name, int x);
/* PyTorch's nn.Hardsigmoid (relu6(x + 3) / 6) and nn.Hardswish (x * hardsigmoid(x)). */
int ch_graph_hardsigmoid(ch_graph *g, const char *name, int x);
int ch_graph_hardswish(ch_graph *g, const char *name, int x);
/* PyTorch's nn.GELU(): x * Phi(x) exactly (erf), or with tanh_approximation its
 * approximate='tanh' form. */
int ch_graph_gelu(ch_graph *g, const char *name, int x, bool tanh_approximation);
/* erf(x), elementwise: what an ONNX export of the exact GELU holds. */
int ch_graph_erf(ch_graph *g, const char *name, int x);
/* x * scale + shift with constant numbers (x * 0.5, x / 6, x + 3, 1 - x in PyTorch code). */
int ch_graph_affine(ch_graph *g, const char *name, int x, double scale, double shift);
int ch_graph_max_pool2d(ch_graph *g, const char *name, int x, const ch_pool2d_args *a);
int ch_graph_avg_pool2d(ch_graph *g, const char *name, int x, const ch_pool2d_args *a);
/* AdaptiveAvgPool2d(1): (c, h, w) -> (c, 1, 1). */
int ch_graph_global_avg_pool(ch_graph *g, const char *name, int x);
/* x.mean((2, 3), keepdim): (c, 1, 1) with keepdim, else (c). */
int ch_graph_mean_hw(ch_graph *g, const char *name, int x, bool keepdim);
/* nn.Upsample(scale_factor=(scale_h, scale_w), mode='nearest'): (c, h, w) -> (c, h * scale_h, w * scale_w),
 * whole factors 1..64. */
int ch_graph_upsample_nearest(ch_graph *g, const char *name, int x, int scale_h, int scale_w);
/* F.interpolate(x, size=(out_h, out_w), mode='bilinear', align_corners=align_corners) (also what
 * nn.Upsample(scale_factor=k, mode='bilinear') makes): (c, h, w) -> (c, out_h, out_w), sides 1..16384. */
int ch_graph_upsample_bilinear(ch_graph *g, const char *name, int x, int out_h, int out_w, bool align_corners);
/* ShuffleNet's channel shuffle, x.view(n, groups, c / groups, h, w).transpose(1, 2) viewed back as
 * (c, h, w): output channel j * groups + i is input channel i * (c / groups) + j. groups divides c. */
int ch_graph_channel_shuffle(ch_graph *g, const char *name, int x, int groups);
/* x.permute(perm[0], perm[1], perm[2], perm[3]) of a (c, h, w) tensor, the batch staying first
 * (perm[0] = 0; the others an order of 1, 2, 3): x.permute(0, 1, 3, 2) swaps h and w,
 * x.permute(0, 2, 3, 1) makes (h, w, c). Its backward is the inverse permutation. */
int ch_graph_permute(ch_graph *g, const char *name, int x, const int perm[4]);
/* x[:, start:start + count]: channels of a (c, h, w) tensor, as x.chunk(k, 1) and x.split(s, 1) make them. */
int ch_graph_channel_slice(ch_graph *g, const char *name, int x, int start, int count);
/* (c, h, w) -> (c*h*w). */
int ch_graph_flatten(ch_graph *g, const char *name, int x);
/* x.view(x.size(0), c, h, w): the same values as shape (c, h, w), e.g. (features) -> (features, 1, 1)
 * for a squeeze-excitation gate computed by linear layers. */
int ch_graph_view(ch_graph *g, const char *name, int x, int c, int h, int w);
/* x: (features), or (c, 1, 1). */
int ch_graph_linear(ch_graph *g, const char *name, int x, int out_features, bool bias);
int ch_graph_dropout(ch_graph *g, const char *name, int x, double p);
/* Elementwise with numpy/PyTorch broadcasting of the per-sample shapes, aligned from the right:
 * (c, h, w) * (c, 1, 1) is a squeeze-excitation gate. */
int ch_graph_add(ch_graph *g, const char *name, int a, int b);
int ch_graph_mul(ch_graph *g, const char *name, int a, int b);
/* torch.cat(xs, 1): inputs of one height and width. */
int ch_graph_concat(ch_graph *g, const char *name, const int *xs, int n);
/* The logits: (classes), or (classes, 1, 1). Training minimizes their softmax cross-entropy. */
ch_status ch_graph_output(ch_graph *g, int x);
/* Nodes and parameters so far. */
int ch_graph_node_count(const ch_graph *g);
/* A model exported by PyTorch in training mode (opsets 13 to 17):
 *     torch.onnx.export(model, x, "net.onnx", training=torch.onnx.TrainingMode.TRAINING,
 *                       do_constant_folding=False, dynamic_axes={"input": {0: "batch"}})
 * as a graph that carries the file's weights under their state_dict names (training starts from
 * them unless cfg.init says otherwise). Operators outside the builder's set, inference exports
 * and malformed files are refused (BAD_INPUT) with one line naming the node and the file. */
ch_status ch_graph_load_onnx(const char *path, ch_graph **out, ch_err *err);

/* ---- devices ------------------------------------------------------------------------------ */

enum { CH_MAX_DEVICES = 64 };

/* cpu: the CPU backend. scramble: a test backend of CPU kernels whose memory is stored XOR-
 * scrambled, so that code reaching a replica's memory other than through the backend computes
 * garbage (what a device the host cannot read would break); it gives the CPU backend's bits.
 * lazy: a test backend on scramble's memory whose kernels and copies are queued on streams and run
 * later, only when something waits for them (what an asynchronous device would break).
 * cuda: an NVIDIA GPU through the CUDA plugin (libcohort-cuda.so, loaded when a list names one);
 * the index is CUDA's, after CUDA_VISIBLE_DEVICES. */
typedef enum ch_device_kind { CH_DEVICE_CPU = 0, CH_DEVICE_SCRAMBLE, CH_DEVICE_LAZY, CH_DEVICE_CUDA, CH_DEVICE_KINDS } ch_device_kind;

/* A logical device: one model replica with its own thread. CPU devices share the machine's cores,
 * each gets its own part of them; the index names the device, it does not pick a core. */
typedef struct ch_device {
    ch_device_kind kind;
    int index;
} ch_device;

typedef struct ch_device_list {
    int count;
    ch_device dev[CH_MAX_DEVICES];
} ch_device_list;

/* Parse "cpu:0,cpu:1", "cpu:0-3" or "cpu*4" (entries may be mixed: "cpu:0,cpu:2-3"); the same
 * for cuda, scramble and lazy ("cuda*2", "lazy:0,lazy:1"). "cuda:local" is the device numbered by
 * this process's local rank (ch_world_local_rank; 0 outside mpirun): one GPU per rank of a host.
 * Duplicates, unknown kinds and two kinds in one list are CH_STATUS_BAD_INPUT. */
ch_status ch_device_list_parse(const char *spec, ch_device_list *out, ch_err *err);
/* "cpu:0, cpu:1" (what the epoch line shows between brackets). */
void ch_device_list_format(const ch_device_list *l, char *buf, size_t len);
/* "cpu", "scramble", "lazy", "cuda": the kind's name, which is also its backend's. */
const char *ch_device_kind_name(ch_device_kind kind);
/* "cpu:1", "scramble:0". */
void ch_device_name(const ch_device *d, char *buf, size_t len);

/* ---- processes (MPI ranks) ----------------------------------------------------------------
 * One program, started alone or by mpirun: `mpirun -np N prog` makes N processes, ranks 0..N-1, that
 * train one model together (each on its own devices, the global batch split over all of them).
 * Call ch_world_init first thing in main; trainers created afterwards span all ranks (unless
 * ch_train_config.local_only). Started without a launcher, the process is rank 0 of 1 and MPI is not
 * used. After a trainer call fails in a job of several ranks, the ranks no longer agree on what
 * comes next: report the error and call ch_world_abort. */
ch_status ch_world_init(int *argc, char ***argv, ch_err *err);
int ch_world_rank(void);
int ch_world_size(void);
/* The ranks on this host (sharing its memory), and this one's place among them. */
int ch_world_local_rank(void);
int ch_world_local_size(void);
const char *ch_world_host(void);
/* End every rank of the job now with exit code `code` (MPI_Abort; exit without MPI). */
CH_NORETURN void ch_world_abort(int code);
/* Leave MPI (call once at the end of a successful run, after freeing every trainer). */
void ch_world_finalize(void);
/* Every rank knows the job is over (an error all ranks hold, err.on_every_rank): leave MPI and
 * exit with code, without ending the others. */
CH_NORETURN void ch_world_exit(int code);
/* Collective over every rank (alone: returns OK at once): each rank names n settings (the same
 * names in the same order when the ranks agree) and gives their values as text. OK when every
 * rank has every value of rank 0; otherwise CH_STATUS_BAD_INPUT on every rank, err naming the
 * first setting that differs, this rank's value and the ranks that differ from rank 0, with
 * err->on_every_rank set. A rank that does not join within timeout_s ends the job. */
ch_status ch_world_agree(const char *what, const char *const *names, const char *const *values, int n,
                         double timeout_s, ch_err *err);

/* ---- training ----------------------------------------------------------------------------- */

typedef struct ch_train_config {
    const char *model;        /* zoo name (ignored when graph is set) */
    const ch_graph *graph;    /* your own model, built with ch_graph_* (borrowed: it must outlive
                               * ch_trainer_create) */
    const char *init;         /* "default" (PyTorch's), "normal:STD" or "file" (an imported graph's
                               * weights); NULL: "file" when the graph has weights, else "default" */
    int epochs;
    int batch_size;           /* global batch */
    int accum_steps;          /* micro-batches per step on every device, gradients summed before one
                               * sync and one update (DDP's no_sync, Horovod's
                               * backward_passes_per_step); 0 or 1: none. Memory holds one
                               * micro-batch's activations. */
    const char *shares;       /* each rank's part of every global batch: "3,1" (one whole number per
                               * rank; parts proportional, gradients still exact), "auto" (re-balanced
                               * from measured step times: after the first steps and at every epoch
                               * end), NULL or "": equal */
    const char *optimizer;    /* "sgd" (default), "adam", "adamw", "adagrad" */
    double lr, momentum, weight_decay;
    bool nesterov;
    double dampening;         /* SGD */
    double beta1, beta2;      /* Adam, AdamW (default 0.9, 0.999) */
    double eps;               /* Adam, AdamW, Adagrad; < 0: PyTorch's default (1e-8; Adagrad 1e-10) */
    /* Learning-rate schedule, stepped per epoch as PyTorch's schedulers usually are, with an
     * optional linear warmup per iteration in front. */
    const char *schedule;     /* "constant" (default), "step", "multistep", "cosine" */
    int step_size;            /* step: epochs between decays */
    double gamma;             /* step, multistep: the factor (default 0.1) */
    const char *milestones;   /* multistep: "30,60,90" */
    int t_max;                /* cosine: epochs of the half period */
    double eta_min;           /* cosine: the lowest rate */
    int warmup_epochs;        /* linear warmup in front of the schedule (0: none) */
    bool scale_lr;            /* linear scaling rule: lr x global batch / 256 */
    /* Augmentation of training samples, keyed by (seed, epoch, sample): torchvision's
     * RandomCrop(size, padding) and RandomHorizontalFlip; normalization applies to evaluation too. */
    int random_crop;          /* padding of the random crop; 0: none */
    bool random_flip;
    const char *normalize;    /* "imagenet" or "M1,M2,M3/S1,S2,S3"; NULL: pixels / 255 (ImageFolder:
                               * imagenet) */
    int loader_workers;       /* threads that decode and augment the next batches ahead of the step
                               * (-j); 0: each device gathers its own slice inside the step */
    uint64_t seed;
    int in_order;             /* 1: every epoch takes the training samples in the data set's order
                               * (--shuffle off, to compare a step with a program that does not
                               * shuffle); 0: a permutation keyed by (seed, epoch) */
    int threads;              /* compute threads; 0: all cores */
    bool nan_check;           /* stop with CH_STATUS_NUMERIC on a non-finite loss */
    const char *devices;      /* device list (ch_device_list_parse); NULL: "cpu:0" */
    bool sync_bn;             /* BatchNorm statistics over the global batch, not per device */
    const char *precision;    /* "fp32" (default) or "bf16": convolutions multiply in bf16 (sums in
                               * fp32) where that is the faster, and BatchNorm inputs are kept in
                               * bf16 for backward; master weights, gradients, optimizer state,
                               * BatchNorm statistics and other activations stay fp32. Refused on
                               * a CPU without native bf16, where it would run slower than fp32 */
    double bucket_mb;         /* gradient sync bucket size in MiB; 0: 25 */
    const char *grad_compress; /* how gradient buckets travel between ranks: NULL or "none" (fp32),
                               * "bf16" (half the bytes, summed in fp32, the same bits on every
                               * rank), "bf16-ef" (bf16 with error feedback: what rounding took is
                               * added to the next step's gradient). Replicas of one process still
                               * sum in fp32 through shared memory. */
    int zero;                 /* 1: ZeRO stage 1, the optimizer state sharded over every replica of the
                               * job (each updates its shard, then the parameters are gathered):
                               * the same result, optimizer memory per replica divided by their
                               * number; 0: every replica keeps all of it */
    int ps_servers;           /* > 0: the last ps_servers ranks become parameter servers (each holds
                               * a shard of the parameters and of the optimizer state; the other
                               * ranks train, push gradients and pull parameters). On a server rank
                               * ch_trainer_create serves until the workers free their trainers and
                               * returns a trainer that does nothing (ch_trainer_is_ps_server). */
    const char *ps_mode;      /* "sync" (default: the allreduce run's arithmetic) or "async" (each
                               * push applied on arrival; workers claim the epoch's work as they go) */
    int staleness;            /* async: steps a worker may run ahead of the slowest; < 0 (default):
                               * no bound */
    double timeout_s;         /* the longest any exchange between ranks may take before the job
                               * is ended with a message naming it (default 300) */
    bool local_only;          /* ignore other MPI ranks: this process trains alone */
    const char *checkpoint_dir; /* write a checkpoint there after every epoch; NULL: none */
    int checkpoint_every;     /* also every N global steps (0: only at epoch ends) */
    int keep;                 /* keep the newest K checkpoints (0: all) */
    const char *trace;        /* write a Chrome trace (JSON) of the first trace_steps steps; NULL: none */
    int trace_steps;          /* default 20 */
    bool allow_nonfinite;     /* load checkpoints holding NaN/Inf or a negative running_var (refused
                               * by default, naming the tensor) */
} ch_train_config;

ch_train_config ch_train_config_default(void);

typedef struct ch_epoch_stats {
    int epoch;                /* 1-based */
    double loss;              /* mean training loss over the epoch */
    double train_acc, test_acc;
    double time_s;            /* training time of the epoch (excluding evaluation) */
    double images_per_s;
    double lr;                /* the learning rate of the epoch's last step */
    double data_wait_s;       /* of time_s, spent waiting for the loader's batches (-j) */
    size_t train_images, test_images;
} ch_epoch_stats;

/* Called after every step from the training thread: step (1-based) of steps, running loss and
 * accuracy of the epoch so far, images processed so far. */
typedef void (*ch_progress_fn)(void *user, int step, int steps, double loss, double acc,
                               size_t images, double elapsed_s);

typedef struct ch_trainer ch_trainer;

/* Build the model, optimizer and plans. train/test are borrowed and must outlive the trainer;
 * test may be NULL. */
ch_status ch_trainer_create(const ch_train_config *cfg, const ch_dataset *train,
                            const ch_dataset *test, ch_trainer **out, ch_err *err);
void ch_trainer_set_progress(ch_trainer *t, ch_progress_fn fn, void *user);
/* Train one epoch, then evaluate on the test set (test_acc is -1 without one). */
ch_status ch_trainer_run_epoch(ch_trainer *t, ch_epoch_stats *stats, ch_err *err);
/* One training step on the global batch idx[0..n) of the training set (every rank passes the same
 * indices): split over the replicas, forward, loss (mean over the n samples), backward, sync,
 * update. Returns the summed loss and the correct count. */
ch_status ch_trainer_step(ch_trainer *t, const uint32_t *idx, int n, double *loss_sum, int64_t *correct,
                          ch_err *err);
/* Evaluate on d: mean loss and accuracy. */
ch_status ch_trainer_evaluate(ch_trainer *t, const ch_dataset *d, double *loss, double *acc,
                              ch_err *err);
/* The devices in use, e.g. "cpu:0, cpu:1". */
const char *ch_trainer_devices(const ch_trainer *t);
const ch_device_list *ch_trainer_device_list(const ch_trainer *t);
size_t ch_trainer_param_count(const ch_trainer *t);
/* Continue from a checkpoint (a checkpoint directory, or a --checkpoint-dir whose `latest` names
 * one): parameters, buffers, optimizer state, epoch and position in it. Collective over the ranks;
 * any number of devices and ranks; with the same ones, training continues bit for bit. Errors name
 * the file, the tensor and the mismatch, and leave the trainer as it was. */
ch_status ch_trainer_resume(ch_trainer *t, const char *path, ch_err *err);
/* Resume from the checkpoint folder dir's `latest` when there is one (*resumed = true), else leave
 * the trainer fresh (*resumed = false): the same command line, run again after a failure, goes on
 * where the last checkpoint stood. Rank 0's folder decides for every rank. A `latest` whose
 * checkpoint cannot be loaded is an error, never a fresh start. Collective. */
ch_status ch_trainer_resume_auto(ch_trainer *t, const char *dir, bool *resumed, ch_err *err);
/* A run that starts afresh (no resume) with cfg.checkpoint_dir: unless overwrite, refuse a folder
 * that already holds checkpoints (a `latest`, an epoch-* or step-* entry), which the run's own
 * would replace: CH_STATUS_BAD_INPUT naming the folder and what it holds, on every rank alike.
 * Rank 0's folder decides. Collective. */
ch_status ch_trainer_start_fresh(ch_trainer *t, bool overwrite, ch_err *err);
/* Weights and buffers only, from a safetensors state_dict (cohort's model.safetensors, or one
 * exported from PyTorch; a `module.` prefix is stripped). Collective. */
ch_status ch_trainer_load_weights(ch_trainer *t, const char *file, ch_err *err);
/* Write the state_dict alone (weights and BatchNorm buffers) to a safetensors file, atomically. */
ch_status ch_trainer_export(const ch_trainer *t, const char *file, ch_err *err);
/* Write the trace (cfg.trace) now, if one is being recorded and was not written yet: the spans
 * recorded so far, of every rank (rank 0 writes the file, merging the ranks' parts, which it reads
 * from cfg.trace.rank<R>: a file system the ranks share). Collective. The trainer calls it itself
 * once trace_steps steps are recorded. */
ch_status ch_trainer_write_trace(ch_trainer *t, ch_err *err);
/* Epochs completed (counting those of a resumed checkpoint). */
int ch_trainer_epochs_done(const ch_trainer *t);
/* Evaluate on d, counting per class: hits[c] and counts[c] for c < classes (exact over ranks). */
ch_status ch_trainer_evaluate_classes(ch_trainer *t, const ch_dataset *d, double *loss, double *acc,
                                      int64_t *hits, int64_t *counts, ch_err *err);
/* What the trainer will do, as cohort train --dry-run prints it: the model's layers (PyTorch's
 * module names, output shapes, parameters, MFLOP per image), memory per replica, devices and ranks,
 * the data's split into steps and replicas, shares, accumulation, the gradient sync's buckets and
 * path, sharding, parameter servers, optimizer and schedule. Text for people, not a format. */
void ch_trainer_describe(const ch_trainer *t, FILE *out);
/* This process's share of one epoch: the training samples its replicas train on and the test
 * samples they evaluate. The shares of all ranks add up to the data sets, without overlap. */
void ch_trainer_share(const ch_trainer *t, size_t *train, size_t *test);
/* The ranks' shares of each batch in use, "W0,W1,..." (--shares; with auto, as last re-balanced);
 * false (out "") when the split is the even one the job started with. */
bool ch_trainer_shares(const ch_trainer *t, char *out, size_t len);
/* How gradients travel between ranks: "bf16" or "bf16-ef" (--grad-compress), "none" when they go
 * as fp32 (the default, and any job of one process). */
const char *ch_trainer_grad_compress(const ch_trainer *t);
/* This rank is a parameter server (--ps-servers): its trainer has served the job already and
 * trains nothing. */
bool ch_trainer_is_ps_server(const ch_trainer *t);
/* "sync" or "async" with parameter servers (and how many in *servers), NULL without. */
const char *ch_trainer_ps(const ch_trainer *t, int *servers);
/* The model's name as the epoch line shows it ("lenet", an imported file's graph name). */
const char *ch_trainer_model_name(const ch_trainer *t);
/* Threads of this process's replicas, together. */
int ch_trainer_threads(const ch_trainer *t);
/* Processes (ranks) the trainer spans. */
int ch_trainer_procs(const ch_trainer *t);
/* *v becomes the largest of every rank's *v (collective over the trainer's ranks): a job is as
 * fast as its slowest rank. */
ch_status ch_trainer_max_over_ranks(ch_trainer *t, double *v, ch_err *err);
/* Benchmarks only: steps leave out the gradient sync (each device keeps its own gradient), so
 * that a run measures what the sync costs. */
void ch_trainer_set_skip_sync(ch_trainer *t, bool skip);
/* The ZeRO stage in effect: 1 with --zero 1 when the job has more than one replica, else 0. */
int ch_trainer_zero(const ch_trainer *t);
/* Bytes of optimizer state this process holds (all its replicas; with --zero 1 their shards). */
size_t ch_trainer_optimizer_bytes(const ch_trainer *t);
/* Copy the flat float32 parameters (ch_trainer_param_count values) into out; every replica holds
 * the same bits. */
void ch_trainer_get_params(const ch_trainer *t, float *out);
void ch_trainer_free(ch_trainer *t);

/* ---- machine ------------------------------------------------------------------------------ */

/* One line describing the CPU (vendor, family/model, widest vector ISA). */
void ch_cpu_describe(char *buf, size_t len);
/* Number of cores this process may run on. */
int ch_cpu_count(void);

#ifdef __cplusplus
}
#endif

#endif
