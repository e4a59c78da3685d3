// elmokit's optional C++ kernels for small-batch inference (loaded and used by elmokit/modules/native.py).
//
// At batch 1 the biLM's time is weight traffic and per-op overhead, not arithmetic. Two kernels:
//
// * lstm_layer: one LSTM layer (both directions, one after the other) without autograd: the same cell equations
//   as BiLSTM._run_layer (TensorFlow LSTMCell with num_proj, clipping), W_hh packed by unit blocks
//   (native.pack_lstm; H and P multiples of 16). Each direction is one OpenMP team over its steps: each thread keeps
//   its share of the weights in its core's L2 and does the recurrent product, the gates and a partial projection of
//   its units, one barrier a step (direction_steps_fused). Where a thread's share does not fit in L2 (one thread
//   on the small configuration: 2.5 MB a direction against 2 MB), the blocks are visited in snake order, up on even
//   steps and down on odd ones, so that each step begins with the blocks the previous one read last, still cached.
// * highway_layer: one highway layer for at most 12 rows. The weight is read once, in blocks of 16 units holding
//   their 16 transform and 16 gate columns side by side (packed by native.py), with the rows' accumulators in
//   registers; MKL's GEMM at 10 rows runs at about half the rate of its matrix-vector product on this shape.
//   The carry/transform combination is the epilogue of each block.
// * batch-invariant forms (elmokit/modules/invariant.py, Embedder(batch_invariant=True)): linear_rows (x·W + b, each
//   row in one fixed summation order, rows in 12-row panels by one code path), highway_rows_invariant (any rows) and
//   lstm_layer_xw (the step loop from x·W_ih + b for any rows; its 4-, 2- and 1-row forms do each row's FMAs alike): a row's bits do not depend on how
//   many rows share the call, their order or the thread count (tests/test_invariant_kernels.py).
//
// Values equal the ATen paths up to float rounding (sums in another order; exp and tanh from glibc's vector math
// library, within 4 ulp): tests/test_native.py.
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <omp.h>
#include <immintrin.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

namespace {

// Built with -ffast-math (so that expf and tanhf vectorise through glibc's vector math library), which assumes no
// inf or NaN: the arguments are clamped to where float32 results are already saturated (σ(±88) and tanh(±10) round
// to σ's and tanh's limits but for σ(−88) ≈ 6e−39), so that a huge finite pre-activation gives what ATen gives, and
// the entry points below refuse inputs holding inf or NaN (the caller then runs the ATen path, which propagates them).
inline float sigmoid(float x) {
  x = fminf(fmaxf(x, -88.0f), 88.0f);
  return 1.0f / (1.0f + expf(-x));
}

inline float tanh_sat(float x) { return tanhf(fminf(fmaxf(x, -10.0f), 10.0f)); }

// Whether every value of a float32 tensor is finite, read from the bits (-ffast-math may fold std::isfinite to true).
bool all_finite(const at::Tensor& t) {
  const at::Tensor c = t.contiguous();
  const uint32_t* p = reinterpret_cast<const uint32_t*>(c.data_ptr<float>());
  const int64_t n = c.numel();
  uint32_t bad = 0;
  for (int64_t i = 0; i < n; ++i) bad |= ((p[i] & 0x7f800000u) == 0x7f800000u);
  return bad == 0;
}

// Highway: rows' accumulators of one block (16 units: 16 transform + 16 gate columns = two 16-float vectors).
typedef float v16 __attribute__((vector_size(64)));

inline v16 load16(const float* p) {
  v16 v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

inline void store16(float* p, v16 v) { std::memcpy(p, &v, sizeof(v)); }

// acc + s·w with one rounding, spelled out: under -ffast-math GCC may otherwise contract or keep a product separate
// differently in each unrolled copy of a loop body, so that rows in different positions of a row group rounded
// differently (the batch-invariant paths need every row's operations identical).
inline v16 fma16(float s, v16 w, v16 acc) {
#if defined(__AVX512F__)
  return (v16)_mm512_fmadd_ps(_mm512_set1_ps(s), (__m512)w, (__m512)acc);
#else
  v16 r;
  for (int i = 0; i < 16; ++i) r[i] = __builtin_fmaf(s, w[i], acc[i]);
  return r;
#endif
}

constexpr int64_t kChunk = 256;  // inputs summed into fresh accumulators before joining the running total

template <int M>
void highway_block(const float* xt, const float* x, const float* wb, const float* bb, float* y, int64_t f,
                   int64_t block) {
  float total[M][32];
  for (int r = 0; r < M; ++r) std::memcpy(total[r], bb, sizeof(total[r]));
  for (int64_t k0 = 0; k0 < f; k0 += kChunk) {
    const int64_t k1 = k0 + kChunk < f ? k0 + kChunk : f;
    v16 a[M], g[M];
#pragma GCC unroll 12
    for (int r = 0; r < M; ++r) {
      a[r] = v16{};
      g[r] = v16{};
    }
    for (int64_t k = k0; k < k1; ++k) {
      const v16 wa = load16(wb + k * 32);
      const v16 wg = load16(wb + k * 32 + 16);
      const float* xk = xt + k * M;
#pragma GCC unroll 12
      for (int r = 0; r < M; ++r) {
        a[r] += xk[r] * wa;
        g[r] += xk[r] * wg;
      }
    }
#pragma GCC unroll 12
    for (int r = 0; r < M; ++r) {
      store16(total[r], load16(total[r]) + a[r]);
      store16(total[r] + 16, load16(total[r] + 16) + g[r]);
    }
  }
  const int64_t u0 = block * 16;
  for (int r = 0; r < M; ++r) {
    const float* xr = x + r * f + u0;
    float* yr = y + r * f + u0;
#pragma omp simd
    for (int u = 0; u < 16; ++u) {
      const float t = sigmoid(total[r][16 + u]);
      const float hv = fmaxf(total[r][u], 0.0f);
      yr[u] = xr[u] + t * (hv - xr[u]);  // t·relu(transform) + (1 − t)·x, as torch.addcmul(x, t, h − x)
    }
  }
}

template <int M>
void highway_rows(const float* xt, const float* x, const float* wp, const float* bp, float* y, int64_t f) {
  at::parallel_for(0, f / 16, 1, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) highway_block<M>(xt, x, wp + b * f * 32, bp + b * 32, y, f, b);
  });
}


