// Fused, numerically stable soft-margin loss: loss_i = log(1 + exp(-y_i x_i)).
//
// Every value is computed in the stable form
//     z = -y x,   e = exp(-|z|) in (0, 1],   loss = max(z, 0) + log1p(e),
//     sigmoid(z) = 1 / (1 + e) for z >= 0,  e / (1 + e) for z < 0,
// so nothing overflows for finite inputs. The plain-torch twin is
// lightning_ig.losses._soft_margin_torch.
//
// Entry points (<sfx> is f32, f16 or bf16; every pointer is a contiguous torch
// tensor of the storage type except `partials` (double[grid]) and `counter`
// (one unsigned int)):
//   soft_margin_reduce_<sfx>       mean/sum in ONE launch, loss only
//   soft_margin_reduce_grad_<sfx>  the same pass also writes dL/dx = -y sigmoid(z) / divisor
//   soft_margin_none_<sfx>         elementwise loss (reduction="none")
//   soft_margin_none_backward_<sfx> grad = g * (-y sigmoid(z)), g full-size or one scalar
//   soft_margin_scale_<sfx>        grad *= g[0] in place, read on the device; nothing when g[0] == 1
//
// Launch contract (lightning_ig/ops/soft_margin.py): blockDim.x == LIG_SM_THREADS, a
// grid of at most LIG_SM_MAX_GRID blocks. The reduction is deterministic: each
// thread sums a fixed set of elements in a fixed order (float32: plain sums
// within an iteration, Kahan-compensated across iterations), the block sums
// its threads' sums in double (warp shuffles, then shared memory), writes that
// partial, and the last block to finish (a __threadfence and an integer ticket;
// no floating-point atomics) sums the partials in index order, in double. The
// order depends only on n and the grid size, so the same input on the same
// device gives bit-identical results.
//
// The ticket counter must be zero before a launch; the last block sets it back
// to zero, so consecutive launches on one stream and CUDA-graph replays reuse
// it. Two launches that could run at the same time (different streams) must
// not share a counter: the launcher keeps one workspace per (device, stream)
// and gives a launch captured into a CUDA graph its own.
//
// Loads are 16 bytes (4 x float) for float32 and 8 bytes (4 x 16 bit) for the
// half types when every pointer involved is aligned to that width; the last
// n % 4 elements (and everything, when unaligned) take the scalar path.
#include "common.cuh"

#define LIG_SM_THREADS 256
#define LIG_SM_MIN_BLOCKS 4
#define LIG_SM_UNROLL 4
#define LIG_SM_MAX_GRID 4096

template <typename Tag>
__device__ __forceinline__ bool lig_sm_aligned(const void* a, const void* b, const void* c, const void* d) {
    const unsigned long long bits = reinterpret_cast<unsigned long long>(a) | reinterpret_cast<unsigned long long>(b) |
                                    reinterpret_cast<unsigned long long>(c) | reinterpret_cast<unsigned long long>(d);
    return (bits & (sizeof(typename lig_vec4<Tag>::type) - 1)) == 0;
}

// log1p(e) for e in [0, 1], as e * P(e) with P a degree-9 minimax fit of
// log1p(e) / e: relative error below 2.2 ulp in float32 (1.3e-7), and half the
// instructions of the library log1pf. The forward must issue fewer than ~50
// instructions per element to keep up with HBM at 8 bytes per element.
__device__ __forceinline__ float lig_sm_log1p_unit(float e) {
    float p = -0.0033381960820406675f;
    p = fmaf(p, e, 0.020274842157959938f);
    p = fmaf(p, e, -0.05775256082415581f);
    p = fmaf(p, e, 0.1068374514579773f);
    p = fmaf(p, e, -0.15352721512317657f);
    p = fmaf(p, e, 0.19692224264144897f);
    p = fmaf(p, e, -0.24957291781902313f);
    p = fmaf(p, e, 0.33330267667770386f);
    p = fmaf(p, e, -0.49999913573265076f);
    p = fmaf(p, e, 1.0f);
    return e * p;
}

// Loss and sigmoid(z) of one element, from one exponential that cannot overflow.
// sigmoid only feeds the gradient, where the approximate division (2 ulp for a
// divisor in [1, 2]) is plenty; the compiler drops it when no gradient is written.
__device__ __forceinline__ void lig_sm_eval(float x, float y, float& loss, float& sigmoid) {
    // explicitly rounded ops: no FMA contraction, so every kernel variant rounds alike
    const float z = __fmul_rn(-y, x);
    const float e = expf(-fabsf(z));
    loss = __fadd_rn(fmaxf(z, 0.0f), lig_sm_log1p_unit(e));
    const float r = __fdividef(1.0f, 1.0f + e);
    sigmoid = z >= 0.0f ? r : e * r;  // NaN input: the comparison fails and e * r is NaN
}

