// Fused ensemble reduce: out[b] = sum_m w[m] * mean_k sigmoid(logits[b, m, k]).
//
// logits is read through strides (stride_row, stride_member, stride_logit, in
// elements), so a (B, K, M) layout or a non-contiguous view needs no copy; the
// torch twin is lightning_ig.ensemble._forward_torch / _backward_torch.
//
// The sigmoid is taken in the stable form
//     e = exp(-|x|) in [0, 1],   r = 1 / (1 + e) in [1/2, 1],
//     sigmoid(x) = r for x >= 0,  e * r for x < 0,   sigmoid'(x) = (e * r) * r,
// so nothing overflows for any input (+/-inf included); NaN stays NaN.
//
// float32 (entry points *_f32): every operation is exactly rounded: expf is
// CUDA's libdevice expf (torch.exp on a CUDA device calls the same function),
// and the rest are __fadd_rn / __fmul_rn / __fdiv_rn / __frcp_rn, which the
// compiler never contracts into an FMA. The twin performs the same operations
// in the same order with torch's elementwise ops, which round alike, so the
// two agree bit for bit on one device. float16/bfloat16 (*_f16, *_bf16): the
// value is loaded into float and everything runs in float32 as above, but with
// the fast intrinsics __expf and __fdividef (a few float32 ulp; the half-type
// output rounding is 2^13 times coarser), which keep the kernel at the memory
// bandwidth at 2 bytes per element.
//
// Work split and reduction order (fixed; no atomics):
//   * a *group* of G lanes (G a power of two <= 32, G = min(32, next_pow2(M)),
//     chosen by the launcher) handles one row at a time; groups take rows in a
//     grid-stride loop;
//   * lane j of a group handles the members m = j, j + G, j + 2G, ... in order;
//     for each it sums sigmoid over k = 0..K-1 sequentially (from 0.0f), takes
//     mean = sum / K and adds w[m] * mean to its partial (from 0.0f);
//   * the G partials are summed by a shuffle tree: offsets G/2, G/4, ..., 1,
//     lane j adding lane j + offset; lane 0 holds the row's value.
// The twin pads M to a multiple of G with zeros (x + 0 == x for every partial,
// which is never -0) and runs the same chunks and the same tree.
//
// Backward (one launch): grad_logits[b, m, k] = (g[b] * w[m] / K) * (e * r) * r,
// written contiguous (B, M, K); and, when asked, grad_weights[m] = sum_b g[b] *
// mean[b, m], accumulated in double from exact products (float * float fits a
// double): per lane over its rows, then per block over its groups in group
// order, then one partial per (block, member); the last block to finish (a
// __threadfence and an integer ticket) sums the partials in block order and
// resets the ticket counter for the next launch or graph replay. The result is
// the exactly rounded float64 sum up to reassociation, rounded once to float.
//
// Launch contract (lightning_ig/ops/ensemble_reduce.py): blockDim.x == LIG_ENS_THREADS,
// any grid >= 1. `vectorized` may be 1 only when stride_logit == 1, K % 4 == 0,
// stride_member and stride_row are multiples of 4, and logits (and, in the
// backward, grad_logits) are aligned to 4 elements: then a member's K logits
// are read (and its gradient written) as 16-byte (float) or 8-byte (half) vectors.
// The backward's `partials` holds gridDim.x * M doubles and `counter` one
// unsigned int that is zero before the launch (the launch leaves it zero).
//
// Tuning knobs (compile-time; the launcher passes them as -D options from its
// variant table in lightning_ig/ops/ensemble_reduce.py). None of them changes a single
// rounding: each row's operations and their order are the ones documented above,
// only the scheduling (which loads are in flight together, how many threads share
// an SM) and the instruction sequences that produce the same bits differ.
//   LIG_ENS_FORWARD_ROWS        rows a forward thread works on at once (R).
//   LIG_ENS_FORWARD_MIN_BLOCKS  the forward's __launch_bounds__ minimum blocks per SM
//                               (its register budget: 65536 / (256 * this)); the
//                               launcher's grid is this many blocks per SM.
//   LIG_ENS_FORWARD_DEPTH       0: the forward reads one 16-byte vector per row of one
//                               member at a time and computes it before the next load.
//                               D > 0 (vectorized layout only): a lane's vectors of a row
//                               (member j: k = 0..K-1 in fours, then member j + G, ...)
//                               are loaded D at a time for all R rows, R * D loads in
//                               flight, before any of them is computed.
//   LIG_ENS_LEAN                1: the float32 reciprocal 1 / (1 + e), whose argument
//                               is in [1, 2] (or NaN), is the fast path of __frcp_rn
//                               written out (MUFU.RCP and one Newton step, the exact
//                               sequence __frcp_rn runs for every normal argument of
//                               moderate size), without the range check and branch to
//                               its slow path; and mean = sum / K becomes sum * (1 / K)
//                               when K is a power of two (1 / K is exact, so both are
//                               the correctly rounded sum / K); and the forward's shuffle
//                               tree is unrolled over offsets 16, 8, ..., 1 (those below G)
//                               with the R rows side by side. Same bits, about half the
//                               instructions per element, no branch per element.
//   LIG_ENS_ONE_DTYPE with LIG_ENS_DTYPE_f32 / _f16 / _bf16: compile only those entry
//                               points (the launcher compiles one dtype at a time).
// The element math is in ensemble_math.cuh, the batched forward in ensemble_batched.cuh.
#include "common.cuh"

