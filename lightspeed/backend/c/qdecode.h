/* Decoders of GGUF block formats into float32, written as simple loops gcc vectorises.
 * Layouts are documented in lightspeed/quant/formats.py. Each decodes one block. */

static inline float ls_f16(const uint8_t *p) { _Float16 h; memcpy(&h, p, 2); return (float)h; }

static inline void ls_dq_q8_0(const uint8_t *b, float *restrict w) {
    const float d = ls_f16(b);
    const int8_t *q = (const int8_t *)(b + 2);
    for (int i = 0; i < 32; i++) w[i] = d * (float)q[i];
}

static inline void ls_dq_q4_0(const uint8_t *b, float *restrict w) {
    const float d = ls_f16(b);
    const uint8_t *qs = b + 2;
    for (int i = 0; i < 16; i++) {
        w[i] = d * (float)((int)(qs[i] & 15) - 8);
        w[i + 16] = d * (float)((int)(qs[i] >> 4) - 8);
    }
}

static inline void ls_dq_q4_1(const uint8_t *b, float *restrict w) {
    const float d = ls_f16(b), m = ls_f16(b + 2);
    const uint8_t *qs = b + 4;
    for (int i = 0; i < 16; i++) {
        w[i] = d * (float)(qs[i] & 15) + m;
        w[i + 16] = d * (float)(qs[i] >> 4) + m;
    }
}

static inline void ls_dq_q5_0(const uint8_t *b, float *restrict w) {
    const float d = ls_f16(b);
    uint32_t qh;
    memcpy(&qh, b + 2, 4);
    const uint8_t *qs = b + 6;
    for (int i = 0; i < 16; i++) {
        int lo = (qs[i] & 15) | (int)(((qh >> i) & 1u) << 4);
        int hi = (qs[i] >> 4) | (int)(((qh >> (i + 16)) & 1u) << 4);
        w[i] = d * (float)(lo - 16);
        w[i + 16] = d * (float)(hi - 16);
    }
}

static inline void ls_dq_q4_k(const uint8_t *b, float *restrict w) {
    const float d = ls_f16(b), dmin = ls_f16(b + 2);
    const uint8_t *sc = b + 4, *qs = b + 16;
    for (int c = 0; c < 4; c++) {
        for (int h = 0; h < 2; h++) {
            int j = 2 * c + h, s, m;
            if (j < 4) {
                s = sc[j] & 63;
                m = sc[j + 4] & 63;
            } else {
                s = (sc[j + 4] & 15) | ((sc[j - 4] >> 6) << 4);
                m = (sc[j + 4] >> 4) | ((sc[j] >> 6) << 4);
            }
            const float ds = d * (float)s, dm = dmin * (float)m;
            for (int l = 0; l < 32; l++) {
                int nib = h ? (qs[32 * c + l] >> 4) : (qs[32 * c + l] & 15);
                w[64 * c + 32 * h + l] = ds * (float)nib - dm;
            }
        }
    }
}

static inline void ls_dq_q6_k(const uint8_t *b, float *restrict w) {
    const uint8_t *ql = b, *qh = b + 128;
    const int8_t *scales = (const int8_t *)(b + 192);
    const float d = ls_f16(b + 208);
    for (int n = 0; n < 2; n++) {
        for (int k = 0; k < 4; k++) {
            for (int l = 0; l < 32; l++) {
                int byte = ql[64 * n + 32 * (k % 2) + l];
                int low = (k / 2) ? (byte >> 4) : (byte & 15);
                int top = (qh[32 * n + l] >> (2 * k)) & 3;
                float s = d * (float)scales[8 * n + 2 * k + l / 16];
                w[128 * n + 32 * k + l] = s * (float)((low | (top << 4)) - 32);
            }
        }
    }
}

/* xsum[r * nb + b] = the sum of block b (32 values) of row r, for r < mr (q4_1's min term) */
static inline void ls_block_sums(const float *restrict x, int64_t mr, int64_t K, float *restrict xsum) {
    const int64_t nb = K / 32;
    for (int64_t r = 0; r < mr; r++)
        for (int64_t b = 0; b < nb; b++) {
            float t = 0.0f;
            _Pragma("omp simd reduction(+:t)")
            for (int i = 0; i < 32; i++) t += x[r * K + 32 * b + i];
            xsum[r * nb + b] = t;
        }
}

/* Dot products of one weight row (nblk blocks of 32) with up to LS_QMM_ROWS activation rows (row stride K),
 * for the 32-element formats: each weight block is loaded and decoded once, then multiplied into every
 * row, so a batch of up to 8 rows (batched decode) reads and decodes the weights once. Each row's
 * arithmetic does not depend on how many rows share the pass: a sequence's result is the same alone or
 * batched. Elsewhere the portable decoders above are used. */
#define LS_QMM_ROWS 8
#ifndef LS_QMM_PREFETCH
#define LS_QMM_PREFETCH 4096
#endif
#if LS_QMM_PREFETCH > 0
#define LS_PF(...) __builtin_prefetch(__VA_ARGS__)
#else
#define LS_PF(...) ((void)0)
#endif
/* a switch over the row count calling an always-inlined body with a constant row count, so that the
 * accumulators of every row live in registers */
#define LS_QMM_DISPATCH(BODY, ...) do { switch (mr) { \
    case 1: BODY(__VA_ARGS__, 1); break; case 2: BODY(__VA_ARGS__, 2); break; \
    case 3: BODY(__VA_ARGS__, 3); break; case 4: BODY(__VA_ARGS__, 4); break; \
    case 5: BODY(__VA_ARGS__, 5); break; case 6: BODY(__VA_ARGS__, 6); break; \
    case 7: BODY(__VA_ARGS__, 7); break; default: BODY(__VA_ARGS__, 8); break; } } while (0)

#if defined(__AVX2__)
#include <immintrin.h>
/* horizontal sum of 8 floats (used by the AVX2 and int8 dot products) */
static inline float ls_hsum256(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
    return _mm_cvtss_f32(s);
}
/* vpshufb masks that put bytes 0-3 | 4-7 (or 8-11 | 12-15) of a 16-byte row held in both 128-bit lanes into
 * the low byte of each 32-bit lane, zeroing the rest: in-lane shuffles, cheaper on Zen 3 than widening halves
 * across lanes (vpmovzxbd from a register; one-row Q4_1 matmul 0.71x the time, eight rows 0.88x) */
