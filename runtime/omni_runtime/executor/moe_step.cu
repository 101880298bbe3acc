// A Qwen3-MoE thinker's decode step for one row, every layer in one kernel (executor/moe_step.py).
//
// At one row the fused decode layer runs four kernels a layer (q/k/v, attention, o, the MoE
// block); between them the GPU drains and ramps, and while the attention and the router wait on
// their short dependency chains HBM idles. Here NCTA blocks, one a multiprocessor, run LAYERS
// layers in turn without leaving the kernel, and each phase's weights are copied into shared
// memory by the copy engine (cp.async.bulk) while the phase before still works or waits:
//
//   A. q/k/v: the layer's input (every block's 2048 values) normalised (input RMSNorm), this
//      block's QKV_PER_BLOCK rows of the fused q/k/v weight (in shared memory since the last
//      layer's down phase) against it, published;
//   B. attention: block b < KV_HEADS x splits takes (key/value head b % KV_HEADS, split of the
//      cached keys b / KV_HEADS): the q and k norms and the rotary embedding of its head group,
//      the new key and value written to the cache (split 0), an online softmax over the split's
//      cached keys (a warp a query head, a lane a key, then a lane four dimensions); the last
//      split of a head to finish (a counter it resets) adds the new key's term, merges the
//      splits and publishes the group's output. Meanwhile the copy engine brings this block's
//      o rows;
//   C. o: every attention output against this block's O_ROWS rows, the residual added, published;
//   D. the MoE block as moe_experts.cu does it: the post-attention norm and a router logit a
//      block, published; routing; the down rows of the 8 routed experts copied in while the gate
//      and up rows stream through registers; the activations published; the down rows against
//      them, the residual added: the layer's output, published for the next layer (the last
//      layer stores it to ``out``). Then the next layer's q/k/v rows are asked for.
//
// Exchanges: a published value carries the launch's tag in the same store (a bfloat16 value's
// 32-bit word: tag << 16 | bits; a logit in 64 bits), every layer has its own words (the
// workspace), and a reader loads until every value it needs has this launch's tag (1 + the parity
// of a launch count that block 0 advances once every block has published a value of layer 0,
// so every block read the count before). Published values are relaxed gpu-scope stores polled by
// volatile or relaxed loads (a weak store may be held back behind a polling loop).
//
// The arithmetic rounds where the Triton kernels of moe_layer_kernels and transformers round
// (each norm, projection, activation, routing weight and residual in bfloat16; sums in float32).
//
// Compile-time sizes (NVRTC -D): HIDDEN, HEADS, KV_HEADS, HEAD_DIM (128), INTER, EXPERTS, TOP_K,
// NCTA, THREADS (HIDDEN / 8), NORMALIZE; launch values a sweep may change (tests/gpu/step_phases.py
// --vary): POLL_NS (a waiting thread's pause between polls), MIN_KEYS (least cached keys a split);
// TRACE (1: block thread 0 stores the
// global timer at phase points of layer TRACE_LAYER, and a wait gives up after 4M polls and says
// so); WORKSPACE_WORDS, COUNTS_AT, FIELDS and SHARED_BYTES (moe_step.py's layout, checked here).
//
// Every block must be resident at once: one a multiprocessor, NCTA at most the multiprocessors.

#define WARPS (THREADS / 32)
#define GROUPS (HEADS / KV_HEADS)
#define Q_ROWS (HEADS * HEAD_DIM)
#define QKV_ROWS ((HEADS + 2 * KV_HEADS) * HEAD_DIM)
#define QKV_PER_BLOCK (QKV_ROWS / NCTA)
#define O_ROWS (HIDDEN / NCTA)
#define BLOCKS_PER_PAIR (NCTA / TOP_K)
#define UNITS (INTER / BLOCKS_PER_PAIR)
#define UNITS_PER_WARP (UNITS / WARPS)
#define H_CHUNKS (HIDDEN / 256)
#define O_CHUNKS (Q_ROWS / 256)
#define I_CHUNKS (INTER / 256)
#define LOGITS_PER_BLOCK (EXPERTS / NCTA)
#define SPLITS_MAX (NCTA / KV_HEADS)
#define KEY_CHUNK 32

#include "moe_kernel_common.cuh"
#ifndef POLL_NS
#define POLL_NS 64  // a waiting thread's pause between polls
#endif
#ifndef MIN_KEYS
#define MIN_KEYS 64  // least cached keys a split
#endif

static_assert(HIDDEN == THREADS * 8, "each thread holds 8 of the row's HIDDEN values");
static_assert(HEAD_DIM == 128 && GROUPS == WARPS, "a warp a query head of a group, a lane 4 dimensions");
static_assert(QKV_ROWS % NCTA == 0 && QKV_PER_BLOCK % WARPS == 0, "blocks and warps split the q/k/v rows");
static_assert(O_ROWS % (2 * WARPS) == 0 && O_ROWS <= 32, "warps split the o rows, two at a time");
static_assert(HIDDEN % 256 == 0 && INTER % 256 == 0 && Q_ROWS % 256 == 0, "rows are read in 256-value chunks");
static_assert(HIDDEN % NCTA == 0 && NCTA % TOP_K == 0 && NCTA % KV_HEADS == 0, "blocks split the work");
static_assert(INTER % BLOCKS_PER_PAIR == 0 && UNITS % WARPS == 0, "blocks and warps split the units");
static_assert(EXPERTS % 32 == 0 && EXPERTS % NCTA == 0 && TOP_K <= 32, "experts per lane and block");
static_assert(Q_ROWS % (THREADS * 4) == 0, "threads split the attention output in fours");

