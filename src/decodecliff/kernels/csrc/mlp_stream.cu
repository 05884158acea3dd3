// A layer's MLP at a verify step's few rows as one persistent kernel:
//   h = silu(x Wg^T) * (x Wu^T),  y = h Wd^T (+ residual)
// At 16 rows both GEMMs are streams of their weights (99 MB a layer at Kimi K2's rank shapes), and
// each kernel of its own pays a few microseconds to fill the memory pipe and drain it. Here one CTA
// an SM streams its share of the gate|up weights, then, before it waits for every CTA's h at the
// one grid barrier, already issues the loads of its first down-projection tiles (no weight depends
// on an activation), so the pipe stays full across the two GEMMs.
//
// Measured, not in the engine: slower than cuBLAS's three launches on the H100 and the H200, its
// CTAs' equal shares finishing microseconds apart (notes/engine.md, "One persistent kernel for the
// MLP"). scripts/mlp_stream_bench.py builds, checks and times it; the build options
// (DCMLP_TILE_N, DCMLP_STAGES, DCMLP_L2_256, DCMLP_NO_PREFETCH, DCMLP_STAMPS, DCMLP_BULK: the ring
// filled by bulk copies of whole rows, sm_90 and later; DCMLP_QUEUE=U: chunks handed out in units
// of U as CTAs ask, in place of equal runs) are what it compared; the last two measured slower.
// DCMLP_PACKED takes the weights packed chunk by chunk (dcmlp_packed says how), so a chunk is one
// contiguous 16 KB read, and one bulk copy with DCMLP_BULK.
//
// Each GEMM is split "stream-K": its weight chunks (64 rows x 128 columns, or 32 x 256), ordered
// row block by row block, are dealt out in equal contiguous runs, one a CTA, so every CTA streams
// the same bytes (or, with DCMLP_QUEUE, in small units to whichever CTA asks next). A run that ends
// inside a row block leaves partial sums in the workspace; the CTA that completes a block (counted
// on an arrival counter) sums the block's partials in run order (the result does not depend on
// which CTA took what or came last) and applies the epilogue: silu(gate) * up
// for the gate|up blocks, whose rows are gate rows and the up rows of the same columns, and the
// residual add for the down blocks. It resets the counter, so the workspace is ready for the next
// call, in a CUDA graph too.
//
// sm_80, sm_90 and sm_120 alike: cp.async, ldmatrix and mma.sync; 80 KB of shared memory a CTA
// (96 KB with 32 x 256 chunks), checked against sm_120's 99 KB at compile time. The grid must be
// co-resident (at most dcmlp_ctas_per_sm() CTAs an SM; dcmlp_mlp refuses more): the barrier waits
// for every CTA.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "mla_ptx.cuh"

