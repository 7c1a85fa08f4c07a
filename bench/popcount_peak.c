/* The popcount ceiling of one kernel path (refimpl/isa.py): the fastest L1-resident loop of
 * x AND w, popcount and accumulate that the path's instructions allow, one OpenMP thread per core.
 *
 *     gcc -O3 -fopenmp -o popcount_peak bench/popcount_peak.c
 *     ./popcount_peak PATH [THREADS]      PATH: avx512-vpopcntdq | avx512bw | avx2 | portable
 *
 * No -march: each path's loops carry their own target attribute, so every path builds on any
 * x86-64 gcc/clang and this CPU runs every path it supports (a lower ISA on a higher host too);
 * on other CPUs only the portable path is built. A path the CPU cannot run exits 2.
 * Every loop is an outer product like the GEMM tile: weight vectors held in registers against
 * loaded input vectors, one accumulator per weight. Each loop's total popcount is checked against
 * a plain scalar count of the same words (a wrong loop exits 1). Rates are binary MACs/s (one MAC
 * = one bit of x AND w) from each thread's own CPU time, summed over threads, best of 5 runs
 * (wall-clock rates beside them): on a machine shared with other work the CPU time is what the
 * loop needs when it has the core. Output: one line with every loop's rate and a checksum,
 * then the last line, the path's ceiling in T binary MACs/s (the best loop of the path).
 *
 * Loops per path (ymm/zmm = 256/512-bit vectors):
 * - avx512-vpopcntdq: "broadcast", the Numba GEMM tile's shape (one weight vector against 16
 *   broadcast input words, 16 accumulators, a load per popcount); "registers", eight weight
 *   vectors in registers against one loaded input (a load per eight popcounts; 10-15% faster
 *   on the Xeon development host: the and, popcount and add share two vector ports).
 * - avx512bw and avx2: "lookup", Muła's nibble lookup (vpand, vpsrlw, 2x vpshufb, vpaddb) into
 *   byte accumulators for 31 steps (31 x 8 = 248 < 256), then one vpsadbw widens them.
 * - avx2 "split": the lookup with the input's nibbles split once per load (6 ops a vector, not 8).
 * - avx512bw and avx2 "harley-seal": a carry-save adder tree over 16 k steps per weight (no
 *   shuffles; 2 vpternlogq per adder on AVX-512, 5 logic ops on AVX2), one lookup per 16 vectors.
 * - portable: "sse2", the x86-64 baseline's bit-slice count (no popcnt instruction: what the
 *   portable Numba path compiles to) into byte accumulators; "popcnt", scalar popcnt on 64-bit
 *   words (x86-64-v2). The ceiling is the sse2 loop: the portable target has no popcnt, and the
 *   popcnt rate says what an x86-64-v2 target would lift it to. Elsewhere (ARM64):
 *   "builtin", __builtin_popcountll on 64-bit words, the ceiling. */
#include <omp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#if defined(__x86_64__)
#include <immintrin.h>
#define X86 1
#else
#define X86 0
#endif

#define STEPS 64 /* input vectors a loop cycles through: at most 64 x 64 bytes, L1 resident */
static uint64_t X[STEPS * 16]; /* input words: 64 steps of up to 16 words (the broadcast loop) */
static uint64_t W[STEPS * 8];  /* weight words: 64 steps of 8 words, or up to 8 vectors of 8 */

/* ---------------------------------------------------------------- avx512-vpopcntdq ---------- */
#if X86
#define T_VPOPCNT __attribute__((target("avx512f,avx512bw,avx512vpopcntdq")))
#define T_AVX512BW __attribute__((target("avx512f,avx512bw")))
#define T_AVX2 __attribute__((target("avx2")))
#define T_POPCNT __attribute__((target("popcnt")))

#define BROADCAST_ITERS 4000000L

