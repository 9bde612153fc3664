#include "parallel.h"

#include <algorithm>
#include <atomic>
#include <thread>
#include <vector>

namespace tfbigconv {

ParallelFor StdThreadParallelFor(int num_threads) {
  if (num_threads <= 0) num_threads = int(std::max(1u, std::thread::hardware_concurrency()));
  return ParallelFor(num_threads, [num_threads](int64_t total, const ParallelFor::Body& body) {
    const int64_t n = std::min<int64_t>(num_threads, total);
    if (n <= 1) return body(0, total, 0);
    // A few blocks per thread, taken in order, balance uneven tasks.
    const int64_t block = std::max<int64_t>(1, total / (4 * n));
    std::atomic<int64_t> next{0};
    auto work = [&](int worker) {
      for (;;) {
        const int64_t begin = next.fetch_add(block);
        if (begin >= total) return;
        body(begin, std::min(total, begin + block), worker);
      }
    };
    std::vector<std::thread> threads;
    for (int t = 1; t < n; ++t) threads.emplace_back(work, t);
    work(0);
    for (auto& th : threads) th.join();
  });
}

}  // namespace tfbigconv
