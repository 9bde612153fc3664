// Free host memory, aware of cgroup (container) limits.
#pragma once

#include <cstdint>

namespace tfbigconv {

// Bytes this process can still allocate: the smaller of MemAvailable and the
// room left under a cgroup v2 (memory.max - memory.current) or v1 limit.
int64_t FreeHostMemoryBytes();

// The default workspace budget: this fraction of FreeHostMemoryBytes().
constexpr double kDefaultBudgetFraction = 0.5;
int64_t DefaultHostWorkspaceBudget();

}  // namespace tfbigconv
