// Absorbed-MLA decode / speculative-verify attention over a paged latent KV cache.
//
// One CTA = (row tile, KV split, request). A row tile packs 16*MT query rows, row = token * H + head,
// so every head and draft token of a request shares one pass over the latent tile. The KV split's
// tokens stream through a cp.async ring of BN-token tiles, gathered through the page table. Per tile:
//   phase 1  S = Q K^T : Q sits in registers split over the 576 dims (warp w holds dims
//            [144 (w%4), +144) of m-tile w/4), partial S tiles go to shared memory;
//   reduce   all 256 threads sum the 4 partials, scale, mask, online softmax, write P (bf16);
//   phase 2  O += P V  : warp w owns V columns [64 w, 64 w + 64) of every m-tile (ldmatrix.trans on
//            the V part of the same tile).
// Each CTA writes fp32 partial O (normalised) + log2-sum-exp per row; a combine kernel merges the
// splits into bf16 output. The split's KV range comes from kv_lens on the device, so the launch
// configuration never depends on the context length (CUDA-graph safe).
//
// Variants (template parameter V, same code path):
//   v1: 32-token tiles, 2-stage ring (one tile in flight), page-table load in front of each gather.
//   v2: 16-token tiles, 4-stage ring (three tiles in flight), the page-table entry of the tile after
//       the one being issued is loaded one iteration early, two mma chains in phase 1; the 16-row
//       kernel is held to 128 registers so two CTAs fit an SM where shared memory allows.
//   v3: v1's 32-token tiles and 2-stage ring with v2's page-table prefetch; on sm_90 both row-tile
//       kernels are held to 128 registers so two CTAs share an SM (228 KB of shared memory): the
//       per-tile phase chain of one CTA overlaps the other's (notes/kernel.md, "v3").
//   v4: v3 with fewer instructions and registers per tile: the running max moves only when a tile's
//       max exceeds it by more than kMaxSlack (P stays <= 2^kMaxSlack), so O is rescaled only on
//       the tiles where it moved (a barrier vote says whether any row did); phase 1 interleaves the
//       dim quarters by k-step (warp q takes k-steps 4k + q), so every K fragment address of a
//       thread is one base plus immediates, as are the loader's destinations.
//   v5: 64 query rows per CTA (attn_body_v5), so each KV tile is read from memory once for up to
//       64 rows (chain16 at 8 heads: two CTAs per KV split instead of four) and each K fragment
//       loaded from shared memory feeds two m-tiles, each V fragment four. 16-token tiles in a
//       4-slot ring (two in flight; tile t+2's copy issued between phase 1's MMAs); partial S is
//       exchanged in accumulator order (conflict-free), P in the A operand's register order (one
//       16-byte load per fragment, no ldmatrix, no register moves); phase 2 of tile t-1 and
//       phase 1 of tile t run between the same two barriers (2 barriers per tile instead of 3).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "mla_ptx.cuh"

