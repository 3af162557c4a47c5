// Part of kernels/ensemble.cu (included there): the forward's lane partials with
// LIG_ENS_FORWARD_DEPTH > 0, the loads of D vectors of R rows in flight together.
#pragma once

// The same partials, LIG_ENS_FORWARD_DEPTH = D > 0, vectorized layout only, for
// the `active` rows first + r * row_step (r < active) of the R. A lane's vectors of
// a row form one sequence, member by member and within a member k = 0, 4, 8, ...;
// it is read D vectors at a time for all R rows (R * D loads in flight), then those
// are computed in the same order, so every sum runs exactly as in
// lig_ens_lane_partials. Rows r >= active read the first row again (never stored),
// which keeps the loads free of predicates and the values free of zeroing.
template <typename Tag, int R, int D>
__device__ __forceinline__ void lig_ens_lane_partials_batched(
    const typename lig_storage<Tag>::type* __restrict__ logits, const float* __restrict__ weights, long long first,
    long long row_step, int active, int lane, int members, int K, long long stride_row, long long stride_member,
    int group_size, const lig_ens_divisor& per_k, float (&partial)[R]) {
    typedef typename lig_storage<Tag>::type T;
    typedef lig_vec4<Tag> V;
    typedef typename V::type T4;
    #pragma unroll
    for (int r = 0; r < R; ++r) partial[r] = 0.0f;
    if (active <= 0 || lane >= members) return;
    const T* next[R];  // each row's next vector to load
    #pragma unroll
    for (int r = 0; r < R; ++r) {
        next[r] = logits + (first + (r < active ? r : 0) * row_step) * stride_row + lane * stride_member;
    }
    const int quads = K >> 2;  // vectors per member
    const int slots = ((members - 1 - lane) / group_size + 1) * quads;
    const long long to_next_member = group_size * stride_member - K + 4;  // from a member's last vector
    int load_quad = 0;
    int load_member = lane;
    int quad = 0;  // the next vector to compute
    float sum[R];
    #pragma unroll
    for (int r = 0; r < R; ++r) sum[r] = 0.0f;
    for (int batch = 0; batch < slots; batch += D) {
        T4 raw[D][R];
        float w[D];
        #pragma unroll
        for (int d = 0; d < D; ++d) {
            if (batch + d < slots) {
                #pragma unroll
                for (int r = 0; r < R; ++r) raw[d][r] = *reinterpret_cast<const T4*>(next[r]);
                w[d] = weights[load_member];
                long long step = 4;
                if (++load_quad == quads) {
                    load_quad = 0;
                    step = to_next_member;
                    load_member += group_size;
                }
                #pragma unroll
                for (int r = 0; r < R; ++r) next[r] += step;
            }
        }
        #pragma unroll
        for (int d = 0; d < D; ++d) {
            if (batch + d < slots) {
                #pragma unroll
                for (int r = 0; r < R; ++r) {
                    float x[4];
                    V::unpack(raw[d][r], x);
                    #pragma unroll
                    for (int j = 0; j < 4; ++j) sum[r] = __fadd_rn(sum[r], lig_ens_sigmoid_of<Tag>(x[j]));
                }
                if (++quad == quads) {  // the member is complete
                    quad = 0;
                    #pragma unroll
                    for (int r = 0; r < R; ++r) {
                        partial[r] = __fadd_rn(partial[r], __fmul_rn(w[d], per_k(sum[r])));
                        sum[r] = 0.0f;
                    }
                }
            }
        }
    }
}

// lig_ens_lane_partials_batched for `active` rows of R, by the smallest of R, R / 2,
// R / 4, ..., 1 that covers them: few rows (a small batch, the last pass over a
// large one) are not computed R times over.
template <typename Tag, int R, int D>
__device__ __forceinline__ void lig_ens_lane_partials_fitted(
    const typename lig_storage<Tag>::type* __restrict__ logits, const float* __restrict__ weights, long long first,
    long long row_step, int active, int lane, int members, int K, long long stride_row, long long stride_member,
    int group_size, const lig_ens_divisor& per_k, float (&partial)[R]) {
    if constexpr (R > 1) {
        if (active <= R / 2) {
            float fewer[R / 2];
            lig_ens_lane_partials_fitted<Tag, R / 2, D>(logits, weights, first, row_step, active, lane, members, K,
                                                        stride_row, stride_member, group_size, per_k, fewer);
            #pragma unroll
            for (int r = 0; r < R; ++r) partial[r] = r < R / 2 ? fewer[r] : 0.0f;
            return;
        }
    }
    lig_ens_lane_partials_batched<Tag, R, D>(logits, weights, first, row_step, active, lane, members, K, stride_row,
                                             stride_member, group_size, per_k, partial);
}
