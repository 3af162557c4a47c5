"""kernels/ig.cu built for the host with g++ and run against its torch twins, bit for bit, without a GPU.

The build compiles the real ``kernels/ig.cu`` and ``kernels/common.cuh`` (whose
half-precision conversions have a plain C++ branch outside CUDA compilers);
only CUDA's built-ins (thread indices, rounded intrinsics, warp shuffles) come
from the small header below. A launch runs every thread of the grid one after
another; the lanes of a warp run from the last down, so a shuffle can read
what the higher lanes wrote at the same step, which is what ``__shfl_down_sync``
does on a GPU. The CUDA backend takes this launch through its constructor.
"""

from __future__ import annotations

import ctypes
import shutil
import subprocess
from typing import Any

import numpy as np
import pytest
import torch

from lightning_ig.ops import _cupy
from lightning_ig.ops.dtypes import accumulate_dtype
from lightning_ig.ops.ig import CudaIG, TorchIG
from tests.support.kernels import repeated_ends

_CUDA_BUILTINS = r"""
// CUDA built-ins for a host build of kernels/ig.cu (the kernels' own headers are used as they are).
#pragma once
#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <vector>
#define __device__
#define __global__
#define __forceinline__ inline
#define __align__(n) alignas(n)
struct lig_host_dim3 { unsigned x, y, z; };
extern "C" { lig_host_dim3 blockIdx, threadIdx, gridDim, blockDim; }
static std::vector<std::array<double, 32>> lig_host_shuffles;  // [shuffle call][lane]: the value each lane offered
static int lig_host_shuffle_call = 0;
static int lig_host_warp_lanes = 32;
extern "C" void lig_set_thread(int block, int thread, int blocks, int threads) {
    blockIdx.x = block; threadIdx.x = thread; gridDim.x = blocks; blockDim.x = threads;
    lig_host_warp_lanes = std::min(32, threads - (thread & ~31));
    lig_host_shuffle_call = 0;
    if ((thread & 31) == lig_host_warp_lanes - 1) lig_host_shuffles.clear();  // a warp's first lane to run
}
template <typename T> static inline T __shfl_down_sync(unsigned, T v, int offset) {
    const int lane = threadIdx.x & 31;
    if (static_cast<int>(lig_host_shuffles.size()) <= lig_host_shuffle_call)
        lig_host_shuffles.resize(lig_host_shuffle_call + 1);
    lig_host_shuffles[lig_host_shuffle_call][lane] = static_cast<double>(v);  // exact for float and double
    const int source = lane + offset;
    const T out = source < lig_host_warp_lanes ? static_cast<T>(lig_host_shuffles[lig_host_shuffle_call][source]) : v;
    ++lig_host_shuffle_call;
    return out;
}
static inline float __fadd_rn(float a, float b) { return a + b; }
static inline float __fsub_rn(float a, float b) { return a - b; }
static inline float __fmul_rn(float a, float b) { return a * b; }
static inline float __fdiv_rn(float a, float b) { return a / b; }
static inline double __dadd_rn(double a, double b) { return a + b; }
static inline double __dsub_rn(double a, double b) { return a - b; }
static inline double __dmul_rn(double a, double b) { return a * b; }
static inline double __ddiv_rn(double a, double b) { return a / b; }
static inline float __int_as_float(int v) { float f; std::memcpy(&f, &v, 4); return f; }
static inline float __uint_as_float(unsigned v) { float f; std::memcpy(&f, &v, 4); return f; }
static inline double __longlong_as_double(long long v) { double f; std::memcpy(&f, &v, 8); return f; }
"""

_SUFFIX = {torch.float32: "f32", torch.float64: "f64", torch.float16: "f16", torch.bfloat16: "bf16"}
_ARGUMENT = {
    np.uint64: ctypes.c_void_p,
    np.int32: ctypes.c_int,
    np.int64: ctypes.c_longlong,
    np.float32: ctypes.c_float,
    np.float64: ctypes.c_double,
}


class HostLaunch:
    """``CudaIG(launch=...)``: runs ``ig_<op>_<dtype>`` of the host build over an emulated grid."""

    def __init__(self, native: ctypes.CDLL) -> None:
        self.native = native
        self.grid = (2, 3)  # (blocks, threads per block): small on purpose, so grid-stride loops wrap

    def __call__(self, op: str, dtype: torch.dtype, device: torch.device, total: int, args: list[Any]) -> None:
        kernel = getattr(self.native, f"ig_{op}_{_SUFFIX[dtype]}")
        converted = [_ARGUMENT[type(a)](a.item()) for a in args]
        blocks, threads = self.grid
        for block in range(blocks):
            for warp in range(0, threads, 32):
                for lane in reversed(range(min(32, threads - warp))):  # the last lane first: see the module docstring
                    self.native.lig_set_thread(block, warp + lane, blocks, threads)
                    kernel(*converted)