#define LS_BYTES_TO_DWORDS_0_7 _mm256_setr_epi8(0, -1, -1, -1, 1, -1, -1, -1, 2, -1, -1, -1, 3, -1, -1, -1, \
    4, -1, -1, -1, 5, -1, -1, -1, 6, -1, -1, -1, 7, -1, -1, -1)
#define LS_BYTES_TO_DWORDS_8_15 _mm256_setr_epi8(8, -1, -1, -1, 9, -1, -1, -1, 10, -1, -1, -1, 11, -1, -1, -1, \
    12, -1, -1, -1, 13, -1, -1, -1, 14, -1, -1, -1, 15, -1, -1, -1)
/* 8 signed / unsigned bytes widened to floats (also used by qgemm.h's AVX2 kernels on AVX-512 CPUs) */
static inline __m256 ls_i8x8_ps(__m128i v) { return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(v)); }
static inline __m256 ls_u8x8_ps(__m128i v) { return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(v)); }
/* a float16 field broadcast to 8 floats (two instructions where the scalar conversion takes four) */
static inline __m256 ls_bcast8_f16(const uint8_t *p) {
#if defined(__F16C__)
    int16_t h; memcpy(&h, p, 2); return _mm256_cvtph_ps(_mm_set1_epi16(h));
#else
    return _mm256_set1_ps(ls_f16(p));
#endif
}
#endif

#if defined(__AVX512F__)
#include <immintrin.h>

static inline __m512 ls_bcast_f16(const uint8_t *p) { return _mm512_set1_ps(ls_f16(p)); }

#define LS_DEC_Q8_0(b, w0, w1) do { \
    const __m512 d_ = ls_bcast_f16(b); \
    w0 = _mm512_mul_ps(d_, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)((b) + 2))))); \
    w1 = _mm512_mul_ps(d_, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)((b) + 18))))); \
} while (0)

#define LS_NIBBLES(q, lo, hi) do { \
    const __m128i bytes_ = _mm_loadu_si128((const __m128i *)(q)); \
    lo = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_and_si128(bytes_, _mm_set1_epi8(15)))); \
    hi = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_and_si128(_mm_srli_epi16(bytes_, 4), _mm_set1_epi8(15)))); \
} while (0)

#define LS_DEC_Q4_0(b, w0, w1) do { \
    const __m512 d_ = ls_bcast_f16(b), off_ = _mm512_set1_ps(-8.0f); \
    __m512 lo_, hi_; LS_NIBBLES((b) + 2, lo_, hi_); \
    w0 = _mm512_mul_ps(d_, _mm512_add_ps(lo_, off_)); w1 = _mm512_mul_ps(d_, _mm512_add_ps(hi_, off_)); \
} while (0)

#define LS_DEC_Q4_1(b, w0, w1) do { \
    const __m512 d_ = ls_bcast_f16(b), m_ = ls_bcast_f16((b) + 2); \
    __m512 lo_, hi_; LS_NIBBLES((b) + 4, lo_, hi_); \
    w0 = _mm512_fmadd_ps(d_, lo_, m_); w1 = _mm512_fmadd_ps(d_, hi_, m_); \
} while (0)

/* two accumulators per row (16 zmm registers at 8 rows) */
#define LS_QDOT_AVX512(NAME, DEC, BB) \
static inline __attribute__((always_inline)) void NAME##_rows(const uint8_t *restrict w, const float *restrict x, \
        int64_t K, int64_t nblk, float *restrict out, int64_t ostride, const int MR) { \
    __m512 a0[LS_QMM_ROWS], a1[LS_QMM_ROWS]; \
    for (int r = 0; r < MR; r++) { a0[r] = _mm512_setzero_ps(); a1[r] = _mm512_setzero_ps(); } \
    for (int64_t b = 0; b < nblk; b++) { \
        LS_PF(w + b * (BB) + LS_QMM_PREFETCH, 0, 3); \
        __m512 w0, w1; DEC(w + b * (BB), w0, w1); \
        _Pragma("GCC unroll 8") \
        for (int r = 0; r < MR; r++) { \
            a0[r] = _mm512_fmadd_ps(w0, _mm512_loadu_ps(x + r * K + 32 * b), a0[r]); \
            a1[r] = _mm512_fmadd_ps(w1, _mm512_loadu_ps(x + r * K + 32 * b + 16), a1[r]); \
        } \
    } \
    for (int r = 0; r < MR; r++) out[r * ostride] = _mm512_reduce_add_ps(_mm512_add_ps(a0[r], a1[r])); \
} \
static inline void NAME(const uint8_t *restrict w, const float *restrict x, const float *restrict xsum, \
                        int64_t K, int64_t nblk, int64_t mr, float *restrict out, int64_t ostride) { \
    (void)xsum; LS_QMM_DISPATCH(NAME##_rows, w, x, K, nblk, out, ostride); \
}
LS_QDOT_AVX512(ls_qdot_q8_0, LS_DEC_Q8_0, 34)
LS_QDOT_AVX512(ls_qdot_q4_0, LS_DEC_Q4_0, 18)
LS_QDOT_AVX512(ls_qdot_q4_1, LS_DEC_Q4_1, 20)
#define LS_HAVE_QDOT_q8_0 1
#define LS_HAVE_QDOT_q4_0 1
#define LS_HAVE_QDOT_q4_1 1

#elif defined(__AVX2__) && defined(__FMA__)

/* the same with 256-bit vectors: a block of 32 is four 8-float vectors (ls_i8x8_ps, ls_u8x8_ps above) */

/* A block's values before its scale d (q8_0: q; q4_0: nibble - 8; q4_1: nibble) */
#define LS_VALS_Q8_0(b, v) do { \
    for (int i_ = 0; i_ < 4; i_++) v[i_] = ls_i8x8_ps(_mm_loadl_epi64((const __m128i *)((b) + 2 + 8 * i_))); \
} while (0)
/* a block's 32 nibbles (16 bytes at q: element i < 16 is the low nibble of byte i, element 16 + i the high
 * one) minus OFF, as four 8-float vectors in element order */
