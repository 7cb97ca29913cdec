/* The hand-written Winograds' sample lanes (wino_body.h): a group of TB samples held as planes of
 * vectors, one sample per lane, and the transposes between a tensor's rows (one per sample) and a
 * group's lanes, both ways. Included by wino_body.h, after the including file defines TB. */
#ifndef WINO_FN
#error "wino_lanes.h is part of wino_body.h"
#endif

/* A tensor's samples s .. s+live-1 (planes of h x w) as a group's planes of ph x pw vectors, the
 * data at (pad, pad), zero elsewhere and in the lanes past live. */
typedef struct wlayout {
    int planes, h, w, pad, ph, pw;
} wlayout;

static size_t group_len(wlayout l) { return (size_t)l.planes * l.ph * l.pw * TB; }

/* Where unpacked rows go: fp32 (f), or bf16 (h: a convolution's output written in bf16 for its
 * BatchNorm, WINO_FN(forward_bf16), rounded as its tiles are stored); the other is NULL. */
typedef struct wdest {
    ch_real *f;
    uint16_t *h;
} wdest;

static wdest dest_at(wdest t, size_t off)
{
    return (wdest){ t.f ? t.f + off : NULL, t.h ? t.h + off : NULL };
}

/* Where packed rows come from: fp32 (f), or bf16 (h: a convolution input kept in bf16 between
 * layers, WINO_FN(forward_of_bf16), packed as bf16 and widened as its windows are read); the
 * other is NULL. */
typedef struct wsrc {
    const ch_real *f;
    const uint16_t *h;
} wsrc;

static wsrc src_at(wsrc t, size_t off)
{
    return (wsrc){ t.f ? t.f + off : NULL, t.h ? t.h + off : NULL };
}

/* The transposes between a tensor's rows (one per sample, ss apart) and a group's lanes:
 * to[c*TB + s] = from[s*ss + c] and back, for c < len and s < live. Where AVX2 is there (float
 * build), 8x8 blocks go through registers (8 row loads, 24 shuffles, 8 stores); the lane-at-a-time
 * loops before were gathers, which Zen 3 runs about one element a cycle, and the packing was a
 * seventh of ResNet-20's step. Where AVX-512 is, 16x16 blocks (16 loads, 64 shuffles, 16
 * stores: two fifths fewer instructions an element, and each sample's fp32 row written a whole
 * 64-byte line at a time instead of half lines); the blocks move values only, so both give the
 * same bits. */
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && defined(__AVX512DQ__) && \
    !defined(CH_REAL_DOUBLE)
#include <immintrin.h>
enum { WINO_BLOCK = 16 };
/* How far ahead along each of a block's 16 sample rows the packing asks for data (1 KiB): 16
 * streams at once, each a sample's row, are more than the hardware prefetcher follows, and the
 * packing waited on memory. `bench/compare_builds` on resnet18 bf16 (whose packing reads bf16
 * rows) 1.02-1.04x with it; 512 B and 2 KiB were no better. */
enum { PACK_AHEAD_BYTES = 1024 };
_Static_assert((int)TB == (int)WINO_BLOCK, "a 16x16 block spans a group's lanes");

/* r[j] = column j of the 16x16 block whose row i was r[i]: 4x4 blocks within each 128-bit lane
 * (two rounds of shuffles), then the lanes themselves (two rounds of 128-bit shuffles). */
static inline void transpose16(__m512 r[16])
{
    __m512 t[16], u[16];
    for (int k = 0; k < 16; k += 2) {
        t[k] = _mm512_unpacklo_ps(r[k], r[k + 1]);
        t[k + 1] = _mm512_unpackhi_ps(r[k], r[k + 1]);
    }
    for (int g = 0; g < 16; g += 4) {   /* u[g + m]: rows g..g+3, elements m, m+4, m+8, m+12 */
        u[g] = _mm512_shuffle_ps(t[g], t[g + 2], 0x44);
        u[g + 1] = _mm512_shuffle_ps(t[g], t[g + 2], 0xEE);
        u[g + 2] = _mm512_shuffle_ps(t[g + 1], t[g + 3], 0x44);
        u[g + 3] = _mm512_shuffle_ps(t[g + 1], t[g + 3], 0xEE);
    }
    for (int m = 0; m < 4; m++) {
        const __m512 v0 = _mm512_shuffle_f32x4(u[m], u[4 + m], 0x44);
        const __m512 v1 = _mm512_shuffle_f32x4(u[m], u[4 + m], 0xEE);
        const __m512 w0 = _mm512_shuffle_f32x4(u[8 + m], u[12 + m], 0x44);
        const __m512 w1 = _mm512_shuffle_f32x4(u[8 + m], u[12 + m], 0xEE);
        r[m] = _mm512_shuffle_f32x4(v0, w0, 0x88);
        r[4 + m] = _mm512_shuffle_f32x4(v0, w0, 0xDD);
        r[8 + m] = _mm512_shuffle_f32x4(v1, w1, 0x88);
        r[12 + m] = _mm512_shuffle_f32x4(v1, w1, 0xDD);
    }
}