namespace dcmla {

constexpr int kDqk = 576;                  // 512 latent + 64 rope
constexpr int kDv = 512;                   // V = latent part of the same row
constexpr int kRowBytes = kDqk * 2;        // 1152 B per cached token
constexpr int kChunks = kRowBytes / 16;    // 72 16-byte chunks per token row
constexpr int kThreads = 256;              // 8 warps
constexpr int kDimGroups = 4;              // phase 1 splits the 576 dims over 4 warps
constexpr int kKSteps = kDqk / kDimGroups / 16;  // 9 k-steps of 16 dims per warp
constexpr int kMaxSplits = 1024;
constexpr int kCombineThreads = 256;
constexpr int kCombineCols = 128;          // output columns per combine CTA
constexpr int kSmemLimit = 101376;         // sm_120: 99 KB per block

static_assert(kDqk % (kDimGroups * 16) == 0, "dims must split evenly over the warps");

template <int V>
struct Variant;
// Traits v4 adds; v1..v3 keep the defaults (their code is unchanged).
struct VariantBase {
  static constexpr bool kLazyMax = false;     // running max moves only past kMaxSlack
  static constexpr bool kInterleave = false;  // phase 1 dim quarters interleaved by k-step
};
template <>
struct Variant<1> : VariantBase {
  static constexpr int kPasses = 1;       // phase 1 n-tiles computed in this many passes
  static constexpr bool kLazySum = false;  // row sums kept per thread, reduced once at the end
  static constexpr int kBlockN = 32;      // KV tokens per tile
  static constexpr int kStages = 2;       // cp.async ring depth
  static constexpr bool kPrefetch = false;  // page-table entries loaded one iteration early
  static constexpr int kChains = 1;       // independent mma accumulator chains in phase 1
};
template <>
struct Variant<2> : VariantBase {
  static constexpr int kPasses = 1;       // phase 1 n-tiles computed in this many passes
  static constexpr bool kLazySum = false;  // row sums kept per thread, reduced once at the end
  static constexpr int kBlockN = 16;
  static constexpr int kStages = 4;
  static constexpr bool kPrefetch = true;
  static constexpr int kChains = 2;
};

template <>
struct Variant<3> : VariantBase {  // v1's tiles + v2's prefetch; sm_90: <= 128 registers, 2 CTAs per SM
  static constexpr int kBlockN = 32;
  static constexpr int kStages = 2;
  static constexpr bool kPrefetch = true;
  static constexpr int kChains = 1;
  static constexpr int kPasses = 1;
  static constexpr bool kLazySum = true;  // no sum shuffles on the per-tile chain
};
template <>
struct Variant<4> : Variant<3> {  // v3 + rescale only when the max moves + base+immediate addressing
  static constexpr bool kLazyMax = true;
  static constexpr bool kInterleave = true;
};
// log2-domain slack of the lazy running max: P = 2^(s - m) <= 2^8, exact in bf16's exponent range.
constexpr float kMaxSlack = 8.f;
template <int MT, int V>
struct SmemLayout {
  static constexpr int kRows = 16 * MT;
  static constexpr int kBlockN = Variant<V>::kBlockN;
  static constexpr int kTileBytes = kBlockN * kRowBytes;
  static constexpr int kSpStride = kBlockN + 8;  // floats per partial-S row (conflict-free float2)
  static constexpr int kPStride = kBlockN + 8;   // bf16 per P row (conflict-free ldmatrix)
  static constexpr int kKv = 0;
  static constexpr int kSp = kKv + Variant<V>::kStages * kTileBytes;
  static constexpr int kP = kSp + kDimGroups * kRows * kSpStride * 4;
  static constexpr int kScale = kP + kRows * kPStride * 2;
  static constexpr int kFinal = kScale + kRows * 4;
  static constexpr int kBytes = kFinal + 2 * kRows * 4;
};
static_assert(SmemLayout<2, 1>::kBytes <= kSmemLimit, "shared memory must fit sm_120's 99 KB");
static_assert(SmemLayout<1, 1>::kBytes <= kSmemLimit, "shared memory must fit sm_120's 99 KB");
static_assert(SmemLayout<2, 2>::kBytes <= kSmemLimit, "shared memory must fit sm_120's 99 KB");
static_assert(SmemLayout<1, 2>::kBytes <= kSmemLimit, "shared memory must fit sm_120's 99 KB");
static_assert(SmemLayout<2, 3>::kBytes <= kSmemLimit, "shared memory must fit sm_120's 99 KB");
static_assert(SmemLayout<1, 3>::kBytes <= kSmemLimit, "shared memory must fit sm_120's 99 KB");
static_assert(SmemLayout<2, 4>::kBytes <= kSmemLimit, "shared memory must fit sm_120's 99 KB");
static_assert(SmemLayout<1, 4>::kBytes <= kSmemLimit, "shared memory must fit sm_120's 99 KB");

struct Params {
  const __nv_bfloat16* q;      // [total_q, H, 576]
  const __nv_bfloat16* kv;     // [num_pages * page_size, 576]
  const int* page_table;       // [B, pt_stride]
  const int* kv_lens;          // [B]
  const int* q_indptr;         // [B + 1]
  const uint8_t* tree_mask;    // [B, tree_stride, tree_stride] or null (chain)
  float* ws_o;                 // [total_q * H, num_splits, 512]
  float* ws_lse;               // [total_q * H, num_splits] (log2 domain)
  int heads;
  int page_size;
  int pt_stride;
  int tree_stride;
  int num_splits;
  float scale_log2;            // sm_scale * log2(e)
  int split_tokens;            // > 0: at least this many tokens per split (a ragged batch's
                               // balance: short requests take fewer splits), 0: kv_len / splits.
                               // Last: placed before scale_log2 it made ptxas spill in v4/v5.
};

// Swizzled byte offset of 16-byte chunk `chunk` of token row `tok` inside one KV tile: rows are
// 1152 B (a multiple of 128 B), so unswizzled column reads of 8 rows hit the same banks 8 times.
__device__ __forceinline__ uint32_t kv_offset(int tok, int chunk) {
  return tok * kRowBytes + ((chunk ^ (tok & 7)) << 4);
}

__device__ __forceinline__ bool draft_visible(const Params& p, int b, int qi, int j) {
  if (p.tree_mask == nullptr) return j <= qi;
  const int64_t n = p.tree_stride;
  return p.tree_mask[(static_cast<int64_t>(b) * n + qi) * n + j] != 0;
}

// Resident CTAs per SM the register budget is cut for. v2's 16-row (decode) kernel fits 128
// registers everywhere, so two CTAs share an SM where shared memory allows it (sm_90: 2 x 80,832
// B). v3 is cut to 128 registers on sm_90 only, whose 228 KB hold two of its CTAs (2 x 97,152 B):
// two independent CTAs per SM overlap one's softmax with the other's mma. sm_120's 99 KB and
// sm_80's 164 KB hold one, so there v3 keeps v1's register budget.
//
// DCMLA_SM120_MODEL builds the library that runs on a bigger GPU (the H200) with sm_120's per-SM
// resources: sm_120's register budget (one v3/v4 CTA per SM) and 100 KB of shared memory per SM
// (the occupancy answer is capped to it and the SM's carveout set to it, so the resident CTAs and
// the split count are those of an sm_120 GPU). kernels/sm120_model.py builds and loads it.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ == 900 && !defined(DCMLA_SM120_MODEL)
constexpr int kV3Blocks = 2;
#else
constexpr int kV3Blocks = 1;
#endif
#if defined(DCMLA_SM120_MODEL)
constexpr int kModelSmemPerSm = 102400;  // sm_120: 100 KB of shared memory per SM
constexpr int kSmemPerBlockReserved = 1024;  // the system's 1 KB per resident CTA (sm_80 and up)
#endif
template <int MT, int V>
constexpr int min_blocks() {
  return (V == 2 && MT == 1) ? 2 : ((V == 3 || V == 4) ? kV3Blocks : 1);
}

// First 16-byte chunk (8 dims) of phase-1 k-step kk of dim group dq: contiguous quarters (v1..v3)
// or interleaved by k-step (v4: dq takes k-steps 4 kk + dq, so its chunks are 8 kk + 2 dq).
template <int V>
__device__ __forceinline__ int k_chunk0(int dq, int kk) {
  return Variant<V>::kInterleave ? (kk * kDimGroups + dq) * 2 : dq * (kKSteps * 2) + kk * 2;
}

// What one CTA works on: request b's row tile rt (R rows) over KV split `split`. The split's tokens
// are ceil(kv_len / splits), or split_tokens where more, rounded up to whole BN-token tiles,
// derived from kv_lens on the device, so one launch configuration (and one CUDA graph) serves
// every context length and every token is in some split whatever split_tokens says.
struct CtaWork {
  int rt, split, b, tid, lane, warp, H, q_len, rows, kv_len, kv_begin, kv_end, S, prefix;
  int64_t g0;  // global row of tile row 0
};
// False when the CTA has nothing to do: no row in its tile, or an empty split (whose partials it
// marks empty, LSE = -inf, for the combine to skip).
template <int R, int BN>
__device__ __forceinline__ bool cta_work(const Params& p, CtaWork& w) {
  w.rt = blockIdx.x, w.split = blockIdx.y, w.b = blockIdx.z;
  w.tid = threadIdx.x, w.lane = w.tid & 31, w.warp = w.tid >> 5;
  w.H = p.heads;
  const int q_begin = p.q_indptr[w.b];
  w.q_len = p.q_indptr[w.b + 1] - q_begin;
  w.rows = w.q_len * w.H;
  if (w.rt * R >= w.rows) return false;
  w.kv_len = p.kv_lens[w.b];
  int chunk = max((w.kv_len + p.num_splits - 1) / p.num_splits, p.split_tokens);
  chunk = (chunk + BN - 1) / BN * BN;
  w.kv_begin = w.split * chunk;
  w.kv_end = min(w.kv_len, w.kv_begin + chunk);
  w.g0 = static_cast<int64_t>(q_begin) * w.H + w.rt * R;
  w.S = p.num_splits;
  if (w.kv_begin >= w.kv_end) {
    if (w.tid < R && w.rt * R + w.tid < w.rows)
      p.ws_lse[(w.g0 + w.tid) * w.S + w.split] = -INFINITY;
    return false;
  }
  w.prefix = w.kv_len - w.q_len;
  return true;
}

// Every variant's epilogue: the CTA's normalised partial O (fp32, warp w's V columns
// [64 w, +64) of each m-tile) and each row's log2-sum-exp for its split. final_smem holds the R
// rows' log2-sum-exp, then their 1 / row sum. (The caller's thread indices are passed in: read
// again here, they would change sm_120's code.)
struct Lane {
  int tid, warp, gid, tig;
};
template <int MT>
__device__ __forceinline__ void write_partials(const Params& p, const float (&o)[MT][8][4],
                                               const float* final_smem, int R, int row0, int rows,
                                               int64_t g0, int split, int S, Lane t) {
  const int tid = t.tid, warp = t.warp, gid = t.gid, tig = t.tig;
#pragma unroll
  for (int m = 0; m < MT; ++m) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = m * 16 + gid + h * 8;
      if (row0 + r >= rows) continue;
      const float inv = final_smem[R + r];
      float* dst = p.ws_o + ((g0 + r) * S + split) * kDv + warp * 64 + 2 * tig;
#pragma unroll
      for (int n = 0; n < 8; ++n)
        *reinterpret_cast<float2*>(dst + n * 8) =
            make_float2(o[m][n][2 * h] * inv, o[m][n][2 * h + 1] * inv);
    }
  }
  if (tid < R && row0 + tid < rows) p.ws_lse[(g0 + tid) * S + split] = final_smem[tid];
}

