/* AVX-512 VNNI kernels for int16 activations (q8_0, q4_0, q4_1, q5_0, q4_k weights): 16 weight rows at once, one
 * in each 32-bit lane of a zmm, the activations broadcast. ls_quantize_rows16 (qdecode.h) stores each int16 value q of
 * these builds as two signed bytes a, b with q = 256 * a + b: per activation row and block the 16 rows' exact
 * integer dot products are sum(w * a) * 256 + sum(w * b), sixteen vpdpbusd for 16 weight rows (the int16 kernels
 * of qdecode.h spend a madd, a conversion and an FMA per weight row and block), then one conversion and one FMA
 * with the 16 rows' weight scales times the activation scale, and one FMA for the offset term (q8_0: weights
 * offset by 128 to make them unsigned, -128 * d * s; q4_0: -8 * d * s; q4_1: the min, m * s; q5_0: the nibble
 * with its high bit as bit 4 of the byte, -16 * d * s; q4_k: each block of 32 of a super-block of 256 with its
 * own scale d * sc and offset -dmin * m, decoded for the 16 rows once per super-block).
 *
 * The weights are read in their GGUF layout: per block, the 16 rows' quant bytes are loaded and transposed at
 * dword granularity, so that vector R[j] holds in lane n bytes 4j..4j+3 of row n (q4: the low nibbles are
 * elements 4j..4j+3 and the high ones 16+4j.., q8_0: elements 4j..4j+3), matching the broadcast dword j of
 * the activation bytes (element order). The weight scales (and q4_1's mins) of the 16 rows come from one
 * gather per block. Each lane's arithmetic is that of its own row only, in the same order whatever the other
 * lanes, the number of rows of the call or the activation row count: a row has the same bits alone, in any
 * batch and in any work item. A last group of fewer than 16 rows masks the loads of the missing rows (they read
 * nothing) and the stores. -DLS_NO_QDOT16X16 (or LS_PORTABLE) keeps qdecode.h's int16 kernels; q8_0's kernel
 * stays per row with -DLS_NO_QDOT16X16_Q8_0 (qdecode.h says why it is on by default).
 *
 * Per block the 16 rows' bytes are read at 16 places 16 * BB bytes apart in one stretch of 16 * rb bytes, which
 * the hardware prefetchers follow poorly from memory (without software prefetch one activation row of q8_0 took
 * 1.33x the time); each block prefetches the next 16 * BB bytes of the stretch LS_Q16X16_PF groups ahead into L1
 * (prefetcht0) and those one group further into L2 (prefetcht1). One row of q8_0, best of 10 interleaved runs:
 * 0.94x the time of the sweep into L2 alone, which took 0.87x of the sweep into L1 alone; q4_1: 0.99x. */
#if defined(__AVX512F__) && !defined(LS_PORTABLE)
/* the in-lane 4x4 transpose of dwords: z[k] holds in its 128-bit lane L four dwords of row 4L + k; afterwards
 * r[j] holds in dword lane 4L + k dword j of that row (also the first half of qamx.h's 16x16 transpose) */
static inline __attribute__((always_inline)) void ls_t4x4(const __m512i *z, __m512i *r) {
    const __m512i t0 = _mm512_unpacklo_epi32(z[0], z[1]), t1 = _mm512_unpackhi_epi32(z[0], z[1]);
    const __m512i t2 = _mm512_unpacklo_epi32(z[2], z[3]), t3 = _mm512_unpackhi_epi32(z[2], z[3]);
    r[0] = _mm512_unpacklo_epi64(t0, t2); r[1] = _mm512_unpackhi_epi64(t0, t2);
    r[2] = _mm512_unpacklo_epi64(t1, t3); r[3] = _mm512_unpackhi_epi64(t1, t3);
}
#endif

#if defined(LS_HAVE_QDOT16X16)
#ifndef LS_Q16X16_PF
#define LS_Q16X16_PF 1
#endif
/* gcc folds no broadcast into vpdpbusd: each activation dword cost a vpbroadcastd of its own next to its
 * vpdpbusd, and one row's two chains of eight were latency-bound. With gcc (not clang, whose asm templates
 * differ) the dwords are the instructions' {1to16} memory operands and the chains are four: eight activation
 * rows of q4_1 took 0.94x the time, q8_0 0.93x (benchmarks/qmatmul.py --ab, one and two threads); one or two
 * rows as before. The integer sums are exact, so the bits are those of the plain form, which
 * -DLS_NO_Q16_EMBCAST keeps (tests compare the two). */
