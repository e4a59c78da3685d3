// elmokit's fused LSTM-with-projection layer for TRAINING (used by elmokit/modules/lstm_train.py; compiled into the
// same extension as native_kernels.cpp by elmokit/modules/native.py, registered as torch.ops.elmokit_train.*).
//
// One layer, both directions, on the packed time-major layout of elmokit.modules.lstm (step s = the next sizes[s]
// rows, rows sorted by length). The cell (TensorFlow LSTMCell with num_proj, gate order i, j, f, o, forget bias
// folded into `bias`):
//     z = xw + bias + h_{t-1}·W_hh;  i, f, o = σ(z_i, z_f, z_o), j = tanh(z_j)
//     c_raw = f·c_{t-1} + i·j;  c = clip(c_raw, ±cell_clip);  m = o·tanh(c)
//     h_raw = m·W_proj;  h = clip(h_raw, ±proj_clip)
// The products are ATen GEMMs into preallocated buffers (at::bmm_out, both directions in one call; in bfloat16 one
// at::mm_out per direction where the step's operand is wide, see step_product): float32, or bfloat16 with float32
// accumulation through oneDNN where the weights come in bfloat16. Everything between two products is ONE vectorised
// pass over the step's rows (float32 gate math, whatever the product dtype T).
// The forward saves the activated gates, c_raw, m and h_raw; the backward runs the reverse time loop the same way
// (per step: the mask of the projection clip, one GEMM to dm, one fused pass to dz and dc_{t-1}, one GEMM to
// dh_{t-1}) and then the weight gradients ONCE per layer as two large GEMMs over all steps (dW_hh = Σ h_{t-1}ᵀ·dz,
// dW_proj = Σ mᵀ·dh_raw), the bias's Σ dz summed in the fused pass (float32, per thread). A clip passes the gradient
// where |x| ≤ clip (as torch.clamp's backward) and zeroes it elsewhere.
//
// Built with -ffast-math (expf/tanhf vectorise), which assumes finite values: the forward reports a non-finite
// pre-activation (read from the bits) by returning nothing, and the caller then runs the torch-op path.
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <cfloat>
#include <cmath>
#include <cstdint>
#include <algorithm>
#include <atomic>
#include <cstring>
#include <vector>

#include "native_bf16.h"