// Kahan-compensated float32 sum. The explicitly rounded adds keep the compiler
// from reassociating the compensation away. An infinite or NaN total carries
// no rounding error (and (inf - inf) would turn an infinite loss into NaN).
struct lig_sm_sum {
    float total;
    float carry;
    __device__ __forceinline__ void add(float value) {
        const float corrected = __fsub_rn(value, carry);
        const float next = __fadd_rn(total, corrected);
        carry = fabsf(next) <= 3.402823466e38f ? __fsub_rn(__fsub_rn(next, total), corrected) : 0.0f;
        total = next;
    }
    __device__ __forceinline__ float value() const { return __fsub_rn(total, carry); }
};

// Block sum in a fixed order; the result is valid in thread 0. `scratch` holds
// one slot per warp; a second call needs a __syncthreads() or its own scratch.
__device__ __forceinline__ double lig_sm_block_sum_double(double v, double* scratch) {
    v = lig_warp_sum(v);
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    if (warp == 0) {
        v = lane < LIG_SM_THREADS / 32 ? scratch[lane] : 0.0;
        v = lig_warp_sum(v);
    }
    return v;
}

// mean/sum: out[0] = sum(loss) / divisor (divisor = n for mean, 1 for sum; for
// n == 0 and mean the launcher passes 0, and 0 / 0 gives torch's NaN). With
// kGrad, grad = -y sigmoid(z) / divisor in the same pass.
template <typename Tag, bool kGrad>
__device__ __forceinline__ void lig_sm_reduce(const typename lig_storage<Tag>::type* __restrict__ x,
                                              const typename lig_storage<Tag>::type* __restrict__ y,
                                              typename lig_storage<Tag>::type* __restrict__ out,
                                              typename lig_storage<Tag>::type* __restrict__ grad,
                                              double* __restrict__ partials, unsigned int* __restrict__ counter,
                                              long long n, double divisor) {
    typedef typename lig_storage<Tag>::type T;
    typedef lig_vec4<Tag> V;
    typedef typename V::type T4;
    const float grad_scale = static_cast<float>(1.0 / divisor);
    const long long first = lig_first_index();
    const long long stride = lig_grid_stride();
    lig_sm_sum sum = {0.0f, 0.0f};

    long long scalar_begin = 0;
    if (lig_sm_aligned<Tag>(x, y, kGrad ? static_cast<const void*>(grad) : x, x)) {
        const long long n_vec = n / 4;
        const T4* xv = reinterpret_cast<const T4*>(x);
        const T4* yv = reinterpret_cast<const T4*>(y);
        T4* gv = reinterpret_cast<T4*>(grad);
        for (long long base = first; base < n_vec; base += stride * LIG_SM_UNROLL) {
            // all loads first, so each thread has LIG_SM_UNROLL x 2 requests in flight
            T4 xr[LIG_SM_UNROLL];
            T4 yr[LIG_SM_UNROLL];
            #pragma unroll
            for (int u = 0; u < LIG_SM_UNROLL; ++u) {
                const long long i = base + u * stride;
                if (i < n_vec) {
                    xr[u] = xv[i];
                    yr[u] = yv[i];
                }
            }
            // this iteration's (up to) 4 x LIG_SM_UNROLL losses in a fixed order, then one
            // compensated add: cheaper than compensating every element
            float chunk = 0.0f;
            #pragma unroll
            for (int u = 0; u < LIG_SM_UNROLL; ++u) {
                const long long i = base + u * stride;
                if (i < n_vec) {
                    float xf[4], yf[4], lf[4], gf[4];
                    V::unpack(xr[u], xf);
                    V::unpack(yr[u], yf);
                    #pragma unroll
                    for (int k = 0; k < 4; ++k) {
                        float sigmoid;
                        lig_sm_eval(xf[k], yf[k], lf[k], sigmoid);
                        gf[k] = -yf[k] * sigmoid * grad_scale;
                    }
                    chunk += (lf[0] + lf[1]) + (lf[2] + lf[3]);
                    if (kGrad) gv[i] = V::pack(gf);
                }
            }
            sum.add(chunk);
        }
        scalar_begin = n_vec * 4;
    }
    for (long long i = scalar_begin + first; i < n; i += stride) {
        float loss, sigmoid;
        const float yf = lig_storage<Tag>::load(y[i]);
        lig_sm_eval(lig_storage<Tag>::load(x[i]), yf, loss, sigmoid);
        sum.add(loss);
        if (kGrad) grad[i] = lig_storage<Tag>::store(-yf * sigmoid * grad_scale);
    }

    // Across threads the sums are in double: a few instructions per thread, and
    // the result's rounding error stays that of the per-thread float32 sums.
    __shared__ double warp_sums[LIG_SM_THREADS / 32];
    __shared__ double warp_sums_last[LIG_SM_THREADS / 32];
    __shared__ bool is_last;
    const double block_total = lig_sm_block_sum_double(static_cast<double>(sum.value()), warp_sums);
    if (threadIdx.x == 0) {
        partials[blockIdx.x] = block_total;
        __threadfence();  // the partial is visible device-wide before this block takes its ticket
        const unsigned int ticket = atomicAdd(counter, 1u);
        is_last = ticket == gridDim.x - 1;
    }
    __syncthreads();
    if (!is_last) return;

    // The last block: every other partial was written before its ticket was
    // taken. Volatile loads bypass L1, which may not be coherent with them.
    __threadfence();
    const volatile double* visible = partials;
    double total = 0.0;
    for (int b = threadIdx.x; b < static_cast<int>(gridDim.x); b += blockDim.x) total += visible[b];
    total = lig_sm_block_sum_double(total, warp_sums_last);
    if (threadIdx.x == 0) {
        out[0] = lig_storage<Tag>::store(static_cast<float>(total / divisor));
        *counter = 0u;  // ready for the next launch on this stream, and for graph replays
    }
}