#if defined(__GNUC__) && !defined(__clang__) && !defined(LS_NO_Q16_EMBCAST)
#define LS_Q16_EMBCAST 1
#define LS_DPBUSD_BCST(acc, w, x32) __asm__("vpdpbusd %2%{1to16%}, %1, %0" : "+v"(acc) : "v"(w), "m"(*(x32)))
#endif

/* 16 bytes at p (TAIL: nothing when the row is missing, bit i of live clear) */
#define LS_L128(p, i) (TAIL ? _mm_maskz_loadu_epi32((__mmask8)(((live) >> (i) & 1) ? 0xf : 0), (const void *)(p)) \
                            : _mm_loadu_si128((const __m128i *)(p)))
#define LS_L256(p, i) (TAIL ? _mm256_maskz_loadu_epi32((__mmask8)(((live) >> (i) & 1) ? 0xff : 0), (const void *)(p)) \
                            : _mm256_loadu_si256((const __m256i *)(p)))

/* q4: the 16 quant bytes at offset QO of block p of rows 0..15 (stride rb) into w[0..7]: w[j] the low nibbles
 * of bytes 4j..4j+3 (elements 4j..), w[4 + j] the high ones (elements 16 + 4j..) */
static inline __attribute__((always_inline)) void ls_w16x16_q4(const uint8_t *p, int64_t rb, int QO, int TAIL,
                                                                unsigned live, __m512i *w) {
    __m512i z[4], r[4];
    for (int k = 0; k < 4; k++) {
        const uint8_t *q = p + QO + k * rb;
        __m512i v = _mm512_castsi128_si512(LS_L128(q, k));
        v = _mm512_inserti32x4(v, LS_L128(q + 4 * rb, k + 4), 1);
        v = _mm512_inserti32x4(v, LS_L128(q + 8 * rb, k + 8), 2);
        z[k] = _mm512_inserti32x4(v, LS_L128(q + 12 * rb, k + 12), 3);
    }
    ls_t4x4(z, r);
    const __m512i m15 = _mm512_set1_epi8(15);
    for (int j = 0; j < 4; j++) {
        w[j] = _mm512_and_si512(r[j], m15);
        w[4 + j] = _mm512_and_si512(_mm512_srli_epi16(r[j], 4), m15);
    }
}

/* q5_0: the high bits (qh, lane n: row n's 32 bits, bit e for element e) onto the nibbles of w[0..7] as bit 4 of
 * each byte: byte t of w[j] (element 4j + t) takes bit 4j + t, of w[4 + j] (element 16 + 4j + t) bit 16 + 4j + t.
 * Four bits x go to bit 0 of four bytes by one multiply: x * 0x00204081 puts bit t at 8t and every other product
 * at a position that is no multiple of 8 (7k + t, t != k), without carries. */
static inline __attribute__((always_inline)) void ls_q5_high_gguf(__m512i qh, __m512i *w) {
    const __m512i spread = _mm512_set1_epi32(0x00204081), ones = _mm512_set1_epi32(0x01010101);
    const __m512i m4 = _mm512_set1_epi32(15);
    for (int j = 0; j < 8; j++) {
        const int at = j < 4 ? 4 * j : 16 + 4 * (j - 4);
        const __m512i x = _mm512_and_si512(_mm512_srli_epi32(qh, at), m4);
        const __m512i bits = _mm512_and_si512(_mm512_mullo_epi32(x, spread), ones);
        w[j] = _mm512_or_si512(w[j], _mm512_slli_epi32(bits, 4));
    }
}

/* the 32 bytes at q of rows 0..15 (stride rb) into w[0..7], w[j] holding bytes 4j..4j+3 of row n in dword lane n:
 * each zmm holds two rows' 32 bytes, the in-lane transposes give rows 0..7 and 8..15 with both halves, and one
 * 128-bit shuffle each puts the halves' lanes together */