// A layer's words in the workspace (u32 each; every region 16-byte aligned).
#define WS_X 0                                   // [HIDDEN] the layer's input (tagged), after layer 0
#define WS_QKV (WS_X + HIDDEN)                   // [QKV_ROWS]
#define WS_ATT (WS_QKV + QKV_ROWS)               // [Q_ROWS]
#define WS_MID (WS_ATT + Q_ROWS)                 // [HIDDEN] attention output + residual
#define WS_LOGITS (WS_MID + HIDDEN)              // [EXPERTS] u64
#define WS_ACT (WS_LOGITS + 2 * EXPERTS)         // [TOP_K * INTER]
#define WS_COUNT (WS_ACT + TOP_K * INTER)        // [KV_HEADS] splits done (padded to 32 words)
#define WS_ROUTE (WS_COUNT + 32)                 // [TOP_K] expert index, [TOP_K] weight bits
#define WS_M (WS_ROUTE + 2 * 32)                 // float [KV_HEADS * SPLITS_MAX * GROUPS]
#define WS_L (WS_M + KV_HEADS * SPLITS_MAX * GROUPS)
#define WS_ACC (WS_L + KV_HEADS * SPLITS_MAX * GROUPS)  // float [KV_HEADS * SPLITS_MAX * GROUPS * HEAD_DIM]
#define WS_WORDS (WS_ACC + KV_HEADS * SPLITS_MAX * GROUPS * HEAD_DIM)
// moe_step.py sizes the workspace and reads the counters and routing: its layout is this one.
static_assert(WS_WORDS == WORKSPACE_WORDS && WS_COUNT == COUNTS_AT, "moe_step.py's workspace layout differs");

// A layer's entry in the table: pointers, in this order.
enum { T_INPUT_NORM, T_QKV, T_Q_NORM, T_K_NORM, T_O, T_POST_NORM, T_ROUTER, T_GATE_UP, T_DOWN, T_KEYS,
       T_VALUES, T_WS, T_FIELDS };
static_assert(T_FIELDS == FIELDS, "moe_step.py's table has other fields");

#define MAX3(a, b, c) ((a) > (b) ? ((a) > (c) ? (a) : (c)) : ((b) > (c) ? (b) : (c)))
#define S_QKV_BYTES (QKV_PER_BLOCK * HIDDEN * 2)
#define S_O_BYTES (O_ROWS * Q_ROWS * 2)
#define S_DOWN_BYTES (TOP_K * O_ROWS * INTER * 2)
#define S_W_BYTES MAX3(S_QKV_BYTES, S_O_BYTES, S_DOWN_BYTES)
#define S_ACT_FLOATS (TOP_K * INTER > Q_ROWS ? TOP_K * INTER : Q_ROWS)  // activations, or the attention's output
#define S_X_BYTES (HIDDEN * 2)
// The weights, activations, a normed row, six arrays of 32 and the barrier (the kernel's layout).
static_assert(S_W_BYTES + S_ACT_FLOATS * 4 + S_X_BYTES + 32 * 4 * 6 + 8 <= SHARED_BYTES,
              "moe_step.py asks for less shared memory than the kernel lays out");

#if TRACE
#define MARKS 32
static __device__ __forceinline__ void mark(long long* trace, int layer, int at) {
    if (layer == TRACE_LAYER && threadIdx.x == 0) {
        long long now;
        asm volatile("mov.u64 %0, %globaltimer;" : "=l"(now));
        trace[blockIdx.x * MARKS + at] = now;
    }
}
#define GIVE_UP(spins) (++(spins) > (1 << 22))
// A wait that gave up: what it waited for, at trace[NCTA + block].
#define REPORT(trace, code, seen)                                      \
    do {                                                               \
        trace[(NCTA + blockIdx.x) * MARKS + 0] = (code);               \
        trace[(NCTA + blockIdx.x) * MARKS + 1] = (long long)(seen);    \
    } while (0)
#else
#define mark(trace, layer, at) ((void)0)
#define GIVE_UP(spins) false
#define REPORT(trace, code, seen) ((void)0)
#endif

static __device__ __forceinline__ void publish(u32* p, u32 tag, float value) {
    const u32 word = (tag << 16) | bf16_bits(value);
    asm volatile("st.relaxed.gpu.global.u32 [%0], %1;" ::"l"(p), "r"(word) : "memory");
}

// After a thread's publishing stores: a gpu-scope fence, so they go out before the thread polls.
static __device__ __forceinline__ void published() { asm volatile("fence.acq_rel.gpu;" ::: "memory"); }

static __device__ __forceinline__ bool tagged4(uint4 w, u32 tag) {
    return (w.x >> 16) == tag && (w.y >> 16) == tag && (w.z >> 16) == tag && (w.w >> 16) == tag;
}

