// Integrated Gradients kernels: path interpolation, finite-difference probes,
// central-difference gradients, the attribution accumulation and completeness.
//
// Every kernel has a plain-torch twin in lightning_ig/ops/ig.py (the `_*_torch`
// functions beside their launchers) that performs the same operations in the
// same order with the same rounding, so the two agree bit for bit. Arithmetic
// uses the explicitly rounded intrinsics (__fadd_rn, __fmul_rn, ...) so the
// compiler cannot contract a multiply and an add into an FMA, which torch's
// separate elementwise ops never do.
//
// Storage types: float (f32), IEEE half (f16), bfloat16 (bf16) and double
// (f64). Half types are loaded into float and every sum runs in float (double
// for f64). There are no atomics: each output element is produced by one
// thread, and sums over quadrature steps run in step order within blocks of
// LIG_SUM_STEPS steps, whose partial sums are then added in order.
//
// Layouts (row-major, all contiguous unless a stride is passed); c = end_copies, 0, 1 or 2:
//   x, b      (B, F)                     inputs and baselines, F = features per state
//   alphas    (n_steps,)                 path positions, accumulate type
//   points    (n_steps + 2 c, B, F)      the path points, then c pairs of ends: x, b (, x, b)
//   h         (B, F)                     finite-difference step per state and feature
//   probes    (P, 2, F, F)               point p, sign s (0: +h, 1: -h), feature i, value j
//   f         (P, 2, F, T)               forward values of the probes for T targets
//   grads     (T, n_steps, B, F)         gradients along the path, accumulate type
//   attr      (T, B, F)                  attributions, storage type
//   ends      (2 c, B, T)                forward values at the ends, accumulate type: F(x) (0), F(b) (1) and, with
//                                        c = 2, F(x) (2) and F(b) (3) again: the stochastic-forward check
//   stats     (7, T, B)                  f_input, f_baseline, delta, relative error, degenerate (0/1),
//                                        non-finite (0/1), repeat differs (0/1; always 0 with c = 1)
#include "common.cuh"

struct lig_f64_tag {};

// Storage and accumulate types per tag, with exactly rounded arithmetic.
template <typename Tag> struct ig_traits {
    typedef typename lig_storage<Tag>::type T;
    typedef float Acc;
    static __device__ __forceinline__ float load(T v) { return lig_storage<Tag>::load(v); }
    static __device__ __forceinline__ T store(float v) { return lig_storage<Tag>::store(v); }
};
template <> struct ig_traits<lig_f64_tag> {
    typedef double T;
    typedef double Acc;
    static __device__ __forceinline__ double load(double v) { return v; }
    static __device__ __forceinline__ double store(double v) { return v; }
};

__device__ __forceinline__ float ig_add(float a, float b) { return __fadd_rn(a, b); }
__device__ __forceinline__ float ig_sub(float a, float b) { return __fsub_rn(a, b); }
__device__ __forceinline__ float ig_mul(float a, float b) { return __fmul_rn(a, b); }
__device__ __forceinline__ float ig_div(float a, float b) { return __fdiv_rn(a, b); }
__device__ __forceinline__ double ig_add(double a, double b) { return __dadd_rn(a, b); }
__device__ __forceinline__ double ig_sub(double a, double b) { return __dsub_rn(a, b); }
__device__ __forceinline__ double ig_mul(double a, double b) { return __dmul_rn(a, b); }
__device__ __forceinline__ double ig_div(double a, double b) { return __ddiv_rn(a, b); }

// (a) points[k, j] = b[j] + alphas[k] * (x[j] - b[j]) for k < n_steps, then
// end_copies pairs of ends: points[n_steps + 2c] = x and points[n_steps + 2c + 1]
// = b, copied bit for bit so the forward values at the ends are F(x) and F(b)
// exactly (a second pair lets one forward check that it repeats its values).
template <typename Tag>
__device__ __forceinline__ void ig_interpolate(const typename ig_traits<Tag>::T* __restrict__ x,
                                               const typename ig_traits<Tag>::T* __restrict__ b,
                                               const typename ig_traits<Tag>::Acc* __restrict__ alphas,
                                               typename ig_traits<Tag>::T* __restrict__ points,
                                               long long n_steps, long long row_numel, int end_copies) {
    typedef ig_traits<Tag> tr;
    const long long total = (n_steps + 2LL * end_copies) * row_numel;
    for (long long idx = lig_first_index(); idx < total; idx += lig_grid_stride()) {
        const long long k = idx / row_numel;
        const long long j = idx - k * row_numel;
        if (k < n_steps) {
            const typename tr::Acc xv = tr::load(x[j]);
            const typename tr::Acc bv = tr::load(b[j]);
            points[idx] = tr::store(ig_add(bv, ig_mul(alphas[k], ig_sub(xv, bv))));
        } else if (((k - n_steps) & 1) == 0) {
            points[idx] = x[j];
        } else {
            points[idx] = b[j];
        }
    }
}

