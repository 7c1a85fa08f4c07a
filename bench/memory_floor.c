/* The memory part of counts_conv2d's floor on this machine (README, "Benchmarks").
 *
 *     gcc -O3 -march=native -fopenmp bench/memory_floor.c -o /tmp/memory_floor && /tmp/memory_floor
 *
 * The API at 256 channels 8x8, batch 64, must write four int64 outputs (32 MB) and read its
 * float32 input and weights (6.6 MB) once. This times those bytes alone, on 1 and 2 threads:
 * streaming (non-temporal) 64-byte stores, as the fused kernel writes, ``rep movsb`` (faster on
 * its own, slower inside the kernel: see the README), and a vector read of floats that were read
 * before (in cache as far as it holds them, as in a loop of calls). Best of 30 runs each. */
#include <immintrin.h>
#include <omp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define OUT_BYTES ((size_t)32 << 20)
#define IN_BYTES ((size_t)6912 << 10) /* 64x256x8x8 + 256x256x3x3 float32 */
#define RUNS 30

enum { STREAM, MOVSB, READ };

static char *out;
static float *in;

static void run(int kind, int threads, float *sink) {
#pragma omp parallel num_threads(threads)
    {
        int t = omp_get_thread_num();
        if (kind == READ) {
            size_t n = IN_BYTES / 4, lo = n * t / threads / 16 * 16, hi = n * (t + 1) / threads / 16 * 16;
            __m512 s = _mm512_setzero_ps();
            for (size_t i = lo; i < hi; i += 16) s = _mm512_add_ps(s, _mm512_load_ps(in + i));
            sink[t * 16] = _mm512_reduce_add_ps(s);
        } else {
            char src[4096] __attribute__((aligned(64)));
            memset(src, t + 1, sizeof src);
            size_t lo = OUT_BYTES * t / threads, hi = OUT_BYTES * (t + 1) / threads;
            for (size_t i = lo; i < hi; i += sizeof src) {
                if (kind == STREAM) {
                    for (size_t j = 0; j < sizeof src; j += 64)
                        _mm512_stream_si512((void *)(out + i + j), _mm512_load_si512(src + j));
                } else {
                    void *d = out + i;
                    const void *s = src;
                    size_t n = sizeof src;
                    __asm__ volatile("rep movsb" : "+D"(d), "+S"(s), "+c"(n) : : "memory");
                }
            }
            _mm_sfence();
        }
    }
}

static double best_ms(int kind, int threads) {
    float sink[64];
    double best = 1e9;
    for (int r = 0; r < RUNS; r++) {
        double t0 = omp_get_wtime();
        run(kind, threads, sink);
        double t = omp_get_wtime() - t0;
        if (t < best) best = t;
    }
    return best * 1e3;
}

int main(void) {
    out = aligned_alloc(4096, OUT_BYTES);
    in = aligned_alloc(4096, IN_BYTES);
    memset(out, 0, OUT_BYTES);
    for (size_t i = 0; i < IN_BYTES / 4; i++) in[i] = (i & 1) ? 1.0f : -1.0f;
    char model[256] = "unknown CPU";
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (f) {
        char line[512];
        while (fgets(line, sizeof line, f))
            if (!strncmp(line, "model name", 10)) {
                char *colon = strchr(line, ':');
                snprintf(model, sizeof model, "%.200s", colon ? colon + 2 : line);
                model[strcspn(model, "\n")] = 0;
                break;
            }
        fclose(f);
    }
    printf("# %s, %d cores; best of %d runs\n", model, omp_get_num_procs(), RUNS);
    printf("%-40s | %9s | %9s | %9s | %9s\n", "bytes", "1 thread", "GB/s", "2 threads", "GB/s");
    const char *names[] = {"write 32 MB, streaming 64-byte stores", "write 32 MB, rep movsb", "read 6.75 MB of float32"};
    size_t sizes[] = {OUT_BYTES, OUT_BYTES, IN_BYTES};
    for (int kind = STREAM; kind <= READ; kind++) {
        double one = best_ms(kind, 1), two = best_ms(kind, 2);
        printf("%-40s | %6.3f ms | %9.1f | %6.3f ms | %9.1f\n", names[kind], one, sizes[kind] / one / 1e6, two,
               sizes[kind] / two / 1e6);
    }
    return 0;
}
