// ParallelFor: injected by the caller so that kernels never own threads.
// Inside TF it wraps the intra-op thread pool; elsewhere StdThreadParallelFor.
#pragma once

#include <cstdint>
#include <functional>

namespace tfbigconv {

// Calls fn(begin, end) over disjoint ranges covering [0, total), possibly
// concurrently. cost_per_unit is a rough cycle count per unit, a hint for
// how finely to split. Kernels must give results independent of the split.
using ParallelFor = std::function<void(int64_t total, int64_t cost_per_unit,
                                       const std::function<void(int64_t, int64_t)>& fn)>;

// A ParallelFor on std::thread with num_threads workers (0: hardware
// concurrency). Ranges are contiguous and static.
ParallelFor StdThreadParallelFor(int num_threads);

}  // namespace tfbigconv