#define LS_NIBBLES8(q, v, OFF) do { \
    const __m256i b_ = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(q))); \
    const __m256i t0_ = _mm256_shuffle_epi8(b_, LS_BYTES_TO_DWORDS_0_7); \
    const __m256i t1_ = _mm256_shuffle_epi8(b_, LS_BYTES_TO_DWORDS_8_15); \
    const __m256i m15_ = _mm256_set1_epi32(15), off_ = _mm256_set1_epi32(OFF); \
    v[0] = _mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_and_si256(t0_, m15_), off_)); \
    v[1] = _mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_and_si256(t1_, m15_), off_)); \
    v[2] = _mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_srli_epi32(t0_, 4), off_)); \
    v[3] = _mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_srli_epi32(t1_, 4), off_)); \
} while (0)
#define LS_VALS_Q4_0(b, v) LS_NIBBLES8((b) + 2, v, 8)
#define LS_VALS_Q4_1(b, v) LS_NIBBLES8((b) + 4, v, 0)

/* sum of v[i] * xr[8i..8i+7] as 8 lanes, two short chains */
static inline __m256 ls_dot4x8(const __m256 *v, const float *xr) {
    __m256 p0 = _mm256_mul_ps(v[0], _mm256_loadu_ps(xr)), p1 = _mm256_mul_ps(v[1], _mm256_loadu_ps(xr + 8));
    p0 = _mm256_fmadd_ps(v[2], _mm256_loadu_ps(xr + 16), p0);
    p1 = _mm256_fmadd_ps(v[3], _mm256_loadu_ps(xr + 24), p1);
    return _mm256_add_ps(p0, p1);
}

/* Per row and block, the dot product of the unscaled values with x, then one FMA with the block's scale
 * (fewer operations per row than scaling 32 weights, and one dependent FMA per block). q4_1 (MIN: w =
 * d*v + m) adds m times the block's sum of x, from xsum[r * nblk + b] (ls_block_sums). A row's arithmetic
 * is the same whatever the row count, so batching does not change its result. */
#define LS_QDOT_AVX2(NAME, VALS, BB, MIN) \
static inline __attribute__((always_inline)) void NAME##_rows(const uint8_t *restrict w, const float *restrict x, \
        const float *restrict xsum, int64_t K, int64_t nblk, float *restrict out, int64_t ostride, const int MR) { \
    __m256 acc[LS_QMM_ROWS]; float cm[LS_QMM_ROWS]; \
    for (int r = 0; r < MR; r++) { acc[r] = _mm256_setzero_ps(); cm[r] = 0.0f; } \
    for (int64_t b = 0; b < nblk; b++) { \
        const uint8_t *blk = w + b * (BB); \
        LS_PF(blk + LS_QMM_PREFETCH, 0, 3); \
        __m256 v[4]; VALS(blk, v); \
        const __m256 d = ls_bcast8_f16(blk); \
        const float m = MIN ? ls_f16(blk + 2) : 0.0f; \
        _Pragma("GCC unroll 8") \
        for (int r = 0; r < MR; r++) { \
            acc[r] = _mm256_fmadd_ps(ls_dot4x8(v, x + r * K + 32 * b), d, acc[r]); \
            if (MIN) cm[r] += m * xsum[r * nblk + b]; \
        } \
    } \
    for (int r = 0; r < MR; r++) out[r * ostride] = ls_hsum256(acc[r]) + cm[r]; \
} \
static inline void NAME(const uint8_t *restrict w, const float *restrict x, const float *restrict xsum, \
                        int64_t K, int64_t nblk, int64_t mr, float *restrict out, int64_t ostride) { \
    LS_QMM_DISPATCH(NAME##_rows, w, x, xsum, K, nblk, out, ostride); \
}
LS_QDOT_AVX2(ls_qdot_q8_0, LS_VALS_Q8_0, 34, 0)
LS_QDOT_AVX2(ls_qdot_q4_0, LS_VALS_Q4_0, 18, 0)
LS_QDOT_AVX2(ls_qdot_q4_1, LS_VALS_Q4_1, 20, 1)
#define LS_HAVE_QDOT_q8_0 1
#define LS_HAVE_QDOT_q4_0 1
#define LS_HAVE_QDOT_q4_1 1
#endif

#if defined(__AVX2__)
/* helpers of the activation quantizers below: the 32 floats at xb into v[4] and their largest magnitude
 * (exact, as the scalar loop), and the sum of 32 int32 values held in four vectors */
static inline float ls_load_absmax32(const float *xb, __m256 *v) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    for (int i = 0; i < 4; i++) v[i] = _mm256_loadu_ps(xb + 8 * i);
    const __m256 a = _mm256_max_ps(_mm256_max_ps(_mm256_andnot_ps(sign, v[0]), _mm256_andnot_ps(sign, v[1])),
                                   _mm256_max_ps(_mm256_andnot_ps(sign, v[2]), _mm256_andnot_ps(sign, v[3])));
    __m128 h = _mm_max_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    h = _mm_max_ps(h, _mm_movehl_ps(h, h));
    h = _mm_max_ss(h, _mm_shuffle_ps(h, h, 1));
    return _mm_cvtss_f32(h);
}
static inline int32_t ls_sum32_epi32(const __m256i *iv) {
    const __m256i t = _mm256_add_epi32(_mm256_add_epi32(iv[0], iv[1]), _mm256_add_epi32(iv[2], iv[3]));
    __m128i t4 = _mm_add_epi32(_mm256_castsi256_si128(t), _mm256_extracti128_si256(t, 1));
    t4 = _mm_add_epi32(t4, _mm_shuffle_epi32(t4, 0x4e));
    t4 = _mm_add_epi32(t4, _mm_shuffle_epi32(t4, 0xb1));
    return _mm_cvtsi128_si32(t4);
}
#endif

/* ---- int8 activations (as GGUF's Q8_0 x Q8_0 dot products): each activation row is quantized per
 * block of 32 to int8 with a float scale, and weight blocks are multiplied in integer arithmetic.
 * ls_quantize_rows writes, for M rows of K floats: q[M][K] int8, d[M][K/32] float (the scales) and
 * s[M][K/32] float (each block's scale times the sum of its int8 values, for the min term of Q4_1). */
