// elmokit's sampled-softmax rows for TRAINING (used by elmokit/modules/softmax.py's _SampledLogSumExp; compiled into
// the same extension as native_kernels.cpp by elmokit/modules/native.py, registered as torch.ops.elmokit_softmax.*).
//
// softmax_rows_(logits, hit_rows, hit_cols) → lse: for each row n of the (N, S) logits (float32, or bfloat16 from the
// bfloat16 product under --precision bf16), in ONE pass per row while the row sits in the core's L1 cache:
//     x = the row in float32, the accidental hits (hit_rows[k] == n → column hit_cols[k]) at −FLT_MAX;
//     top = max x;  e = exp(x − top);  Z = Σ e;  lse[n] = log Z + top;  row ← e / Z (hits 0), in the logits' dtype.
// The same arithmetic as the torch-op blocks it replaces (amax, sub_, exp_, sum, div_, a float32 copy of each bfloat16
// block and the copy back, six sweeps of each block through the cache hierarchy); the sum's order differs (float
// rounding). Rows run in parallel over torch's threads; each row's own order is fixed, so the result does not depend
// on the thread count. Built with -ffast-math (expf vectorises): the logits must be finite (the caller checks).
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "native_bf16.h"

namespace {

using elmokit_native::ld;
using elmokit_native::st;

// one row: x (S) in T → its probabilities in place, returns log Σ exp; `buf` (S floats) is the row in float32
template <typename T>
__attribute__((noinline)) float softmax_row(T* __restrict x, float* __restrict buf, const int64_t* hits, int64_t n_hits,
                                            int64_t S) {
#pragma omp simd
  for (int64_t k = 0; k < S; ++k) buf[k] = ld(x, k);
  for (int64_t h = 0; h < n_hits; ++h) buf[hits[h]] = -FLT_MAX;
  float top = -FLT_MAX;
#pragma omp simd reduction(max : top)
  for (int64_t k = 0; k < S; ++k) top = fmaxf(top, buf[k]);
  float total = 0.0f;
#pragma omp simd reduction(+ : total)
  for (int64_t k = 0; k < S; ++k) {
    const float e = expf(fmaxf(buf[k] - top, -100.0f));  // −FLT_MAX − top stays finite; e^−100 is 0 in float32
    buf[k] = e;
    total += e;
  }
  const float inv = 1.0f / total;
#pragma omp simd
  for (int64_t k = 0; k < S; ++k) st(x, k, buf[k] * inv);
  for (int64_t h = 0; h < n_hits; ++h) st(x, hits[h], 0.0f);  // masked logits get no gradient
  return logf(total) + top;
}

template <typename T>
at::Tensor softmax_rows_impl(at::Tensor& logits, const at::Tensor& hit_rows, const at::Tensor& hit_cols) {
  const int64_t N = logits.size(0), S = logits.size(1), H = hit_rows.numel();
  at::Tensor lse = at::empty({N}, logits.options().dtype(at::kFloat));
  // each row's hits: hit_rows ascending, so row n holds hits[start[n]:start[n + 1]]
  std::vector<int64_t> start(N + 1, 0);
  const int64_t* hr = hit_rows.data_ptr<int64_t>();
  for (int64_t k = 0; k < H; ++k) start[hr[k] + 1] += 1;
  for (int64_t n = 0; n < N; ++n) start[n + 1] += start[n];
  const int64_t* hc = hit_cols.data_ptr<int64_t>();
  T* xp = logits.data_ptr<T>();
  float* lp = lse.data_ptr<float>();
  at::parallel_for(0, N, 16, [&](int64_t a, int64_t b) {
    std::vector<float> buf(S);
    for (int64_t n = a; n < b; ++n)
      lp[n] = softmax_row<T>(xp + n * S, buf.data(), hc + start[n], start[n + 1] - start[n], S);
  });
  return lse;
}

// logits (N, S) float32 or bfloat16, contiguous, finite, modified in place into the probabilities; hit_rows,
// hit_cols (H,) int64 (rows ascending, in [0, N); columns in [0, S)) → lse (N,) float32
at::Tensor softmax_rows_(at::Tensor logits, const at::Tensor& hit_rows, const at::Tensor& hit_cols) {
  at::get_num_threads();  // torch's thread count into this thread's OpenMP settings before any ATen op
  TORCH_CHECK(logits.dim() == 2 && logits.is_contiguous() && logits.device().is_cpu(),
              "softmax_rows_: logits (N, S) contiguous on the CPU");
  TORCH_CHECK(hit_rows.scalar_type() == at::kLong && hit_cols.scalar_type() == at::kLong &&
                  hit_rows.numel() == hit_cols.numel() && hit_rows.is_contiguous() && hit_cols.is_contiguous(),
              "softmax_rows_: hit_rows, hit_cols (H,) int64, contiguous");
  if (logits.scalar_type() == at::kBFloat16) return softmax_rows_impl<c10::BFloat16>(logits, hit_rows, hit_cols);
  TORCH_CHECK(logits.scalar_type() == at::kFloat, "softmax_rows_: float32 or bfloat16 logits");
  return softmax_rows_impl<float>(logits, hit_rows, hit_cols);
}

}  // namespace

TORCH_LIBRARY(elmokit_softmax, lib) { lib.def("softmax_rows_", &softmax_rows_); }
