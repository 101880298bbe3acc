// A Qwen3-MoE decoder layer's MoE block for one decode row, as one kernel (executor/moe_experts.py).
//
// The layer's Triton chain reads the routed experts in two kernels (gate-up, then down) after a
// router kernel: 75 MB a layer in two reads that each ramp and drain, with the down rows read
// only after gate-up ends. Here NCTA blocks, one a multiprocessor, do it in one pass:
//
//   1. router: each block normalises the row (the post-attention RMSNorm) and publishes
//      EXPERTS / NCTA router logits; every block then reads all of them and routes (softmax,
//      top-k, renormalisation);
//   2. each block asks the copy engine for its share of the 8 routed experts' down rows
//      (DOWN_ROWS hidden units x 8 experts x INTER, into shared memory), and meanwhile streams its
//      share of the gate and up rows through registers: silu(gate) * up of UNITS units,
//      published;
//   3. each block reads every activation, applies its down rows from shared memory and adds the
//      routing-weighted sum to the residual.
//
// No grid barrier: a published value carries the launch's tag beside it in one store (a logit in
// 64 bits, an activation in 32), and a reader loads until every value it needs has this launch's
// tag. The tag is 1 + the parity of a per-layer launch count that block 0 advances once every
// block has published (so every block read the count before); the buffers start zeroed (tag 0).
//
// So the down rows and the gate and up rows are one 75 MB stream. The arithmetic rounds where the
// Triton kernels round (moe_layer_kernels: the norm, the logits, the activations, the routing
// weights and the residual in bfloat16; sums in float32). Launched as a programmatic dependent of
// the o projection: the router rows and the norm's weights are read before the wait.
//
// Compile-time sizes (NVRTC -D): HIDDEN, INTER, EXPERTS, TOP_K, NCTA, THREADS, NORMALIZE;
// TRIGGER (when the next kernel may launch: 0 past the wait, 3 once routed, 1 after gate-up,
// 2 at the end); DEPTH (gate-up units a warp has in flight); MIN_BLOCKS (launch bounds: blocks a
// multiprocessor must fit by registers, so the next kernel's programs find room); TRACE (1: each
// block's thread 0 stores the GPU's global timer at its phase points, tests/gpu/layer_phases.py).
//
// Every block must be resident at once (a block waits for values every other block publishes):
// one a multiprocessor, NCTA at most the GPU's multiprocessors (moe_experts.plan).

#define WARPS (THREADS / 32)
#define DOWN_ROWS (HIDDEN / NCTA)
#define BLOCKS_PER_PAIR (NCTA / TOP_K)
#define UNITS (INTER / BLOCKS_PER_PAIR)
#define UNITS_PER_WARP (UNITS / WARPS)
#define H_CHUNKS (HIDDEN / 256)
#define I_CHUNKS (INTER / 256)
#define LOGITS_PER_BLOCK (EXPERTS / NCTA)

#include "moe_kernel_common.cuh"

static_assert(HIDDEN == THREADS * 8, "each thread holds 8 of the row's HIDDEN values");
static_assert(HIDDEN % 256 == 0 && INTER % 256 == 0, "rows are read in 256-value chunks a warp");
static_assert(HIDDEN % NCTA == 0 && NCTA % TOP_K == 0, "blocks split the hidden units and the pairs");
static_assert(INTER % BLOCKS_PER_PAIR == 0 && UNITS % WARPS == 0, "blocks and warps split the units");
static_assert(EXPERTS % 32 == 0 && EXPERTS % NCTA == 0 && TOP_K <= 32, "experts per lane and block");

#define S_DOWN_BYTES (TOP_K * DOWN_ROWS * INTER * 2)
#define S_ACT_BYTES (TOP_K * INTER * 4)
#define S_X_BYTES (HIDDEN * 2)
static_assert(DOWN_ROWS <= THREADS && TOP_K * DOWN_ROWS * 4 <= S_X_BYTES, "a thread a down row; the parts fit");

// Marks (mark_block): 0 entry, 1 past the wait, 2 logits stored, 3 routed, 4 gate-up done, 5 end,
// 6 every activation read, 7 down rows arrived.

static __device__ __forceinline__ bool tagged(u32 w, u32 tag) { return (w >> 16) == tag; }

