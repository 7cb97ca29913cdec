/* The model zoo: the exact architectures of the reference programs, with PyTorch module names. */
#ifndef CH_MODELS_ZOO_H
#define CH_MODELS_ZOO_H

#include "nn/layer.h"

/* Build the layer tree of arch for per-sample input `in` and `classes` outputs.
 * Unknown names and inputs the architecture cannot take are CH_STATUS_BAD_INPUT. */
ch_status ch_zoo_build(const char *arch, ch_shape3 in, int classes, ch_layer **root, ch_err *err);
bool ch_zoo_has(const char *arch);

#endif
