#include "parallel.h"

#include <algorithm>
#include <thread>
#include <vector>

namespace tfbigconv {

ParallelFor StdThreadParallelFor(int num_threads) {
  if (num_threads <= 0) num_threads = std::max(1u, std::thread::hardware_concurrency());
  return [num_threads](int64_t total, int64_t /*cost*/,
                       const std::function<void(int64_t, int64_t)>& fn) {
    const int64_t n = std::min<int64_t>(num_threads, total);
    if (n <= 1) {
      if (total > 0) fn(0, total);
      return;
    }
    std::vector<std::thread> threads;
    threads.reserve(n - 1);
    for (int64_t t = 1; t < n; ++t)
      threads.emplace_back(fn, total * t / n, total * (t + 1) / n);
    fn(0, total / n);
    for (auto& th : threads) th.join();
  };
}

}  // namespace tfbigconv