static inline __attribute__((always_inline)) void ls_w16x16_bytes32(const uint8_t *q0, int64_t rb, int TAIL,
                                                                     unsigned live, __m512i *w) {
    __m512i y[8], t[4], u[4];
    for (int k = 0; k < 4; k++) {
        const uint8_t *q = q0 + k * rb;
        y[k] = _mm512_inserti64x4(_mm512_castsi256_si512(LS_L256(q, k)), LS_L256(q + 4 * rb, k + 4), 1);
        y[4 + k] = _mm512_inserti64x4(_mm512_castsi256_si512(LS_L256(q + 8 * rb, k + 8)),
                                      LS_L256(q + 12 * rb, k + 12), 1);
    }
    ls_t4x4(y, t);
    ls_t4x4(y + 4, u);
    for (int j = 0; j < 4; j++) {
        w[j] = _mm512_shuffle_i32x4(t[j], u[j], _MM_SHUFFLE(2, 0, 2, 0));
        w[4 + j] = _mm512_shuffle_i32x4(t[j], u[j], _MM_SHUFFLE(3, 1, 3, 1));
    }
}

/* q8_0: the 32 quant bytes of block p of rows 0..15, plus 128 (unsigned), into w[0..7] (w[j]: elements 4j..) */
static inline __attribute__((always_inline)) void ls_w16x16_q8_0(const uint8_t *p, int64_t rb, int TAIL,
                                                                  unsigned live, __m512i *w) {
    ls_w16x16_bytes32(p + 2, rb, TAIL, live, w);
    const __m512i x80 = _mm512_set1_epi8((char)0x80);
    for (int j = 0; j < 8; j++) w[j] = _mm512_xor_si512(w[j], x80);
}

/* block b of 16 weight rows (wv: their bytes as ls_w16x16_* gives them, dw: the weight scales, cw: the offset
 * term's factors) against MR activation rows, added to acc[0..MR-1]: the arithmetic both layouts share, so a row
 * has the same bits whichever layout its weights are read from */
static inline __attribute__((always_inline)) void ls_q16_block_rows(const __m512i *wv, __m512 dw, __m512 cw,
        const int8_t *restrict xq, const float *restrict xd, const float *restrict xs, int64_t K, int64_t nblk,
        int64_t b, __m512 *acc, const int MR) {
    _Pragma("GCC unroll 8")
    for (int r = 0; r < MR; r++) {
        const int32_t *xa = (const int32_t *)(xq + r * 2 * K + 64 * b);
        __m512i ia = _mm512_setzero_si512(), ib = _mm512_setzero_si512();
#if defined(LS_Q16_EMBCAST)
        /* four chains of four, the activation dwords as embedded broadcasts (see LS_Q16_EMBCAST) */
        __m512i ia2 = _mm512_setzero_si512(), ib2 = _mm512_setzero_si512();
        _Pragma("GCC unroll 4")
        for (int j = 0; j < 4; j++) {
            LS_DPBUSD_BCST(ia, wv[j], xa + j);
            LS_DPBUSD_BCST(ib, wv[j], xa + 8 + j);
            LS_DPBUSD_BCST(ia2, wv[4 + j], xa + 4 + j);
            LS_DPBUSD_BCST(ib2, wv[4 + j], xa + 12 + j);
        }
        ia = _mm512_add_epi32(ia, ia2);  /* exact: the integer sums do not depend on the order */
        ib = _mm512_add_epi32(ib, ib2);
#else
        _Pragma("GCC unroll 8")
        for (int j = 0; j < 8; j++) {
            ia = _mm512_dpbusd_epi32(ia, wv[j], _mm512_set1_epi32(xa[j]));
            ib = _mm512_dpbusd_epi32(ib, wv[j], _mm512_set1_epi32(xa[8 + j]));
        }
#endif
        const __m512i dot = _mm512_add_epi32(_mm512_slli_epi32(ia, 8), ib);
        acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), _mm512_mul_ps(dw, _mm512_set1_ps(xd[r * nblk + b])),
                                 acc[r]);
        acc[r] = _mm512_fmadd_ps(cw, _mm512_set1_ps(xs[r * nblk + b]), acc[r]);
    }
}

/* q4_k: the 16 rows' super-block headers (h[k], lane n: dword k of row n's block: d | dmin << 16, then the 12
 * bytes of 6-bit scales and mins as qgemm.h's ls_qg_q4_k_sm reads them) as each block of 32's scale d * sc and
 * offset factor -(dmin * m), the products ls_qg_prep_q4_k makes (the sign is exact either way) */
