/* The lazy backend's queue, shared by its streams and events (lazy.c) and its kernel table
 * (lazy_kernels.c, lazy_norm.c): a queued kernel is a call of the scramble backend's kernel with arguments
 * copied at queue time. */
#ifndef CH_KERNELS_LAZY_H
#define CH_KERNELS_LAZY_H

#include <stddef.h>

#include "kernels/kernels.h"

enum { CH_LAZY_ARGS = 192 };

typedef struct ch_lazy_call {
    void (*run)(const ch_kctx *kc, const void *args);
    ch_kctx kc;
    _Alignas(16) unsigned char args[CH_LAZY_ARGS];
} ch_lazy_call;

/* Queue call on kc->stream (a lazy stream): run later, in the stream's order, with a copy of the
 * bytes of args (n <= CH_LAZY_ARGS) and of *kc. */
void ch_lazy_queue_call(const ch_kctx *kc, void (*run)(const ch_kctx *kc, const void *args), const void *args,
                        size_t n);

/* The normalisation kernels of the lazy table (lazy_norm.c), as kernels.h's entries of the same names. */
void ch_lazy_batchnorm_stats(const ch_kctx *kc, int n, int c, int hw, const ch_real *x, double *mean, double *var);
void ch_lazy_batchnorm_stats_bf16(const ch_kctx *kc, int n, int c, int hw, const uint16_t *x, double *mean,
                                  double *var);
void ch_lazy_batchnorm_finalize(const ch_kctx *kc, int c, const double *mean, const double *var, double count,
                                double eps, double momentum, const ch_real *gamma, const ch_real *beta,
                                ch_real *running_mean, ch_real *running_var, ch_real *save);
void ch_lazy_to_real(const ch_kctx *kc, size_t len, const double *x, ch_real *y);
void ch_lazy_channel_affine_keep_bf16(const ch_kctx *kc, int n, int c, int hw, const ch_real *x,
                                      const ch_real *scale, const ch_real *shift, ch_real *y, uint16_t *keep);
void ch_lazy_channel_affine_of_bf16(const ch_kctx *kc, int n, int c, int hw, const uint16_t *x,
                                    const ch_real *scale, const ch_real *shift, ch_real *y);
void ch_lazy_batchnorm_backward_reduce_bf16(const ch_kctx *kc, int n, int c, int hw, const uint16_t *x,
                                            const ch_real *dy, const ch_real *mean, const ch_real *invstd,
                                            double *sum_dy, double *sum_dy_xhat);
void ch_lazy_batchnorm_backward_data_bf16(const ch_kctx *kc, int n, int c, int hw, const uint16_t *x,
                                          const ch_real *dy, const ch_real *mean, const ch_real *invstd,
                                          const ch_real *gamma, const double *sum_dy, const double *sum_dy_xhat,
                                          double count, ch_real *dx);
void ch_lazy_channel_affine(const ch_kctx *kc, int n, int c, int hw, const ch_real *x, const ch_real *scale, const ch_real *shift, ch_real *y);
void ch_lazy_batchnorm_backward_reduce(const ch_kctx *kc, int n, int c, int hw, const ch_real *x, const ch_real *dy, const ch_real *mean, const ch_real *invstd, double *sum_dy, double *sum_dy_xhat);
void ch_lazy_batchnorm_backward_data(const ch_kctx *kc, int n, int c, int hw, const ch_real *x, const ch_real *dy, const ch_real *mean, const ch_real *invstd, const ch_real *gamma, const double *sum_dy, const double *sum_dy_xhat, double count, ch_real *dx);
void ch_lazy_layernorm_forward(const ch_kctx *kc, int outer, int len, int inner, const ch_real *x, const ch_real *gamma, const ch_real *beta, double eps, ch_real *y, ch_real *mean, ch_real *invstd);
void ch_lazy_layernorm_backward(const ch_kctx *kc, int outer, int len, int inner, const ch_real *x, const ch_real *dy, const ch_real *gamma, const ch_real *mean, const ch_real *invstd, ch_real *dx, ch_real *dgamma, ch_real *dbeta);

#endif
