// One decode row's matrix-vector product with the residual added, its weights in shared memory
// before its input exists (executor/row_gemv.py; issue 17: decode at batch 1).
//
// out[n] = bf16(res[n] + bf16(W[n, :] . x)) for N outputs of a K-wide row x, as the Triton
// matrix-vector kernel rounds (moe_layer_kernels.gemv_kernel with a residual). NCTA blocks, one a
// multiprocessor, each owning ROWS consecutive rows of W:
//
//   1. at entry (a programmatic dependent launch: while the kernel before still runs) thread 0 asks
//      the copy engine for the block's ROWS x K weights (cp.async.bulk on an mbarrier, into shared
//      memory) and the first ROWS threads read the block's residuals (the layer's input: final
//      before this kernel launches, two kernels back);
//   2. past the wait, every warp reads x (K values, 16 bytes a lane at a time) into registers;
//   3. once the weights are in, warp w takes rows w, w + WARPS, ..: a lane's share of each row
//      against x, summed across the warp, rounded, plus the residual.
//
// The o projection after the one-row attention is the use: the attention's few programs leave
// the multiprocessors' shared memory and HBM nearly idle, so the 17 MB of o rows stream while it
// runs, and what the kernel adds past its wait is x's read and the dot products.
//
// Compile-time sizes (NVRTC -D): K, N, NCTA, THREADS; TRACE (1: each block's thread 0 stores the
// GPU's global timer at 0 entry, 1 past the wait, 3 x's loads issued, 2 weights arrived, 5 end, as
// layer_phases reads).

#define WARPS (THREADS / 32)
#define ROWS (N / NCTA)
#define CHUNKS (K / 256)

#include "moe_kernel_common.cuh"

static_assert(K % 256 == 0, "a warp reads a row in 256-value chunks, 8 a lane");
static_assert(N % NCTA == 0 && ROWS % WARPS == 0 && ROWS <= THREADS, "blocks and warps split the rows");
static_assert((K * 2) % 16 == 0, "a row is a whole number of 16-byte bulk-copy units");

extern "C" __global__ void __launch_bounds__(THREADS, 1) row_gemv(
    const bf16* __restrict__ x,    // [K] the row (from the kernel before)
    const bf16* __restrict__ w,    // [N, K]
    const bf16* __restrict__ res,  // [N] the residual (final before this kernel launches)
    bf16* __restrict__ out,        // [N]
    long long* trace) {            // [NCTA, 8] when TRACE
    extern __shared__ __align__(128) unsigned char smem[];
    bf16* s_w = (bf16*)smem;                          // [ROWS][K]
    u64* s_bar = (u64*)(smem + (size_t)ROWS * K * 2);  // the weights' arrival
    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
    const int first = blockIdx.x * ROWS;
    mark_block(trace, 0);
    if (tid == 0) {
        const u32 bar = smem_addr(s_bar);
        asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(bar));
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
        asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(ROWS * K * 2)
                     : "memory");
#pragma unroll 1
        for (int r = 0; r < ROWS; ++r)
            asm volatile(
                "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                    smem_addr(s_w + (size_t)r * K)),
                "l"(w + (size_t)(first + r) * K), "r"(K * 2), "r"(bar)
                : "memory");
    }
    const float residual = tid < ROWS ? __uint_as_float((u32)res[first + tid] << 16) : 0.f;
    __syncthreads();  // the barrier is initialised before any thread waits on it
    asm volatile("griddepcontrol.wait;" ::: "memory");
    asm volatile("griddepcontrol.launch_dependents;");
    mark_block(trace, 1);
    uint4 xv[CHUNKS];
#pragma unroll
    for (int c = 0; c < CHUNKS; ++c) xv[c] = __ldcg((const uint4*)(x + c * 256 + lane * 8));
    mark_block(trace, 3);
    {
        const u32 bar = smem_addr(s_bar);
        u32 ready = 0;
        while (!ready)
            asm volatile(
                "{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], 0; selp.u32 %0, 1, 0, p; }"
                : "=r"(ready)
                : "r"(bar)
                : "memory");
    }
    mark_block(trace, 2);
    __shared__ float s_dot[ROWS];
#pragma unroll 1
    for (int r = warp; r < ROWS; r += WARPS) {
        float p = 0.f;
#pragma unroll
        for (int c = 0; c < CHUNKS; ++c) p += dot8(*(const uint4*)(s_w + (size_t)r * K + c * 256 + lane * 8), xv[c]);
        p = warp_sum(p);
        if (lane == 0) s_dot[r] = p;
    }
    __syncthreads();
    if (tid < ROWS) out[first + tid] = (bf16)bf16_bits(residual + rbf(s_dot[tid]));  // as the Triton kernel rounds
    mark_block(trace, 5);
}