static inline __attribute__((always_inline)) void ls_q4k16_scales(const __m512i *h, __m512 *ds, __m512 *dm) {
    const __m512 d = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(h[0]));
    const __m512 dmin = _mm512_castsi512_ps(_mm512_xor_si512(  /* -dmin: its sign bit flipped */
        _mm512_castps_si512(_mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(h[0], 16)))),
        _mm512_set1_epi32((int)0x80000000u)));
    const __m512i m63 = _mm512_set1_epi32(63), m15 = _mm512_set1_epi32(15), m48 = _mm512_set1_epi32(48);
    for (int i = 0; i < 4; i++) {
        const __m512i a = _mm512_srli_epi32(h[1], 8 * i), b = _mm512_srli_epi32(h[2], 8 * i);
        const __m512i c = _mm512_srli_epi32(h[3], 8 * i);
        const __m512i s_lo = _mm512_and_si512(a, m63), m_lo = _mm512_and_si512(b, m63);
        const __m512i s_hi = _mm512_or_si512(_mm512_and_si512(c, m15),
                                             _mm512_and_si512(_mm512_srli_epi32(a, 2), m48));
        const __m512i m_hi = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi32(c, 4), m15),
                                             _mm512_and_si512(_mm512_srli_epi32(b, 2), m48));
        ds[i] = _mm512_mul_ps(d, _mm512_cvtepi32_ps(s_lo));
        dm[i] = _mm512_mul_ps(dmin, _mm512_cvtepi32_ps(m_lo));
        ds[4 + i] = _mm512_mul_ps(d, _mm512_cvtepi32_ps(s_hi));
        dm[4 + i] = _mm512_mul_ps(dmin, _mm512_cvtepi32_ps(m_hi));
    }
}

/* q4_k (super-blocks of 144 bytes: the header, then per pair of blocks 2c, 2c + 1 the 32 bytes of their low and
 * high nibbles), the weight rows w + i * rb, i < 16 (i < nv when TAIL), against MR activation rows: in the GGUF
 * layout (REP 0: the headers gathered, the nibble bytes loaded and transposed) or repacked (REP 1: ls_repack16's
 * layout, every dword already in its lane). Each block of 32 is one ls_q16_block_rows with its own scale. */
static inline __attribute__((always_inline)) void ls_q4k16_group(const uint8_t *restrict w, int64_t rb, int nv,
        const int8_t *restrict xq, const float *restrict xd, const float *restrict xs, int64_t K, int64_t nblk,
        float *restrict out, int64_t ostride, const int REP, const int TAIL, const int MR) {
    const unsigned live = TAIL ? (1u << nv) - 1u : 0xffffu;
    const __mmask16 km = (__mmask16)live;
    const __m512i offs = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                            _mm512_set1_epi32((int)rb));
    const __m512i m15 = _mm512_set1_epi8(15);
    __m512 acc[LS_QMM_ROWS];
    for (int r = 0; r < MR; r++) acc[r] = _mm512_setzero_ps();
    const uint8_t *pf = w + LS_Q16X16_PF * 16 * rb;  /* as the other formats: the next groups' stretch */
    for (int64_t sb = 0; sb < nblk / 8; sb++, pf += 16 * 144) {
        const uint8_t *p = REP ? w + sb * 16 * 144 : w + sb * 144;
        if (LS_Q16X16_PF > 0)
            for (int o = 0; o < 16 * 144; o += 64) {
                LS_PF(pf + o, 0, 3);
                LS_PF(pf + 16 * rb + o, 0, 2);
            }
        __m512i h[4];
        for (int k = 0; k < 4; k++)
            h[k] = REP ? _mm512_loadu_si512((const void *)(p + 64 * k))
                       : _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), km, offs, p + 4 * k, 1);
        __m512 ds[8], dm[8];
        ls_q4k16_scales(h, ds, dm);
        for (int c = 0; c < 4; c++) {
            __m512i v[8], lo[8], hi[8];
            if (REP)
                for (int j = 0; j < 8; j++) v[j] = _mm512_loadu_si512((const void *)(p + 256 + 512 * c + 64 * j));
            else
                ls_w16x16_bytes32(p + 16 + 32 * c, rb, TAIL, live, v);
            for (int j = 0; j < 8; j++) {
                lo[j] = _mm512_and_si512(v[j], m15);
                hi[j] = _mm512_and_si512(_mm512_srli_epi16(v[j], 4), m15);
            }
            ls_q16_block_rows(lo, ds[2 * c], dm[2 * c], xq, xd, xs, K, nblk, 8 * sb + 2 * c, acc, MR);
            ls_q16_block_rows(hi, ds[2 * c + 1], dm[2 * c + 1], xq, xd, xs, K, nblk, 8 * sb + 2 * c + 1, acc, MR);
        }
    }
    for (int r = 0; r < MR; r++) _mm512_mask_storeu_ps(out + r * ostride, km, acc[r]);
}
/* the weight rows w + i * rb, i < 16 (i < nv when TAIL), against MR activation rows (split bytes at xq, row
 * stride 2K bytes; scales xd, sums xs, row stride nblk) into out[r * ostride + i]. QT: 0 q8_0, 1 q4_0, 2 q4_1,
 * 3 q5_0, 4 q4_k (ls_q4k16_group) */
