/* ONNX import from memory: what ch_graph_load_onnx (include/cohort.h) does after reading the
 * file, for the fuzzer and for callers that hold the bytes already. */
#ifndef CH_GRAPH_ONNX_H
#define CH_GRAPH_ONNX_H

#include <stddef.h>
#include <stdint.h>

#include "cohort.h"

/* The model in buf (len bytes, an ONNX ModelProto); path names it in messages and gives the
 * graph its name. */
ch_status ch_onnx_import(const uint8_t *buf, size_t len, const char *path, ch_graph **out, ch_err *err);

#endif
