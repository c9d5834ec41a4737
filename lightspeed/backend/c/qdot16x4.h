/* AVX2 kernels for int16 activations (q8_0, q4_0, q4_1 weights) without AVX-512: four weight rows at once
 * against one or two activation rows (decode, two-row batched decode). qdecode.h's AVX2 int16 kernel does one
 * weight row per call: a single FMA chain per activation row (4 cycles a block at one row), the activation
 * block reloaded for every weight row and a call, a reduction and a dispatch per 18-48 blocks. Here four
 * chains run side by side, each activation block is loaded once for the four rows, and the four rows' float16
 * scales (and q4_1's minimums) are widened by one conversion.
 *
 * Each row's arithmetic is exactly that of qdecode.h's kernel (the same integer products, the same FMA per
 * block with the same scale product, the same horizontal sum and minimum term, in the same order), so a row
 * has the same bits whether it runs here, in a last group of fewer than four rows there, alone or batched;
 * tests/test_qdot16x4.py compares the two builds bit for bit. Calls of more activation rows keep qdecode.h's
 * kernel, which already shares each decoded weight block between its rows.
 *
 * Measured on a Zen 3 (EPYC, 2 vCPUs), one thread, SmolLM2's matrices from memory (benchmarks/qmatmul.py): q4_1
 * one row 0.60x qdecode.h's time, two rows 0.66x; in L2 the four-row q4_1 kernel does a row and block in ~1.8 ns
 * against ~3.2. q8_0 is built only with -DLS_QDOT16X4_Q8_0: its per-row kernel is already near one core's
 * memory bandwidth (14.5 GB/s), and four rows read side by side, 612 bytes apart, defeat the hardware
 * prefetcher (9.5-10.6 GB/s whatever the software prefetch; faster only in cache, 23.7 against 19.4 GB/s).
 * -DLS_NO_QDOT16X4 (or LS_PORTABLE) keeps qdecode.h's kernel everywhere. q4_0 and q4_1 weights with a repack slot
 * are read in groups of 8 rows by repack8.h instead (these kernels then take the matrix's last rows only). */
#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__) && !defined(LS_PORTABLE)
#define LS_HAVE_QDOT16_AVX2 1
#endif
#if defined(LS_HAVE_QDOT16_AVX2) && !(defined(__AVX512F__) && defined(__AVX512BW__)) && !defined(LS_NO_QDOT16X4)
#define LS_HAVE_QDOT16X4 1
#if defined(LS_QDOT16X4_Q8_0)
#define LS_HAVE_QDOT16X4_q8_0 1
#endif
#define LS_HAVE_QDOT16X4_q4_0 1
#define LS_HAVE_QDOT16X4_q4_1 1
#endif

#if defined(LS_HAVE_QDOT16_AVX2)

/* a block's 32 weights as two vectors of 16 int16, the values of qdecode.h's LS_W16_* (elements 0-15, 16-31):
 * q4 bytes widened first, then the low nibble masked and the high one shifted down (3 operations, not 5) */
#define LS_W4_Q8_0(p, lo, hi) do { \
    lo = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)((p) + 2))); \
    hi = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)((p) + 18))); \
} while (0)
#define LS_W4_NIB(q, lo, hi, OFF) do { \
    const __m256i b_ = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)(q))); \
    lo = _mm256_and_si256(b_, _mm256_set1_epi16(15)); \
    hi = _mm256_srli_epi16(b_, 4); \
    if (OFF) { lo = _mm256_sub_epi16(lo, _mm256_set1_epi16(OFF)); hi = _mm256_sub_epi16(hi, _mm256_set1_epi16(OFF)); } \
} while (0)
#define LS_W4_Q4_0(p, lo, hi) LS_W4_NIB((p) + 2, lo, hi, 8)
#define LS_W4_Q4_1(p, lo, hi) LS_W4_NIB((p) + 4, lo, hi, 0)

/* the first 32 bits of the four rows' block at byte offset at (a float16 scale, and q4_1's float16 minimum
 * after it) in one register: four scalar loads inserted (a gather is slower on Zen 3; 16-bit stores read
 * back as one load stall store forwarding) */
