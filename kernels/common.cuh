// Shared device helpers for the kernels in this folder.
//
// Half types are kept as raw 16-bit storage and converted with PTX, so the
// kernels need no CUDA toolkit headers at run time (NVRTC through CuPy finds
// them on some installs and not on others). bfloat16 conversion needs sm_80+.
//
// Outside a CUDA compiler (the engine's tests build ig.cu for the host with a
// header of CUDA built-ins and g++), the conversions are plain C++ with the
// same round-to-nearest-even results.
#pragma once

typedef unsigned short lig_half;  // IEEE binary16 bits
typedef unsigned short lig_bf16;  // bfloat16 bits

struct __align__(8) lig_half4 { lig_half x, y, z, w; };
struct __align__(8) lig_bf16_4 { lig_bf16 x, y, z, w; };

#if defined(__CUDACC__) || defined(__CUDACC_RTC__)

__device__ __forceinline__ float lig_half_to_float(lig_half h) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
}

__device__ __forceinline__ float lig_bf16_to_float(lig_bf16 b) {
    return __uint_as_float(static_cast<unsigned int>(b) << 16);
}

__device__ __forceinline__ lig_half lig_float_to_half(float f) {
    lig_half h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return h;
}

__device__ __forceinline__ lig_bf16 lig_float_to_bf16(float f) {
    lig_bf16 b;
    asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(b) : "f"(f));
    return b;
}

#else  // a host build

#include <cmath>
#include <cstdint>
#include <cstring>

inline float lig_half_to_float(lig_half h) { _Float16 f; std::memcpy(&f, &h, 2); return static_cast<float>(f); }
inline lig_half lig_float_to_half(float v) { _Float16 f = static_cast<_Float16>(v); lig_half h; std::memcpy(&h, &f, 2); return h; }
inline float lig_bf16_to_float(lig_bf16 b) { std::uint32_t u = static_cast<std::uint32_t>(b) << 16; float f; std::memcpy(&f, &u, 4); return f; }
inline lig_bf16 lig_float_to_bf16(float f) {
    std::uint32_t u;
    std::memcpy(&u, &f, 4);
    if (std::isnan(f)) return 0x7fc0;
    return static_cast<lig_bf16>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);  // round to nearest even, as cvt.rn.bf16.f32
}

#endif

// Load/store one element of storage type T as float. T is float, lig_half or
// lig_bf16; the tag selects the conversion because lig_half and lig_bf16 are
// the same C type.
struct lig_f32_tag {};
struct lig_f16_tag {};
struct lig_bf16_tag {};

template <typename Tag> struct lig_storage;
template <> struct lig_storage<lig_f32_tag> {
    typedef float type;
    static __device__ __forceinline__ float load(float v) { return v; }
    static __device__ __forceinline__ float store(float v) { return v; }
};
template <> struct lig_storage<lig_f16_tag> {
    typedef lig_half type;
    static __device__ __forceinline__ float load(lig_half v) { return lig_half_to_float(v); }
    static __device__ __forceinline__ lig_half store(float v) { return lig_float_to_half(v); }
};
template <> struct lig_storage<lig_bf16_tag> {
    typedef lig_bf16 type;
    static __device__ __forceinline__ float load(lig_bf16 v) { return lig_bf16_to_float(v); }
    static __device__ __forceinline__ lig_bf16 store(float v) { return lig_float_to_bf16(v); }
};

// Four consecutive elements as one aligned load or store (16 bytes of float, 8 of
// a half type), unpacked to and packed from float[4]. Our own 16-byte type rather
// than float4, so nothing depends on which headers NVRTC provides.
struct __align__(16) lig_float4 { float x, y, z, w; };

template <typename Tag> struct lig_vec4;
template <> struct lig_vec4<lig_f32_tag> {
    typedef lig_float4 type;
    static __device__ __forceinline__ void unpack(const lig_float4& v, float (&f)[4]) {
        f[0] = v.x; f[1] = v.y; f[2] = v.z; f[3] = v.w;
    }
    static __device__ __forceinline__ lig_float4 pack(const float (&f)[4]) {
        lig_float4 v;
        v.x = f[0]; v.y = f[1]; v.z = f[2]; v.w = f[3];
        return v;
    }
};
template <typename Tag, typename V4> struct lig_vec4_of_half {
    typedef V4 type;
    static __device__ __forceinline__ void unpack(const V4& v, float (&f)[4]) {
        f[0] = lig_storage<Tag>::load(v.x); f[1] = lig_storage<Tag>::load(v.y);
        f[2] = lig_storage<Tag>::load(v.z); f[3] = lig_storage<Tag>::load(v.w);
    }
    static __device__ __forceinline__ V4 pack(const float (&f)[4]) {
        V4 v;
        v.x = lig_storage<Tag>::store(f[0]); v.y = lig_storage<Tag>::store(f[1]);
        v.z = lig_storage<Tag>::store(f[2]); v.w = lig_storage<Tag>::store(f[3]);
        return v;
    }
};
template <> struct lig_vec4<lig_f16_tag> : lig_vec4_of_half<lig_f16_tag, lig_half4> {};
template <> struct lig_vec4<lig_bf16_tag> : lig_vec4_of_half<lig_bf16_tag, lig_bf16_4> {};

// Grid-stride loops: for (i = lig_first_index(); i < n; i += lig_grid_stride()).
__device__ __forceinline__ long long lig_first_index() {
    return static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ __forceinline__ long long lig_grid_stride() {
    return static_cast<long long>(gridDim.x) * blockDim.x;
}

// Sum over a warp with shuffles (lane l adds lane l + 16, then l + 8, ..., l + 1);
// the order of additions is fixed, so the result (valid in lane 0) is the same on
// every run. An addition alone cannot be contracted into an FMA: `+` rounds
// exactly as __fadd_rn/__dadd_rn.
template <typename T>
__device__ __forceinline__ T lig_warp_sum(T v) {
    #pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_down_sync(0xffffffffu, v, offset);
    return v;
}