template <int MT, int V>
__device__ __forceinline__ void attn_body(const Params& p, uint8_t* smem) {
  using VT = Variant<V>;
  using L = SmemLayout<MT, V>;
  constexpr int BN = VT::kBlockN;
  constexpr int ST = VT::kStages;
  constexpr int NC = VT::kChains;
  constexpr int SPS = L::kSpStride, PS = L::kPStride;
  constexpr int R = L::kRows;
  constexpr int NT = (MT == 2) ? BN / 8 : BN / 16;  // phase 1: n-tiles of 8 tokens per warp
  constexpr int TPR = kThreads / R;        // reduce: threads per row
  constexpr int TPT = BN / TPR;            // reduce: tokens per thread
  constexpr int TPTOK = kThreads / BN;     // loader: threads per token
  constexpr int CPT = (kChunks + TPTOK - 1) / TPTOK;  // loader: chunks per thread
  static_assert(NT >= 1 && TPT >= 1 && BN % 16 == 0 && ST >= 2, "tile shape");
  static_assert(TPTOK % 8 == 0, "loader chunks per thread must keep the swizzle's low bits");

  CtaWork w;
  if (!cta_work<R, BN>(p, w)) return;
  const auto [rt, split, b, tid, lane, warp, H, q_len, rows, kv_len, kv_begin, kv_end, S, prefix,
              g0] = w;

  const uint32_t kv_smem = smem_addr(smem + L::kKv);
  float* sp_smem = reinterpret_cast<float*>(smem + L::kSp);
  __nv_bfloat16* p_smem = reinterpret_cast<__nv_bfloat16*>(smem + L::kP);
  float* scale_smem = reinterpret_cast<float*>(smem + L::kScale);
  float* final_smem = reinterpret_cast<float*>(smem + L::kFinal);

  const int gid = lane >> 2, tig = lane & 3;
  const int dq = warp & 3;                       // phase 1: which quarter of the dims
  const int mt_w = (MT == 2) ? (warp >> 2) : 0;  // phase 1: which m-tile
  const int nt0 = (MT == 2) ? 0 : (warp >> 2) * NT;  // phase 1: first n-tile

  // Q fragments (A operand of m16n8k16) for this warp's m-tile and dim quarter, loaded once.
  uint32_t qf[kKSteps][4];
  {
    const int r0 = mt_w * 16 + gid, r1 = r0 + 8;
    const bool v0 = rt * R + r0 < rows, v1 = rt * R + r1 < rows;
    const uint32_t* q0 = reinterpret_cast<const uint32_t*>(p.q + (g0 + (v0 ? r0 : 0)) * kDqk);
    const uint32_t* q1 = reinterpret_cast<const uint32_t*>(p.q + (g0 + (v1 ? r1 : 0)) * kDqk);
#pragma unroll
    for (int kk = 0; kk < kKSteps; ++kk) {
      const int w = k_chunk0<V>(dq, kk) * 4 + tig;  // 32-bit words
      qf[kk][0] = v0 ? __ldg(q0 + w) : 0u;
      qf[kk][1] = v1 ? __ldg(q1 + w) : 0u;
      qf[kk][2] = v0 ? __ldg(q0 + w + 4) : 0u;
      qf[kk][3] = v1 ? __ldg(q1 + w + 4) : 0u;
    }
  }

  // Loader: thread -> token tid / TPTOK, chunks (tid % TPTOK) + TPTOK k: one page-table entry per
  // thread per tile. page_of() is the (dependent) global load; issue() only needs its result, so
  // v2 calls page_of() one iteration before the issue that uses it.
  const int ld_tok = tid / TPTOK, ld_c = tid % TPTOK;
  const int* pt = p.page_table + static_cast<int64_t>(b) * p.pt_stride;
  auto page_of = [&](int tile_begin) -> int {
    const int t = tile_begin + ld_tok;
    return t < kv_end ? pt[t / p.page_size] : 0;
  };
  auto issue = [&](int slot, int tile_begin, int page) {
    const int t = tile_begin + ld_tok;
    const bool ok = t < kv_end;  // tokens past the split's end are zero-filled
    const __nv_bfloat16* src = p.kv;
    if (ok) src = p.kv + (static_cast<int64_t>(page) * p.page_size + t % p.page_size) * kDqk;
    const uint32_t dst = kv_smem + slot * L::kTileBytes;
    // v4: ld_c < TPTOK and TPTOK is a multiple of 8, so the swizzle (XOR of the low 3 bits) of
    // chunk ld_c + TPTOK k is that of ld_c plus TPTOK k: one base address, immediates after it.
    [[maybe_unused]] const uint32_t dst0 = dst + kv_offset(ld_tok, ld_c);
#pragma unroll
    for (int k = 0; k < CPT; ++k) {
      const int c = ld_c + TPTOK * k;
      const uint32_t to = VT::kInterleave ? dst0 + TPTOK * 16 * k : dst + kv_offset(ld_tok, c);
      if (kChunks % TPTOK == 0 || c < kChunks) cp_async16(to, src + c * 8, ok ? 16 : 0);
    }
  };

  // Reduce-phase ownership: row rr, tokens [rj * TPT, +TPT); running max / sum live here.
  const int rr = tid / TPR, rj = tid % TPR;
  const int lrow = rt * R + rr;
  const bool row_valid = lrow < rows;
  const int qi = lrow / H;  // draft index of this row's query token
  float row_m = -INFINITY, row_l = 0.f;

  float o[MT][8][4];
#pragma unroll
  for (int m = 0; m < MT; ++m)
#pragma unroll
    for (int n = 0; n < 8; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) o[m][n][e] = 0.f;

  // Prologue: tiles 0 .. ST-2 in flight, one commit group each (empty groups keep the count).
  const int n_tiles = (kv_end - kv_begin + BN - 1) / BN;
#pragma unroll
  for (int s = 0; s < ST - 1; ++s) {
    const int tb = kv_begin + s * BN;
    if (s < n_tiles) issue(s, tb, page_of(tb));
    cp_async_commit();
  }
  int pf_page = 0;  // v2: page-table entry of tile it + ST - 1, loaded during iteration it - 1
  if constexpr (VT::kPrefetch) pf_page = page_of(kv_begin + (ST - 1) * BN);

  for (int it = 0; it < n_tiles; ++it) {
    const int slot = it % ST;
    const int tile_begin = kv_begin + it * BN;
    cp_async_wait<ST - 2>();  // groups 0..it complete: tile `it` landed (this thread's part)
    __syncthreads();  // tile `it` visible; everyone is done with tile it-1 (its slot is free)
    {
      const int nxt = it + ST - 1;  // goes into slot (it - 1) % ST, freed by the barrier above
      const int nb = kv_begin + nxt * BN;
      if constexpr (VT::kPrefetch) {
        if (nxt < n_tiles) issue(nxt % ST, nb, pf_page);
        pf_page = page_of(nb + BN);  // consumed next iteration: off this tile's critical path
      } else {
        if (nxt < n_tiles) issue(nxt % ST, nb, page_of(nb));
      }
      cp_async_commit();
    }
    const uint32_t kv_s = kv_smem + slot * L::kTileBytes;

    // ---- phase 1: partial S over this warp's 144 dims ----
    // (v4: in two passes of half the n-tiles, to stay within 128 registers)
#pragma unroll
    for (int pass = 0; pass < VT::kPasses; ++pass) {
      constexpr int NTP = NT / VT::kPasses;  // n-tiles per pass
      const int ntb = nt0 + pass * NTP;
      float s[NC][NTP][4];
#pragma unroll
      for (int ch = 0; ch < NC; ++ch)
#pragma unroll
        for (int n = 0; n < NTP; ++n)
#pragma unroll
          for (int e = 0; e < 4; ++e) s[ch][n][e] = 0.f;
      const int b_tok = (lane & 7) + ((lane >> 4) << 3);
      const int b_half = (lane >> 3) & 1;
#pragma unroll
      // v4: chunk 8 kk + 2 dq + b_half of token row 8 n + b_tok: (b_tok & 7) is the swizzle
      // of every such row, so the address is k_base + immediates.
      [[maybe_unused]] const uint32_t k_base = kv_s + kv_offset(ntb * 8 + b_tok, 2 * dq + b_half);
      for (int kk = 0; kk < kKSteps; ++kk) {
        const int c = k_chunk0<V>(dq, kk) + b_half;
        const int ch = kk % NC;
        if constexpr (NTP >= 2) {
#pragma unroll
          for (int pr = 0; pr < NTP / 2; ++pr) {
            uint32_t kb[4];
            if constexpr (VT::kInterleave)
              ldmatrix_x4(k_base + (2 * pr * 8) * kRowBytes + kk * 128, kb);
            else
              ldmatrix_x4(kv_s + kv_offset((ntb + 2 * pr) * 8 + b_tok, c), kb);
            mma_bf16(s[ch][2 * pr], qf[kk], kb[0], kb[1]);
            mma_bf16(s[ch][2 * pr + 1], qf[kk], kb[2], kb[3]);
          }
        } else {
          uint32_t kb[2];
          ldmatrix_x2(kv_s + kv_offset(ntb * 8 + (lane & 7), c), kb);
          mma_bf16(s[ch][0], qf[kk], kb[0], kb[1]);
        }
      }
#pragma unroll
      for (int ch = 1; ch < NC; ++ch)
#pragma unroll
        for (int n = 0; n < NTP; ++n)
#pragma unroll
          for (int e = 0; e < 4; ++e) s[0][n][e] += s[ch][n][e];
      float* sp = sp_smem + dq * R * SPS;
      const int r = mt_w * 16 + gid;
#pragma unroll
      for (int n = 0; n < NTP; ++n) {
        const int col = (ntb + n) * 8 + 2 * tig;
        *reinterpret_cast<float2*>(sp + r * SPS + col) = make_float2(s[0][n][0], s[0][n][1]);
        *reinterpret_cast<float2*>(sp + (r + 8) * SPS + col) = make_float2(s[0][n][2], s[0][n][3]);
      }
    }
    __syncthreads();

    // ---- reduce: sum partials, scale, mask, online softmax, P -> smem ----
    bool moved;  // this row's running max moved (its O needs rescaling)
    {
      float sv[TPT];
#pragma unroll
      for (int e = 0; e < TPT; ++e) sv[e] = 0.f;
#pragma unroll
      for (int d = 0; d < kDimGroups; ++d) {
        const float* src = sp_smem + (d * R + rr) * SPS + rj * TPT;
        if constexpr (TPT % 4 == 0) {
#pragma unroll
          for (int e = 0; e < TPT; e += 4) {
            const float4 v = *reinterpret_cast<const float4*>(src + e);
            sv[e] += v.x;
            sv[e + 1] += v.y;
            sv[e + 2] += v.z;
            sv[e + 3] += v.w;
          }
        } else if constexpr (TPT % 2 == 0) {
#pragma unroll
          for (int e = 0; e < TPT; e += 2) {
            const float2 v = *reinterpret_cast<const float2*>(src + e);
            sv[e] += v.x;
            sv[e + 1] += v.y;
          }
        } else {
#pragma unroll
          for (int e = 0; e < TPT; ++e) sv[e] += src[e];
        }
      }
      float mx = -INFINITY;
#pragma unroll
      for (int e = 0; e < TPT; ++e) {
        const int t = tile_begin + rj * TPT + e;
        const bool vis = row_valid && t < kv_end &&
                         (t < prefix || draft_visible(p, b, qi, t - prefix));
        sv[e] = vis ? sv[e] * p.scale_log2 : -INFINITY;
        mx = fmaxf(mx, sv[e]);
      }
#pragma unroll
      for (int off = 1; off < TPR; off <<= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, off));
      // v4: the max moves only past kMaxSlack (from -inf always), so most tiles keep alpha = 1.
      const float m_new = VT::kLazyMax ? (mx > row_m + kMaxSlack ? mx : row_m) : fmaxf(row_m, mx);
      const float m_use = (m_new == -INFINITY) ? 0.f : m_new;
      moved = m_new != row_m;
      const float alpha = (VT::kLazyMax && !moved) ? 1.f : fast_exp2(row_m - m_use);
      float sum = 0.f;
#pragma unroll
      for (int e = 0; e < TPT; ++e) {
        sv[e] = fast_exp2(sv[e] - m_use);
        sum += sv[e];
      }
      if constexpr (!VT::kLazySum) {
#pragma unroll
        for (int off = 1; off < TPR; off <<= 1) sum += __shfl_xor_sync(0xffffffffu, sum, off);
      }
      row_l = row_l * alpha + sum;  // lazy: this thread's share; alpha is the same row-wide
      row_m = m_new;
      if constexpr (TPT % 2 == 0) {
        uint32_t* pdst = reinterpret_cast<uint32_t*>(p_smem + rr * PS + rj * TPT);
#pragma unroll
        for (int e = 0; e < TPT; e += 2) pdst[e / 2] = pack_bf16x2(sv[e], sv[e + 1]);
      } else {
#pragma unroll
        for (int e = 0; e < TPT; ++e) p_smem[rr * PS + rj * TPT + e] = __float2bfloat16_rn(sv[e]);
      }
      if (rj == 0) scale_smem[rr] = alpha;
    }
    // v4: the barrier also tells whether any row's max moved; if none did, O keeps its scale.
    bool rescale = true;
    if constexpr (VT::kLazyMax)
      rescale = __syncthreads_or(moved) != 0;
    else
      __syncthreads();

    // ---- phase 2: O = O * alpha + P V over this warp's 64 V columns ----
    {
#pragma unroll
      for (int m = 0; m < MT; ++m) {
        if (!rescale) break;
        const float a0 = scale_smem[m * 16 + gid], a1 = scale_smem[m * 16 + gid + 8];
#pragma unroll
        for (int n = 0; n < 8; ++n) {
          o[m][n][0] *= a0;
          o[m][n][1] *= a0;
          o[m][n][2] *= a1;
          o[m][n][3] *= a1;
        }
      }
      const uint32_t p_base = smem_addr(p_smem);
      const int a_row = (lane & 7) + ((lane >> 3) & 1) * 8;
#pragma unroll
      for (int ks = 0; ks < BN / 16; ++ks) {
        uint32_t pa[MT][4];
#pragma unroll
        for (int m = 0; m < MT; ++m)
          ldmatrix_x4(p_base + ((m * 16 + a_row) * PS + ks * 16 + (lane >> 4) * 8) * 2, pa[m]);
        const int v_tok = ks * 16 + a_row;
#pragma unroll
        for (int np = 0; np < 4; ++np) {
          uint32_t vb[4];
          ldmatrix_x4_trans(kv_s + kv_offset(v_tok, warp * 8 + np * 2 + (lane >> 4)), vb);
#pragma unroll
          for (int m = 0; m < MT; ++m) {
            mma_bf16(o[m][2 * np], pa[m], vb[0], vb[1]);
            mma_bf16(o[m][2 * np + 1], pa[m], vb[2], vb[3]);
          }
        }
      }
    }
  }

  // ---- epilogue: normalised partial O and log2-sum-exp per row ----
  if constexpr (VT::kLazySum) {
#pragma unroll
    for (int off = 1; off < TPR; off <<= 1) row_l += __shfl_xor_sync(0xffffffffu, row_l, off);
  }
  if (rj == 0) {
    const bool any = row_l > 0.f;
    final_smem[rr] = any ? row_m + __log2f(row_l) : -INFINITY;
    final_smem[R + rr] = any ? 1.f / row_l : 0.f;
  }
  __syncthreads();
  write_partials<MT>(p, o, final_smem, R, rt * R, rows, g0, split, S, {tid, warp, gid, tig});
}

