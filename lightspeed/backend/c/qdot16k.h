/* ---- q4_k and q6_k with int16 activations, for calls of at most LS_QMM_ROWS activation rows (decode, batched
 * decode; longer calls run qgemm.h's float kernel, which the renderer branches to, as for q5_0 in qdot16x4.h).
 * The activations are quantized per block of 32 (ls_quantize_rows16), which is one q4_k block and two q6_k
 * blocks of 16, so a block's dot product is an exact integer sum scaled once:
 *   q4_k (w = d*s*q - dmin*m, q a nibble): d*s*x_d * sum(q * x_q) - dmin*m * x_s  (x_s: the block's scaled sum)
 *   q6_k (w = d*sc*(q - 32)): d*x_d * sum(((q - 32) * sc) * x_q), the 16-element scales multiplied into the
 *        weights first (|(q - 32) * sc| <= 4096, exact in int16), so both halves of a block share one sum.
 * Each integer lane sums four products (|sum| < 2^24 for q4_k: exact as a float; < 2^31 for q6_k, rounded
 * once when converted). Per row two accumulators (even and odd blocks) break the FMA chain; q4_k's minimum
 * terms go into the odd one, one vector FMA per super-block. Before: qgemm.h's float kernel decoded every
 * weight to float and multiplied by float activations, compute-bound at 3-4 GB/s a core (Gemma 3 270M Q4_K_M,
 * Zen 4), where the integer products stream the weights several times faster.
 *
 * A row's arithmetic is the same whatever the row count (batched rows round as a single sequence's do). The
 * kernels are AVX2 (on AVX-512 CPUs too); elsewhere a portable form with the same arithmetic per lane gives
 * the same bits (tests/test_qdot16k.py). ls_qg_q4_k_sm and ls_qg_prep_q4_k are qgemm.h's. */
#if defined(LS_HAVE_QDOT16X16_q4_k)
#define LS_SPLIT16_q4_k 1  /* q4_k's int16 calls take qdot16x16.h's 16-row kernel, which reads split bytes */
#else
#define LS_SPLIT16_q4_k 0
#endif
#define LS_SPLIT16_q6_k 0

#if defined(LS_HAVE_QDOT16_AVX2)
/* a row's two accumulators summed in ls_hsum256's order */
#define LS_QK_RESULT(acc, r) ls_hsum256(_mm256_add_ps(acc[r][0], acc[r][1]))

static inline __attribute__((always_inline)) void ls_qdot16_q4_k_rows(const uint8_t *restrict w,
        const int16_t *restrict xq, const float *restrict xd, const float *restrict xs, int64_t K, int64_t nblk,
        float *restrict out, int64_t ostride, const int MR) {
    __m256 acc[LS_QMM_ROWS][2];
    for (int r = 0; r < MR; r++) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
    for (int64_t sb = 0; sb < nblk / 8; sb++) {
        const uint8_t *blk = w + sb * 144;
        LS_PF(blk + LS_QMM_PREFETCH, 0, 3);
        LS_PF(blk + LS_QMM_PREFETCH + 64, 0, 3);
        LS_PF(blk + LS_QMM_PREFETCH + 128, 0, 3);
        ls_qg_st_q4_k st;
        ls_qg_prep_q4_k(blk, &st);
        const __m256 ds = _mm256_loadu_ps(st.ds), dm = _mm256_loadu_ps(st.dm);
        float sc[LS_QMM_ROWS][8] __attribute__((aligned(32)));
        for (int r = 0; r < MR; r++) {
            _mm256_store_ps(sc[r], _mm256_mul_ps(ds, _mm256_loadu_ps(xd + r * nblk + 8 * sb)));
            acc[r][1] = _mm256_fnmadd_ps(dm, _mm256_loadu_ps(xs + r * nblk + 8 * sb), acc[r][1]);
        }
        for (int c = 0; c < 4; c++) {  /* blocks 2c (low nibbles) and 2c + 1 (high) of the same 32 bytes */
            const uint8_t *q = blk + 16 + 32 * c;
            const __m256i b0 = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)q));
            const __m256i b1 = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)(q + 16)));
            const __m256i m15 = _mm256_set1_epi16(15);
            const __m256i wl0 = _mm256_and_si256(b0, m15), wl1 = _mm256_and_si256(b1, m15);
            const __m256i wh0 = _mm256_srli_epi16(b0, 4), wh1 = _mm256_srli_epi16(b1, 4);
            _Pragma("GCC unroll 8")
            for (int r = 0; r < MR; r++) {
                const int16_t *xr = xq + r * K + 256 * sb + 64 * c;
                const __m256i pl = _mm256_add_epi32(
                    _mm256_madd_epi16(wl0, _mm256_loadu_si256((const __m256i *)xr)),
                    _mm256_madd_epi16(wl1, _mm256_loadu_si256((const __m256i *)(xr + 16))));
                const __m256i ph = _mm256_add_epi32(
                    _mm256_madd_epi16(wh0, _mm256_loadu_si256((const __m256i *)(xr + 32))),
                    _mm256_madd_epi16(wh1, _mm256_loadu_si256((const __m256i *)(xr + 48))));
                acc[r][0] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(pl), _mm256_broadcast_ss(&sc[r][2 * c]), acc[r][0]);
                acc[r][1] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(ph), _mm256_broadcast_ss(&sc[r][2 * c + 1]),
                                            acc[r][1]);
            }
        }
    }
    for (int r = 0; r < MR; r++) out[r * ostride] = LS_QK_RESULT(acc, r);
}

