/* cohort help [COMMAND]: manual pages, in the sections of man(1). `cohort COMMAND --help` gives the
 * short usage; this is the long form. */
#include <stdio.h>
#include <string.h>

#include "cli/cli.h"

static const char train_page[] =
    "NAME\n"
    "    cohort train - train a model on one or more devices, processes and machines\n"
    "\n"
    "SYNOPSIS\n"
    "    cohort train --model NAME --data DIR [OPTION]...\n"
    "    mpirun -np N [--hostfile FILE] cohort train --model NAME --data DIR [OPTION]...\n"
    "\n"
    "DESCRIPTION\n"
    "    Trains a model of the zoo on an IDX data set (MNIST, Fashion-MNIST layout: train-images-\n"
    "    idx3-ubyte[.gz], train-labels-idx1-ubyte[.gz], t10k-...) and prints one line per epoch:\n"
    "        epoch 3, loss 0.4173, train acc 0.8458, test acc 0.8575, time 5.3 sec, 11220 img/s on\n"
    "        [cpu:0, cpu:1]\n"
    "    Every device (--devices) holds a replica of the model; under mpirun every process is a\n"
    "    rank with its own devices. The global batch (-b) is split over all replicas of all ranks,\n"
    "    the gradients are summed (in buckets, while backward runs) and every replica applies the\n"
    "    same update, so any number of devices and ranks computes what one device would. A\n"
    "    progress bar is drawn on stderr when it is a terminal (rank 0 only).\n"
    "\n"
    "MODEL AND DATA\n"
    "    --model NAME          lenet | mnist-cnn | resnet18 | mlp | linear | resnet18-imagenet\n"
    "                          (torchvision's ResNet-18, for RGB images) (required)\n"
    "    --data DIR            the data set directory (required): IDX files, or CIFAR-10's binary\n"
    "                          batches (data_batch_1..5.bin, test_batch.bin, also in\n"
    "                          DIR/cifar-10-batches-bin), or an ImageFolder: DIR/train/CLASS/ and\n"
    "                          DIR/val/CLASS/ holding .png, .jpg and .jpeg files at any depth,\n"
    "                          classes sorted by name (torchvision's ImageFolder)\n"
    "    --dataset KIND        auto | idx | cifar10 | imagefolder (default auto: what DIR holds)\n"
    "    --image-size N        ImageFolder: training samples get RandomResizedCrop(N) (scale\n"
    "                          0.08-1, ratio 3/4-4/3, bilinear), test samples Resize(N x 256/224)\n"
    "                          + CenterCrop(N); images are decoded when a batch needs them\n"
    "                          (default 224)\n"
    "    --skip-bad-images     ImageFolder: a file that does not decode is replaced by the next\n"
    "                          sample that does, and the count is printed at the end (default:\n"
    "                          stop with an error naming the file)\n"
    "    -j, --workers N       loader threads that decode and augment the coming batches into a\n"
    "                          ring of 2 batch buffers while the step runs; the results do not\n"
    "                          depend on N (default 0: each device gathers its own slice)\n"
    "    --train-limit N       train on the first N samples only (default: all)\n"
    "    --test-limit N        evaluate on the first N test samples only (default: all)\n"
    "    --init SPEC           default (PyTorch's initialisation) | normal:STD (weights N(0, STD),\n"
    "                          biases 0) (default: default)\n"
    "    --seed S              seed of every random choice: the same command gives the same bits\n"
    "                          (default 0)\n"
    "\n"
    "OPTIMISATION\n"
    "    --epochs N            epochs in all, counting those of a resumed checkpoint (default 10)\n"
    "    -b, --batch-size B    global batch size (default 256)\n"
    "    --lr X                learning rate (default 0.1)\n"
    "    --optimizer NAME      sgd | adam | adamw | adagrad, each with PyTorch's update rule\n"
    "                          (torch.optim) (default sgd)\n"
    "    --momentum M          SGD momentum, PyTorch semantics (default 0)\n"
    "    --dampening D         SGD momentum dampening (default 0)\n"
    "    --betas B1,B2         Adam and AdamW betas (default 0.9,0.999)\n"
    "    --eps E               Adam, AdamW and Adagrad epsilon (default 1e-8; Adagrad 1e-10)\n"
    "    --schedule NAME       constant | step | multistep | cosine: PyTorch's StepLR, MultiStepLR,\n"
    "                          CosineAnnealingLR stepped once per epoch (default constant)\n"
    "    --step-size N         step: epochs between decays (required by step)\n"
    "    --gamma G             step, multistep: the decay factor (default 0.1)\n"
    "    --milestones LIST     multistep: increasing epochs, like 30,60,90 (required)\n"
    "    --t-max N             cosine: epochs from lr down to --eta-min (default: --epochs)\n"
    "    --eta-min X           cosine: the lowest rate (default 0)\n"
    "    --random-crop PAD     training: torchvision's RandomCrop(size, padding=PAD): zero-pad,\n"
    "                          crop back at a random place (default 0: none)\n"
    "    --random-flip         training: RandomHorizontalFlip(0.5) (default off)\n"
    "    --normalize SPEC      imagenet | MEAN/STD per channel (\"0.49,0.48,0.45/0.25,0.24,0.26\"):\n"
    "                          x = (pixel / 255 - mean) / std, training and evaluation; random\n"
    "                          choices come from (seed, epoch, sample) (default: pixel / 255;\n"
    "                          imagenet for an ImageFolder)\n"
    "    --warmup-epochs N     first a linear warmup, per step, from lr/(N x steps) up to lr over N\n"
    "                          epochs; then the schedule starts at its epoch 0 (default 0)\n"
    "    --scale-lr            the linear scaling rule: lr x global batch / 256 (default off)\n"
    "    --nesterov            Nesterov momentum (default off)\n"
    "    --weight-decay W, --wd W\n"
    "                          L2 weight decay; AdamW: decoupled (default 0; AdamW 0.01)\n"
    "    --nan-check           stop with an error when the loss is not finite (default off)\n"
    "    --allow-nonfinite     resume from a checkpoint that holds NaN or infinity, or a negative\n"
    "                          BatchNorm running_var (default: refused, naming the tensor)\n"
    "\n"
    "DEVICES AND PROCESSES\n"
    "    --devices LIST        cpu:0,cpu:1 | cpu:0-3 | 'cpu*4' (default cpu:0)\n"
    "    --threads T           compute threads in all, shared out among the devices, at least one\n"
    "                          each (default: the cores this process may use, divided by the\n"
    "                          ranks on the host)\n"
    "    --sync-bn             BatchNorm statistics over the whole global batch (default: each\n"
    "                          device's own slice, as PyTorch DDP)\n"
    "    --precision P         fp32 (default). bf16 is refused: without native bf16 (cohort info\n"
    "                          says) it is slower than fp32, and its kernels are not built yet\n"
    "    --bucket-mb M         gradient sync bucket size in MiB (default 25)\n"
    "    --timeout SECONDS     end the job when an exchange between ranks takes longer: a stuck\n"
    "                          or lost rank (default 300)\n"
    "    --log-dir DIR         every rank writes DIR/workerlog.RANK: rank, host, pid, devices,\n"
    "                          share of the data, epoch lines, errors (default: none)\n"
    "\n"
    "CHECKPOINTS\n"
    "    --checkpoint-dir DIR  write DIR/epoch-NNNN after every epoch (model.safetensors,\n"
    "                          optimizer.safetensors, trainer.json), atomically, and point\n"
    "                          DIR/latest at it (default: none)\n"
    "    --checkpoint-every N  also DIR/step-NNNNNNNN every N steps (default 0: epoch ends only)\n"
    "    --keep K              keep the newest K checkpoints (default: all)\n"
    "    --resume [PATH]       continue from PATH, or from DIR/latest; with the same devices and\n"
    "                          ranks, bit for bit\n"
    "\n"
    "OUTPUT\n"
    "    --metrics FILE        append one JSON object per epoch (JSON Lines): epoch, loss,\n"
    "                          train_acc, test_acc, time_s, images_per_s, devices, ranks\n"
    "    --plot FILE.svg       after every epoch, redraw an SVG chart of train loss, train accuracy\n"
    "                          and test accuracy per epoch (cohort plot compares several runs)\n"
    "    --trace FILE.json     a timeline in the Chrome trace event format (chrome://tracing,\n"
    "                          Perfetto) of the first --trace-steps steps: per rank (process) and\n"
    "                          device (a compute and a sync thread each), spans for data, forward,\n"
    "                          backward per layer, each gradient bucket's allreduce, the wait for\n"
    "                          the sync and the optimizer step. Ranks write FILE.json.rankR and\n"
    "                          rank 0 merges them (a shared directory) (default: none)\n"
    "    --trace-steps N       steps in the trace (default 20)\n"
    "    --no-progress         no progress bar\n"
    "    --dry-run             print the model summary (layers, output shapes, parameters, FLOPs\n"
    "                          per image, memory per replica) and the data and device plan; exit\n"
    "    -h, --help            the short usage\n"
    "\n"
    "EXIT STATUS\n"
    "    0 success; 2 bad input (a flag, a data file, a checkpoint), with one line naming it;\n"
    "    1 any other failure (a replica's error, a NaN under --nan-check, a failed rank).\n"
    "\n"
    "ENVIRONMENT\n"
    "    OMPI_COMM_WORLD_SIZE, PMI_SIZE, PMIX_RANK\n"
    "                          set by MPI launchers: the process joins the job as one rank\n"
    "    COHORT_MPI=0|1        force (or forbid) joining an MPI job\n"
    "    OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1\n"
    "                          let mpirun run as root (or mpirun --allow-run-as-root)\n"
    "\n"
    "EXAMPLES\n"
    "    cohort train --model lenet --data data/fashion-mnist --devices cpu:0,cpu:1 --lr 0.05 \\\n"
    "        --momentum 0.9 --checkpoint-dir ckpt\n"
    "    cohort train --model lenet --data data/fashion-mnist --checkpoint-dir ckpt --resume\n"
    "    mpirun -np 4 --hostfile hosts cohort train --model resnet18 --data /data/fashion-mnist \\\n"
    "        -b 512 --lr 0.2 --log-dir logs\n"
    "\n"
    "SEE ALSO\n"
    "    cohort help eval, cohort help export, cohort help bench; README.md; docs/ARCHITECTURE.md\n";

static int show_usage(int (*cmd)(int, char **), const char *name)
{
    char *argv[] = { (char *)name, (char *)"--help", NULL };
    return cmd(2, argv);
}

int ch_cmd_help(int argc, char **argv)
{
    if (argc < 2 || strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0) {
        puts("usage: cohort help COMMAND    (train, eval, export, plot, bench, info)");
        return CH_EXIT_OK;
    }
    const char *what = argv[1];
    if (strcmp(what, "train") == 0) {
        fputs(train_page, stdout);
        return CH_EXIT_OK;
    }
    if (strcmp(what, "eval") == 0) return show_usage(ch_cmd_eval, "eval");
    if (strcmp(what, "export") == 0) return show_usage(ch_cmd_export, "export");
    if (strcmp(what, "bench") == 0) return show_usage(ch_cmd_bench, "bench");
    if (strcmp(what, "plot") == 0) return show_usage(ch_cmd_plot, "plot");
    if (strcmp(what, "info") == 0) return show_usage(ch_cmd_info, "info");
    fprintf(stderr, "cohort help: no page for '%s' (train, eval, export, plot, bench, info)\n", what);
    return CH_EXIT_USAGE;
}
