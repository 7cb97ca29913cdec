/* The model zoo: the exact architectures of the reference programs, as graphs with PyTorch module
 * names. */
#ifndef CH_MODELS_ZOO_H
#define CH_MODELS_ZOO_H

#include "cohort.h"
#include "nn/model.h"

/* The graph of arch for per-sample input `in` and `classes` outputs (the caller frees it).
 * Unknown names and inputs the architecture cannot take are CH_STATUS_BAD_INPUT. */
ch_status ch_zoo_graph(const char *arch, ch_shape3 in, int classes, ch_graph **out, ch_err *err);
/* The model of that graph (ch_model_create_graph), for code that has a zoo name only: a
 * checkpoint's, a test's. */
ch_status ch_zoo_model(const char *name, ch_shape3 in, int classes, const ch_backend *be, ch_model **out,
                       ch_err *err);

#endif