namespace dcmlp {
using namespace dcmla;

constexpr int kRows = 16;  // one m16 tile of activation rows
#ifndef DCMLP_TILE_N
#define DCMLP_TILE_N 64
#endif
constexpr int kTileN = DCMLP_TILE_N;      // weight rows a chunk: 64 or 32
constexpr int kTileK = 8192 / kTileN;     // columns a chunk: a 16 KB tile of weights
[[maybe_unused]] constexpr int kPieces = kTileK / 8;  // 16 B pieces of a tile row
#ifndef DCMLP_STAGES
#define DCMLP_STAGES 4
#endif
constexpr int kStages = DCMLP_STAGES;     // slots of the ring of chunks
constexpr int kThreads = 128;
constexpr int kWarpsN = kTileN / 16;      // warps over a chunk's rows (16 each: two n8 tiles)
constexpr int kWarpsK = 4 / kWarpsN;      // and over its columns (128 each)
// A tile's rows in shared memory: XOR-swizzled where 16 B copies place the pieces (or the weights
// come packed, pre-swizzled), padded by 16 B where bulk copies land rows whole (8 rows, 8 bank
// groups either way, for ldmatrix).
#ifdef DCMLP_BULK
constexpr bool kPadA = true;
#else
constexpr bool kPadA = false;
#endif
#if defined(DCMLP_BULK) && !defined(DCMLP_PACKED)
constexpr bool kPadW = true;
#else
constexpr bool kPadW = false;
#endif
constexpr int kWRowBytes = kTileK * 2 + (kPadW ? 16 : 0);
constexpr int kARowBytes = kTileK * 2 + (kPadA ? 16 : 0);
constexpr int kWBytes = kTileN * kWRowBytes;
constexpr int kABytes = kRows * kARowBytes;
[[maybe_unused]] constexpr int kChunk = kTileN * kTileK;  // a chunk's elements (DCMLP_PACKED:
                                                         // contiguous)
#ifdef DCMLP_PACKED
static_assert(kWBytes == kChunk * 2, "a packed chunk lands whole, unpadded");
#endif
constexpr int kStageBytes = kWBytes + kABytes;
constexpr int kSmemBytes = kStages * kStageBytes;  // 80 KB (64 x 128, 4 stages), 96 KB (32 x 256)
static_assert(kTileN == 64 || kTileN == 32, "a chunk is 64 or 32 weight rows");
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 1200
static_assert(kSmemBytes + 256 <= 101376, "sm_120 gives a block 99 KB of shared memory");
#endif

#ifdef DCMLP_STAMPS  // for the measurement: each CTA's clock at its start, A done, barrier passed, end
__device__ unsigned long long stamps[4096][4];
__device__ __forceinline__ void stamp(int at) {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  if (threadIdx.x == 0 && blockIdx.x < 4096) stamps[blockIdx.x][at] = t;
}
#else
__device__ __forceinline__ void stamp(int) {}
#endif
constexpr int kPartial = kRows * kTileN * kWarpsK;  // floats of an owner's sums of a block:
                                                    // one 16 x kTileN slot a column warp

// One GEMM of the two: out rows of `w` ([n, k] row-major) against `a` ([rows, k] row-major).
struct Gemm {
  const __nv_bfloat16* w;
  const __nv_bfloat16* a;
  int n, k;           // n: weight rows (a multiple of kTileN), k: a multiple of kTileK
  int gated;          // 1: rows [0, n/2) gate, [n/2, n) up; a block takes kTileN / 2 of each
  int* arrivals;      // [n / kTileN], zero between calls
  int* queue;         // DCMLP_QUEUE: the count of units handed out past the first, zero between calls
};

// The CTA whose run holds chunk c: the smallest b with end(b) > c.
__device__ __forceinline__ int cta_of(long long c, int grid, long long total) {
  return static_cast<int>(((c + 1) * grid + total - 1) / total) - 1;
}

// Who sums which chunks, and where their partial sums of a block go. By default an owner is a CTA
// and its run; with DCMLP_QUEUE=U an owner is a unit of U chunks, handed to whichever CTA asks
// next (so fast SMs take more), its sums in two slots (a unit of at most a block's chunks touches
// two blocks). Either way the finisher adds the owners' slots in owner order: the sums do not
// depend on which CTA took what, or finished last.
struct Parts {
  long long total;  // chunks of the GEMM
  int kchunks, grid, segs;

  __device__ Parts(const Gemm& g, int grid_, int segs_)
      : total(static_cast<long long>(g.n / kTileN) * (g.k / kTileK)),
        kchunks(g.k / kTileK), grid(grid_), segs(segs_) {}
#ifdef DCMLP_QUEUE
  static constexpr int kUnit = DCMLP_QUEUE;
  static_assert(kUnit >= 1, "a unit is one chunk or more");
  __device__ int owner_of(long long c) const { return static_cast<int>(c / kUnit); }
  __device__ long long first(int o) const { return static_cast<long long>(o) * kUnit; }
  __device__ bool idle(int) const { return false; }
  __device__ size_t slot(int o, int block) const {
    return static_cast<size_t>(o) * 2 + (block - first(o) / kchunks);
  }
#else
  __device__ int owner_of(long long c) const { return cta_of(c, grid, total); }
  __device__ long long first(int o) const { return total * o / grid; }
  __device__ bool idle(int o) const { return first(o) == total * (o + 1) / grid; }
  __device__ size_t slot(int o, int block) const {
    return static_cast<size_t>(o) * segs + (block - first(o) / kchunks);
  }
#endif
};

// An id's flag: its chunk is the first of a new owner's (a queue's next unit), so the chunk
// before it closes its owner's sums; the loop reads it instead of dividing 64-bit chunk indices.
constexpr int kFirstOfOwner = 1 << 30;
__device__ __forceinline__ int chunk_of(int id) { return id & ~kFirstOfOwner; }

// Thread 0's source of this CTA's chunks, in order (-1: no more). With DCMLP_QUEUE a CTA starts
// on the unit of its own index and asks the counter for the next one a unit ahead, so the atomic's
// round trip is hidden behind the unit's loads; every CTA that had a unit asks once past the last,
// and the asker of the last count resets the counter for the next call.
struct Feed {
  long long next = 0, end = 0;
#ifdef DCMLP_QUEUE
  int units = 0, grid = 0, ahead = 0;  // ahead: the counter's answer, read a unit later
  bool asked = false;
  int* counter = nullptr;