static inline __attribute__((always_inline)) void ls_qdot16_q6_k_rows(const uint8_t *restrict w,
        const int16_t *restrict xq, const float *restrict xd, int64_t K, int64_t nblk, float *restrict out,
        int64_t ostride, const int MR) {
    __m256 acc[LS_QMM_ROWS][2];
    for (int r = 0; r < MR; r++) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
    for (int64_t sb = 0; sb < nblk / 8; sb++) {
        const uint8_t *blk = w + sb * 210;
        for (int o = 0; o < 256; o += 64) LS_PF(blk + LS_QMM_PREFETCH + o, 0, 3);
        int16_t s16[16] __attribute__((aligned(32)));
        _mm256_store_si256((__m256i *)s16, _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(blk + 192))));
        const __m256 d = ls_bcast8_f16(blk + 208);
        float sc[LS_QMM_ROWS][8] __attribute__((aligned(32)));
        for (int r = 0; r < MR; r++) _mm256_store_ps(sc[r], _mm256_mul_ps(d, _mm256_loadu_ps(xd + r * nblk + 8 * sb)));
        for (int n = 0; n < 2; n++) {  /* half n: blocks 4n .. 4n + 3 */
            const __m256i l0 = _mm256_loadu_si256((const __m256i *)(blk + 64 * n));
            const __m256i l1 = _mm256_loadu_si256((const __m256i *)(blk + 64 * n + 32));
            const __m256i h = _mm256_loadu_si256((const __m256i *)(blk + 128 + 32 * n));
            const __m256i m15 = _mm256_set1_epi8(15), m48 = _mm256_set1_epi8(48), o32 = _mm256_set1_epi8(32);
            __m256i q[4];  /* block 4n + k: low 4 bits from l0 / l1 (k even / odd; low nibbles for k < 2), qh bits 2k */
            q[0] = _mm256_or_si256(_mm256_and_si256(l0, m15), _mm256_and_si256(_mm256_slli_epi16(h, 4), m48));
            q[1] = _mm256_or_si256(_mm256_and_si256(l1, m15), _mm256_and_si256(_mm256_slli_epi16(h, 2), m48));
            q[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), m15), _mm256_and_si256(h, m48));
            q[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), m15),
                                   _mm256_and_si256(_mm256_srli_epi16(h, 2), m48));
            _Pragma("GCC unroll 4")
            for (int k = 0; k < 4; k++) {
                const int j = 4 * n + k;
                const __m256i v = _mm256_sub_epi8(q[k], o32);
                const __m256i wa = _mm256_mullo_epi16(_mm256_cvtepi8_epi16(_mm256_castsi256_si128(v)),
                                                      _mm256_set1_epi16(s16[2 * j]));
                const __m256i wb = _mm256_mullo_epi16(_mm256_cvtepi8_epi16(_mm256_extracti128_si256(v, 1)),
                                                      _mm256_set1_epi16(s16[2 * j + 1]));
                _Pragma("GCC unroll 8")
                for (int r = 0; r < MR; r++) {
                    const int16_t *xr = xq + r * K + 256 * sb + 32 * j;
                    const __m256i p = _mm256_add_epi32(
                        _mm256_madd_epi16(wa, _mm256_loadu_si256((const __m256i *)xr)),
                        _mm256_madd_epi16(wb, _mm256_loadu_si256((const __m256i *)(xr + 16))));
                    acc[r][k & 1] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_broadcast_ss(&sc[r][j]),
                                                    acc[r][k & 1]);
                }
            }
        }
    }
    for (int r = 0; r < MR; r++) out[r * ostride] = LS_QK_RESULT(acc, r);
}