T_VPOPCNT static uint64_t vpopcnt_broadcast(long iters) {
    uint64_t w[64 * 8] __attribute__((aligned(64)));
    uint64_t x[64 * 16] __attribute__((aligned(64)));
    memcpy(w, W, sizeof w);
    memcpy(x, X, sizeof x);
    __m512i acc[16];
    for (int p = 0; p < 16; p++) acc[p] = _mm512_setzero_si512();
    for (long it = 0; it < iters; it++) {
        int s = it & 63;
        __m512i wv = _mm512_load_si512(&w[s * 8]);
#pragma GCC unroll 16
        for (int p = 0; p < 16; p++) {
            __m512i xv = _mm512_set1_epi64((long long)x[s * 16 + p]);
            acc[p] = _mm512_add_epi64(acc[p], _mm512_popcnt_epi64(_mm512_and_si512(wv, xv)));
        }
    }
    uint64_t sink = 0;
    for (int p = 0; p < 16; p++) sink += _mm512_reduce_add_epi64(acc[p]);
    return sink;
}

T_VPOPCNT static uint64_t vpopcnt_registers(long steps) {
    __m512i x[STEPS], w[8], acc[8];
    for (int i = 0; i < STEPS; i++) x[i] = _mm512_loadu_si512(&X[i * 8]);
    for (int j = 0; j < 8; j++) {
        w[j] = _mm512_loadu_si512(&W[j * 8]);
        acc[j] = _mm512_setzero_si512();
    }
    for (long it = 0; it < steps; it++) {
        __m512i xv = _mm512_load_si512(&x[it & 63]);
#pragma GCC unroll 8
        for (int j = 0; j < 8; j++) acc[j] = _mm512_add_epi64(acc[j], _mm512_popcnt_epi64(_mm512_and_si512(xv, w[j])));
    }
    uint64_t sink = 0;
    for (int j = 0; j < 8; j++) sink += _mm512_reduce_add_epi64(acc[j]);
    return sink;
}

/* ---------------------------------------------------------------- shared by the vector loops */
/* Muła's lookup: the popcount of each nibble from a 16-entry table, two shuffles per vector. */
#define LOOKUP_TABLE 0, 1, 1, 2, 1, 2, 2, 3, 1, 2, 2, 3, 2, 3, 3, 4

/* The byte-count and Harley-Seal loops are one algorithm on several vector widths: each is
 * written once below (BYTE_COUNT_LOOP, HARLEY_SEAL_LOOP) over a width's names, V512_* (zmm),
 * V256_* (ymm) or V128_* (xmm): its type, 64-bit words per vector, loads, and, byte and 64-bit
 * adds, psadbw, the byte counts of a vector (nibble lookup or bit slices), the sum of its 64-bit
 * lanes, the count of a vector and the carry-save adder. */

/* Harley-Seal over the k steps (Muła, Kurz, Lemire 2018), per weight: the 16 vectors x AND w of
 * a block go through a tree of 15 carry-save adders (CSA: h:l = a + b + c bit by bit) into ones,
 * twos, fours, eights; only the block's carry out is popcounted. Count = 16 x (carries) +
 * 8 x eights + 4 x fours + 2 x twos + ones. P(V, k) is the k-th vector x AND w of the block. */
#define CSA_TREE(V, P, ones, twos, fours, eights, carry)                                        \
    do {                                                                                        \
        V##_T twos_a, twos_b, fours_a, fours_b, eights_a, eights_b;                             \
        CSA_FOURS(V, P, 0, ones, twos, fours_a);                                                \
        CSA_FOURS(V, P, 4, ones, twos, fours_b);                                                \
        V##_CSA(eights_a, fours, fours, fours_a, fours_b);                                      \
        CSA_FOURS(V, P, 8, ones, twos, fours_a);                                                \
        CSA_FOURS(V, P, 12, ones, twos, fours_b);                                               \
        V##_CSA(eights_b, fours, fours, fours_a, fours_b);                                      \
        V##_CSA(carry, eights, eights, eights_a, eights_b);                                     \
    } while (0)

/* Vectors k..k+3 into ones and twos, their carry out of twos into fours_out (in CSA_TREE). */
#define CSA_FOURS(V, P, k, ones, twos, fours_out)                                               \
    do {                                                                                        \
        V##_CSA(twos_a, ones, ones, P(V, k), P(V, k + 1));                                      \
        V##_CSA(twos_b, ones, ones, P(V, k + 2), P(V, k + 3));                                  \
        V##_CSA(fours_out, twos, twos, twos_a, twos_b);                                         \
    } while (0)

/* Weights in registers, input vectors loaded, byte accumulators for 31 steps (31 x 8 = 248 <
 * 256), then one psadbw widens them into 64-bit lanes. */