static inline void ls_quantize_rows(const float *restrict x, int64_t M, int64_t K, int8_t *restrict q,
                                    float *restrict d, float *restrict s) {
    const int64_t nb = K / 32;
    for (int64_t m = 0; m < M; m++) {
        for (int64_t b = 0; b < nb; b++) {
            const float *xb = x + m * K + 32 * b;
            int8_t *qb = q + m * K + 32 * b;
#if defined(__AVX2__)
            /* the same values as the loops below, vectorised (gcc leaves the max reduction scalar) */
            __m256 v[4];
            const float amax = ls_load_absmax32(xb, v);
            const float scale = amax / 127.0f, inv = amax > 0.0f ? 127.0f / amax : 0.0f;
            __m256i iv[4];
            for (int i = 0; i < 4; i++)
                iv[i] = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(v[i], _mm256_set1_ps(inv)),
                                                           _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
            /* int32 -> int8; the packs interleave 128-bit lanes, the permutation restores the order */
            const __m256i p16 = _mm256_packs_epi16(_mm256_packs_epi32(iv[0], iv[1]), _mm256_packs_epi32(iv[2], iv[3]));
            _mm256_storeu_si256((__m256i *)qb, _mm256_permutevar8x32_epi32(p16, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
            const int32_t sum = ls_sum32_epi32(iv);
#else
            float amax = 0.0f;
            for (int i = 0; i < 32; i++) { float v = fabsf(xb[i]); amax = v > amax ? v : amax; }
            const float scale = amax / 127.0f, inv = amax > 0.0f ? 127.0f / amax : 0.0f;
            int32_t sum = 0;
            for (int i = 0; i < 32; i++) {
                int v = (int)__builtin_nearbyintf(xb[i] * inv);
                qb[i] = (int8_t)v;
                sum += v;
            }
#endif
            d[m * nb + b] = scale;
            s[m * nb + b] = scale * (float)sum;
        }
    }
}

#if (defined(__AVX512VNNI__) && defined(__AVX512VL__)) || defined(__AVX2__)
#include <immintrin.h>
/* sum over 32 lanes of u8 * s8 products, as 8 int32 partial sums (the same with or without VNNI: no pair of
 * products reaches maddubs' int16 saturation, as |x| <= 127 and |w| <= 128; LS_NO_VNNI measures the difference) */
static inline __m256i ls_dot_u8s8(__m256i u, __m256i s) {
#if defined(__AVX512VNNI__) && defined(__AVX512VL__) && !defined(LS_NO_VNNI)
    return _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, s);
#else
    return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
#endif
}
/* the 32 nibbles of a q4 block in element order (low nibbles, then high), minus OFF, as bytes */
static inline __m256i ls_nibbles32(const uint8_t *q, int off) {
    const __m128i bytes = _mm_loadu_si128((const __m128i *)q), m15 = _mm_set1_epi8(15);
    const __m128i lo = _mm_and_si128(bytes, m15), hi = _mm_and_si128(_mm_srli_epi16(bytes, 4), m15);
    return _mm256_sub_epi8(_mm256_set_m128i(hi, lo), _mm256_set1_epi8((char)off));
}

/* One weight row (nblk blocks) against up to LS_QMM_ROWS quantized activation rows (strides K and nblk).
 * SIGNED formats (q8_0; q4_0 as nibble - 8) multiply |w| by x carrying w's sign, so |w| is computed
 * once per block for every row; q4_1 multiplies its unsigned nibbles directly and adds m * d_x * sum(x)
 * per block. A row's arithmetic is the same whatever the row count (batching does not change it). */
#define LS_I8_WEIGHTS(b, WVALS) \
    const uint8_t *blk_ = w + (b) * BB_; \
    const __m256i wv_ = WVALS(blk_); \
    const __m256i wu_ = SIGNED_ ? _mm256_sign_epi8(wv_, wv_) : wv_; \
    const __m256 dw_ = ls_bcast8_f16(blk_);
#define LS_I8_ROW(b, r, acc) do { \
    __m256i xv_ = _mm256_loadu_si256((const __m256i *)(xq + (r) * K + 32 * (b))); \
    if (SIGNED_) xv_ = _mm256_sign_epi8(xv_, wv_); \
    acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(ls_dot_u8s8(wu_, xv_)), \
                          _mm256_mul_ps(dw_, _mm256_broadcast_ss(xd + (r) * nblk + (b))), acc); \
    if (MIN_) corr[r] += ls_f16(blk_ + 2) * xs[(r) * nblk + (b)]; \
} while (0)
#define LS_QDOT_I8(NAME, BB, SIGNED, WVALS, MIN) \
static inline __attribute__((always_inline)) void NAME##_rows(const uint8_t *restrict w, const int8_t *restrict xq, \
        const float *restrict xd, const float *restrict xs, int64_t K, int64_t nblk, float *restrict out, \
        int64_t ostride, const int MR) { \
    enum { BB_ = BB, SIGNED_ = SIGNED, MIN_ = MIN }; \
    __m256 acc[LS_QMM_ROWS]; float corr[LS_QMM_ROWS]; \
    for (int r = 0; r < MR; r++) { acc[r] = _mm256_setzero_ps(); corr[r] = 0.0f; } \
    for (int64_t b = 0; b < nblk; b++) { \
        LS_PF(w + b * (BB) + LS_QMM_PREFETCH, 0, 3); \
        LS_I8_WEIGHTS(b, WVALS) \
        _Pragma("GCC unroll 8") \
        for (int r = 0; r < MR; r++) LS_I8_ROW(b, r, acc[r]); \
    } \
    for (int r = 0; r < MR; r++) out[r * ostride] = ls_hsum256(acc[r]) + corr[r]; \
} \
static inline void NAME(const uint8_t *restrict w, const int8_t *restrict xq, const float *restrict xd, \
                        const float *restrict xs, int64_t K, int64_t nblk, int64_t mr, \
                        float *restrict out, int64_t ostride) { \
    LS_QMM_DISPATCH(NAME##_rows, w, xq, xd, xs, K, nblk, out, ostride); \
}
/* a block's 32 weights as bytes: int8 (q8_0, q4_0 nibble - 8) or uint8 (q4_1 nibble) */
#define LS_W8_Q8_0(p) _mm256_loadu_si256((const __m256i *)((p) + 2))
#define LS_W8_Q4_0(p) ls_nibbles32((p) + 2, 8)
#define LS_W8_Q4_1(p) ls_nibbles32((p) + 4, 0)
LS_QDOT_I8(ls_qdot8_q8_0, 34, 1, LS_W8_Q8_0, 0)
LS_QDOT_I8(ls_qdot8_q4_0, 18, 1, LS_W8_Q4_0, 0)
LS_QDOT_I8(ls_qdot8_q4_1, 20, 0, LS_W8_Q4_1, 1)
#define LS_HAVE_QDOT8 1
#endif

/* ---- int16 activations: each activation row is quantized per block of 32 to int16 with a float scale
 * (amax / 32639, see below: 1/257 of int8's rounding error, ~2e-5 relative error in a product), and the
 * weights, widened to int16, are multiplied in integer arithmetic (madd: pairs of int16 products summed
 * into int32 lanes; |w| <= 128 and |x| <= 32639, so 32 products fit easily). ls_quantize_rows16 writes,
 * for M rows of K floats: q[M][K] int16, d[M][K/32] float scales and s[M][K/32] float (scale times the
 * sum of the block's int16 values, for the min term of Q4_1). Its vector and scalar forms give the same
 * values (max is exact; both round with the current rounding mode, nearest-even by default). */
/* Activations "auto" (LS_QUANT_ROWS_MAX defined, AVX-512 builds): a call of more rows than that (prefill)
 * keeps its activations float, as the float row-group kernel is faster there than int16 (SmolLM2 prefill,
 * this Xeon: int16 0.86x of float) while int16 is faster for few rows (decode 1.7x). The launcher quantizes
 * once per call and passes only the scratch to the dot products, so the choice travels in the scratch:
 * each row's first scale is LS_FLOAT_ROWS (a scale amax / 32639 is never negative) and its int16 values
 * begin with the address of the row's floats. The dot products then run the float kernel with the
 * arguments activations "float" pass it, so those calls give float's bits exactly. */
#define LS_FLOAT_ROWS (-1.0f)
#if defined(LS_QUANT_ROWS_MAX) && defined(__AVX512F__) && defined(__AVX512BW__) && !defined(LS_PORTABLE)
#define LS_AUTO_FLOAT_ROWS 1
#define LS_FLOAT_ROWS_CALL(FNAME) \
    if (xd[0] == LS_FLOAT_ROWS) { \
        const float *xf_; memcpy(&xf_, xq, sizeof xf_); FNAME(w, xf_, 0, K, nblk, mr, out, ostride); return; \
    }
#else
#define LS_FLOAT_ROWS_CALL(FNAME)
#endif
/* Activations "auto" on AVX2 without AVX-512: a call of more rows than LS_QUANT_ROWS_MAX runs qgemm.h's float
 * kernel instead (the renderer emits that branch), so the launcher leaves its rows unquantized. The per-row
 * int16 kernels are faster for a few rows there (decode) and slower for more (activations.py). */
#if defined(LS_QUANT_ROWS_MAX) && defined(__AVX2__) && defined(__FMA__) && !defined(__AVX512F__) \
    && !defined(LS_PORTABLE)
#define LS_AUTO_QGEMM 1
#endif
/* The scale is amax / 32639 (32639 = 127 * 257) in every build, so that a value q splits exactly into two signed
 * bytes, q = 256 * a + b with a, b in [-127, 127] x [-128, 127]; the step is 1.004x that of amax / 32767.
 * With SPLIT (the kernels of qdot16x16.h, 16 weight rows at once, which multiply the bytes by unsigned weight
 * bytes with vpdpbusd) it stores the split: per block the 32 bytes a then the 32 bytes b, both in element order.
 * Those and the int16 kernels below compute the same integer products, so they agree to float rounding.
 * LS_SPLIT16_<format>: the SPLIT a format's matmuls quantize with (1 where its 16-row kernel is built). q8_0's
 * kernel alone streams one activation row (decode) ~6% slower than ls_qdot16_q8_0 but eight 1.9x faster; in
 * the whole model (SmolLM2's q8_0 LM head) decode measured no slower and eight served streams ~15% faster, so
 * it is built by default too; -DLS_NO_QDOT16X16_Q8_0 keeps ls_qdot16_q8_0 (benchmarks/README.md). */
#define LS_Q16_MAX 32639.0f
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && defined(__AVX512VNNI__) \
    && !defined(LS_PORTABLE) && !defined(LS_NO_QDOT16X16)
#define LS_HAVE_QDOT16X16 1
#define LS_HAVE_QDOT16X16_q4_0 1
#define LS_HAVE_QDOT16X16_q4_1 1
#define LS_HAVE_QDOT16X16_q5_0 1
#define LS_HAVE_QDOT16X16_q4_k 1
#if !defined(LS_NO_QDOT16X16_Q8_0)
#define LS_HAVE_QDOT16X16_q8_0 1
#endif
#endif
#if defined(LS_HAVE_QDOT16X16)
#define LS_SPLIT16_q4_0 1
#define LS_SPLIT16_q4_1 1
#define LS_SPLIT16_q5_0 1
#else
#define LS_SPLIT16_q4_0 0
#define LS_SPLIT16_q4_1 0
#define LS_SPLIT16_q5_0 0
#endif
#if defined(LS_HAVE_QDOT16X16_q8_0)
#define LS_SPLIT16_q8_0 1
#else
#define LS_SPLIT16_q8_0 0
#endif
static inline void ls_quantize_rows16(const float *restrict x, int64_t M, int64_t K, int16_t *restrict q,
                                      float *restrict d, float *restrict s, const int split) {
    const int64_t nb = K / 32;
#if defined(LS_AUTO_FLOAT_ROWS)
    if (M > LS_QUANT_ROWS_MAX) {
        for (int64_t m = 0; m < M; m++) {
            const float *row = x + m * K;
            memcpy(q + m * K, &row, sizeof row);
            d[m * nb] = LS_FLOAT_ROWS;
        }
        (void)s;
        return;
    }
#endif
#if defined(LS_AUTO_QGEMM)
    if (M > LS_QUANT_ROWS_MAX) return;
#endif
    for (int64_t m = 0; m < M; m++) {
        for (int64_t b = 0; b < nb; b++) {
            const float *xb = x + m * K + 32 * b;
            int16_t *qb = q + m * K + 32 * b;
#if defined(__AVX2__) && !defined(LS_PORTABLE)
            __m256 v[4];
            const float amax = ls_load_absmax32(xb, v);
            const float inv = amax > 0.0f ? LS_Q16_MAX / amax : 0.0f;
            __m256i iv[4];
            for (int i = 0; i < 4; i++) iv[i] = _mm256_cvtps_epi32(_mm256_mul_ps(v[i], _mm256_set1_ps(inv)));
#if defined(LS_HAVE_QDOT16X16)
            if (split) {
            /* b = q's low byte as a signed value, a = (q - b) / 256 (exact); int32 -> int8 as ls_quantize_rows */
            __m256i lo[4], hi[4];
            for (int i = 0; i < 4; i++) {
                lo[i] = _mm256_srai_epi32(_mm256_slli_epi32(iv[i], 24), 24);
                hi[i] = _mm256_srai_epi32(_mm256_sub_epi32(iv[i], lo[i]), 8);
            }
            const __m256i perm = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
            _mm256_storeu_si256((__m256i *)qb, _mm256_permutevar8x32_epi32(_mm256_packs_epi16(
                _mm256_packs_epi32(hi[0], hi[1]), _mm256_packs_epi32(hi[2], hi[3])), perm));
            _mm256_storeu_si256((__m256i *)(qb + 16), _mm256_permutevar8x32_epi32(_mm256_packs_epi16(
                _mm256_packs_epi32(lo[0], lo[1]), _mm256_packs_epi32(lo[2], lo[3])), perm));
            } else
#endif
            {
            /* int32 -> int16 (saturating); the packs interleave 128-bit lanes, the permutation restores the order */
            _mm256_storeu_si256((__m256i *)qb, _mm256_permute4x64_epi64(_mm256_packs_epi32(iv[0], iv[1]), 0xd8));
            _mm256_storeu_si256((__m256i *)(qb + 16), _mm256_permute4x64_epi64(_mm256_packs_epi32(iv[2], iv[3]), 0xd8));
            }
            const int32_t sum = ls_sum32_epi32(iv);
#else
            float amax = 0.0f;
            for (int i = 0; i < 32; i++) { float v = fabsf(xb[i]); amax = v > amax ? v : amax; }
            const float inv = amax > 0.0f ? LS_Q16_MAX / amax : 0.0f;
            int32_t sum = 0;
            for (int i = 0; i < 32; i++) {
                int v = (int)__builtin_nearbyintf(xb[i] * inv);
                v = v > 32767 ? 32767 : v < -32768 ? -32768 : v;
                qb[i] = (int16_t)v;
                sum += v;
            }
#endif
            const float scale = amax / LS_Q16_MAX;
            d[m * nb + b] = scale;
            s[m * nb + b] = scale * (float)sum;
        }
    }
}

/* One weight row (nblk blocks) against up to LS_QMM_ROWS int16 activation rows (strides K and nblk): per
 * row and block an exact integer dot product, then one FMA with the product of the two scales; q4_1 (w =
 * d*nibble + m) adds m * s per block. A row's arithmetic is the same whatever the row count. */
#if defined(__AVX512BW__) && defined(__AVX512F__) && !defined(LS_PORTABLE) && !defined(LS_NO_QDOT16_GATHER)
/* AVX-512: the scales of 16 blocks at a time. One gather takes the first 32 bits of each block (the float16
 * scale d, and q4_1's minimum m after it), so a row's 16 products d * d_x are one vector multiply, stored and
 * read back as broadcasts; per block and row there remain the integer dot product (madd), its conversion and
 * one FMA. A q4 block's 16 bytes are widened once to 32 int16 (both halves the same bytes) and masked with 15
 * (elements 0-15: low nibbles) or 240 (16-31: high nibbles, times 16); the madd lanes 8-15 then hold 16
 * times their products, taken back by an exact 1/16 at the end. The sums stay exact integers below 2^24.
 * Two accumulators per row (even and odd blocks) keep two FMA chains in flight for a single row (decode).
 * -DLS_NO_QDOT16_GATHER forces the per-block form below (tests compare the two). */
#define LS_W16G_Q8_0(p) _mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i *)((p) + 2)))
#define LS_NIB16(q) _mm512_and_si512(_mm512_cvtepu8_epi16(_mm256_broadcastsi128_si256( \
    _mm_loadu_si128((const __m128i *)(q)))), _mm512_setr_epi64(0x000f000f000f000fLL, 0x000f000f000f000fLL, \
    0x000f000f000f000fLL, 0x000f000f000f000fLL, 0x00f000f000f000f0LL, 0x00f000f000f000f0LL, 0x00f000f000f000f0LL, \
    0x00f000f000f000f0LL))