// One unit block (16 units) of one step for R consecutive rows: the recurrent product h·W_hh of the block's i, f, o, j
// columns added to the rows' input contributions xr (row stride 4H), the gate math and cell state update in place on
// cr (row stride H), and the block's share of the projection added to the rows' partial sums pr (row stride P).
// R rows share each weight load: 4R independent accumulators in the recurrent product and 2R in the projection keep
// both FMA ports busy (one row alone has four dependency chains, half of what their latency needs).
#if defined(__AVX512F__)
constexpr int kRowGroup = 4;  // four rows' 16 accumulators (and 4 weights) in AVX-512's 32 vector registers
#else
constexpr int kRowGroup = 1;  // a 16-float vector is 2 (AVX2) or 4 (NEON) registers: one row at a time, as before
#endif
constexpr int64_t kSlices = 16;  // the projection's partial sums: unit blocks in this many slices (direction_steps_fused)

template <int R>
inline void unit_block_rows(const float* xr, const float* hr, const float* wb, const float* wpr, float* cr, float* pr,
                            int64_t blk, int64_t hd, int64_t p, float cclip) {
  const int64_t g4 = 4 * hd;
  v16 a[R][4];
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int g = 0; g < 4; ++g) a[r][g] = load16(xr + r * g4 + g * hd + 16 * blk);
  for (int64_t k = 0; k < p; ++k) {
    const float* w = wb + k * 64;
    const v16 w0 = load16(w), w1 = load16(w + 16), w2 = load16(w + 32), w3 = load16(w + 48);
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) {
      const float hk = hr[r * p + k];
      a[r][0] = fma16(hk, w0, a[r][0]);
      a[r][1] = fma16(hk, w1, a[r][1]);
      a[r][2] = fma16(hk, w2, a[r][2]);
      a[r][3] = fma16(hk, w3, a[r][3]);
    }
  }
  float m[R][16];
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r) {
    float gi[16], gf[16], go[16], gj[16];
    store16(gi, a[r][0]);
    store16(gf, a[r][1]);
    store16(go, a[r][2]);
    store16(gj, a[r][3]);
    float* c = cr + r * hd + 16 * blk;
#pragma omp simd
    for (int u = 0; u < 16; ++u) {
      const float ij = sigmoid(gi[u]) * tanh_sat(gj[u]);  // σ(i)·tanh(j), then σ(f)·c added with one rounding
      float cv = __builtin_fmaf(sigmoid(gf[u]), c[u], ij);
      if (cclip > 0) cv = fminf(fmaxf(cv, -cclip), cclip);
      c[u] = cv;
      m[r][u] = sigmoid(go[u]) * tanh_sat(cv);
    }
  }
  const float* wblk = wpr + (16 * blk) * p;
  int64_t j0 = 0;
  for (; j0 + 32 <= p; j0 += 32) {  // two output vectors per row at a time: 2R accumulators
    v16 acc[R][2];
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) {
      acc[r][0] = load16(pr + r * p + j0);
      acc[r][1] = load16(pr + r * p + j0 + 16);
    }
