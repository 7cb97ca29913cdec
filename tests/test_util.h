/* Helpers shared by the unit tests (cmocka). */
#ifndef CH_TEST_UTIL_H
#define CH_TEST_UTIL_H

#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "core/real.h"
#include "nn/layer.h"

/* Fill with uniform values in [lo, hi) from a seeded stream. */
void tu_fill_uniform(ch_real *x, size_t n, double lo, double hi, uint64_t seed);
/* n values uniform in [-1, 1) from seed, newly allocated (the caller frees; a failed allocation
 * fails the test). */
ch_real *tu_uniform(size_t n, uint64_t seed);
/* The worse of two errors, where a NaN is the worst and stays so (a plain `if (!(e <= worst))
 * worst = e` let the next finite error replace a NaN). */
double tu_worse(double worst, double e);
/* max_i |a_i - b_i| / max(|a_i|, |b_i|, floor): relative error, absolute below floor. */
double tu_max_rel_err(const ch_real *a, const ch_real *b, size_t n, double floor);
/* max_i |a_i - b_i| / max_i |b_i|: the error relative to the array's scale, the fair measure for
 * float sums whose terms cancel. */
double tu_max_norm_err(const ch_real *a, const ch_real *b, size_t n);
/* The same over float arrays: ch_trainer_get_params's parameters, in either build. */
double tu_max_norm_err_f32(const float *a, const float *b, size_t n);
/* Per parameter tensor of m: ||a - b|| / max(||b||, 1e-2 ||b over the model||), the worst; the
 * floor keeps tensors whose exact gradient is zero (conv biases before BatchNorm) from comparing
 * noise. a and b are gradient buffers laid out like m->grads. */
struct ch_model;
double tu_grad_error(const struct ch_model *m, const ch_real *a, const ch_real *b);
/* One training step of the zoo's `arch` (inputs `in`, 10 classes, parameters from init seed `seed`)
 * on backend be, planned for n samples on 2 threads, in bf16 or not, from fixed inputs and a
 * fixed gradient of the logits: its parameter gradients (nparams floats) into g. Returns the
 * planned model, for the caller to read and free (ch_model_free). Fails the test on any error. */
struct ch_backend;
struct ch_model *tu_zoo_step(struct ch_backend *be, const char *arch, ch_shape3 in, uint64_t seed,
                             bool bf16, int n, float *g);
/* Called by tu_zoo_step, where not NULL, with the model once it is planned, before the step (a
 * test's kernels that need to know where the model's memory is). */
extern void (*tu_zoo_planned)(const struct ch_model *m);
/* n single-channel size x size images with 10 classes and a learnable pattern (a bright column at
 * the label's position). Free with ch_dataset_free. */
struct ch_dataset *tu_synthetic(size_t n, int size, uint64_t seed);
/* The job-shape contract: one epoch of `model` on d with global batch `batch` on `devices` (in
 * this process, or over every MPI rank unless local_only), SGD at lr with momentum 0.9, one thread per
 * device, then the largest parameter difference from one device (tu_max_norm_err). The epoch's
 * last batch is whatever d->n leaves; replicas with no sample in a step must contribute exactly
 * zero. Fails the test (cmocka) if a trainer cannot be made or a step fails. */
double tu_job_shape_error(const char *model, const struct ch_dataset *d, const char *devices,
                          int batch, double lr, bool sync_bn, bool local_only);
/* The same with the job's steps run as accum micro-batches per device (--accum-steps): against one
 * device with whole batches. */
double tu_accum_error(const char *model, const struct ch_dataset *d, const char *devices, int batch, int accum,
                      double lr, bool sync_bn, bool local_only);
/* tu_accum_error's run, with the epoch's figures too: the parameters' distance as above, the
 * reported loss's relative distance from one device's, and the training accuracies' difference. */
typedef struct tu_gaps {
    double params, loss, acc;
} tu_gaps;
tu_gaps tu_accum_gaps(const char *model, const struct ch_dataset *d, const char *devices, int batch, int accum,
                      double lr, bool sync_bn, bool local_only);
/* A model name the helpers above take besides the zoo's: conv 3x3 (8), BatchNorm (eps 1e-3,
 * momentum 0.3), ReLU, global average pool, linear. */
#define TU_BN_NET "tu-bn-net"
/* n copies of one image and label (tu_synthetic's first): any subset of a batch has the same
 * BatchNorm statistics, so only their counts can make a split differ. */