/* q4_0: nibble - 8, the high half times 16 as well (16 * nibble - 128) */
#define LS_W16G_Q4_0(p) _mm512_sub_epi16(LS_NIB16((p) + 2), _mm512_setr_epi64(0x0008000800080008LL, \
    0x0008000800080008LL, 0x0008000800080008LL, 0x0008000800080008LL, 0x0080008000800080LL, 0x0080008000800080LL, \
    0x0080008000800080LL, 0x0080008000800080LL))
#define LS_W16G_Q4_1(p) LS_NIB16((p) + 4)
#define LS_QDOT16_BLOCK(j, acc, BB, WVALS) do { \
    const uint8_t *blk_ = w + (c0 + (j)) * (BB); \
    LS_PF(blk_ + LS_QMM_PREFETCH, 0, 3); \
    const __m512i wv_ = WVALS(blk_); \
    _Pragma("GCC unroll 8") \
    for (int r = 0; r < MR; r++) { \
        const __m512i p_ = _mm512_madd_epi16(wv_, _mm512_loadu_si512((const void *)(xq + r * K + 32 * (c0 + (j))))); \
        acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p_), _mm512_set1_ps(sc[r][j]), acc[r]); \
    } \
} while (0)
#define LS_QDOT_I16(NAME, BB, WVALS, MIN, FNAME, NIB) \
static inline __attribute__((always_inline)) void NAME##_rows(const uint8_t *restrict w, const int16_t *restrict xq, \
        const float *restrict xd, const float *restrict xs, int64_t K, int64_t nblk, float *restrict out, \
        int64_t ostride, const int MR) { \
    __m512 a0[LS_QMM_ROWS], a1[LS_QMM_ROWS], cm[LS_QMM_ROWS]; \
    float sc[LS_QMM_ROWS][16] __attribute__((aligned(64))); \
    for (int r = 0; r < MR; r++) { a0[r] = _mm512_setzero_ps(); a1[r] = a0[r]; cm[r] = a0[r]; } \
    const __m512i offs = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15), \
                                            _mm512_set1_epi32(BB)); \
    for (int64_t c0 = 0; c0 < nblk; c0 += 16) { \
        const int nb = (int)ls_min(16, nblk - c0); \
        const __mmask16 km = (__mmask16)((1u << nb) - 1u); \
        const __m512i head = _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), km, offs, w + c0 * (BB), 1); \
        const __m512 dw = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(head)); \
        const __m512 mw = MIN ? _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(head, 16))) : dw; \
        for (int r = 0; r < MR; r++) { \
            _mm512_store_ps(sc[r], _mm512_mul_ps(dw, _mm512_maskz_loadu_ps(km, xd + r * nblk + c0))); \
            if (MIN) cm[r] = _mm512_fmadd_ps(mw, _mm512_maskz_loadu_ps(km, xs + r * nblk + c0), cm[r]); \
        } \
        /* read the scales back from memory (FMAs with a broadcast operand) rather than permuted in registers, \
         * which gcc otherwise does: two more shuffle-port operations a block */ \
        __asm__ volatile("" : : "r"(sc) : "memory"); \
        int j = 0; \
        for (; j + 1 < nb; j += 2) { LS_QDOT16_BLOCK(j, a0, BB, WVALS); LS_QDOT16_BLOCK(j + 1, a1, BB, WVALS); } \
        if (j < nb) LS_QDOT16_BLOCK(j, a0, BB, WVALS); \
    } \
    const __m512 lanes = NIB ? _mm512_setr_ps(1, 1, 1, 1, 1, 1, 1, 1, 0.0625f, 0.0625f, 0.0625f, 0.0625f, \
                                              0.0625f, 0.0625f, 0.0625f, 0.0625f) : _mm512_set1_ps(1.0f); \
    for (int r = 0; r < MR; r++) \
        out[r * ostride] = _mm512_reduce_add_ps(_mm512_mul_ps(_mm512_add_ps(a0[r], a1[r]), lanes)) \
                           + (MIN ? _mm512_reduce_add_ps(cm[r]) : 0.0f); \
} \
static inline void NAME(const uint8_t *restrict w, const int16_t *restrict xq, const float *restrict xd, \
                        const float *restrict xs, int64_t K, int64_t nblk, int64_t mr, \
                        float *restrict out, int64_t ostride) { \
    LS_FLOAT_ROWS_CALL(FNAME) \
    LS_QMM_DISPATCH(NAME##_rows, w, xq, xd, xs, K, nblk, out, ostride); \
}
LS_QDOT_I16(ls_qdot16_q8_0, 34, LS_W16G_Q8_0, 0, ls_qdot_q8_0, 0)
LS_QDOT_I16(ls_qdot16_q4_0, 18, LS_W16G_Q4_0, 0, ls_qdot_q4_0, 1)
LS_QDOT_I16(ls_qdot16_q4_1, 20, LS_W16G_Q4_1, 1, ls_qdot_q4_1, 1)
#define LS_HAVE_QDOT16_GATHER 1
#elif defined(__AVX512BW__) && defined(__AVX512F__) && !defined(LS_PORTABLE)
/* a block's 32 weights before the scale, as int16 in one zmm */
#define LS_W16_Q8_0(p) _mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i *)((p) + 2)))
#define LS_W16_Q4_0(p) _mm512_cvtepi8_epi16(ls_nibbles32((p) + 2, 8))
#define LS_W16_Q4_1(p) _mm512_cvtepi8_epi16(ls_nibbles32((p) + 4, 0))
#define LS_QDOT_I16(NAME, BB, WVALS, MIN, FNAME) \
static inline __attribute__((always_inline)) void NAME##_rows(const uint8_t *restrict w, const int16_t *restrict xq, \
        const float *restrict xd, const float *restrict xs, int64_t K, int64_t nblk, float *restrict out, \
        int64_t ostride, const int MR) { \
    __m512 acc[LS_QMM_ROWS]; float corr[LS_QMM_ROWS]; \
    for (int r = 0; r < MR; r++) { acc[r] = _mm512_setzero_ps(); corr[r] = 0.0f; } \
    for (int64_t b = 0; b < nblk; b++) { \
        const uint8_t *blk = w + b * (BB); \
        LS_PF(blk + LS_QMM_PREFETCH, 0, 3); \
        const __m512i wv = WVALS(blk); \
        const __m512 dw = _mm512_set1_ps(ls_f16(blk)); \
        _Pragma("GCC unroll 8") \
        for (int r = 0; r < MR; r++) { \
            const __m512i p = _mm512_madd_epi16(wv, _mm512_loadu_si512((const void *)(xq + r * K + 32 * b))); \
            acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p), _mm512_mul_ps(dw, _mm512_set1_ps(xd[r * nblk + b])), acc[r]); \
            if (MIN) corr[r] += ls_f16(blk + 2) * xs[r * nblk + b]; \
        } \
    } \
    for (int r = 0; r < MR; r++) out[r * ostride] = _mm512_reduce_add_ps(acc[r]) + corr[r]; \
} \
static inline void NAME(const uint8_t *restrict w, const int16_t *restrict xq, const float *restrict xd, \
                        const float *restrict xs, int64_t K, int64_t nblk, int64_t mr, \
                        float *restrict out, int64_t ostride) { \
    LS_FLOAT_ROWS_CALL(FNAME) \
    LS_QMM_DISPATCH(NAME##_rows, w, xq, xd, xs, K, nblk, out, ostride); \
}
#elif defined(__AVX2__) && !defined(LS_PORTABLE)
/* a block's 32 weights before the scale, as two vectors of 16 int16 (elements 0-15 and 16-31) */
#define LS_W16_Q8_0(p, lo, hi) do { \
    lo = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)((p) + 2))); \
    hi = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)((p) + 18))); \
} while (0)
#define LS_W16_NIB(q, lo, hi, OFF) do { \
    const __m128i bytes_ = _mm_loadu_si128((const __m128i *)(q)), m15_ = _mm_set1_epi8(15); \
    lo = _mm256_sub_epi16(_mm256_cvtepu8_epi16(_mm_and_si128(bytes_, m15_)), _mm256_set1_epi16(OFF)); \
    hi = _mm256_sub_epi16(_mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(bytes_, 4), m15_)), _mm256_set1_epi16(OFF)); \
} while (0)
#define LS_W16_Q4_0(p, lo, hi) LS_W16_NIB((p) + 2, lo, hi, 8)
#define LS_W16_Q4_1(p, lo, hi) LS_W16_NIB((p) + 4, lo, hi, 0)
#define LS_QDOT_I16(NAME, BB, WVALS, MIN, FNAME) \
static inline __attribute__((always_inline)) void NAME##_rows(const uint8_t *restrict w, const int16_t *restrict xq, \
        const float *restrict xd, const float *restrict xs, int64_t K, int64_t nblk, float *restrict out, \
        int64_t ostride, const int MR) { \
    __m256 acc[LS_QMM_ROWS]; float corr[LS_QMM_ROWS]; \
    for (int r = 0; r < MR; r++) { acc[r] = _mm256_setzero_ps(); corr[r] = 0.0f; } \
    for (int64_t b = 0; b < nblk; b++) { \
        const uint8_t *blk = w + b * (BB); \
        LS_PF(blk + LS_QMM_PREFETCH, 0, 3); \
        __m256i wa, wb; WVALS(blk, wa, wb); \
        const __m256 dw = ls_bcast8_f16(blk); \
        _Pragma("GCC unroll 8") \
        for (int r = 0; r < MR; r++) { \
            const int16_t *xr = xq + r * K + 32 * b; \
            const __m256i p = _mm256_add_epi32(_mm256_madd_epi16(wa, _mm256_loadu_si256((const __m256i *)xr)), \
                                               _mm256_madd_epi16(wb, _mm256_loadu_si256((const __m256i *)(xr + 16)))); \
            acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_mul_ps(dw, _mm256_broadcast_ss(xd + r * nblk + b)), acc[r]); \
            if (MIN) corr[r] += ls_f16(blk + 2) * xs[r * nblk + b]; \
        } \
    } \
    for (int r = 0; r < MR; r++) out[r * ostride] = ls_hsum256(acc[r]) + corr[r]; \
} \
static inline void NAME(const uint8_t *restrict w, const int16_t *restrict xq, const float *restrict xd, \
                        const float *restrict xs, int64_t K, int64_t nblk, int64_t mr, \
                        float *restrict out, int64_t ostride) { \
    LS_QMM_DISPATCH(NAME##_rows, w, xq, xd, xs, K, nblk, out, ostride); \
}
#else
/* portable: a block's 32 weights before the scale, as ints */
#define LS_W16_Q8_0(p, v) do { for (int i_ = 0; i_ < 32; i_++) v[i_] = ((const int8_t *)((p) + 2))[i_]; } while (0)
#define LS_W16_NIB(q, v, OFF) do { \
    for (int i_ = 0; i_ < 16; i_++) { v[i_] = ((q)[i_] & 15) - (OFF); v[i_ + 16] = ((q)[i_] >> 4) - (OFF); } \
} while (0)
#define LS_W16_Q4_0(p, v) LS_W16_NIB((p) + 2, v, 8)
#define LS_W16_Q4_1(p, v) LS_W16_NIB((p) + 4, v, 0)
/* (explicit fmaf: left to the compiler, whether a multiply-add was fused differed with the row count, so a
 * row was rounded differently alone and batched) */
