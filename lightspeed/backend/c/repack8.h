/* AVX2 without AVX-512: q4_0 and q4_1 weights repacked in groups of 8 rows (LS_REPACK8_<format>), read by the
 * int16 kernels of decode and batched decode and by qgemm.h's float kernel of longer calls. Per whole group of 8
 * rows, in its own 8 * rb bytes, block after block: the 8 rows' float16 scales (q4_1: then their 8 float16
 * minimums), then each row's 16 nibble bytes. From the GGUF layout qdot16x4.h's kernel gathers four rows' scales
 * by four scalar loads and inserts, and its four rows are four streams 1-2 blocks apart; here a block of the
 * group is one stream, its scales one load and one conversion, and each activation block is loaded once for 8
 * rows. Measured on a Zen 3 (EPYC, 2 vCPUs; a C harness over SmolLM2's 576-wide q4_1 rows, one activation row):
 * 16.5 against 10.8 GB/s in L3 on one thread, 22 against 15 GB/s from memory on two.
 *
 * Every row's arithmetic is that of qdecode.h's per-row int16 kernel and of qgemm.h's float kernel (the same
 * integer products, scale products, FMAs and sums in the same order), so a row has the same bits in either
 * layout, alone or batched; tests/test_repack8.py compares builds with and without -DLS_NO_REPACK8 (-DLS_NO_REPACK16
 * switches every repacked layout off). Rows after the last whole group of the matrix stay in the GGUF layout
 * (callers start every call at a multiple of 8 rows of the matrix: the renderer's work items are multiples of 16). */
#if defined(LS_HAVE_QDOT16X4) && defined(LS_HAVE_QGEMM) && !defined(__AVX512F__) && !defined(LS_NO_REPACK8) \
    && !defined(LS_NO_REPACK16)
#define LS_REPACK8 1
#define LS_REPACK8_q4_0 1
#define LS_REPACK8_q4_1 1

/* weight rows r0 .. r0 + NRW - 1 of the group at g (nblk blocks of BS bytes: NS float16 fields per row, then the
 * rows' nibbles) against MR int16 activation rows; NRW x MR accumulators stay in registers (8 x 1, 4 x 2, 2 x 4,
 * 1 x 8). The first pass over a group prefetches its stream; the later ones find it in L1 (decode's work items
 * are 16 KiB, a group of 8 rows at most 8 KiB). */