// Traced, a wait gives up after this many polls and says what it saw at trace[NCTA + block]
// (tests/gpu/layer_phases.py reads the marks; a wait that never ends is then a report, not a hang).
#if TRACE
#define GIVE_UP(spins) (++(spins) > (1 << 22))
#else
#define GIVE_UP(spins) false
#endif

extern "C" __global__ void __launch_bounds__(THREADS, MIN_BLOCKS) moe_experts_row(
    const bf16* __restrict__ mid,       // [HIDDEN] the attention block's output + residual
    const bf16* __restrict__ post_norm, // [HIDDEN]
    const bf16* __restrict__ router,    // [EXPERTS, HIDDEN]
    const bf16* __restrict__ gate_up,   // [EXPERTS, 2 INTER, HIDDEN], gate rows first
    const bf16* __restrict__ down,      // [EXPERTS, HIDDEN, INTER]
    u64* logits,                        // [EXPERTS] (tag << 32 | float bits), zeroed once
    u32* act,                           // [TOP_K, INTER] (tag << 16 | bfloat16 bits), zeroed once
    bf16* route_weights,                // [TOP_K] the routing, for the record
    long long* route_index,             // [TOP_K]
    u32* launches,                      // this layer's launch count
    bf16* __restrict__ out,             // [HIDDEN]
    float eps,
    long long* trace) {                 // [NCTA, 8] when TRACE
    extern __shared__ __align__(128) unsigned char smem[];
    bf16* s_down = (bf16*)smem;                              // [TOP_K][DOWN_ROWS][INTER]
    float* s_act = (float*)(smem + S_DOWN_BYTES);            // [TOP_K][INTER]
    bf16* s_x = (bf16*)(smem + S_DOWN_BYTES + S_ACT_BYTES);  // [HIDDEN] the normed row
    float* s_sum = (float*)(smem + S_DOWN_BYTES + S_ACT_BYTES + S_X_BYTES);  // [WARPS]
    float* s_weight = s_sum + 32;                            // [TOP_K]
    int* s_expert = (int*)(s_weight + 32);                   // [TOP_K]
    u64* s_bar = (u64*)(s_expert + 32);                      // the down rows' arrival

    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, block = blockIdx.x;
    mark_block(trace, 0);

    // Before the wait: what does not come from the o projection.
    const uint4 gain = *(const uint4*)(post_norm + tid * 8);
    uint4 wrow[LOGITS_PER_BLOCK];
#pragma unroll
    for (int j = 0; j < LOGITS_PER_BLOCK; ++j)
        wrow[j] = ld_stream(router + (size_t)(block * LOGITS_PER_BLOCK + j) * HIDDEN + tid * 8);
    const u32 launch = __ldcg(launches);  // advanced by block 0 once every block has read it
    const u32 tag = 1u + (launch & 1u);
    if (tid == 0) {
        asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(smem_addr(s_bar)));
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    asm volatile("griddepcontrol.wait;" ::: "memory");
    mark_block(trace, 1);
#if TRIGGER == 0
    asm volatile("griddepcontrol.launch_dependents;");
#endif

    // 1. The post-attention norm of the row, as transformers' RMSNorm rounds it, and the logits.
    const uint4 h = __ldcg((const uint4*)(mid + tid * 8));
    const float hv[8] = {lo(h.x), hi(h.x), lo(h.y), hi(h.y), lo(h.z), hi(h.z), lo(h.w), hi(h.w)};
    const uint4 normed = normed_row(hv, gain, eps, s_sum);
    *(uint4*)(s_x + tid * 8) = normed;
#pragma unroll
    for (int j = 0; j < LOGITS_PER_BLOCK; ++j) {
        const float logit = rbf(block_sum(dot8(wrow[j], normed), s_sum));  // transformers' linear rounds
        if (tid == 0) {
            const u64 value = ((u64)tag << 32) | __float_as_uint(logit);
            asm volatile("st.relaxed.gpu.global.u64 [%0], %1;" ::"l"(logits + block * LOGITS_PER_BLOCK + j), "l"(value)
                         : "memory");
        }
    }
    mark_block(trace, 2);

    // Routing (every block, warp 0): softmax over the experts, the top k (the lowest index on a
    // tie, as a stable sort), their weights renormalised when asked, rounded to bfloat16.
    if (warp == 0) {
        u64 slot[E_LANES];
        bool ready;
        [[maybe_unused]] int spins = 0;
        do {  // every block's logits, published with this launch's tag
            ready = true;
#pragma unroll
            for (int j = 0; j < E_LANES; ++j) {
                slot[j] = ld_poll_u64(logits + j * 32 + lane);
                ready = ready && (u32)(slot[j] >> 32) == tag;
            }
            if (GIVE_UP(spins)) {
                const int seen = __popc(__ballot_sync(0xffffffffu, ready));
                if (lane == 0) {
                    trace[(NCTA + block) * 8 + 0] = 1000 + tag;
                    trace[(NCTA + block) * 8 + 1] = seen;
                    trace[(NCTA + block) * 8 + 2] = (long long)slot[0];
                    trace[(NCTA + block) * 8 + 3] = launch;
                }
                break;
            }
        } while (!__all_sync(0xffffffffu, ready));
        float mine, picked;
        int mine_expert;
        route_top_k(slot, lane, mine, picked, mine_expert);
        if (lane < TOP_K) {
            const float weight = route_weight(mine, picked);
            s_weight[lane] = weight;
            s_expert[lane] = mine_expert;
            if (block == 0) {
                route_weights[lane] = (bf16)bf16_bits(weight);
                route_index[lane] = mine_expert;
            }
        }
    }
    __syncthreads();
    mark_block(trace, 3);
#if TRIGGER == 3
    asm volatile("griddepcontrol.launch_dependents;");
#endif

    // 2. This block's down rows of every routed expert, by the copy engine, into shared memory.
    if (tid == 0) {
        const u32 bar = smem_addr(s_bar);
        asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(S_DOWN_BYTES)
                     : "memory");
#pragma unroll 1
        for (int k = 0; k < TOP_K; ++k) {
            const bf16* src = down + ((size_t)s_expert[k] * HIDDEN + (size_t)block * DOWN_ROWS) * INTER;
            asm volatile(
                "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                    smem_addr(s_down + k * DOWN_ROWS * INTER)),
                "l"(src), "r"(DOWN_ROWS * INTER * 2), "r"(bar)
                : "memory");
        }
    }
    // Meanwhile the gate and up rows of this block's units of its pair's expert, DEPTH units a
    // warp in flight.
    const int pair = block / BLOCKS_PER_PAIR;
    const int first_unit = (block % BLOCKS_PER_PAIR) * UNITS;
    const bf16* expert_rows = gate_up + (size_t)s_expert[pair] * 2 * INTER * HIDDEN;
    uint4 buf[DEPTH][2 * H_CHUNKS];