#pragma GCC unroll 16
    for (int u = 0; u < 16; ++u) {
      const v16 w0 = load16(wblk + u * p + j0), w1 = load16(wblk + u * p + j0 + 16);
#pragma GCC unroll 4
      for (int r = 0; r < R; ++r) {
        acc[r][0] = fma16(m[r][u], w0, acc[r][0]);
        acc[r][1] = fma16(m[r][u], w1, acc[r][1]);
      }
    }
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) {
      store16(pr + r * p + j0, acc[r][0]);
      store16(pr + r * p + j0 + 16, acc[r][1]);
    }
  }
  if (j0 < p) {  // P = 16 (mod 32): the last output vector
    v16 acc[R];
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) acc[r] = load16(pr + r * p + j0);
#pragma GCC unroll 16
    for (int u = 0; u < 16; ++u) {
      const v16 w0 = load16(wblk + u * p + j0);
#pragma GCC unroll 4
      for (int r = 0; r < R; ++r) acc[r] = fma16(m[r][u], w0, acc[r]);
    }
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) store16(pr + r * p + j0, acc[r]);
  }
}

// ---- batch-invariant products (used where batch independence must be bitwise; see elmokit/modules/invariant.py)
//
// Every output element x[r]·W[:, j] + b[j] is summed in one fixed order whatever the number of rows, their order,
// the thread count or the task a thread takes: b first, then the inputs in chunks of kChunk (each chunk's products
// summed in k order into a fresh accumulator with one FMA each, then added to the running total). Rows are computed
// in panels of kPanel rows by one template instantiation only (a short last panel is padded with zero rows), so no
// row ever takes another code path: a sentence's vectors are the same bits alone or in any batch.
constexpr int kPanel = 12;  // 12 rows × 2 vectors = 24 accumulators of AVX-512's 32 registers

// x (M, K) row-major → panels (ceil(M / kPanel), K, kPanel): one input's 12 rows side by side, zero rows appended.
at::Tensor pack_panels(const at::Tensor& x) {
  const int64_t m = x.size(0), k = x.size(1), np = (m + kPanel - 1) / kPanel;
  at::Tensor xp = at::zeros({np * kPanel, k}, x.options());
  xp.narrow(0, 0, m).copy_(x);
  return xp.view({np, kPanel, k}).transpose(1, 2).contiguous();  // (np, K, kPanel)
}

// One panel × one column block (32 columns), inputs k0 … k1 − 1 (one chunk): their products summed in k order into
// fresh accumulators, then added to the panel's running totals (kPanel, 32).
inline void panel_chunk(const float* xp, const float* wb, float* total, int64_t k0, int64_t k1) {
  v16 a[kPanel], g[kPanel];
#pragma GCC unroll 12
  for (int r = 0; r < kPanel; ++r) {
    a[r] = v16{};
    g[r] = v16{};
  }
  for (int64_t kk = k0; kk < k1; ++kk) {
    const v16 wa = load16(wb + kk * 32);
    const v16 wg = load16(wb + kk * 32 + 16);
    const float* xk = xp + kk * kPanel;
#pragma GCC unroll 12
    for (int r = 0; r < kPanel; ++r) {
      a[r] = fma16(xk[r], wa, a[r]);
      g[r] = fma16(xk[r], wg, g[r]);
    }
  }
#pragma GCC unroll 12
  for (int r = 0; r < kPanel; ++r) {
    store16(total + r * 32, load16(total + r * 32) + a[r]);
    store16(total + r * 32 + 16, load16(total + r * 32 + 16) + g[r]);
  }
}

