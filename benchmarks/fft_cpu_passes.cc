// Times the CPU fft kernel's three passes (FftConv through PlanFft, as
// RunConvCpu runs them) of a conv with x (N, H, H, C) and w (K, K, CI, C),
// stride 1, PAD (SAME), default issue 11's depthwise case (8, 56, 56, 128) x
// (31, 31, 1, 128). The ParallelFor splits each call into equal blocks, one per
// thread, as csrc/tf/kernels_cpu.cc's TfParallelFor does. Prints the plan, the
// median and min of REPS calls (after one untimed), a hash of the output
// (bit-identical results hash alike), and with PHASES 1 the time of each
// ParallelFor call and each worker's busy time. STAGE=n forces stage_planes;
// FRESH=1 allocates the workspace anew for every call (as TF's allocator
// does above glibc's 32 MiB mmap threshold). L=length times the 1-D causal case
// x (N, 1, L, C) x w (1, K, CI, C) instead (issue 38's Hyena case: N=8 L=16384
// C=256 K=16384). D=depth times the 3-D case x (N, D, H, H, C) x w (K, K, K, CI, C)
// in NDHWC (issue 38's depthwise 21^3: N=2 D=48 H=48 C=64 K=21). SEED=1 times
// the motivating case (N, 321, 481, 1) x (135, 135, 1, 3) VALID; FLOOR=1 also
// times each pass's floor (fft_cpu_floor.h) and prints path / floor.
//
// Build (after pip install, which leaves the static core library) and run:
//   g++ -std=c++17 -O2 -Icsrc/core benchmarks/fft_cpu_passes.cc \
//       build/temp.linux-x86_64-cpython-311/libtfbigconv_core.a -lpthread -o /tmp/fft_passes
//   /tmp/fft_passes THREADS REPS PHASES
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>
#include <algorithm>
#include "fft_cpu.h"
#include "fft_cpu_floor.h"
#include "geometry.h"
#include "parallel.h"
#include "plan.h"
using namespace tfbigconv;
using Clock = std::chrono::steady_clock;
static double Sec(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); }

