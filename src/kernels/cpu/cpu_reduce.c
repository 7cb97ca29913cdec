/* Sums over contiguous rows, written so that they vectorise. A plain `s += p[j]` loop is one chain
 * of dependent adds (4 cycles each) that the compiler may not reorder; here each sum keeps
 * CH_CPU_LANES partial sums, one per lane, added in a fixed order at the end. The bits do not
 * depend on the vector width the compiler picks, so results stay the same on every x86 build. */
#include "kernels/cpu/cpu.h"

#include "core/bf16.h"

enum { LANES = CH_CPU_LANES };

static size_t full_of(size_t len) { return len - len % LANES; }

/* The lane sums of len values of type T at p, each widened by WIDEN: one body for fp32 and bf16
 * rows, so that the two give the same bits for the same values. */
#define LANE_SUM_OF(T, WIDEN)                                                                      \
    static double lane_sum_##T(const T *p, size_t len)                                             \
    {                                                                                              \
        double acc[LANES] = { 0 };                                                                 \
        const size_t full = full_of(len);                                                          \
        for (size_t i = 0; i < full; i += LANES) {                                                 \
            _Pragma("omp simd") for (int j = 0; j < LANES; j++) acc[j] += WIDEN(p[i + j]);         \
        }                                                                                          \
        double s = 0;                                                                              \
        for (int j = 0; j < LANES; j++) s += acc[j];                                               \
        for (size_t i = full; i < len; i++) s += WIDEN(p[i]);                                      \
        return s;                                                                                  \
    }
#define AS_IS(v) (v)
LANE_SUM_OF(ch_real, AS_IS)
LANE_SUM_OF(uint16_t, ch_bf16_to_float)

double ch_cpu_sum(const ch_real *p, size_t len) { return lane_sum_ch_real(p, len); }

/* ch_cpu_sum of bf16 values widened: the same bits as ch_cpu_sum of the widened copy. */
double ch_cpu_sum_bf16(const uint16_t *p, size_t len) { return lane_sum_uint16_t(p, len); }

double ch_cpu_sum_sq_dev(const ch_real *p, size_t len, double m)
{
    double acc[LANES] = { 0 };
    const size_t full = full_of(len);
    for (size_t i = 0; i < full; i += LANES) {
#pragma omp simd
        for (int j = 0; j < LANES; j++) acc[j] += (p[i + j] - m) * (p[i + j] - m);
    }
    double s = 0;
    for (int j = 0; j < LANES; j++) s += acc[j];
    for (size_t i = full; i < len; i++) s += (p[i] - m) * (p[i] - m);
    return s;
}

void ch_cpu_sum_dy_dyx(const ch_real *dy, const ch_real *x, size_t len, double m, double *sum_dy,
                       double *sum_dyx)
{
    double acc[LANES] = { 0 }, accx[LANES] = { 0 };
    const size_t full = full_of(len);
    for (size_t i = 0; i < full; i += LANES) {
#pragma omp simd
        for (int j = 0; j < LANES; j++) {
            acc[j] += dy[i + j];
            accx[j] += (double)dy[i + j] * ((double)x[i + j] - m);
        }
    }
    double s = 0, sx = 0;
    for (int j = 0; j < LANES; j++) {
        s += acc[j];
        sx += accx[j];
    }
    for (size_t i = full; i < len; i++) {
        s += dy[i];
        sx += (double)dy[i] * ((double)x[i] - m);
    }
    *sum_dy += s;
    *sum_dyx += sx;
}

void ch_cpu_col_sum(const ch_kctx *kc, int rows, size_t len, const ch_real *x, ch_real *y)
{
    (void)kc;
    /* Row by row, so the inner loop runs along a row and vectorises over j. */
    for (size_t j = 0; j < len; j++) y[j] = 0;
    for (int i = 0; i < rows; i++)
        for (size_t j = 0; j < len; j++) y[j] += x[(size_t)i * len + j];
}
