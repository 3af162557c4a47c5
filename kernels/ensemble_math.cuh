// Part of kernels/ensemble.cu (included there, after its tuning macros): the
// sigmoid's parts in each dtype and the division by K (the vector types are common.cuh's).
#pragma once

// e = exp(-|x|) and r = 1 / (1 + e): exactly rounded for float32 (the twin's
// torch.exp and torch.reciprocal give the same bits), fast for the half types.
template <typename Tag> struct lig_ens_math {
    static __device__ __forceinline__ void parts(float x, float& e, float& r) {
        e = __expf(-fabsf(x));
        r = __fdividef(1.0f, 1.0f + e);
    }
};
// 1 / y rounded to nearest for y in [1, 2] (and NaN for NaN): the sequence
// __frcp_rn runs for every argument outside its slow path (zero, subnormal,
// |y| >= 2^126, inf, NaN): an approximate reciprocal, then one Newton step with
// two fused multiply-adds, t = y r - 1 and r - r t. Written out it needs no
// range check and no branch, so the compiler can interleave elements.
__device__ __forceinline__ float lig_ens_reciprocal_1_to_2(float y) {
    float r;
    asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(y));
    const float t = __fmaf_rn(y, r, -1.0f);
    return __fmaf_rn(r, -t, r);
}

template <> struct lig_ens_math<lig_f32_tag> {
    static __device__ __forceinline__ void parts(float x, float& e, float& r) {
        e = expf(-fabsf(x));
#if LIG_ENS_LEAN
        r = lig_ens_reciprocal_1_to_2(__fadd_rn(1.0f, e));  // 1 + e is in [1, 2]
#else
        r = __frcp_rn(__fadd_rn(1.0f, e));
#endif
    }
};

// x / K, correctly rounded (the twin divides by a tensor of K). With
// LIG_ENS_LEAN and K a power of two, x * (1 / K): 1 / K is exact, so the
// product is the correctly rounded x / K as well (subnormal results included).
struct lig_ens_divisor {
    float k;
    float inverse;
    bool power_of_two;
    __device__ __forceinline__ explicit lig_ens_divisor(int K)
        : k(static_cast<float>(K)), inverse(__frcp_rn(static_cast<float>(K))),
          power_of_two(LIG_ENS_LEAN && K > 0 && (K & (K - 1)) == 0) {}
    __device__ __forceinline__ float operator()(float x) const {
        return power_of_two ? __fmul_rn(x, inverse) : __fdiv_rn(x, k);
    }
};

// sigmoid(x) from its parts; a NaN x fails the comparison and e * r is NaN.
__device__ __forceinline__ float lig_ens_sigmoid(float x, float e, float r) {
    return x >= 0.0f ? r : __fmul_rn(e, r);
}

template <typename Tag>
__device__ __forceinline__ float lig_ens_sigmoid_of(float x) {
    float e, r;
    lig_ens_math<Tag>::parts(x, e, r);
    return lig_ens_sigmoid(x, e, r);
}