  __device__ void take(const Parts& p, int unit) {
    next = p.first(unit);
    end = next + Parts::kUnit < p.total ? next + Parts::kUnit : p.total;
    ahead = atomicAdd(counter, 1);
    asked = true;
  }
  __device__ void start(const Gemm& g, const Parts& p) {
    grid = p.grid, counter = g.queue;
    units = static_cast<int>((p.total + Parts::kUnit - 1) / Parts::kUnit);
    if (static_cast<int>(blockIdx.x) < units) take(p, blockIdx.x);
  }
  __device__ int pop(const Parts& p) {
    if (next != end) return static_cast<int>(next++);
    if (!asked) return -1;
    asked = false;
    if (ahead == units - 1) atomicExch(counter, 0);  // the last count handed out
    if (grid + ahead >= units) return -1;
    take(p, grid + ahead);
    return static_cast<int>(next++) | kFirstOfOwner;
  }
#else
  __device__ void start(const Gemm&, const Parts& p) {
    next = p.first(blockIdx.x), end = p.first(blockIdx.x + 1);
  }
  __device__ int pop(const Parts&) { return next < end ? static_cast<int>(next++) : -1; }
#endif
};

// The weight row a chunk's row r reads: a gate|up block is kTileN / 2 gate rows, then the up
// rows of the same columns.
__device__ __forceinline__ int weight_row(const Gemm& g, int block, int r) {
  if (!g.gated) return block * kTileN + r;
  int half = g.n / 2;
  return (r < kTileN / 2 ? 0 : half - kTileN / 2) + block * (kTileN / 2) + r;
}

// The first weight column of chunk c (its row block is c / (g.k / kTileK)).
__device__ __forceinline__ int first_column(const Gemm& g, int c) {
  return (c % (g.k / kTileK)) * kTileK;
}

// The byte offset of 16 B piece (row, piece) of a tile: XOR-swizzled by row, so that ldmatrix's
// 8 rows at one column land in 8 bank groups (a row is a multiple of 128 B), or in padded rows.
template <bool kPadded, int kRowBytes>
__device__ __forceinline__ uint32_t piece_at(int row, int piece) {
  return row * kRowBytes + ((kPadded ? piece : piece ^ (row & 7)) << 4);
}
__device__ __forceinline__ uint32_t w_at(int row, int piece) {
  return piece_at<kPadW, kWRowBytes>(row, piece);
}
__device__ __forceinline__ uint32_t a_at(int row, int piece) {
  return piece_at<kPadA, kARowBytes>(row, piece);
}

#ifdef DCMLP_BULK
// The ring's slots are filled by bulk copies (sm_90 and sm_120: the copy engine), one a weight or
// activation row, and each slot's mbarrier counts its bytes in. Warp 0 issues them.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
#error "DCMLP_BULK needs sm_90 or later (cp.async.bulk)"
#endif
struct Ring {
  uint32_t smem, bars;  // the slots; kStages mbarriers of 8 B
  uint32_t parity = 0;  // bit s: the phase the next wait of slot s waits for

