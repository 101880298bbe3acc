// What the one-row decode kernels share (moe_experts.cu, moe_step.cu): bfloat16 unpacking and
// rounding, dot products, warp and block sums, the loads they stream weights and poll published
// values with, a row's RMSNorm and the router's top-k. The including file defines WARPS (and for
// the norm and routing HIDDEN, EXPERTS, TOP_K, NORMALIZE) first. Passed to NVRTC as a header by
// moe_experts.compile_source.
#pragma once

typedef unsigned int u32;
typedef unsigned long long u64;
typedef unsigned short bf16;

static __device__ __forceinline__ float lo(u32 w) { return __uint_as_float(w << 16); }
static __device__ __forceinline__ float hi(u32 w) { return __uint_as_float(w & 0xffff0000u); }

static __device__ __forceinline__ u32 bf16_bits(float f) {  // round to nearest even
    u32 u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (u >> 16) | 0x40u;
    u += 0x7fffu + ((u >> 16) & 1u);
    return u >> 16;
}

static __device__ __forceinline__ float rbf(float f) { return __uint_as_float(bf16_bits(f) << 16); }

static __device__ __forceinline__ float dot8(uint4 a, uint4 b) {
    float s = lo(a.x) * lo(b.x);
    s += hi(a.x) * hi(b.x);
    s += lo(a.y) * lo(b.y);
    s += hi(a.y) * hi(b.y);
    s += lo(a.z) * lo(b.z);
    s += hi(a.z) * hi(b.z);
    s += lo(a.w) * lo(b.w);
    s += hi(a.w) * hi(b.w);
    return s;
}

static __device__ __forceinline__ uint4 ld_stream(const bf16* p) {  // weights: read once
    uint4 r;
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w) : "l"(p));
    return r;
}

static __device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

static __device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

static __device__ __forceinline__ u32 smem_addr(const void* p) {
    u64 a;
    asm("cvta.to.shared.u64 %0, %1;" : "=l"(a) : "l"(p));
    return (u32)a;
}

static __device__ __forceinline__ float block_sum(float v, float* scratch) {
    v = warp_sum(v);
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    __syncthreads();  // scratch may still be read from the last sum
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    float s = 0.f;
#pragma unroll
    for (int w = 0; w < WARPS; ++w) s += scratch[w];
    return s;
}

#ifdef TRACE
// Traced (TRACE 1), thread 0 of a block stores the GPU's global timer at trace[block * 8 + at]: the
// 8 marks a block that tests/gpu/layer_phases.py reads. Untraced, nothing.
static __device__ __forceinline__ void mark_block(long long* trace, int at) {
#if TRACE
    if (threadIdx.x == 0) {
        long long now;
        asm volatile("mov.u64 %0, %globaltimer;" : "=l"(now));
        trace[blockIdx.x * 8 + at] = now;
    }
#endif
}
#endif

// Published values are strong (relaxed, gpu scope) stores, polled by strong loads: weak ones to
// other addresses may be held back behind a polling loop (seen: a warp's last activation never
// reached the readers).
static __device__ __forceinline__ u64 ld_poll_u64(const u64* p) {
    u64 r;
    asm volatile("ld.relaxed.gpu.global.u64 %0, [%1];" : "=l"(r) : "l"(p) : "memory");
    return r;
}