// ---------------------------------------------------------------------------------------------
// v5: 64 rows per CTA. 8 warps; phase 1: warp (dq = w % 4, rg = w / 4) holds Q of m-tiles 2 rg,
// 2 rg + 1 over the dim quarter dq (k-steps interleaved as in v4): 72 registers, each K fragment
// feeds 4 mma. Reduce: warp w owns rows 16 (w / 2) + 8 (w % 2) + [0, 8), 4 tokens per thread,
// in the accumulator layout (row gid, tokens 8 n + 2 tig + {0, 1}). Phase 2: warp w owns V columns
// [64 w, +64) of all four m-tiles (128 accumulators), each V fragment feeds 4 mma. The loop runs
// phase 2 of tile t-1 and phase 1 of tile t between barrier A (tile t landed, P(t-1) ready, vote
// on rescaling, slot of t-2 free: phase 1 refills it with tile t+2) and barrier B (partial S(t)
// ready); the reduce of t follows B.
constexpr int kV5Rows = 64;
constexpr int kV5BlockN = 16;
constexpr int kV5Stages = 4;
struct SmemV5 {
  static constexpr int kTileBytes = kV5BlockN * kRowBytes;                // 18,432 B
  static constexpr int kKv = 0;                                           // ring: 4 x 18,432 B
  static constexpr int kSp = kKv + kV5Stages * kTileBytes;                // partial S, fragment order
  static constexpr int kP = kSp + kDimGroups * kV5Rows * kV5BlockN * 4;   // 16,384 B
  static constexpr int kScale = kP + kV5Rows * kV5BlockN * 2;             // P: 2,048 B
  static constexpr int kFinal = kScale + kV5Rows * 4;
  static constexpr int kBytes = kFinal + 2 * kV5Rows * 4;                 // 92,928 B
};
static_assert(SmemV5::kBytes <= kSmemLimit, "shared memory must fit sm_120's 99 KB");

