// elmokit's native kernels (native_train.cpp, native_softmax.cpp): loads and stores of a product dtype as float32.
// float32 as is; bfloat16 widened by a 16-bit shift and stored rounded to nearest even (finite values: the kernels
// that call these check or bound their inputs first). Part of the extension's build digest (elmokit/modules/native.py).
#pragma once

#include <c10/util/BFloat16.h>

#include <cstdint>
#include <cstring>

namespace elmokit_native {

inline float ld(const float* p, int64_t i) { return p[i]; }
inline float ld(const c10::BFloat16* p, int64_t i) {
  uint32_t u = static_cast<uint32_t>(reinterpret_cast<const uint16_t*>(p)[i]) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline void st(float* p, int64_t i, float v) { p[i] = v; }
inline void st(c10::BFloat16* p, int64_t i, float v) {
  uint32_t u;
  std::memcpy(&u, &v, 4);
  u += 0x7fffu + ((u >> 16) & 1u);
  reinterpret_cast<uint16_t*>(p)[i] = static_cast<uint16_t>(u >> 16);
}

}  // namespace elmokit_native