/* The first n elements of a block. */
static inline __mmask16 first_n(int n) { return (__mmask16)((1u << n) - 1); }

/* One 16-sample x 16-element block at element c, samples h..h+15 (h is 0: a block is a group's
 * lanes); n < 16: the first n elements only, read and written under a mask. */
static void block_to_lanes(const ch_real *from, size_t ss, int h, int c, int n, ch_real *to)
{
    __m512 r[16];
    for (int i = 0; i < 16; i++) {
        _mm_prefetch((const char *)(from + (size_t)(h + i) * ss + c) + PACK_AHEAD_BYTES, _MM_HINT_T0);
        r[i] = _mm512_maskz_loadu_ps(first_n(n), from + (size_t)(h + i) * ss + c);
    }
    transpose16(r);
    for (int j = 0; j < n; j++) _mm512_storeu_ps(to + (size_t)(c + j) * TB + h, r[j]);
}

/* The same block from bf16 rows into bf16 lanes: the values moved through the 32-bit transpose,
 * zero-extended and narrowed back (the planes of an input held in bf16: pack_group). */
static void block16_to_lanes16(const uint16_t *from, size_t ss, int h, int c, int n, uint16_t *to)
{
    __m512 r[16];
    for (int i = 0; i < 16; i++) {
        _mm_prefetch((const char *)(from + (size_t)(h + i) * ss + c) + PACK_AHEAD_BYTES, _MM_HINT_T0);
        const __m256i v = _mm256_maskz_loadu_epi16(first_n(n), from + (size_t)(h + i) * ss + c);
        r[i] = _mm512_castsi512_ps(_mm512_cvtepu16_epi32(v));
    }
    transpose16(r);
    for (int j = 0; j < n; j++)
        _mm256_storeu_si256((__m256i *)(to + (size_t)(c + j) * TB + h), _mm512_cvtepi32_epi16(_mm512_castps_si512(r[j])));
}

/* Sixteen floats rounded to bf16: by AVX512-BF16's instruction (to nearest even, a NaN kept a NaN,
 * subnormal values flushed to zero: wino_body.h's store_points_bf16 says why), or, in a build for
 * an AVX-512 CPU without it (a Skylake to Ice Lake, or a portable x86-64-v4 build), by
 * core/bf16.h's ch_bf16_from_float: a bf16 output there is a test's (the CPU's bf16 is emulated)
 * or a portable binary's, not worth a third copy of the rounding. */
static inline __m256i bf16x16(__m512 v)
{
#if defined(__AVX512BF16__)
    return (__m256i)_mm512_cvtneps_pbh(v);
#else
    float f[16];
    uint16_t h[16];
    _mm512_storeu_ps(f, v);
    for (int l = 0; l < 16; l++) h[l] = ch_bf16_from_float(f[l]);
    return _mm256_loadu_si256((const __m256i *)h);
#endif
}

/* A block of bf16 lanes into bf16 rows: the values moved (the planes of an output held in bf16:
 * unpack_group). */
static void block16_to_rows16(const uint16_t *from, int live, int c, int n, uint16_t *to, size_t ss)
{
    __m512 r[16];
    for (int j = 0; j < 16; j++)
        r[j] = j < n ? _mm512_castsi512_ps(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(from + (size_t)(c + j) * TB))))
                     : _mm512_setzero_ps();
    transpose16(r);
    for (int i = 0; i < 16 && i < live; i++)
        _mm256_mask_storeu_epi16(to + (size_t)i * ss + c, first_n(n), _mm512_cvtepi32_epi16(_mm512_castps_si512(r[i])));
}

