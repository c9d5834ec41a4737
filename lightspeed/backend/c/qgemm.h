/* Quantized matmul out[m, n] = sum_k x[m, k] * w[n, k] for the block formats q8_0, q4_0, q4_1, q5_0 and the
 * 256-element q4_k and q6_k (as 8 blocks of 32 per super-block), with one summation order for every row
 * count, so that a row's result is bit-identical alone (decode) and in any batch (batched decode, prefill):
 *   - the weights are decoded with their scale (and min) applied: w = d * q (q4_1: fma(d, q, m); q4_k:
 *     fma(d * s, q, -(dmin * m)); q6_k: (d * s) * q);
 *   - K is cut into chunks of ls_qg_chunk_blocks(nblk) blocks (a function of K only);
 *   - per chunk, 8 lanes accumulate lane l += w[k] * x[k] (k = l mod 8, k increasing, fused multiply-add),
 *     then the lanes are summed as ((a0+a1)+(a2+a3))+((a4+a5)+(a6+a7));
 *   - the chunk sums are added in order: out = s0, out = out + s1, ...
 * Up to LS_QG_FEW rows (decode, batched decode) decode weight blocks in registers, each block once for all
 * rows. More rows (prefill) decode a K chunk of the item's weight rows once into a float buffer (in L2) and
 * run register-blocked micro-kernels of up to 6 activation rows x 2-4 weight rows (12 accumulators) over
 * it, so the FMAs need no scale and every load feeds several FMAs. The portable form computes the same
 * values. */

#define LS_QG_KCB 24  /* most blocks of 32 in a K chunk (the buffer holds LS_QG_RMAX rows of a chunk) */
#define LS_QG_RMAX 64  /* weight rows decoded into the buffer at once */
#define LS_QG_MR 6  /* most activation rows of the micro-kernel */
#define LS_QG_NR 4  /* most weight rows of the micro-kernel */
#define LS_QG_FEW 8  /* most activation rows of the register-decoding kernel (batched decode) */
/* software prefetch in the register-decoding kernel: NR weight rows stream at once, and twice the one-stream
 * distance measured faster (Q8_0, one row, weights from memory: ~10% less time than LS_QMM_PREFETCH) */
#define LS_QG_FEW_PF(blk) LS_PF((blk) + 2 * LS_QMM_PREFETCH, 0, 3)
#define LS_QG_X_L1 (16 * 1024)  /* bytes of activation rows read alongside streaming weights from L1 */

/* blocks per K chunk: the fewest chunks of at most LS_QG_KCB blocks, as even as possible */
static inline int64_t ls_qg_chunk_blocks(int64_t nblk) {
    const int64_t nc = (nblk + LS_QG_KCB - 1) / LS_QG_KCB;
    return nc > 0 ? (nblk + nc - 1) / nc : 1;
}

/* fused multiply-add where the hardware has it (the vector paths fuse too), else the plain expression */
#if defined(FP_FAST_FMAF)
#define LS_QG_FMA(a, b, c) fmaf((a), (b), (c))
#else
#define LS_QG_FMA(a, b, c) ((a) * (b) + (c))
#endif

/* Portable decoders of block j (of 32 elements) of a super-block b, scale applied, the same values as the
 * vector ones (the 32-element formats have one block per super-block: j is 0) */
static inline void ls_qg_dq_q8_0(const uint8_t *b, int j, float *restrict w) {
    (void)j;
    const float d = ls_f16(b);
    const int8_t *q = (const int8_t *)(b + 2);
    for (int i = 0; i < 32; i++) w[i] = d * (float)q[i];
}
static inline void ls_qg_dq_q4_0(const uint8_t *b, int j, float *restrict w) {
    (void)j;
    const float d = ls_f16(b);
    for (int i = 0; i < 16; i++) {
        w[i] = d * (float)((int)(b[2 + i] & 15) - 8);
        w[i + 16] = d * (float)((int)(b[2 + i] >> 4) - 8);
    }
}
static inline void ls_qg_dq_q4_1(const uint8_t *b, int j, float *restrict w) {
    (void)j;
    const float d = ls_f16(b), m = ls_f16(b + 2);
    for (int i = 0; i < 16; i++) {
        w[i] = LS_QG_FMA(d, (float)(b[4 + i] & 15), m);
        w[i + 16] = LS_QG_FMA(d, (float)(b[4 + i] >> 4), m);
    }
}

