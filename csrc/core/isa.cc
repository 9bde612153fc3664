#include "isa.h"

#include <cstdlib>

namespace tfbigconv {

const char* IsaName(Isa isa) {
  switch (isa) {
    case Isa::kBaseline: return "baseline";
    case Isa::kAvx2: return "avx2";
    case Isa::kAvx512: return "avx512";
  }
  return "?";
}

bool ParseIsa(const std::string& s, Isa* out) {
  if (s == "baseline") *out = Isa::kBaseline;
  else if (s == "avx2") *out = Isa::kAvx2;
  else if (s == "avx512") *out = Isa::kAvx512;
  else return false;
  return true;
}

std::vector<Isa> SupportedIsas() {
  std::vector<Isa> v{Isa::kBaseline};
#if defined(TFBIGCONV_HAVE_X86_VARIANTS)
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) v.push_back(Isa::kAvx2);
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq") &&
      __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl"))
    v.push_back(Isa::kAvx512);
#endif
  return v;
}

Status CheckIsaSupported(Isa isa) {
  for (Isa ok : SupportedIsas())
    if (ok == isa) return Status::Ok();
  return Status::InvalidArgument(std::string("isa ") + IsaName(isa) +
                                 " is not supported by this CPU or build");
}

Isa ActiveIsa() {
  static const Isa isa = [] {
    const std::vector<Isa> ok = SupportedIsas();
    Isa want;
    const char* env = std::getenv("TFBIGCONV_ISA");
    if (env && ParseIsa(env, &want))
      for (Isa i : ok)
        if (i == want) return want;
    return ok.back();
  }();
  return isa;
}

}  // namespace tfbigconv