  __device__ uint32_t slot(int s) const { return smem + s * kStageBytes; }
  __device__ uint32_t bar(int s) const { return bars + 8 * s; }
  __device__ void init() {
    if (threadIdx.x == 0) {
      for (int s = 0; s < kStages; ++s)
        asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;\n" ::"r"(bar(s)) : "memory");
      asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    // activation rows past the batch are never copied: zeros, once
    for (int i = threadIdx.x; i < kStages * kABytes / 16; i += kThreads) {
      uint32_t at = slot(i / (kABytes / 16)) + kWBytes + (i % (kABytes / 16)) * 16;
      asm volatile("st.shared.v4.u32 [%0], {%1, %1, %1, %1};\n" ::"r"(at), "r"(0) : "memory");
    }
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");  // before the copies' writes
    __syncthreads();
  }
  __device__ void copy(uint32_t dst, const void* src, int bytes, int s) const {
    asm volatile(
        "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n"
        ::"r"(dst), "l"(src), "r"(bytes), "r"(bar(s)) : "memory");
  }
  // A chunk's weights into slot s, its mbarrier armed for them and the `rows` activation rows:
  // one copy of the packed chunk, or one a row.
  __device__ void weights(const Gemm& g, int c, int s, int rows) const {
    if (threadIdx.x >= 32) return;
    if (threadIdx.x == 0)
      asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar(s)),
                   "r"((kTileN + rows) * kTileK * 2) : "memory");
    __syncwarp();
#ifdef DCMLP_PACKED
    if (threadIdx.x == 0) copy(slot(s), g.w + static_cast<size_t>(c) * kChunk, kWBytes, s);
#else
    int block = c / (g.k / kTileK), k0 = first_column(g, c);
    for (int r = threadIdx.x; r < kTileN; r += 32)
      copy(slot(s) + r * kWRowBytes,
           g.w + static_cast<size_t>(weight_row(g, block, r)) * g.k + k0, kTileK * 2, s);
#endif
  }
  __device__ void activations(const Gemm& g, int c, int s, int rows) const {
    int k0 = first_column(g, c);
    if (threadIdx.x < rows)
      copy(slot(s) + kWBytes + threadIdx.x * kARowBytes,
           g.a + static_cast<size_t>(threadIdx.x) * g.k + k0, kTileK * 2, s);
  }
  __device__ void commit() const {}
  __device__ void wait(int s) {  // the chunk in slot s has landed
    uint32_t phase = (parity >> s) & 1;
    asm volatile(
        "{\n.reg .pred done;\nWAIT_%=:\n"
        "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
        "@!done bra WAIT_%=;\n}\n" ::"r"(bar(s)), "r"(phase) : "memory");
    parity ^= 1u << s;
  }
  __device__ void drain() const {}
};
#else
// 16 B global -> shared; DCMLP_L2_256: the L2 fetches the 256 B around it from memory at once.
__device__ __forceinline__ void copy16(uint32_t dst, const void* src, int src_bytes) {
#ifdef DCMLP_L2_256
  asm volatile("cp.async.cg.shared.global.L2::256B [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
               "r"(src_bytes));
#else
  cp_async16(dst, src, src_bytes);
#endif
}

// The ring's slots are filled by every thread's 16 B copies, a commit group a chunk.
struct Ring {
  uint32_t smem, bars;

  __device__ uint32_t slot(int s) const { return smem + s * kStageBytes; }
  __device__ void init() {}
  __device__ void weights(const Gemm& g, int c, int s, int) const {
#ifdef DCMLP_PACKED  // the chunk's 16 KB in order: the pieces come swizzled
    const __nv_bfloat16* chunk = g.w + static_cast<size_t>(c) * kChunk;
#pragma unroll
    for (int i = 0; i < kChunk / 8 / kThreads; ++i) {
      int idx = threadIdx.x + i * kThreads;
      copy16(slot(s) + idx * 16, chunk + idx * 8, 16);
    }
#else
    int block = c / (g.k / kTileK), k0 = first_column(g, c);
#pragma unroll
    for (int i = 0; i < kTileN * kPieces / kThreads; ++i) {
      int idx = threadIdx.x + i * kThreads, row = idx / kPieces, piece = idx % kPieces;
      const __nv_bfloat16* src = g.w + static_cast<size_t>(weight_row(g, block, row)) * g.k + k0;
      copy16(slot(s) + w_at(row, piece), src + piece * 8, 16);
    }
#endif
  }
  __device__ void activations(const Gemm& g, int c, int s, int rows) const {
    int k0 = first_column(g, c);
#pragma unroll
    for (int i = 0; i < kRows * kPieces / kThreads; ++i) {
      int idx = threadIdx.x + i * kThreads, row = idx / kPieces, piece = idx % kPieces;
      int r = row < rows ? row : 0;  // rows past the batch read row 0 as zeros
      copy16(slot(s) + kWBytes + a_at(row, piece),
             g.a + static_cast<size_t>(r) * g.k + k0 + piece * 8, row < rows ? 16 : 0);
    }
  }
  __device__ void commit() const { cp_async_commit(); }
  // The chunk in slot s has landed: groups complete in order, and the kStages - 2 after it may
  // still be in flight.
  __device__ void wait(int) const { cp_async_wait<kStages - 2>(); }
  __device__ void drain() const { cp_async_wait<0>(); }
};
#endif