#pragma unroll
    for (int u = 0; u < UNITS_PER_WARP + DEPTH - 1; ++u) {
        if (u < UNITS_PER_WARP) {
            const int unit = first_unit + u * WARPS + warp;
            const bf16* gate = expert_rows + (size_t)unit * HIDDEN + lane * 8;
            const bf16* up = gate + (size_t)INTER * HIDDEN;
#pragma unroll
            for (int c = 0; c < H_CHUNKS; ++c) {
                buf[u % DEPTH][c] = ld_stream(gate + c * 256);
                buf[u % DEPTH][H_CHUNKS + c] = ld_stream(up + c * 256);
            }
        }
        const int done = u - (DEPTH - 1);
        if (done >= 0) {
            float g = 0.f, p = 0.f;
#pragma unroll
            for (int c = 0; c < H_CHUNKS; ++c) {
                const uint4 x = *(const uint4*)(s_x + c * 256 + lane * 8);
                g += dot8(buf[done % DEPTH][c], x);
                p += dot8(buf[done % DEPTH][H_CHUNKS + c], x);
            }
            g = warp_sum(g);
            p = warp_sum(p);
            if (lane == 0) {
                const int unit = first_unit + done * WARPS + warp;
                const u32 value = (tag << 16) | bf16_bits(g / (1.f + __expf(-g)) * p);  // silu(gate) * up
                asm volatile("st.relaxed.gpu.global.u32 [%0], %1;" ::"l"(act + pair * INTER + unit), "r"(value) : "memory");
            }
        }
    }
    asm volatile("fence.acq_rel.gpu;" ::: "memory");  // this thread's activations go out before it polls
    mark_block(trace, 4);
#if TRIGGER == 1
    asm volatile("griddepcontrol.launch_dependents;");
#endif

    // 3. Every block's activations, as float, once each has this launch's tag.
    static_assert((TOP_K * INTER / 4) % THREADS == 0, "threads split the activations in fours");