// Shared driver: tasks = (column block, group of kGroup panels), any order, any thread. Per task the totals start at
// the bias, then each chunk of kChunk inputs (its 32 KB of weights kept in L1) is added for every panel of the group
// in turn; epilogue(panel, block, totals) last. Every value: b + chunk sums in chunk order, whatever the task split.
constexpr int64_t kGroup = 8;  // panels per task (96 rows)
constexpr int64_t kInvChunk = 128;  // inputs per chunk: 16 KB of weights and 6 KB of a panel in L1

template <class Epilogue>
void panels_by_blocks(const at::Tensor& xp, const at::Tensor& packed, const at::Tensor& packed_bias,
                      Epilogue&& epilogue) {
  const int64_t np = xp.size(0), k = xp.size(1), nb = packed.size(0);
  const int64_t ng = (np + kGroup - 1) / kGroup;
  const float* xpp = xp.data_ptr<float>();
  const float* wp = packed.data_ptr<float>();
  const float* bp = packed_bias.data_ptr<float>();
  at::parallel_for(0, nb * ng, 1, [&](int64_t t0, int64_t t1) {
    std::vector<float> totals(static_cast<size_t>(kGroup * kPanel * 32));
    for (int64_t task = t0; task < t1; ++task) {
      const int64_t blk = task % nb, grp = task / nb;
      const int64_t p0 = grp * kGroup, p1 = (grp + 1) * kGroup < np ? (grp + 1) * kGroup : np;
      const float* wb = wp + blk * k * 32;
      for (int64_t r = 0; r < (p1 - p0) * kPanel; ++r)
        std::memcpy(totals.data() + r * 32, bp + blk * 32, sizeof(float) * 32);
      for (int64_t k0 = 0; k0 < k; k0 += kInvChunk) {
        const int64_t k1 = k0 + kInvChunk < k ? k0 + kInvChunk : k;
        for (int64_t pn = p0; pn < p1; ++pn)
          panel_chunk(xpp + pn * k * kPanel, wb, totals.data() + (pn - p0) * kPanel * 32, k0, k1);
      }
      for (int64_t pn = p0; pn < p1; ++pn) epilogue(pn, blk, totals.data() + (pn - p0) * kPanel * 32);
    }
  });
}

}  // namespace