/* q5_0: d * ((nibble | high bit << 4) - 16), the high bit of element i being bit i of qh */
static inline void ls_qg_dq_q5_0(const uint8_t *b, int j, float *restrict w) {
    (void)j;
    const float d = ls_f16(b);
    uint32_t qh;
    memcpy(&qh, b + 2, 4);
    for (int i = 0; i < 16; i++) {
        w[i] = d * (float)((int)((b[6 + i] & 15) | (((qh >> i) & 1u) << 4)) - 16);
        w[i + 16] = d * (float)((int)((b[6 + i] >> 4) | (((qh >> (i + 16)) & 1u) << 4)) - 16);
    }
}
/* q4_k block j: its 6-bit scale s and min m, packed in the super-block's 12 scale bytes */
static inline void ls_qg_q4_k_sm(const uint8_t *sc, int j, int *s, int *m) {
    if (j < 4) {
        *s = sc[j] & 63;
        *m = sc[j + 4] & 63;
    } else {
        *s = (sc[j + 4] & 15) | ((sc[j - 4] >> 6) << 4);
        *m = (sc[j + 4] >> 4) | ((sc[j] >> 6) << 4);
    }
}
/* q4_k block j: fma(d * s, nibble, -(dmin * m)); the nibbles of blocks 2c and 2c + 1 share the 32 bytes
 * qs[32c..32c+31] (low, high) */
static inline void ls_qg_dq_q4_k(const uint8_t *b, int j, float *restrict w) {
    int s, m;
    ls_qg_q4_k_sm(b + 4, j, &s, &m);
    const float ds = ls_f16(b) * (float)s, dm = ls_f16(b + 2) * (float)m;
    const uint8_t *q = b + 16 + 32 * (j >> 1);
    const int sh = 4 * (j & 1);
    for (int l = 0; l < 32; l++) w[l] = LS_QG_FMA(ds, (float)((q[l] >> sh) & 15), -dm);
}
/* q6_k block j = 4n + k (half n, quarter k): (d * scale) * (q - 32), q = low 4 bits from ql (low nibbles for
 * k < 2, high for k >= 2) | 2 bits of qh (bits 2k, 2k+1) << 4; elements 0-15 and 16-31 have their own scale */
static inline void ls_qg_dq_q6_k(const uint8_t *b, int j, float *restrict w) {
    const int n = j >> 2, k = j & 3;
    const uint8_t *ql = b + 64 * n + 32 * (k & 1), *qh = b + 128 + 32 * n;
    const int8_t *sc = (const int8_t *)(b + 192 + 8 * n + 2 * k);
    const float d = ls_f16(b + 208), s0 = d * (float)sc[0], s1 = d * (float)sc[1];
    const int shl = 4 * (k >> 1), shh = 2 * k;
    for (int l = 0; l < 32; l++) {
        const int q = ((ql[l] >> shl) & 15) | (((qh[l] >> shh) & 3) << 4);
        w[l] = (l < 16 ? s0 : s1) * (float)(q - 32);
    }
}

/* the 8-lane sum in the order above */
static inline float ls_qg_sum8(const float *a) { return ((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7])); }

/* one K chunk of one row in the order above (kc a multiple of 8): the portable forms' reference arithmetic */
static inline float ls_qg_chunk_dot(const float *restrict w, const float *restrict x, int64_t kc) {
    float acc[8] = {0};
    for (int64_t k = 0; k < kc; k += 8)
        for (int l = 0; l < 8; l++) acc[l] = LS_QG_FMA(w[k + l], x[k + l], acc[l]);
    return ls_qg_sum8(acc);
}

/* out[j] (j < nr) = s[j] for the first chunk, out[j] + s[j] after */
static inline void ls_qg_store(float *restrict out, const float *s, int nr, int first) {
    for (int j = 0; j < nr; j++) out[j] = first ? s[j] : out[j] + s[j];
}

#if defined(__AVX2__) && defined(__FMA__)
/* the kernels below: every format's float kernel on AVX2 CPUs (LS_HAVE_QGEMM); on AVX-512 CPUs they are the
 * float kernel of the formats that have no AVX-512 one (q5_0, q4_k, q6_k: the renderer asks for
 * LS_HAVE_QGEMM_AVX2 there). Gemma 3 270M Q4_K_M on an Ice Lake Xeon, 2 threads: a Q6_K 2048 x 640 matmul of one
 * row took 1.9-3.1 ms through the per-block float decode it had before, the whole decode step 50 ms. */
