/* The popcount ceiling of this CPU: and + vpopcntq + add on L1-resident words, one OpenMP thread
 * per core. bench_counts.py compiles and runs it (gcc -O3 -march=native -fopenmp) and takes the
 * last line: the faster of two loop shapes, in binary MACs/s (one MAC = one bit of x AND w).
 *
 * - "broadcast": the GEMM tile's shape, one weight vector against 16 broadcast input words,
 *   16 accumulators (a load per popcount).
 * - "registers": eight weight vectors held in registers against one loaded input vector, eight
 *   accumulators (a load per eight popcounts). On the Xeon development host this shape ran
 *   10-15% faster than the first (2.7-2.85 against 2.35-2.5 T on 2 cores): the and, popcount and
 *   add share two vector ports, and fewer loads leave them busier. The ceiling is the faster. */
#include <immintrin.h>
#include <omp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#define ITERS 4000000L

/* One thread's loop of each shape; returns a checksum so that the loop is not optimized away. */
static uint64_t broadcast_shape(void) {
    uint64_t w[64 * 8] __attribute__((aligned(64)));
    uint64_t x[64 * 16] __attribute__((aligned(64)));
    for (int i = 0; i < 64 * 8; i++) w[i] = 0x9E3779B97F4A7C15ull * (i + 1 + omp_get_thread_num());
    for (int i = 0; i < 64 * 16; i++) x[i] = 0xD1B54A32D192ED03ull * (i + 7);
    __m512i acc[16];
    for (int p = 0; p < 16; p++) acc[p] = _mm512_setzero_si512();
    for (long it = 0; it < ITERS; it++) {
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
#define BROADCAST_MACS ((double)ITERS * 16 * 512)

static uint64_t register_shape(void) {
    __m512i x[64] __attribute__((aligned(64)));
    for (int i = 0; i < 64; i++) x[i] = _mm512_set1_epi64(0xD1B54A32D192ED03ull * (i + 7));
    __m512i w[8], acc[8];
    for (int j = 0; j < 8; j++) {
        w[j] = _mm512_set1_epi64(0x9E3779B97F4A7C15ull * (j + 1 + omp_get_thread_num()));
        acc[j] = _mm512_setzero_si512();
    }
    for (long it = 0; it < 2 * ITERS; it++) {
        __m512i xv = _mm512_load_si512(&x[it & 63]);
#pragma GCC unroll 8
        for (int j = 0; j < 8; j++) acc[j] = _mm512_add_epi64(acc[j], _mm512_popcnt_epi64(_mm512_and_si512(xv, w[j])));
    }
    uint64_t sink = 0;
    for (int j = 0; j < 8; j++) sink += _mm512_reduce_add_epi64(acc[j]);
    return sink;
}
#define REGISTER_MACS ((double)2 * ITERS * 8 * 512)

/* T binary MACs/s of `loop` on `threads` threads: the best of five runs. */
static double tera_macs(int threads, uint64_t (*loop)(void), double macs_per_thread) {
    double best = 1e30;
    for (int rep = 0; rep < 5; rep++) {
        double t0 = omp_get_wtime();
        uint64_t sink = 0;
#pragma omp parallel num_threads(threads) reduction(+ : sink)
        sink += loop();
        double t = omp_get_wtime() - t0;
        if (t < best) best = t;
        if (sink == 42) printf("#");
    }
    return macs_per_thread * threads / best / 1e12;
}

int main(int argc, char **argv) {
    int threads = argc > 1 ? atoi(argv[1]) : 1;
    double broadcast = tera_macs(threads, broadcast_shape, BROADCAST_MACS);
    double registers = tera_macs(threads, register_shape, REGISTER_MACS);
    printf("broadcast %.4f registers %.4f\n", broadcast, registers);
    printf("%.4f\n", broadcast > registers ? broadcast : registers);
    return 0;
}