struct ch_dataset *tu_identical(size_t n, int size, uint64_t seed);
/* epochs of d on one device and as a job over [devices] of every rank with --shares shares (lr
 * 0.05): the parameters' distance from one device as above; the job's shares after, in shares_out,
 * and this rank's training samples per epoch with them, in mine. */
double tu_shares_error(const char *model, const struct ch_dataset *d, const char *devices, int batch,
                       const char *shares, int epochs, char *shares_out, size_t len, size_t *mine);
/* The reference for per-replica BatchNorm: resnet18 (init "default", seed 7) on the host backend,
 * planned for n samples on 2 threads, in bf16 or not; each of the D slices of idx
 * (ch_trainer_slice) run alone, its gradient scaled by 1/n, the slices' gradients summed into
 * *grads; running statistics averaged by slice size into *buffers (both allocated here, nparams and
 * nbuffers of *keep). *keep: the model. The caller frees all three. */
void tu_per_slice_reference(const struct ch_dataset *d, const uint32_t *idx, int n, int D, bool bf16,
                            ch_real **grads, ch_real **buffers, struct ch_model **keep);
struct ch_train_config;
/* The job those comparisons run: model, batch 10 (on 26 samples: 10, 10, 6, a short last batch),
 * SGD lr 0.05 with momentum 0.9 and weight decay 5e-4, buckets of 0.05 MiB (several), sync-BN or
 * not, accum micro-batches, threads in all. */
struct ch_train_config tu_lazy_job(const char *model, bool sync_bn, int accum, int threads);
/* Two epochs of *cfg's job (d for training and test) on cpu*D and on lazy*D give the same epoch
 * figures (==) and every replica's parameters, buffers and optimizer state bit for bit, and keep
 * as many values in bf16 (into *bf16_kept unless NULL: replica 0's count); fails the test otherwise.
 * Returns the second epoch's loss. */
double tu_lazy_gives_cpu_bits(const struct ch_train_config *cfg, const struct ch_dataset *d, int D,
                              size_t *bf16_kept);
/* A host copy of n values of m's memory dev (through its backend: also the lazy one's); the caller
 * frees it. */
ch_real *tu_down(const struct ch_model *m, const ch_real *dev, size_t n);
/* n values of a's memory da and of b's db, bit for bit; fails the test naming what otherwise. */
void tu_assert_same_bits(const struct ch_model *a, const ch_real *da, const struct ch_model *b, const ch_real *db,
                         size_t n, const char *what);
/* The backend the device lists of a test run name (--backend=NAME as the program's first argument,
 * taken out of argv by tu_take_backend; "cpu" without it): ctest's *_lazy runs and the GPU checks
 * pass it, so no environment switch picks a backend. tu_devices rewrites a list written for the
 * CPU ("cpu:0,cpu:1", "cpu*3") to that backend's ("lazy:0,lazy:1"); the result lives until 16
 * more calls. */
extern const char *tu_backend;
void tu_take_backend(int *argc, char **argv);
const char *tu_devices(const char *cpu_list);
/* The CPU's maker as Linux's /proc/cpuinfo names it (vendor_id: "GenuineIntel", "AuthenticAMD"):
 * a reading apart from CPUID, to hold ch_cpu_vendor and what rests on it to. False where there is
 * no such line. */
bool tu_cpuinfo_vendor(char *buf, size_t len);
/* Whether a bf16 test program runs here, and how: 0 to run, 77 (skipped, said why) or 1 (failed,
 * said why) to exit with. Without native bf16 it sets COHORT_BF16=emulate, oneDNN's emulation of
 * bf16 on AVX-512; a CPU with AVX-512 where that still leaves bf16 off is a failure, not a skip (a
 * broken gate must not turn the bf16 tests into skips on CI). skip_emulated: skip rather than
 * emulate (a program too slow under emulation for the pass it is in). */
int tu_bf16_here(bool skip_emulated, const char *why_skip);
/* Whether this run is CI's sanitizer pass (COHORT_SANITIZED=1), where some tests run fewer cases. */
bool tu_sanitized(void);
/* A scratch directory for the test's files (removed by tu_rmdir). */
void tu_mkdtemp(char *buf, size_t len);
void tu_rmdir(const char *dir);
/* Write bytes to dir/name, gzip-compressed when gz. */
void tu_write_file(const char *dir, const char *name, const void *data, size_t len, int gz);

#endif
