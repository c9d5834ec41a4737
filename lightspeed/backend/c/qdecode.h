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

/* Dot products of one weight row (nblk blocks of 32) with up to 4 activation rows, for the
 * 32-element formats. With AVX-512 each block is decoded into two 16-float vectors once and
 * multiplied into every row; elsewhere the portable decoders above are used. */
#if defined(__AVX2__)
#include <immintrin.h>
/* horizontal sum of 8 floats (used by the AVX2 and int8 dot products) */
static inline float ls_hsum256(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
    return _mm_cvtss_f32(s);
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

#define LS_QDOT_AVX512(NAME, DEC, BB) \
static inline void NAME(const uint8_t *restrict w, const float *restrict x, int64_t K, int64_t nblk, \
                        int64_t mr, float *restrict out, int64_t ostride) { \
    __m512 a0[4], a1[4]; \
    for (int r = 0; r < 4; r++) { a0[r] = _mm512_setzero_ps(); a1[r] = _mm512_setzero_ps(); } \
    if (mr == 1) { \
        for (int64_t b = 0; b < nblk; b++) { \
            __builtin_prefetch(w + b * (BB) + LS_QMM_PREFETCH, 0, 3); \
            __m512 w0, w1; DEC(w + b * (BB), w0, w1); \
            a0[0] = _mm512_fmadd_ps(w0, _mm512_loadu_ps(x + 32 * b), a0[0]); \
            a1[0] = _mm512_fmadd_ps(w1, _mm512_loadu_ps(x + 32 * b + 16), a1[0]); \
        } \
    } else { \
        for (int64_t b = 0; b < nblk; b++) { \
            __builtin_prefetch(w + b * (BB) + LS_QMM_PREFETCH, 0, 3); \
            __m512 w0, w1; DEC(w + b * (BB), w0, w1); \
            for (int r = 0; r < 4; r++) { \
                if (r < mr) { \
                    a0[r] = _mm512_fmadd_ps(w0, _mm512_loadu_ps(x + r * K + 32 * b), a0[r]); \
                    a1[r] = _mm512_fmadd_ps(w1, _mm512_loadu_ps(x + r * K + 32 * b + 16), a1[r]); \
                } \
            } \
        } \
    } \
    for (int r = 0; r < mr; r++) out[r * ostride] = _mm512_reduce_add_ps(_mm512_add_ps(a0[r], a1[r])); \
}
#ifndef LS_QMM_PREFETCH
#define LS_QMM_PREFETCH 4096
#endif
LS_QDOT_AVX512(ls_qdot_q8_0, LS_DEC_Q8_0, 34)
LS_QDOT_AVX512(ls_qdot_q4_0, LS_DEC_Q4_0, 18)
LS_QDOT_AVX512(ls_qdot_q4_1, LS_DEC_Q4_1, 20)
#define LS_HAVE_QDOT_q8_0 1
#define LS_HAVE_QDOT_q4_0 1
#define LS_HAVE_QDOT_q4_1 1

#elif defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>

/* the same with 256-bit vectors: a block of 32 decodes into four 8-float vectors */
static inline __m256 ls_bcast_f16(const uint8_t *p) { return _mm256_set1_ps(ls_f16(p)); }
static inline __m256 ls_u8x8_to_ps(__m128i v) { return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(v)); }

#define LS_DEC_Q8_0(b, w) do { \
    const __m256 d_ = ls_bcast_f16(b); \
    for (int i_ = 0; i_ < 4; i_++) \
        w[i_] = _mm256_mul_ps(d_, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32( \
            _mm_loadl_epi64((const __m128i *)((b) + 2 + 8 * i_))))); \
} while (0)

#define LS_NIBBLES8(q, w) do { \
    const __m128i bytes_ = _mm_loadu_si128((const __m128i *)(q)); \
    const __m128i lo_ = _mm_and_si128(bytes_, _mm_set1_epi8(15)); \
    const __m128i hi_ = _mm_and_si128(_mm_srli_epi16(bytes_, 4), _mm_set1_epi8(15)); \
    w[0] = ls_u8x8_to_ps(lo_); w[1] = ls_u8x8_to_ps(_mm_srli_si128(lo_, 8)); \
    w[2] = ls_u8x8_to_ps(hi_); w[3] = ls_u8x8_to_ps(_mm_srli_si128(hi_, 8)); \
} while (0)