#define ACT_LOADS (TOP_K * INTER / 4 / THREADS)
    uint4 got[ACT_LOADS];
    bool ready;
    [[maybe_unused]] int spins = 0;
    do {
        ready = true;
        int missing = -1;
#pragma unroll
        for (int j = 0; j < ACT_LOADS; ++j) {
            got[j] = ld_poll_v4(act + (j * THREADS + tid) * 4);
            const bool all = tagged(got[j].x, tag) && tagged(got[j].y, tag) && tagged(got[j].z, tag) &&
                             tagged(got[j].w, tag);
            if (!all && missing < 0) missing = (j * THREADS + tid) * 4;
            ready = ready && all;
        }
        if (GIVE_UP(spins)) {
            trace[(NCTA + block) * 8 + 4] = 2000 + tag;
            trace[(NCTA + block) * 8 + 5] = missing;
            trace[(NCTA + block) * 8 + 6] = got[0].x;
            break;
        }
    } while (!ready);
#pragma unroll
    for (int j = 0; j < ACT_LOADS; ++j)
        *(float4*)(s_act + (j * THREADS + tid) * 4) =
            make_float4(lo(got[j].x), lo(got[j].y), lo(got[j].z), lo(got[j].w));
    if (block == 0) {  // every block has published, so every block has read the launch count
        __syncthreads();
        if (tid == 0) __stcg(launches, launch + 1u);
    }
    mark_block(trace, 6);
    if (tid == 0) {
        const u32 bar = smem_addr(s_bar);
        u32 ready = 0;
        [[maybe_unused]] int spins = 0;
        while (!ready && !GIVE_UP(spins))
            asm volatile(
                "{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], 0; selp.u32 %0, 1, 0, p; }"
                : "=r"(ready)
                : "r"(bar)
                : "memory");
        if (!ready) trace[(NCTA + block) * 8 + 7] = 3000;
    }
    __syncthreads();
    mark_block(trace, 7);
    // Warp w takes experts w, w + WARPS, ..: its activations in registers, each of the block's
    // down rows of that expert from shared memory once; then a thread a row sums the experts'
    // routing-weighted parts in expert order.
    float* s_part = (float*)s_x;  // [TOP_K][DOWN_ROWS]: the normed row is no longer read
    for (int k = warp; k < TOP_K; k += WARPS) {
        float a[I_CHUNKS][8];
#pragma unroll
        for (int c = 0; c < I_CHUNKS; ++c) {
            const float4 a0 = *(const float4*)(s_act + k * INTER + c * 256 + lane * 8);
            const float4 a1 = *(const float4*)(s_act + k * INTER + c * 256 + lane * 8 + 4);
            a[c][0] = a0.x, a[c][1] = a0.y, a[c][2] = a0.z, a[c][3] = a0.w;
            a[c][4] = a1.x, a[c][5] = a1.y, a[c][6] = a1.z, a[c][7] = a1.w;
        }
        float part[DOWN_ROWS];
#pragma unroll
        for (int row = 0; row < DOWN_ROWS; ++row) {
            float p = 0.f;
#pragma unroll
            for (int c = 0; c < I_CHUNKS; ++c) {
                const uint4 w = *(const uint4*)(s_down + (k * DOWN_ROWS + row) * INTER + c * 256 + lane * 8);
                p += lo(w.x) * a[c][0] + hi(w.x) * a[c][1] + lo(w.y) * a[c][2] + hi(w.y) * a[c][3] +
                     lo(w.z) * a[c][4] + hi(w.z) * a[c][5] + lo(w.w) * a[c][6] + hi(w.w) * a[c][7];
            }
            part[row] = p;
        }
#pragma unroll
        for (int row = 0; row < DOWN_ROWS; ++row) {
            const float total = warp_sum(part[row]);
            if (lane == 0) s_part[k * DOWN_ROWS + row] = total;
        }
    }
    __syncthreads();
    if (tid < DOWN_ROWS) {
        float sum = 0.f;
#pragma unroll
        for (int k = 0; k < TOP_K; ++k) sum += s_part[k * DOWN_ROWS + tid] * s_weight[k];
        const int unit = block * DOWN_ROWS + tid;
        const float res = __uint_as_float((u32)mid[unit] << 16);
        out[unit] = (bf16)bf16_bits(res + rbf(sum));  // transformers' residual + moe
    }
    mark_block(trace, 5);
#if TRIGGER == 2
    asm volatile("griddepcontrol.launch_dependents;");
#endif
}