// reduction="none": loss[i] = max(z, 0) + log1p(exp(-|z|)).
template <typename Tag>
__device__ __forceinline__ void lig_sm_none(const typename lig_storage<Tag>::type* __restrict__ x,
                                            const typename lig_storage<Tag>::type* __restrict__ y,
                                            typename lig_storage<Tag>::type* __restrict__ loss_out, long long n) {
    typedef lig_vec4<Tag> V;
    typedef typename V::type T4;
    const long long first = lig_first_index();
    const long long stride = lig_grid_stride();
    long long scalar_begin = 0;
    if (lig_sm_aligned<Tag>(x, y, loss_out, x)) {
        const long long n_vec = n / 4;
        const T4* xv = reinterpret_cast<const T4*>(x);
        const T4* yv = reinterpret_cast<const T4*>(y);
        T4* lv = reinterpret_cast<T4*>(loss_out);
        for (long long i = first; i < n_vec; i += stride) {
            float xf[4], yf[4], lf[4];
            V::unpack(xv[i], xf);
            V::unpack(yv[i], yf);
            #pragma unroll
            for (int k = 0; k < 4; ++k) {
                float sigmoid;
                lig_sm_eval(xf[k], yf[k], lf[k], sigmoid);
            }
            lv[i] = V::pack(lf);
        }
        scalar_begin = n_vec * 4;
    }
    for (long long i = scalar_begin + first; i < n; i += stride) {
        float loss, sigmoid;
        lig_sm_eval(lig_storage<Tag>::load(x[i]), lig_storage<Tag>::load(y[i]), loss, sigmoid);
        loss_out[i] = lig_storage<Tag>::store(loss);
    }
}

// Backward of reduction="none": grad[i] = g[i] * (-y[i] sigmoid(z_i)). With
// g_is_scalar, g holds one value for every element (an expanded grad_output,
// as `loss.sum().backward()` produces), so it is never materialised.
template <typename Tag>
__device__ __forceinline__ void lig_sm_none_backward(const typename lig_storage<Tag>::type* __restrict__ x,
                                                     const typename lig_storage<Tag>::type* __restrict__ y,
                                                     const typename lig_storage<Tag>::type* __restrict__ g,
                                                     int g_is_scalar,
                                                     typename lig_storage<Tag>::type* __restrict__ grad, long long n) {
    typedef lig_vec4<Tag> V;
    typedef typename V::type T4;
    const long long first = lig_first_index();
    const long long stride = lig_grid_stride();
    const float g_scalar = g_is_scalar ? lig_storage<Tag>::load(g[0]) : 0.0f;
    long long scalar_begin = 0;
    if (lig_sm_aligned<Tag>(x, y, grad, g_is_scalar ? static_cast<const void*>(x) : g)) {
        const long long n_vec = n / 4;
        const T4* xv = reinterpret_cast<const T4*>(x);
        const T4* yv = reinterpret_cast<const T4*>(y);
        const T4* g4 = reinterpret_cast<const T4*>(g);
        T4* out4 = reinterpret_cast<T4*>(grad);
        for (long long i = first; i < n_vec; i += stride) {
            float xf[4], yf[4], gf[4], of[4];
            V::unpack(xv[i], xf);
            V::unpack(yv[i], yf);
            if (g_is_scalar) {
                gf[0] = gf[1] = gf[2] = gf[3] = g_scalar;
            } else {
                V::unpack(g4[i], gf);
            }
            #pragma unroll
            for (int k = 0; k < 4; ++k) {
                float loss, sigmoid;
                lig_sm_eval(xf[k], yf[k], loss, sigmoid);
                of[k] = gf[k] * (-yf[k] * sigmoid);
            }
            out4[i] = V::pack(of);
        }
        scalar_begin = n_vec * 4;
    }
    for (long long i = scalar_begin + first; i < n; i += stride) {
        float loss, sigmoid;
        const float yf = lig_storage<Tag>::load(y[i]);
        lig_sm_eval(lig_storage<Tag>::load(x[i]), yf, loss, sigmoid);
        const float gf = g_is_scalar ? g_scalar : lig_storage<Tag>::load(g[i]);
        grad[i] = lig_storage<Tag>::store(gf * (-yf * sigmoid));
    }
}

