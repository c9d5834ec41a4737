/* ---- AMX tiles for prefill (Intel CPUs with AMX-BF16: Sapphire Rapids and later).
 * Under activations "auto" (LS_QUANT_ROWS_MAX defined) a call of more rows than that (prefill) takes float
 * activations (qdecode.h). Here its first M & ~15 rows run on the tile unit instead: the launcher converts
 * those rows to bfloat16 (round to nearest even) in place of their int16 scratch (ls_qamx_prepare; the
 * scratch holds K int16 per row, the same bytes as K bfloat16), and each work item decodes its weight rows 16
 * at a time to bfloat16 (scale and minimum applied in float, then rounded), transposed into the tile layout
 * TDPBF16PS reads (16 rows of 16 pairs), and multiplies every group of 16 activation rows by them with
 * float32 accumulation over the whole of K. The rows past the last multiple of 16 keep the float kernels.
 * Rounding: bfloat16 keeps 8 bits of each activation and of each decoded weight (relative error <= 2^-9);
 * held-out perplexity and the parity prompts' greedy tokens are the evidence (tests/test_qamx.py and
 * benchmarks/README.md). Linux grants the tile state on request (arch_prctl); where it refuses, or with
 * -DLS_NO_AMX, everything runs as without AMX. A row's result depends on its call's row count only through
 * the choice auto already makes (more than LS_QUANT_ROWS_MAX rows) and on whether it is among the first
 * M & ~15. */
#if defined(LS_QUANT_ROWS_MAX) && defined(__AMX_TILE__) && defined(__AMX_BF16__) && defined(__AVX512BF16__) && \
    defined(__AVX512F__) && defined(__AVX512BW__) && defined(__linux__) && !defined(LS_PORTABLE) && !defined(LS_NO_AMX)
#include <stdio.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <unistd.h>
#define LS_HAVE_QAMX 1

/* whether this process may use the tile registers: asked once (ARCH_REQ_XCOMP_PERM for XTILEDATA) */
static int ls_amx_granted(void) {
    static int state;  /* 0: not asked yet, 1: granted, -1: refused */
    int s = __atomic_load_n(&state, __ATOMIC_ACQUIRE);
    if (s == 0) {
        s = syscall(SYS_arch_prctl, 0x1023, 18) == 0 ? 1 : -1;
        __atomic_store_n(&state, s, __ATOMIC_RELEASE);
    }
    return s > 0;
}

/* the rows of an M-row call that run on tiles (0: none) */
static inline int64_t ls_qamx_rows(int64_t M) {
    return M > LS_QUANT_ROWS_MAX && M >= 16 && ls_amx_granted() ? M & ~(int64_t)15 : 0;
}

/* the launcher: rows 0 .. ls_qamx_rows(M) - 1 of x as bfloat16 over the start of the int16 scratch q (whose
 * per-row float pointers those rows no longer need; the later rows' stay) */
static inline void ls_qamx_prepare(const float *restrict x, int64_t M, int64_t K, int16_t *restrict q) {
    const int64_t n = ls_qamx_rows(M) * K;  /* a multiple of 32: K is */
    for (int64_t i = 0; i < n; i += 32) {
        const __m512bh v = _mm512_cvtne2ps_pbh(_mm512_loadu_ps(x + i + 16), _mm512_loadu_ps(x + i));
        _mm512_storeu_si512((void *)(q + i), (__m512i)v);
    }
}

/* r[i] lane j -> r[j] lane i for 16 vectors of 16 dwords */
static inline void ls_transpose16_epi32(__m512i r[16]) {
    __m512i b[16];
    /* in-lane 4x4 transposes (qdot16x16.h): b[4k + j], 128-bit lane l: column 4l + j of rows 4k .. 4k + 3 */
    for (int k = 0; k < 4; k++) ls_t4x4(r + 4 * k, b + 4 * k);
    for (int j = 0; j < 4; j++) {
        const __m512i c0 = _mm512_shuffle_i32x4(b[j], b[4 + j], _MM_SHUFFLE(2, 0, 2, 0));
        const __m512i c1 = _mm512_shuffle_i32x4(b[j], b[4 + j], _MM_SHUFFLE(3, 1, 3, 1));
        const __m512i d0 = _mm512_shuffle_i32x4(b[8 + j], b[12 + j], _MM_SHUFFLE(2, 0, 2, 0));
        const __m512i d1 = _mm512_shuffle_i32x4(b[8 + j], b[12 + j], _MM_SHUFFLE(3, 1, 3, 1));
        r[j] = _mm512_shuffle_i32x4(c0, d0, _MM_SHUFFLE(2, 0, 2, 0));
        r[8 + j] = _mm512_shuffle_i32x4(c0, d0, _MM_SHUFFLE(3, 1, 3, 1));
        r[4 + j] = _mm512_shuffle_i32x4(c1, d1, _MM_SHUFFLE(2, 0, 2, 0));
        r[12 + j] = _mm512_shuffle_i32x4(c1, d1, _MM_SHUFFLE(3, 1, 3, 1));
    }
}

