// Host emulation of kernels/ensemble.cu's forward lane partials (tests/test_ensemble_variants.py).
//
// Compiled with g++ (no GPU): the CUDA built-ins the included functions use are
// stood in for by IEEE float operations below, so both paths see the same
// arithmetic. It checks that lig_ens_lane_partials_fitted (the batched forward of
// LIG_ENS_FORWARD_DEPTH > 0, through its fewer-rows paths) gives every stored
// row's lane partial bit for bit as lig_ens_lane_partials (the member loop of
// depth 0), over shapes, padded strides, group counts, R and D: that the batching
// changes only which loads are in flight together, never an operation or its order.
// Build with -DLIG_ENS_ONE_DTYPE -DLIG_ENS_DTYPE_f32 -DLIG_ENS_LEAN=0.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <math.h>
#include <random>
#include <vector>

#define __device__
#define __forceinline__ inline
#define __global__
#define __launch_bounds__(...)
#define __align__(n) alignas(n)
#define __shared__ static
struct lig_dim3 { unsigned x, y, z; };
static lig_dim3 threadIdx, blockIdx, blockDim, gridDim;
inline float __fadd_rn(float a, float b) { volatile float r = a + b; return r; }
inline float __fmul_rn(float a, float b) { volatile float r = a * b; return r; }
inline float __fdiv_rn(float a, float b) { volatile float r = a / b; return r; }
inline float __frcp_rn(float a) { volatile float r = 1.0f / a; return r; }
inline float __fmaf_rn(float a, float b, float c) { return std::fma(a, b, c); }
inline float __expf(float x) { return std::exp(x); }
inline float __fdividef(float a, float b) { return a / b; }
inline float __uint_as_float(unsigned u) { float f; std::memcpy(&f, &u, 4); return f; }
inline float __shfl_down_sync(unsigned, float v, int, int = 32) { return v; }
inline void __syncthreads() {}
inline void __threadfence() {}
inline unsigned atomicAdd(unsigned* p, unsigned v) { unsigned o = *p; *p += v; return o; }

#include "ensemble.cu"

static int group_size(int m) { int g = 1; while (g < m) g <<= 1; return g < 32 ? g : 32; }

static void fail(const char* what, int R, int D, int rows, int members, int K, long long first, int lane, int r) {
    std::printf("MISMATCH (%s) R=%d D=%d rows=%d M=%d K=%d first=%lld lane=%d r=%d\n", what, R, D, rows, members, K, first, lane, r);
    std::exit(1);
}

template <int R, int D>
static long check(int rows, int members, int K, int pad, int count, std::mt19937& gen) {
    const long long stride_member = K + pad, stride_row = members * stride_member + pad;
    std::vector<float> logits(rows * stride_row + 8, NAN);  // padding is NaN: reading it would show
    std::normal_distribution<float> normal(0.f, 4.f);
    for (int b = 0; b < rows; ++b)
        for (int m = 0; m < members; ++m)
            for (int k = 0; k < K; ++k) logits[b * stride_row + m * stride_member + k] = normal(gen);
    std::vector<float> w(members);
    for (auto& v : w) v = normal(gen);
    const int G = group_size(members);
    const lig_ens_divisor per_k(K);
    long compared = 0;
    for (long long first = 0; first < rows + 2 * count; ++first) {
        int active = 0;
        for (int r = 0; r < R; ++r) active += first + r * count < rows;
        for (int lane = 0; lane < G; ++lane) {
            float loop[R], batched[R];
            lig_ens_lane_partials<lig_f32_tag, R>(logits.data(), w.data(), first, count, rows, lane, members, K,
                                                  stride_row, stride_member, 1, G, 1, per_k, loop);
            lig_ens_lane_partials_fitted<lig_f32_tag, R, D>(logits.data(), w.data(), first, count, active, lane,
                                                            members, K, stride_row, stride_member, G, per_k, batched);
            for (int r = 0; r < active; ++r, ++compared)
                if (std::memcmp(&loop[r], &batched[r], 4) != 0) fail("partial", R, D, rows, members, K, first, lane, r);
            if (active == 0 && batched[0] != 0.0f) fail("no row", R, D, rows, members, K, first, lane, 0);
        }
    }
    return compared;
}

template <int R, int D>
static long sweep(std::mt19937& gen) {
    const int shapes[][3] = {{1, 1, 4}, {7, 3, 4}, {13, 64, 4}, {9, 32, 16}, {5, 33, 8},
                             {11, 100, 4}, {6, 7, 12}, {3, 2, 1000}, {10, 40, 20}};
    long n = 0;
    for (auto& s : shapes)
        for (int pad : {0, 4})
            for (int count : {1, 3, 5}) n += check<R, D>(s[0], s[1], s[2], pad, count, gen);
    return n;
}

int main() {
    std::mt19937 gen(1234);
    long n = 0;
    n += sweep<1, 1>(gen) + sweep<1, 3>(gen) + sweep<1, 4>(gen);
    n += sweep<2, 1>(gen) + sweep<2, 2>(gen) + sweep<2, 4>(gen);
    n += sweep<3, 1>(gen) + sweep<3, 2>(gen);
    n += sweep<4, 1>(gen) + sweep<4, 2>(gen) + sweep<5, 2>(gen) + sweep<6, 2>(gen) + sweep<8, 1>(gen);
    std::printf("ok: %ld lane partials bit-identical\n", n);
    return 0;
}