// (b) probes[p, s, i, j] = points[p, j] + (i == j ? (s == 0 ? h : -h) : 0) for
// the n_points path points starting at global point index point_offset; the
// state of point g is g % B (points are laid out (n_steps, B)).
template <typename Tag>
__device__ __forceinline__ void ig_fd_probes(const typename ig_traits<Tag>::T* __restrict__ points,
                                             const typename ig_traits<Tag>::Acc* __restrict__ h,
                                             typename ig_traits<Tag>::T* __restrict__ probes,
                                             long long n_points, int features, int batch,
                                             long long point_offset) {
    typedef ig_traits<Tag> tr;
    const long long F = features;
    const long long total = n_points * 2 * F * F;
    for (long long idx = lig_first_index(); idx < total; idx += lig_grid_stride()) {
        const long long j = idx % F;
        long long rest = idx / F;
        const long long i = rest % F;
        rest /= F;
        const int sign = static_cast<int>(rest & 1);
        const long long p = rest >> 1;
        const typename tr::T value = points[p * F + j];
        if (i != j) {
            probes[idx] = value;
        } else {
            const long long state = (point_offset + p) % batch;
            const typename tr::Acc step = h[state * F + i];
            const typename tr::Acc v = tr::load(value);
            probes[idx] = tr::store(sign == 0 ? ig_add(v, step) : ig_sub(v, step));
        }
    }
}

// (c) grads[t, p, i] = (f[p, 0, i, t] - f[p, 1, i, t]) / (p_i^+ - p_i^-), where
// p_i^+/- are the probe coordinates as stored (rounded to the storage type), so
// the divisor is the step the forward really saw. A step that rounds away
// (p^+ == p^-) gives 0. grads_target_stride is the distance between targets in
// the output, which lets a chunk write straight into the (T, n_steps * B, F) buffer.
template <typename Tag>
__device__ __forceinline__ void ig_fd_gradient(const typename ig_traits<Tag>::T* __restrict__ points,
                                               const typename ig_traits<Tag>::Acc* __restrict__ h,
                                               const typename ig_traits<Tag>::Acc* __restrict__ f,
                                               typename ig_traits<Tag>::Acc* __restrict__ grads,
                                               long long n_points, int features, int batch, int n_targets,
                                               long long point_offset, long long grads_target_stride) {
    typedef ig_traits<Tag> tr;
    typedef typename tr::Acc Acc;
    const long long F = features;
    const long long total = static_cast<long long>(n_targets) * n_points * F;
    for (long long idx = lig_first_index(); idx < total; idx += lig_grid_stride()) {
        const long long i = idx % F;
        const long long rest = idx / F;
        const long long p = rest % n_points;
        const long long t = rest / n_points;
        const long long state = (point_offset + p) % batch;
        const Acc step = h[state * F + i];
        const Acc v = tr::load(points[p * F + i]);
        const Acc plus = tr::load(tr::store(ig_add(v, step)));
        const Acc minus = tr::load(tr::store(ig_sub(v, step)));
        const Acc denominator = ig_sub(plus, minus);
        const Acc f_plus = f[((p * 2 + 0) * F + i) * n_targets + t];
        const Acc f_minus = f[((p * 2 + 1) * F + i) * n_targets + t];
        grads[t * grads_target_stride + p * F + i] =
            denominator != Acc(0) ? ig_div(ig_sub(f_plus, f_minus), denominator) : Acc(0);
    }
}

// (d) attr[t, j] = (x[j] - b[j]) * sum_k w[t, k, s] * grads[t, k, j] (s = j / features: the state), the sum
// taken by one thread in step order within blocks of LIG_SUM_STEPS steps, then over the blocks' partial sums in
// order: deterministic, no atomics, and the rounding grows with n / 256 + 256 steps instead of n (at 65,536 steps a
// plain float sum was less accurate than at 4,096). The weights are read through strides: (0, 1, 0) for one weight
// per step, (n_steps B, B, 1) for one per step and state.
#define LIG_SUM_STEPS 256
template <typename Tag>
__device__ __forceinline__ void ig_accumulate(const typename ig_traits<Tag>::T* __restrict__ x,
                                              const typename ig_traits<Tag>::T* __restrict__ b,
                                              const typename ig_traits<Tag>::Acc* __restrict__ weights,
                                              const typename ig_traits<Tag>::Acc* __restrict__ grads,
                                              typename ig_traits<Tag>::T* __restrict__ attr,
                                              int n_steps, long long row_numel, int n_targets, long long features,
                                              long long w_target, long long w_step, long long w_state) {
    typedef ig_traits<Tag> tr;
    typedef typename tr::Acc Acc;
    const long long total = static_cast<long long>(n_targets) * row_numel;
    for (long long idx = lig_first_index(); idx < total; idx += lig_grid_stride()) {
        const long long t = idx / row_numel;
        const long long j = idx - t * row_numel;
        const Acc* g = grads + t * static_cast<long long>(n_steps) * row_numel + j;
        const Acc* w = weights + t * w_target + (j / features) * w_state;
        Acc sum = Acc(0);
        for (int first = 0; first < n_steps; first += LIG_SUM_STEPS) {
            const int last = n_steps - first < LIG_SUM_STEPS ? n_steps : first + LIG_SUM_STEPS;
            Acc part = Acc(0);
            for (int k = first; k < last; ++k) part = ig_add(part, ig_mul(w[k * w_step], g[k * row_numel]));
            sum = ig_add(sum, part);  // 0 + part is part, bit for bit: part, summed from +0, is never -0
        }
        attr[idx] = tr::store(ig_mul(ig_sub(tr::load(x[j]), tr::load(b[j])), sum));
    }
}

