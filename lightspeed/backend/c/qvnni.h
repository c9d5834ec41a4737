/* AVX-512 VNNI kernels for int8 activations (q8_0, q4_0, q4_1 weights; the scratch of ls_quantize_rows):
 * two weight rows at once, one in each 256-bit half of a zmm, so every instruction after the weight loads
 * serves two dot products (the 256-bit kernels of qdecode.h serve one). Each half does exactly what
 * ls_qdot8_* does for its row: per block, eight int32 partial sums (lane l: elements 4l..4l+3), converted
 * to float and accumulated with one FMA by (weight scale * activation scale), the eight lanes summed by
 * ls_hsum256 at the end; so a row's result has the same bits here, in ls_qdot8_* and with LS_NO_VNNI
 * (where the integer sums come from maddubs/madd instead of vpdpbusd). Used for 1 to 8 activation rows a
 * pass (decode, batched decode; prefill's row groups), except one row of q8_0: its decode streams the weights
 * at DRAM speed either way, and ls_qdot8_q8_0 (vpdpbusd on 256 bits) with one weight stream measured ~5%
 * faster than two.
 *
 * vpdpbusd multiplies unsigned by signed bytes. Signed weights (q8_0; q4_0 as nibble - 8) take the
 * activations offset by 128 (x ^ 0x80 = x + 128, in 1..255 as |x| <= 127) and start each lane at
 * -128 * (the lane's sum of weights), itself a vpdpbusd of 0x80 with the weights, computed once per block
 * for every activation row: exact in int32. AVX-512 has no vpsignb, the 256-bit kernels' alternative.
 * q4_1's nibbles are unsigned already and multiply the signed activations directly; so do q4_0's (before
 * the - 8) when a call can precompute each lane's -8 * (sum of x) for its activation rows, saving the
 * per-block correction and the - 8.
 *
 * Selected by __AVX512VNNI__ (with F, BW and VL, which the 256-bit VNNI forms of qdecode.h also need);
 * LS_NO_VNNI or LS_PORTABLE turn it off (LS_NO_VNNI also keeps qdecode.h's 256-bit kernels off VNNI). */
#if defined(LS_HAVE_QDOT8) && defined(__AVX512VNNI__) && defined(__AVX512F__) && defined(__AVX512BW__) \
    && defined(__AVX512VL__) && !defined(LS_NO_VNNI) && !defined(LS_PORTABLE)
#define LS_HAVE_QDOT8X2 1
/* bytes of a call's activation buffer on the stack (rows offset by 128, or q4_0's lane sums: mr * K bytes
 * either way, so up to 8 rows of K = 2048; longer rows offset each load instead) */
#define LS_VNNI_XBUF (16 * 1024)

/* block b's 32 weight bytes of rows p and p + rb (p points at the block): row p's in the low half */
static inline __m512i ls_vnni_w2_q8_0(const uint8_t *p, int64_t rb) {
    return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(p + 2))),
                              _mm256_loadu_si256((const __m256i *)(p + rb + 2)), 1);
}
/* the 32 nibbles of two blocks' 16 bytes q and q + rb, in element order (low nibbles, then high) minus OFF:
 * each row's bytes fill two 128-bit quarters (broadcast loads), and the upper quarter of each half is
 * shifted right by 4 as 64-bit lanes, moving the high nibbles down (the mask drops what came across) */
static inline __m512i ls_vnni_nib2(const uint8_t *q, int64_t rb, int off) {
    const __m256i a = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)q));
    const __m256i b = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(q + rb)));
    const __m512i z = _mm512_inserti64x4(_mm512_castsi256_si512(a), b, 1);
    const __m512i v = _mm512_and_si512(_mm512_srlv_epi64(z, _mm512_setr_epi64(0, 0, 4, 4, 0, 0, 4, 4)),
                                       _mm512_set1_epi8(15));
    return off ? _mm512_sub_epi8(v, _mm512_set1_epi8((char)off)) : v;
}
#define LS_W8X2_Q8_0(p, rb) ls_vnni_w2_q8_0(p, rb)
#define LS_W8X2_Q4_0(p, rb) ls_vnni_nib2((p) + 2, rb, 8)
#define LS_W8X2_Q4_1(p, rb) ls_vnni_nib2((p) + 4, rb, 0)
#define LS_U8X2_Q4_0(p, rb) ls_vnni_nib2((p) + 2, rb, 0)  /* q4_0's nibbles before the - 8 */
/* the float16 scales at p and p + rb, each broadcast to one half */
static inline __m512 ls_vnni_d2(const uint8_t *p, int64_t rb) {
    int16_t h0, h1;
    memcpy(&h0, p, 2);
    memcpy(&h1, p + rb, 2);
    return _mm512_cvtph_ps(_mm256_inserti128_si256(_mm256_castsi128_si256(_mm_set1_epi16(h0)), _mm_set1_epi16(h1), 1));
}
/* q4_1: the scales d and mins m (float16, adjacent) of blocks p and p + rb at once: d0 broadcast to the low half
 * of *dw and d1 to the high half, [m0, m1] in the low lanes of *m */