#define LS_HAVE_QGEMM_AVX2 1
#if !defined(__AVX512F__)
#define LS_HAVE_QGEMM 1
#endif

/* the 8-lane sums of four accumulators, in the order above, as one 4-lane vector */
static inline __m128 ls_qg_sum4(__m256 a, __m256 b, __m256 c, __m256 d) {
    const __m256 t = _mm256_hadd_ps(_mm256_hadd_ps(a, b), _mm256_hadd_ps(c, d));
    return _mm_add_ps(_mm256_castps256_ps128(t), _mm256_extractf128_ps(t, 1));
}
static inline void ls_qg_store4(float *restrict out, __m128 s, int nr, int first) {
    if (nr == 4) {
        _mm_storeu_ps(out, first ? s : _mm_add_ps(_mm_loadu_ps(out), s));
    } else {
        float t[4];
        _mm_storeu_ps(t, s);
        ls_qg_store(out, t, nr, first);
    }
}

/* block j of super-block b: its 32 weights, scale (and min) applied, as four vectors in element order; st is
 * what PREP wrote for the super-block (its scales as floats: the 256-element formats; the others have none) */
typedef struct { char unused; } ls_qg_st_none;
#define LS_QG_PREP_NONE(b, st) ((void)0)
#define LS_QG_VALS_Q8_0(b, j, st, v) do { \
    const __m256 d_ = ls_bcast8_f16(b); LS_VALS_Q8_0(b, v); \
    for (int i_ = 0; i_ < 4; i_++) v[i_] = _mm256_mul_ps(d_, v[i_]); } while (0)
#define LS_QG_VALS_Q4_0(b, j, st, v) do { \
    const __m256 d_ = ls_bcast8_f16(b); LS_VALS_Q4_0(b, v); \
    for (int i_ = 0; i_ < 4; i_++) v[i_] = _mm256_mul_ps(d_, v[i_]); } while (0)
#define LS_QG_VALS_Q4_1(b, j, st, v) do { \
    const __m256 d_ = ls_bcast8_f16(b), m_ = ls_bcast8_f16((b) + 2); LS_VALS_Q4_1(b, v); \
    for (int i_ = 0; i_ < 4; i_++) v[i_] = _mm256_fmadd_ps(d_, v[i_], m_); } while (0)
/* a block's 32 byte values stored to t, to be widened 8 at a time from memory (vpmovsxbd with a memory
 * operand) rather than by extracting and shifting halves in registers: three shuffles less per block (Q5_0:
 * one row ~7% faster, three rows ~4% slower; Q6_K: one row ~5% faster but eight ~9% slower, so it keeps the
 * shuffles); the empty asm keeps gcc from turning the store and loads back into shuffles */
static inline void ls_qg_spill32(__m256i q, int8_t *t) {
    _mm256_store_si256((__m256i *)t, q);
    __asm__("" : "+m"(*(int8_t(*)[32])t));
}
#define LS_QG_T8(t, i) _mm_loadl_epi64((const __m128i *)((t) + 8 * (i)))
static inline void ls_qg_vals_q5_0(const uint8_t *b, __m256 *v) {
    uint32_t qh;
    memcpy(&qh, b + 2, 4);
    /* byte i of the vector: byte i / 8 of qh (both 128-bit lanes hold all of qh), then bit i % 8 of it */
    const __m256i sel = _mm256_shuffle_epi8(_mm256_set1_epi32((int)qh),
        _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3));
    const __m256i bit = _mm256_set1_epi64x(0x8040201008040201LL);
    /* (nibble | high << 4) - 16 as int8: the nibble where the high bit is set, else nibble - 16 = nibble | 0xf0 */
    const __m256i set = _mm256_cmpeq_epi8(_mm256_and_si256(sel, bit), bit);
    const __m256i q = _mm256_or_si256(ls_nibbles32(b + 6, 0), _mm256_andnot_si256(set, _mm256_set1_epi8((char)0xf0)));
    const __m256 d = ls_bcast8_f16(b);
    int8_t t[32] __attribute__((aligned(32)));
    ls_qg_spill32(q, t);
    for (int i = 0; i < 4; i++) v[i] = _mm256_mul_ps(d, ls_i8x8_ps(LS_QG_T8(t, i)));
}
/* q4_k: a super-block's 8 block scales d * s and mins dmin * m (the values of ls_qg_dq_q4_k), unpacked at once:
 * bytes 0-3 hold s0-3 (and the top 2 bits of s4-7), bytes 4-7 m0-3 (top bits of m4-7), bytes 8-11 the low
 * 4 bits of s4-7 (low nibbles) and m4-7 (high nibbles) */