/* a block's 32 weights, decoded as ls_dq_* does (float, scale and minimum applied), as bfloat16 in order */
static inline __m512i ls_amx_bf16(__m512 lo, __m512 hi) { return (__m512i)_mm512_cvtne2ps_pbh(hi, lo); }
static inline __m512i ls_amx_vals_q8_0(const uint8_t *b) {
    const __m512 d = _mm512_set1_ps(ls_f16(b));
    const __m512 lo = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(b + 2))));
    const __m512 hi = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(b + 18))));
    return ls_amx_bf16(_mm512_mul_ps(d, lo), _mm512_mul_ps(d, hi));
}
static inline __m512i ls_amx_vals_q4_0(const uint8_t *b) {
    const __m512 d = _mm512_set1_ps(ls_f16(b));
    const __m512i q = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(b + 2))), eight = _mm512_set1_epi32(8);
    const __m512 lo = _mm512_cvtepi32_ps(_mm512_sub_epi32(_mm512_and_si512(q, _mm512_set1_epi32(15)), eight));
    const __m512 hi = _mm512_cvtepi32_ps(_mm512_sub_epi32(_mm512_srli_epi32(q, 4), eight));
    return ls_amx_bf16(_mm512_mul_ps(d, lo), _mm512_mul_ps(d, hi));
}
static inline __m512i ls_amx_vals_q4_1(const uint8_t *b) {
    const __m512 d = _mm512_set1_ps(ls_f16(b)), m = _mm512_set1_ps(ls_f16(b + 2));
    const __m512i q = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(b + 4)));
    const __m512 lo = _mm512_cvtepi32_ps(_mm512_and_si512(q, _mm512_set1_epi32(15)));
    const __m512 hi = _mm512_cvtepi32_ps(_mm512_srli_epi32(q, 4));
    return ls_amx_bf16(_mm512_fmadd_ps(d, lo, m), _mm512_fmadd_ps(d, hi, m));
}

/* this thread's buffer of at least ``bytes`` (64-byte aligned), kept for its later calls */
static inline uint16_t *ls_amx_buffer(int64_t bytes) {
    static __thread uint16_t *buf;
    static __thread int64_t cap;
    if (cap < bytes) {
        free(buf);
        cap = (bytes + 4095) & ~(int64_t)4095;
        buf = (uint16_t *)aligned_alloc(64, (size_t)cap);
        if (buf == NULL) cap = 0;
    }
    return buf;
}

typedef struct { uint8_t palette, start_row, reserved[14]; uint16_t colsb[16]; uint8_t rows[16]; } ls_tilecfg;

/* four groups of 16 activation rows (xa, row stride K) times the panel bt: C tiles 0-3, the panel's tile 4 */
#define LS_AMX_GROUPS4(xa, K, bt, nblk) do { \
    _tile_zero(0); _tile_zero(1); _tile_zero(2); _tile_zero(3); \
    for (int64_t kb = 0; kb < (nblk); kb++) { \
        _tile_loadd(4, (bt) + kb * 512, 64); \
        _tile_loadd(5, (xa) + kb * 32, 2 * (K)); _tile_dpbf16ps(0, 5, 4); \
        _tile_loadd(6, (xa) + 16 * (K) + kb * 32, 2 * (K)); _tile_dpbf16ps(1, 6, 4); \
        _tile_loadd(7, (xa) + 32 * (K) + kb * 32, 2 * (K)); _tile_dpbf16ps(2, 7, 4); \
        _tile_loadd(5, (xa) + 48 * (K) + kb * 32, 2 * (K)); _tile_dpbf16ps(3, 5, 4); \
    } } while (0)

