/* cohort export: a checkpoint's weights alone (the state_dict: weights and BatchNorm buffers), as
 * one safetensors file that PyTorch's load_state_dict takes. */
#include <getopt.h>
#include <stdio.h>

#include "cli/cli.h"
#include "core/file.h"
#include "train/checkpoint.h"

static const char export_usage[] =
    "usage: cohort export --checkpoint PATH --out FILE.safetensors\n"
    "\n"
    "Write a checkpoint's state_dict (weights, BatchNorm buffers; no optimizer state) to FILE,\n"
    "checked against its architecture, written atomically. In PyTorch:\n"
    "  model.load_state_dict(safetensors.torch.load_file(FILE))\n";

int ch_cmd_export(int argc, char **argv)
{
    static const struct option opts[] = {
        { "checkpoint", required_argument, NULL, 'c' }, { "out", required_argument, NULL, 'o' },
        { "help", no_argument, NULL, 'h' },             { NULL, 0, NULL, 0 },
    };
    const char *ckpt = NULL, *out = NULL;
    optind = 1;
    opterr = 0;
    int c;
    while ((c = getopt_long(argc, argv, ":h", opts, NULL)) != -1) {
        switch (c) {
        case 'c': ckpt = optarg; break;
        case 'o': out = optarg; break;
        case 'h': fputs(export_usage, stdout); return CH_EXIT_OK;
        default: fprintf(stderr, "cohort export: unknown or incomplete option (see cohort export --help)\n"); return CH_EXIT_USAGE;
        }
    }
    if (!ckpt || !out || optind < argc) {
        fprintf(stderr, "cohort export: --checkpoint PATH and --out FILE are required (see cohort export --help)\n");
        return CH_EXIT_USAGE;
    }
    ch_err err;
    ch_status st = ch_out_check(out, "--out", &err);
    if (st == CH_STATUS_OK) st = ch_checkpoint_export_dir(ckpt, out, &err);
    return ch_exit_for("export", st, &err);
}