__device__ __forceinline__ void attn_body_v5(const Params& p, uint8_t* smem) {
  constexpr int BN = kV5BlockN, ST = kV5Stages, R = kV5Rows;
  constexpr int TPTOK = kThreads / BN;                // loader: 16 threads per token
  constexpr int CPT = (kChunks + TPTOK - 1) / TPTOK;  // loader: 5 chunks per thread (last: half)
  static_assert(TPTOK % 8 == 0, "loader chunks per thread must keep the swizzle's low bits");
  static_assert(CPT <= kKSteps, "phase 1 issues one loader chunk per k-step");
  using L = SmemV5;

  CtaWork w;
  if (!cta_work<R, BN>(p, w)) return;
  const auto [rt, split, b, tid, lane, warp, H, q_len, rows, kv_len, kv_begin, kv_end, S, prefix,
              g0] = w;

  const uint32_t kv_smem = smem_addr(smem + L::kKv);
  float2* sp_smem = reinterpret_cast<float2*>(smem + L::kSp);
  // P in the mma's A-operand register order: lane's 16 bytes of m-tile m are {a0, a1, a2, a3}
  // (rows gid, gid + 8 x tokens 2 tig, 8 + 2 tig), so phase 2 loads each fragment with one
  // 16-byte load into the operand's registers (assembled from two 8-byte loads, every mma's
  // operand cost four register moves: 1.1 moves per HMMA in the profile).
  uint32_t* p_words = reinterpret_cast<uint32_t*>(smem + L::kP);
  const uint4* p_frags = reinterpret_cast<const uint4*>(smem + L::kP);
  float* scale_smem = reinterpret_cast<float*>(smem + L::kScale);
  float* final_smem = reinterpret_cast<float*>(smem + L::kFinal);

  const int gid = lane >> 2, tig = lane & 3;
  const int dq = warp & 3, rg = warp >> 2;  // phase 1: dim quarter, m-tile pair

  uint32_t qf[2][kKSteps][4];
#pragma unroll
  for (int mi = 0; mi < 2; ++mi) {
    const int r0 = (2 * rg + mi) * 16 + gid, r1 = r0 + 8;
    const bool v0 = rt * R + r0 < rows, v1 = rt * R + r1 < rows;
    const uint32_t* q0 = reinterpret_cast<const uint32_t*>(p.q + (g0 + (v0 ? r0 : 0)) * kDqk);
    const uint32_t* q1 = reinterpret_cast<const uint32_t*>(p.q + (g0 + (v1 ? r1 : 0)) * kDqk);
#pragma unroll
    for (int kk = 0; kk < kKSteps; ++kk) {
      const int w = (kk * kDimGroups + dq) * 8 + tig;  // chunk (4 kk + dq) * 2, 32-bit words
      qf[mi][kk][0] = v0 ? __ldg(q0 + w) : 0u;
      qf[mi][kk][1] = v1 ? __ldg(q1 + w) : 0u;
      qf[mi][kk][2] = v0 ? __ldg(q0 + w + 4) : 0u;
      qf[mi][kk][3] = v1 ? __ldg(q1 + w + 4) : 0u;
    }
  }

  const int ld_tok = tid / TPTOK, ld_c = tid % TPTOK;
  const int* pt = p.page_table + static_cast<int64_t>(b) * p.pt_stride;
  // Page sizes that are powers of two (1, 16, 64, ...) take a shift and a mask instead of an
  // integer division (about 25 instructions each) per tile; the branch is uniform.
  const int ps = p.page_size;
  const bool ps_pow2 = (ps & (ps - 1)) == 0;
  const int ps_shift = __ffs(ps) - 1;
  auto page_of = [&](int tile_begin) -> int {
    const int t = tile_begin + ld_tok;
    return t < kv_end ? pt[ps_pow2 ? (t >> ps_shift) : (t / ps)] : 0;
  };
  // A tile's copy into a ring slot: this thread's token and its CPT 16-byte chunks, issued one by
  // one (in the loop, from phase 1's k-steps, between its MMAs).
  struct Copy {
    const __nv_bfloat16* src;
    uint32_t dst;
    int bytes;  // 0 past the split: the chunk is zero-filled
    bool on;    // false past the last tile: nothing issued
  };
  auto copy_of = [&](int slot, int tile_begin, int page, bool on) -> Copy {
    const int t = tile_begin + ld_tok;
    const bool ok = t < kv_end;
    const int off = ps_pow2 ? (t & (ps - 1)) : (t % ps);
    const __nv_bfloat16* src = ok ? p.kv + (static_cast<int64_t>(page) * ps + off) * kDqk : p.kv;
    return {src, kv_smem + slot * L::kTileBytes + kv_offset(ld_tok, ld_c), ok ? 16 : 0, on};
  };
  auto copy_chunk = [&](const Copy& cp, int k) {
    const int c = ld_c + TPTOK * k;
    if (cp.on && (kChunks % TPTOK == 0 || c < kChunks))
      cp_async16(cp.dst + TPTOK * 16 * k, cp.src + c * 8, cp.bytes);
  };

  // Reduce ownership: row rr of the tile, tokens 8 n + 2 tig + {0, 1}.
  const int rm = warp >> 1, rh = warp & 1;
  const int rr = rm * 16 + rh * 8 + gid;
  const int lrow = rt * R + rr;
  const bool row_valid = lrow < rows;
  const int qi = lrow / H;
  float row_m = -INFINITY, row_l = 0.f;

  float o[4][8][4];
#pragma unroll
  for (int m = 0; m < 4; ++m)
#pragma unroll
    for (int n = 0; n < 8; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) o[m][n][e] = 0.f;

  const int n_tiles = (kv_end - kv_begin + BN - 1) / BN;
  // Two tiles ahead: tile it + 2 is copied during phase 1 of iteration it, into the slot tile
  // it - 2 left (its phase 2 ran before barrier B of it - 1), its chunks issued between the MMAs
  // instead of in the scalar stretch after barrier B.
#pragma unroll
  for (int s = 0; s < ST - 2; ++s) {
    const int tb = kv_begin + s * BN;
    const Copy cp = copy_of(s, tb, page_of(tb), s < n_tiles);
#pragma unroll
    for (int k = 0; k < CPT; ++k) copy_chunk(cp, k);
    cp_async_commit();
  }
  int pf_page = page_of(kv_begin + (ST - 2) * BN);

  // O = O * alpha + P V for this warp's 64 columns of all four m-tiles.
  auto phase2 = [&](uint32_t kv_s, bool rescale) {
    if (rescale) {
#pragma unroll
      for (int m = 0; m < 4; ++m) {
        const float a0 = scale_smem[m * 16 + gid], a1 = scale_smem[m * 16 + gid + 8];
#pragma unroll
        for (int n = 0; n < 8; ++n) {
          o[m][n][0] *= a0;
          o[m][n][1] *= a0;
          o[m][n][2] *= a1;
          o[m][n][3] *= a1;
        }
      }
    }
    uint32_t pa[4][4];
#pragma unroll
    for (int m = 0; m < 4; ++m) {
      const uint4 a = p_frags[m * 32 + lane];
      pa[m][0] = a.x;
      pa[m][1] = a.y;
      pa[m][2] = a.z;
      pa[m][3] = a.w;
    }
    const int v_tok = (lane & 7) + ((lane >> 3) & 1) * 8;
#pragma unroll
    for (int np = 0; np < 4; ++np) {
      uint32_t vb[4];
      ldmatrix_x4_trans(kv_s + kv_offset(v_tok, warp * 8 + np * 2 + (lane >> 4)), vb);
#pragma unroll
      for (int m = 0; m < 4; ++m) {
        mma_bf16(o[m][2 * np], pa[m], vb[0], vb[1]);
        mma_bf16(o[m][2 * np + 1], pa[m], vb[2], vb[3]);
      }
    }
  };

  // Partial S over this warp's dim quarter for its two m-tiles, stored in fragment order:
  // float2 index (((dq * 4 + m) * 2 + n) * 2 + h) * 32 + lane holds rows gid + 8 h, tokens
  // 8 n + 2 tig + {0, 1} (a warp's 32 lanes write 256 contiguous bytes).
  auto phase1 = [&](uint32_t kv_s, const Copy& next) {
    float s[2][2][4];
#pragma unroll
    for (int mi = 0; mi < 2; ++mi)
#pragma unroll
      for (int n = 0; n < 2; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) s[mi][n][e] = 0.f;
    const int b_tok = (lane & 7) + ((lane >> 4) << 3);
    const int b_half = (lane >> 3) & 1;
    const uint32_t k_base = kv_s + kv_offset(b_tok, 2 * dq + b_half);
#pragma unroll
    for (int kk = 0; kk < kKSteps; ++kk) {
      uint32_t kb[4];
      ldmatrix_x4(k_base + kk * 128, kb);  // chunk 8 kk + 2 dq + b_half, tokens 0..15
      if (kk < CPT) copy_chunk(next, kk);    // the loader's work between the MMAs
#pragma unroll
      for (int mi = 0; mi < 2; ++mi) {
        mma_bf16(s[mi][0], qf[mi][kk], kb[0], kb[1]);
        mma_bf16(s[mi][1], qf[mi][kk], kb[2], kb[3]);
      }
    }
#pragma unroll
    for (int mi = 0; mi < 2; ++mi)
#pragma unroll
      for (int n = 0; n < 2; ++n)
#pragma unroll
        for (int h = 0; h < 2; ++h)
          sp_smem[(((dq * 4 + 2 * rg + mi) * 2 + n) * 2 + h) * 32 + lane] =
              make_float2(s[mi][n][2 * h], s[mi][n][2 * h + 1]);
  };

  // Sum the partials, scale, mask, online softmax (lazy max as v4), P in A-fragment order.
  auto reduce = [&](int tile_begin) -> bool {
    float v[2][2];
#pragma unroll
    for (int n = 0; n < 2; ++n) {
      v[n][0] = 0.f;
      v[n][1] = 0.f;
#pragma unroll
      for (int d = 0; d < kDimGroups; ++d) {
        const float2 x = sp_smem[(((d * 4 + rm) * 2 + n) * 2 + rh) * 32 + lane];
        v[n][0] += x.x;
        v[n][1] += x.y;
      }
    }
    // Every token of the tile in the prefix and the split: no per-element mask. The test is the
    // same for the whole CTA, so the common case runs as straight-line code (the masked one
    // branches per element around the tree-mask load).
    const bool full = tile_begin + BN <= kv_end && tile_begin + BN <= prefix;
    float mx = -INFINITY;
    if (full) {
#pragma unroll
      for (int n = 0; n < 2; ++n)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          v[n][e] *= p.scale_log2;
          mx = fmaxf(mx, v[n][e]);
        }
    } else {
#pragma unroll
      for (int n = 0; n < 2; ++n)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int t = tile_begin + n * 8 + 2 * tig + e;
          const bool vis = row_valid && t < kv_end &&
                           (t < prefix || draft_visible(p, b, qi, t - prefix));
          v[n][e] = vis ? v[n][e] * p.scale_log2 : -INFINITY;
          mx = fmaxf(mx, v[n][e]);
        }
    }
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
    const float m_new = mx > row_m + kMaxSlack ? mx : row_m;
    const float m_use = (m_new == -INFINITY) ? 0.f : m_new;
    const bool moved = m_new != row_m;
    const float alpha = moved ? fast_exp2(row_m - m_use) : 1.f;
    float sum = 0.f;