// Four published values at p (16-byte aligned), once all have this launch's tag. Every lane of the
// warp calls it. While some lane's values are missing, only the first such lane polls (its values
// come from the same block as its neighbours', at about the same time), then the warp reads again:
// with every lane polling, the 30,000 polling threads crowded L2 for everyone.
static __device__ __forceinline__ uint4 wait4(const u32* p, u32 tag, long long* trace, int code) {
    uint4 got = ld_poll_v4(p);
    [[maybe_unused]] int spins = 0;
    unsigned missing;
    while ((missing = __ballot_sync(0xffffffffu, !tagged4(got, tag))) != 0) {
        if ((int)(threadIdx.x % 32) == __ffs(missing) - 1) {
            while (!tagged4(got, tag)) {
                __nanosleep(POLL_NS);
                got = ld_poll_v4(p);
                if (GIVE_UP(spins)) break;
            }
        }
        __syncwarp();
        if (!tagged4(got, tag)) got = ld_poll_v4(p);
        if (GIVE_UP(spins)) {
            REPORT(trace, code, got.x);
            break;
        }
    }
    return got;
}

// The copy engine's bulk copies into shared memory, counted on one mbarrier (thread 0 asks).
static __device__ __forceinline__ void expect(u64* bar, u32 bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_addr(bar)), "r"(bytes)
                 : "memory");
}

static __device__ __forceinline__ void bulk_copy(void* dst, const void* src, u32 bytes, u64* bar) {
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                     smem_addr(dst)),
                 "l"(src), "r"(bytes), "r"(smem_addr(bar))
                 : "memory");
}

// ``bytes`` from ``src`` into the weights' shared memory in pieces of at most 32 KB (thread 0);
// every thread must be done reading what was there (a __syncthreads before).
static __device__ __forceinline__ void fetch_rows(bf16* dst, const bf16* src, u32 bytes, u64* bar) {
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
    expect(bar, bytes);
    for (u32 at = 0; at < bytes; at += 32768u) {
        const u32 n = bytes - at < 32768u ? bytes - at : 32768u;
        bulk_copy((unsigned char*)dst + at, (const unsigned char*)src + at, n, bar);
    }
}

// Every thread waits for the copies of this phase (parity: the barrier's phase count so far).
static __device__ __forceinline__ void wait_rows(u64* bar, u32 parity, long long* trace) {
    u32 ready = 0;
    [[maybe_unused]] int spins = 0;
    while (!ready) {
        asm volatile(
            "{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }"
            : "=r"(ready)
            : "r"(smem_addr(bar)), "r"(parity)
            : "memory");
        if (!ready && GIVE_UP(spins)) {
            REPORT(trace, 9000 + parity, 0);
            break;
        }
    }
}

// Sums each of 2 O values across the warp, halving: every lane keeps the half of its values its
// bit O selects, adding its partner's; lane j ends with the total of value j in part[0].
template <int O>
static __device__ __forceinline__ void halve(float* part, int lane) {
    const bool upper = lane & O;
#pragma unroll
    for (int i = 0; i < O; ++i) {
        const float send = upper ? part[i] : part[i + O];
        const float keep = upper ? part[i + O] : part[i];
        part[i] = keep + __shfl_xor_sync(0xffffffffu, send, O);
    }
    if constexpr (O > 1) halve<O / 2>(part, lane);
}

// One unit's gate and up rows (the up rows INTER rows after), a lane's 8 values of each chunk.
static __device__ __forceinline__ void gate_up_load(uint4* buf, const bf16* gate) {
    const bf16* up = gate + (size_t)INTER * HIDDEN;
#pragma unroll
    for (int c = 0; c < H_CHUNKS; ++c) {
        buf[c] = ld_stream(gate + c * 256);
        buf[H_CHUNKS + c] = ld_stream(up + c * 256);
    }
}

// silu(gate) * up of one unit against the normed row, published by lane 0.
static __device__ __forceinline__ void gate_up_publish(const uint4* buf, const bf16* s_x, u32* dst, u32 tag, int lane) {
    float g = 0.f, p = 0.f;
#pragma unroll
    for (int c = 0; c < H_CHUNKS; ++c) {
        const uint4 x = *(const uint4*)(s_x + c * 256 + lane * 8);
        g += dot8(buf[c], x);
        p += dot8(buf[H_CHUNKS + c], x);
    }
    g = warp_sum(g);
    p = warp_sum(p);
    if (lane == 0) publish(dst, tag, g / (1.f + __expf(-g)) * p);
}

static __device__ __forceinline__ const bf16* field(const u64* table, int layer, int f) {
    return (const bf16*)__ldg(table + layer * T_FIELDS + f);
}