static inline __m128i ls_head4(const uint8_t *w, int64_t rb, int64_t at) {
    uint32_t h[4];
    for (int i = 0; i < 4; i++) memcpy(&h[i], w + i * rb + at, 4);
    return _mm_setr_epi32((int)h[0], (int)h[1], (int)h[2], (int)h[3]);
}
/* the low (first) or high float16 of each 32-bit lane, as 4 floats */
static inline __m128 ls_f16lo4(__m128i v) {
    return _mm_cvtph_ps(_mm_shuffle_epi8(v, _mm_setr_epi8(0, 1, 4, 5, 8, 9, 12, 13, -1, -1, -1, -1, -1, -1, -1, -1)));
}
static inline __m128 ls_f16hi4(__m128i v) {
    return _mm_cvtph_ps(_mm_shuffle_epi8(v, _mm_setr_epi8(2, 3, 6, 7, 10, 11, 14, 15, -1, -1, -1, -1, -1, -1, -1, -1)));
}

/* four weight rows at w (stride rb) against MR (1 or 2) int16 activation rows */
#define LS_QDOT16X4_GROUP(NAME, BB, WVALS, MIN) \
static inline __attribute__((always_inline)) void NAME##_group(const uint8_t *restrict w, int64_t rb, \
        const int16_t *restrict xq, const float *restrict xd, const float *restrict xs, int64_t K, int64_t nblk, \
        float *restrict out, int64_t ostride, const int MR) { \
    __m256 acc[2][4]; __m128 corr[2]; \
    for (int r = 0; r < MR; r++) { \
        corr[r] = _mm_setzero_ps(); \
        for (int i = 0; i < 4; i++) acc[r][i] = _mm256_setzero_ps(); \
    } \
    for (int64_t b = 0; b < nblk; b++) { \
        const uint8_t *blk = w + b * (BB); \
        /* one prefetch per row and 64 bytes, of the next group's rows */ \
        if ((b * (BB)) % 64 < (BB)) for (int i = 4; i < 8; i++) LS_PF(blk + i * rb, 0, 3); \
        float sc[2][4] __attribute__((aligned(16))); \
        const __m128i head = ls_head4(w, rb, b * (BB)); \
        const __m128 d4 = ls_f16lo4(head), m4 = MIN ? ls_f16hi4(head) : d4; \
        for (int r = 0; r < MR; r++) { \
            _mm_store_ps(sc[r], _mm_mul_ps(d4, _mm_set1_ps(xd[r * nblk + b]))); \
            if (MIN) corr[r] = _mm_fmadd_ps(m4, _mm_set1_ps(xs[r * nblk + b]), corr[r]); \
        } \
        __m256i xa[2], xb[2]; \
        for (int r = 0; r < MR; r++) { \
            xa[r] = _mm256_loadu_si256((const __m256i *)(xq + r * K + 32 * b)); \
            xb[r] = _mm256_loadu_si256((const __m256i *)(xq + r * K + 32 * b + 16)); \
        } \
        _Pragma("GCC unroll 4") \
        for (int i = 0; i < 4; i++) { \
            __m256i wa, wb; WVALS(blk + i * rb, wa, wb); \
            for (int r = 0; r < MR; r++) { \
                const __m256i p = _mm256_add_epi32(_mm256_madd_epi16(wa, xa[r]), _mm256_madd_epi16(wb, xb[r])); \
                acc[r][i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_broadcast_ss(&sc[r][i]), acc[r][i]); \
            } \
        } \
    } \
    for (int r = 0; r < MR; r++) { \
        float c[4]; _mm_storeu_ps(c, corr[r]); \
        for (int i = 0; i < 4; i++) out[r * ostride + i] = ls_hsum256(acc[r][i]) + (MIN ? c[i] : 0.0f); \
    } \
} \
static inline __attribute__((always_inline)) void NAME##_rows(const uint8_t *restrict w, int64_t rb, int64_t n, \
        const int16_t *restrict xq, const float *restrict xd, const float *restrict xs, int64_t K, int64_t nblk, \
        float *restrict out, int64_t ostride, const int MR) { \
    for (int64_t i = 0; i + 4 <= n; i += 4) NAME##_group(w + i * rb, rb, xq, xd, xs, K, nblk, out + i, ostride, MR); \
} \
/* the first n & ~3 of n weight rows at w (stride rb) against mr activation rows; returns how many it did (none \
 * for more than two activation rows: qdecode.h's kernel does those and the last rows) */ \