static inline __attribute__((always_inline)) void ls_r8_rows(const uint8_t *restrict g, int64_t nblk, const int NS,
        const int OFF, const int r0, const int NRW, const int16_t *restrict xq, const float *restrict xd,
        const float *restrict xs, int64_t K, float *restrict out, int64_t ostride, const int MR) {
    const int64_t BS = 16 * NS + 128;
    __m256 acc[LS_QMM_ROWS][8], corr[LS_QMM_ROWS];
    float corr1[LS_QMM_ROWS];  /* one row a pass: its minimum term as the per-row kernel keeps it, a scalar */
    for (int r = 0; r < MR; r++) {
        corr[r] = _mm256_setzero_ps();
        corr1[r] = 0.0f;
        for (int i = 0; i < NRW; i++) acc[r][i] = _mm256_setzero_ps();
    }
    for (int64_t b = 0; b < nblk; b++) {
        const uint8_t *blk = g + b * BS;
        if (r0 == 0)
            for (int o = 0; o < BS; o += 64) LS_PF(blk + 2048 + o, 0, 3);
        /* several rows a pass: d * d_x of the 8 rows (each lane the per-row kernel's product) read back as
         * broadcasts, m * s_x as 8 lanes */
        float sc[LS_QMM_ROWS][8] __attribute__((aligned(32)));
        if (NRW > 1) {
            const __m256 d8 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)blk));
            for (int r = 0; r < MR; r++) {
                _mm256_store_ps(sc[r], _mm256_mul_ps(d8, _mm256_broadcast_ss(xd + r * nblk + b)));
                if (NS == 2)
                    corr[r] = _mm256_fmadd_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(blk + 16))),
                                              _mm256_broadcast_ss(xs + r * nblk + b), corr[r]);
            }
        }
        const __m256 dw = ls_bcast8_f16(blk + 2 * r0);
        _Pragma("GCC unroll 8")
        for (int i = 0; i < NRW; i++) {
            __m256i wa, wb; LS_W4_NIB(blk + 16 * NS + 16 * (r0 + i), wa, wb, OFF);
            _Pragma("GCC unroll 8")
            for (int r = 0; r < MR; r++) {
                const int16_t *xr = xq + r * K + 32 * b;
                const __m256i p = _mm256_add_epi32(_mm256_madd_epi16(wa, _mm256_loadu_si256((const __m256i *)xr)),
                                                   _mm256_madd_epi16(wb, _mm256_loadu_si256((const __m256i *)(xr + 16))));
                const __m256 s = NRW > 1 ? _mm256_broadcast_ss(&sc[r][r0 + i])
                                         : _mm256_mul_ps(dw, _mm256_broadcast_ss(xd + r * nblk + b));
                acc[r][i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), s, acc[r][i]);
                if (NS == 2 && NRW == 1) corr1[r] += ls_f16(blk + 16 + 2 * r0) * xs[r * nblk + b];
            }
        }
    }
    for (int r = 0; r < MR; r++) {
        float c[8];
        _mm256_storeu_ps(c, corr[r]);
        for (int i = 0; i < NRW; i++)
            out[r * ostride + r0 + i] = ls_hsum256(acc[r][i]) + (NS == 2 ? (NRW > 1 ? c[r0 + i] : corr1[r]) : 0.0f);
    }
}
static inline __attribute__((always_inline)) void ls_r8_group(const uint8_t *restrict g, int64_t nblk, const int NS,
        const int OFF, const int16_t *restrict xq, const float *restrict xd, const float *restrict xs, int64_t K,
        float *restrict out, int64_t ostride, const int MR) {
    if (MR == 1) {
        ls_r8_rows(g, nblk, NS, OFF, 0, 8, xq, xd, xs, K, out, ostride, 1);
    } else if (MR == 2) {
        for (int i = 0; i < 8; i += 4) ls_r8_rows(g, nblk, NS, OFF, i, 4, xq, xd, xs, K, out, ostride, 2);
    } else if (MR <= 4) {
        for (int i = 0; i < 8; i += 2) ls_r8_rows(g, nblk, NS, OFF, i, 2, xq, xd, xs, K, out, ostride, MR);
    } else {
        for (int i = 0; i < 8; i++) ls_r8_rows(g, nblk, NS, OFF, i, 1, xq, xd, xs, K, out, ostride, MR);
    }
}
/* all n weight rows at w (stride rb; whole groups of 8 repacked, the rest in the GGUF layout) against mr rows */
#define LS_QDOT16X8R(NAME, NS, OFF, GGUF4, GGUF1) \
static inline __attribute__((always_inline)) void NAME##_rows(const uint8_t *restrict w, int64_t rb, int64_t n, \
        const int16_t *restrict xq, const float *restrict xd, const float *restrict xs, int64_t K, int64_t nblk, \
        float *restrict out, int64_t ostride, const int MR) { \
    for (int64_t i = 0; i + 8 <= n; i += 8) ls_r8_group(w + i * rb, nblk, NS, OFF, xq, xd, xs, K, out + i, ostride, MR); \
} \
static inline int64_t NAME(const uint8_t *restrict w, int64_t rb, int64_t n, const int16_t *restrict xq, \
                           const float *restrict xd, const float *restrict xs, int64_t K, int64_t nblk, int64_t mr, \
                           float *restrict out, int64_t ostride) { \
    LS_QMM_DISPATCH(NAME##_rows, w, rb, n, xq, xd, xs, K, nblk, out, ostride); \
    int64_t j = n & ~(int64_t)7; \
    j += GGUF4(w + j * rb, rb, n - j, xq, xd, xs, K, nblk, mr, out + j, ostride); \
    for (; j < n; j++) GGUF1(w + j * rb, xq, xd, xs, K, nblk, mr, out + j, ostride); \
    return n; \
}
LS_QDOT16X8R(ls_qdot16x8r_q4_0, 1, 8, ls_qdot16x4_q4_0, ls_qdot16_q4_0)
LS_QDOT16X8R(ls_qdot16x8r_q4_1, 2, 0, ls_qdot16x4_q4_1, ls_qdot16_q4_1)

/* qgemm.h's float kernel over the repacked layout: a K chunk of the rows decoded into the buffer as
 * NAME##_decode does from the GGUF layout (the same values), then the same micro-kernels */
#define LS_QGEMM_R8(NAME, NS, OFF, GGUF) \
static void NAME##_decode(const uint8_t *restrict w, int64_t rb, int64_t b0, int64_t nb, int64_t n, \
                          float *restrict dst) { \
    const int64_t BS = 16 * NS + 128, whole = n & ~(int64_t)7; \
    for (int64_t j = 0; j < whole; j++) \
        for (int64_t b = 0; b < nb; b++) { \
            const uint8_t *blk = w + (j & ~(int64_t)7) * rb + (b0 + b) * BS; \
            const int i = (int)(j & 7); \
            const __m256 d_ = ls_bcast8_f16(blk + 2 * i); \
            __m256 v[4]; LS_NIBBLES8(blk + 16 * NS + 16 * i, v, OFF); \
            if (NS == 2) { \
                const __m256 m_ = ls_bcast8_f16(blk + 16 + 2 * i); \
                for (int k = 0; k < 4; k++) v[k] = _mm256_fmadd_ps(d_, v[k], m_); \
            } else { \
                for (int k = 0; k < 4; k++) v[k] = _mm256_mul_ps(d_, v[k]); \
            } \
            for (int k = 0; k < 4; k++) _mm256_storeu_ps(dst + j * 32 * nb + 32 * b + 8 * k, v[k]); \
        } \
    if (whole < n) GGUF##_decode(w + whole * rb, rb, b0, nb, n - whole, dst + whole * 32 * nb); \
} \
static void NAME(const uint8_t *restrict w, int64_t rb, const float *restrict x, int64_t M, int64_t K, int64_t n, \
                 float *restrict out, int64_t N) { \
    ls_qg_decoded(w, rb, x, M, K, n, out, N, NAME##_decode); \
}
LS_QGEMM_R8(ls_qgemm_r8_q4_0, 1, 8, ls_qgemm_q4_0)
LS_QGEMM_R8(ls_qgemm_r8_q4_1, 2, 0, ls_qgemm_q4_1)
#endif