/* weight rows w .. w + (n-1)*rb (nblk blocks of BB bytes each) against the ls_qamx_rows(M) = Mf bfloat16
 * activation rows xb (row stride K): out[m * ostride + j] for m < Mf, j < n */
#define LS_QAMX(NAME, BB, VALS) \
static void NAME(const uint8_t *restrict w, int64_t rb, int64_t n, const uint16_t *restrict xb, int64_t Mf, \
                 int64_t K, float *restrict out, int64_t ostride) { \
    const int64_t nblk = K / 32; \
    uint16_t *bt = ls_amx_buffer(nblk * 1024); \
    if (bt == NULL) { fprintf(stderr, "lightspeed: out of memory for an AMX weight panel\n"); abort(); } \
    ls_tilecfg cfg; \
    memset(&cfg, 0, sizeof cfg); \
    cfg.palette = 1; \
    for (int t = 0; t < 8; t++) { cfg.colsb[t] = 64; cfg.rows[t] = 16; } \
    _tile_loadconfig(&cfg); \
    float part[16 * 16] __attribute__((aligned(64))); \
    for (int64_t n0 = 0; n0 < n; n0 += 16) { \
        const int nr = (int)ls_min(16, n - n0); \
        for (int64_t kb = 0; kb < nblk; kb++) { \
            __m512i r[16]; \
            for (int c = 0; c < 16; c++) \
                r[c] = c < nr ? VALS(w + (n0 + c) * rb + kb * (BB)) : _mm512_setzero_si512(); \
            ls_transpose16_epi32(r);  /* row p: pair p of each weight row */ \
            for (int p = 0; p < 16; p++) _mm512_store_si512((void *)(bt + kb * 512 + 32 * p), r[p]); \
        } \
        int64_t m0 = 0; \
        for (; m0 + 64 <= Mf; m0 += 64) { \
            LS_AMX_GROUPS4(xb + m0 * K, K, bt, nblk); \
            if (nr == 16) { \
                _tile_stored(0, out + m0 * ostride + n0, 4 * ostride); \
                _tile_stored(1, out + (m0 + 16) * ostride + n0, 4 * ostride); \
                _tile_stored(2, out + (m0 + 32) * ostride + n0, 4 * ostride); \
                _tile_stored(3, out + (m0 + 48) * ostride + n0, 4 * ostride); \
            } else { \
                _tile_stored(0, part, 64); ls_amx_copy(part, nr, out + m0 * ostride + n0, ostride); \
                _tile_stored(1, part, 64); ls_amx_copy(part, nr, out + (m0 + 16) * ostride + n0, ostride); \
                _tile_stored(2, part, 64); ls_amx_copy(part, nr, out + (m0 + 32) * ostride + n0, ostride); \
                _tile_stored(3, part, 64); ls_amx_copy(part, nr, out + (m0 + 48) * ostride + n0, ostride); \
            } \
        } \
        for (; m0 < Mf; m0 += 16) { \
            _tile_zero(0); \
            for (int64_t kb = 0; kb < nblk; kb++) { \
                _tile_loadd(4, bt + kb * 512, 64); \
                _tile_loadd(5, xb + m0 * K + kb * 32, 2 * K); \
                _tile_dpbf16ps(0, 5, 4); \
            } \
            if (nr == 16) { \
                _tile_stored(0, out + m0 * ostride + n0, 4 * ostride); \
            } else { \
                _tile_stored(0, part, 64); ls_amx_copy(part, nr, out + m0 * ostride + n0, ostride); \
            } \
        } \
    } \
    _tile_release(); \
}
/* the first nr columns of a 16 x 16 tile stored at part, into out (row stride ostride) */
static inline void ls_amx_copy(const float *part, int nr, float *out, int64_t ostride) {
    const __mmask16 k = (__mmask16)((1u << nr) - 1u);
    for (int i = 0; i < 16; i++) _mm512_mask_storeu_ps(out + i * ostride, k, _mm512_load_ps(part + 16 * i));
}
LS_QAMX(ls_qamx_q8_0, 34, ls_amx_vals_q8_0)
LS_QAMX(ls_qamx_q4_0, 18, ls_amx_vals_q4_0)
LS_QAMX(ls_qamx_q4_1, 20, ls_amx_vals_q4_1)
#endif