#define LIG_ENS_THREADS 256
#define LIG_ENS_MIN_BLOCKS 4  // the backward's; the launcher's grid is this many blocks per SM
// The defaults are the launcher's "baseline" variant: 3 rows, the most whose loads
// fit in 4 blocks' register budget without spilling on sm_80/sm_90 in that layout.
#ifndef LIG_ENS_FORWARD_MIN_BLOCKS
#define LIG_ENS_FORWARD_MIN_BLOCKS LIG_ENS_MIN_BLOCKS
#endif
#ifndef LIG_ENS_FORWARD_ROWS
#define LIG_ENS_FORWARD_ROWS 3
#endif
#ifndef LIG_ENS_FORWARD_DEPTH
#define LIG_ENS_FORWARD_DEPTH 0
#endif
#ifndef LIG_ENS_LEAN
#define LIG_ENS_LEAN 0
#endif
#define LIG_ENS_BACKWARD_ROWS 2

#include "ensemble_math.cuh"

// The group layout shared by both kernels: lane within the group, the global
// group index, the number of groups in the grid, and the group index of the
// warp's first group (groups of one warp move through the rows together, so a
// loop bounded by the first group's row is uniform across the warp).
struct lig_ens_groups {
    int lane;
    long long group;
    long long count;
    long long warp_first;
    __device__ __forceinline__ explicit lig_ens_groups(int group_size) {
        const long long thread = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;
        lane = static_cast<int>(threadIdx.x) & (group_size - 1);
        group = thread / group_size;
        count = static_cast<long long>(gridDim.x) * blockDim.x / group_size;
        warp_first = (thread & ~31LL) / group_size;
    }
};

// R rows of one member at a time: row[r] = first + r * row_step. The
// loads of all rows are issued before any arithmetic, so each thread keeps
// R requests in flight (enough, with 4 blocks of 256 per SM, to
// keep HBM busy). Rows at or past `rows` are skipped (their sums stay 0).
template <typename Tag, int R>
struct lig_ens_rows {
    typedef typename lig_storage<Tag>::type T;
    typedef lig_vec4<Tag> V;
    typedef typename V::type T4;

    const T* member;      // logits[row[0], m, 0]
    long long row_step;   // elements from row[r] to row[r + 1]
    int active;           // rows row[0..active-1] exist (a prefix: rows grow with r)

