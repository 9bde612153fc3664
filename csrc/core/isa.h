// Instruction-set variants of the hot loops, chosen once per process at run
// time so that one binary runs on any x86-64 CPU.
#pragma once

#include <string>
#include <vector>

#include "status.h"

namespace tfbigconv {

enum class Isa { kBaseline, kAvx2, kAvx512 };

const char* IsaName(Isa isa);
// Parses "baseline", "avx2", "avx512"; returns false on anything else.
bool ParseIsa(const std::string& s, Isa* out);
// Variants that were compiled in and that this CPU can run.
std::vector<Isa> SupportedIsas();
// Ok if `isa` is in SupportedIsas(); else kInvalidArgument naming it.
Status CheckIsaSupported(Isa isa);
// The best supported variant, or the one forced by TFBIGCONV_ISA (read once).
// A forced variant the CPU cannot run falls back to the best one.
Isa ActiveIsa();

}  // namespace tfbigconv