// Warp (wn, wk) = (warp % kWarpsN, warp / kWarpsN): acc[j] += A (16 x 128 columns from 128 wk) *
// W rows [16 wn + 8 j, +8)^T for the chunk in `stage`.
__device__ __forceinline__ void mma_chunk(uint32_t stage, float (&acc)[2][4]) {
  int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  int wn = warp % kWarpsN, piece0 = (warp / kWarpsN) * 16;
  int a_row = lane & 15, a_half = lane >> 4;
  int w_row = wn * 16 + ((lane >> 4) << 3) + (lane & 7), w_half = (lane >> 3) & 1;
#pragma unroll
  for (int ks = 0; ks < 8; ++ks) {
    uint32_t a[4], b[4];
    ldmatrix_x4(stage + kWBytes + a_at(a_row, piece0 + 2 * ks + a_half), a);
    ldmatrix_x4(stage + w_at(w_row, piece0 + 2 * ks + w_half), b);
    mma_bf16(acc[0], a, b[0], b[1]);
    mma_bf16(acc[1], a, b[2], b[3]);
  }
}

// This CTA's sums of one block into its workspace slots: warp (wn, wk) writes columns
// [16 wn, +16) of slot wk (row-major 16 x kTileN); the finisher adds the kWarpsK slots.
__device__ __forceinline__ void store_partial(float* slots, float (&acc)[2][4]) {
  int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  float* slot = slots + (warp / kWarpsN) * kRows * kTileN;
#pragma unroll
  for (int j = 0; j < 2; ++j) {
    int col = (warp % kWarpsN) * 16 + j * 8 + 2 * (lane & 3), row = lane >> 2;
    *reinterpret_cast<float2*>(slot + row * kTileN + col) = make_float2(acc[j][0], acc[j][1]);
    *reinterpret_cast<float2*>(slot + (row + 8) * kTileN + col) =
        make_float2(acc[j][2], acc[j][3]);
    acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.f;
  }
}

struct Epilogue {
  __nv_bfloat16* out;              // gated: h [rows, n/2]; else y [rows, n]
  const __nv_bfloat16* residual;   // added to y where given
  int rows, ld;
};

__device__ __forceinline__ float silu(float v) { return v / (1.f + __expf(-v)); }

__device__ __forceinline__ void add4(float (&sum)[4], const float* p) {
  float4 v = __ldcg(reinterpret_cast<const float4*>(p));
  sum[0] += v.x, sum[1] += v.y, sum[2] += v.z, sum[3] += v.w;
}

// The block's full sums, from the slots of the owners of its chunks (in owner order, then column
// warp), through the epilogue; each thread takes 4 output columns of a row at a time.
__device__ void finish_block(const Gemm& g, int block, const Parts& parts, const float* partials,
                             const Epilogue& e) {
  long long first = static_cast<long long>(block) * parts.kchunks;
  int lo = parts.owner_of(first), hi = parts.owner_of(first + parts.kchunks - 1);
  int width = g.gated ? kTileN / 2 : kTileN;  // output columns of the block
  for (int item = threadIdx.x; item < kRows * width / 4; item += kThreads) {
    int row = item / (width / 4), col = (item % (width / 4)) * 4;
    float sum[4] = {}, up[4] = {};
    for (int o = lo; o <= hi; ++o) {
      if (parts.idle(o)) continue;  // an empty run (fewer chunks than CTAs)
      const float* p = partials + parts.slot(o, block) * kPartial;
      for (int wk = 0; wk < kWarpsK; ++wk) {
        const float* q = p + wk * kRows * kTileN + row * kTileN + col;
        add4(sum, q);
        if (g.gated) add4(up, q + kTileN / 2);
      }
    }
    if (row >= e.rows) continue;
    if (g.gated) {  // h[row, block kTileN / 2 + col + i] = silu(gate) * up
      __nv_bfloat16* dst = e.out + static_cast<size_t>(row) * e.ld + block * width + col;
      *reinterpret_cast<uint2*>(dst) = {pack_bf16x2(silu(sum[0]) * up[0], silu(sum[1]) * up[1]),
                                        pack_bf16x2(silu(sum[2]) * up[2], silu(sum[3]) * up[3])};
      continue;
    }
    size_t at = static_cast<size_t>(row) * e.ld + block * width + col;
    if (e.residual) {
      uint2 r = *reinterpret_cast<const uint2*>(e.residual + at);
      float2 lo2 = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&r.x));
      float2 hi2 = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&r.y));
      sum[0] += lo2.x, sum[1] += lo2.y, sum[2] += hi2.x, sum[3] += hi2.y;
    }
    *reinterpret_cast<uint2*>(e.out + at) = {pack_bf16x2(sum[0], sum[1]),
                                             pack_bf16x2(sum[2], sum[3])};
  }
}