// One direction's steps (the loop of elmokit.modules.lstm_steps._direction_steps) with the recurrent product, the gate
// math and the projection fused, for W_hh packed by unit blocks: w_packed (H/16, P, 64), block b and input k holding the i, f, o, j columns of units 16b … 16b + 15 (16 each); needs
// H and P multiples of 16. One OpenMP team (torch's threads) runs the whole loop: each thread owns a range of unit
// blocks (its share of W_hh and of W_proj's rows stays in its core's L2 across the steps), computes their gates and
// cell state, and a partial projection over its units; after one barrier per step every thread sums the partials
// into the next h (the partial buffers alternate between even and odd steps, so one barrier suffices).
static void direction_steps_fused(const at::Tensor& xw, const std::vector<int64_t>& sizes, const at::Tensor& c,
                           const at::Tensor& h, const at::Tensor& w_packed, const at::Tensor& w_proj,
                           double cell_clip, double proj_clip, at::Tensor out, at::Tensor final_c,
                           at::Tensor final_h) {
  const int64_t b = c.size(0), hd = c.size(1), p = h.size(1);
  const int64_t nb = hd / 16;
  const int64_t n0 = sizes.empty() ? 0 : sizes[0];
  if (n0 < b) {  // rows with no step keep their start state
    final_c.narrow(0, n0, b - n0).copy_(c.narrow(0, n0, b - n0));
    final_h.narrow(0, n0, b - n0).copy_(h.narrow(0, n0, b - n0));
  }
  if (n0 == 0) return;
  // Rows run in groups of 4, 2 and 1 (unit_block_rows<R>); every form does each row's operations in the same order
  // with explicit FMAs (fma16), so a row's bits do not depend on its position among the step's rows.
  at::Tensor c_run = c.narrow(0, 0, n0).contiguous().clone();  // (n0, H), each unit updated in place by its owner
  at::Tensor h0 = h.narrow(0, 0, n0).contiguous();
  const int max_threads = static_cast<int>(at::get_num_threads());  // torch.set_num_threads, in any thread (a new
  // thread's omp_get_max_threads() is the process default, not what torch was told)
  // The projection's partial sums are kept per slice of unit blocks, a partition fixed by H alone (kSlices
  // slices), never by the thread count: a thread owns whole slices, and h sums the slices' partials in slice order,
  // so one thread and several give the same bits (a partition by threads made --workers 2 × 1 thread differ from one
  // process with 2 threads).
  const int64_t ns = nb < kSlices ? nb : kSlices;
  std::vector<float> partial(static_cast<size_t>(2 * ns * n0 * p));
  const float* xwp = xw.data_ptr<float>();
  const float* wpk = w_packed.data_ptr<float>();
  const float* wpr = w_proj.data_ptr<float>();
  const float* h0p = h0.data_ptr<float>();
  float* outp = out.data_ptr<float>();
  float* cp = c_run.data_ptr<float>();
  float* fcp = final_c.data_ptr<float>();
  float* fhp = final_h.data_ptr<float>();
  const int64_t fc_stride = final_c.stride(0), fh_stride = final_h.stride(0);
  const float cclip = static_cast<float>(cell_clip), pclip = static_cast<float>(proj_clip);
  const int64_t g4 = 4 * hd;
#pragma omp parallel num_threads(max_threads)
  {
    const int nt = omp_get_num_threads(), t = omp_get_thread_num();
    const int64_t s0 = ns * t / nt, s1 = ns * (t + 1) / nt;  // this thread's slices
    const int64_t u0 = 16 * (nb * s0 / ns), u1 = 16 * (nb * s1 / ns);
    std::vector<float> hloc(h0p, h0p + n0 * p);  // this thread's copy of h (the same on every thread)
    int64_t offset = 0, n_prev = n0;
    for (size_t s = 0; s < sizes.size(); ++s) {
      const int64_t n = sizes[s];
      if (n < n_prev) {  // rows n … n_prev − 1 ended at the previous step
        for (int64_t r = n; r < n_prev; ++r) {
          std::memcpy(fcp + r * fc_stride + u0, cp + r * hd + u0, sizeof(float) * (u1 - u0));
          if (t == 0) std::memcpy(fhp + r * fh_stride, hloc.data() + r * p, sizeof(float) * p);
        }
        n_prev = n;
      }
      for (int64_t i = s0; i < s1; ++i) {
        // snake order over the slices: up on even steps, down on odd ones. Visited in one direction at every step,
        // a share larger than L2 misses on every block (each evicted before its next use); turned back, a step
        // starts with the blocks last read (python bench/lstm_rows.py, small shape, one thread: kernel / GEMM loop
        // 1.23 -> 1.73 at 1 row, 1.07 -> 1.18 at 16). Within a slice the blocks always go up (fixed sums).
        const int64_t sl = (s & 1) ? s1 - 1 - (i - s0) : i;
        float* part = partial.data() + ((s & 1) * ns + sl) * n0 * p;
        std::memset(part, 0, sizeof(float) * n * p);
        for (int64_t blk = nb * sl / ns; blk < nb * (sl + 1) / ns; ++blk) {
          const float* wb = wpk + blk * p * 64;
          int64_t r = 0;
          if constexpr (kRowGroup >= 4) {
            for (; r + 4 <= n; r += 4)
              unit_block_rows<4>(xwp + (offset + r) * g4, hloc.data() + r * p, wb, wpr, cp + r * hd, part + r * p,
                                 blk, hd, p, cclip);
            for (; r + 2 <= n; r += 2)
              unit_block_rows<2>(xwp + (offset + r) * g4, hloc.data() + r * p, wb, wpr, cp + r * hd, part + r * p,
                                 blk, hd, p, cclip);
          }
          for (; r < n; ++r)
            unit_block_rows<1>(xwp + (offset + r) * g4, hloc.data() + r * p, wb, wpr, cp + r * hd, part + r * p, blk,
                               hd, p, cclip);
        }
      }
#pragma omp barrier
      const float* parts = partial.data() + (s & 1) * ns * n0 * p;
      for (int64_t r = 0; r < n; ++r) {
        float* hr = hloc.data() + r * p;
        std::memcpy(hr, parts + r * p, sizeof(float) * p);
        for (int64_t sl = 1; sl < ns; ++sl) {
          const float* pr = parts + sl * n0 * p + r * p;
#pragma omp simd
          for (int64_t j = 0; j < p; ++j) hr[j] += pr[j];
        }
        if (pclip > 0) {
#pragma omp simd
          for (int64_t j = 0; j < p; ++j) hr[j] = fminf(fmaxf(hr[j], -pclip), pclip);
        }
        if (t == 0) std::memcpy(outp + (offset + r) * p, hr, sizeof(float) * p);
      }
      offset += n;
    }
    for (int64_t r = 0; r < n_prev; ++r) {
      std::memcpy(fcp + r * fc_stride + u0, cp + r * hd + u0, sizeof(float) * (u1 - u0));
      if (t == 0) std::memcpy(fhp + r * fh_stride, hloc.data() + r * p, sizeof(float) * p);
    }
  }
}