namespace {

inline float sig(float x) {
  x = fminf(fmaxf(x, -88.0f), 88.0f);
  return 1.0f / (1.0f + expf(-x));
}

// tanh from exp (1 − 2/(e^{2x} + 1)): glibc's vector expf is native AVX-512/AVX2 code, while its vector tanhf called
// the scalar tanhf lane by lane here (perf: __tanhf, __expm1f); within 1e-7 absolute of tanhf
inline float tanh_sat(float x) {
  x = fminf(fmaxf(x, -10.0f), 10.0f);
  return 1.0f - 2.0f / (expf(2.0f * x) + 1.0f);
}

inline uint32_t bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

// load/store of the product dtype (native_bf16.h)
using elmokit_native::ld;
using elmokit_native::st;

inline float clip(float x, float c) { return c > 0 ? fminf(fmaxf(x, -c), c) : x; }

// One (direction, row) of a forward step: the gates from z = xw + bias + rec, the cell update and its clip, m; the
// activated gates and c_raw saved. Returns whether a pre-activation was inf or NaN. A function of its own (not
// inlined into the step loop), so that the compiler vectorises it with the vector exp and tanh of glibc's libmvec
// (inlined into at::parallel_for's one-thread path it called the scalar ones).
template <typename T>
__attribute__((noinline)) uint32_t forward_row(const T* __restrict x, const T* __restrict rc, const float* __restrict b,
                                               const float* __restrict cp, bool cp_raw, float* __restrict g,
                                               float* __restrict cr, T* __restrict mo, int64_t H, float cc) {
  // the clips as bounds (FLT_MAX: none), loop-invariant: a select between clipped and unclipped loads per element
  // kept GCC from vectorising the loop (scalar expf)
  const float cpc = cp_raw && cc > 0 ? cc : FLT_MAX, ccl = cc > 0 ? cc : FLT_MAX;
  uint32_t nonfinite = 0;
#pragma omp simd reduction(| : nonfinite)
  for (int64_t k = 0; k < H; ++k) {
    const float zi = ld(x, k) + b[k] + ld(rc, k);
    const float zj = ld(x, H + k) + b[H + k] + ld(rc, H + k);
    const float zf = ld(x, 2 * H + k) + b[2 * H + k] + ld(rc, 2 * H + k);
    const float zo = ld(x, 3 * H + k) + b[3 * H + k] + ld(rc, 3 * H + k);
    nonfinite |= ((bits(zi) & 0x7f800000u) == 0x7f800000u) | ((bits(zj) & 0x7f800000u) == 0x7f800000u) |
                 ((bits(zf) & 0x7f800000u) == 0x7f800000u) | ((bits(zo) & 0x7f800000u) == 0x7f800000u);
    const float i = sig(zi), j = tanh_sat(zj), f = sig(zf), o = sig(zo);
    const float cprev = fminf(fmaxf(cp[k], -cpc), cpc);
    const float c_raw = f * cprev + i * j;
    cr[k] = c_raw;
    g[k] = i;
    g[H + k] = j;
    g[2 * H + k] = f;
    g[3 * H + k] = o;
    st(mo, k, o * tanh_sat(fminf(fmaxf(c_raw, -ccl), ccl)));
  }
  return nonfinite;
}

// One (direction, row) of a backward step: dm = dh_raw·W_projᵀ and the carried dc → the gate gradients dz (in T, the
// dtype of the products that read them) and dc_{t-1} (in place over the carry); dz in float32 is added into `acc`,
// this thread's (4H) sum for the bias's gradient. Not inlined, as forward_row.
template <typename T>
__attribute__((noinline)) void backward_row(const float* __restrict g, const float* __restrict cr,
                                            const float* __restrict cp, bool cp_raw, const T* __restrict dm,
                                            float* __restrict dc, T* __restrict dz, float* __restrict acc, int64_t H,
                                            float cc) {
  const float cpc = cp_raw && cc > 0 ? cc : FLT_MAX, ccl = cc > 0 ? cc : FLT_MAX;  // as forward_row
#pragma omp simd
  for (int64_t k = 0; k < H; ++k) {
    const float i = g[k], j = g[H + k], f = g[2 * H + k], o = g[3 * H + k];
    const float c_raw = cr[k];
    const float tc = tanh_sat(fminf(fmaxf(c_raw, -ccl), ccl));
    const float dmk = ld(dm, k);
    const float dct = dc[k] + dmk * o * (1.0f - tc * tc);
    const float dcraw = fabsf(c_raw) <= ccl ? dct : 0.0f;
    const float cprev = fminf(fmaxf(cp[k], -cpc), cpc);
    const float dzi = dcraw * j * i * (1.0f - i);
    const float dzj = dcraw * i * (1.0f - j * j);
    const float dzf = dcraw * cprev * f * (1.0f - f);
    const float dzo = dmk * tc * o * (1.0f - o);
    dc[k] = dcraw * f;
    st(dz, k, dzi);
    st(dz, H + k, dzj);
    st(dz, 2 * H + k, dzf);
    st(dz, 3 * H + k, dzo);
    acc[k] += dzi;
    acc[H + k] += dzj;
    acc[2 * H + k] += dzf;
    acc[3 * H + k] += dzo;
  }
}

// One (direction, row) of dh_raw: the output's gradient + the carried one (the next step's recurrent gradient
// `rec`, or the final state's `fh` where the row ends here), zero where the projection clip was active.
template <typename T>
__attribute__((noinline)) void dh_row(const float* __restrict dout, const T* __restrict rec, const float* __restrict fh,
                                      const T* __restrict hraw, T* __restrict dhraw, int64_t P, float pc) {
  if (rec != nullptr) {
#pragma omp simd
    for (int64_t k = 0; k < P; ++k) {
      const float g = dout[k] + ld(rec, k);
      st(dhraw, k, (!(pc > 0) || fabsf(ld(hraw, k)) <= pc) ? g : 0.0f);
    }
  } else {
#pragma omp simd
    for (int64_t k = 0; k < P; ++k) {
      const float g = dout[k] + fh[k];
      st(dhraw, k, (!(pc > 0) || fabsf(ld(hraw, k)) <= pc) ? g : 0.0f);
    }
  }
}

// rows of one per-step product: n for float32; for bfloat16, n rounded up to a multiple of 16 within `limit` rows of
// the operands. oneDNN (torch's bfloat16 GEMM) JIT-compiles a kernel for every new row count, about 2 ms each (issue
// 40: the first 8 steps of the zoo recipe's bf16 run took 0.92 s each against 0.65 s for the same 8 batches again);
// 16-row multiples leave at most 8 shapes a product at 128 sentences, and AMX tiles are 16 rows, so the extra rows
// cost little. Each output row depends only on its own input row: the rows past n hold garbage that nothing reads.
inline int64_t gemm_rows(int64_t n, int64_t limit, bool bf16) {
  return bf16 ? std::min(limit, (n + 15) / 16 * 16) : n;
}

// out[d] = a[d]·b[d] for both directions, a and out a step's rows of (2, N, X) or (2, B, X) buffers: one batched
// product, except in bfloat16 when a is wide (≥ 1,024 columns: m at H ≥ 1,024, dz at 4H ≥ 1,024), then one
// product per direction on the 2-D blocks. oneDNN's batched matmul copies an operand whose batch stride is not
// rows × columns (a step's rows of a (2, N, X) buffer) to a contiguous tensor first; two calls cost a second call's
// overhead instead.
// Measured (2 threads, rows at an offset of (2, N, K) buffers, ms a call, batched / per direction): (128, 4096)·
// (4096, 128) 0.72 / 0.61, (128, 1024)·(1024, 128) 0.20 / 0.13, (32, 2048)·(2048, 128) 0.171 / 0.167; narrower a
// favours the one call: (32, 512)·(512, 128) 0.050 / 0.085, (128, 128)·(128, 4096) 0.61 / 0.66. float32 (oneMKL
// reads the batch stride): always one call.
inline void step_product(at::Tensor out, const at::Tensor& a, const at::Tensor& b, bool bf16) {
  if (!bf16 || a.size(2) < 1024) {
    at::bmm_out(out, a, b);
    return;
  }
  for (int64_t d = 0; d < 2; ++d) {
    at::Tensor o = out.select(0, d);
    at::mm_out(o, a.select(0, d), b.select(0, d));
  }
}

// rows of one step: 2·n (direction, row) pairs split over torch's threads
template <typename F>
void for_rows(int64_t n, int64_t width, const F& body) {
  const int64_t grain = width >= 1024 ? 2 : 8;
  at::parallel_for(0, 2 * n, grain, [&](int64_t a, int64_t b) {
    for (int64_t q = a; q < b; ++q) body(q / n, q % n);
  });
}

template <typename T>
std::vector<at::Tensor> forward_impl(const at::Tensor& xw, const at::Tensor& bias, const at::Tensor& c0,
                                     const at::Tensor& h0, const at::Tensor& w_hh, const at::Tensor& w_proj,
                                     c10::IntArrayRef sizes, float cc, float pc) {
  const int64_t N = xw.size(1), G = xw.size(2), H = G / 4, B = c0.size(1), P = w_proj.size(2), S = sizes.size();
  const auto f32 = xw.options().dtype(at::kFloat);
  const auto tg = w_hh.options();
  at::Tensor gates = at::empty({2, N, G}, f32);
  at::Tensor craw = at::empty({2, N, H}, f32);
  at::Tensor m = at::empty({2, N, H}, tg);
  at::Tensor hraw = at::empty({2, N, P}, tg);
  at::Tensor out = pc > 0 ? at::empty({2, N, P}, tg) : hraw;
  at::Tensor rec = at::empty({2, B, G}, tg);
  at::Tensor h0g = h0.to(w_hh.scalar_type()).contiguous();
  at::Tensor final_c = c0.clone();
  at::Tensor final_h = h0.clone();
  const bool bf = w_hh.scalar_type() == at::kBFloat16;
  const T* xwp = xw.data_ptr<T>();
  const float* bp = bias.data_ptr<float>();
  const float* c0p = c0.data_ptr<float>();
  float* gp = gates.data_ptr<float>();
  float* crp = craw.data_ptr<float>();
  T* mp = m.data_ptr<T>();
  T* recp = rec.data_ptr<T>();
  T* hrp = hraw.data_ptr<T>();
  T* outp = out.data_ptr<T>();
  std::vector<int> bad(2 * B + 1, 0);
  // N may exceed the positions (the input product run on gemm_rows rows in bfloat16): the rows past them are never
  // computed; m's are zeroed, as the backward's dW_proj sums over all N rows
  int64_t positions = 0;
  for (int64_t s = 0; s < S; ++s) positions += sizes[s];
  if (positions < N) m.narrow(1, positions, N - positions).zero_();
  int64_t off = 0, off_prev = 0;
  for (int64_t s = 0; s < S; ++s) {
    const int64_t n = sizes[s];
    {
      const int64_t nr = gemm_rows(n, s == 0 ? B : std::min(B, N - off_prev), bf);
      step_product(rec.narrow(1, 0, nr), s == 0 ? h0g.narrow(1, 0, nr) : out.narrow(1, off_prev, nr), w_hh, bf);
    }
    for_rows(n, G, [&](int64_t d, int64_t r) {
      const float* cp = s == 0 ? c0p + (d * B + r) * H : crp + (d * N + off_prev + r) * H;
      const int64_t row = d * N + off + r;
      if (forward_row<T>(xwp + row * G, recp + (d * B + r) * G, bp + d * G, cp, s != 0, gp + row * G, crp + row * H,
                         mp + row * H, H, cc))
        bad[d * B + r] = 1;
    });
    {  // the rows past n are the next step's, written again there
      const int64_t nr = gemm_rows(n, N - off, bf);
      step_product(hraw.narrow(1, off, nr), m.narrow(1, off, nr), w_proj, bf);
    }
    if (pc > 0) {
      at::parallel_for(0, 2 * n, 16, [&](int64_t a, int64_t b) {
        for (int64_t q = a; q < b; ++q) {
          const int64_t base = ((q / n) * N + off + q % n) * P;
          for (int64_t k = 0; k < P; ++k) st(outp + base, k, clip(ld(hrp + base, k), pc));
        }
      });
    }
    off_prev = off;
    off += n;
  }
  for (int64_t q = 0; q < 2 * B; ++q) bad[2 * B] |= bad[q];
  if (bad[2 * B]) return {};
  // each row's state after its last step (rows without a step keep the start state cloned above)
  float* fcp = final_c.data_ptr<float>();
  float* fhp = final_h.data_ptr<float>();
  off = 0;
  for (int64_t s = 0; s < S; ++s) {
    const int64_t n = sizes[s], n_next = s + 1 < S ? sizes[s + 1] : 0;
    for (int64_t d = 0; d < 2; ++d)
      for (int64_t r = n_next; r < n; ++r) {
        const float* cr = crp + (d * N + off + r) * H;
        for (int64_t k = 0; k < H; ++k) fcp[(d * B + r) * H + k] = clip(cr[k], cc);
        const T* h = outp + (d * N + off + r) * P;
        for (int64_t k = 0; k < P; ++k) fhp[(d * B + r) * P + k] = ld(h, k);
      }
    off += n;
  }
  return {out, final_c, final_h, gates, craw, m, hraw};
}

// long: the reverse time loop and the once-per-layer weight gradients, its buffers shared across the steps
template <typename T>
std::vector<at::Tensor> backward_impl(const at::Tensor& dout, const at::Tensor& dfc, const at::Tensor& dfh,
                                      const at::Tensor& gates, const at::Tensor& craw, const at::Tensor& m,
                                      const at::Tensor& hraw, const at::Tensor& out, const at::Tensor& c0,
                                      const at::Tensor& h0, const at::Tensor& w_hh, const at::Tensor& w_proj,
                                      c10::IntArrayRef sizes, float cc, float pc) {
  const int64_t N = gates.size(1), G = gates.size(2), H = G / 4, B = c0.size(1), P = w_proj.size(2), S = sizes.size();
  const auto f32 = gates.options();
  const auto tg = w_hh.options();
  at::Tensor dzg = at::empty({2, N, G}, tg);
  // the bias's gradient Σ dz: one (2, 4H) float32 sum per thread, the rows of a thread in order, the threads' sums
  // added in order at the end (deterministic for a thread count, as at::parallel_for splits a range the same way)
  at::Tensor acc = at::zeros({at::get_num_threads(), 2, G}, f32);
  float* accp = acc.data_ptr<float>();
  // the transposed weights of the backward's products, contiguous (once per call)
  const at::Tensor w_hh_t = w_hh.transpose(1, 2).contiguous(), w_proj_t = w_proj.transpose(1, 2).contiguous();
  at::Tensor dhraw = at::empty({2, N, P}, tg);
  at::Tensor dm = at::empty({2, B, H}, tg);
  at::Tensor dhrec = at::empty({2, B, P}, tg);
  at::Tensor dc = dfc.clone();
  const bool bf = w_hh.scalar_type() == at::kBFloat16;
  std::vector<int64_t> offs(S + 1, 0);
  for (int64_t s = 0; s < S; ++s) offs[s + 1] = offs[s] + sizes[s];
  if (offs[S] < N) {  // rows past the positions (see forward_impl): zeros in the weight gradients' sums
    dzg.narrow(1, offs[S], N - offs[S]).zero_();
    dhraw.narrow(1, offs[S], N - offs[S]).zero_();
  }
  const float* doutp = dout.data_ptr<float>();
  const float* dfhp = dfh.data_ptr<float>();
  const float* gp = gates.data_ptr<float>();
  const float* crp = craw.data_ptr<float>();
  const float* c0p = c0.data_ptr<float>();
  const T* hrp = hraw.data_ptr<T>();
  T* dhrp = dhraw.data_ptr<T>();
  T* dmp = dm.data_ptr<T>();
  T* dhrecp = dhrec.data_ptr<T>();
  T* dzgp = dzg.data_ptr<T>();
  float* dcp = dc.data_ptr<float>();
  int64_t n_next = 0;
  for (int64_t s = S - 1; s >= 0; --s) {
    const int64_t n = sizes[s], off = offs[s], off_prev = s > 0 ? offs[s - 1] : 0;
    // dh at this step: the output's gradient + (the next step's recurrent gradient, or the final state's)
    at::parallel_for(0, 2 * n, 16, [&](int64_t a, int64_t b) {
      for (int64_t q = a; q < b; ++q) {
        const int64_t d = q / n, r = q % n, base = (d * N + off + r) * P;
        dh_row<T>(doutp + base, r < n_next ? dhrecp + (d * B + r) * P : nullptr, dfhp + (d * B + r) * P, hrp + base,
                  dhrp + base, P, pc);
      }
    });
    const int64_t nr = gemm_rows(n, std::min(B, N - off), bf);
    step_product(dm.narrow(1, 0, nr), dhraw.narrow(1, off, nr), w_proj_t, bf);
    for_rows(n, G, [&](int64_t d, int64_t r) {
      const int64_t row = d * N + off + r;
      const float* cp = s == 0 ? c0p + (d * B + r) * H : crp + (d * N + off_prev + r) * H;
      backward_row<T>(gp + row * G, crp + row * H, cp, s != 0, dmp + (d * B + r) * H, dcp + (d * B + r) * H,
                      dzgp + row * G, accp + (at::get_thread_num() * 2 + d) * G, H, cc);
    });
    step_product(dhrec.narrow(1, 0, nr), dzg.narrow(1, off, nr), w_hh_t, bf);
    n_next = n;
  }
  at::Tensor dh0 = dfh.clone();
  if (S > 0) dh0.narrow(1, 0, sizes[0]).copy_(dhrec.narrow(1, 0, sizes[0]));
  // the weight gradients once per layer: h_{t-1} of every position stacked (the start state for step 0), written
  // transposed, (2, P, N) contiguous: the product then reads both operands along N in memory order (a transposed
  // view as its first operand ran at half the rate)
  at::Tensor hprev_t = at::empty({2, P, N}, tg);
  if (offs[S] < N) hprev_t.narrow(2, offs[S], N - offs[S]).zero_();
  at::Tensor h0g = h0.to(w_hh.scalar_type()).contiguous();
  const T* h0p = h0g.data_ptr<T>();
  const T* outp = out.data_ptr<T>();
  T* htp = hprev_t.data_ptr<T>();
  at::parallel_for(0, 2 * S, 1, [&](int64_t a, int64_t b) {
    for (int64_t q = a; q < b; ++q) {
      const int64_t d = q / S, s = q % S, n = sizes[s];
      const T* src = s == 0 ? h0p + d * B * P : outp + (d * N + offs[s - 1]) * P;
      T* dst = htp + d * P * N + offs[s];
      for (int64_t r0 = 0; r0 < n; r0 += 16)  // 16 rows at a time: 16 source rows, P short runs of the destination
        for (int64_t k = 0; k < P; ++k)
          for (int64_t r = r0; r < std::min(n, r0 + 16); ++r) dst[k * N + r] = src[r * P + k];
    }
  });
  // float32: one mm per direction (oneMKL's batched path ran this (2, P, N)·(2, N, 4H) product at 0.6× the rate of two
  // mm calls at the quickstart's and the zoo's shapes); bfloat16 (oneDNN): one bmm, as fast as two mm
  at::Tensor dw_hh;
  if (w_hh.scalar_type() == at::kFloat) {
    dw_hh = at::empty({2, P, G}, tg);
    for (int64_t d = 0; d < 2; ++d) {
      at::Tensor dst = dw_hh.select(0, d);
      at::mm_out(dst, hprev_t.select(0, d), dzg.select(0, d));
    }
  } else {
    dw_hh = at::bmm(hprev_t, dzg);
  }
  at::Tensor dw_proj = at::bmm(m.transpose(1, 2), dhraw);
  return {dzg, acc.sum(0), dc, dh0, dw_hh, dw_proj};
}

// xw (2, N, 4H) float32 or bfloat16 (the input product, without the bias); bias (2, 4H) float32 (forget bias
// folded); c0 (2, B, H), h0 (2, B, P) float32; w_hh (2, P, 4H), w_proj (2, H, P) in the product dtype (float32 or
// bfloat16, the same as xw); sizes: running rows per step (> 0, non-increasing; their sum may be below N, the rows
// past it then ignored, and zeros in the backward's weight gradients) → [out (2, N, P) product dtype,
// final_c, final_h float32, saved: gates (2, N, 4H) float32 (σ(i), tanh(j), σ(f), σ(o)), c_raw (2, N, H) float32,
// m (2, N, H), h_raw (2, N, P) product dtype], or nothing when a pre-activation is inf or NaN.
std::vector<at::Tensor> lstm_train_forward(const at::Tensor& xw, const at::Tensor& bias, const at::Tensor& c0,
                                           const at::Tensor& h0, const at::Tensor& w_hh, const at::Tensor& w_proj,
                                           c10::IntArrayRef sizes, double cell_clip, double proj_clip) {
  at::get_num_threads();  // torch's thread count into this thread's OpenMP settings before any ATen op
  TORCH_CHECK(xw.dim() == 3 && xw.size(0) == 2 && xw.is_contiguous(), "lstm_train_forward: xw (2, N, 4H) contiguous");
  TORCH_CHECK(xw.scalar_type() == w_hh.scalar_type() && w_proj.scalar_type() == w_hh.scalar_type(),
              "lstm_train_forward: xw, w_hh and w_proj in one dtype");
  TORCH_CHECK(bias.scalar_type() == at::kFloat && c0.scalar_type() == at::kFloat && h0.scalar_type() == at::kFloat,
              "lstm_train_forward: bias, c0, h0 float32");
  const at::Tensor b = bias.contiguous(), c = c0.contiguous(), h = h0.contiguous();
  const at::Tensor whh = w_hh.contiguous(), wp = w_proj.contiguous();
  if (xw.scalar_type() == at::kBFloat16)
    return forward_impl<c10::BFloat16>(xw, b, c, h, whh, wp, sizes, cell_clip, proj_clip);
  TORCH_CHECK(xw.scalar_type() == at::kFloat, "lstm_train_forward: float32 or bfloat16");
  return forward_impl<float>(xw, b, c, h, whh, wp, sizes, cell_clip, proj_clip);
}

// The backward of lstm_train_forward: dout (2, N, P), dfc (2, B, H), dfh (2, B, P) float32, the saved tensors, the
// forward's out, c0, h0 and weights → [dxw (2, N, 4H) product dtype, dbias (2, 4H) float32 (Σ dz, summed in float32
// before dz is rounded), dc0, dh0 float32, dW_hh (2, P, 4H), dW_proj (2, H, P) in the product dtype].
std::vector<at::Tensor> lstm_train_backward(const at::Tensor& dout, const at::Tensor& dfc, const at::Tensor& dfh,
                                            const at::Tensor& gates, const at::Tensor& craw, const at::Tensor& m,
                                            const at::Tensor& hraw, const at::Tensor& out, const at::Tensor& c0,
                                            const at::Tensor& h0, const at::Tensor& w_hh, const at::Tensor& w_proj,
                                            c10::IntArrayRef sizes, double cell_clip, double proj_clip) {
  at::get_num_threads();
  TORCH_CHECK(dout.scalar_type() == at::kFloat && dfc.scalar_type() == at::kFloat && dfh.scalar_type() == at::kFloat,
              "lstm_train_backward: float32 gradients");
  const at::Tensor g = dout.contiguous(), fc = dfc.contiguous(), fh = dfh.contiguous();
  const at::Tensor whh = w_hh.contiguous(), wp = w_proj.contiguous(), c = c0.contiguous(), h = h0.contiguous();
  if (w_hh.scalar_type() == at::kBFloat16)
    return backward_impl<c10::BFloat16>(g, fc, fh, gates, craw, m, hraw, out, c, h, whh, wp, sizes, cell_clip,
                                        proj_clip);
  return backward_impl<float>(g, fc, fh, gates, craw, m, hraw, out, c, h, whh, wp, sizes, cell_clip, proj_clip);
}

// ---------------------------------------------------------------------------------------------------------- dropout
// Inverted dropout with a counter-based mask: element i is kept iff hash(seed, i) ≥ threshold (a 32-bit draw, kept
// with probability 1 − threshold / 2³²), kept values scaled by `scale` = 1 / (1 − p). The mask is a function of
// (seed, i) only: the same for any thread count and split, and the backward recomputes it from the seed instead of
// saving it. The hash: two rounds of a 32-bit integer finaliser ("lowbias32", C. Wellons' hash-prospector: multiply,
// xor-shift; each round a bijection of 32 bits with full avalanche) keyed by the seed's two halves, the index's high
// half folded into the second key; vectorises (32-bit multiplies) where torch.bernoulli_ draws one number at a time.
inline uint32_t lowbias32(uint32_t x) {
  x ^= x >> 16;
  x *= 0x21f0aaadu;
  x ^= x >> 15;
  x *= 0x735a2d97u;
  x ^= x >> 15;
  return x;
}

template <typename T>
void dropout_span(const T* __restrict x, T* __restrict y, int64_t a, int64_t b, uint32_t k0, uint32_t k1,
                  uint32_t threshold, float scale) {
#pragma omp simd
  for (int64_t i = a; i < b; ++i) {
    const uint32_t h = lowbias32(lowbias32(static_cast<uint32_t>(i) + k0) ^ k1);
    st(y, i, h >= threshold ? ld(x, i) * scale : 0.0f);
  }
}

// x float32 or bfloat16 (any shape) → x ⊙ mask / (1 − p) in x's dtype, contiguous; p in [0, 1); the mask from
// (seed, element index in x's contiguous order)
at::Tensor dropout_apply(const at::Tensor& x, double p, int64_t seed) {
  at::get_num_threads();
  TORCH_CHECK(p >= 0.0 && p < 1.0, "dropout_apply: p in [0, 1)");
  TORCH_CHECK(x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16, "dropout_apply: float32 or bfloat16");
  const at::Tensor xc = x.contiguous();
  at::Tensor y = at::empty_like(xc);
  const uint64_t s = static_cast<uint64_t>(seed);
  const double t = std::ldexp(p, 32);
  const uint32_t threshold = t >= 4294967295.0 ? 0xffffffffu : static_cast<uint32_t>(std::llround(t));
  const float scale = static_cast<float>(1.0 / (1.0 - p));
  const int64_t n = xc.numel();
  at::parallel_for(0, n, 16384, [&](int64_t a, int64_t b) {
    // the index's high half (tensors past 2³² elements) changes the second key, per span of 2³² indices
    for (int64_t lo = a; lo < b;) {
      const int64_t hi = std::min(b, ((lo >> 32) + 1) << 32);
      const uint32_t k0 = static_cast<uint32_t>(s), k1 = static_cast<uint32_t>(s >> 32) ^ lowbias32(lo >> 32);
      if (xc.scalar_type() == at::kFloat)
        dropout_span<float>(xc.data_ptr<float>(), y.data_ptr<float>(), lo, hi, k0, k1, threshold, scale);
      else
        dropout_span<c10::BFloat16>(xc.data_ptr<c10::BFloat16>(), y.data_ptr<c10::BFloat16>(), lo, hi, k0, k1,
                                    threshold, scale);
      lo = hi;
    }
  });
  return y;
}

// ------------------------------------------------------------------------------------------------------- window max
// The char CNN's max-pooling over window positions for training (elmokit/modules/char_cnn.py, _WindowMax): y (N, S, F)
// float32 or bfloat16 → the maximum over s (N, F), in y's dtype (exact: a copy of the winning value), and the first
// position holding it (N, F) uint8 (S ≤ 255). torch.max(dim=1) computes the same with int64 indices in a reduction
// that does not vectorise over F (≈ 12 ms for (128, 8, 2048) on one thread of this project's machine, 0.9 ms without
// the indices). One pass over y per row, vectorised over F, float32 compares. Returns nothing when y holds inf or NaN
// (the file is built with -ffast-math): the caller then runs torch.max.
template <typename T>
uint32_t window_max_rows(const T* __restrict y, T* __restrict out, uint8_t* __restrict index, int64_t n0, int64_t n1,
                         int64_t S, int64_t F) {
  std::vector<float> best(F);
  std::vector<int32_t> at_s(F);
  float* __restrict b = best.data();
  int32_t* __restrict a = at_s.data();
  uint32_t nonfinite = 0;
  for (int64_t n = n0; n < n1; ++n) {
    const T* yn = y + n * S * F;
#pragma omp simd reduction(| : nonfinite)
    for (int64_t f = 0; f < F; ++f) {
      const float v = ld(yn, f);
      nonfinite |= (bits(v) & 0x7f800000u) == 0x7f800000u;
      b[f] = v;
      a[f] = 0;
    }
    for (int64_t s = 1; s < S; ++s) {
      const T* ys = yn + s * F;
      const int32_t si = static_cast<int32_t>(s);
#pragma omp simd reduction(| : nonfinite)
      for (int64_t f = 0; f < F; ++f) {
        const float v = ld(ys, f);
        nonfinite |= (bits(v) & 0x7f800000u) == 0x7f800000u;
        const bool take = v > b[f];
        b[f] = take ? v : b[f];
        a[f] = take ? si : a[f];
      }
    }
    T* o = out + n * F;
    uint8_t* ix = index + n * F;
#pragma omp simd
    for (int64_t f = 0; f < F; ++f) {
      st(o, f, b[f]);  // a value of T widened and stored back: the same bits
      ix[f] = static_cast<uint8_t>(a[f]);
    }
  }
  return nonfinite;
}

std::vector<at::Tensor> window_max(const at::Tensor& y) {
  at::get_num_threads();
  TORCH_CHECK(y.dim() == 3, "window_max: y must be (N, S, F)");
  TORCH_CHECK(y.scalar_type() == at::kFloat || y.scalar_type() == at::kBFloat16, "window_max: float32 or bfloat16");
  const int64_t N = y.size(0), S = y.size(1), F = y.size(2);
  TORCH_CHECK(S >= 1 && S <= 255, "window_max: 1 to 255 positions");
  const at::Tensor yc = y.contiguous();
  at::Tensor out = at::empty({N, F}, yc.options());
  at::Tensor index = at::empty({N, F}, yc.options().dtype(at::kByte));
  std::atomic<uint32_t> bad{0};
  const int64_t grain = std::max<int64_t>(1, 32768 / std::max<int64_t>(1, S * F));
  at::parallel_for(0, N, grain, [&](int64_t n0, int64_t n1) {
    uint32_t nf;
    if (yc.scalar_type() == at::kFloat)
      nf = window_max_rows<float>(yc.data_ptr<float>(), out.data_ptr<float>(), index.data_ptr<uint8_t>(), n0, n1, S, F);
    else
      nf = window_max_rows<c10::BFloat16>(yc.data_ptr<c10::BFloat16>(), out.data_ptr<c10::BFloat16>(),
                                          index.data_ptr<uint8_t>(), n0, n1, S, F);
    if (nf) bad.store(1);
  });
  if (bad.load()) return {};
  return {out, index};
}

template <typename T>
void window_max_backward_rows(const T* __restrict g, const uint8_t* __restrict index, T* __restrict dy, int64_t n0,
                              int64_t n1, int64_t S, int64_t F) {
  for (int64_t n = n0; n < n1; ++n) {
    const T* gn = g + n * F;
    const uint8_t* ix = index + n * F;
    for (int64_t s = 0; s < S; ++s) {
      T* d = dy + (n * S + s) * F;
      const int32_t si = static_cast<int32_t>(s);
#pragma omp simd
      for (int64_t f = 0; f < F; ++f) st(d, f, static_cast<int32_t>(ix[f]) == si ? ld(gn, f) : 0.0f);
    }
  }
}

// grad (N, F) float32 or bfloat16 and window_max's index (N, F) → dy (N, S, F) in grad's dtype: grad[n, f] at
// (n, index[n, f], f), zero elsewhere (torch.max's backward: a zero fill and a scatter, in one pass)
at::Tensor window_max_backward(const at::Tensor& grad, const at::Tensor& index, int64_t S) {
  at::get_num_threads();
  TORCH_CHECK(grad.dim() == 2 && index.sizes() == grad.sizes(), "window_max_backward: grad and index (N, F)");
  TORCH_CHECK(index.scalar_type() == at::kByte, "window_max_backward: uint8 index");
  TORCH_CHECK(grad.scalar_type() == at::kFloat || grad.scalar_type() == at::kBFloat16,
              "window_max_backward: float32 or bfloat16");
  TORCH_CHECK(S >= 1 && S <= 255, "window_max_backward: 1 to 255 positions");
  const at::Tensor gc = grad.contiguous(), ic = index.contiguous();
  const int64_t N = gc.size(0), F = gc.size(1);
  at::Tensor dy = at::empty({N, S, F}, gc.options());
  const int64_t grain = std::max<int64_t>(1, 32768 / std::max<int64_t>(1, S * F));
  at::parallel_for(0, N, grain, [&](int64_t n0, int64_t n1) {
    if (gc.scalar_type() == at::kFloat)
      window_max_backward_rows<float>(gc.data_ptr<float>(), ic.data_ptr<uint8_t>(), dy.data_ptr<float>(), n0, n1, S, F);
    else
      window_max_backward_rows<c10::BFloat16>(gc.data_ptr<c10::BFloat16>(), ic.data_ptr<uint8_t>(),
                                              dy.data_ptr<c10::BFloat16>(), n0, n1, S, F);
  });
  return dy;
}

// ---------------------------------------------------------------------------------------------------------- highway
// One highway layer for training (elmokit/modules/highway.py, _HighwayTrainLayer). a = x·[W_h | W_g]ᵀ + [b_h | b_g]
// (N, 2F) comes from one GEMM in the product dtype T; here h = relu(a_h), t = σ(a_g), y = t·h + (1 − t)·x
// = x + t·(h − x), float32, one vectorised pass. Returns nothing when a holds inf or NaN (-ffast-math; the caller
// then runs the torch-op path).
template <typename T>
uint32_t highway_forward_rows(const float* __restrict x, const T* __restrict a, float* __restrict y, int64_t n0,
                              int64_t n1, int64_t F) {
  uint32_t nonfinite = 0;
  for (int64_t n = n0; n < n1; ++n) {
    const float* xr = x + n * F;
    const T* ar = a + n * 2 * F;
    float* yr = y + n * F;
#pragma omp simd reduction(| : nonfinite)
    for (int64_t f = 0; f < F; ++f) {
      const float ah = ld(ar, f), ag = ld(ar, F + f);
      nonfinite |= ((bits(ah) & 0x7f800000u) == 0x7f800000u) | ((bits(ag) & 0x7f800000u) == 0x7f800000u);
      const float h = fmaxf(ah, 0.0f), t = sig(ag);
      yr[f] = xr[f] + t * (h - xr[f]);
    }
  }
  return nonfinite;
}

// x (N, F) float32, a (N, 2F) float32 or bfloat16 → y (N, F) float32, or nothing (inf or NaN in a)
std::vector<at::Tensor> highway_train_forward(const at::Tensor& x, const at::Tensor& a) {
  at::get_num_threads();
  TORCH_CHECK(x.dim() == 2 && a.dim() == 2 && a.size(0) == x.size(0) && a.size(1) == 2 * x.size(1),
              "highway_train_forward: x (N, F) and a (N, 2F)");
  TORCH_CHECK(x.scalar_type() == at::kFloat, "highway_train_forward: float32 x");
  TORCH_CHECK(a.scalar_type() == at::kFloat || a.scalar_type() == at::kBFloat16,
              "highway_train_forward: float32 or bfloat16 a");
  const at::Tensor xc = x.contiguous(), ac = a.contiguous();
  const int64_t N = xc.size(0), F = xc.size(1);
  at::Tensor y = at::empty({N, F}, xc.options());
  std::atomic<uint32_t> bad{0};
  at::parallel_for(0, N, std::max<int64_t>(1, 16384 / std::max<int64_t>(1, F)), [&](int64_t n0, int64_t n1) {
    uint32_t nf;
    if (ac.scalar_type() == at::kFloat)
      nf = highway_forward_rows<float>(xc.data_ptr<float>(), ac.data_ptr<float>(), y.data_ptr<float>(), n0, n1, F);
    else
      nf = highway_forward_rows<c10::BFloat16>(xc.data_ptr<float>(), ac.data_ptr<c10::BFloat16>(),
                                               y.data_ptr<float>(), n0, n1, F);
    if (nf) bad.store(1);
  });
  if (bad.load()) return {};
  return {y};
}

template <typename T>
void highway_backward_rows(const float* __restrict dy, const float* __restrict x, const T* __restrict a,
                           T* __restrict da, float* __restrict dx, int64_t n0, int64_t n1, int64_t F) {
  for (int64_t n = n0; n < n1; ++n) {
    const float* g = dy + n * F;
    const float* xr = x + n * F;
    const T* ar = a + n * 2 * F;
    T* dar = da + n * 2 * F;
    float* dxr = dx + n * F;
#pragma omp simd
    for (int64_t f = 0; f < F; ++f) {
      const float ah = ld(ar, f), h = fmaxf(ah, 0.0f), t = sig(ld(ar, F + f));
      st(dar, f, ah > 0.0f ? g[f] * t : 0.0f);
      st(dar, F + f, g[f] * (h - xr[f]) * t * (1.0f - t));
      dxr[f] = g[f] * (1.0f - t);
    }
  }
}

// dy (N, F) float32, x (N, F) float32, a (N, 2F) (the forward's) → [da (N, 2F) in a's dtype (the gradient of a:
// dy·t·[a_h > 0] | dy·(h − x)·t·(1 − t)), dx_carry (N, F) float32 (the part of x's gradient through the carry,
// dy·(1 − t); the caller adds da·[W_h | W_g])]
std::vector<at::Tensor> highway_train_backward(const at::Tensor& dy, const at::Tensor& x, const at::Tensor& a) {
  at::get_num_threads();
  TORCH_CHECK(dy.scalar_type() == at::kFloat && x.scalar_type() == at::kFloat && dy.sizes() == x.sizes(),
              "highway_train_backward: float32 dy and x, (N, F)");
  TORCH_CHECK(a.dim() == 2 && a.size(0) == x.size(0) && a.size(1) == 2 * x.size(1),
              "highway_train_backward: a (N, 2F)");
  const at::Tensor gc = dy.contiguous(), xc = x.contiguous(), ac = a.contiguous();
  const int64_t N = xc.size(0), F = xc.size(1);
  at::Tensor da = at::empty({N, 2 * F}, ac.options());
  at::Tensor dx = at::empty({N, F}, xc.options());
  at::parallel_for(0, N, std::max<int64_t>(1, 16384 / std::max<int64_t>(1, F)), [&](int64_t n0, int64_t n1) {
    if (ac.scalar_type() == at::kFloat)
      highway_backward_rows<float>(gc.data_ptr<float>(), xc.data_ptr<float>(), ac.data_ptr<float>(),
                                   da.data_ptr<float>(), dx.data_ptr<float>(), n0, n1, F);
    else
      highway_backward_rows<c10::BFloat16>(gc.data_ptr<float>(), xc.data_ptr<float>(), ac.data_ptr<c10::BFloat16>(),
                                           da.data_ptr<c10::BFloat16>(), dx.data_ptr<float>(), n0, n1, F);
  });
  return {da, dx};
}

}  // namespace

TORCH_LIBRARY(elmokit_train, lib) {
  lib.def("lstm_train_forward", &lstm_train_forward);
  lib.def("lstm_train_backward", &lstm_train_backward);
  lib.def("dropout_apply", &dropout_apply);
  lib.def("window_max", &window_max);
  lib.def("window_max_backward", &window_max_backward);
  lib.def("highway_train_forward", &highway_train_forward);
  lib.def("highway_train_backward", &highway_train_backward);
}
