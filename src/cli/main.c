/* The cohort program: dispatch to a subcommand. */
#include <stdio.h>
#include <string.h>

#include "cli/cli.h"

static const char usage[] =
    "usage: cohort COMMAND [options]\n"
    "\n"
    "Data-parallel training of convolutional networks.\n"
    "\n"
    "commands:\n"
    "  train    train a model (cohort train --help)\n"
    "  bench    measure training or evaluation throughput (cohort bench --help)\n"
    "  info     version, kernels, CPU and optional back ends\n"
    "\n"
    "  --help, --version\n";

int main(int argc, char **argv)
{
    if (argc < 2) {
        fputs(usage, stderr);
        return CH_EXIT_USAGE;
    }
    const char *cmd = argv[1];
    if (strcmp(cmd, "--help") == 0 || strcmp(cmd, "-h") == 0 || strcmp(cmd, "help") == 0) {
        fputs(usage, stdout);
        return CH_EXIT_OK;
    }
    if (strcmp(cmd, "--version") == 0) {
        printf("cohort %s\n", ch_version());
        return CH_EXIT_OK;
    }
    if (strcmp(cmd, "train") == 0) return ch_cmd_train(argc - 1, argv + 1);
    if (strcmp(cmd, "info") == 0) return ch_cmd_info(argc - 1, argv + 1);
    if (strcmp(cmd, "bench") == 0) return ch_cmd_bench(argc - 1, argv + 1);
    fprintf(stderr, "cohort: unknown command '%s' (see cohort --help)\n", cmd);
    return CH_EXIT_USAGE;
}