static void block_to_rows(const ch_real *from, int h, int live, int c, int n, ch_real *to, size_t ss)
{
    __m512 r[16];
    for (int j = 0; j < 16; j++)
        r[j] = j < n ? _mm512_loadu_ps(from + (size_t)(c + j) * TB + h) : _mm512_setzero_ps();
    transpose16(r);
    for (int i = 0; i < 16 && h + i < live; i++)
        _mm512_mask_storeu_ps(to + (size_t)(h + i) * ss + c, first_n(n), r[i]);
}
#elif defined(__AVX2__) && !defined(CH_REAL_DOUBLE)
#include <immintrin.h>

/* r[j] = column j of the 8x8 block whose row i was r[i]. */
static inline void transpose8(__m256 r[8])
{
    const __m256 t0 = _mm256_unpacklo_ps(r[0], r[1]), t1 = _mm256_unpackhi_ps(r[0], r[1]);
    const __m256 t2 = _mm256_unpacklo_ps(r[2], r[3]), t3 = _mm256_unpackhi_ps(r[2], r[3]);
    const __m256 t4 = _mm256_unpacklo_ps(r[4], r[5]), t5 = _mm256_unpackhi_ps(r[4], r[5]);
    const __m256 t6 = _mm256_unpacklo_ps(r[6], r[7]), t7 = _mm256_unpackhi_ps(r[6], r[7]);
    const __m256 u0 = _mm256_shuffle_ps(t0, t2, 0x44), u1 = _mm256_shuffle_ps(t0, t2, 0xEE);
    const __m256 u2 = _mm256_shuffle_ps(t1, t3, 0x44), u3 = _mm256_shuffle_ps(t1, t3, 0xEE);
    const __m256 u4 = _mm256_shuffle_ps(t4, t6, 0x44), u5 = _mm256_shuffle_ps(t4, t6, 0xEE);
    const __m256 u6 = _mm256_shuffle_ps(t5, t7, 0x44), u7 = _mm256_shuffle_ps(t5, t7, 0xEE);
    r[0] = _mm256_permute2f128_ps(u0, u4, 0x20), r[4] = _mm256_permute2f128_ps(u0, u4, 0x31);
    r[1] = _mm256_permute2f128_ps(u1, u5, 0x20), r[5] = _mm256_permute2f128_ps(u1, u5, 0x31);
    r[2] = _mm256_permute2f128_ps(u2, u6, 0x20), r[6] = _mm256_permute2f128_ps(u2, u6, 0x31);
    r[3] = _mm256_permute2f128_ps(u3, u7, 0x20), r[7] = _mm256_permute2f128_ps(u3, u7, 0x31);
}
enum { WINO_BLOCK = 8 };

/* The lanes below n set: a mask for the first n elements of a block. */
static inline __m256i first_n(int n)
{
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

/* One 8-sample x 8-element block at element c, samples h..h+7 (n < 8: the first n elements
 * only, read and written under a mask, for rows shorter than a block). */
static void block_to_lanes(const ch_real *from, size_t ss, int h, int c, int n, ch_real *to)
{
    __m256 r[8];
    for (int i = 0; i < 8; i++)
        r[i] = n == 8 ? _mm256_loadu_ps(from + (size_t)(h + i) * ss + c)
                      : _mm256_maskload_ps(from + (size_t)(h + i) * ss + c, first_n(n));
    transpose8(r);
    for (int j = 0; j < n; j++) _mm256_storeu_ps(to + (size_t)(c + j) * TB + h, r[j]);
}

/* Eight floats rounded to bf16 as core/bf16.h's ch_bf16_from_float does (to nearest even, a NaN
 * kept a NaN), in integer lanes; where the CPU has AVX512-BF16, by its instruction (which also
 * flushes subnormal values to zero: wino_body.h's store_points_bf16 says why). */
static inline __m128i bf16x8(__m256 v)
{
#if defined(__AVX512BF16__) && defined(__AVX512VL__)
    return (__m128i)_mm256_cvtneps_pbh(v);
#else
    const __m256i u = _mm256_castps_si256(v), hi = _mm256_srli_epi32(u, 16);
    const __m256i lsb = _mm256_and_si256(hi, _mm256_set1_epi32(1));
    const __m256i rounded = _mm256_srli_epi32(
        _mm256_add_epi32(u, _mm256_add_epi32(_mm256_set1_epi32(0x7fff), lsb)), 16);
    const __m256i quiet = _mm256_or_si256(hi, _mm256_set1_epi32(0x40));
    const __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, _mm256_set1_epi32(0x7fffffff)),
                                           _mm256_set1_epi32(0x7f800000));
    const __m256i r = _mm256_blendv_epi8(rounded, quiet, nan);
    /* Each 128-bit half packs its four values twice; quadwords 0 and 2 are the eight in order. */
    const __m256i packed = _mm256_packus_epi32(r, r);
    return _mm256_castsi256_si128(_mm256_permute4x64_epi64(packed, 0x08));
