/* Half-precision weight matmul out[m, n] = sum_k x[m, k] * widen(w[n, k]) for float16 and bfloat16 weights
 * (w dense [N][K], K a multiple of 8), with qgemm.h's summation order, so that a row's result is
 * bit-identical alone (decode) and in any batch (batched decode, prefill):
 *   - K is cut into chunks of ls_hg_chunk(K) values (a multiple of 8, a function of K only);
 *   - per chunk, 8 lanes accumulate lane l += w[k] * x[k] (k = l mod 8, k increasing, fused multiply-add),
 *     then the lanes are summed as ((a0+a1)+(a2+a3))+((a4+a5)+(a6+a7));
 *   - the chunk sums are added in order: out = s0, out = out + s1, ...
 * Widening is exact (float16 and bfloat16 values are all floats), so every path multiplies the same values.
 * Up to LS_QG_FEW rows widen the weights in registers, each vector once for all rows, streaming the weight
 * rows with software prefetch. More rows widen a K chunk of up to LS_QG_RMAX weight rows into a float panel
 * and run qgemm.h's register-blocked micro-kernels over it. The portable form computes the same values.
 * AVX-512 CPUs run these AVX2 kernels too (SmolLM2 requantized to f16 on an Ice Lake Xeon, 2 threads: a decode
 * step 90-118 ms -> 18 ms, prefill 34 -> 353 tok/s against the portable form they ran before). */

#define LS_HG_KC 768  /* most values in a K chunk (the panel holds LS_QG_RMAX rows of a chunk) */

/* values per K chunk: the fewest chunks of at most LS_HG_KC values, as even as possible, in groups of 8 */
static inline int64_t ls_hg_chunk(int64_t K) {
    const int64_t g = K / 8, nc = (g + LS_HG_KC / 8 - 1) / (LS_HG_KC / 8);
    return nc > 0 ? (g + nc - 1) / nc * 8 : 8;
}

/* portable widening of one weight (exact) */
static inline float ls_hg_f16(const uint16_t *p) { _Float16 h; memcpy(&h, p, 2); return (float)h; }
static inline float ls_hg_bf16(const uint16_t *p) { return ls_bits_f32((uint32_t)*p << 16); }

#if defined(LS_HAVE_QGEMM_AVX2)
/* 8 weights widened to floats: F16C for float16, a 16-bit shift for bfloat16 */
#define LS_HG_W_F16(p) _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p)))
#define LS_HG_W_BF16(p) \
    _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(p))), 16))
/* prefetch distance in the weight stream, in bytes (NR rows stream at once, as in qgemm.h) */
#define LS_HG_PF(p) LS_PF((const char *)(p) + 2 * LS_QMM_PREFETCH, 0, 3)

#define LS_HG_STEP(WIDEN, w, x, K, k, MR, NR, acc) do { \
    __m256 v_[4]; \
    for (int j_ = 0; j_ < (NR); j_++) v_[j_] = WIDEN((w) + j_ * (K) + (k)); \
    for (int r_ = 0; r_ < (MR); r_++) { \
        __m256 xv_ = _mm256_loadu_ps((x) + r_ * (K) + (k)); \
        __asm__("" : "+x"(xv_));  /* one load of x per step, not one folded into each FMA */ \
        for (int j_ = 0; j_ < (NR); j_++) acc[r_][j_] = _mm256_fmadd_ps(v_[j_], xv_, acc[r_][j_]); \
    } } while (0)

#define LS_HG_KERNELS(NAME, WIDEN) \
/* MR activation rows (stride K) x NR weight rows (stride K) over values [k0, k1) of K */ \
static inline __attribute__((always_inline)) void NAME##_few_k(const uint16_t *restrict w, \
        const float *restrict x, int64_t K, int64_t k0, int64_t k1, float *restrict out, int64_t N, const int MR, \
        const int NR) { \
    const __m256 z = _mm256_setzero_ps(); \
    __m256 acc[8][4]; \
    for (int r = 0; r < MR; r++) for (int j = 0; j < NR; j++) acc[r][j] = z; \
    int64_t k = k0; \
    for (; k + 32 <= k1; k += 32) {  /* a cache line of each weight row per step, prefetched ahead */ \
        for (int j = 0; j < NR; j++) LS_HG_PF(w + j * K + k); \
        LS_HG_STEP(WIDEN, w, x, K, k, MR, NR, acc); \
        LS_HG_STEP(WIDEN, w, x, K, k + 8, MR, NR, acc); \
        LS_HG_STEP(WIDEN, w, x, K, k + 16, MR, NR, acc); \
        LS_HG_STEP(WIDEN, w, x, K, k + 24, MR, NR, acc); \
    } \
    for (; k < k1; k += 8) LS_HG_STEP(WIDEN, w, x, K, k, MR, NR, acc); \
    for (int r = 0; r < MR; r++) \
        ls_qg_store4(out + r * N, ls_qg_sum4(acc[r][0], NR > 1 ? acc[r][1] : z, NR > 2 ? acc[r][2] : z, \
                                             NR > 3 ? acc[r][3] : z), NR, k0 == 0); \
} \
/* n weight rows, NR at a time (then the remainder), over one K range */ \
static inline __attribute__((always_inline)) void NAME##_few_rows(const uint16_t *restrict w, \
        const float *restrict x, int64_t K, int64_t k0, int64_t k1, int64_t n, float *restrict out, int64_t N, \
        const int MR, const int NR) { \
    int64_t j = 0; \
    for (; j + NR <= n; j += NR) NAME##_few_k(w + j * K, x, K, k0, k1, out + j, N, MR, NR); \
    switch (n - j) { \
    case 1: NAME##_few_k(w + j * K, x, K, k0, k1, out + j, N, MR, 1); break; \
    case 2: if (NR > 2) NAME##_few_k(w + j * K, x, K, k0, k1, out + j, N, MR, 2); break; \
    case 3: if (NR > 3) NAME##_few_k(w + j * K, x, K, k0, k1, out + j, N, MR, 3); break; \
    default: break; } \
} \
/* rows whose x exceeds L1 go K chunk by K chunk over all n weight rows (that chunk of x stays in L1), \
 * others stream each group of NR weight rows once from start to end */ \