static inline void ls_vnni_dm2(const uint8_t *p, int64_t rb, __m512 *dw, __m128 *m) {
    int32_t a, b;
    memcpy(&a, p, 4);
    memcpy(&b, p + rb, 4);
    const __m128 f = _mm_cvtph_ps(_mm_insert_epi32(_mm_cvtsi32_si128(a), b, 1));  /* d0, m0, d1, m1 */
    *dw = _mm512_permutexvar_ps(_mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 2, 2, 2, 2, 2, 2, 2, 2),
                                _mm512_castps128_ps512(f));
    *m = _mm_shuffle_ps(f, f, _MM_SHUFFLE(3, 1, 3, 1));
}
/* the upper 8 floats of a zmm (extractf32x8 would need AVX512DQ) */
static inline __m256 ls_vnni_hi8(__m512 v) { return _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)); }

/* How a pass gets unsigned x signed byte products (XM, a constant after inlining):
 *   LS_XM_OFF: signed weights, activations offset by 128 at each load, lanes started at -128 * sum(w);
 *   LS_XM_PRE: the same with activations offset once per call (xq is that buffer);
 *   LS_XM_COR: unsigned weights (q4_0's nibbles, before the - 8) times the signed activations, lanes started
 *              at -8 * (the lane's sum of x), precomputed once per call into xc ([row][block][8] int32);
 *   LS_XM_UNS: unsigned weights, nothing to correct (q4_1: w = d * nibble + m). */
enum { LS_XM_OFF, LS_XM_PRE, LS_XM_COR, LS_XM_UNS };

/* Weight rows w and w + rb (nblk blocks of BB bytes) against up to LS_QMM_ROWS activation rows (strides K
 * and nblk), into out[r * ostride] and out[r * ostride + 1]; SVALS / UVALS give a block pair's weights as
 * signed / unsigned bytes. MIN (q4_1) adds m * s per block and row, as ls_qdot8_q4_1 does. */
#define LS_QDOT8X2(NAME, BB, SVALS, UVALS, MIN, ONE_ROW, HAS_COR) \
static inline __attribute__((always_inline)) void NAME##_rows(const uint8_t *restrict w, int64_t rb, \
        const int8_t *restrict xq, const int32_t *restrict xc, const float *restrict xd, const float *restrict xs, \
        int64_t K, int64_t nblk, float *restrict out, int64_t ostride, const int XM, const int MR) { \
    __m512 acc[LS_QMM_ROWS]; __m128 cm[LS_QMM_ROWS]; \
    for (int r = 0; r < MR; r++) { acc[r] = _mm512_setzero_ps(); cm[r] = _mm_setzero_ps(); } \
    const __m512i x80 = _mm512_set1_epi8((char)0x80), z = _mm512_setzero_si512(); \
    const int UNS = XM == LS_XM_COR || XM == LS_XM_UNS; \
    for (int64_t b = 0; b < nblk; b++) { \
        const uint8_t *blk = w + b * (BB); \
        LS_PF(blk + LS_QMM_PREFETCH, 0, 3); \
        LS_PF(blk + rb + LS_QMM_PREFETCH, 0, 3); \
        const __m512i wv = UNS ? UVALS(blk, rb) : SVALS(blk, rb); \
        const __m512i base = UNS ? z : _mm512_sub_epi32(z, _mm512_dpbusd_epi32(z, x80, wv)); \
        __m512 dw; __m128 m2 = _mm_setzero_ps(); \
        if (MIN) ls_vnni_dm2(blk, rb, &dw, &m2); else dw = ls_vnni_d2(blk, rb); \
        _Pragma("GCC unroll 8") \
        for (int r = 0; r < MR; r++) { \
            const __m512i xv = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(xq + r * K + 32 * b))); \
            __m512i p; \
            if (XM == LS_XM_OFF) p = _mm512_dpbusd_epi32(base, _mm512_xor_si512(xv, x80), wv); \
            else if (XM == LS_XM_PRE) p = _mm512_dpbusd_epi32(base, xv, wv); \
            else if (XM == LS_XM_COR) { \
                const __m256i c_ = _mm256_load_si256((const __m256i *)(xc + 8 * (r * nblk + b))); \
                p = _mm512_dpbusd_epi32(_mm512_broadcast_i64x4(c_), wv, xv); \
            } \
            else p = _mm512_dpbusd_epi32(z, wv, xv); \
            acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p), _mm512_mul_ps(dw, _mm512_set1_ps(xd[r * nblk + b])), \
                                     acc[r]); \
            /* [m0, m1] * s + corr in two lanes: the fused multiply-add ls_qdot8_q4_1's scalar += compiles to */ \
            if (MIN) cm[r] = _mm_fmadd_ps(m2, _mm_set1_ps(xs[r * nblk + b]), cm[r]); \
        } \
    } \
    for (int r = 0; r < MR; r++) { \
        out[r * ostride] = ls_hsum256(_mm512_castps512_ps256(acc[r])) + _mm_cvtss_f32(cm[r]); \
        out[r * ostride + 1] = ls_hsum256(ls_vnni_hi8(acc[r])) + _mm_cvtss_f32(_mm_movehdup_ps(cm[r])); \
    } \
} \
static inline __attribute__((always_inline)) void NAME##_pairs(const uint8_t *restrict w, int64_t rb, int64_t n, \
        const int8_t *restrict xq, const int32_t *restrict xc, const float *restrict xd, const float *restrict xs, \
        int64_t K, int64_t nblk, float *restrict out, int64_t ostride, const int XM, const int MR) { \
    for (int64_t j = 0; j + 1 < n; j += 2) \
        NAME##_rows(w + j * rb, rb, xq, xc, xd, xs, K, nblk, out + j, ostride, XM, MR); \
} \
/* the pairs of n weight rows at w (stride rb); returns how many weight rows it did (n rounded down to even, \
 * or none: one activation row of a format whose decode runs at DRAM speed, ONE_ROW 0). What depends on the \
 * activations alone (their offset, q4_0's correction) is computed once per call when it fits the buffer. */ \