static inline int64_t NAME(const uint8_t *restrict w, int64_t rb, int64_t n, const int16_t *restrict xq, \
                           const float *restrict xd, const float *restrict xs, int64_t K, int64_t nblk, int64_t mr, \
                           float *restrict out, int64_t ostride) { \
    if (mr == 1) NAME##_rows(w, rb, n, xq, xd, xs, K, nblk, out, ostride, 1); \
    else if (mr == 2) NAME##_rows(w, rb, n, xq, xd, xs, K, nblk, out, ostride, 2); \
    else return 0; \
    return n & ~(int64_t)3; \
}
#if defined(LS_HAVE_QDOT16X4_q8_0)
LS_QDOT16X4_GROUP(ls_qdot16x4_q8_0, 34, LS_W4_Q8_0, 0)
#endif
#if defined(LS_HAVE_QDOT16X4)
LS_QDOT16X4_GROUP(ls_qdot16x4_q4_0, 18, LS_W4_Q4_0, 0)
LS_QDOT16X4_GROUP(ls_qdot16x4_q4_1, 20, LS_W4_Q4_1, 1)
#endif
#endif

/* ---- q5_0 with int16 activations, for calls of at most LS_QMM_ROWS activation rows (decode, batched decode;
 * longer calls run qgemm.h's float kernel, which the renderer branches to, but for weights read repacked, see
 * qdot16x16.h). A weight is (nibble | high bit << 4) - 16, exact in int16, so the products are exact integers as
 * for the other formats. Builds with the 16-row kernels (AVX-512 VNNI) use those (qdot16x16.h); here every build
 * has the one-row kernel ls_qdot16_q5_0 (AVX2 wherever AVX2, FMA and F16C are, AVX-512 CPUs included, where no wider
 * kernel of this format exists; else a portable form with the same arithmetic order per lane group) and, on
 * AVX2, the four-row kernel ls_qdot16x4_q5_0 with the same bits (LS_NO_QDOT16X4 switches that off). */
#if defined(LS_QUANT_ROWS_MAX) && LS_QUANT_ROWS_MAX < LS_QMM_ROWS
#error q5_0 quantizes calls of up to LS_QMM_ROWS rows: LS_QUANT_ROWS_MAX must not be lower
#endif
#if defined(LS_HAVE_QDOT16_AVX2)
/* the 32 weights of a q5_0 block at p as two vectors of 16 int16: the nibbles, plus -16 where the high bit
 * (bit i of qh for element i) is clear; with AVX-512 BW/VL the bits are the masks of two masked subtractions
 * (the same values in 6 operations fewer: Gemma 3's Q5_0 matrices in 0.92x the time at one row, 0.88x at two,
 * on a Zen 4; -DLS_NO_Q5_0_MASKS keeps the AVX2 form). The AVX2 form broadcasts qh from memory once and copies
 * its low or high 16 bits into every lane with a byte shuffle: two broadcasts from general registers (a scalar
 * load, a shift, two register moves) took 1.11x the time on a Zen 3 (Gemma 3's matrices, in cache, one row). */