static inline __attribute__((always_inline)) void NAME##_few_n(const uint16_t *restrict w, \
        const float *restrict x, int64_t K, int64_t n, float *restrict out, int64_t N, const int MR, const int NR) { \
    const int64_t kcs = ls_hg_chunk(K); \
    if (MR * K * 4 > LS_QG_X_L1) { \
        for (int64_t k0 = 0; k0 < K; k0 += kcs) NAME##_few_rows(w, x, K, k0, ls_min(K, k0 + kcs), n, out, N, MR, NR); \
        return; \
    } \
    for (int64_t j = 0; j < n; j += NR) { \
        const int64_t nj = ls_min(NR, n - j); \
        for (int64_t k0 = 0; k0 < K; k0 += kcs) \
            NAME##_few_rows(w + j * K, x, K, k0, ls_min(K, k0 + kcs), nj, out + j, N, MR, NR); \
    } \
} \
static void NAME##_few(const uint16_t *restrict w, const float *restrict x, int64_t M, int64_t K, int64_t n, \
                       float *restrict out, int64_t N) { \
    switch (M) { \
    /* one or two rows stream one weight row at a time: from memory ~10% faster than 2-4 rows at once \
     * (bf16, 1 row, 85 MB of weights, one thread: 5.0 ms vs 5.6-6.1 ms; hot in L3 it is slower) */ \
    case 1: NAME##_few_n(w, x, K, n, out, N, 1, 1); break; \
    case 2: NAME##_few_n(w, x, K, n, out, N, 2, 1); break; \
    case 3: NAME##_few_n(w, x, K, n, out, N, 3, 3); break; \
    case 4: NAME##_few_n(w, x, K, n, out, N, 4, 2); break; \
    default:  /* 4 rows, then the rest: two passes over the item's weights (from L1/L2 the second time) \
               * measured ~10% faster at 6 and 8 rows than one pass of 6x1 / 8x1 (9 loads per 8 FMAs) */ \
        NAME##_few_n(w, x, K, n, out, N, 4, 2); \
        NAME##_few(w, x + 4 * K, M - 4, K, n, out + 4 * N, N); break; } \
} \
/* out[m, j] (row stride N) for n weight rows at w (stride K) and M activation rows (stride K) */ \
static void NAME(const uint16_t *restrict w, const float *restrict x, int64_t M, int64_t K, int64_t n, \
                 float *restrict out, int64_t N) { \
    if (M <= LS_QG_FEW) { NAME##_few(w, x, M, K, n, out, N); return; } \
    float buf[LS_QG_RMAX * LS_HG_KC] __attribute__((aligned(64))); \
    const int64_t kcs = ls_hg_chunk(K); \
    for (int64_t j0 = 0; j0 < n; j0 += LS_QG_RMAX) { \
        const int64_t nj = ls_min(LS_QG_RMAX, n - j0); \
        for (int64_t k0 = 0; k0 < K; k0 += kcs) { \
            const int64_t kc = ls_min(kcs, K - k0); \
            for (int64_t j = 0; j < nj; j++)  /* the panel: nj rows of kc widened weights */ \
                for (int64_t k = 0; k < kc; k += 8) \
                    _mm256_store_ps(buf + j * kc + k, WIDEN(w + (j0 + j) * K + k0 + k)); \
            for (int64_t m0 = 0; m0 < M; m0 += LS_QG_MR) { \
                const int mr = (int)ls_min(LS_QG_MR, M - m0), nr = ls_qg_nr(mr); \
                for (int64_t j = 0; j < nj; j += nr) \
                    ls_qg_micro(x + m0 * K + k0, K, buf + j * kc, kc, out + m0 * N + j0 + j, N, k0 == 0, mr, \
                                (int)ls_min(nr, nj - j)); \
            } \
        } \
    } \
}
#if defined(__F16C__)
#define LS_HAVE_HGEMM_F16 1
LS_HG_KERNELS(ls_hgemm_f16, LS_HG_W_F16)
#endif
#define LS_HAVE_HGEMM_BF16 1
LS_HG_KERNELS(ls_hgemm_bf16, LS_HG_W_BF16)
#endif

/* Portable form: the same order and values without vector intrinsics. */
#define LS_HG_PORTABLE(NAME, CVT) \
static void NAME(const uint16_t *restrict w, const float *restrict x, int64_t M, int64_t K, int64_t n, \
                 float *restrict out, int64_t N) { \
    const int64_t kcs = ls_hg_chunk(K); \
    float buf[LS_HG_KC]; \
    for (int64_t j = 0; j < n; j++) \
        for (int64_t k0 = 0; k0 < K; k0 += kcs) { \
            const int64_t kc = ls_min(kcs, K - k0); \
            for (int64_t k = 0; k < kc; k++) buf[k] = CVT(w + j * K + k0 + k); \
            for (int64_t m = 0; m < M; m++) { \
                const float s = ls_qg_chunk_dot(buf, x + m * K + k0, kc); \
                ls_qg_store(out + m * N + j, &s, 1, k0 == 0); \
            } \
        } \
}
LS_HG_PORTABLE(ls_hgemm_portable_f16, ls_hg_f16)
LS_HG_PORTABLE(ls_hgemm_portable_bf16, ls_hg_bf16)