#pragma unroll
    for (int n = 0; n < 2; ++n)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        v[n][e] = fast_exp2(v[n][e] - m_use);
        sum += v[n][e];
      }
    row_l = row_l * alpha + sum;  // this thread's share; alpha is the same row-wide
    row_m = m_new;
    p_words[(rm * 32 + lane) * 4 + rh] = pack_bf16x2(v[0][0], v[0][1]);      // a0 / a1
    p_words[(rm * 32 + lane) * 4 + 2 + rh] = pack_bf16x2(v[1][0], v[1][1]);  // a2 / a3
    if (tig == 0) scale_smem[rr] = alpha;
    return moved;
  };

  bool moved = false;
  for (int it = 0;; ++it) {
    cp_async_wait<ST - 3>();  // tile `it` landed (this thread's part)
    // A: tile `it` visible, P and alpha of tile it-1 ready, partial-S buffer free, slot of
    // tile it-2 free
    const bool rescale = __syncthreads_or(moved) != 0;
    const int nxt = it + ST - 2;  // copied during phase 1, into slot (it - 2) % ST
    const int nb = kv_begin + nxt * BN;
    const Copy next = copy_of(nxt % ST, nb, pf_page, nxt < n_tiles);
    pf_page = page_of(nb + BN);
    if (it > 0) phase2(kv_smem + ((it - 1) % ST) * L::kTileBytes, rescale);
    if (it == n_tiles) break;
    const int tile_begin = kv_begin + it * BN;
    phase1(kv_smem + (it % ST) * L::kTileBytes, next);
    cp_async_commit();
    __syncthreads();  // B: partial S of tile `it` ready; P free
    moved = reduce(tile_begin);
  }
  cp_async_wait_all();

  row_l += __shfl_xor_sync(0xffffffffu, row_l, 1);
  row_l += __shfl_xor_sync(0xffffffffu, row_l, 2);
  if (tig == 0) {
    const bool any = row_l > 0.f;
    final_smem[rr] = any ? row_m + __log2f(row_l) : -INFINITY;
    final_smem[R + rr] = any ? 1.f / row_l : 0.f;
  }
  __syncthreads();
  write_partials<4>(p, o, final_smem, R, rt * R, rows, g0, split, S, {tid, warp, gid, tig});
}

}  // namespace dcmla