extern "C" __global__ void __launch_bounds__(THREADS, 1) moe_step_row(
    const u64* __restrict__ table,       // [LAYERS][T_FIELDS] each layer's weights, cache and workspace
    int layers,
    const bf16* __restrict__ hidden_in,  // [HIDDEN] the first layer's input
    const bf16* __restrict__ cos,        // [HEAD_DIM] the row's rotary tables
    const bf16* __restrict__ sin,
    const long long* __restrict__ write_pos,  // [1] the row's position: cached keys are before it
    long long stride_head,               // the cache's element strides (slot 0): key/value head,
    long long stride_pos,                //   position
    u32* launches,                       // this kernel's launch count
    bf16* __restrict__ out,              // [HIDDEN] the last layer's output
    float eps, float qk_eps, float scale,
    long long* trace) {                  // [2 NCTA, MARKS] when TRACE
    extern __shared__ __align__(128) unsigned char smem[];
    bf16* s_w = (bf16*)smem;                                    // q/k/v rows, then o rows, then down rows
    float* s_act = (float*)(smem + S_W_BYTES);                  // activations, or the attention's output
    bf16* s_x = (bf16*)(smem + S_W_BYTES + S_ACT_FLOATS * 4);   // [HIDDEN] a normed row
    float* s_sum = (float*)(s_x + HIDDEN);                      // [32]
    float* s_weight = s_sum + 32;                               // [32] routing weights
    int* s_expert = (int*)(s_weight + 32);                      // [32] routed experts
    float* s_res = (float*)(s_expert + 32);                     // [32] the layer input of this block's rows
    float* s_mid = s_res + 32;                                  // [32] the attention block's output of them
    int* s_flag = (int*)(s_mid + 32);                           // [32]
    u64* s_bar = (u64*)(s_flag + 32);                           // the copies' arrival

    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, block = blockIdx.x;
    u32 parity = 0;  // the copy barrier's phase

    // Before the wait: the launch's tag and the first layer's q/k/v rows.
    const u32 launch = __ldcg(launches);
    const u32 tag = 1u + (launch & 1u);
    if (tid == 0) {
        asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(smem_addr(s_bar)));
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
        fetch_rows(s_w, field(table, 0, T_QKV) + (size_t)block * QKV_PER_BLOCK * HIDDEN, S_QKV_BYTES, s_bar);
    }
    asm volatile("griddepcontrol.wait;" ::: "memory");
    __syncthreads();  // the barrier is initialised before anyone waits on it
    const int pos = (int)__ldg(write_pos);
    // Cached keys split among the blocks: SPLITS_MAX a head at most, at least MIN_KEYS each.
    int per = (pos + SPLITS_MAX - 1) / SPLITS_MAX;
    per = per < MIN_KEYS ? MIN_KEYS : (per + KEY_CHUNK - 1) / KEY_CHUNK * KEY_CHUNK;
    const int splits = pos > 0 ? (pos + per - 1) / per : 1;
    const int d0 = lane * 4;  // a lane's dimensions in the attention