// Both directions of one layer: x (2, N, P), sizes (running rows per step, all > 0), c (2, B, H), h (2, B, P),
// w_ih (2, P, 4H), bias (2, 4H) (gate columns i, f, o, j; each direction's slice contiguous), w_hh (2, H/16, P, 64)
// from native.pack_lstm, w_proj (2, H, P), all float32 → (out (2, N, P), final c (2, B, H), final h (2, B, P)); as elmokit.modules.lstm_steps._steps_by_direction;
// nothing (an empty list) when x, c or h hold inf or NaN.
std::vector<at::Tensor> lstm_layer(const at::Tensor& x, const std::vector<int64_t>& sizes, const at::Tensor& c,
                                   const at::Tensor& h, const at::Tensor& w_ih, const at::Tensor& bias,
                                   const at::Tensor& w_hh, const at::Tensor& w_proj, double cell_clip,
                                   double proj_clip) {
  TORCH_CHECK(x.scalar_type() == at::kFloat && x.dim() == 3 && x.size(0) == 2, "lstm_layer: x must be (2, N, P) float32");
  TORCH_CHECK(w_hh.dim() == 4 && w_hh.size(3) == 64 && w_hh.size(1) * 16 == c.size(2) && h.size(2) % 16 == 0,
              "lstm_layer: w_hh must be packed by native.pack_lstm (H and P multiples of 16)");
  // Before any ATen op: torch's thread count into this thread's OpenMP and MKL settings. A thread that is not the
  // main one (the server's inference loops) starts with the process defaults (the core count) until torch's first
  // parallel op there sets them; a GEMM run before that (the input product below, MKL or oneDNN) started an OpenMP
  // team of that size from such a thread after torch.set_num_threads(1) on AMD EPYC machines.
  at::get_num_threads();
  if (!all_finite(x) || !all_finite(c) || !all_finite(h)) return {};  // inf or NaN: the caller's ATen path
  at::Tensor out = at::empty({2, x.size(1), w_proj.size(2)}, x.options());
  at::Tensor final_c = at::empty_like(c);
  at::Tensor final_h = at::empty_like(h);
  for (int64_t d = 0; d < 2; ++d) {
    at::Tensor xw = at::addmm(bias[d], x[d], w_ih[d]);  // (N, 4H): every step's input contribution in one GEMM
    direction_steps_fused(xw, sizes, c[d].contiguous(), h[d].contiguous(), w_hh[d], w_proj[d], cell_clip,
                          proj_clip, out[d], final_c[d], final_h[d]);
  }
  return {out, final_c, final_h};
}