__device__ __forceinline__ float ig_nan(float) { return __int_as_float(0x7fc00000); }
__device__ __forceinline__ double ig_nan(double) { return __longlong_as_double(0x7ff8000000000000LL); }
__device__ __forceinline__ float ig_inf(float) { return __int_as_float(0x7f800000); }
__device__ __forceinline__ double ig_inf(double) { return __longlong_as_double(0x7ff0000000000000LL); }
__device__ __forceinline__ float ig_abs(float v) { return fabsf(v); }
__device__ __forceinline__ double ig_abs(double v) { return fabs(v); }
__device__ __forceinline__ float ig_max(float a, float b) { return fmaxf(a, b); }
__device__ __forceinline__ double ig_max(double a, double b) { return fmax(a, b); }
// Finite: neither NaN (every comparison fails) nor +/-Inf (above the largest finite value).
__device__ __forceinline__ bool ig_finite(float v) { return fabsf(v) <= 3.40282346638528859812e+38f; }
__device__ __forceinline__ bool ig_finite(double v) { return fabs(v) <= 1.79769313486231570815e+308; }

// Whether a second evaluation `again` of a forward value `first` differs from it: NaN against a number, or
// |again - first| > tolerance * max(1, |first|, |again|) (a NaN difference, of one infinity twice, never is).
template <typename Acc>
__device__ __forceinline__ bool ig_repeat_differs(Acc first, Acc again, Acc tolerance) {
    const Acc scale = ig_max(ig_max(ig_abs(first), ig_abs(again)), Acc(1));
    return (first != first) != (again != again) || ig_abs(ig_sub(again, first)) > ig_mul(tolerance, scale);
}

// (e) completeness per (target t, state s), one warp each: the sum of the
// attributions over the F features (lane-strided partial sums, then a fixed
// shuffle tree; the twin sums in this order too), delta = sum - (F(x) - F(b)),
// and what the state is:
//   non-finite  F(x), F(b) or delta is NaN/Inf (an attribution NaN/Inf makes the sum, and so delta, so):
//               relative error +Inf, never a clean score;
//   degenerate  finite and |F(x) - F(b)| <= threshold * max(1, |F(x)|, |F(b)|): too small for a ratio,
//               relative error NaN;
//   checked     otherwise: relative error |delta| / |F(x) - F(b)|.
// With end_copies == 2, ends holds a second evaluation of F(x) and F(b) (rows 2B..4B) and the last row of
// stats is 1 where either differs from the first: NaN against a number, or by more than
// repeat_threshold * max(1, |first|, |second|) (NaN twice, or one infinity twice, agree); else 0.
// Launched with blockDim.x a multiple of 32; warps past the last row exit.
template <typename Tag>
__device__ __forceinline__ void ig_completeness(const typename ig_traits<Tag>::T* __restrict__ attr,
                                                const typename ig_traits<Tag>::Acc* __restrict__ ends,
                                                typename ig_traits<Tag>::Acc* __restrict__ stats,
                                                int batch, long long features, int n_targets, double threshold,
                                                int end_copies, double repeat_threshold) {
    typedef ig_traits<Tag> tr;
    typedef typename tr::Acc Acc;
    const long long rows = static_cast<long long>(n_targets) * batch;
    const int lane = threadIdx.x & 31;
    const long long warps = lig_grid_stride() >> 5;
    for (long long row = lig_first_index() >> 5; row < rows; row += warps) {
        const long long t = row / batch;
        const long long s = row - t * batch;
        const typename tr::T* a = attr + row * features;
        Acc partial = Acc(0);
        for (long long j = lane; j < features; j += 32) partial = ig_add(partial, tr::load(a[j]));
        const Acc total = lig_warp_sum(partial);
        if (lane == 0) {
            const Acc f_input = ends[s * n_targets + t];
            const Acc f_baseline = ends[(static_cast<long long>(batch) + s) * n_targets + t];
            const Acc difference = ig_sub(f_input, f_baseline);
            const Acc delta = ig_sub(total, difference);
            const Acc scale = ig_max(ig_max(ig_abs(f_input), ig_abs(f_baseline)), Acc(1));
            const bool non_finite = !(ig_finite(f_input) && ig_finite(f_baseline) && ig_finite(delta));
            const bool degenerate = !non_finite && ig_abs(difference) <= ig_mul(static_cast<Acc>(threshold), scale);
            stats[0 * rows + row] = f_input;
            stats[1 * rows + row] = f_baseline;
            stats[2 * rows + row] = delta;
            stats[3 * rows + row] = non_finite   ? ig_inf(Acc(0))
                                    : degenerate ? ig_nan(Acc(0))
                                                 : ig_div(ig_abs(delta), ig_abs(difference));
            stats[4 * rows + row] = degenerate ? Acc(1) : Acc(0);
            stats[5 * rows + row] = non_finite ? Acc(1) : Acc(0);
            bool differs = false;
            if (end_copies == 2) {
                const Acc* again = ends + 2LL * batch * n_targets;
                const Acc tolerance = static_cast<Acc>(repeat_threshold);
                differs = ig_repeat_differs(f_input, again[s * n_targets + t], tolerance) ||
                          ig_repeat_differs(f_baseline, again[(static_cast<long long>(batch) + s) * n_targets + t],
                                            tolerance);
            }
            stats[6 * rows + row] = differs ? Acc(1) : Acc(0);
        }
    }
}