static inline __attribute__((always_inline)) void ls_qdot16x16_group(const uint8_t *restrict w, int64_t rb,
        int nv, const int8_t *restrict xq, const float *restrict xd, const float *restrict xs, int64_t K,
        int64_t nblk, float *restrict out, int64_t ostride, const int QT, const int BB, const int TAIL,
        const int MR) {
    if (QT == 4) {  /* super-blocks of their own */
        ls_q4k16_group(w, rb, nv, xq, xd, xs, K, nblk, out, ostride, 0, TAIL, MR);
        return;
    }
    const unsigned live = TAIL ? (1u << nv) - 1u : 0xffffu;
    const __mmask16 km = (__mmask16)live;
    const __m512i offs = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                            _mm512_set1_epi32((int)rb));
    __m512 acc[LS_QMM_ROWS];
    for (int r = 0; r < MR; r++) acc[r] = _mm512_setzero_ps();
    /* the prefetch sweeps through the stretches of the groups LS_Q16X16_PF and LS_Q16X16_PF + 1 ahead */
    const uint8_t *pf = w + LS_Q16X16_PF * 16 * rb;
    for (int64_t b = 0; b < nblk; b++, pf += 16 * BB) {
        const uint8_t *p = w + b * BB;
        if (LS_Q16X16_PF > 0)
            for (int o = 0; o < 16 * BB; o += 64) {
                LS_PF(pf + o, 0, 3);
                LS_PF(pf + 16 * rb + o, 0, 2);
            }
        __m512i wv[8];
        if (QT == 0) ls_w16x16_q8_0(p, rb, TAIL, live, wv);
        else ls_w16x16_q4(p, rb, QT == 1 ? 2 : QT == 2 ? 4 : 6, TAIL, live, wv);
        if (QT == 3) ls_q5_high_gguf(_mm512_mask_i32gather_epi32(_mm512_setzero_si512(), km, offs, p + 2, 1), wv);
        const __m512i head = _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), km, offs, p, 1);
        const __m512 dw = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(head));
        /* the offset term's factor per row: -128 d, -8 d, -16 d or the min m */
        const __m512 cw = QT == 2 ? _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(head, 16)))
                                  : _mm512_mul_ps(dw, _mm512_set1_ps(QT == 0 ? -128.0f : QT == 3 ? -16.0f : -8.0f));
        ls_q16_block_rows(wv, dw, cw, xq, xd, xs, K, nblk, b, acc, MR);
    }
    for (int r = 0; r < MR; r++) _mm512_mask_storeu_ps(out + r * ostride, km, acc[r]);
}
#undef LS_L128
#undef LS_L256

static inline __attribute__((always_inline)) void ls_qdot16x16_rows(const uint8_t *restrict w, int64_t rb,
        int64_t n, const int8_t *restrict xq, const float *restrict xd, const float *restrict xs, int64_t K,
        int64_t nblk, float *restrict out, int64_t ostride, const int QT, const int BB, const int MR) {
    int64_t i = 0;
    for (; i + 16 <= n; i += 16)
        ls_qdot16x16_group(w + i * rb, rb, 16, xq, xd, xs, K, nblk, out + i, ostride, QT, BB, 0, MR);
    if (i < n)
        ls_qdot16x16_group(w + i * rb, rb, (int)(n - i), xq, xd, xs, K, nblk, out + i, ostride, QT, BB, 1, MR);
}