int main(int argc, char** argv) {
  const int threads = argc > 1 ? atoi(argv[1]) : 2;
  const int reps = argc > 2 ? atoi(argv[2]) : 5;
  const bool phases = argc > 3 && atoi(argv[3]);
  const bool floor = getenv("FLOOR") && atoi(getenv("FLOOR"));  // FLOOR=1: each pass's floor too
  int64_t N = getenv("N") ? atoll(getenv("N")) : 8, H = getenv("H") ? atoll(getenv("H")) : 56,
          C = getenv("C") ? atoll(getenv("C")) : 128, K = getenv("K") ? atoll(getenv("K")) : 31;
  int64_t CI = getenv("CI") ? atoll(getenv("CI")) : 1;  // filter in-depth
  ConvAttrs a;
  ParsePadding(getenv("PAD") ? getenv("PAD") : "SAME", &a.padding);
  ParseDataFormat("NHWC", &a.data_format);
  a.strides = {1, 1, 1, 1};
  a.dilations = {1, 1, 1, 1};
  ConvGeometry g;
  // L=length: the 1-D causal case instead, x (N, 1, L, C), w (1, K, CI, C), K - 1 zeros before.
  const int64_t L = getenv("L") ? atoll(getenv("L")) : 0;
  if (L > 0) {
    a.padding = Padding::kExplicit;
    a.explicit_paddings = {0, 0, 0, 0, K - 1, 0, 0, 0};
  }
  // D=depth: the 3-D case x (N, D, H, H, C), w (K, K, K, CI, C) in NDHWC instead.
  const int64_t D = getenv("D") ? atoll(getenv("D")) : 0;
  if (D > 0) {
    ParseDataFormat("NDHWC", &a.data_format);
    a.strides = a.dilations = {1, 1, 1, 1, 1};
  }
  // SEED=1: the motivating case instead, x (N, 321, 481, 1), w (135, 135, 1, 3), VALID.
  const bool seed = getenv("SEED") && atoi(getenv("SEED"));
  if (seed) {
    H = 321, K = 135, CI = 1, C = 3;
    a.padding = Padding::kValid;
  }
  std::string err = seed    ? ComputeConvGeometry({N, 321, 481, 1}, {135, 135, 1, 3}, a, &g)
                    : L > 0 ? ComputeConvGeometry({N, 1, L, C}, {1, K, CI, C}, a, &g)
                    : D > 0 ? ComputeConvGeometry({N, D, H, H, C}, {K, K, K, CI, C}, a, &g)
                            : ComputeConvGeometry({N, H, H, C}, {K, K, CI, C}, a, &g);
  if (!err.empty()) { fprintf(stderr, "%s\n", err.c_str()); return 1; }
  std::vector<float> x(seed ? N * 321 * 481 : L > 0 ? N * L * C : N * std::max<int64_t>(D, 1) * H * H * C),
      w(L > 0 ? K * CI * C : K * K * (D > 0 ? K : 1) * CI * C), y(g.output_elements()), out(std::max(x.size(), w.size()) * 2);
  std::mt19937 rng(0);
  std::normal_distribution<float> nd;
  for (float& v : x) v = nd(rng);
  for (float& v : w) v = nd(rng);
  for (float& v : y) v = nd(rng);
  std::vector<double> phase_t;
  size_t phase_i = 0;
  std::vector<double> busy(threads);
  const ParallelFor pf(threads, [&](int64_t total, const ParallelFor::Body& body) {
    auto t0 = Clock::now();
    const int64_t block = std::max<int64_t>(1, (total + threads - 1) / threads);
    std::vector<std::thread> th;
    for (int t = 1; t < threads && t * block < total; ++t)
      th.emplace_back([&, t] { auto s = Clock::now(); body(t * block, std::min(total, (t + 1) * block), t); busy[t] += Sec(s, Clock::now()); });
    { auto s = Clock::now(); body(0, std::min(total, block), 0); busy[0] += Sec(s, Clock::now()); }
    for (auto& t : th) t.join();
    if (phase_i >= phase_t.size()) phase_t.resize(phase_i + 1);
    phase_t[phase_i++] += Sec(t0, Clock::now());
  });
  double total_best = 0;
  for (const char* pname : {"forward", "backprop_input", "backprop_filter"}) {
    FftParams p;
    p.dtype = DType::kFloat;
    std::string ps = pname;
    if (ps == "forward") { p.problem = ForwardProblem(g); p.input = x.data(); p.filter = w.data(); }
    else if (ps == "backprop_input") { p.problem = BackpropInputProblem(g); p.input = y.data(); p.filter = w.data(); }
    else { p.problem = BackpropFilterProblem(g); p.input = x.data(); p.filter = y.data(); }
    p.output = out.data();
    err = PlanFft(p.problem.g, DType::kFloat, int64_t(1) << 40, threads, &p.plan);
    if (!err.empty()) { fprintf(stderr, "%s\n", err.c_str()); return 1; }
    if (getenv("STAGE")) { p.plan.stage_planes = atoi(getenv("STAGE")); FillFftWorkspace(p.problem.g, DType::kFloat, &p.plan); }
    if (getenv("CHUNK")) { p.plan.chunk = std::min<int64_t>(p.plan.items, atoi(getenv("CHUNK"))); FillFftWorkspace(p.problem.g, DType::kFloat, &p.plan); }
    std::vector<char> ws(p.plan.workspace_bytes + 128);
    p.workspace = ws.data() + (64 - (reinterpret_cast<uintptr_t>(ws.data()) & 63)) % 64;
    std::vector<double> ts;
    phase_t.clear();
    std::fill(busy.begin(), busy.end(), 0.0);
    for (int r = 0; r < reps + 1; ++r) {
      if (r == 1) { phase_t.assign(phase_t.size(), 0.0); std::fill(busy.begin(), busy.end(), 0.0); }
      phase_i = 0;
      auto t0 = Clock::now();
      char* fresh = nullptr;
      if (getenv("FRESH")) { fresh = static_cast<char*>(aligned_alloc(64, (p.plan.workspace_bytes + 63) / 64 * 64)); p.workspace = fresh; }
      FftConv(p, pf);
      if (fresh) free(fresh);
      if (r > 0) ts.push_back(Sec(t0, Clock::now()));
    }
    std::sort(ts.begin(), ts.end());
    { unsigned long long hsh = 1469598103934665603ull; for (size_t k = 0; k < out.size(); ++k) { unsigned u; memcpy(&u, &out[k], 4); hsh = (hsh ^ u) * 1099511628211ull; } printf("hash %016llx ", hsh); }
    const FftPlan& q = p.plan;
    printf("%-16s tile %ldx%ld fft %ldx%ld chunk %ld/%ld ci_block %ld fused %d ws %.1f MiB: median %.2f ms min %.2f ms\n",
           pname, q.tile_h, q.tile_w, q.fft_h, q.fft_w, q.chunk, q.items, q.ci_block, int(q.fused_mix),
           q.workspace_bytes / 1048576.0, ts[ts.size() / 2] * 1e3, ts[0] * 1e3);
    total_best += ts[ts.size() / 2];
    if (floor) {  // its transforms alone (fft_cpu_floor.h), the weights' not counted
      std::vector<double> fl;
      for (int r = 0; r < reps; ++r)
        fl.push_back(TimeFftFloor(p.problem.g, DType::kFloat, p.plan,
                                  ps == "backprop_filter" ? FloorFilter::kData : FloorFilter::kCached, pf).seconds);
      std::sort(fl.begin(), fl.end());
      printf("   floor: median %.2f ms min %.2f ms (path / floor %.2f)\n", fl[fl.size() / 2] * 1e3,
             fl[0] * 1e3, ts[ts.size() / 2] / fl[fl.size() / 2]);
    }
    if (phases) {
      printf("   phases (ms/call):");
      for (double t : phase_t) printf(" %.2f", t / reps * 1e3);
      printf("   busy per worker:");
      for (double b : busy) printf(" %.2f", b / reps * 1e3);
      printf("\n");
    }
  }
  printf("total of medians: %.2f ms\n", total_best * 1e3);
  // Both gradients at once where the fused backward serves the case (1-D depthwise).
  LaneBackpropParams lb;
  if (PlanLaneBackprop(g, DType::kFloat, int64_t(1) << 40, threads, &lb.plan).empty()) {
    lb.problem = ForwardProblem(g);
    lb.input = x.data();
    lb.filter = w.data();
    lb.out_backprop = y.data();
    std::vector<float> dx(x.size()), dw(w.size());
    std::vector<char> ws(lb.plan.workspace_bytes);
    lb.input_backprop = dx.data();
    lb.filter_backprop = dw.data();
    lb.workspace = ws.data();
    std::vector<double> ts;
    for (int r = 0; r < reps + 1; ++r) {
      auto t0 = Clock::now();
      FftLaneBackprop(lb, pf);
      if (r > 0) ts.push_back(Sec(t0, Clock::now()));
    }
    std::sort(ts.begin(), ts.end());
    unsigned long long hsh = 1469598103934665603ull;
    for (const std::vector<float>* v : {&dx, &dw})
      for (float f : *v) { unsigned u; memcpy(&u, &f, 4); hsh = (hsh ^ u) * 1099511628211ull; }
    printf("hash %016llx fused backward   fft %ld, %ld lanes a task, ws %.1f MiB: median %.2f ms min %.2f ms\n",
           hsh, long(lb.plan.fft_w), long(lb.plan.stage_planes), lb.plan.workspace_bytes / 1048576.0,
           ts[ts.size() / 2] * 1e3, ts[0] * 1e3);
  }
  return 0;
}
