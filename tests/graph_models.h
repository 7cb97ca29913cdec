/* The five models of graph_models.py, built with the public ch_graph_* calls under the same
 * PyTorch names: the parity and learning tests train them. */
#ifndef CH_TESTS_GRAPH_MODELS_H
#define CH_TESTS_GRAPH_MODELS_H

#include "cohort.h"

/* Build model `name` ("resnet", "mobilenet", "densenet", "lognet", "headnet") for 1x28x28 inputs
 * and 10 classes; dropout is the mobilenet's and headnet's rate. */
ch_status tg_build(const char *name, double dropout, ch_graph **out, ch_err *err);

#endif