#pragma unroll 1
    for (int layer = 0; layer < layers; ++layer) {
        u32* ws = (u32*)__ldg(table + layer * T_FIELDS + T_WS);
        mark(trace, layer, 0);

        // A. The layer's input, normalised; this block's q/k/v rows against it.
        float hv[8];
        if (layer == 0) {  // plain bfloat16, from the kernel before
            const uint4 x = __ldcg((const uint4*)(hidden_in + tid * 8));
            hv[0] = lo(x.x), hv[1] = hi(x.x), hv[2] = lo(x.y), hv[3] = hi(x.y);
            hv[4] = lo(x.z), hv[5] = hi(x.z), hv[6] = lo(x.w), hv[7] = hi(x.w);
        } else {  // published by the layer before
            const uint4 x0 = wait4(ws + WS_X + tid * 8, tag, trace, 100);
            const uint4 x1 = wait4(ws + WS_X + tid * 8 + 4, tag, trace, 101);
            hv[0] = lo(x0.x), hv[1] = lo(x0.y), hv[2] = lo(x0.z), hv[3] = lo(x0.w);
            hv[4] = lo(x1.x), hv[5] = lo(x1.y), hv[6] = lo(x1.z), hv[7] = lo(x1.w);
        }
        mark(trace, layer, 1);
        if (tid / (O_ROWS / 8) == block) {  // the residual of this block's o rows
#pragma unroll
            for (int i = 0; i < 8; ++i) s_res[(tid % (O_ROWS / 8)) * 8 + i] = hv[i];
        }
        {
            const uint4 gain = __ldg((const uint4*)(field(table, layer, T_INPUT_NORM) + tid * 8));
            *(uint4*)(s_x + tid * 8) = normed_row(hv, gain, eps, s_sum);
        }
        __syncthreads();
        wait_rows(s_bar, parity, trace);
        parity ^= 1u;
        mark(trace, layer, 2);
        {
            float qs[QKV_PER_BLOCK / WARPS];  // every row's dot product first, so the warp sums overlap
#pragma unroll
            for (int i = 0; i < QKV_PER_BLOCK / WARPS; ++i) qs[i] = 0.f;
#pragma unroll
            for (int c = 0; c < H_CHUNKS; ++c) {
                const uint4 x = *(const uint4*)(s_x + c * 256 + lane * 8);
#pragma unroll
                for (int i = 0; i < QKV_PER_BLOCK / WARPS; ++i)
                    qs[i] += dot8(*(const uint4*)(s_w + (i * WARPS + warp) * HIDDEN + c * 256 + lane * 8), x);
            }
#pragma unroll
            for (int i = 0; i < QKV_PER_BLOCK / WARPS; ++i) {
                const float total = warp_sum(qs[i]);
                if (lane == 0) publish(ws + WS_QKV + block * QKV_PER_BLOCK + i * WARPS + warp, tag, total);
            }
        }
        mark(trace, layer, 18);
        published();
        mark(trace, layer, 19);
        __syncthreads();  // the q/k/v rows are read: the o rows may come
        if (tid == 0)  // during the attention
            fetch_rows(s_w, field(table, layer, T_O) + (size_t)block * O_ROWS * Q_ROWS, S_O_BYTES, s_bar);
        mark(trace, layer, 3);

        // B. Attention, in the blocks that have a (head, split) of it.
        float* s_in = s_act;                 // [Q_ROWS] the attention's output, for the o rows
        if (block < KV_HEADS * splits) {
            const int head = block % KV_HEADS, split = block / KV_HEADS;
            const u32* group = ws + WS_QKV + (head * GROUPS + warp) * HEAD_DIM;
            const uint4 qw = wait4(group + d0, tag, trace, 200);
            const uint4 kw = wait4(ws + WS_QKV + (HEADS + head) * HEAD_DIM + d0, tag, trace, 201);
            const uint4 vw = wait4(ws + WS_QKV + (HEADS + KV_HEADS + head) * HEAD_DIM + d0, tag, trace, 202);
            mark(trace, layer, 4);
            const float q[4] = {lo(qw.x), lo(qw.y), lo(qw.z), lo(qw.w)};
            const float k[4] = {lo(kw.x), lo(kw.y), lo(kw.z), lo(kw.w)};
            const float v_new[4] = {lo(vw.x), lo(vw.y), lo(vw.z), lo(vw.w)};
            const uint2 wq2 = __ldg((const uint2*)(field(table, layer, T_Q_NORM) + d0));
            const uint2 wk2 = __ldg((const uint2*)(field(table, layer, T_K_NORM) + d0));
            const uint2 c2 = __ldg((const uint2*)(cos + d0));
            const uint2 s2 = __ldg((const uint2*)(sin + d0));
            const float wq[4] = {lo(wq2.x), hi(wq2.x), lo(wq2.y), hi(wq2.y)};
            const float wk[4] = {lo(wk2.x), hi(wk2.x), lo(wk2.y), hi(wk2.y)};
            const float cs[4] = {lo(c2.x), hi(c2.x), lo(c2.y), hi(c2.y)};
            const float sn[4] = {lo(s2.x), hi(s2.x), lo(s2.y), hi(s2.y)};
            const float sign = lane < 16 ? -1.f : 1.f;  // rotate_half: (-x2, x1)
            float qss = 0.f, kss = 0.f;
#pragma unroll
            for (int i = 0; i < 4; ++i) qss += q[i] * q[i], kss += k[i] * k[i];
            const float q_rstd = rsqrtf(warp_sum(qss) / HEAD_DIM + qk_eps);
            const float k_rstd = rsqrtf(warp_sum(kss) / HEAD_DIM + qk_eps);
            float query[4], key_new[4];
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                const float qn = rbf(rbf(q[i] * q_rstd) * wq[i]);
                const float kn = rbf(rbf(k[i] * k_rstd) * wk[i]);
                const float qn_rot = __shfl_xor_sync(0xffffffffu, qn, 16);
                const float kn_rot = __shfl_xor_sync(0xffffffffu, kn, 16);
                query[i] = rbf(qn * cs[i] + sign * qn_rot * sn[i]);
                key_new[i] = rbf(kn * cs[i] + sign * kn_rot * sn[i]);
            }
            bf16* keys = (bf16*)field(table, layer, T_KEYS) + head * stride_head;
            bf16* values = (bf16*)field(table, layer, T_VALUES) + head * stride_head;
            if (split == 0 && warp == 0) {
                *(uint2*)(keys + pos * stride_pos + d0) =
                    make_uint2(bf16_bits(key_new[0]) | (bf16_bits(key_new[1]) << 16),
                               bf16_bits(key_new[2]) | (bf16_bits(key_new[3]) << 16));
                *(uint2*)(values + pos * stride_pos + d0) = make_uint2((vw.x & 0xffffu) | (vw.y << 16), (vw.z & 0xffffu) | (vw.w << 16));
            }
            // This split's cached keys, a warp a query head and a lane 4 dimensions: each key's
            // partial dot products summed across the warp by halving (lane j ends with key j's).
            const int start = split * per;
            const int end = start + per < pos ? start + per : pos;
            float m = __int_as_float(0xff800000), l = 0.f, acc[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll 1
            for (int first = start; first < end; first += KEY_CHUNK) {
                const int n = end - first < KEY_CHUNK ? end - first : KEY_CHUNK;
                uint2 kk[KEY_CHUNK], vv[KEY_CHUNK];  // the chunk's key and value rows, asked for at once
#pragma unroll
                for (int j = 0; j < KEY_CHUNK; ++j) {
                    const size_t row = (size_t)(first + (j < n ? j : 0)) * stride_pos + d0;
                    kk[j] = __ldg((const uint2*)(keys + row));
                    vv[j] = __ldg((const uint2*)(values + row));
                }
                float part[KEY_CHUNK];
#pragma unroll
                for (int j = 0; j < KEY_CHUNK; ++j)
                    part[j] = query[0] * lo(kk[j].x) + query[1] * hi(kk[j].x) + query[2] * lo(kk[j].y) +
                              query[3] * hi(kk[j].y);
                halve<KEY_CHUNK / 2>(part, lane);
                const float s = lane < n ? part[0] * scale : __int_as_float(0xff800000);
                const float m_new = fmaxf(m, warp_max(s));
                const float m_safe = m_new == __int_as_float(0xff800000) ? 0.f : m_new;
                const float alpha = __expf(m - m_safe);
                const float p = __expf(s - m_safe);
                l = l * alpha + warp_sum(p);
                const float pb = rbf(p);  // the Triton kernel's p @ v takes p in bfloat16
#pragma unroll
                for (int i = 0; i < 4; ++i) acc[i] *= alpha;
#pragma unroll
                for (int j = 0; j < KEY_CHUNK; ++j) {
                    const float pj = __shfl_sync(0xffffffffu, pb, j);  // zero past the split's end
                    acc[0] += pj * lo(vv[j].x), acc[1] += pj * hi(vv[j].x);
                    acc[2] += pj * lo(vv[j].y), acc[3] += pj * hi(vv[j].y);
                }
                m = m_new;
            }
            mark(trace, layer, 16);
            const int at = (head * SPLITS_MAX + split) * GROUPS + warp;
            float* ws_m = (float*)(ws + WS_M);
            float* ws_l = (float*)(ws + WS_L);
            float* ws_acc = (float*)(ws + WS_ACC);
            if (lane == 0) ws_m[at] = m, ws_l[at] = l;
            *(float4*)(ws_acc + at * HEAD_DIM + d0) = make_float4(acc[0], acc[1], acc[2], acc[3]);
            asm volatile("fence.acq_rel.gpu;" ::: "memory");  // the partials before the count
            __syncthreads();
            mark(trace, layer, 5);
            if (tid == 0) s_flag[0] = atomicAdd(ws + WS_COUNT + head, 1u) == (u32)(splits - 1);
            __syncthreads();
            if (s_flag[0]) {  // the last split of this head: the new key's term, then every split
                asm volatile("fence.acq_rel.gpu;" ::: "memory");  // every split's partials after it
                // Lane s holds split s's maximum and denominator; every split's value sums are
                // asked for at once (16 at a time).
                const float mine = warp_sum(query[0] * key_new[0] + query[1] * key_new[1] + query[2] * key_new[2] +
                                            query[3] * key_new[3]) * scale;
                float m_s = __int_as_float(0xff800000), l_s = 0.f;
                if (lane < splits) {
                    m_s = __ldcg(ws_m + (head * SPLITS_MAX + lane) * GROUPS + warp);
                    l_s = __ldcg(ws_l + (head * SPLITS_MAX + lane) * GROUPS + warp);
                }
                const float top = fmaxf(mine, warp_max(m_s));
                const float w_s = __expf(m_s - top);  // zero for a split with no key
                const float w_new = __expf(mine - top);
                const float total = w_new + warp_sum(l_s * w_s);
                float o[4] = {v_new[0] * w_new, v_new[1] * w_new, v_new[2] * w_new, v_new[3] * w_new};
#pragma unroll
                for (int half = 0; half < SPLITS_MAX; half += 16) {
                    float4 parts[16];
#pragma unroll
                    for (int j = 0; j < 16; ++j) {
                        const int sp = half + j < splits ? half + j : 0;
                        parts[j] = __ldcg((const float4*)(ws_acc + ((head * SPLITS_MAX + sp) * GROUPS + warp) * HEAD_DIM + d0));
                    }
#pragma unroll
                    for (int j = 0; j < 16; ++j) {
                        const float w = __shfl_sync(0xffffffffu, w_s, half + j);  // zero past the last split
                        o[0] += parts[j].x * w, o[1] += parts[j].y * w, o[2] += parts[j].z * w, o[3] += parts[j].w * w;
                    }
                }
                if (tid == 0) atomicExch(ws + WS_COUNT + head, 0u);  // (next used by the next launch)

                __syncthreads();
                u32* dst = ws + WS_ATT + (head * GROUPS + warp) * HEAD_DIM + d0;
#pragma unroll
                for (int i = 0; i < 4; ++i) publish(dst + i, tag, o[i] / total);
                published();
                mark(trace, layer, 6);
            }
            __syncthreads();  // the queries in shared memory are read
        }

        // C. Every attention output against this block's o rows, the residual added.
#pragma unroll
        for (int j = 0; j < Q_ROWS / (THREADS * 4); ++j) {
            const int at = (j * THREADS + tid) * 4;
            const uint4 a = wait4(ws + WS_ATT + at, tag, trace, 300);
            *(float4*)(s_in + at) = make_float4(lo(a.x), lo(a.y), lo(a.z), lo(a.w));
        }
        // Router row(s) of this block, for the MoE phase: they do not depend on anything.
        uint4 wrow[LOGITS_PER_BLOCK];
#pragma unroll
        for (int j = 0; j < LOGITS_PER_BLOCK; ++j)
            wrow[j] = ld_stream(field(table, layer, T_ROUTER) + (size_t)(block * LOGITS_PER_BLOCK + j) * HIDDEN + tid * 8);
        const uint4 post_gain = __ldg((const uint4*)(field(table, layer, T_POST_NORM) + tid * 8));
        __syncthreads();
        mark(trace, layer, 7);
        wait_rows(s_bar, parity, trace);
        parity ^= 1u;
#pragma unroll
        for (int i = 0; i < O_ROWS / WARPS; i += 2) {  // two rows a warp: each input chunk read once
            const int r0 = i * WARPS + warp, r1 = r0 + WARPS;
            float s0 = 0.f, s1 = 0.f;
#pragma unroll 4
            for (int c = 0; c < O_CHUNKS; ++c) {
                const uint4 w0 = *(const uint4*)(s_w + r0 * Q_ROWS + c * 256 + lane * 8);
                const uint4 w1 = *(const uint4*)(s_w + r1 * Q_ROWS + c * 256 + lane * 8);
                const float4 a0 = *(const float4*)(s_in + c * 256 + lane * 8);
                const float4 a1 = *(const float4*)(s_in + c * 256 + lane * 8 + 4);
                s0 += lo(w0.x) * a0.x + hi(w0.x) * a0.y + lo(w0.y) * a0.z + hi(w0.y) * a0.w + lo(w0.z) * a1.x +
                      hi(w0.z) * a1.y + lo(w0.w) * a1.z + hi(w0.w) * a1.w;
                s1 += lo(w1.x) * a0.x + hi(w1.x) * a0.y + lo(w1.y) * a0.z + hi(w1.y) * a0.w + lo(w1.z) * a1.x +
                      hi(w1.z) * a1.y + lo(w1.w) * a1.z + hi(w1.w) * a1.w;
            }
            s0 = warp_sum(s0);
            s1 = warp_sum(s1);
            if (lane == 0) {
                const float mid0 = rbf(s_res[r0] + rbf(s0));  // transformers: residual + o_proj(attention)
                const float mid1 = rbf(s_res[r1] + rbf(s1));
                s_mid[r0] = mid0, s_mid[r1] = mid1;
                publish(ws + WS_MID + block * O_ROWS + r0, tag, mid0);
                publish(ws + WS_MID + block * O_ROWS + r1, tag, mid1);
            }
        }
        mark(trace, layer, 24);
        published();
        mark(trace, layer, 8);

        // D. The MoE block. The post-attention norm of the row and this block's router logits.
        const uint4 h0 = wait4(ws + WS_MID + tid * 8, tag, trace, 400);
        const uint4 h1 = wait4(ws + WS_MID + tid * 8 + 4, tag, trace, 401);
        if (layer == 0 && block == 0) {  // every block has published: every block read the count
            __syncthreads();
            if (tid == 0) __stcg(launches, launch + 1u);
        }
        mark(trace, layer, 9);
        {
            const float hv2[8] = {lo(h0.x), lo(h0.y), lo(h0.z), lo(h0.w), lo(h1.x), lo(h1.y), lo(h1.z), lo(h1.w)};
            const uint4 normed = normed_row(hv2, post_gain, eps, s_sum);
            *(uint4*)(s_x + tid * 8) = normed;
            u64* logits = (u64*)(ws + WS_LOGITS);
#pragma unroll
            for (int j = 0; j < LOGITS_PER_BLOCK; ++j) {
                const float logit = rbf(block_sum(dot8(wrow[j], normed), s_sum));  // transformers' linear rounds
                if (tid == 0) {
                    const u64 value = ((u64)tag << 32) | __float_as_uint(logit);
                    asm volatile("st.relaxed.gpu.global.u64 [%0], %1;" ::"l"(logits + block * LOGITS_PER_BLOCK + j),
                                 "l"(value)
                                 : "memory");
                }
            }
        }
        mark(trace, layer, 10);
        // Routing (every block, warp 0, once every block's logit is out: route_top_k).
        if (warp == 0) {
            const u64* logits = (const u64*)(ws + WS_LOGITS);
            u64 slot[E_LANES];
            bool ready;
            [[maybe_unused]] int spins = 0;
            do {
                ready = true;
#pragma unroll
                for (int j = 0; j < E_LANES; ++j) {
                    slot[j] = ld_poll_u64(logits + j * 32 + lane);
                    ready = ready && (u32)(slot[j] >> 32) == tag;
                }
                if (GIVE_UP(spins)) {
                    REPORT(trace, 500, __popc(__ballot_sync(0xffffffffu, ready)));
                    break;
                }
                if (!__all_sync(0xffffffffu, ready)) __nanosleep(POLL_NS);
            } while (!__all_sync(0xffffffffu, ready));
            float mine, picked;
            int mine_expert;
            route_top_k(slot, lane, mine, picked, mine_expert);
            if (lane < TOP_K) {
                const float weight = route_weight(mine, picked);
                s_weight[lane] = weight;
                s_expert[lane] = mine_expert;
                if (block == 0) {
                    ws[WS_ROUTE + lane] = (u32)mine_expert;
                    ws[WS_ROUTE + 32 + lane] = bf16_bits(weight);
                }
            }
        }
        __syncthreads();  // routed; the o rows are read
        mark(trace, layer, 11);

        // This block's down rows of every routed expert, by the copy engine; meanwhile the gate
        // and up rows of this block's units of its pair's expert, two units a warp in flight.
        const bf16* down = field(table, layer, T_DOWN);
        if (tid == 0) {
            asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
            expect(s_bar, S_DOWN_BYTES);
#pragma unroll 1
            for (int k = 0; k < TOP_K; ++k)
                bulk_copy(s_w + k * O_ROWS * INTER, down + ((size_t)s_expert[k] * HIDDEN + (size_t)block * O_ROWS) * INTER,
                          O_ROWS * INTER * 2, s_bar);
        }
        {
            const int pair = block / BLOCKS_PER_PAIR;
            const int first_unit = (block % BLOCKS_PER_PAIR) * UNITS;
            const bf16* expert_rows = field(table, layer, T_GATE_UP) + (size_t)s_expert[pair] * 2 * INTER * HIDDEN;
            u32* act = ws + WS_ACT;
            static_assert(UNITS_PER_WARP % 2 == 0, "units go through two buffers in turn");
            uint4 buf0[2 * H_CHUNKS], buf1[2 * H_CHUNKS];
            const bf16* row0 = expert_rows + (size_t)(first_unit + warp) * HIDDEN + lane * 8;
            gate_up_load(buf0, row0);
#pragma unroll 1
            for (int u = 0; u < UNITS_PER_WARP; u += 2) {  // unit u in buf0, u + 1 in buf1
                const int unit = first_unit + u * WARPS + warp;
                gate_up_load(buf1, expert_rows + (size_t)(unit + WARPS) * HIDDEN + lane * 8);
                gate_up_publish(buf0, s_x, act + pair * INTER + unit, tag, lane);
                if (u + 2 < UNITS_PER_WARP) gate_up_load(buf0, expert_rows + (size_t)(unit + 2 * WARPS) * HIDDEN + lane * 8);
                gate_up_publish(buf1, s_x, act + pair * INTER + unit + WARPS, tag, lane);
            }
        }
        published();
        mark(trace, layer, 12);

        // Every block's activations, as float.
#pragma unroll
        for (int j = 0; j < TOP_K * INTER / 4 / THREADS; ++j) {
            const int at = (j * THREADS + tid) * 4;
            const uint4 a = wait4(ws + WS_ACT + at, tag, trace, 600);
            *(float4*)(s_act + at) = make_float4(lo(a.x), lo(a.y), lo(a.z), lo(a.w));
        }
        mark(trace, layer, 13);
        wait_rows(s_bar, parity, trace);
        parity ^= 1u;
        __syncthreads();
        mark(trace, layer, 14);
        // Warp w takes experts w, w + WARPS, ..; then a thread a row sums the routing-weighted parts.
        float* s_part = (float*)s_x;  // [TOP_K][O_ROWS]: the normed row is no longer read
        for (int k = warp; k < TOP_K; k += WARPS) {
            float a[I_CHUNKS][8];
#pragma unroll
            for (int c = 0; c < I_CHUNKS; ++c) {
                const float4 a0 = *(const float4*)(s_act + k * INTER + c * 256 + lane * 8);
                const float4 a1 = *(const float4*)(s_act + k * INTER + c * 256 + lane * 8 + 4);
                a[c][0] = a0.x, a[c][1] = a0.y, a[c][2] = a0.z, a[c][3] = a0.w;
                a[c][4] = a1.x, a[c][5] = a1.y, a[c][6] = a1.z, a[c][7] = a1.w;
            }
            float part[O_ROWS];  // every row's dot product first, so the warp sums overlap
#pragma unroll
            for (int row = 0; row < O_ROWS; ++row) {
                float p = 0.f;
#pragma unroll
                for (int c = 0; c < I_CHUNKS; ++c) {
                    const uint4 w = *(const uint4*)(s_w + (k * O_ROWS + row) * INTER + c * 256 + lane * 8);
                    p += lo(w.x) * a[c][0] + hi(w.x) * a[c][1] + lo(w.y) * a[c][2] + hi(w.y) * a[c][3] +
                         lo(w.z) * a[c][4] + hi(w.z) * a[c][5] + lo(w.w) * a[c][6] + hi(w.w) * a[c][7];
                }
                part[row] = p;
            }
#pragma unroll
            for (int row = 0; row < O_ROWS; ++row) {
                const float total = warp_sum(part[row]);
                if (lane == 0) s_part[k * O_ROWS + row] = total;
            }
        }
        mark(trace, layer, 20);
        __syncthreads();  // the down rows are read: the next layer's q/k/v rows may come
        if (tid < O_ROWS) {
            float sum = 0.f;
#pragma unroll
            for (int k = 0; k < TOP_K; ++k) sum += s_part[k * O_ROWS + tid] * s_weight[k];
            const int unit = block * O_ROWS + tid;
            const float value = rbf(s_mid[tid] + rbf(sum));  // transformers' residual + moe
            if (layer + 1 < layers) {
                u32* next = (u32*)__ldg(table + (layer + 1) * T_FIELDS + T_WS);
                publish(next + WS_X + unit, tag, value);
            } else {
                out[unit] = (bf16)bf16_bits(value);
            }
        }
        mark(trace, layer, 22);
        if (tid == 0 && layer + 1 < layers)  // during the hand-over to the next layer
            fetch_rows(s_w, field(table, layer + 1, T_QKV) + (size_t)block * QKV_PER_BLOCK * HIDDEN, S_QKV_BYTES,
                       s_bar);
        mark(trace, layer, 21);
        published();
        mark(trace, layer, 23);
        __syncthreads();  // s_part, s_res and s_mid are read before the next layer writes them
        mark(trace, layer, 15);
    }
}
