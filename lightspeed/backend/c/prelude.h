/* Lightspeed generated-code prelude: helpers every kernel may use.
 * Index arithmetic is int64; float16 and bfloat16 values are computed in float. */
#include <stdint.h>
#include <string.h>
#include <math.h>

typedef void (*ls_task_fn)(void *ctx, int64_t begin, int64_t end);
extern void ls_parallel_for(ls_task_fn fn, void *ctx, int64_t n);

typedef struct { void **bufs; const int64_t *dims; char *arena; } ls_args;

static inline int64_t ls_min(int64_t a, int64_t b) { return a < b ? a : b; }
static inline int64_t ls_max(int64_t a, int64_t b) { return a > b ? a : b; }
/* floor division and modulo (Python semantics) for operands that may be negative */
static inline int64_t ls_floordiv(int64_t a, int64_t b) {
    int64_t q = a / b;
    return (q * b != a && ((a < 0) != (b < 0))) ? q - 1 : q;
}
static inline int64_t ls_floormod(int64_t a, int64_t b) { return a - ls_floordiv(a, b) * b; }

/* split the last axis into chunks when the outer axes alone give too little parallel work */
static inline int64_t ls_chunks(int64_t outer, int64_t last) {
    if (outer >= 32 || last < 512) return 1;
    int64_t want = (32 + outer - 1) / outer, most = last / 256;
    return want < most ? want : most;
}

static inline float ls_bits_f32(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }
static inline uint32_t ls_f32_bits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }

static inline float ls_bf16_to_f32(uint16_t h) { return ls_bits_f32((uint32_t)h << 16); }
/* the float16 stored little-endian at p (any alignment), exactly: the magnitude's bits moved into float32
 * position and scaled by 2**112 (normals and subnormals alike), infinities and NaN set apart */
static inline float ls_f16_at(const uint8_t *p) {
    const uint32_t h = (uint32_t)p[0] | ((uint32_t)p[1] << 8), mag = h & 0x7fffu;
    const float f = mag >= 0x7c00u ? ls_bits_f32(0x7f800000u | ((mag & 0x3ffu) << 13))
                                   : ls_bits_f32(mag << 13) * 0x1p112f;
    return ls_bits_f32(ls_f32_bits(f) | ((h & 0x8000u) << 16));
}
static inline uint16_t ls_f32_to_bf16(float f) {
    uint32_t u = ls_f32_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fc0;  /* NaN */
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);  /* round to nearest even */
}

/* 2**x without libm, branch-free so loops vectorise; ~1 ulp. */
static inline float ls_exp2f(float x) {
    float xc = x < -151.0f ? -151.0f : (x > 128.0f ? 128.0f : x);
    float fi = __builtin_floorf(xc + 0.5f);
    float f = xc - fi;
    float p = 1.5252734e-5f;
    p = p * f + 1.5403530e-4f;
    p = p * f + 1.3333558e-3f;
    p = p * f + 9.6181291e-3f;
    p = p * f + 5.5504109e-2f;
    p = p * f + 2.4022651e-1f;
    p = p * f + 6.9314718e-1f;
    p = p * f + 1.0f;
    int32_t i = (int32_t)fi;
    int32_t i1 = i >> 1, i2 = i - (i >> 1);  /* two factors keep 2**i representable */
    float s1 = ls_bits_f32((uint32_t)(i1 + 127) << 23), s2 = ls_bits_f32((uint32_t)(i2 + 127) << 23);
    float r = p * s1 * s2;
    return x != x ? x : r;
}

/* log2(x) without libm, branch-free; ~2 ulp. */
static inline float ls_log2f(float x) {
    int sub = x < 1.17549435e-38f;
    float xs = sub ? x * 8388608.0f : x;  /* scale subnormals by 2**23 */
    uint32_t u = ls_f32_bits(xs);
    int32_t e = (int32_t)((u >> 23) & 0xff) - 127 - (sub ? 23 : 0);
    float m = ls_bits_f32((u & 0x7fffffu) | 0x3f800000u);  /* [1, 2) */
    int big = m > 1.41421356f;
    m = big ? m * 0.5f : m;
    e += big;
    float t = (m - 1.0f) / (m + 1.0f), t2 = t * t;
    float p = 0.11111111f;
    p = p * t2 + 0.14285714f;
    p = p * t2 + 0.2f;
    p = p * t2 + 0.33333333f;
    p = p * t2 + 1.0f;
    float r = (float)e + p * t * 2.8853900817779268f;  /* 2/ln(2) */
    r = (x == 0.0f) ? -INFINITY : r;
    r = (x == INFINITY) ? INFINITY : r;
    r = (x < 0.0f || x != x) ? NAN : r;
    return r;
}