// The partial of `block` is stored; count its chunks, and finish the block if they complete it.
__device__ void arrive(const Gemm& g, int block, int chunks, const Parts& parts, float* partials,
                       const Epilogue& e) {
  __shared__ int last;
  __threadfence();  // this CTA's partial before its count
  __syncthreads();
  if (threadIdx.x == 0) {
    int before = atomicAdd(&g.arrivals[block], chunks);
    last = before + chunks == g.k / kTileK;
    if (last) g.arrivals[block] = 0;  // every chunk has arrived: ready for the next call
  }
  __syncthreads();
  if (!last) return;
  __threadfence();  // the others' partials, after their counts
  finish_block(g, block, parts, partials, e);
}

// Stream this CTA's chunks of `g`. ids[] holds the chunk in each slot of the ring (-1: none),
// written by thread 0 from the feed as it issues; the first kStages - 1 are already issued
// (weights and rows together, or weights first and rows after: see the kernel).
__device__ __forceinline__ void stream(const Gemm& g, Feed& feed, const Parts& parts, int rows,
                                       float* partials, const Epilogue& e, Ring& ring,
                                       volatile int* ids) {
  float acc[2][4] = {};
  int chunks = 0;
  for (int i = 0;; ++i) {
    int c = ids[i % kStages], issue = (i + kStages - 1) % kStages;
    if (c < 0) break;
    c = chunk_of(c);
    ring.wait(i % kStages);
    if (threadIdx.x == 0) ids[issue] = feed.pop(parts);
    __syncthreads();  // every warp is done with the slot the next chunk takes, and sees its id
    if (int next = ids[issue]; next >= 0) {
      ring.weights(g, chunk_of(next), issue, rows);
      ring.activations(g, chunk_of(next), issue, rows);
    }
    ring.commit();
    mma_chunk(ring.slot(i % kStages), acc);
    ++chunks;
    int block = c / parts.kchunks, after = ids[(i + 1) % kStages];
    if (after < 0 || (after & kFirstOfOwner) || after / parts.kchunks != block) {
      store_partial(partials + parts.slot(parts.owner_of(c), block) * kPartial, acc);
      arrive(g, block, chunks, parts, partials, e);
      chunks = 0;
    }
  }
  ring.drain();
  __syncthreads();  // the ring is free for the next GEMM's loads
}

// Every CTA of the grid arrives; none leaves before all have. bar[0] counts, bar[1] is the
// generation: the last to arrive resets the count and moves the generation on.
__device__ void grid_barrier(unsigned* bar, unsigned grid) {
  __threadfence();  // this CTA's h before its arrival
  __syncthreads();
  if (threadIdx.x == 0) {
    unsigned gen = *reinterpret_cast<volatile unsigned*>(bar + 1);
    __threadfence();
    if (atomicAdd(bar, 1u) == grid - 1) {
      atomicExch(bar, 0u);
      __threadfence();
      atomicAdd(bar + 1, 1u);
    } else {
      unsigned now;
      do {
        asm volatile("ld.acquire.gpu.u32 %0, [%1];\n" : "=r"(now) : "l"(bar + 1) : "memory");
      } while (now == gen);
    }
  }
  __syncthreads();
}

// The first kStages - 1 chunk ids of a GEMM into ids[], from thread 0's feed.
__device__ __forceinline__ void first_ids(Feed& feed, const Gemm& g, const Parts& parts, volatile int* ids) {
  if (threadIdx.x == 0) {
    feed.start(g, parts);
    for (int s = 0; s < kStages - 1; ++s) ids[s] = feed.pop(parts);
  }
  __syncthreads();
}

