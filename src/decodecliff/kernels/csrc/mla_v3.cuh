// v3 of the MLA attention kernel body: 16 warps (512 threads) held to 128 registers.
//
// Nsight Compute on v1 (H200, 185k chain16, 8 heads) found the tensor pipe 24% busy with 2 warps
// per scheduler and every warp waiting on a dependency (long scoreboard 1.96, short scoreboard
// 1.78, fixed-latency wait 1.69 cycles per issued instruction; barriers only 0.36). v3 keeps the
// same tile algebra (Q in registers split over the dims, partial S through shared memory, P V with
// the columns split over warps) but doubles the warps per scheduler, so each phase has twice the
// independent mma / ldmatrix chains in flight, and takes the page-table load off the gather path.
//   32-row tiles: 32-token KV tiles, 2 stages; phase 1 warp = (dim quarter, m-tile, token half).
//   16-row tiles: 16-token KV tiles, 4 stages; phase 1 warp = (dim eighth, token half).
//   phase 2: warp w owns V columns [32 w, +32) of every m-tile.
#pragma once

namespace dcmla {

constexpr int kThreadsV3 = 512;

template <int MT>
struct V3Traits;
template <>
struct V3Traits<2> {
  static constexpr int kBlockN = 32, kStages = 2, kDimGroups = 4, kTokSlices = 2;
};
template <>
struct V3Traits<1> {
  static constexpr int kBlockN = 16, kStages = 4, kDimGroups = 8, kTokSlices = 2;
};

template <int MT>
struct SmemLayoutV3 {
  using T = V3Traits<MT>;
  static constexpr int kRows = 16 * MT;
  static constexpr int kBlockN = T::kBlockN;
  static constexpr int kTileBytes = kBlockN * kRowBytes;
  static constexpr int kSpStride = kBlockN + 8;
  static constexpr int kPStride = kBlockN + 8;
  static constexpr int kKv = 0;
  static constexpr int kSp = kKv + T::kStages * kTileBytes;
  static constexpr int kP = kSp + T::kDimGroups * kRows * kSpStride * 4;
  static constexpr int kScale = kP + kRows * kPStride * 2;
  static constexpr int kFinal = kScale + kRows * 4;
  static constexpr int kBytes = kFinal + 2 * kRows * 4;
};
static_assert(SmemLayoutV3<2>::kBytes <= kSmemLimit, "shared memory must fit sm_120's 99 KB");
static_assert(SmemLayoutV3<1>::kBytes <= kSmemLimit, "shared memory must fit sm_120's 99 KB");

template <int MT>
__device__ __forceinline__ void attn_v3(const Params& p, uint8_t* smem) {
  using T = V3Traits<MT>;
  using L = SmemLayoutV3<MT>;
  constexpr int NTH = kThreadsV3;
  constexpr int BN = T::kBlockN, ST = T::kStages, DG = T::kDimGroups, TS = T::kTokSlices;
  constexpr int R = L::kRows, SPS = L::kSpStride, PS = L::kPStride;
  constexpr int KS = kDqk / 16;               // 36 k-steps over the 576 dims
  constexpr int KPG = (KS + DG - 1) / DG;     // most k-steps one dim group holds
  constexpr int TOKW = BN / TS;               // phase 1: tokens per warp
  constexpr int NT = TOKW / 8;                // phase 1: n-tiles per warp
  constexpr int RTH = (R * BN >= NTH) ? NTH : R * BN;  // reduce: active threads
  constexpr int TPR = RTH / R;                // reduce: threads per row
  constexpr int TPT = BN / TPR;               // reduce: tokens per thread
  constexpr int TPTOK = NTH / BN;             // loader: threads per token
  constexpr int CPT = (kChunks + TPTOK - 1) / TPTOK;
  constexpr int CW = kDv / (NTH / 32);        // phase 2: V columns per warp (32)
  static_assert(DG * MT * TS == NTH / 32, "phase 1 covers every warp once");
  static_assert(NT >= 1 && TOKW % 8 == 0 && TPT >= 1 && RTH % 32 == 0 && CW == 32, "tile shape");

  const int rt = blockIdx.x, split = blockIdx.y, b = blockIdx.z;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int H = p.heads;
  const int q_begin = p.q_indptr[b];
  const int q_len = p.q_indptr[b + 1] - q_begin;
  const int rows = q_len * H;
  if (rt * R >= rows) return;
  const int kv_len = p.kv_lens[b];
  int chunk = (kv_len + p.num_splits - 1) / p.num_splits;
  chunk = (chunk + BN - 1) / BN * BN;
  const int kv_begin = split * chunk;
  const int kv_end = min(kv_len, kv_begin + chunk);
  const int64_t g0 = static_cast<int64_t>(q_begin) * H + rt * R;
  const int S = p.num_splits;
  if (kv_begin >= kv_end) {
    if (tid < R && rt * R + tid < rows) p.ws_lse[(g0 + tid) * S + split] = -INFINITY;
    return;
  }
  const int prefix = kv_len - q_len;

  const uint32_t kv_smem = smem_addr(smem + L::kKv);
  float* sp_smem = reinterpret_cast<float*>(smem + L::kSp);
  __nv_bfloat16* p_smem = reinterpret_cast<__nv_bfloat16*>(smem + L::kP);
  float* scale_smem = reinterpret_cast<float*>(smem + L::kScale);
  float* final_smem = reinterpret_cast<float*>(smem + L::kFinal);

  const int gid = lane >> 2, tig = lane & 3;
  const int dq = warp % DG;               // phase 1: dim group
  const int mt_w = (warp / DG) % MT;      // phase 1: m-tile
  const int tok0 = (warp / (DG * MT)) * TOKW;  // phase 1: first token of the slice
  const int k0 = dq * KS / DG, nk = (dq + 1) * KS / DG - k0;

  uint32_t qf[KPG][4];
  {
    const int r0 = mt_w * 16 + gid, r1 = r0 + 8;
    const bool v0 = rt * R + r0 < rows, v1 = rt * R + r1 < rows;
    const uint32_t* q0 = reinterpret_cast<const uint32_t*>(p.q + (g0 + (v0 ? r0 : 0)) * kDqk);
    const uint32_t* q1 = reinterpret_cast<const uint32_t*>(p.q + (g0 + (v1 ? r1 : 0)) * kDqk);
#pragma unroll
    for (int kk = 0; kk < KPG; ++kk) {
      const bool in = kk < nk;
      const int w = ((k0 + (in ? kk : 0)) * 16 + 2 * tig) / 2;
      qf[kk][0] = (in && v0) ? __ldg(q0 + w) : 0u;
      qf[kk][1] = (in && v1) ? __ldg(q1 + w) : 0u;
      qf[kk][2] = (in && v0) ? __ldg(q0 + w + 4) : 0u;
      qf[kk][3] = (in && v1) ? __ldg(q1 + w + 4) : 0u;
    }
  }

  const int ld_tok = tid / TPTOK, ld_c = tid % TPTOK;
  const int* pt = p.page_table + static_cast<int64_t>(b) * p.pt_stride;
  auto page_of = [&](int tile_begin) -> int {
    const int t = tile_begin + ld_tok;
    return t < kv_end ? pt[t / p.page_size] : 0;
  };
  auto issue = [&](int slot, int tile_begin, int page) {
    const int t = tile_begin + ld_tok;
    const bool ok = t < kv_end;
    const __nv_bfloat16* src = p.kv;
    if (ok) src = p.kv + (static_cast<int64_t>(page) * p.page_size + t % p.page_size) * kDqk;
    const uint32_t dst = kv_smem + slot * L::kTileBytes;
#pragma unroll
    for (int k = 0; k < CPT; ++k) {
      const int c = ld_c + TPTOK * k;
      if (kChunks % TPTOK == 0 || c < kChunks)
        cp_async16(dst + kv_offset(ld_tok, c), src + c * 8, ok ? 16 : 0);
    }
  };

  const bool reducer = tid < RTH;
  const int rr = reducer ? tid / TPR : 0, rj = tid % TPR;
  const int lrow = rt * R + rr;
  const bool row_valid = reducer && lrow < rows;
  const int qi = lrow / H;
  float row_m = -INFINITY, row_l = 0.f;

  float o[MT][4][4];
#pragma unroll
  for (int m = 0; m < MT; ++m)
#pragma unroll
    for (int n = 0; n < 4; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) o[m][n][e] = 0.f;

  const int n_tiles = (kv_end - kv_begin + BN - 1) / BN;
#pragma unroll
  for (int s = 0; s < ST - 1; ++s) {
    const int tb = kv_begin + s * BN;
    if (s < n_tiles) issue(s, tb, page_of(tb));
    cp_async_commit();
  }
  int pf_page = page_of(kv_begin + (ST - 1) * BN);

  for (int it = 0; it < n_tiles; ++it) {
    const int slot = it % ST;
    const int tile_begin = kv_begin + it * BN;
    cp_async_wait<ST - 2>();
    __syncthreads();  // tile `it` visible; every warp is done with tile it-1 (its slot is free)
    {
      const int nxt = it + ST - 1;
      const int nb = kv_begin + nxt * BN;
      if (nxt < n_tiles) issue(nxt % ST, nb, pf_page);
      pf_page = page_of(nb + BN);  // used next iteration: its latency hides behind this tile
      cp_async_commit();
    }
    const uint32_t kv_s = kv_smem + slot * L::kTileBytes;

    // ---- phase 1: partial S of (m-tile, token slice) over this warp's dim group ----
    {
      float s[2][NT][4];
#pragma unroll
      for (int ch = 0; ch < 2; ++ch)
#pragma unroll
        for (int n = 0; n < NT; ++n)
#pragma unroll
          for (int e = 0; e < 4; ++e) s[ch][n][e] = 0.f;
      const int b_tok = (lane & 7) + ((lane >> 4) << 3);
      const int b_half = (lane >> 3) & 1;
#pragma unroll
      for (int kk = 0; kk < KPG; ++kk) {
        if (kk < nk) {  // warp-uniform
          const int c = (k0 + kk) * 2 + b_half;
          if constexpr (NT >= 2) {
#pragma unroll
            for (int pr = 0; pr < NT / 2; ++pr) {
              uint32_t kb[4];
              ldmatrix_x4(kv_s + kv_offset(tok0 + 16 * pr + b_tok, c), kb);
              mma_bf16(s[kk & 1][2 * pr], qf[kk], kb[0], kb[1]);
              mma_bf16(s[kk & 1][2 * pr + 1], qf[kk], kb[2], kb[3]);
            }
          } else {
            uint32_t kb[2];
            ldmatrix_x2(kv_s + kv_offset(tok0 + (lane & 7), c), kb);
            mma_bf16(s[kk & 1][0], qf[kk], kb[0], kb[1]);
          }
        }
      }
      float* sp = sp_smem + dq * R * SPS;
      const int r = mt_w * 16 + gid;
#pragma unroll
      for (int n = 0; n < NT; ++n) {
        const int col = tok0 + n * 8 + 2 * tig;
        *reinterpret_cast<float2*>(sp + r * SPS + col) =
            make_float2(s[0][n][0] + s[1][n][0], s[0][n][1] + s[1][n][1]);
        *reinterpret_cast<float2*>(sp + (r + 8) * SPS + col) =
            make_float2(s[0][n][2] + s[1][n][2], s[0][n][3] + s[1][n][3]);
      }
    }
    __syncthreads();

    // ---- reduce: sum partials, scale, mask, online softmax, P -> smem ----
    if (reducer) {
      float sv[TPT];
#pragma unroll
      for (int e = 0; e < TPT; ++e) sv[e] = 0.f;
#pragma unroll
      for (int d = 0; d < DG; ++d) {
        const float* src = sp_smem + (d * R + rr) * SPS + rj * TPT;
        if constexpr (TPT == 2) {
          const float2 v = *reinterpret_cast<const float2*>(src);
          sv[0] += v.x;
          sv[1] += v.y;
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
      const float m_new = fmaxf(row_m, mx);
      const float m_use = (m_new == -INFINITY) ? 0.f : m_new;
      const float alpha = fast_exp2(row_m - m_use);
      float sum = 0.f;
#pragma unroll
      for (int e = 0; e < TPT; ++e) {
        sv[e] = fast_exp2(sv[e] - m_use);
        sum += sv[e];
      }
#pragma unroll
      for (int off = 1; off < TPR; off <<= 1) sum += __shfl_xor_sync(0xffffffffu, sum, off);
      row_l = row_l * alpha + sum;
      row_m = m_new;
      if constexpr (TPT == 2) {
        *reinterpret_cast<uint32_t*>(p_smem + rr * PS + rj * 2) = pack_bf16x2(sv[0], sv[1]);
      } else {
#pragma unroll
        for (int e = 0; e < TPT; ++e) p_smem[rr * PS + rj * TPT + e] = __float2bfloat16_rn(sv[e]);
      }
      if (rj == 0) scale_smem[rr] = alpha;
    }
    __syncthreads();

    // ---- phase 2: O = O * alpha + P V over this warp's 32 V columns ----
    {
#pragma unroll
      for (int m = 0; m < MT; ++m) {
        const float a0 = scale_smem[m * 16 + gid], a1 = scale_smem[m * 16 + gid + 8];
#pragma unroll
        for (int n = 0; n < 4; ++n) {
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
        for (int np = 0; np < 2; ++np) {
          uint32_t vb[4];
          ldmatrix_x4_trans(kv_s + kv_offset(v_tok, warp * 4 + np * 2 + (lane >> 4)), vb);
#pragma unroll
          for (int m = 0; m < MT; ++m) {
            mma_bf16(o[m][2 * np], pa[m], vb[0], vb[1]);
            mma_bf16(o[m][2 * np + 1], pa[m], vb[2], vb[3]);
          }
        }
      }
    }
  }

  if (reducer && rj == 0) {
    const bool any = row_l > 0.f;
    final_smem[rr] = any ? row_m + __log2f(row_l) : -INFINITY;
    final_smem[R + rr] = any ? 1.f / row_l : 0.f;
  }
  __syncthreads();
#pragma unroll
  for (int m = 0; m < MT; ++m) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = m * 16 + gid + h * 8;
      if (rt * R + r >= rows) continue;
      const float inv = final_smem[R + r];
      float* dst = p.ws_o + ((g0 + r) * S + split) * kDv + warp * CW + 2 * tig;
#pragma unroll
      for (int n = 0; n < 4; ++n)
        *reinterpret_cast<float2*>(dst + n * 8) =
            make_float2(o[m][n][2 * h] * inv, o[m][n][2 * h + 1] * inv);
    }
  }
  if (tid < R && rt * R + tid < rows) p.ws_lse[(g0 + tid) * S + split] = final_smem[tid];
}

}  // namespace dcmla