typedef struct { float ds[8], dm[8]; } ls_qg_st_q4_k;
static inline void ls_qg_prep_q4_k(const uint8_t *b, ls_qg_st_q4_k *st) {
    uint32_t u[3];
    memcpy(u, b + 4, 12);
    const uint64_t s = (u[0] & 0x3f3f3f3fu) | (uint64_t)((u[2] & 0x0f0f0f0fu) | ((u[0] >> 2) & 0x30303030u)) << 32;
    const uint64_t m = (u[1] & 0x3f3f3f3fu) | (uint64_t)(((u[2] >> 4) & 0x0f0f0f0fu) | ((u[1] >> 2) & 0x30303030u)) << 32;
    _mm256_storeu_ps(st->ds, _mm256_mul_ps(ls_bcast8_f16(b), ls_u8x8_ps(_mm_cvtsi64_si128((long long)s))));
    _mm256_storeu_ps(st->dm, _mm256_mul_ps(ls_bcast8_f16(b + 2), ls_u8x8_ps(_mm_cvtsi64_si128((long long)m))));
}
/* block j's 32 nibbles: the low (j even) or high (j odd) nibbles of 32 bytes, 16 at a time in both lanes */
static inline void ls_qg_vals_q4_k(const uint8_t *b, int j, const ls_qg_st_q4_k *st, __m256 *v) {
    const __m256 ds = _mm256_broadcast_ss(st->ds + j), dm = _mm256_broadcast_ss(st->dm + j);
    const uint8_t *q = b + 16 + 32 * (j >> 1);
    const __m128i sh = _mm_cvtsi32_si128(4 * (j & 1));
    const __m256i m15 = _mm256_set1_epi32(15);
    for (int h = 0; h < 2; h++) {
        const __m256i t = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(q + 16 * h)));
        const __m256i t0 = _mm256_shuffle_epi8(t, LS_BYTES_TO_DWORDS_0_7);
        const __m256i t1 = _mm256_shuffle_epi8(t, LS_BYTES_TO_DWORDS_8_15);
        v[2 * h] = _mm256_fmsub_ps(ds, _mm256_cvtepi32_ps(_mm256_and_si256(_mm256_srl_epi32(t0, sh), m15)), dm);
        v[2 * h + 1] = _mm256_fmsub_ps(ds, _mm256_cvtepi32_ps(_mm256_and_si256(_mm256_srl_epi32(t1, sh), m15)), dm);
    }
}
/* q6_k: a super-block's 16 scales d * sc (block j has 2j and 2j + 1) */
typedef struct { float s[16]; } ls_qg_st_q6_k;
static inline void ls_qg_prep_q6_k(const uint8_t *b, ls_qg_st_q6_k *st) {
    const __m256 d = ls_bcast8_f16(b + 208);
    const __m128i sc = _mm_loadu_si128((const __m128i *)(b + 192));
    _mm256_storeu_ps(st->s, _mm256_mul_ps(d, ls_i8x8_ps(sc)));
    _mm256_storeu_ps(st->s + 8, _mm256_mul_ps(d, ls_i8x8_ps(_mm_srli_si128(sc, 8))));
}
static inline void ls_qg_vals_q6_k(const uint8_t *b, int j, const ls_qg_st_q6_k *st, __m256 *v) {
    const int n = j >> 2, k = j & 3;
    const __m256i lo = _mm256_and_si256(_mm256_srl_epi16(_mm256_loadu_si256((const __m256i *)(b + 64 * n + 32 * (k & 1))),
                                                         _mm_cvtsi32_si128(4 * (k >> 1))), _mm256_set1_epi8(15));
    const __m256i hi = _mm256_and_si256(_mm256_srl_epi16(_mm256_loadu_si256((const __m256i *)(b + 128 + 32 * n)),
                                                         _mm_cvtsi32_si128(2 * k)), _mm256_set1_epi8(3));
    const __m256i q = _mm256_sub_epi8(_mm256_or_si256(lo, _mm256_slli_epi16(hi, 4)), _mm256_set1_epi8(32));
    const __m128i q0 = _mm256_castsi256_si128(q), q1 = _mm256_extracti128_si256(q, 1);
    const __m256 s0 = _mm256_broadcast_ss(st->s + 2 * j), s1 = _mm256_broadcast_ss(st->s + 2 * j + 1);
    v[0] = _mm256_mul_ps(s0, ls_i8x8_ps(q0));
    v[1] = _mm256_mul_ps(s0, ls_i8x8_ps(_mm_srli_si128(q0, 8)));
    v[2] = _mm256_mul_ps(s1, ls_i8x8_ps(q1));
    v[3] = _mm256_mul_ps(s1, ls_i8x8_ps(_mm_srli_si128(q1, 8)));
}
#define LS_QG_VALS_Q5_0(b, j, st, v) ls_qg_vals_q5_0(b, v)
#define LS_QG_VALS_Q4_K(b, j, st, v) ls_qg_vals_q4_k(b, j, st, v)
#define LS_QG_VALS_Q6_K(b, j, st, v) ls_qg_vals_q6_k(b, j, st, v)