__global__ void __launch_bounds__(kThreads, 1)
    mlp_stream_kernel(Gemm up, Gemm down, Epilogue ep_up, Epilogue ep_down, int rows, int segs,
                      float* partials, unsigned* barrier) {
  extern __shared__ __align__(128) unsigned char smem_raw[];
  __shared__ __align__(8) unsigned long long bars[kStages];
  __shared__ int ids[kStages];
  Ring ring{smem_addr(smem_raw), smem_addr(bars)};
  ring.init();
  stamp(0);
  Parts parts_up(up, gridDim.x, segs), parts_down(down, gridDim.x, segs);
  Feed feed;

  first_ids(feed, up, parts_up, ids);
  for (int s = 0; s < kStages - 1; ++s) {
    if (ids[s] >= 0) {
      ring.weights(up, chunk_of(ids[s]), s, rows);
      ring.activations(up, chunk_of(ids[s]), s, rows);
    }
    ring.commit();
  }
  stream(up, feed, parts_up, rows, partials, ep_up, ring, ids);
  stamp(1);

  // The down weights do not wait for h: their first chunks stream in while the grid meets
  // (DCMLP_NO_PREFETCH, for the measurement: they wait at the barrier too).
  first_ids(feed, down, parts_down, ids);
#ifndef DCMLP_NO_PREFETCH
  for (int s = 0; s < kStages - 1; ++s) {
    if (ids[s] >= 0) ring.weights(down, chunk_of(ids[s]), s, rows);
    ring.commit();
  }
#endif
  grid_barrier(barrier, gridDim.x);
#ifdef DCMLP_BULK  // h was stored by other CTAs' threads; the copy engine reads it through another
  asm volatile("fence.proxy.async.global;\n" ::: "memory");  // proxy
#endif
  stamp(2);
  for (int s = 0; s < kStages - 1; ++s) {  // groups in order: a chunk's rows land after its weights
    if (ids[s] >= 0) {
#ifdef DCMLP_NO_PREFETCH
      ring.weights(down, chunk_of(ids[s]), s, rows);
#endif
      ring.activations(down, chunk_of(ids[s]), s, rows);
    }
    ring.commit();
  }
  stream(down, feed, parts_down, rows, partials, ep_down, ring, ids);
  stamp(3);
}

int segments(int blocks, int kchunks, int grid) {
  long long total = static_cast<long long>(blocks) * kchunks;
  long long longest = (total + grid - 1) / grid;
  return static_cast<int>((longest + kchunks - 2) / kchunks) + 1;  // blocks a run can touch
}

// Slots of partial sums a GEMM of `blocks` x `kchunks` chunks needs (each kPartial floats), and
// the blocks a CTA's run can touch (`segs`; the kernel's argument is the larger of two GEMMs', and
// grid x that is the larger of their equal runs' slots).
long long slots(int blocks, int kchunks, int grid, int* segs) {
  *segs = segments(blocks, kchunks, grid);
#ifdef DCMLP_QUEUE
  long long total = static_cast<long long>(blocks) * kchunks;
  return 2 * ((total + DCMLP_QUEUE - 1) / DCMLP_QUEUE);
#else
  return static_cast<long long>(grid) * *segs;
#endif
}

// The larger of the two GEMMs' needs, and the segs that covers both.
long long workspace_slots(int hidden, int inter, int grid, int* segs) {
  int segs_down = 0;
  long long up = slots(2 * inter / kTileN, hidden / kTileK, grid, segs);
  long long down = slots(hidden / kTileN, inter / kTileK, grid, &segs_down);
  if (segs_down > *segs) *segs = segs_down;
  return up > down ? up : down;
}

}  // namespace dcmlp

extern "C" {

// CTAs of the kernel an SM can hold at once (0 on an error): the grid may have this many an SM.
int dcmlp_ctas_per_sm() {
  int per_sm = 0;
  if (cudaFuncSetAttribute(dcmlp::mlp_stream_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                           dcmlp::kSmemBytes) != cudaSuccess ||
      cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, dcmlp::mlp_stream_kernel,
                                                    dcmlp::kThreads, dcmlp::kSmemBytes) != cudaSuccess)
    return 0;
  return per_sm;
}

// Bytes of the float workspace of partial sums; the int workspace holds dcmlp_counter_ints zeroed
// ints (the two GEMMs' arrival counters, the barrier's two and the two queue counters), which
// every call leaves zero again.
long long dcmlp_partial_bytes(int hidden, int inter, int grid) {
  int segs = 0;
  return dcmlp::workspace_slots(hidden, inter, grid, &segs) * dcmlp::kPartial * sizeof(float);
}

