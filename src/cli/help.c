/* cohort help [COMMAND]: manual pages, in the sections of man(1). `cohort COMMAND --help` gives the
 * short usage; this is the long form. */
#include <stdio.h>
#include <string.h>

#include "cli/cli.h"
#include "train/options.h"

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
    "    progress bar is drawn on stderr when it is a terminal (rank 0 only).\n";

/* After the option sections (from the option table). */
static const char train_page_tail[] =
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
        ch_flags_manual(stdout, CH_CMD_TRAIN);
        fputs(train_page_tail, stdout);
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
