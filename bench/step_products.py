"""The fused LSTM layer's per-step products, one way against another: what ``native_train.cpp`` calls now against the
alternatives measured in issue 40's third round (none adopted; the figures are in its closing note).

For each shape (rows n, inner K, columns N; both directions) and dtype, the mean time of one product of both
directions over 200 calls, the best of three, 2 threads:

* v0 ``at::bmm_out`` over both directions (what the fused layer calls);
* v1 one thread per direction, ``at::mm_out`` each (``at::parallel_for`` over the two directions);
* v2 oneDNN's brgemm ukernel (``at::native::cpublas::brgemm``) per direction, bf16 weights packed once (64-column
  blocks), float32 accumulation then copied to the output;
* v3 oneMKL's packed sgemm (``cblas_sgemm_pack`` / ``cblas_sgemm_compute``, looked up at run time; float32; "—" where
  this torch build has no oneMKL).

Each result's largest difference from a float64 reference, relative to its largest value, is printed beside the time.
Compiled once with ``torch.utils.cpp_extension.load_inline`` (a C++ compiler, as the native kernels). Printed first:
``lscpu``'s model name and the ``torch.mm`` bf16/fp32 ratio. Run on a quiet machine:
``python bench/step_products.py [--threads 2]``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
from torch.utils.cpp_extension import load_inline

sys.path.insert(0, str(Path(__file__).resolve().parent))
from train import cpu_model, mm_rates  # noqa: E402  (bench/train.py)

SOURCE = r"""
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <ATen/native/CPUBlas.h>
#include <dlfcn.h>
using at::native::cpublas::brgemm;
typedef void (*pack_fn)(int, int, int, int, int, int, float, const float*, int, float*);
typedef void (*compute_fn)(int, int, int, int, int, int, const float*, int, const float*, int, float, float*, int);
typedef size_t (*packsize_fn)(int, int, int, int, int);
// variant 0: bmm_out both dirs per step; 1: per-direction thread mm_out; 2: per-direction brgemm; 3: mkl packed
double run(at::Tensor x, at::Tensor w, at::Tensor out, int64_t T, int64_t variant) {
  at::get_num_threads();
  const int64_t n = x.size(1), K = x.size(2), N = w.size(2);
  auto t0 = std::chrono::steady_clock::now();
  if (variant == 0) {
    for (int64_t t = 0; t < T; ++t) at::bmm_out(out, x, w);
  } else if (variant == 1) {
    at::parallel_for(0, 2, 1, [&](int64_t a, int64_t b) {
      at::NoGradGuard g;
      for (int64_t d = a; d < b; ++d) {
        at::Tensor o = out[d];
        for (int64_t t = 0; t < T; ++t) at::mm_out(o, x[d], w[d]);
      }
    });
  } else if (variant == 2) {
    const bool bf = x.scalar_type() == at::kBFloat16;
    at::Tensor wp = w;
    const int64_t NB = 64;
    if (bf) {
      wp = at::empty({2, N / NB, K, NB}, w.options());
      for (int d = 0; d < 2; ++d)
        for (int64_t j = 0; j < N / NB; ++j)
          at::native::cpublas::pack(K, NB, N, NB, at::kBFloat16, at::kBFloat16,
                                    (const at::BFloat16*)w[d].data_ptr() + j * NB, wp[d][j].data_ptr());
    }
    at::Tensor acc = at::empty({2, n, N}, x.options().dtype(at::kFloat));
    at::parallel_for(0, 2, 1, [&](int64_t a, int64_t b) {
      for (int64_t d = a; d < b; ++d) for (int64_t t = 0; t < T; ++t) {
        float* c = acc[d].data_ptr<float>();
        if (bf) {
          for (int64_t j = 0; j < N / NB; ++j)
            brgemm(n, NB, K, K, NB, N, false, (const at::BFloat16*)x[d].data_ptr(),
                   (const at::BFloat16*)wp[d][j].data_ptr(), c + j * NB, true);
        }
        else brgemm(n, N, K, K, N, N, false, x[d].data_ptr<float>(), w[d].data_ptr<float>(), c, false);
      }
      if (bf) at::native::cpublas::brgemm_release(true);
    });
    out.copy_(acc);
  } else if (variant == 3) {
    auto pk = (pack_fn)dlsym(RTLD_DEFAULT, "cblas_sgemm_pack");
    auto cp = (compute_fn)dlsym(RTLD_DEFAULT, "cblas_sgemm_compute");
    auto ps = (packsize_fn)dlsym(RTLD_DEFAULT, "cblas_sgemm_pack_get_size");
    if (!(pk && cp && ps)) return -1.0;  // no oneMKL in this torch build
    // CblasRowMajor=101, CblasBMatrix=162, NoTrans=111, CblasPacked=151
    std::vector<float*> bufs(2);
    for (int d = 0; d < 2; ++d) {
      bufs[d] = (float*)malloc(ps(162, n, N, K, 0));
      pk(101, 162, 111, n, N, K, 1.0f, w[d].data_ptr<float>(), N, bufs[d]);
    }
    at::parallel_for(0, 2, 1, [&](int64_t a, int64_t b) {
      for (int64_t d = a; d < b; ++d) for (int64_t t = 0; t < T; ++t)
        cp(101, 111, 151, n, N, K, x[d].data_ptr<float>(), K, bufs[d], N, 0.0f, out[d].data_ptr<float>(), N);
    });
    for (auto p : bufs) free(p);
  }
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / T;
}
"""

SHAPES = [(32, 128, 2048), (32, 512, 128), (128, 128, 2048), (128, 512, 128), (7, 128, 2048)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=2, help="torch threads (default: %(default)s)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    rates = mm_rates(args.threads)
    print(f"CPU: {cpu_model()}; torch.mm bf16/fp32 at 2048²: {rates['mm_bf16_over_fp32']:.2f}", flush=True)
    ext = load_inline("elmokit_bench_step_products", cpp_sources=SOURCE, functions=["run"], extra_cflags=["-O3"])
    for n, k, cols in SHAPES:
        for dtype in (torch.float32, torch.bfloat16):
            x = torch.randn(2, n, k).to(dtype)
            w = (torch.randn(2, k, cols) / k**0.5).to(dtype)
            ref = torch.bmm(x.double(), w.double())
            cells = []
            for variant in (0, 1, 2, 3):
                if variant == 3 and dtype == torch.bfloat16:
                    continue
                out = torch.empty(2, n, cols, dtype=dtype)
                if ext.run(x, w, out, 20, variant) < 0:
                    cells.append(f"v{variant} —")
                    continue
                err = float((out.double() - ref).abs().max() / ref.abs().max())
                seconds = min(ext.run(x, w, out, 200, variant) for _ in range(3))
                cells.append(f"v{variant} {seconds * 1e6:7.1f} µs (err {err:.1e})")
            print(f"n={n} K={k} N={cols} {str(dtype)[6:]}: " + " | ".join(cells), flush=True)


if __name__ == "__main__":
    main()