static inline int64_t NAME(const uint8_t *restrict w, int64_t rb, int64_t n, const int8_t *restrict xq, \
                           const float *restrict xd, const float *restrict xs, int64_t K, int64_t nblk, int64_t mr, \
                           float *restrict out, int64_t ostride) { \
    if (mr == 1 && !(ONE_ROW)) return 0; \
    if ((MIN) || n < 4 || mr * K > LS_VNNI_XBUF) { \
        LS_QMM_DISPATCH(NAME##_pairs, w, rb, n, xq, 0, xd, xs, K, nblk, out, ostride, \
                        (MIN) ? LS_XM_UNS : LS_XM_OFF); \
    } else if (HAS_COR) { \
        int32_t xc[LS_VNNI_XBUF / 4] __attribute__((aligned(64))); \
        const __m256i eight = _mm256_set1_epi8(8); \
        for (int64_t i = 0; i < mr * nblk; i++) { \
            const __m256i x_ = _mm256_loadu_si256((const __m256i *)(xq + 32 * i)), z_ = _mm256_setzero_si256(); \
            _mm256_store_si256((__m256i *)(xc + 8 * i), _mm256_sub_epi32(z_, _mm256_dpbusd_epi32(z_, eight, x_))); \
        } \
        LS_QMM_DISPATCH(NAME##_pairs, w, rb, n, xq, xc, xd, xs, K, nblk, out, ostride, LS_XM_COR); \
    } else { \
        int8_t xo[LS_VNNI_XBUF] __attribute__((aligned(64))); \
        const __m256i x80 = _mm256_set1_epi8((char)0x80); \
        for (int64_t i = 0; i < mr * K; i += 32) \
            _mm256_store_si256((__m256i *)(xo + i), \
                               _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(xq + i)), x80)); \
        LS_QMM_DISPATCH(NAME##_pairs, w, rb, n, xo, 0, xd, xs, K, nblk, out, ostride, LS_XM_PRE); \
    } \
    return n & ~(int64_t)1; \
}
/* q8_0: one activation row keeps ls_qdot8_q8_0, whose single weight stream measured ~5% faster at DRAM
 * speed than a pair's two; the q4 formats are compute-bound there, and pairs are faster */
LS_QDOT8X2(ls_qdot8x2_q8_0, 34, LS_W8X2_Q8_0, LS_W8X2_Q8_0, 0, 0, 0)
LS_QDOT8X2(ls_qdot8x2_q4_0, 18, LS_W8X2_Q4_0, LS_U8X2_Q4_0, 0, 1, 1)
LS_QDOT8X2(ls_qdot8x2_q4_1, 20, LS_W8X2_Q4_1, LS_W8X2_Q4_1, 1, 1, 0)
#endif