#define IG_ENTRY_POINTS(SUFFIX, TAG)                                                                      \
    extern "C" __global__ void ig_interpolate_##SUFFIX(                                                   \
        const ig_traits<TAG>::T* x, const ig_traits<TAG>::T* b, const ig_traits<TAG>::Acc* alphas,        \
        ig_traits<TAG>::T* points, long long n_steps, long long row_numel, int end_copies) {              \
        ig_interpolate<TAG>(x, b, alphas, points, n_steps, row_numel, end_copies);                        \
    }                                                                                                     \
    extern "C" __global__ void ig_fd_probes_##SUFFIX(const ig_traits<TAG>::T* points,                     \
                                                     const ig_traits<TAG>::Acc* h, ig_traits<TAG>::T* probes, \
                                                     long long n_points, int features, int batch,         \
                                                     long long point_offset) {                            \
        ig_fd_probes<TAG>(points, h, probes, n_points, features, batch, point_offset);                    \
    }                                                                                                     \
    extern "C" __global__ void ig_fd_gradient_##SUFFIX(                                                   \
        const ig_traits<TAG>::T* points, const ig_traits<TAG>::Acc* h, const ig_traits<TAG>::Acc* f,      \
        ig_traits<TAG>::Acc* grads, long long n_points, int features, int batch, int n_targets,           \
        long long point_offset, long long grads_target_stride) {                                          \
        ig_fd_gradient<TAG>(points, h, f, grads, n_points, features, batch, n_targets, point_offset,      \
                            grads_target_stride);                                                         \
    }                                                                                                     \
    extern "C" __global__ void ig_accumulate_##SUFFIX(                                                    \
        const ig_traits<TAG>::T* x, const ig_traits<TAG>::T* b, const ig_traits<TAG>::Acc* weights,       \
        const ig_traits<TAG>::Acc* grads, ig_traits<TAG>::T* attr, int n_steps, long long row_numel,      \
        int n_targets, long long features, long long w_target, long long w_step, long long w_state) {      \
        ig_accumulate<TAG>(x, b, weights, grads, attr, n_steps, row_numel, n_targets, features, w_target,  \
                           w_step, w_state);                                                              \
    }                                                                                                     \
    extern "C" __global__ void ig_completeness_##SUFFIX(const ig_traits<TAG>::T* attr,                    \
                                                        const ig_traits<TAG>::Acc* ends,                  \
                                                        ig_traits<TAG>::Acc* stats, int batch,            \
                                                        long long features, int n_targets, double threshold, \
                                                        int end_copies, double repeat_threshold) {        \
        ig_completeness<TAG>(attr, ends, stats, batch, features, n_targets, threshold, end_copies,        \
                             repeat_threshold);                                                           \
    }

IG_ENTRY_POINTS(f32, lig_f32_tag)
IG_ENTRY_POINTS(f16, lig_f16_tag)
IG_ENTRY_POINTS(bf16, lig_bf16_tag)
IG_ENTRY_POINTS(f64, lig_f64_tag)
