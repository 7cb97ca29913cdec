/* CH_HD marks a function that both targets compile: plain C11 for the CPU, and under nvcc a
 * function device kernels call too (the per-element bodies in kernels/ and core/philox.h, which
 * the CUDA plugin includes as they are, so both backends run the same arithmetic). */
#ifndef CH_CORE_HD_H
#define CH_CORE_HD_H

#ifdef __CUDACC__
#define CH_HD __host__ __device__
#else
#define CH_HD
#endif

#endif