#define LS_DEC_Q4_0(b, w) do { \
    const __m256 d_ = ls_bcast_f16(b), off_ = _mm256_set1_ps(-8.0f); \
    LS_NIBBLES8((b) + 2, w); \
    for (int i_ = 0; i_ < 4; i_++) w[i_] = _mm256_mul_ps(d_, _mm256_add_ps(w[i_], off_)); \
} while (0)

#define LS_DEC_Q4_1(b, w) do { \
    const __m256 d_ = ls_bcast_f16(b), m_ = ls_bcast_f16((b) + 2); \
    LS_NIBBLES8((b) + 4, w); \
    for (int i_ = 0; i_ < 4; i_++) w[i_] = _mm256_fmadd_ps(d_, w[i_], m_); \
} while (0)


#define LS_QDOT_AVX2(NAME, DEC, BB) \
static inline void NAME(const uint8_t *restrict w, const float *restrict x, int64_t K, int64_t nblk, \
                        int64_t mr, float *restrict out, int64_t ostride) { \
    __m256 acc[4][2]; \
    for (int r = 0; r < 4; r++) { acc[r][0] = _mm256_setzero_ps(); acc[r][1] = _mm256_setzero_ps(); } \
    for (int64_t b = 0; b < nblk; b++) { \
        __builtin_prefetch(w + b * (BB) + LS_QMM_PREFETCH, 0, 3); \
        __m256 wv[4]; DEC(w + b * (BB), wv); \
        for (int r = 0; r < 4; r++) { \
            if (r < mr) { \
                const float *xr = x + r * K + 32 * b; \
                acc[r][0] = _mm256_fmadd_ps(wv[0], _mm256_loadu_ps(xr), acc[r][0]); \
                acc[r][1] = _mm256_fmadd_ps(wv[1], _mm256_loadu_ps(xr + 8), acc[r][1]); \
                acc[r][0] = _mm256_fmadd_ps(wv[2], _mm256_loadu_ps(xr + 16), acc[r][0]); \
                acc[r][1] = _mm256_fmadd_ps(wv[3], _mm256_loadu_ps(xr + 24), acc[r][1]); \
            } \
        } \
    } \
    for (int r = 0; r < mr; r++) out[r * ostride] = ls_hsum256(_mm256_add_ps(acc[r][0], acc[r][1])); \
}
#ifndef LS_QMM_PREFETCH
#define LS_QMM_PREFETCH 4096
#endif
LS_QDOT_AVX2(ls_qdot_q8_0, LS_DEC_Q8_0, 34)
LS_QDOT_AVX2(ls_qdot_q4_0, LS_DEC_Q4_0, 18)
LS_QDOT_AVX2(ls_qdot_q4_1, LS_DEC_Q4_1, 20)
#define LS_HAVE_QDOT_q8_0 1
#define LS_HAVE_QDOT_q4_0 1
#define LS_HAVE_QDOT_q4_1 1
#endif

/* ---- int8 activations (as GGUF's Q8_0 x Q8_0 dot products): each activation row is quantized per
 * block of 32 to int8 with a float scale, and weight blocks are multiplied in integer arithmetic.
 * ls_quantize_rows writes, for M rows of K floats: q[M][K] int8, d[M][K/32] float, s[M][K/32] int32
 * (the sum of each block's int8 values, for the offset/min terms of Q4_0 and Q4_1). */