/* all n weight rows at w (stride rb) against mr activation rows; returns how many it did: n, or none when the
 * activations were left float (LS_FLOAT_ROWS: the per-row kernels run the float kernel then) */
#define LS_QDOT16X16(NAME, QT, BB) \
static inline int64_t NAME(const uint8_t *restrict w, int64_t rb, int64_t n, const int16_t *restrict xq, \
                           const float *restrict xd, const float *restrict xs, int64_t K, int64_t nblk, int64_t mr, \
                           float *restrict out, int64_t ostride) { \
    if (xd[0] == LS_FLOAT_ROWS) return 0; \
    const int8_t *xb = (const int8_t *)xq; \
    LS_QMM_DISPATCH(ls_qdot16x16_rows, w, rb, n, xb, xd, xs, K, nblk, out, ostride, QT, BB); \
    return n; \
}
#if defined(LS_HAVE_QDOT16X16_q8_0)
LS_QDOT16X16(ls_qdot16x16_q8_0, 0, 34)
#endif
LS_QDOT16X16(ls_qdot16x16_q4_0, 1, 18)
LS_QDOT16X16(ls_qdot16x16_q4_1, 2, 20)
LS_QDOT16X16(ls_qdot16x16_q5_0, 3, 22)
LS_QDOT16X16(ls_qdot16x16_q4_k, 4, 144)

/* ---- Repacked weights (LS_REPACK16_<format>): each whole group of 16 weight rows stored in the order these
 * kernels consume it, so a block is a few aligned loads instead of 16 strided loads, in-lane transposes and a
 * gather of the scales. Reading the GGUF layout, one activation row of q8_0 took ~53 cycles per block of 16 rows
 * from L2 (compute-bound at ~24 GB/s on 2 threads of a Zen 4, about its stream from memory), the repacked layout
 * ~3x less, which leaves decode bound by memory. The arithmetic is ls_q16_block_rows on the same vectors, so a
 * row has the same bits in either layout. A group of 16 rows keeps its 16 * rb bytes (see ls_repack16); the rows
 * after the last whole group stay in the GGUF layout and take the masked kernel above, so callers must start
 * every call at a multiple of 16 rows of the matrix (the renderer's work items are). */
static inline __attribute__((always_inline)) void ls_qdot16x16r_group(const uint8_t *restrict g, int64_t nblk,
        const int8_t *restrict xq, const float *restrict xd, const float *restrict xs, int64_t K,
        float *restrict out, int64_t ostride, const int QT, const int BB, const int MR) {
    if (QT == 4) {  /* super-blocks of their own (16 rows of rb = nblk / 8 * 144 bytes) */
        ls_q4k16_group(g, nblk / 8 * 144, 16, xq, xd, xs, K, nblk, out, ostride, 1, 0, MR);
        return;
    }
    const int QB = QT == 0 ? 512 : QT == 3 ? 320 : 256;  /* quant bytes of a block of 16 rows (q5_0: 64 high) */
    const uint16_t *sd = (const uint16_t *)g;  /* [nblk][16] float16 scales (q4_1: then [nblk][16] mins) */
    const uint8_t *qs = g + nblk * (QT == 2 ? 64 : 32);
    __m512 acc[LS_QMM_ROWS];
    for (int r = 0; r < MR; r++) acc[r] = _mm512_setzero_ps();
    /* as the GGUF layout's kernel: each block prefetches its share (16 * BB bytes) of the group LS_Q16X16_PF
     * ahead into L1 and of the one after into L2 (a work item's stream is short: the hardware prefetchers
     * alone ramp up too late; one decode row took 1.14x the time without, a prefetch 1 KiB down the stream
     * instead was slower too) */
    const uint8_t *pf = g + LS_Q16X16_PF * 16 * nblk * BB;
    for (int64_t b = 0; b < nblk; b++, pf += 16 * BB) {
        const uint8_t *p = qs + b * QB;
        if (LS_Q16X16_PF > 0)
            for (int o = 0; o < 16 * BB; o += 64) {
                LS_PF(pf + o, 0, 3);
                LS_PF(pf + 16 * nblk * BB + o, 0, 2);
            }
        __m512i wv[8];
        if (QT == 0) {
            for (int j = 0; j < 8; j++) wv[j] = _mm512_loadu_si512((const void *)(p + 64 * j));
        } else {
            const __m512i m15 = _mm512_set1_epi8(15);
            const uint8_t *nib = QT == 3 ? p + 64 : p;
            for (int j = 0; j < 4; j++) {
                const __m512i v = _mm512_loadu_si512((const void *)(nib + 64 * j));
                wv[j] = _mm512_and_si512(v, m15);
                wv[4 + j] = _mm512_and_si512(_mm512_srli_epi16(v, 4), m15);
            }
            if (QT == 3) {  /* the high bits, stored so that one shift puts each vector's at bit 4 of its bytes */
                const __m512i h = _mm512_loadu_si512((const void *)p), b4 = _mm512_set1_epi8(16);
                for (int j = 0; j < 4; j++) {  /* a | (b & c) */
                    wv[j] = _mm512_ternarylogic_epi32(wv[j], _mm512_srli_epi32(h, j), b4, 0xF8);
                    wv[4 + j] = _mm512_ternarylogic_epi32(wv[4 + j], _mm512_slli_epi32(h, 4 - j), b4, 0xF8);
                }
            }
        }
        const __m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(sd + 16 * b)));
        const __m512 cw = QT == 2 ? _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(sd + 16 * (nblk + b))))
                                  : _mm512_mul_ps(dw, _mm512_set1_ps(QT == 0 ? -128.0f : QT == 3 ? -16.0f : -8.0f));
        ls_q16_block_rows(wv, dw, cw, xq, xd, xs, K, nblk, b, acc, MR);
    }
    for (int r = 0; r < MR; r++) _mm512_storeu_ps(out + r * ostride, acc[r]);
}