    __device__ __forceinline__ lig_ens_rows(const T* __restrict__ logits, long long first, long long step_rows,
                                            long long rows, long long stride_row, long long member_offset) {
        const long long left = first < rows ? (rows - 1 - first) / step_rows + 1 : 0;
        active = static_cast<int>(left < R ? left : R);
        row_step = step_rows * stride_row;
        member = logits + (active > 0 ? first * stride_row : 0) + member_offset;
    }

    __device__ __forceinline__ bool is_active(int r) const { return r < active; }

    // Logits k..k+3 of every row as floats (vectorized layout only).
    __device__ __forceinline__ void load4(int k, float (&x)[R][4]) const {
        T4 raw[R];
        #pragma unroll
        for (int r = 0; r < R; ++r) {
            if (r < active) raw[r] = *reinterpret_cast<const T4*>(member + r * row_step + k);
        }
        #pragma unroll
        for (int r = 0; r < R; ++r) {
            if (r < active) {
                V::unpack(raw[r], x[r]);
            } else {
                x[r][0] = x[r][1] = x[r][2] = x[r][3] = 0.0f;
            }
        }
    }

    // Logit k of every row as a float (any stride).
    __device__ __forceinline__ void load1(int k, long long stride_logit, float (&x)[R]) const {
        #pragma unroll
        for (int r = 0; r < R; ++r) {
            x[r] = r < active ? lig_storage<Tag>::load(member[r * row_step + k * stride_logit]) : 0.0f;
        }
    }
};

// sum[r] = sum over k = 0..K-1 of sigmoid(logits[row[r], m, k]), in k order from 0.0f.
template <typename Tag, int R>
__device__ __forceinline__ void lig_ens_member_sums(const lig_ens_rows<Tag, R>& block_rows, int K, long long stride_logit,
                                                    int vectorized, float (&sum)[R]) {
    #pragma unroll
    for (int r = 0; r < R; ++r) sum[r] = 0.0f;
    if (vectorized) {
        for (int k = 0; k < K; k += 4) {
            float x[R][4];
            block_rows.load4(k, x);
            #pragma unroll
            for (int r = 0; r < R; ++r) {
                #pragma unroll
                for (int j = 0; j < 4; ++j) sum[r] = __fadd_rn(sum[r], lig_ens_sigmoid_of<Tag>(x[r][j]));
            }
        }
    } else {
        for (int k = 0; k < K; ++k) {
            float x[R];
            block_rows.load1(k, stride_logit, x);
            #pragma unroll
            for (int r = 0; r < R; ++r) sum[r] = __fadd_rn(sum[r], lig_ens_sigmoid_of<Tag>(x[r]));
        }
    }
}

// partial[r] = the lane's share of row r: over its members m = lane, lane + G, ...
// in order, partial += w[m] * mean_k sigmoid(logits[row r, m, k]), from 0.0f.
// One member at a time for all R rows (LIG_ENS_FORWARD_DEPTH 0, and any layout).
template <typename Tag, int R>
__device__ __forceinline__ void lig_ens_lane_partials(const typename lig_storage<Tag>::type* __restrict__ logits,
                                                      const float* __restrict__ weights, long long first,
                                                      long long row_step, long long rows, int lane, int members,
                                                      int K, long long stride_row, long long stride_member,
                                                      long long stride_logit, int group_size, int vectorized,
                                                      const lig_ens_divisor& per_k, float (&partial)[R]) {
    #pragma unroll
    for (int r = 0; r < R; ++r) partial[r] = 0.0f;
    for (int m = lane; m < members; m += group_size) {
        const lig_ens_rows<Tag, R> block_rows(logits, first, row_step, rows, stride_row, m * stride_member);
        float sum[R];
        lig_ens_member_sums<Tag, R>(block_rows, K, stride_logit, vectorized, sum);
        const float w = weights[m];
        #pragma unroll
        for (int r = 0; r < R; ++r) partial[r] = __fadd_rn(partial[r], __fmul_rn(w, per_k(sum[r])));
    }
}

#include "ensemble_batched.cuh"