#define BYTE_COUNT_LOOP(NAME, TARGET, V, WEIGHTS)                                                   \
    TARGET static uint64_t NAME(long steps) {                                                   \
        const V##_T zero = V##_ZERO();                                                          \
        V##_T x[STEPS], w[WEIGHTS], acc[WEIGHTS], wide[WEIGHTS];                                \
        for (int i = 0; i < STEPS; i++) x[i] = V##_LOADU(&X[i * V##_WORDS]);                    \
        for (int j = 0; j < WEIGHTS; j++) {                                                     \
            w[j] = V##_LOADU(&W[j * V##_WORDS]);                                                \
            wide[j] = zero;                                                                     \
        }                                                                                       \
        long i = 0;                                                                             \
        for (long block = 0; block < steps; block += 31) {                                      \
            for (int j = 0; j < WEIGHTS; j++) acc[j] = zero;                                    \
            for (int s = 0; s < 31; s++, i++) {                                                 \
                V##_T xv = V##_LOAD(&x[i & 63]);                                                \
                _Pragma("GCC unroll 8") for (int j = 0; j < WEIGHTS; j++)                       \
                    acc[j] = V##_ADD8(acc[j], V##_BYTES(V##_AND(xv, w[j])));                   \
            }                                                                                   \
            for (int j = 0; j < WEIGHTS; j++) wide[j] = V##_ADD64(wide[j], V##_SAD(acc[j], zero)); \
        }                                                                                       \
        uint64_t sink = 0;                                                                      \
        for (int j = 0; j < WEIGHTS; j++) sink += V##_SUM(wide[j]);                             \
        return sink;                                                                            \
    }

/* The k-th input vector of the block AND the weight, inside HARLEY_SEAL_LOOP. */
#define XS_AND_W(V, k) V##_AND(V##_LOAD(&xs[k]), wj)

/* Per weight: ones, twos, fours, eights carry-save registers and a 64-bit sum of the carries. */
#define HARLEY_SEAL_LOOP(NAME, TARGET, V, WEIGHTS)                                              \
    TARGET static uint64_t NAME(long steps) {                                                   \
        V##_T x[STEPS], w[WEIGHTS], ones[WEIGHTS], twos[WEIGHTS], fours[WEIGHTS], eights[WEIGHTS], \
            sixteens[WEIGHTS];                                                                  \
        for (int i = 0; i < STEPS; i++) x[i] = V##_LOADU(&X[i * V##_WORDS]);                    \
        for (int j = 0; j < WEIGHTS; j++) {                                                     \
            w[j] = V##_LOADU(&W[j * V##_WORDS]);                                                \
            ones[j] = twos[j] = fours[j] = eights[j] = sixteens[j] = V##_ZERO();                \
        }                                                                                       \
        for (long block = 0; block < steps; block += 16) {                                      \
            const V##_T *xs = &x[block & 63]; /* block is a multiple of 16: xs[0..15] in range */ \
            _Pragma("GCC unroll 4") for (int j = 0; j < WEIGHTS; j++) {                         \
                V##_T wj = w[j], carry;                                                         \
                CSA_TREE(V, XS_AND_W, ones[j], twos[j], fours[j], eights[j], carry);            \
                sixteens[j] = V##_ADD64(sixteens[j], V##_SAD(V##_BYTES(carry), V##_ZERO()));   \
            }                                                                                   \
        }                                                                                       \
        uint64_t sink = 0;                                                                      \
        for (int j = 0; j < WEIGHTS; j++)                                                       \
            sink += 16 * V##_SUM(sixteens[j]) + 8 * V##_COUNT(eights[j]) + 4 * V##_COUNT(fours[j]) + \
                    2 * V##_COUNT(twos[j]) + V##_COUNT(ones[j]);                                \
        return sink;                                                                            \
    }

/* ---------------------------------------------------------------- avx512bw ------------------ */
#define BW_WEIGHTS 8

T_AVX512BW static inline __m512i lookup512(__m512i v) {
    const __m512i lut = _mm512_broadcast_i32x4(_mm_setr_epi8(LOOKUP_TABLE)), low = _mm512_set1_epi8(0x0f);
    __m512i lo = _mm512_shuffle_epi8(lut, _mm512_and_si512(v, low));
    __m512i hi = _mm512_shuffle_epi8(lut, _mm512_and_si512(_mm512_srli_epi16(v, 4), low));
    return _mm512_add_epi8(lo, hi); /* byte counts, at most 8 */
}