static inline __attribute__((always_inline)) void ls_qdot16x16r_rows(const uint8_t *restrict w, int64_t rb,
        int64_t n, const int8_t *restrict xq, const float *restrict xd, const float *restrict xs, int64_t K,
        int64_t nblk, float *restrict out, int64_t ostride, const int QT, const int BB, const int MR) {
    int64_t i = 0;
    for (; i + 16 <= n; i += 16)
        ls_qdot16x16r_group(w + i * rb, nblk, xq, xd, xs, K, out + i, ostride, QT, BB, MR);
    if (i < n)  /* the rows after the last whole group of the matrix: the GGUF layout */
        ls_qdot16x16_group(w + i * rb, rb, (int)(n - i), xq, xd, xs, K, nblk, out + i, ostride, QT, BB, 1, MR);
}

#define LS_QDOT16X16R(NAME, QT, BB) \
static inline int64_t NAME(const uint8_t *restrict w, int64_t rb, int64_t n, const int16_t *restrict xq, \
                           const float *restrict xd, const float *restrict xs, int64_t K, int64_t nblk, int64_t mr, \
                           float *restrict out, int64_t ostride) { \
    const int8_t *xb = (const int8_t *)xq; \
    LS_QMM_DISPATCH(ls_qdot16x16r_rows, w, rb, n, xb, xd, xs, K, nblk, out, ostride, QT, BB); \
    return n; \
}
/* Repacked weights only where nothing else reads them in the GGUF layout: the 16-row kernels take every row
 * count (no float rows, no AMX tiles: both come with LS_QUANT_ROWS_MAX) */
#if !defined(LS_QUANT_ROWS_MAX) && !defined(LS_NO_REPACK16)
#if defined(LS_HAVE_QDOT16X16_q8_0)
#define LS_REPACK16_q8_0 1
LS_QDOT16X16R(ls_qdot16x16r_q8_0, 0, 34)
#endif
#define LS_REPACK16_q4_0 1
#define LS_REPACK16_q4_1 1
#define LS_REPACK16_q5_0 1
#define LS_REPACK16_q4_k 1
LS_QDOT16X16R(ls_qdot16x16r_q4_0, 1, 18)
LS_QDOT16X16R(ls_qdot16x16r_q4_1, 2, 20)
LS_QDOT16X16R(ls_qdot16x16r_q5_0, 3, 22)
LS_QDOT16X16R(ls_qdot16x16r_q4_k, 4, 144)
#endif
#endif