#define LS_QDOT_I16(NAME, BB, WVALS, MIN, FNAME) \
static inline __attribute__((always_inline)) void NAME##_rows(const uint8_t *restrict w, const int16_t *restrict xq, \
        const float *restrict xd, const float *restrict xs, int64_t K, int64_t nblk, float *restrict out, \
        int64_t ostride, const int MR) { \
    float acc[LS_QMM_ROWS], corr[LS_QMM_ROWS]; \
    for (int r = 0; r < MR; r++) { acc[r] = 0.0f; corr[r] = 0.0f; } \
    for (int64_t b = 0; b < nblk; b++) { \
        const uint8_t *blk = w + b * (BB); \
        int32_t wv[32]; WVALS(blk, wv); \
        const float dw = ls_f16(blk); \
        for (int r = 0; r < MR; r++) { \
            const int16_t *xr = xq + r * K + 32 * b; \
            int32_t p = 0; \
            for (int i = 0; i < 32; i++) p += wv[i] * (int32_t)xr[i]; \
            acc[r] = fmaf((float)p, dw * xd[r * nblk + b], acc[r]); \
            if (MIN) corr[r] = fmaf(ls_f16(blk + 2), xs[r * nblk + b], corr[r]); \
        } \
    } \
    for (int r = 0; r < MR; r++) out[r * ostride] = acc[r] + corr[r]; \
} \
static inline void NAME(const uint8_t *restrict w, const int16_t *restrict xq, const float *restrict xd, \
                        const float *restrict xs, int64_t K, int64_t nblk, int64_t mr, \
                        float *restrict out, int64_t ostride) { \
    LS_QMM_DISPATCH(NAME##_rows, w, xq, xd, xs, K, nblk, out, ostride); \
}
#endif
#if !defined(LS_HAVE_QDOT16_GATHER)
LS_QDOT_I16(ls_qdot16_q8_0, 34, LS_W16_Q8_0, 0, ls_qdot_q8_0)
LS_QDOT_I16(ls_qdot16_q4_0, 18, LS_W16_Q4_0, 0, ls_qdot_q4_0)
LS_QDOT_I16(ls_qdot16_q4_1, 20, LS_W16_Q4_1, 1, ls_qdot_q4_1)
#endif