static inline void ls_qdot16_q4_k(const uint8_t *restrict w, const int16_t *restrict xq, const float *restrict xd,
                                  const float *restrict xs, int64_t K, int64_t nblk, int64_t mr,
                                  float *restrict out, int64_t ostride) {
    LS_QMM_DISPATCH(ls_qdot16_q4_k_rows, w, xq, xd, xs, K, nblk, out, ostride);
}
static inline void ls_qdot16_q6_k(const uint8_t *restrict w, const int16_t *restrict xq, const float *restrict xd,
                                  const float *restrict xs, int64_t K, int64_t nblk, int64_t mr,
                                  float *restrict out, int64_t ostride) {
    (void)xs;
    LS_QMM_DISPATCH(ls_qdot16_q6_k_rows, w, xq, xd, K, nblk, out, ostride);
}
#else
/* portable: the AVX2 kernels' arithmetic lane by lane. Lane l of block j's integer sum takes elements 2l, 2l+1,
 * 16+2l and 17+2l; even blocks accumulate into a[0], odd ones (and q4_k's minimum terms, first in each
 * super-block) into a[1]; the result is ls_hsum256's order over a[0] + a[1]. */
static inline float ls_qk_sum(float a[2][8]) {
    float v[8];
    for (int l = 0; l < 8; l++) v[l] = a[0][l] + a[1][l];
    return ((v[0] + v[4]) + (v[2] + v[6])) + ((v[1] + v[5]) + (v[3] + v[7]));
}
static inline void ls_qk_block(const int32_t *wv, const int16_t *restrict xr, float sc, float *restrict a) {
    for (int l = 0; l < 8; l++) {
        const int32_t p = wv[2 * l] * xr[2 * l] + wv[2 * l + 1] * xr[2 * l + 1]
                          + wv[16 + 2 * l] * xr[16 + 2 * l] + wv[17 + 2 * l] * xr[17 + 2 * l];
        a[l] = fmaf((float)p, sc, a[l]);
    }
}
static inline void ls_qdot16_q4_k(const uint8_t *restrict w, const int16_t *restrict xq, const float *restrict xd,
                                  const float *restrict xs, int64_t K, int64_t nblk, int64_t mr,
                                  float *restrict out, int64_t ostride) {
    for (int64_t r = 0; r < mr; r++) {
        float a[2][8] = {{0}};
        for (int64_t sb = 0; sb < nblk / 8; sb++) {
            const uint8_t *blk = w + sb * 144;
            const float d = ls_f16(blk), dmin = ls_f16(blk + 2);
            float ds[8];
            for (int j = 0; j < 8; j++) {
                int s, m;
                ls_qg_q4_k_sm(blk + 4, j, &s, &m);
                ds[j] = d * (float)s;
                a[1][j] = fmaf(-(dmin * (float)m), xs[r * nblk + 8 * sb + j], a[1][j]);
            }
            for (int j = 0; j < 8; j++) {
                const uint8_t *q = blk + 16 + 32 * (j >> 1);
                int32_t wv[32];
                for (int i = 0; i < 32; i++) wv[i] = (q[i] >> (4 * (j & 1))) & 15;
                ls_qk_block(wv, xq + r * K + 256 * sb + 32 * j, ds[j] * xd[r * nblk + 8 * sb + j], a[j & 1]);
            }
        }
        out[r * ostride] = ls_qk_sum(a);
    }
}
static inline void ls_qdot16_q6_k(const uint8_t *restrict w, const int16_t *restrict xq, const float *restrict xd,
                                  const float *restrict xs, int64_t K, int64_t nblk, int64_t mr,
                                  float *restrict out, int64_t ostride) {
    (void)xs;
    for (int64_t r = 0; r < mr; r++) {
        float a[2][8] = {{0}};
        for (int64_t sb = 0; sb < nblk / 8; sb++) {
            const uint8_t *blk = w + sb * 210;
            const int8_t *sc = (const int8_t *)(blk + 192);
            const float d = ls_f16(blk + 208);
            for (int j = 0; j < 8; j++) {
                const int n = j >> 2, k = j & 3;
                const uint8_t *ql = blk + 64 * n + 32 * (k & 1), *qh = blk + 128 + 32 * n;
                int32_t wv[32];
                for (int i = 0; i < 32; i++) {
                    const int q = ((ql[i] >> (4 * (k >> 1))) & 15) | (((qh[i] >> (2 * k)) & 3) << 4);
                    wv[i] = (q - 32) * sc[2 * j + (i >= 16)];
                }
                ls_qk_block(wv, xq + r * K + 256 * sb + 32 * j, d * xd[r * nblk + 8 * sb + j], a[k & 1]);
            }
        }
        out[r * ostride] = ls_qk_sum(a);
    }
}
#endif