static __device__ __forceinline__ uint4 ld_poll_v4(const void* p) {
    uint4 r;
    asm volatile("ld.volatile.global.v4.u32 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w) : "l"(p) : "memory");
    return r;
}

#ifdef HIDDEN
// A thread's 8 values of the row (HIDDEN = 8 a thread) through transformers' RMSNorm: bfloat16
// of x / rms, times the weights, rounded; packed as the matrix-vector products read them.
static __device__ __forceinline__ uint4 normed_row(const float hv[8], uint4 gain, float eps, float* scratch) {
    const float gv[8] = {lo(gain.x), hi(gain.x), lo(gain.y), hi(gain.y),
                         lo(gain.z), hi(gain.z), lo(gain.w), hi(gain.w)};
    float ss = 0.f;
#pragma unroll
    for (int i = 0; i < 8; ++i) ss += hv[i] * hv[i];
    const float rstd = rsqrtf(block_sum(ss, scratch) / HIDDEN + eps);
    u32 nb[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) nb[i] = bf16_bits(rbf(hv[i] * rstd) * gv[i]);
    uint4 normed;
    normed.x = nb[0] | (nb[1] << 16);
    normed.y = nb[2] | (nb[3] << 16);
    normed.z = nb[4] | (nb[5] << 16);
    normed.w = nb[6] | (nb[7] << 16);
    return normed;
}
#endif

#ifdef EXPERTS
#define E_LANES (EXPERTS / 32)
// One warp's routing of the EXPERTS router logits, as published (tag << 32 | float bits; lane l
// holds logits j * 32 + l): softmax and the top TOP_K (the lowest index on a tie, as a stable
// sort). Lane k < TOP_K gets the k-th expert and its probability; every lane the top k's sum, in
// rank order as transformers adds them. route_weight gives the weight to apply.
//
// A round of the top k is one warp-wide max of a 32-bit key per expert: the logit's bfloat16 bits
// made order-preserving, above 0xffff minus the expert's index (the logits are bfloat16 values, as
// transformers' linear rounds them; a higher logit is a higher probability, and the lower index
// wins a tie), so a round is four compares and one redux.sync; the softmax runs beside the rounds,
// not before them (rounds of argmax over the probabilities, a value and an index shuffled at each
// of five steps, took about 1 µs more on an H200).
static __device__ __forceinline__ u32 route_key(u64 slot, int expert) {
    u32 bits = ((u32)slot >> 16) & 0xffffu;  // the logit's bfloat16 bits (exact: it was rounded)
    if (bits == 0x8000u) bits = 0u;  // -0 ties with +0
    const u32 ordered = (bits & 0x8000u) ? (~bits & 0xffffu) : (bits | 0x8000u);
    return (ordered << 16) | (0xffffu - (u32)expert);
}

static __device__ __forceinline__ void route_top_k(const u64 slot[E_LANES], int lane, float& mine, float& picked,
                                                   int& expert) {
    u32 key[E_LANES];
    float v[E_LANES], m = __int_as_float(0xff800000);
#pragma unroll
    for (int j = 0; j < E_LANES; ++j) {
        key[j] = route_key(slot[j], j * 32 + lane);
        v[j] = __uint_as_float((u32)slot[j]);
        m = fmaxf(m, v[j]);
    }
    int mine_expert = 0;
#pragma unroll
    for (int k = 0; k < TOP_K; ++k) {
        u32 local = key[0];
#pragma unroll
        for (int j = 1; j < E_LANES; ++j) local = max(local, key[j]);
        const u32 best = __reduce_max_sync(0xffffffffu, local);
        const int at = 0xffff - (int)(best & 0xffffu);
        if (lane == k) mine_expert = at;
#pragma unroll
        for (int j = 0; j < E_LANES; ++j)
            if (j * 32 + lane == at) key[j] = 0u;  // taken (no key is 0: its expert index would be 0xffff)
    }
    m = warp_max(m);
    float total = 0.f;
#pragma unroll
    for (int j = 0; j < E_LANES; ++j) {
        v[j] = __expf(v[j] - m);
        total += v[j];
    }
    total = warp_sum(total);
    float prob[E_LANES];
#pragma unroll
    for (int j = 0; j < E_LANES; ++j) prob[j] = v[j] / total;
    // Lane k's expert's probability from the lane that holds it; then the k's sum in rank order.
    mine = 0.f;
#pragma unroll
    for (int j = 0; j < E_LANES; ++j) {
        const float there = __shfl_sync(0xffffffffu, prob[j], mine_expert & 31);
        if ((mine_expert >> 5) == j) mine = there;
    }
    picked = 0.f;
#pragma unroll
    for (int k = 0; k < TOP_K; ++k) picked += __shfl_sync(0xffffffffu, mine, k);
    if (lane >= TOP_K) mine = 0.f;
    expert = mine_expert;
}

// A routed expert's weight: its probability, renormalised over the top k when NORMALIZE, rounded.
static __device__ __forceinline__ float route_weight(float mine, float picked) {
    return rbf(NORMALIZE ? mine / picked : mine);
}
#endif