/* micro-kernel: MR activation rows (stride K) x NR decoded weight rows (stride kc) over kc values */
static inline __attribute__((always_inline)) void ls_qg_micro_k(const float *restrict x, int64_t K,
        const float *restrict w, int64_t kc, float *restrict out, int64_t N, int first, const int MR, const int NR) {
    __m256 acc[LS_QG_MR][LS_QG_NR];
    for (int r = 0; r < MR; r++)
        for (int j = 0; j < NR; j++) acc[r][j] = _mm256_setzero_ps();
    for (int64_t k = 0; k < kc; k += 8) {
        __m256 wv[LS_QG_NR];
        for (int j = 0; j < NR; j++) wv[j] = _mm256_loadu_ps(w + j * kc + k);
        for (int r = 0; r < MR; r++) {
            __m256 xv = _mm256_loadu_ps(x + r * K + k);
            /* in a register: gcc would otherwise fold the load into each FMA (NR loads instead of one) */
            __asm__("" : "+x"(xv));
            for (int j = 0; j < NR; j++) acc[r][j] = _mm256_fmadd_ps(wv[j], xv, acc[r][j]);
        }
    }
    const __m256 z = _mm256_setzero_ps();
    for (int r = 0; r < MR; r++) {
        for (int j = 0; j < NR; j += 4) {
            const int n = NR - j < 4 ? NR - j : 4;
            const __m128 s = ls_qg_sum4(acc[r][j], n > 1 ? acc[r][j + 1] : z, n > 2 ? acc[r][j + 2] : z,
                                         n > 3 ? acc[r][j + 3] : z);
            ls_qg_store4(out + r * N + j, s, n, first);
        }
    }
}
/* The micro-kernel's shape for mr activation rows: 6x2, 5x2, 4x3, 3x4, 2x4 or 1x4 (the fastest measured on
 * Zen 3 for each; the 12 accumulators, the weights and one row of x fill the 16 ymm registers). */
static inline int ls_qg_nr(int mr) { return mr >= 5 ? 2 : mr == 4 ? 3 : 4; }
#define LS_QG_MICRO_NR(MR, NR) do { switch (nr) { \
    case 1: ls_qg_micro_k(x, K, w, kc, out, N, first, MR, 1); break; \
    case 2: ls_qg_micro_k(x, K, w, kc, out, N, first, MR, 2); break; \
    case 3: ls_qg_micro_k(x, K, w, kc, out, N, first, MR, (NR) >= 3 ? 3 : 1); break; \
    default: ls_qg_micro_k(x, K, w, kc, out, N, first, MR, NR); break; } } while (0)
