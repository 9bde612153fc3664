// ParallelFor: injected by the caller so that kernels never own threads.
// Inside TF it wraps the intra-op thread pool; elsewhere StdThreadParallelFor.
#pragma once

#include <cstdint>
#include <functional>

namespace tfbigconv {

class ParallelFor {
 public:
  // body(begin, end, worker) over disjoint ranges covering [0, total);
  // worker < num_workers() identifies the thread, so that per-thread scratch
  // can be indexed by it. Kernels must give results independent of the split.
  using Body = std::function<void(int64_t begin, int64_t end, int worker)>;
  using Runner = std::function<void(int64_t total, const Body& body)>;

  ParallelFor(int num_workers, Runner runner)
      : num_workers_(num_workers), runner_(std::move(runner)) {}
  int num_workers() const { return num_workers_; }
  void operator()(int64_t total, const Body& body) const {
    if (total > 0) runner_(total, body);
  }

 private:
  int num_workers_;
  Runner runner_;
};

// A ParallelFor on std::thread with num_threads workers (0: hardware
// concurrency), handing out blocks of work dynamically.
ParallelFor StdThreadParallelFor(int num_threads);

}  // namespace tfbigconv