#if defined(__AVX512BW__) && defined(__AVX512VL__) && !defined(LS_NO_Q5_0_MASKS)
#define LS_W4_Q5_0(p, lo, hi) do { \
    const __m256i b_ = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)((p) + 6))); \
    uint32_t qh_; memcpy(&qh_, (p) + 2, 4); \
    const __m256i s16_ = _mm256_set1_epi16(16); \
    const __m256i l_ = _mm256_and_si256(b_, _mm256_set1_epi16(15)), h_ = _mm256_srli_epi16(b_, 4); \
    lo = _mm256_mask_sub_epi16(l_, (__mmask16)~qh_, l_, s16_); \
    hi = _mm256_mask_sub_epi16(h_, (__mmask16)~(qh_ >> 16), h_, s16_); \
} while (0)
#else
#define LS_W4_Q5_0(p, lo, hi) do { \
    const __m256i b_ = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)((p) + 6))); \
    int32_t qh_; memcpy(&qh_, (p) + 2, 4); \
    const __m256i q_ = _mm256_set1_epi32(qh_); \
    const __m256i bit_ = _mm256_setr_epi16(1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, \
                                           -32768); \
    const __m256i w0_ = _mm256_set1_epi16(0x0100), w1_ = _mm256_set1_epi16(0x0302); \
    const __m256i hl_ = _mm256_cmpeq_epi16(_mm256_and_si256(_mm256_shuffle_epi8(q_, w0_), bit_), bit_); \
    const __m256i hh_ = _mm256_cmpeq_epi16(_mm256_and_si256(_mm256_shuffle_epi8(q_, w1_), bit_), bit_); \
    lo = _mm256_add_epi16(_mm256_and_si256(b_, _mm256_set1_epi16(15)), \
                          _mm256_andnot_si256(hl_, _mm256_set1_epi16(-16))); \
    hi = _mm256_add_epi16(_mm256_srli_epi16(b_, 4), _mm256_andnot_si256(hh_, _mm256_set1_epi16(-16))); \
} while (0)
#endif
/* one weight row against up to LS_QMM_ROWS activation rows: qdecode.h's AVX2 int16 kernel for this format */
static inline __attribute__((always_inline)) void ls_qdot16_q5_0_rows(const uint8_t *restrict w,
        const int16_t *restrict xq, const float *restrict xd, int64_t K, int64_t nblk, float *restrict out,
        int64_t ostride, const int MR) {
    __m256 acc[LS_QMM_ROWS];
    for (int r = 0; r < MR; r++) acc[r] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nblk; b++) {
        const uint8_t *blk = w + b * 22;
        LS_PF(blk + LS_QMM_PREFETCH, 0, 3);
        __m256i wa, wb; LS_W4_Q5_0(blk, wa, wb);
        const __m256 dw = ls_bcast8_f16(blk);
        _Pragma("GCC unroll 8")
        for (int r = 0; r < MR; r++) {
            const int16_t *xr = xq + r * K + 32 * b;
            const __m256i p = _mm256_add_epi32(_mm256_madd_epi16(wa, _mm256_loadu_si256((const __m256i *)xr)),
                                               _mm256_madd_epi16(wb, _mm256_loadu_si256((const __m256i *)(xr + 16))));
            acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_mul_ps(dw, _mm256_broadcast_ss(xd + r * nblk + b)),
                                     acc[r]);
        }
    }
    for (int r = 0; r < MR; r++) out[r * ostride] = ls_hsum256(acc[r]);
}
static inline void ls_qdot16_q5_0(const uint8_t *restrict w, const int16_t *restrict xq, const float *restrict xd,
                                  const float *restrict xs, int64_t K, int64_t nblk, int64_t mr,
                                  float *restrict out, int64_t ostride) {
    (void)xs;
    LS_QMM_DISPATCH(ls_qdot16_q5_0_rows, w, xq, xd, K, nblk, out, ostride);
}
#if !defined(LS_NO_QDOT16X4)
#define LS_HAVE_QDOT16X4_q5_0 1
LS_QDOT16X4_GROUP(ls_qdot16x4_q5_0, 22, LS_W4_Q5_0, 0)
#endif
#else
/* portable: the same products in the same order per row as the AVX2 kernel's 8 lanes (lane l sums the pairs
 * 2l, 2l+1 of each half-block, the lanes then summed as ls_hsum256 does), so both give the same bits */
static inline void ls_qdot16_q5_0(const uint8_t *restrict w, const int16_t *restrict xq, const float *restrict xd,
                                  const float *restrict xs, int64_t K, int64_t nblk, int64_t mr,
                                  float *restrict out, int64_t ostride) {
    (void)xs;
    for (int64_t r = 0; r < mr; r++) {
        float acc[8] = {0};
        for (int64_t b = 0; b < nblk; b++) {
            const uint8_t *blk = w + b * 22;
            uint32_t qh; memcpy(&qh, blk + 2, 4);
            int32_t v[32];
            for (int i = 0; i < 16; i++) {
                v[i] = (int32_t)((blk[6 + i] & 15) | (((qh >> i) & 1u) << 4)) - 16;
                v[i + 16] = (int32_t)((blk[6 + i] >> 4) | (((qh >> (i + 16)) & 1u) << 4)) - 16;
            }
            const int16_t *xr = xq + r * K + 32 * b;
            const float sc = ls_f16(blk) * xd[r * nblk + b];
            for (int l = 0; l < 8; l++) {
                const int32_t p = v[2 * l] * xr[2 * l] + v[2 * l + 1] * xr[2 * l + 1]
                                  + v[16 + 2 * l] * xr[16 + 2 * l] + v[17 + 2 * l] * xr[17 + 2 * l];
                acc[l] = fmaf((float)p, sc, acc[l]);
            }
        }
        out[r * ostride] = ((acc[0] + acc[4]) + (acc[2] + acc[6])) + ((acc[1] + acc[5]) + (acc[3] + acc[7]));
    }
}
#endif