@pytest.fixture(scope="module")
def host_launch(tmp_path_factory: pytest.TempPathFactory) -> HostLaunch:
    """kernels/ig.cu built as a host library (g++); skipped without g++ or its _Float16."""
    compiler = shutil.which("g++")
    if compiler is None:
        pytest.skip("g++ is not installed")
    folder = tmp_path_factory.mktemp("ig_host")
    (folder / "cuda_builtins.h").write_text(_CUDA_BUILTINS)
    library = folder / "libig_host.so"
    kernels = _cupy.kernel_dir()
    build = subprocess.run(
        [
            compiler,
            "-std=c++17",
            "-O1",
            "-ffp-contract=off",
            "-fPIC",
            "-shared",
            "-x",
            "c++",
            "-include",
            str(folder / "cuda_builtins.h"),
            f"-I{kernels}",
            "-o",
            str(library),
            str(kernels / "ig.cu"),
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    if build.returncode != 0:
        if "_Float16" in build.stderr:
            pytest.skip("this g++ has no _Float16")
        pytest.fail(f"ig.cu does not build for the host:\n{build.stderr[-3000:]}")
    return HostLaunch(ctypes.CDLL(str(library)))


DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16]


@pytest.mark.parametrize("dtype", DTYPES)
def test_host_built_kernels_match_their_torch_twins_bit_for_bit(host_launch: HostLaunch, dtype: torch.dtype) -> None:
    kernels, twins = CudaIG(launch=host_launch), TorchIG()
    acc = accumulate_dtype(dtype)
    generator = torch.Generator().manual_seed(50)
    for batch, features in [(1, 1), (3, 5), (2, 7)]:
        for grid in [(1, 1), (2, 3), (3, 32)]:
            host_launch.grid = grid
            x = torch.randn(batch, features, generator=generator).to(dtype)
            b = torch.randn(batch, features, generator=generator).to(dtype)
            alphas = torch.rand(4, generator=generator).to(acc)
            for end_copies in (0, 1, 2):
                points = kernels.interpolate(x, b, alphas, end_copies)
                assert points.shape == (4 + 2 * end_copies, batch, features)
                assert torch.equal(points, twins.interpolate(x, b, alphas, end_copies))
            points = twins.interpolate(x, b, alphas, 0)[:3].reshape(-1, features).contiguous()
            h = (torch.rand(batch, features, generator=generator) * 0.1 + 0.01).to(acc)
            for offset in (0, 1, 5):
                assert torch.equal(kernels.fd_probes(points, h, offset), twins.fd_probes(points, h, offset))
                f = torch.randn(points.shape[0], 2, features, 3, generator=generator).to(acc)
                ours = torch.full((3, points.shape[0] + 4, features), -7.0, dtype=acc)
                twin = ours.clone()
                kernels.fd_gradient(points, h, f, offset, ours[:, 2 : 2 + points.shape[0]])
                twins.fd_gradient(points, h, f, offset, twin[:, 2 : 2 + points.shape[0]])
                assert torch.equal(ours, twin)
            grads = torch.randn(2, 5, batch, features, generator=generator).to(acc)
            weights = torch.rand(5, generator=generator).to(acc)
            assert torch.equal(kernels.accumulate(x, b, weights, grads), twins.accumulate(x, b, weights, grads))
            per_state = torch.randn(2, 5, batch, generator=generator).to(acc)  # the kink rule's (T, n, B) weights
            assert torch.equal(kernels.accumulate(x, b, per_state, grads), twins.accumulate(x, b, per_state, grads))
            # past one block of 256 summed steps: two full blocks and a part
            grads = torch.randn(2, 600, batch, features, generator=generator).to(acc)
            weights = torch.rand(600, generator=generator).to(acc)
            assert torch.equal(kernels.accumulate(x, b, weights, grads), twins.accumulate(x, b, weights, grads))
            per_state = torch.randn(2, 600, batch, generator=generator).to(acc)
            assert torch.equal(kernels.accumulate(x, b, per_state, grads), twins.accumulate(x, b, per_state, grads))


def test_the_accumulation_keeps_its_rounding_at_many_steps() -> None:
    # 65,536 steps of 1/n times numbers in [1, 2]: one float32 sum in step order was 56 eps off; in blocks of 256
    # steps it is 4 eps (the same inputs give the same bits on any IEEE machine)
    n = 65536
    grads = torch.rand(1, n, 2, 8, generator=torch.Generator().manual_seed(0)) + 1.0
    weights = torch.full((n,), 1.0 / n)
    ours = TorchIG().accumulate(torch.ones(2, 8), torch.zeros(2, 8), weights, grads).double()
    exact = (weights.double().view(1, n, 1, 1) * grads.double()).sum(1)
    assert float(((ours - exact).abs() / exact).max()) <= 8 * torch.finfo(torch.float32).eps


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("features", [1, 5, 32, 33, 70, 129])
def test_host_built_completeness_matches_its_twin_with_full_warps(
    host_launch: HostLaunch, dtype: torch.dtype, features: int
) -> None:
    kernels, twins = CudaIG(launch=host_launch), TorchIG()
    acc = accumulate_dtype(dtype)
    generator = torch.Generator().manual_seed(51)
    for grid in [(1, 32), (2, 64), (3, 96)]:  # whole warps, as the launcher gives; fewer warps than rows: they stride
        host_launch.grid = grid
        attributions = (torch.randn(3, 4, features, generator=generator) * torch.logspace(-3, 3, features)).to(dtype)
        ends = torch.randn(2, 4, 3, generator=generator).to(acc) * 5
        ends[1, 0, 1] = ends[0, 0, 1]  # one degenerate state
        ours = kernels.completeness(attributions, ends)
        twin = twins.completeness(attributions, ends)
        assert ours.shape == (7, 3, 4)
        torch.testing.assert_close(ours, twin, rtol=0, atol=0, equal_nan=True)  # the sums too: same order
        assert ours[4, 1, 0] == 1 and torch.isnan(ours[3, 1, 0])
        assert not ours[6].any()  # one copy of the ends: nothing to compare


@pytest.mark.parametrize("dtype", DTYPES)
def test_host_built_repeat_check_matches_its_twin(host_launch: HostLaunch, dtype: torch.dtype) -> None:
    kernels, twins = CudaIG(launch=host_launch), TorchIG()
    host_launch.grid = (2, 64)
    attributions, ends, expected = repeated_ends(dtype)
    ours = kernels.completeness(attributions, ends)
    torch.testing.assert_close(ours, twins.completeness(attributions, ends), rtol=0, atol=0, equal_nan=True)
    assert torch.equal(ours[6] != 0, expected)
    alone = kernels.completeness(attributions, ends[:2].contiguous())
    torch.testing.assert_close(ours[:6], alone[:6], rtol=0, atol=0, equal_nan=True)  # the rest as with one copy


@pytest.mark.parametrize("dtype", DTYPES)
def test_host_built_completeness_flags_nan_and_inf_like_its_twin(host_launch: HostLaunch, dtype: torch.dtype) -> None:
    kernels, twins = CudaIG(launch=host_launch), TorchIG()
    acc = accumulate_dtype(dtype)
    host_launch.grid = (2, 64)
    attributions = torch.randn(2, 6, 40, generator=torch.Generator().manual_seed(52)).to(dtype)
    ends = torch.randn(2, 6, 2, generator=torch.Generator().manual_seed(53)).to(acc)
    attributions[0, 0, 39] = float("nan")
    attributions[1, 1, 3], attributions[1, 1, 35] = float("inf"), float("-inf")  # Inf - Inf in the sum
    ends[0, 2, 0] = float("inf")
    ends[1, 3, 1] = float("nan")
    ends[0, 4, 0] = ends[1, 4, 0] = float("-inf")  # F(x) = F(b) = -Inf: non-finite, not degenerate
    ours = kernels.completeness(attributions, ends)
    torch.testing.assert_close(ours, twins.completeness(attributions, ends), rtol=0, atol=0, equal_nan=True)
    expected = torch.zeros(2, 6, dtype=torch.bool)
    for t, s in [(0, 0), (1, 1), (0, 2), (1, 3), (0, 4)]:
        expected[t, s] = True
    assert torch.equal(ours[5] != 0, expected) and torch.equal(ours[4][expected], torch.zeros(5, dtype=acc))
    assert (ours[3][expected] == float("inf")).all()