// One highway layer for M ≤ 12 rows: x (M, F) float32 contiguous, packed (F/16, F, 32) and packed_bias (F/16, 32)
// as native.pack_highway → (M, F) = t·relu(x·W_h + b_h) + (1 − t)·x, t = σ(x·W_g + b_g); an undefined tensor (None
// in Python) when x holds inf or NaN.
at::Tensor highway_layer(const at::Tensor& x, const at::Tensor& packed, const at::Tensor& packed_bias) {
  TORCH_CHECK(x.scalar_type() == at::kFloat && x.dim() == 2 && x.is_contiguous(), "highway_layer: x must be (M, F) float32");
  const int64_t m = x.size(0), f = x.size(1);
  TORCH_CHECK(m >= 1 && m <= 12, "highway_layer: 1 to 12 rows, got ", m);
  TORCH_CHECK(f % 16 == 0 && packed.size(0) == f / 16 && packed.size(1) == f && packed.size(2) == 32,
              "highway_layer: packed weight does not match F = ", f);
  at::get_num_threads();  // torch's thread count into this thread's OpenMP settings first, as in lstm_layer
  if (!all_finite(x)) return at::Tensor();  // inf or NaN: the caller's ATen path
  at::Tensor xt = x.t().contiguous();  // (F, M): one input's M values side by side
  at::Tensor y = at::empty_like(x);
  const float* xtp = xt.data_ptr<float>();
  const float* xp = x.data_ptr<float>();
  const float* wp = packed.data_ptr<float>();
  const float* bp = packed_bias.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  switch (m) {
    case 1: highway_rows<1>(xtp, xp, wp, bp, yp, f); break;
    case 2: highway_rows<2>(xtp, xp, wp, bp, yp, f); break;
    case 3: highway_rows<3>(xtp, xp, wp, bp, yp, f); break;
    case 4: highway_rows<4>(xtp, xp, wp, bp, yp, f); break;
    case 5: highway_rows<5>(xtp, xp, wp, bp, yp, f); break;
    case 6: highway_rows<6>(xtp, xp, wp, bp, yp, f); break;
    case 7: highway_rows<7>(xtp, xp, wp, bp, yp, f); break;
    case 8: highway_rows<8>(xtp, xp, wp, bp, yp, f); break;
    case 9: highway_rows<9>(xtp, xp, wp, bp, yp, f); break;
    case 10: highway_rows<10>(xtp, xp, wp, bp, yp, f); break;
    case 11: highway_rows<11>(xtp, xp, wp, bp, yp, f); break;
    default: highway_rows<12>(xtp, xp, wp, bp, yp, f); break;
  }
  return y;
}

// The batch-invariant product: x (M, K) float32, packed (NB, K, 32) and packed_bias (NB, 32) from
// native.pack_linear → (M, 32·NB) = x·W + b in the packed column order (each value summed in the one fixed order
// above, whatever M, the rows' order or the thread count); an undefined tensor when x holds inf or NaN.
at::Tensor linear_rows(const at::Tensor& x, const at::Tensor& packed, const at::Tensor& packed_bias) {
  TORCH_CHECK(x.scalar_type() == at::kFloat && x.dim() == 2, "linear_rows: x must be (M, K) float32");
  const int64_t m = x.size(0), k = x.size(1), nb = packed.size(0);
  TORCH_CHECK(packed.dim() == 3 && packed.size(1) == k && packed.size(2) == 32 && packed.is_contiguous() &&
                  packed_bias.dim() == 2 && packed_bias.size(0) == nb && packed_bias.size(1) == 32 &&
                  packed_bias.is_contiguous(),
              "linear_rows: packed weight (NB, K, 32) and bias (NB, 32) as native.pack_linear, K = ", k);
  at::get_num_threads();  // torch's thread count into this thread's OpenMP settings first, as in lstm_layer
  at::Tensor y = at::empty({m, nb * 32}, x.options());
  if (m == 0) return y;
  const at::Tensor xc = x.contiguous();
  if (!all_finite(xc)) return at::Tensor();
  const at::Tensor xp = pack_panels(xc);
  float* yp = y.data_ptr<float>();
  const int64_t n = nb * 32;
  panels_by_blocks(xp, packed, packed_bias, [&](int64_t pn, int64_t blk, const float* total) {
    const int64_t r0 = pn * kPanel, r1 = r0 + kPanel < m ? r0 + kPanel : m;
    for (int64_t r = r0; r < r1; ++r) std::memcpy(yp + r * n + blk * 32, total + (r - r0) * 32, sizeof(float) * 32);
  });
  return y;
}