template <typename Tag>
__device__ __forceinline__ void lig_ens_forward(const typename lig_storage<Tag>::type* __restrict__ logits,
                                                const float* __restrict__ weights,
                                                typename lig_storage<Tag>::type* __restrict__ out, long long rows,
                                                int members, int K, long long stride_row, long long stride_member,
                                                long long stride_logit, int group_size, int vectorized) {
    const int R = LIG_ENS_FORWARD_ROWS;
    const lig_ens_groups groups(group_size);
    const lig_ens_divisor per_k(K);
    const long long own = groups.group - groups.warp_first;  // this group's place in its warp
    // Uniform across the warp (bounded by the warp's first row): every lane reaches every shuffle.
    for (long long warp_row = groups.warp_first; warp_row < rows; warp_row += groups.count * R) {
        const long long first = warp_row + own;
        float partial[R];
#if LIG_ENS_FORWARD_DEPTH > 0
        if (vectorized) {
            int active = 0;  // rows first + r * count that exist (a prefix of the R)
            #pragma unroll
            for (int r = 0; r < R; ++r) active += first + r * groups.count < rows ? 1 : 0;
            lig_ens_lane_partials_fitted<Tag, R, LIG_ENS_FORWARD_DEPTH>(logits, weights, first, groups.count, active,
                                                                      groups.lane, members, K, stride_row,
                                                                      stride_member, group_size, per_k, partial);
        } else
#endif
        {
            lig_ens_lane_partials<Tag, R>(logits, weights, first, groups.count, rows, groups.lane, members, K,
                                          stride_row, stride_member, stride_logit, group_size, vectorized, per_k,
                                          partial);
        }
#if LIG_ENS_LEAN
        // Each row's tree (offsets G / 2, ..., 1), the R rows' shuffles interleaved.
        #pragma unroll
        for (int offset = 16; offset > 0; offset >>= 1) {
            if (offset < group_size) {  // uniform
                #pragma unroll
                for (int r = 0; r < R; ++r) {
                    partial[r] = __fadd_rn(partial[r], __shfl_down_sync(0xffffffffu, partial[r], offset, group_size));
                }
            }
        }
        #pragma unroll
        for (int r = 0; r < R; ++r) {
            const long long row = first + r * groups.count;
            if (groups.lane == 0 && row < rows) out[row] = lig_storage<Tag>::store(partial[r]);
        }
#else
        #pragma unroll
        for (int r = 0; r < R; ++r) {
            for (int offset = group_size >> 1; offset > 0; offset >>= 1) {
                partial[r] = __fadd_rn(partial[r], __shfl_down_sync(0xffffffffu, partial[r], offset, group_size));
            }
            const long long row = first + r * groups.count;
            if (groups.lane == 0 && row < rows) out[row] = lig_storage<Tag>::store(partial[r]);
        }
#endif
    }
}

// d out[b] / d logits[b, m, k] * g[b] = coefficient * (e r) r with coefficient = g[b] w[m] / K.
__device__ __forceinline__ float lig_ens_gradient(float coefficient, float e, float r) {
    return __fmul_rn(coefficient, __fmul_rn(__fmul_rn(e, r), r));
}

