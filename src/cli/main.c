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
    "  eval     test loss and accuracy of a checkpoint (cohort eval --help)\n"
    "  export   a checkpoint's weights as one safetensors file (cohort export --help)\n"
    "  bench    measure training or evaluation throughput (cohort bench --help)\n"
    "  plot     several runs' metrics in one SVG chart (cohort plot --help)\n"
    "  info     version, kernels, CPU and optional back ends\n"
    "  help     the manual page of a command (cohort help train)\n"
    "\n"
    "  --help, --version\n";

int main(int argc, char **argv)
{
    if (argc < 2) {
        fputs(usage, stderr);
        return CH_EXIT_USAGE;
    }
    const char *cmd = argv[1];
    if (strcmp(cmd, "help") == 0 && argc > 2) return ch_cmd_help(argc - 1, argv + 1);
    if (strcmp(cmd, "--help") == 0 || strcmp(cmd, "-h") == 0 || strcmp(cmd, "help") == 0) {
        fputs(usage, stdout);
        return CH_EXIT_OK;
    }
    if (strcmp(cmd, "--version") == 0) {
        printf("cohort %s\n", ch_version());
        return CH_EXIT_OK;
    }
    int (*run)(int, char **) = NULL;
    if (strcmp(cmd, "train") == 0) run = ch_cmd_train;
    if (strcmp(cmd, "info") == 0) run = ch_cmd_info;
    if (strcmp(cmd, "bench") == 0) run = ch_cmd_bench;
    if (strcmp(cmd, "eval") == 0) run = ch_cmd_eval;
    if (strcmp(cmd, "export") == 0) run = ch_cmd_export;
    if (strcmp(cmd, "plot") == 0) return ch_cmd_plot(argc - 1, argv + 1);
    if (run) {
        /* Under mpirun this process becomes one rank of the job; alone, rank 0 of 1. */
        ch_err err;
        ch_status st = ch_world_init(&argc, &argv, &err);
        if (st != CH_STATUS_OK) return ch_exit_for(cmd, st, &err);
        int rc = ch_cli_join(argc - 1, argv + 1);
        if (rc < 0) rc = run(argc - 1, argv + 1);
        /* A rank that stops on its own (its flags refused where another rank's were not, say)
         * leaves the others waiting in a collective: end the job. It said why already. */
        if (rc != CH_EXIT_OK && ch_world_size() > 1) ch_world_abort(rc);
        ch_world_finalize();
        return rc;
    }
    fprintf(stderr, "cohort: unknown command '%s' (see cohort --help)\n", cmd);
    return CH_EXIT_USAGE;
}