namespace dcmla {

template <int V>
constexpr int threads_of() {
  return kThreads;
}

template <int MT, int V>
constexpr int smem_of() {
  if constexpr (V == 5)
    return SmemV5::kBytes;
  else
    return SmemLayout<MT, V>::kBytes;
}

template <int MT, int V>
constexpr int block_n_of() {
  if constexpr (V == 5)
    return kV5BlockN;
  else
    return Variant<V>::kBlockN;
}

// One kernel symbol per (m-tiles, variant): mla_attn_kernel<MT, V>, the body chosen at compile time.
template <int MT, int V>
__global__ void __launch_bounds__(threads_of<V>(), min_blocks<MT, V>()) mla_attn_kernel(
    const Params p) {
  extern __shared__ __align__(128) uint8_t smem[];
  dependent_launch_start();
  if constexpr (V == 5)
    attn_body_v5(p, smem);  // MT = 4: 64-row tiles
  else
    attn_body<MT, V>(p, smem);
}

// Merge the splits of one row (grid.x = row, grid.y = 128-column segment) into bf16 output.
__global__ void __launch_bounds__(kCombineThreads) mla_combine_kernel(
    const float* __restrict__ ws_o, const float* __restrict__ ws_lse, __nv_bfloat16* __restrict__ out,
    int num_splits) {
  __shared__ float weight[kMaxSplits];
  __shared__ float red[kCombineThreads / 32];
  __shared__ float4 acc_smem[kCombineThreads / 32][kCombineCols / 4];
  dependent_launch_start();
  const int64_t g = blockIdx.x;
  const int seg = blockIdx.y;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const float* lse = ws_lse + g * num_splits;

  float mx = -INFINITY;
  for (int s = tid; s < num_splits; s += kCombineThreads) mx = fmaxf(mx, lse[s]);
  for (int off = 16; off > 0; off >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, off));
  if (lane == 0) red[warp] = mx;
  __syncthreads();
  mx = red[0];
  for (int w = 1; w < kCombineThreads / 32; ++w) mx = fmaxf(mx, red[w]);
  __syncthreads();

  float total = 0.f;
  for (int s = tid; s < num_splits; s += kCombineThreads) {
    const float v = lse[s];
    const float w = (v == -INFINITY) ? 0.f : exp2f(v - mx);
    weight[s] = w;
    total += w;
  }
  for (int off = 16; off > 0; off >>= 1) total += __shfl_xor_sync(0xffffffffu, total, off);
  if (lane == 0) red[warp] = total;
  __syncthreads();
  total = 0.f;
  for (int w = 0; w < kCombineThreads / 32; ++w) total += red[w];

  // warp w sums splits w, w+8, ...; lane holds 4 columns of the segment.
  float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
  const int col = seg * kCombineCols + lane * 4;
  for (int s = warp; s < num_splits; s += kCombineThreads / 32) {
    const float w = weight[s];
    if (w == 0.f) continue;  // empty split: its partial O was never written
    const float4 v = *reinterpret_cast<const float4*>(ws_o + (g * num_splits + s) * kDv + col);
    acc.x += w * v.x;
    acc.y += w * v.y;
    acc.z += w * v.z;
    acc.w += w * v.w;
  }
  acc_smem[warp][lane] = acc;
  __syncthreads();
  if (warp == 0) {
    float4 sum = acc_smem[0][lane];
    for (int w = 1; w < kCombineThreads / 32; ++w) {
      const float4 v = acc_smem[w][lane];
      sum.x += v.x;
      sum.y += v.y;
      sum.z += v.z;
      sum.w += v.w;
    }
    const float inv = total > 0.f ? 1.f / total : 0.f;
    uint2 packed;
    packed.x = pack_bf16x2(sum.x * inv, sum.y * inv);
    packed.y = pack_bf16x2(sum.z * inv, sum.w * inv);
    *reinterpret_cast<uint2*>(out + g * kDv + col) = packed;
  }
}

// Which kernels got their shared-memory opt-in, per device. Internal linkage on purpose: a
// function-local static of a template is a process-wide (GNU unique) symbol, so the sm_120-model
// library loaded beside the regular one would read the other's flags and skip its own opt-in.
namespace {
bool g_prepared[6][5][64] = {};  // [variant][m-tiles][device]
}  // namespace

template <int MT, int V>
cudaError_t prepare_kernel() {
  // The >48 KB dynamic shared memory opt-in is per device; remember it per device (host only, no
  // stream work, so this is safe during graph capture).
  bool* done = g_prepared[V][MT];
  int dev = 0;
  cudaError_t err = cudaGetDevice(&dev);
  if (err != cudaSuccess) return err;
  if (dev >= 0 && dev < 64 && done[dev]) return cudaSuccess;
  err = cudaFuncSetAttribute(mla_attn_kernel<MT, V>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             smem_of<MT, V>());
#if defined(DCMLA_SM120_MODEL)
  // The carveout is a percentage of the SM's shared memory; the driver rounds up to the next
  // configuration it has, which on Hopper is 100 KB (sm_120's size) for anything above 64 KB.
  int max_per_sm = 0;
  if (err == cudaSuccess)
    err = cudaDeviceGetAttribute(&max_per_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, dev);
  if (err == cudaSuccess && max_per_sm > kModelSmemPerSm)
    err = cudaFuncSetAttribute(mla_attn_kernel<MT, V>,
                               cudaFuncAttributePreferredSharedMemoryCarveout,
                               kModelSmemPerSm * 100 / max_per_sm);
#endif
  if (err == cudaSuccess && dev >= 0 && dev < 64) done[dev] = true;
  return err;
}