// The backward of one member for R rows: writes the gradients (when
// grad_logits is not null) and returns sum_k sigmoid per row in `sum` (the
// mean that d out / d w needs). grad_logits is contiguous (B, M, K).
template <typename Tag, int R>
__device__ __forceinline__ void lig_ens_member_backward(const lig_ens_rows<Tag, R>& block_rows,
                                                        typename lig_storage<Tag>::type* __restrict__ grad_logits,
                                                        const float (&coefficient)[R],
                                                        const long long (&grad_offset)[R], int K,
                                                        long long stride_logit, int vectorized,
                                                        float (&sum)[R]) {
    typedef typename lig_ens_rows<Tag, R>::V V;
    #pragma unroll
    for (int r = 0; r < R; ++r) sum[r] = 0.0f;
    if (vectorized) {
        for (int k = 0; k < K; k += 4) {
            float x[R][4];
            block_rows.load4(k, x);
            #pragma unroll
            for (int r = 0; r < R; ++r) {
                float d[4];
                #pragma unroll
                for (int j = 0; j < 4; ++j) {
                    float e, rr;
                    lig_ens_math<Tag>::parts(x[r][j], e, rr);
                    sum[r] = __fadd_rn(sum[r], lig_ens_sigmoid(x[r][j], e, rr));
                    d[j] = lig_ens_gradient(coefficient[r], e, rr);
                }
                if (grad_logits && block_rows.is_active(r)) {
                    *reinterpret_cast<typename V::type*>(grad_logits + grad_offset[r] + k) = V::pack(d);
                }
            }
        }
    } else {
        for (int k = 0; k < K; ++k) {
            float x[R];
            block_rows.load1(k, stride_logit, x);
            #pragma unroll
            for (int r = 0; r < R; ++r) {
                float e, rr;
                lig_ens_math<Tag>::parts(x[r], e, rr);
                sum[r] = __fadd_rn(sum[r], lig_ens_sigmoid(x[r], e, rr));
                if (grad_logits && block_rows.is_active(r)) {
                    grad_logits[grad_offset[r] + k] = lig_storage<Tag>::store(lig_ens_gradient(coefficient[r], e, rr));
                }
            }
        }
    }
}

// grad_weights[m] = sum over blocks (in block order) of partials[block, m];
// run by the last block to finish. Volatile loads bypass L1, which may not be
// coherent with the other blocks' writes.
__device__ __forceinline__ void lig_ens_finish_weights(float* __restrict__ grad_weights, double* partials,
                                                       unsigned int* counter, int members) {
    __shared__ bool is_last;
    __syncthreads();  // every partial of this block is written
    if (threadIdx.x == 0) {
        __threadfence();  // ... and visible device-wide before this block takes its ticket
        const unsigned int ticket = atomicAdd(counter, 1u);
        is_last = ticket == gridDim.x - 1;
    }
    __syncthreads();
    if (!is_last) return;
    __threadfence();
    const volatile double* visible = partials;
    for (int m = threadIdx.x; m < members; m += blockDim.x) {
        double total = 0.0;
        for (unsigned int block = 0; block < gridDim.x; ++block) total += visible[static_cast<long long>(block) * members + m];
        grad_weights[m] = static_cast<float>(total);
    }
    if (threadIdx.x == 0) *counter = 0u;  // ready for the next launch on this stream, and for graph replays
}

// The block's sum of each lane's weight-gradient accumulator for member m, in
// group order, written to partials[block, m]. Called by every thread of the block.
__device__ __forceinline__ void lig_ens_block_partial(double accumulated, int m, int members, int group_size,
                                                      double* __restrict__ partials) {
    __shared__ double block_sums[LIG_ENS_THREADS];
    block_sums[threadIdx.x] = accumulated;
    __syncthreads();
    if (static_cast<int>(threadIdx.x) < group_size && m < members) {  // threadIdx.x == lane here
        double total = 0.0;
        for (int q = 0; q < LIG_ENS_THREADS / group_size; ++q) total += block_sums[q * group_size + threadIdx.x];
        partials[static_cast<long long>(blockIdx.x) * members + m] = total;
    }
    __syncthreads();  // block_sums is reused by the next call
}