#endif
}

static void block_to_rows(const ch_real *from, int h, int live, int c, int n, ch_real *to, size_t ss)
{
    __m256 r[8];
    for (int j = 0; j < 8; j++)
        r[j] = j < n ? _mm256_loadu_ps(from + (size_t)(c + j) * TB + h) : _mm256_setzero_ps();
    transpose8(r);
    for (int i = 0; i < 8 && h + i < live; i++) {
        const size_t at = (size_t)(h + i) * ss + c;
        if (n == 8)
            _mm256_storeu_ps(to + at, r[i]);
        else
            _mm256_maskstore_ps(to + at, first_n(n), r[i]);
    }
}

#endif

/* TB floats rounded to bf16 (bf16x16, bf16x8 or ch_bf16_from_float, by build): a Winograd output
 * written in bf16, rounded as its transform stores it into planes of bf16 vectors, and each point
 * of a transformed tile as it is stored into a bf16 chunk buffer (store_points_bf16). */
static inline void lanes_to_bf16(const ch_real *from, uint16_t *to)
{
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && defined(__AVX512DQ__) && \
    !defined(CH_REAL_DOUBLE)
    _mm256_storeu_si256((__m256i *)to, bf16x16(_mm512_loadu_ps(from)));
#elif defined(__AVX2__) && !defined(CH_REAL_DOUBLE)
    for (int h = 0; h < TB; h += 8) _mm_storeu_si128((__m128i *)(to + h), bf16x8(_mm256_loadu_ps(from + h)));
#else
    for (int l = 0; l < TB; l++) to[l] = ch_bf16_from_float((float)from[l]);
#endif
}

#if defined(__AVX2__) && !defined(CH_REAL_DOUBLE)
/* Where the block at element c of a row of len elements starts, and how many it holds: whole
 * blocks, then the rest as one block ending at len (it rewrites a few elements with the same
 * values) or, in a row shorter than a block, one masked block. */
static inline void block_span(int len, int c, int *at, int *n)
{
    *at = c, *n = WINO_BLOCK;
    if (c + WINO_BLOCK > len) {
        if (len >= WINO_BLOCK)
            *at = len - WINO_BLOCK;
        else
            *n = len;
    }
}
#endif

static void rows_to_lanes(const ch_real *from, size_t ss, int live, int len, ch_real *restrict to)
{
#if defined(__AVX2__) && !defined(CH_REAL_DOUBLE)
    if (live == TB) {
        for (int c = 0, at, n; c < len; c += WINO_BLOCK) {
            block_span(len, c, &at, &n);
            for (int h = 0; h < TB; h += WINO_BLOCK) block_to_lanes(from, ss, h, at, n, to);
        }
        return;
    }
#endif
    for (int c = 0; c < len; c++)
        for (int s = 0; s < live; s++) to[(size_t)c * TB + s] = from[(size_t)s * ss + c];
}

/* rows_to_lanes from bf16 rows into bf16 lanes, full groups (live == TB) or not (an AVX2 build
 * moves them one at a time). */
static void rows_to_lanes16(const uint16_t *from, size_t ss, int live, int len, uint16_t *restrict to)
{
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && defined(__AVX512DQ__) && \
    !defined(CH_REAL_DOUBLE)
    if (live == TB) {
        for (int c = 0, at, n; c < len; c += WINO_BLOCK) {
            block_span(len, c, &at, &n);
            block16_to_lanes16(from, ss, 0, at, n, to);
        }
        return;
    }
#endif
    for (int c = 0; c < len; c++)
        for (int s = 0; s < live; s++) to[(size_t)c * TB + s] = from[(size_t)s * ss + c];
}