static void ls_qg_micro(const float *restrict x, int64_t K, const float *restrict w, int64_t kc,
                        float *restrict out, int64_t N, int first, int mr, int nr) {
    switch (mr) {
    case 1: LS_QG_MICRO_NR(1, 4); break;
    case 2: LS_QG_MICRO_NR(2, 4); break;
    case 3: LS_QG_MICRO_NR(3, 4); break;
    case 4: LS_QG_MICRO_NR(4, 3); break;
    case 5: LS_QG_MICRO_NR(5, 2); break;
    default: LS_QG_MICRO_NR(6, 2); break;
    }
}

/* out[m, j] (row stride N) for n weight rows at w (stride rb bytes) and M activation rows (stride K): a K chunk
 * of up to LS_QG_RMAX weight rows at a time decoded into a buffer (by decode, in L2), then the micro-kernels
 * over it (the values and order of the register-decoding kernel below, for any M) */
typedef void (*ls_qg_decode_fn)(const uint8_t *restrict w, int64_t rb, int64_t b0, int64_t nb, int64_t n,
                                float *restrict dst);
static void ls_qg_decoded(const uint8_t *restrict w, int64_t rb, const float *restrict x, int64_t M, int64_t K,
                          int64_t n, float *restrict out, int64_t N, ls_qg_decode_fn decode) {
    const int64_t nblk = K / 32, cb = ls_qg_chunk_blocks(nblk);
    float buf[LS_QG_RMAX * LS_QG_KCB * 32] __attribute__((aligned(64)));
    for (int64_t j0 = 0; j0 < n; j0 += LS_QG_RMAX) {
        const int64_t nj = ls_min(LS_QG_RMAX, n - j0);
        for (int64_t b0 = 0; b0 < nblk; b0 += cb) {
            const int64_t nb = ls_min(cb, nblk - b0), kc = 32 * nb;
            decode(w + j0 * rb, rb, b0, nb, nj, buf);
            for (int64_t m0 = 0; m0 < M; m0 += LS_QG_MR) {
                const int mr = (int)ls_min(LS_QG_MR, M - m0), nr = ls_qg_nr(mr);
                for (int64_t j = 0; j < nj; j += nr)
                    ls_qg_micro(x + m0 * K + 32 * b0, K, buf + j * kc, kc, out + m0 * N + j0 + j, N, b0 == 0,
                                mr, (int)ls_min(nr, nj - j));
            }
        }
    }
}

/* A few activation rows (MR <= 8, stride K) against NR weight rows (stride rb bytes) decoded in registers:
 * each weight block is decoded once and feeds MR x 4 FMAs (decode, batched decode). MR x NR accumulators,
 * at least 8 where the rows allow, so that the 4-cycle FMA latency does not bound the dependent chains. */
#define LS_QG_REGS(NAME, VALS, BB, SH, ST, PREP) \
static inline __attribute__((always_inline)) void NAME##_few_k(const uint8_t *restrict w, int64_t rb, \
        const float *restrict x, int64_t K, int64_t b0, int64_t b1, float *restrict out, int64_t N, const int MR, \
        const int NR) { \
    const __m256 z = _mm256_setzero_ps(); \
    __m256 acc[8][4]; \
    for (int r = 0; r < MR; r++) for (int j = 0; j < NR; j++) acc[r][j] = z; \
    ST st[4]; \
    for (int64_t b = b0; b < b1; b++) { \
        for (int j = 0; j < NR; j++) { \
            const uint8_t *blk = w + j * rb + (b >> (SH)) * (BB); \
            LS_QG_FEW_PF(w + j * rb + ((b * (BB)) >> (SH))); \
            if ((SH) && (b == b0 || (b & ((1 << (SH)) - 1)) == 0)) PREP(blk, &st[j]); \
            __m256 v[4]; VALS(blk, (int)(b & ((1 << (SH)) - 1)), &st[j], v); \
            for (int r = 0; r < MR; r++) { \
                const float *xb = x + r * K + 32 * b; \
                acc[r][j] = _mm256_fmadd_ps(v[0], _mm256_loadu_ps(xb), acc[r][j]); \
                acc[r][j] = _mm256_fmadd_ps(v[1], _mm256_loadu_ps(xb + 8), acc[r][j]); \
                acc[r][j] = _mm256_fmadd_ps(v[2], _mm256_loadu_ps(xb + 16), acc[r][j]); \
                acc[r][j] = _mm256_fmadd_ps(v[3], _mm256_loadu_ps(xb + 24), acc[r][j]); \
            } \
        } \
    } \
    for (int r = 0; r < MR; r++) \
        ls_qg_store4(out + r * N, ls_qg_sum4(acc[r][0], NR > 1 ? acc[r][1] : z, NR > 2 ? acc[r][2] : z, \
                                             NR > 3 ? acc[r][3] : z), NR, b0 == 0); \
} \
/* n weight rows, NR at a time (then the remainder); rows whose x exceeds L1 go K chunk by K chunk over all
 * n weight rows (that chunk of x stays in L1), others stream each weight row group once from start to end */ \