// Backward. The loop order is member chunk (outer) then rows (inner), so a
// lane's weight-gradient accumulator belongs to one member at a time.
template <typename Tag>
__device__ __forceinline__ void lig_ens_backward(const typename lig_storage<Tag>::type* __restrict__ logits,
                                                 const float* __restrict__ weights,
                                                 const typename lig_storage<Tag>::type* __restrict__ grad_out,
                                                 long long grad_out_stride,
                                                 typename lig_storage<Tag>::type* __restrict__ grad_logits,
                                                 float* __restrict__ grad_weights, double* __restrict__ partials,
                                                 unsigned int* __restrict__ counter, long long rows, int members,
                                                 int K, long long stride_row, long long stride_member,
                                                 long long stride_logit, int group_size, int vectorized) {
    const int R = LIG_ENS_BACKWARD_ROWS;
    const lig_ens_groups groups(group_size);
    const lig_ens_divisor per_k(K);
    const int chunks = (members + group_size - 1) / group_size;
    for (int chunk = 0; chunk < chunks; ++chunk) {  // uniform across the block
        const int m = chunk * group_size + groups.lane;
        double accumulated = 0.0;
        if (m < members) {
            const float w = weights[m];
            // No shuffles in here: lanes may leave this loop at different times.
            for (long long first = groups.group; first < rows; first += groups.count * R) {
                const lig_ens_rows<Tag, R> block_rows(logits, first, groups.count, rows, stride_row, m * stride_member);
                float g[R], coefficient[R], sum[R];
                long long grad_offset[R];
                #pragma unroll
                for (int r = 0; r < R; ++r) {
                    const long long row = first + r * groups.count;
                    g[r] = block_rows.is_active(r) ? lig_storage<Tag>::load(grad_out[row * grad_out_stride]) : 0.0f;
                    coefficient[r] = per_k(__fmul_rn(g[r], w));
                    grad_offset[r] = (row * members + m) * static_cast<long long>(K);
                }
                lig_ens_member_backward<Tag, R>(block_rows, grad_logits, coefficient, grad_offset, K, stride_logit,
                                             vectorized, sum);
                #pragma unroll
                for (int r = 0; r < R; ++r) {
                    // the product of two floats is exact in double; inactive rows add 0 * 0
                    accumulated += static_cast<double>(g[r]) * static_cast<double>(per_k(sum[r]));
                }
            }
        }
        if (grad_weights) lig_ens_block_partial(accumulated, m, members, group_size, partials);  // uniform argument
    }
    if (grad_weights) lig_ens_finish_weights(grad_weights, partials, counter, members);
}

#define LIG_ENS_ENTRY_POINTS(SFX, TAG)                                                                           \
    extern "C" __global__ void __launch_bounds__(LIG_ENS_THREADS, LIG_ENS_FORWARD_MIN_BLOCKS)                \
    ensemble_forward_##SFX(                                                                                     \
        const lig_storage<TAG>::type* logits, const float* weights, lig_storage<TAG>::type* out, long long rows, \
        int members, int K, long long stride_row, long long stride_member, long long stride_logit,              \
        int group_size, int vectorized) {                                                                       \
        lig_ens_forward<TAG>(logits, weights, out, rows, members, K, stride_row, stride_member, stride_logit,    \
                             group_size, vectorized);                                                           \
    }                                                                                                           \
    extern "C" __global__ void __launch_bounds__(LIG_ENS_THREADS, LIG_ENS_MIN_BLOCKS) ensemble_backward_##SFX(    \
        const lig_storage<TAG>::type* logits, const float* weights, const lig_storage<TAG>::type* grad_out,      \
        long long grad_out_stride, lig_storage<TAG>::type* grad_logits, float* grad_weights, double* partials,   \
        unsigned int* counter, long long rows, int members, int K, long long stride_row,                        \
        long long stride_member, long long stride_logit, int group_size, int vectorized) {                      \
        lig_ens_backward<TAG>(logits, weights, grad_out, grad_out_stride, grad_logits, grad_weights, partials,   \
                              counter, rows, members, K, stride_row, stride_member, stride_logit, group_size,    \
                              vectorized);                                                                      \
    }

#if !defined(LIG_ENS_ONE_DTYPE) || defined(LIG_ENS_DTYPE_f32)
LIG_ENS_ENTRY_POINTS(f32, lig_f32_tag)
#endif
#if !defined(LIG_ENS_ONE_DTYPE) || defined(LIG_ENS_DTYPE_f16)
LIG_ENS_ENTRY_POINTS(f16, lig_f16_tag)
#endif
#if !defined(LIG_ENS_ONE_DTYPE) || defined(LIG_ENS_DTYPE_bf16)
LIG_ENS_ENTRY_POINTS(bf16, lig_bf16_tag)
#endif
