#include "memory_info.h"

#include <algorithm>
#include <fstream>
#include <limits>
#include <string>

namespace tfbigconv {
namespace {

// First integer in a file, or -1 if missing or not a number (e.g. "max").
int64_t ReadInt(const char* path) {
  std::ifstream f(path);
  std::string s;
  if (!(f >> s)) return -1;
  try {
    size_t used = 0;
    const long long v = std::stoll(s, &used);
    return used == s.size() ? int64_t(v) : -1;
  } catch (...) {
    return -1;
  }
}

int64_t MemAvailable() {
  std::ifstream f("/proc/meminfo");
  std::string key, unit;
  int64_t kb;
  while (f >> key >> kb) {
    std::getline(f, unit);
    if (key == "MemAvailable:") return kb * 1024;
  }
  return -1;
}

}  // namespace

int64_t FreeHostMemoryBytes() {
  int64_t free = MemAvailable();
  if (free < 0) free = std::numeric_limits<int64_t>::max();
  const int64_t limits[][2] = {
      {ReadInt("/sys/fs/cgroup/memory.max"), ReadInt("/sys/fs/cgroup/memory.current")},
      {ReadInt("/sys/fs/cgroup/memory/memory.limit_in_bytes"),
       ReadInt("/sys/fs/cgroup/memory/memory.usage_in_bytes")}};
  for (const auto& l : limits)
    if (l[0] > 0 && l[1] >= 0) free = std::min(free, std::max<int64_t>(0, l[0] - l[1]));
  return free;
}

int64_t DefaultHostWorkspaceBudget() {
  return int64_t(double(FreeHostMemoryBytes()) * kDefaultBudgetFraction);
}

}  // namespace tfbigconv
