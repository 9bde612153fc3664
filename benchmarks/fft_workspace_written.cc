// Which bytes of the CPU fft workspace one filter-gradient call writes, region
// by region: the 135x135 case of bench_memory_report.py (x: (N, 321, 481, 1),
// filter 135x135x1x3, VALID). The workspace is a fresh anonymous mmap and
// mincore() counts its resident (written) pages after FftConv. The
// ParallelFor splits work as csrc/tf/kernels_cpu.cc's TfParallelFor does
// (block = ceil(total / threads), worker index = begin / block); shards run
// one after another here. (Before TfParallelFor indexed workers by block, it
// used TF's pool thread ids; this tool then took a third argument, same|rotate,
// for two schedules of those ids: RESULTS.md's issue-13 review table.)
//
// Build (after pip install, which leaves the static core library) and run:
//   g++ -std=c++17 -O1 -Icsrc/core benchmarks/fft_workspace_written.cc \
//       build/temp.linux-x86_64-cpython-311/libtfbigconv_core.a -lpthread -o /tmp/fft_written
//   /tmp/fft_written BATCH THREADS
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "fft_cpu.h"
#include "geometry.h"
#include "parallel.h"
#include "plan.h"

using namespace tfbigconv;

static double WrittenMiB(const char* base, long begin, long end) {
  const long page = sysconf(_SC_PAGESIZE);
  const long b = begin / page * page, e = (end + page - 1) / page * page;
  std::vector<unsigned char> resident((e - b) / page);
  mincore(const_cast<char*>(base) + b, e - b, resident.data());
  long n = 0;
  for (unsigned char c : resident) n += c & 1;
  return double(n * page) / (1 << 20);
}

int main(int argc, char** argv) {
  if (argc != 3) {
    fprintf(stderr, "usage: %s BATCH THREADS\n", argv[0]);
    return 2;
  }
  const int batch = atoi(argv[1]), threads = atoi(argv[2]);
  ConvAttrs a;
  ParsePadding("VALID", &a.padding);
  ParseDataFormat("NHWC", &a.data_format);
  a.strides = {1, 1, 1, 1};
  a.dilations = {1, 1, 1, 1};
  ConvGeometry ug;
  std::string err = ComputeConvGeometry({batch, 321, 481, 1}, {135, 135, 1, 3}, a, &ug);
  FftParams p;
  p.problem = BackpropFilterProblem(ug);
  p.dtype = DType::kFloat;
  const int workers = threads;  // as host.current().threads() and TfParallelFor
  if (err.empty()) err = PlanFft(p.problem.g, DType::kFloat, int64_t(1) << 40, workers, &p.plan);
  if (!err.empty()) {
    fprintf(stderr, "%s\n", err.c_str());
    return 1;
  }
  std::vector<float> x(size_t(batch) * 321 * 481), dy(size_t(batch) * 187 * 347 * 3),
      dw(135 * 135 * 3);
  std::mt19937 rng(0);
  std::normal_distribution<float> normal;
  for (float& v : x) v = normal(rng);
  for (float& v : dy) v = normal(rng);
  p.input = x.data();  // the filter gradient's problem: input x, filter dy (geometry.cc)
  p.filter = dy.data();
  p.output = dw.data();
  const FftPlan& q = p.plan;
  char* ws = static_cast<char*>(mmap(nullptr, q.workspace_bytes, PROT_READ | PROT_WRITE,
                                     MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
  p.workspace = ws;
  const ParallelFor pf(workers, [&](int64_t total, const ParallelFor::Body& body) {
    const int64_t block = std::max<int64_t>(1, (total + threads - 1) / threads);
    for (int64_t b = 0; b < total; b += block) body(b, std::min(total, b + block), int(b / block));
  });
  FftConv(p, pf);
  printf("batch %d, %d threads: planned workspace %.3f MiB, written %.3f MiB\n", batch,
         threads, q.workspace_bytes / double(1 << 20),
         WrittenMiB(ws, 0, q.workspace_bytes));
  long off = 0;
  auto region = [&](const std::string& name, long bytes) {
    printf("  %-20s %.3f of %.3f MiB\n", name.c_str(), WrittenMiB(ws, off, off + bytes),
           bytes / double(1 << 20));
    off += bytes;
  };
  region("filter spectra", q.filter_spectra_bytes);
  region("item spectra", q.chunk * q.item_spectra_bytes);
  const long staging = q.stage_planes * q.fft_h * q.fft_w * long(sizeof(float));
  for (int w = 0; w < q.workers; ++w) {
    region("worker " + std::to_string(w) + " staging", staging);
    region("worker " + std::to_string(w) + " spectrum", q.worker_bytes - staging);
  }
  return 0;
}
