/* The ceiling of the batch-1 LSTM step (docs/recurrent.md): h @ R^T for hidden 128, R packed as the
 * kernel reads it ([8 column blocks][128 k][4 gates][16 lanes] float32 = 256 KB), one block's 4 gate
 * vectors accumulated per k. Times 32 steps (thread CPU time) with R streamed from L2 in one order,
 * in the kernel's snake order (blocks backward on odd steps, so a step starts on the block still in
 * L1), and with every block reading the same 32 KB (all in L1). Then the input projection alone
 * (32 steps x input 64 x 512 columns, the kernel's 4 x 4 register tile), which runs at the FMA peak.
 *
 *   gcc -O3 -march=native -funroll-loops -o /tmp/recurrent_roofline benchmarks/recurrent_roofline.c && /tmp/recurrent_roofline
 *
 * AVX-512 only (x86-64 with avx512f). Without -funroll-loops GCC keeps the projection's tile in
 * memory and it takes 22 us instead of 18. */
#include <immintrin.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

enum { BLOCKS = 8, HIDDEN = 128, STEPS = 32, INPUT = 64, COLUMNS = 512, REPEATS = 2000 };
enum { PLAIN, SNAKE, ONE_BLOCK };

static float *rec, *win, *xp, x[STEPS * INPUT], h[HIDDEN];

static double thread_seconds(void) {
    struct timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static __attribute__((noinline)) void recurrence(int order) {
    for (int step = 0; step < STEPS; step++) {
        for (int sweep = 0; sweep < BLOCKS; sweep++) {
            int block = (order == SNAKE && step % 2) ? BLOCKS - 1 - sweep : sweep;
            const float *r = rec + (order == ONE_BLOCK ? 0 : block) * HIDDEN * 64;
            __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
            for (int k = 0; k < HIDDEN; k++) {
                __m512 hk = _mm512_set1_ps(h[k]);
                const float *q = r + k * 64;
                a0 = _mm512_fmadd_ps(hk, _mm512_loadu_ps(q), a0);
                a1 = _mm512_fmadd_ps(hk, _mm512_loadu_ps(q + 16), a1);
                a2 = _mm512_fmadd_ps(hk, _mm512_loadu_ps(q + 32), a2);
                a3 = _mm512_fmadd_ps(hk, _mm512_loadu_ps(q + 48), a3);
            }
            /* a stand-in for the gate math: the next step depends on this block's sums */
            __m512 s = _mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3));
            h[block] += _mm512_reduce_add_ps(s) * 1e-30f;
        }
    }
}

static __attribute__((noinline)) void projection(void) {
    for (int tile = 0; tile < COLUMNS / 64; tile++) {
        for (int q0 = 0; q0 < STEPS; q0 += 4) {
            __m512 c[4][4];
            for (int i = 0; i < 4; i++)
                for (int j = 0; j < 4; j++) c[i][j] = _mm512_setzero_ps();
            for (int k = 0; k < INPUT; k++) {
                const float *w = win + (tile * INPUT + k) * 64;
                __m512 w0 = _mm512_loadu_ps(w), w1 = _mm512_loadu_ps(w + 16);
                __m512 w2 = _mm512_loadu_ps(w + 32), w3 = _mm512_loadu_ps(w + 48);
                for (int i = 0; i < 4; i++) {
                    __m512 xi = _mm512_set1_ps(x[(q0 + i) * INPUT + k]);
                    c[i][0] = _mm512_fmadd_ps(xi, w0, c[i][0]);
                    c[i][1] = _mm512_fmadd_ps(xi, w1, c[i][1]);
                    c[i][2] = _mm512_fmadd_ps(xi, w2, c[i][2]);
                    c[i][3] = _mm512_fmadd_ps(xi, w3, c[i][3]);
                }
            }
            for (int i = 0; i < 4; i++)
                for (int j = 0; j < 4; j++) _mm512_storeu_ps(xp + (q0 + i) * COLUMNS + tile * 64 + j * 16, c[i][j]);
        }
    }
}

int main(void) {
    rec = aligned_alloc(64, BLOCKS * HIDDEN * 64 * sizeof(float));
    win = aligned_alloc(64, INPUT * COLUMNS * sizeof(float));
    xp = aligned_alloc(64, STEPS * COLUMNS * sizeof(float));
    for (int i = 0; i < BLOCKS * HIDDEN * 64; i++) rec[i] = (float)(i % 7) * 0.01f;
    for (int i = 0; i < INPUT * COLUMNS; i++) win[i] = 0.001f;
    for (int i = 0; i < STEPS * INPUT; i++) x[i] = 0.1f;
    for (int i = 0; i < HIDDEN; i++) h[i] = 0.5f;
    const char *names[] = {"R from L2, one order", "R from L2, snake order", "R from L1 (timing only)"};
    for (int round = 0; round < 3; round++) {
        for (int order = PLAIN; order <= ONE_BLOCK; order++) {
            double t0 = thread_seconds();
            for (int r = 0; r < REPEATS; r++) recurrence(order);
            double us = (thread_seconds() - t0) * 1e6 / REPEATS;
            printf("recurrence, %-24s %6.1f us per sequence, %.3f us per step (%.0f GB/s of R)\n", names[order], us,
                   us / STEPS, 256.0 * 1024 * STEPS / (us * 1e3));
        }
        double t0 = thread_seconds();
        for (int r = 0; r < REPEATS; r++) projection();
        printf("projection alone                     %6.1f us per sequence\n", (thread_seconds() - t0) * 1e6 / REPEATS);
    }
    return 0;
}