// A launch on the stream, as a programmatic dependent of the kernel before it when `dependent`
// (the kernel then waits for that one itself: dependent_launch_start); else a plain launch.
template <typename... KernelArgs, typename... Args>
cudaError_t launch(void (*kernel)(KernelArgs...), dim3 grid, dim3 block, size_t smem,
                   cudaStream_t stream, bool dependent, Args... args) {
  if (!dependent) {
    kernel<<<grid, block, smem, stream>>>(args...);
    return cudaGetLastError();
  }
  cudaLaunchAttribute attr = {};
  attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr.val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cfg.attrs = &attr;
  cfg.numAttrs = 1;
  return cudaLaunchKernelEx(&cfg, kernel, args...);
}

template <int N>
using IntC = std::integral_constant<int, N>;

// The one place that maps run-time (variant, m-tiles) to a kernel instance: f(IntC<MT>, IntC<V>).
template <typename F>
cudaError_t dispatch(int variant, int mtiles, F&& f) {
  switch (variant * 10 + mtiles) {
    case 11: return f(IntC<1>{}, IntC<1>{});
    case 12: return f(IntC<2>{}, IntC<1>{});
    case 21: return f(IntC<1>{}, IntC<2>{});
    case 22: return f(IntC<2>{}, IntC<2>{});
    case 31: return f(IntC<1>{}, IntC<3>{});
    case 32: return f(IntC<2>{}, IntC<3>{});
    case 41: return f(IntC<1>{}, IntC<4>{});
    case 42: return f(IntC<2>{}, IntC<4>{});
    // v5 has one kernel, 64-row tiles (MT = 4), whatever m-tiles the host planned with
    case 51:
    case 52:
    case 54: return f(IntC<4>{}, IntC<5>{});
    default: return cudaErrorInvalidValue;
  }
}

inline bool valid_variant(int variant, int mtiles) {
  return variant >= 1 && variant <= 5 && (mtiles == 1 || mtiles == 2);
}

}  // namespace dcmla

extern "C" {

// Python binds these through kernels/abi.py; tests/test_kernel_abi.py checks that the two agree.

// The interface's version: raised whenever a function's parameters change, so a library built
// from older source (left in a build folder) is refused by name instead of misreading arguments.
int dcmla_abi_version() { return 3; }

int dcmla_max_splits() { return dcmla::kMaxSplits; }

// Shared memory per SM the library plans its CTAs for: sm_120's 100 KB in the sm_120-model build
// (DCMLA_SM120_MODEL), 0 (the GPU's own) otherwise.
int dcmla_model_smem_per_sm() {
#if defined(DCMLA_SM120_MODEL)
  return dcmla::kModelSmemPerSm;
#else
  return 0;
#endif
}

// Dynamic shared memory of an attention kernel (static shared memory is in ptxas -v); -1 if unknown.
int dcmla_smem_bytes(int variant, int mtiles) {
  int n = -1;
  dcmla::dispatch(variant, mtiles, [&](auto mt, auto v) {
    n = dcmla::smem_of<decltype(mt)::value, decltype(v)::value>();
    return cudaSuccess;
  });
  return n;
}

const char* dcmla_error_string(int code) {
  return cudaGetErrorString(static_cast<cudaError_t>(code));
}

// Resident CTAs per SM of an attention kernel on the current device (the host plans v5's in its
// own 64-row CTAs).
int dcmla_ctas_per_sm(int variant, int mtiles, int* out) {
  return static_cast<int>(dcmla::dispatch(variant, mtiles, [&](auto mt, auto v) {
    constexpr int MT = decltype(mt)::value, V = decltype(v)::value;
    cudaError_t err = dcmla::prepare_kernel<MT, V>();
    if (err != cudaSuccess) return err;
    err = cudaOccupancyMaxActiveBlocksPerMultiprocessor(
        out, dcmla::mla_attn_kernel<MT, V>, dcmla::threads_of<V>(), dcmla::smem_of<MT, V>());
#if defined(DCMLA_SM120_MODEL)
    const int fit = dcmla::kModelSmemPerSm /
                    (dcmla::smem_of<MT, V>() + dcmla::kSmemPerBlockReserved);
    if (err == cudaSuccess && *out > fit) *out = fit;
#endif
    return err;
  }));
}

// out[total_q, H, 512] = attention(q, paged latent KV). ws_o holds total_q*H*num_splits*512 floats,
// ws_lse total_q*H*num_splits floats. max_q_len only sizes the grid (an upper bound is fine).
// variant: 1..5 (see the top of this file); mtiles: 1 (16-row tiles) or 2 (32-row tiles) for
// v1..v4; v5 always runs 64-row tiles (mtiles only has to be 1 or 2). dependent: 1 launches both
// kernels as programmatic dependents of the kernel before them (sm_90+), 0 plainly.
int dcmla_mla_attention(const void* q, const void* kv, const int* page_table, const int* kv_lens,
                        const int* q_indptr, const uint8_t* tree_mask, void* out, float* ws_o,
                        float* ws_lse, int batch, int heads, int total_q, int max_q_len,
                        int page_size, int pt_stride, int tree_stride, int num_splits,
                        int split_tokens, int mtiles, int variant, int dependent, float sm_scale,
                        cudaStream_t stream) {
  if (batch <= 0 || total_q <= 0) return static_cast<int>(cudaSuccess);
  if (heads <= 0 || max_q_len <= 0 || page_size <= 0 || pt_stride <= 0 || num_splits <= 0 ||
      num_splits > dcmla::kMaxSplits || split_tokens < 0 || (dependent != 0 && dependent != 1) ||
      !dcmla::valid_variant(variant, mtiles) ||
      (tree_mask != nullptr && tree_stride < max_q_len))
    return static_cast<int>(cudaErrorInvalidValue);
  dcmla::Params p;
  p.q = static_cast<const __nv_bfloat16*>(q);
  p.kv = static_cast<const __nv_bfloat16*>(kv);
  p.page_table = page_table;
  p.kv_lens = kv_lens;
  p.q_indptr = q_indptr;
  p.tree_mask = tree_mask;
  p.ws_o = ws_o;
  p.ws_lse = ws_lse;
  p.heads = heads;
  p.page_size = page_size;
  p.pt_stride = pt_stride;
  p.tree_stride = tree_stride;
  p.num_splits = num_splits;
  p.split_tokens = split_tokens;
  p.scale_log2 = sm_scale * 1.4426950408889634f;
  cudaError_t err = dcmla::dispatch(variant, mtiles, [&](auto mt, auto v) {
    constexpr int MT = decltype(mt)::value, V = decltype(v)::value;
    cudaError_t e = dcmla::prepare_kernel<MT, V>();
    if (e != cudaSuccess) return e;
    const int row_tiles = (max_q_len * heads + 16 * MT - 1) / (16 * MT);
    dim3 grid(row_tiles, p.num_splits, batch);
    return dcmla::launch(dcmla::mla_attn_kernel<MT, V>, grid, dcmla::threads_of<V>(),
                         dcmla::smem_of<MT, V>(), stream, dependent != 0, p);
  });
  if (err != cudaSuccess) return static_cast<int>(err);
  dim3 grid(static_cast<unsigned>(total_q) * heads, dcmla::kDv / dcmla::kCombineCols);
  return static_cast<int>(dcmla::launch(
      dcmla::mla_combine_kernel, grid, dcmla::kCombineThreads, 0, stream, dependent != 0,
      static_cast<const float*>(ws_o), static_cast<const float*>(ws_lse),
      static_cast<__nv_bfloat16*>(out), num_splits));
}

}  // extern "C"