T_AVX512BW static inline uint64_t count512(__m512i v) {
    return (uint64_t)_mm512_reduce_add_epi64(_mm512_sad_epu8(lookup512(v), _mm512_setzero_si512()));
}

/* AVX-512 has three-input logic: a CSA is two vpternlogq (majority 0xE8, parity 0x96). */
#define CSA512(h, l, a, b, c)                                                                   \
    do {                                                                                        \
        __m512i a_ = (a), b_ = (b), c_ = (c);                                                   \
        h = _mm512_ternarylogic_epi64(a_, b_, c_, 0xE8);                                        \
        l = _mm512_ternarylogic_epi64(a_, b_, c_, 0x96);                                        \
    } while (0)

#define V512_T __m512i
#define V512_WORDS 8
#define V512_ZERO _mm512_setzero_si512
#define V512_LOADU(p) _mm512_loadu_si512(p)
#define V512_LOAD _mm512_load_si512
#define V512_AND _mm512_and_si512
#define V512_ADD8 _mm512_add_epi8
#define V512_ADD64 _mm512_add_epi64
#define V512_SAD _mm512_sad_epu8
#define V512_BYTES lookup512
#define V512_SUM(v) ((uint64_t)_mm512_reduce_add_epi64(v))
#define V512_COUNT count512
#define V512_CSA CSA512

#define HS512_WEIGHTS 3 /* per weight: 4 carry-save registers, the weight, a sum; 3 fit in 32 zmm */

BYTE_COUNT_LOOP(avx512bw_lookup, T_AVX512BW, V512, BW_WEIGHTS)
HARLEY_SEAL_LOOP(avx512bw_harley_seal, T_AVX512BW, V512, HS512_WEIGHTS)

/* ---------------------------------------------------------------- avx2 ---------------------- */
#define AVX2_WEIGHTS 4 /* 16 ymm registers: 4 weights, 4 byte accumulators, table, mask, temporaries */