#ifdef DCMLP_STAMPS
int dcmlp_read_stamps(void* host) {
  return cudaMemcpyFromSymbol(host, dcmlp::stamps, sizeof(dcmlp::stamps));
}
#endif

// hidden and inter must be multiples of this (the columns of a chunk).
int dcmlp_tile_k() { return dcmlp::kTileK; }

// The rows of a chunk, and whether the weights must come packed: chunk by chunk in streaming
// order (row block, then column block; a gate|up block's rows its gate rows, then the up rows
// of the same columns), each chunk's 16 B pieces XOR-swizzled by row (piece p of row r stored at
// p ^ (r % 8)), as scripts/mlp_stream_bench.py packs them.
int dcmlp_tile_n() { return dcmlp::kTileN; }
int dcmlp_packed() {
#ifdef DCMLP_PACKED
  return 1;
#else
  return 0;
#endif
}

// Chunks of a queue's unit (DCMLP_QUEUE; 0: equal runs). hidden and inter must hold this many
// chunks or more.
int dcmlp_queue_unit() {
#ifdef DCMLP_QUEUE
  return DCMLP_QUEUE;
#else
  return 0;
#endif
}

int dcmlp_counter_ints(int hidden, int inter) {
  return hidden / dcmlp::kTileN + 2 * inter / dcmlp::kTileN + 4;
}

// y[rows, hidden] = (silu(x Wg^T) * (x Wu^T)) Wd^T (+ residual), h[rows, inter] kept.
// x: [rows, hidden]; w_gate_up: [2 inter, hidden] (gate rows, then up rows); w_down: [hidden,
// inter]; all bf16 row-major. rows <= 16, hidden and inter multiples of 128. Returns a
// cudaError_t (cudaErrorInvalidValue for shapes it does not take).
int dcmlp_mlp(const void* x, const void* w_gate_up, const void* w_down, const void* residual,
              void* h, void* y, void* partials, void* counters, int rows, int hidden, int inter,
              int grid, void* stream) {
  using namespace dcmlp;
  if (rows < 1 || rows > kRows || hidden < kTileK || inter < kTileK || hidden % kTileK ||
      inter % kTileK || grid < 1)
    return cudaErrorInvalidValue;
  // every CTA must be resident at once, or the barrier waits for ever
  int device = 0, sms = 0, per_sm = dcmlp_ctas_per_sm();
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess ||
      per_sm < 1)
    return cudaErrorInvalidDevice;
  if (grid > sms * per_sm) return cudaErrorCooperativeLaunchTooLarge;
#ifdef DCMLP_QUEUE  // a unit may touch two blocks of a GEMM, no more
  if (DCMLP_QUEUE > hidden / kTileK || DCMLP_QUEUE > inter / kTileK) return cudaErrorInvalidValue;
#endif
  int* ints = static_cast<int*>(counters);
  int* down_arrivals = ints + 2 * inter / kTileN;
  unsigned* barrier = reinterpret_cast<unsigned*>(down_arrivals + hidden / kTileN);
  int* queues = down_arrivals + hidden / kTileN + 2;
  Gemm up{static_cast<const __nv_bfloat16*>(w_gate_up), static_cast<const __nv_bfloat16*>(x),
          2 * inter, hidden, 1, ints, queues};
  Gemm down{static_cast<const __nv_bfloat16*>(w_down), static_cast<const __nv_bfloat16*>(h),
            hidden, inter, 0, down_arrivals, queues + 1};
  Epilogue ep_up{static_cast<__nv_bfloat16*>(h), nullptr, rows, inter};
  Epilogue ep_down{static_cast<__nv_bfloat16*>(y), static_cast<const __nv_bfloat16*>(residual),
                   rows, hidden};
  int segs = 0;
  workspace_slots(hidden, inter, grid, &segs);
  cudaError_t err = cudaFuncSetAttribute(mlp_stream_kernel,
                                         cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes);
  if (err != cudaSuccess) return err;
  mlp_stream_kernel<<<grid, kThreads, kSmemBytes, static_cast<cudaStream_t>(stream)>>>(
      up, down, ep_up, ep_down, rows, segs, static_cast<float*>(partials), barrier);
  return cudaGetLastError();
}

}  // extern "C"