static inline __attribute__((always_inline)) void NAME##_few_rows(const uint8_t *restrict w, int64_t rb, \
        const float *restrict x, int64_t K, int64_t b0, int64_t b1, int64_t n, float *restrict out, int64_t N, \
        const int MR, const int NR) { \
    int64_t j = 0; \
    for (; j + NR <= n; j += NR) NAME##_few_k(w + j * rb, rb, x, K, b0, b1, out + j, N, MR, NR); \
    switch (n - j) { \
    case 1: NAME##_few_k(w + j * rb, rb, x, K, b0, b1, out + j, N, MR, 1); break; \
    case 2: if (NR > 2) NAME##_few_k(w + j * rb, rb, x, K, b0, b1, out + j, N, MR, 2); break; \
    case 3: if (NR > 3) NAME##_few_k(w + j * rb, rb, x, K, b0, b1, out + j, N, MR, 3); break; \
    default: break; } \
} \
static inline __attribute__((always_inline)) void NAME##_few_n(const uint8_t *restrict w, int64_t rb, \
        const float *restrict x, int64_t K, int64_t nblk, int64_t n, float *restrict out, int64_t N, const int MR, \
        const int NR) { \
    const int64_t cb = ls_qg_chunk_blocks(nblk); \
    if (MR * K * 4 > LS_QG_X_L1) { \
        for (int64_t b0 = 0; b0 < nblk; b0 += cb) \
            NAME##_few_rows(w, rb, x, K, b0, ls_min(nblk, b0 + cb), n, out, N, MR, NR); \
        return; \
    } \
    for (int64_t j = 0; j < n; j += NR) { \
        const int64_t nj = ls_min(NR, n - j); \
        for (int64_t b0 = 0; b0 < nblk; b0 += cb) \
            NAME##_few_rows(w + j * rb, rb, x, K, b0, ls_min(nblk, b0 + cb), nj, out + j, N, MR, NR); \
    } \
} \
static void NAME##_few(const uint8_t *restrict w, int64_t rb, const float *restrict x, int64_t M, int64_t K, \
                       int64_t nblk, int64_t n, float *restrict out, int64_t N) { \
    switch (M) { \
    case 1: NAME##_few_n(w, rb, x, K, nblk, n, out, N, 1, 4); break; \
    case 2: NAME##_few_n(w, rb, x, K, nblk, n, out, N, 2, 4); break; \
    case 3: NAME##_few_n(w, rb, x, K, nblk, n, out, N, 3, 3); break; \
    case 4: NAME##_few_n(w, rb, x, K, nblk, n, out, N, 4, 2); break; \
    case 5: NAME##_few_n(w, rb, x, K, nblk, n, out, N, 5, 2); break; \
    case 6: NAME##_few_n(w, rb, x, K, nblk, n, out, N, 6, 1); break; \
    case 7: NAME##_few_n(w, rb, x, K, nblk, n, out, N, 7, 1); break; \
    default: NAME##_few_n(w, rb, x, K, nblk, n, out, N, 8, 1); break; } \
}
#define LS_QG_KERNELS(NAME, VALS, BB, SH, ST, PREP) \
LS_QG_REGS(NAME, VALS, BB, SH, ST, PREP) \
/* a chunk of nb blocks (from block b0) of n weight rows into dst (row stride 32 * nb floats) */ \
static void NAME##_decode(const uint8_t *restrict w, int64_t rb, int64_t b0, int64_t nb, int64_t n, \
                                 float *restrict dst) { \
    ST st; \
    for (int64_t j = 0; j < n; j++) \
        for (int64_t b = 0; b < nb; b++) { \
            const int64_t bb = b0 + b; \
            const uint8_t *blk = w + j * rb + (bb >> (SH)) * (BB); \
            LS_PF(w + j * rb + ((bb * (BB)) >> (SH)) + LS_QMM_PREFETCH, 0, 3); \
            if ((SH) && (b == 0 || (bb & ((1 << (SH)) - 1)) == 0)) PREP(blk, &st); \
            __m256 v[4]; VALS(blk, (int)(bb & ((1 << (SH)) - 1)), &st, v); \
            for (int i = 0; i < 4; i++) _mm256_storeu_ps(dst + j * 32 * nb + 32 * b + 8 * i, v[i]); \
        } \
} \
/* out[m, j] (row stride N) for n weight rows at w (stride rb bytes) and M activation rows (stride K) */ \
static void NAME(const uint8_t *restrict w, int64_t rb, const float *restrict x, int64_t M, int64_t K, \
                 int64_t n, float *restrict out, int64_t N) { \
    if (M <= LS_QG_FEW) { NAME##_few(w, rb, x, M, K, K / 32, n, out, N); return; } \
    ls_qg_decoded(w, rb, x, M, K, n, out, N, NAME##_decode); \
}
#if !defined(__AVX512F__)  /* (AVX-512 CPUs have their own kernels of these three: qdecode.h) */
LS_QG_KERNELS(ls_qgemm_q8_0, LS_QG_VALS_Q8_0, 34, 0, ls_qg_st_none, LS_QG_PREP_NONE)
LS_QG_KERNELS(ls_qgemm_q4_0, LS_QG_VALS_Q4_0, 18, 0, ls_qg_st_none, LS_QG_PREP_NONE)
LS_QG_KERNELS(ls_qgemm_q4_1, LS_QG_VALS_Q4_1, 20, 0, ls_qg_st_none, LS_QG_PREP_NONE)
#endif
LS_QG_KERNELS(ls_qgemm_q5_0, LS_QG_VALS_Q5_0, 22, 0, ls_qg_st_none, LS_QG_PREP_NONE)
LS_QG_KERNELS(ls_qgemm_q4_k, LS_QG_VALS_Q4_K, 144, 3, ls_qg_st_q4_k, ls_qg_prep_q4_k)
LS_QG_KERNELS(ls_qgemm_q6_k, LS_QG_VALS_Q6_K, 210, 3, ls_qg_st_q6_k, ls_qg_prep_q6_k)
#endif

/* Portable form: the same structure and values without vector intrinsics (what CPUs without AVX2 run). */
#define LS_QG_PORTABLE(NAME, DQ, BB, SH) \
static void NAME(const uint8_t *restrict w, int64_t rb, const float *restrict x, int64_t M, int64_t K, \
                 int64_t n, float *restrict out, int64_t N) { \
    const int64_t nblk = K / 32, cb = ls_qg_chunk_blocks(nblk); \
    float buf[LS_QG_KCB * 32]; \
    for (int64_t j = 0; j < n; j++) \
        for (int64_t b0 = 0; b0 < nblk; b0 += cb) { \
            const int64_t nb = ls_min(cb, nblk - b0), kc = 32 * nb; \
            for (int64_t b = b0; b < b0 + nb; b++) \
                DQ(w + j * rb + (b >> (SH)) * (BB), (int)(b & ((1 << (SH)) - 1)), buf + 32 * (b - b0)); \
            for (int64_t m = 0; m < M; m++) { \
                const float s = ls_qg_chunk_dot(buf, x + m * K + 32 * b0, kc); \
                ls_qg_store(out + m * N + j, &s, 1, b0 == 0); \
            } \
        } \
}
LS_QG_PORTABLE(ls_qgemm_portable_q8_0, ls_qg_dq_q8_0, 34, 0)
LS_QG_PORTABLE(ls_qgemm_portable_q4_0, ls_qg_dq_q4_0, 18, 0)
LS_QG_PORTABLE(ls_qgemm_portable_q4_1, ls_qg_dq_q4_1, 20, 0)
LS_QG_PORTABLE(ls_qgemm_portable_q5_0, ls_qg_dq_q5_0, 22, 0)
LS_QG_PORTABLE(ls_qgemm_portable_q4_k, ls_qg_dq_q4_k, 144, 3)
LS_QG_PORTABLE(ls_qgemm_portable_q6_k, ls_qg_dq_q6_k, 210, 3)