// One highway layer for any number of rows, batch-invariant (each row as linear_rows computes it, then the
// carry/transform combination per element): x (M, F), packed (F/16, F, 32), packed_bias (F/16, 32) from
// native.pack_highway → (M, F); an undefined tensor when x holds inf or NaN.
at::Tensor highway_rows_invariant(const at::Tensor& x, const at::Tensor& packed, const at::Tensor& packed_bias) {
  TORCH_CHECK(x.scalar_type() == at::kFloat && x.dim() == 2, "highway_rows_invariant: x must be (M, F) float32");
  const int64_t m = x.size(0), f = x.size(1);
  TORCH_CHECK(f % 16 == 0 && packed.size(0) == f / 16 && packed.size(1) == f && packed.size(2) == 32,
              "highway_rows_invariant: packed weight does not match F = ", f);
  at::get_num_threads();
  at::Tensor y = at::empty_like(x);
  if (m == 0) return y;
  const at::Tensor xc = x.contiguous();
  if (!all_finite(xc)) return at::Tensor();
  const at::Tensor xp = pack_panels(xc);
  const float* xr0 = xc.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  panels_by_blocks(xp, packed, packed_bias, [&](int64_t pn, int64_t blk, const float* total) {
    const int64_t r0 = pn * kPanel, r1 = r0 + kPanel < m ? r0 + kPanel : m;
    for (int64_t r = r0; r < r1; ++r) {
      const float* tr = total + (r - r0) * 32;
      const float* xr = xr0 + r * f + blk * 16;
      float* yr = yp + r * f + blk * 16;
#pragma omp simd
      for (int u = 0; u < 16; ++u) {
        const float t = sigmoid(tr[16 + u]);
        const float hv = fmaxf(tr[u], 0.0f);
        yr[u] = __builtin_fmaf(t, hv - xr[u], xr[u]);  // t·relu(transform) + (1 − t)·x
      }
    }
  });
  return y;
}

// One LSTM layer from its input contributions, batch-invariant: xw (2, N, 4H) = x·W_ih + b (gate columns i, f, o, j,
// from linear_rows), the rest as lstm_layer. Each row's recurrent product, gates and projection are computed in the
// one order direction_steps_fused fixes (any row count, any thread count).
std::vector<at::Tensor> lstm_layer_xw(const at::Tensor& xw, const std::vector<int64_t>& sizes, const at::Tensor& c,
                                      const at::Tensor& h, const at::Tensor& w_hh, const at::Tensor& w_proj,
                                      double cell_clip, double proj_clip) {
  TORCH_CHECK(xw.scalar_type() == at::kFloat && xw.dim() == 3 && xw.size(0) == 2 && xw.size(2) == 4 * c.size(2),
              "lstm_layer_xw: xw must be (2, N, 4H) float32");
  TORCH_CHECK(w_hh.dim() == 4 && w_hh.size(3) == 64 && w_hh.size(1) * 16 == c.size(2) && h.size(2) % 16 == 0,
              "lstm_layer_xw: w_hh must be packed by native.pack_lstm (H and P multiples of 16)");
  at::get_num_threads();
  if (!all_finite(xw) || !all_finite(c) || !all_finite(h)) return {};
  at::Tensor out = at::empty({2, xw.size(1), w_proj.size(2)}, xw.options());
  at::Tensor final_c = at::empty_like(c);
  at::Tensor final_h = at::empty_like(h);
  for (int64_t d = 0; d < 2; ++d)
    direction_steps_fused(xw[d].contiguous(), sizes, c[d].contiguous(), h[d].contiguous(), w_hh[d], w_proj[d],
                          cell_clip, proj_clip, out[d], final_c[d], final_h[d]);
  return {out, final_c, final_h};
}

// The kernels touch tensors only (their arguments are converted before the call), so they run without the GIL:
// the server's HTTP threads and other Python threads go on while a pass computes, as they do during torch's own ops.
PYBIND11_MODULE(TORCH_EXTENSION_NAME, module) {
  // the most rows lstm_layer is worth using for (native.lstm_rows_limit): 32 with row groups, 8 without
  module.attr("max_rows") = kRowGroup >= 4 ? 32 : 8;
  module.def("lstm_layer", &lstm_layer, "one LSTM layer, both directions, without autograd",
             pybind11::call_guard<pybind11::gil_scoped_release>());
  module.def("highway_layer", &highway_layer, "one highway layer for at most 12 rows",
             pybind11::call_guard<pybind11::gil_scoped_release>());
  module.def("linear_rows", &linear_rows, "x·W + b, each row in one fixed order (batch-invariant)",
             pybind11::call_guard<pybind11::gil_scoped_release>());
  module.def("highway_rows_invariant", &highway_rows_invariant, "one highway layer, any rows, batch-invariant",
             pybind11::call_guard<pybind11::gil_scoped_release>());
  module.def("lstm_layer_xw", &lstm_layer_xw, "one LSTM layer from x·W_ih + b, batch-invariant",
             pybind11::call_guard<pybind11::gil_scoped_release>());
}
