// What every codec shares (codecs.hpp): CodecError names and the CPU check that enables the SIMD
// paths. The codecs themselves: half_float.cpp (fp16, bf16), e3m0.cpp, topk.cpp; the metrics:
// metrics.cpp; the SIMD order-statistic selection they use: simd_select.cpp.
#include "optim/codec_util.hpp"

namespace grove::optim {

const char* to_string(CodecError e) {
  switch (e) {
    case CodecError::ok:
      return "ok";
    case CodecError::size_mismatch:
      return "size mismatch";
    case CodecError::not_finite:
      return "not finite";
    case CodecError::malformed:
      return "malformed";
  }
  return "unknown";
}

bool simd_available() {
#if GROVE_CODECS_X86
  static const bool have = [] {
    // clang 14 lacks __builtin_cpu_supports("f16c"): read CPUID.1:ECX bits 29 (F16C) and 23
    // (POPCNT, used by the selection kernels) directly. avx2 support (checked by the builtin)
    // implies the OS saves the ymm state.
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
    if (!__get_cpuid(1, &eax, &ebx, &ecx, &edx)) return false;
    return __builtin_cpu_supports("avx2") && (ecx & (1u << 29)) != 0 && (ecx & (1u << 23)) != 0;
  }();
  return have;
#else
  return false;
#endif
}

}  // namespace grove::optim