static void lanes_to_rows(const ch_real *restrict from, int live, int len, ch_real *to, size_t ss)
{
#if defined(__AVX2__) && !defined(CH_REAL_DOUBLE)
    for (int c = 0, at, n; c < len; c += WINO_BLOCK) {
        block_span(len, c, &at, &n);
        for (int h = 0; h < live; h += WINO_BLOCK) block_to_rows(from, h, live, at, n, to, ss);
    }
#else
    for (int c = 0; c < len; c++)
        for (int s = 0; s < live; s++) to[(size_t)s * ss + c] = from[(size_t)c * TB + s];
#endif
}

/* lanes_to_rows from bf16 lanes into bf16 rows. */
static void lanes16_to_rows16(const uint16_t *restrict from, int live, int len, uint16_t *to, size_t ss)
{
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && defined(__AVX512DQ__) && \
    !defined(CH_REAL_DOUBLE)
    for (int c = 0, at, n; c < len; c += WINO_BLOCK) {
        block_span(len, c, &at, &n);
        block16_to_rows16(from, live, at, n, to, ss);
    }
#else
    for (int c = 0; c < len; c++)
        for (int s = 0; s < live; s++) to[(size_t)s * ss + c] = from[(size_t)c * TB + s];
#endif
}

/* Zeros in a full group's border: the rows above and below the data, and the columns either
 * side of it (a memset of the whole group before was 3% of ResNet-20's step). */
static void zero_border(wlayout l, void *grp, size_t es)
{
    const size_t row = (size_t)l.pw * TB * es, left = (size_t)l.pad * TB * es;
    const size_t right = (size_t)(l.pw - l.pad - l.w) * TB * es;
    for (int p = 0; p < l.planes; p++) {
        char *pl = (char *)grp + (size_t)p * l.ph * row;
        memset(pl, 0, row * (size_t)l.pad);
        for (int r = l.pad; r < l.pad + l.h; r++) {
            memset(pl + (size_t)r * row, 0, left);
            memset(pl + (size_t)r * row + left + (size_t)l.w * TB * es, 0, right);
        }
        memset(pl + (size_t)(l.pad + l.h) * row, 0, row * (size_t)(l.ph - l.pad - l.h));
    }
}

/* The samples' rows from t into the group's planes, in t's precision: fp32 lanes, or from bf16
 * rows bf16 lanes, half the bytes, the values moved (the transforms widen them as they read a
 * window: exactly, so the same bits as planes in fp32). */
static void pack_group(wlayout l, wsrc t, int live, void *grp)
{
    const bool lanes16 = t.h != NULL;
    const size_t es = lanes16 ? sizeof(uint16_t) : sizeof(ch_real);
    if (live < TB)
        memset(grp, 0, es * group_len(l));
    else if (l.ph != l.h || l.pw != l.w)
        zero_border(l, grp, es);
    const size_t plane = (size_t)l.h * l.w, ss = plane * l.planes;
    const bool whole = l.ph == l.h && l.pw == l.w;   /* a plane without a border: one row */
    for (int p = 0; p < l.planes; p++)
        for (int r = 0; r < (whole ? 1 : l.h); r++) {
            const wsrc from = src_at(t, p * plane + (size_t)r * l.w);
            const int len = whole ? (int)plane : l.w;
            const size_t at = (((size_t)p * l.ph + r + l.pad) * l.pw + l.pad) * TB;
            if (lanes16) rows_to_lanes16(from.h, ss, live, len, (uint16_t *)grp + at);
            else rows_to_lanes(from.f, ss, live, len, (ch_real *)grp + at);
        }
}

/* The inverse: the group's lanes 0 .. live-1 back into the tensor (the border dropped), in t's
 * precision: fp32, or bf16 lanes into bf16 rows (an output rounded as its transform stored it).
 * Planes without a border go as one row. */
static void unpack_group(wlayout l, const void *grp, int live, wdest t)
{
    const bool lanes16 = t.h != NULL;
    const size_t plane = (size_t)l.h * l.w, ss = plane * l.planes;
    const bool whole = l.ph == l.h && l.pw == l.w;
    for (int p = 0; p < l.planes; p++)
        for (int r = 0; r < (whole ? 1 : l.h); r++) {
            const wdest to = dest_at(t, (size_t)p * plane + (size_t)r * l.w);
            const int len = whole ? (int)plane : l.w;
            const size_t at = (((size_t)p * l.ph + r + l.pad) * l.pw + l.pad) * TB;
            if (lanes16) lanes16_to_rows16((const uint16_t *)grp + at, live, len, to.h, ss);
            else lanes_to_rows((const ch_real *)grp + at, live, len, to.f, ss);
        }
}