/* sin(x) without libm, branch-free so loops vectorise: quadrant reduction in double precision
 * (accurate while |x| < 1e15), then minimax polynomials on [-pi/4, pi/4]; ~1 ulp. */
static inline float ls_sinf(float x) {
    double xd = (double)x;
    double k = __builtin_nearbyint(xd * 0.63661977236758134308);
    double rd = (xd - k * 1.57079632679489655800e+00) - k * 6.12323399573676603587e-17;
    float r = (float)rd, r2 = r * r;
    float s = r + r * r2 * (-1.6666654611e-1f + r2 * (8.3321608736e-3f + r2 * -1.9515295891e-4f));
    float c = 1.0f - 0.5f * r2 + r2 * r2 * (4.166664568298827e-2f + r2 * (-1.388731625493765e-3f + r2 * 2.443315711809948e-5f));
    int32_t q = (int32_t)(k - 4.0 * __builtin_floor(k * 0.25));  /* quadrant k mod 4, exact in double */
    float v = (q & 1) ? c : s;
    v = (q & 2) ? -v : v;
    return (x - x != 0.0f) ? NAN : v;  /* inf and NaN give NaN */
}

/* max that propagates NaN like numpy */
static inline float ls_maxf(float a, float b) { return (b > a || b != b) ? b : a; }
/* fmod(a, c) for c = 2**k (with inv = 2**-k): the scalings are exact, so is the difference (the remainder is
 * representable), the sign of a zero result is a's as fmod's is, and inf - inf gives fmod's NaN; it
 * vectorises, where fmodf is a library call (a Q4_1 nibble is cut out of its byte this way) */
static inline float ls_fmod_pow2(float a, float c, float inv) { return copysignf(a - truncf(a * inv) * c, a); }

/* 8 floats as one value (two SSE or one AVX register), for kernels written with vector arithmetic */
typedef float ls_v8 __attribute__((vector_size(32)));
static inline ls_v8 ls_load8(const float *p) { ls_v8 v; memcpy(&v, p, sizeof v); return v; }
#if defined(__AVX__)
#include <immintrin.h>
#endif
/* 8 float16 values widened to floats (exact): one F16C instruction where the target has it */
static inline ls_v8 ls_load8h(const _Float16 *p) {
#if defined(__F16C__)
    return (ls_v8)_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
#else
    ls_v8 v;
    for (int i = 0; i < 8; i++) v[i] = (float)p[i];
    return v;
#endif
}
/* lane u of the result = the sum of the 8 lanes of a[u] */
static inline ls_v8 ls_sum8x8(const ls_v8 *a) {
#if defined(__AVX__)
    const __m256 h0 = _mm256_hadd_ps((__m256)a[0], (__m256)a[1]), h1 = _mm256_hadd_ps((__m256)a[2], (__m256)a[3]);
    const __m256 h2 = _mm256_hadd_ps((__m256)a[4], (__m256)a[5]), h3 = _mm256_hadd_ps((__m256)a[6], (__m256)a[7]);
    const __m256 g0 = _mm256_hadd_ps(h0, h1), g1 = _mm256_hadd_ps(h2, h3);  /* quarter sums of a0-3 | a4-7 */
    return (ls_v8)_mm256_add_ps(_mm256_permute2f128_ps(g0, g1, 0x20), _mm256_permute2f128_ps(g0, g1, 0x31));
#else
    ls_v8 r;
    for (int u = 0; u < 8; u++) {
        float s = 0.0f;
        for (int l = 0; l < 8; l++) s += a[u][l];
        r[u] = s;
    }
    return r;
#endif
}

/* saturating float -> int conversions (NaN -> 0), matching the reference backend */
#define LS_F2I(name, T, LO, HI) \
    static inline T name(float x) { \
        return x != x ? (T)0 : x <= (float)(LO) ? (T)(LO) : x >= (float)(HI) ? (T)(HI) : (T)x; }
LS_F2I(ls_f2i8, int8_t, -128, 127)
LS_F2I(ls_f2u8, uint8_t, 0, 255)
LS_F2I(ls_f2i16, int16_t, -32768, 32767)
LS_F2I(ls_f2u16, uint16_t, 0, 65535)
LS_F2I(ls_f2i32, int32_t, -2147483648.0, 2147483647.0)
LS_F2I(ls_f2u32, uint32_t, 0, 4294967295.0)
LS_F2I(ls_f2i64, int64_t, -9223372036854775808.0, 9223372036854775807.0)
