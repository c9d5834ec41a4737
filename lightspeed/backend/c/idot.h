/* Integer dot products for generated kernels: the builtin layer a schedule's IntegerDot step renders to
 * (backend/c/matvec.py). Generated code is otherwise plain C with GCC vector extensions; this is the one place
 * where a target instruction matters, so it lives in a few small, tested functions with a portable form.
 *
 * ls_idot16x32(a, w): the products of 32 int16 activations and 32 int8 weights summed as integers into eight
 * int32 lanes, lane l holding elements 2l, 2l+1, 16+2l and 17+2l (the lanes of AVX2's vpmaddwd over the two
 * halves, added). Every lane is an exact integer sum whatever computes it (|a| <= 32767, |w| <= 128: at most
 * 4 * 32767 * 128 < 2^31), so the SIMD forms and the portable one give the same bits, and the float sums a
 * kernel forms from the lanes (one per block, in lane order) do not depend on the path:
 * - AVX-512 VNNI with VL (and AVX-VNNI): vpdpwssd, one instruction per half;
 * - AVX2: vpmaddwd per half and an add;
 * - otherwise (or with -DLS_NO_IDOT_SIMD / LS_PORTABLE): a loop GCC vectorises as it can.
 * tests/test_idot.py compares the builds bit for bit and has the preprocessor confirm which path is built.
 *
 * ls_quantize16(v, n, q): n floats (a block) as int16 with one scale, round to nearest: q = v * 32767 / max|v|;
 * the scale (max|v| / 32767, 0 for a block of zeros, NaN for a block holding a NaN or an infinity, so that the
 * outputs it feeds are NaN rather than a finite wrong value) is returned. */
typedef int32_t ls_vi32x8 __attribute__((vector_size(32)));
typedef float ls_vf32x8 __attribute__((vector_size(32)));

#if !defined(LS_PORTABLE) && !defined(LS_NO_IDOT_SIMD) && defined(__AVX512VNNI__) && defined(__AVX512VL__)
#define LS_IDOT_PATH 3 /* vpdpwssd (EVEX) */
#elif !defined(LS_PORTABLE) && !defined(LS_NO_IDOT_SIMD) && defined(__AVXVNNI__)
#define LS_IDOT_PATH 2 /* vpdpwssd (VEX) */
#elif !defined(LS_PORTABLE) && !defined(LS_NO_IDOT_SIMD) && defined(__AVX2__)
#define LS_IDOT_PATH 1 /* vpmaddwd */
#else
#define LS_IDOT_PATH 0 /* portable */
#endif

static inline __attribute__((always_inline)) ls_vi32x8 ls_idot16x32(const int16_t *restrict a,
                                                                    const int8_t *restrict w) {
#if LS_IDOT_PATH > 0
    const __m256i a0 = _mm256_loadu_si256((const __m256i *)a), a1 = _mm256_loadu_si256((const __m256i *)(a + 16));
    const __m256i w0 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)w));
    const __m256i w1 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(w + 16)));
#if LS_IDOT_PATH == 3
    const __m256i s = _mm256_dpwssd_epi32(_mm256_madd_epi16(a0, w0), a1, w1);
#elif LS_IDOT_PATH == 2
    const __m256i s = _mm256_dpwssd_avx_epi32(_mm256_madd_epi16(a0, w0), a1, w1);
#else
    const __m256i s = _mm256_add_epi32(_mm256_madd_epi16(a0, w0), _mm256_madd_epi16(a1, w1));
#endif
    return (ls_vi32x8)s;
#else
    ls_vi32x8 s;
    for (int l = 0; l < 8; l++)
        s[l] = (int32_t)a[2 * l] * w[2 * l] + (int32_t)a[2 * l + 1] * w[2 * l + 1]
             + (int32_t)a[16 + 2 * l] * w[16 + 2 * l] + (int32_t)a[17 + 2 * l] * w[17 + 2 * l];
    return s;
#endif
}

static inline float ls_quantize16(const float *restrict v, int n, int16_t *restrict q) {
    float amax = 0.0f;
    int nan = 0;
    for (int i = 0; i < n; i++) { amax = fmaxf(amax, fabsf(v[i])); nan |= v[i] != v[i]; }
    if (nan || amax > 3.4028235e38f) { /* NaN or infinity: the block's products are NaN, as in float */
        for (int i = 0; i < n; i++) q[i] = 0;
        return __builtin_nanf("");
    }
    const float inv = amax > 0.0f ? 32767.0f / amax : 0.0f;
    for (int i = 0; i < n; i++) q[i] = (int16_t)__builtin_lrintf(v[i] * inv);
    return amax / 32767.0f;
}

/* acc + (float)d * s in every lane, fused (one rounding), so that every build forms the same float sums: an FMA
 * instruction where the target has one, else fmaf (correctly rounded); the compiler never chooses */
static inline __attribute__((always_inline)) ls_vf32x8 ls_idot_acc(ls_vf32x8 acc, ls_vi32x8 d, float s) {
    const ls_vf32x8 x = __builtin_convertvector(d, ls_vf32x8);
#if LS_IDOT_PATH > 0 && defined(__FMA__)
    return (ls_vf32x8)_mm256_fmadd_ps((__m256)x, _mm256_set1_ps(s), (__m256)acc);
#else
    ls_vf32x8 out;
    for (int l = 0; l < 8; l++) out[l] = fmaf(x[l], s, acc[l]);
    return out;
#endif
}

/* the eight lanes of a float accumulator summed in lane order (one fixed order for every path) */
static inline float ls_hsum8(ls_vf32x8 v) {
    float s = 0.0f;
    for (int l = 0; l < 8; l++) s += v[l];
    return s;
}