// Backward of mean/sum: the forward already wrote dL/dx for grad_output == 1;
// scale it by grad_output, read here so the host never waits for it. When the
// loss is the last op (g == 1, the usual `loss.backward()`), every thread
// returns at once and the backward costs one tiny launch.
template <typename Tag>
__device__ __forceinline__ void lig_sm_scale(typename lig_storage<Tag>::type* __restrict__ grad,
                                             const typename lig_storage<Tag>::type* __restrict__ g, long long n) {
    typedef lig_vec4<Tag> V;
    typedef typename V::type T4;
    const float scale = lig_storage<Tag>::load(g[0]);
    if (scale == 1.0f) return;  // x * 1 == x exactly, NaN payloads included
    const long long first = lig_first_index();
    const long long stride = lig_grid_stride();
    long long scalar_begin = 0;
    if (lig_sm_aligned<Tag>(grad, grad, grad, grad)) {
        const long long n_vec = n / 4;
        T4* gv = reinterpret_cast<T4*>(grad);
        for (long long i = first; i < n_vec; i += stride) {
            float f[4];
            V::unpack(gv[i], f);
            #pragma unroll
            for (int k = 0; k < 4; ++k) f[k] *= scale;
            gv[i] = V::pack(f);
        }
        scalar_begin = n_vec * 4;
    }
    for (long long i = scalar_begin + first; i < n; i += stride) {
        grad[i] = lig_storage<Tag>::store(lig_storage<Tag>::load(grad[i]) * scale);
    }
}

#define LIG_SM_ENTRY_POINTS(SFX, TAG)                                                                              \
    extern "C" __global__ void __launch_bounds__(LIG_SM_THREADS, LIG_SM_MIN_BLOCKS) soft_margin_reduce_##SFX(     \
        const lig_storage<TAG>::type* x, const lig_storage<TAG>::type* y, lig_storage<TAG>::type* out,          \
        double* partials, unsigned int* counter, long long n, double divisor) {                                   \
        lig_sm_reduce<TAG, false>(x, y, out, (lig_storage<TAG>::type*)0, partials, counter, n, divisor);          \
    }                                                                                                            \
    extern "C" __global__ void __launch_bounds__(LIG_SM_THREADS, LIG_SM_MIN_BLOCKS) soft_margin_reduce_grad_##SFX( \
        const lig_storage<TAG>::type* x, const lig_storage<TAG>::type* y, lig_storage<TAG>::type* out,          \
        lig_storage<TAG>::type* grad, double* partials, unsigned int* counter, long long n, double divisor) {     \
        lig_sm_reduce<TAG, true>(x, y, out, grad, partials, counter, n, divisor);                                 \
    }                                                                                                            \
    extern "C" __global__ void __launch_bounds__(LIG_SM_THREADS, LIG_SM_MIN_BLOCKS) soft_margin_none_##SFX(       \
        const lig_storage<TAG>::type* x, const lig_storage<TAG>::type* y, lig_storage<TAG>::type* loss,         \
        long long n) {                                                                                           \
        lig_sm_none<TAG>(x, y, loss, n);                                                                         \
    }                                                                                                            \
    extern "C" __global__ void __launch_bounds__(LIG_SM_THREADS, LIG_SM_MIN_BLOCKS)                              \
        soft_margin_none_backward_##SFX(const lig_storage<TAG>::type* x, const lig_storage<TAG>::type* y,       \
                                        const lig_storage<TAG>::type* g, int g_is_scalar,                       \
                                        lig_storage<TAG>::type* grad, long long n) {                            \
        lig_sm_none_backward<TAG>(x, y, g, g_is_scalar, grad, n);                                                \
    }                                                                                                            \
    extern "C" __global__ void __launch_bounds__(LIG_SM_THREADS, LIG_SM_MIN_BLOCKS) soft_margin_scale_##SFX(      \
        lig_storage<TAG>::type* grad, const lig_storage<TAG>::type* g, long long n) {                           \
        lig_sm_scale<TAG>(grad, g, n);                                                                           \
    }

LIG_SM_ENTRY_POINTS(f32, lig_f32_tag)
LIG_SM_ENTRY_POINTS(f16, lig_f16_tag)
LIG_SM_ENTRY_POINTS(bf16, lig_bf16_tag)