static inline void ls_quantize_rows(const float *restrict x, int64_t M, int64_t K, int8_t *restrict q,
                                    float *restrict d, int32_t *restrict s) {
    const int64_t nb = K / 32;
    for (int64_t m = 0; m < M; m++) {
        for (int64_t b = 0; b < nb; b++) {
            const float *xb = x + m * K + 32 * b;
            float amax = 0.0f;
            for (int i = 0; i < 32; i++) { float v = fabsf(xb[i]); amax = v > amax ? v : amax; }
            const float scale = amax / 127.0f, inv = amax > 0.0f ? 127.0f / amax : 0.0f;
            int32_t sum = 0;
            for (int i = 0; i < 32; i++) {
                int v = (int)__builtin_nearbyintf(xb[i] * inv);
                q[m * K + 32 * b + i] = (int8_t)v;
                sum += v;
            }
            d[m * nb + b] = scale;
            s[m * nb + b] = sum;
        }
    }
}

#if (defined(__AVX512VNNI__) && defined(__AVX512VL__)) || defined(__AVX2__)
#include <immintrin.h>
/* sum over 32 lanes of u8 * s8 products, as 8 int32 partial sums */
static inline __m256i ls_dot_u8s8(__m256i u, __m256i s) {
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
    return _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, s);
#else
    return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
#endif
}
static inline __m256i ls_nibbles32(const uint8_t *q) {
    const __m128i bytes = _mm_loadu_si128((const __m128i *)q);
    const __m128i lo = _mm_and_si128(bytes, _mm_set1_epi8(15));
    const __m128i hi = _mm_and_si128(_mm_srli_epi16(bytes, 4), _mm_set1_epi8(15));
    return _mm256_set_m128i(hi, lo);
}

/* one weight row (nblk blocks) against up to 4 quantized activation rows (stride K, nb) */
#define LS_QDOT_I8(NAME, BB, BODY, FINISH) \
static inline void NAME(const uint8_t *restrict w, const int8_t *restrict xq, const float *restrict xd, \
                        const int32_t *restrict xs, int64_t K, int64_t nblk, int64_t mr, \
                        float *restrict out, int64_t ostride) { \
    __m256 acc[4]; float corr[4]; \
    for (int r = 0; r < 4; r++) { acc[r] = _mm256_setzero_ps(); corr[r] = 0.0f; } \
    for (int64_t b = 0; b < nblk; b++) { \
        const uint8_t *blk = w + b * (BB); \
        __builtin_prefetch(blk + LS_QMM_PREFETCH, 0, 3); \
        for (int r = 0; r < 4; r++) { \
            if (r < mr) { \
                const __m256i xv = _mm256_loadu_si256((const __m256i *)(xq + r * K + 32 * b)); \
                const float dx = xd[r * nblk + b]; const int32_t sx = xs[r * nblk + b]; \
                BODY \
            } \
        } \
    } \
    for (int r = 0; r < mr; r++) out[r * ostride] = ls_hsum256(acc[r]) FINISH; \
}
#ifndef LS_QMM_PREFETCH
#define LS_QMM_PREFETCH 4096
#endif
/* Q8_0: sign trick (|w| unsigned, x takes w's sign) */
LS_QDOT_I8(ls_qdot8_q8_0, 34, {
    const __m256i wv = _mm256_loadu_si256((const __m256i *)(blk + 2));
    const __m256i p = ls_dot_u8s8(_mm256_sign_epi8(wv, wv), _mm256_sign_epi8(xv, wv));
    acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_set1_ps(ls_f16(blk) * dx), acc[r]);
    (void)sx;
}, + 0.0f)
/* Q4_0: w = d*(nib - 8): d*dx*(sum nib*x - 8*sum x) */
LS_QDOT_I8(ls_qdot8_q4_0, 18, {
    const float dd = ls_f16(blk) * dx;
    const __m256i p = ls_dot_u8s8(ls_nibbles32(blk + 2), xv);
    acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_set1_ps(dd), acc[r]);
    corr[r] -= 8.0f * dd * (float)sx;
}, + corr[r])
/* Q4_1: w = d*nib + m: d*dx*sum nib*x + m*dx*sum x */
LS_QDOT_I8(ls_qdot8_q4_1, 20, {
    const __m256i p = ls_dot_u8s8(ls_nibbles32(blk + 4), xv);
    acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_set1_ps(ls_f16(blk) * dx), acc[r]);
    corr[r] += ls_f16(blk + 2) * dx * (float)sx;
}, + corr[r])
#define LS_HAVE_QDOT8 1
#endif
