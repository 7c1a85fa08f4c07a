/* The popcount ceiling of this CPU: and + vpopcntq + add on L1-resident words, 16 independent
 * 512-bit accumulators per thread, one OpenMP thread per core. bench_counts.py compiles and runs
 * it (gcc -O3 -march=native -fopenmp) and prints binary MACs/s (one MAC = one bit of x AND w). */
#include <immintrin.h>
#include <omp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

int main(int argc, char **argv) {
    int threads = argc > 1 ? atoi(argv[1]) : 1;
    long iters = 4000000;
    double best = 1e30;
    for (int rep = 0; rep < 5; rep++) {
        double t0 = omp_get_wtime();
        uint64_t sink = 0;
#pragma omp parallel num_threads(threads) reduction(+ : sink)
        {
            uint64_t w[64 * 8] __attribute__((aligned(64)));
            uint64_t x[64 * 16] __attribute__((aligned(64)));
            for (int i = 0; i < 64 * 8; i++) w[i] = 0x9E3779B97F4A7C15ull * (i + 1 + omp_get_thread_num());
            for (int i = 0; i < 64 * 16; i++) x[i] = 0xD1B54A32D192ED03ull * (i + 7);
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
            for (int p = 0; p < 16; p++) sink += _mm512_reduce_add_epi64(acc[p]);
        }
        double t = omp_get_wtime() - t0;
        if (t < best) best = t;
        if (sink == 42) printf("#");
    }
    printf("%.4f\n", (double)iters * 16 * 512 * threads / best / 1e12);
    return 0;
}