T_AVX2 static inline uint64_t sum256(__m256i v) {
    __m128i s = _mm_add_epi64(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    return (uint64_t)_mm_cvtsi128_si64(s) + (uint64_t)_mm_extract_epi64(s, 1);
}

T_AVX2 static inline __m256i lookup256(__m256i v) {
    const __m256i lut = _mm256_setr_epi8(LOOKUP_TABLE, LOOKUP_TABLE), low = _mm256_set1_epi8(0x0f);
    __m256i lo = _mm256_shuffle_epi8(lut, _mm256_and_si256(v, low));
    __m256i hi = _mm256_shuffle_epi8(lut, _mm256_and_si256(_mm256_srli_epi16(v, 4), low));
    return _mm256_add_epi8(lo, hi); /* byte counts, at most 8 */
}

T_AVX2 static inline uint64_t count256(__m256i v) {
    return sum256(_mm256_sad_epu8(lookup256(v), _mm256_setzero_si256()));
}

/* AVX2 has no three-input logic: a CSA is 5 ops, against 8 per vector for the lookup. */
#define CSA256(h, l, a, b, c)                                                                   \
    do {                                                                                        \
        __m256i u_ = _mm256_xor_si256(a, b), c_ = (c);                                         \
        h = _mm256_or_si256(_mm256_and_si256(a, b), _mm256_and_si256(u_, c_));                 \
        l = _mm256_xor_si256(u_, c_);                                                           \
    } while (0)

#define V256_T __m256i
#define V256_WORDS 4
#define V256_ZERO _mm256_setzero_si256
#define V256_LOADU(p) _mm256_loadu_si256((const __m256i *)(p))
#define V256_LOAD _mm256_load_si256
#define V256_AND _mm256_and_si256
#define V256_ADD8 _mm256_add_epi8
#define V256_ADD64 _mm256_add_epi64
#define V256_SAD _mm256_sad_epu8
#define V256_BYTES lookup256
#define V256_SUM sum256
#define V256_COUNT count256
#define V256_CSA CSA256

#define HS_WEIGHTS 2 /* per weight: 4 carry-save registers and the weight; 2 fit in 16 ymm */

/* The lookup per vector: vpand, then vpand, vpsrlw, vpand, 2x vpshufb, 2x vpaddb (8 ops). */
BYTE_COUNT_LOOP(avx2_lookup, T_AVX2, V256, AVX2_WEIGHTS)
HARLEY_SEAL_LOOP(avx2_harley_seal, T_AVX2, V256, HS_WEIGHTS)

/* The lookup with the input's nibbles split once per load: the low nibbles of x AND w are
 * (x & 0x0f..) AND w, the high ones ((x >> 4) & 0x0f..) AND (w >> 4), so a vector costs
 * 2x vpand, 2x vpshufb, 2x vpaddb (6 ops) and the weights take two registers each. */
T_AVX2 static uint64_t avx2_split(long steps) {
    const __m256i lut = _mm256_setr_epi8(LOOKUP_TABLE, LOOKUP_TABLE);
    const __m256i low = _mm256_set1_epi8(0x0f), zero = _mm256_setzero_si256();
    __m256i x[STEPS], w[AVX2_WEIGHTS], w_high[AVX2_WEIGHTS], acc[AVX2_WEIGHTS], wide[AVX2_WEIGHTS];
    for (int i = 0; i < STEPS; i++) x[i] = _mm256_loadu_si256((const __m256i *)&X[i * 4]);
    for (int j = 0; j < AVX2_WEIGHTS; j++) {
        w[j] = _mm256_loadu_si256((const __m256i *)&W[j * 4]);
        w_high[j] = _mm256_srli_epi16(w[j], 4);
        wide[j] = zero;
    }
    long i = 0;
    for (long block = 0; block < steps; block += 31) {
        for (int j = 0; j < AVX2_WEIGHTS; j++) acc[j] = zero;
        for (int s = 0; s < 31; s++, i++) {
            __m256i xv = _mm256_load_si256(&x[i & 63]);
            __m256i x_low = _mm256_and_si256(xv, low), x_high = _mm256_and_si256(_mm256_srli_epi16(xv, 4), low);
#pragma GCC unroll 8
            for (int j = 0; j < AVX2_WEIGHTS; j++) {
                __m256i lo = _mm256_shuffle_epi8(lut, _mm256_and_si256(x_low, w[j]));
                __m256i hi = _mm256_shuffle_epi8(lut, _mm256_and_si256(x_high, w_high[j]));
                acc[j] = _mm256_add_epi8(acc[j], _mm256_add_epi8(lo, hi));
            }
        }
        for (int j = 0; j < AVX2_WEIGHTS; j++) wide[j] = _mm256_add_epi64(wide[j], _mm256_sad_epu8(acc[j], zero));
    }
    uint64_t sink = 0;
    for (int j = 0; j < AVX2_WEIGHTS; j++) sink += sum256(wide[j]);
    return sink;
}

/* ---------------------------------------------------------------- portable (x86-64) --------- */
#define T_BASELINE /* SSE2 is in every x86-64 */
#define SSE2_WEIGHTS 4

/* The x86-64 baseline has no popcnt: the bit-slice count of each byte (LLVM expands ctpop the
 * same way for the portable target). */
static inline __m128i bitslice128(__m128i t) {
    const __m128i m1 = _mm_set1_epi8(0x55), m2 = _mm_set1_epi8(0x33), m4 = _mm_set1_epi8(0x0f);
    t = _mm_sub_epi8(t, _mm_and_si128(_mm_srli_epi64(t, 1), m1));
    t = _mm_add_epi8(_mm_and_si128(t, m2), _mm_and_si128(_mm_srli_epi64(t, 2), m2));
    return _mm_and_si128(_mm_add_epi8(t, _mm_srli_epi64(t, 4)), m4); /* byte counts, at most 8 */
}

static inline uint64_t sum128(__m128i v) {
    return (uint64_t)_mm_cvtsi128_si64(v) + (uint64_t)_mm_cvtsi128_si64(_mm_unpackhi_epi64(v, v));
}

#define V128_T __m128i
#define V128_WORDS 2
#define V128_ZERO _mm_setzero_si128
#define V128_LOADU(p) _mm_loadu_si128((const __m128i *)(p))
#define V128_LOAD _mm_load_si128
#define V128_AND _mm_and_si128
#define V128_ADD8 _mm_add_epi8
#define V128_ADD64 _mm_add_epi64
#define V128_SAD _mm_sad_epu8
#define V128_BYTES bitslice128
#define V128_SUM sum128

BYTE_COUNT_LOOP(portable_sse2, T_BASELINE, V128, SSE2_WEIGHTS)
#else
#define T_POPCNT
#endif /* X86 */

/* ---------------------------------------------------------------- scalar popcount ----------- */
#define SCALAR_WEIGHTS 4

/* popcnt on x86-64 (x86-64-v2), the CPU's own instruction elsewhere (ARM64: cnt + addv). */
T_POPCNT static uint64_t scalar_popcount(long steps) {
    uint64_t x[STEPS], w[SCALAR_WEIGHTS], acc[SCALAR_WEIGHTS];
    memcpy(x, X, sizeof x);
    for (int j = 0; j < SCALAR_WEIGHTS; j++) {
        w[j] = W[j];
        acc[j] = 0;
    }
    for (long it = 0; it < steps; it++) {
        uint64_t xv = x[it & 63];
#pragma GCC unroll 4
        for (int j = 0; j < SCALAR_WEIGHTS; j++) acc[j] += (uint64_t)__builtin_popcountll(xv & w[j]);
    }
    uint64_t sink = 0;
    for (int j = 0; j < SCALAR_WEIGHTS; j++) sink += acc[j];
    return sink;
}

/* ---------------------------------------------------------------- driver -------------------- */
struct loop {
    const char *name;
    uint64_t (*run)(long steps);
    long steps;     /* k steps per run: a multiple of the loop's block (31 or 16) */
    int words;      /* 64-bit words per vector */
    int weights;    /* weight vectors in registers; 0 for the broadcast loop */
    int in_ceiling; /* 0: measured for comparison, not an instruction of the path's target */
};

static double macs_per_run(const struct loop *l) {
    return l->weights ? (double)l->steps * l->weights * l->words * 64 : (double)l->steps * 16 * 512;
}

/* The loop's total count, from a plain scalar popcount of the same words. */
static uint64_t expected(const struct loop *l) {
    uint64_t per_step[STEPS], cycle = 0, total = 0;
    for (int s = 0; s < STEPS; s++) {
        per_step[s] = 0;
        if (l->weights) {
            for (int j = 0; j < l->weights; j++)
                for (int k = 0; k < l->words; k++)
                    per_step[s] += (uint64_t)__builtin_popcountll(X[s * l->words + k] & W[j * l->words + k]);
        } else {
            for (int p = 0; p < 16; p++)
                for (int k = 0; k < 8; k++) per_step[s] += (uint64_t)__builtin_popcountll(W[s * 8 + k] & X[s * 16 + p]);
        }
        cycle += per_step[s];
    }
    total = (uint64_t)(l->steps / STEPS) * cycle;
    for (long s = 0; s < l->steps % STEPS; s++) total += per_step[s];
    return total;
}

static double thread_seconds(void) {
    struct timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* Best of 5 runs: T MACs/s from each thread's CPU time (summed) and from wall time. */
static int measure(const struct loop *l, int threads, double *cpu_rate, double *wall_rate, uint64_t *checksum) {
    uint64_t want = (uint64_t)threads * expected(l);
    *cpu_rate = *wall_rate = 0;
    for (int rep = 0; rep < 5; rep++) {
        uint64_t sink = 0;
        double rate = 0, t0 = omp_get_wtime();
#pragma omp parallel num_threads(threads) reduction(+ : sink, rate)
        {
            double c0 = thread_seconds();
            sink += l->run(l->steps);
            rate += macs_per_run(l) / (thread_seconds() - c0) / 1e12;
        }
        double wall = macs_per_run(l) * threads / (omp_get_wtime() - t0) / 1e12;
        if (sink != want) {
            fprintf(stderr, "popcount_peak: loop %s counted %llu, a scalar count of the same words gives %llu\n",
                    l->name, (unsigned long long)sink, (unsigned long long)want);
            return 1;
        }
        *checksum += sink;
        if (rate > *cpu_rate) *cpu_rate = rate;
        if (wall > *wall_rate) *wall_rate = wall;
    }
    if (threads > omp_get_num_procs()) *cpu_rate = *wall_rate; /* threads share cores: CPU time overstates */
    return 0;
}

static const char *PATHS = "avx512-vpopcntdq, avx512bw, avx2, portable";

/* The loops of `path` this CPU can run, or -1 where it cannot run the path (or no such path). */
static int loops_of(const char *path, struct loop *out) {
    int n = 0;
#if X86
    __builtin_cpu_init();
    if (!strcmp(path, "avx512-vpopcntdq")) {
        if (!__builtin_cpu_supports("avx512f") || !__builtin_cpu_supports("avx512bw") ||
            !__builtin_cpu_supports("avx512vpopcntdq"))
            return -1;
        out[n++] = (struct loop){"broadcast", vpopcnt_broadcast, BROADCAST_ITERS, 8, 0, 1};
        out[n++] = (struct loop){"registers", vpopcnt_registers, 2 * BROADCAST_ITERS, 8, 8, 1};
    } else if (!strcmp(path, "avx512bw")) {
        if (!__builtin_cpu_supports("avx512f") || !__builtin_cpu_supports("avx512bw")) return -1;
        out[n++] = (struct loop){"lookup", avx512bw_lookup, 31L * 80000, 8, BW_WEIGHTS, 1};
        out[n++] = (struct loop){"harley-seal", avx512bw_harley_seal, 16L * 400000, 8, HS512_WEIGHTS, 1};
    } else if (!strcmp(path, "avx2")) {
        if (!__builtin_cpu_supports("avx2")) return -1;
        out[n++] = (struct loop){"lookup", avx2_lookup, 31L * 160000, 4, AVX2_WEIGHTS, 1};
        out[n++] = (struct loop){"split", avx2_split, 31L * 160000, 4, AVX2_WEIGHTS, 1};
        out[n++] = (struct loop){"harley-seal", avx2_harley_seal, 16L * 640000, 4, HS_WEIGHTS, 1};
    } else if (!strcmp(path, "portable")) {
        out[n++] = (struct loop){"sse2", portable_sse2, 31L * 64000, 2, SSE2_WEIGHTS, 1};
        if (__builtin_cpu_supports("popcnt"))
            out[n++] = (struct loop){"popcnt", scalar_popcount, 8000000L, 1, SCALAR_WEIGHTS, 0};
    } else {
        return -1;
    }
#else
    if (strcmp(path, "portable")) return -1;
    out[n++] = (struct loop){"builtin", scalar_popcount, 8000000L, 1, SCALAR_WEIGHTS, 1};
#endif
    return n;
}

int main(int argc, char **argv) {
    if (argc < 2 || argc > 3) {
        fprintf(stderr, "usage: %s PATH [THREADS]   (PATH: %s)\n", argv[0], PATHS);
        return 2;
    }
    const char *path = argv[1];
    int threads = argc > 2 ? atoi(argv[2]) : 1;
    if (threads < 1) {
        fprintf(stderr, "popcount_peak: THREADS must be a positive integer, not '%s'\n", argv[2]);
        return 2;
    }
    uint64_t state = 0x9E3779B97F4A7C15ull; /* splitmix64: the same words in every run */
    for (int i = 0; i < STEPS * 16 + STEPS * 8; i++) {
        uint64_t z = (state += 0x9E3779B97F4A7C15ull);
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
        z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
        z ^= z >> 31;
        if (i < STEPS * 16) X[i] = z;
        else W[i - STEPS * 16] = z;
    }
    struct loop loops[4];
    int n = loops_of(path, loops);
    if (n < 0) {
        fprintf(stderr, "popcount_peak: '%s' is not a path this CPU can run (paths: %s)\n", path, PATHS);
        return 2;
    }
    double best = 0;
    uint64_t checksum = 0;
    printf("%s, %d thread%s, T binary MACs/s by CPU time (wall):", path, threads, threads > 1 ? "s" : "");
    for (int i = 0; i < n; i++) {
        double cpu, wall;
        if (measure(&loops[i], threads, &cpu, &wall, &checksum)) return 1;
        printf(" %s%s %.4f (%.4f)", loops[i].name, loops[i].in_ceiling ? "" : " [not in the path's target]", cpu, wall);
        if (loops[i].in_ceiling && cpu > best) best = cpu;
    }
    printf("; checksum %016llx, every count equal to a scalar count\n%.4f\n", (unsigned long long)checksum, best);
    return 0;
}
