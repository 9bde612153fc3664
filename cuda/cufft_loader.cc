#include "cufft_loader.h"

#include <dlfcn.h>

#include <mutex>
#include <vector>

namespace tfbigconv {
namespace gpu {
namespace {

// Sonames of cuFFT for CUDA 13 and CUDA 12 (there is no unversioned .so in
// the wheels), and the nvidia-cufft wheel folders relative to site-packages,
// which is found from this library's own path (site-packages/tfbigconv/x.so).
// The plain sonames come last: LD_LIBRARY_PATH, the system, or a copy that
// TensorFlow, torch or CuPy already loaded into the process.
const char* const kSonames[] = {"libcufft.so.12", "libcufft.so.11"};
const char* const kWheelFiles[] = {"nvidia/cu13/lib/libcufft.so.12",
                                   "nvidia/cufft/lib/libcufft.so.11"};

// site-packages of the .so that holds this function (".../tfbigconv/x.so").
std::string SitePackagesDir() {
  Dl_info info;
  if (dladdr(reinterpret_cast<void*>(&SitePackagesDir), &info) == 0 || !info.dli_fname) return "";
  std::string p = info.dli_fname;
  for (int up = 0; up < 2; ++up) {
    const size_t slash = p.rfind('/');
    if (slash == std::string::npos) return "";
    p.resize(slash);
  }
  return p + "/";
}

template <typename F>
bool Resolve(void* lib, const char* name, F* fn, std::string* missing) {
  *fn = reinterpret_cast<F>(dlsym(lib, name));
  if (!*fn) *missing += std::string(missing->empty() ? "" : ", ") + name;
  return *fn != nullptr;
}

struct Loaded {
  CufftApi api{};
  bool ok = false;
  std::string why;
};

Loaded Load() {
  Loaded r;
  std::vector<std::string> candidates;
  const std::string site = SitePackagesDir();
  if (!site.empty())
    for (const char* f : kWheelFiles) candidates.push_back(site + f);
  for (const char* so : kSonames) candidates.push_back(so);  // system / LD_LIBRARY_PATH
  std::string tried;
  for (const std::string& c : candidates) {
    void* lib = dlopen(c.c_str(), RTLD_NOW | RTLD_LOCAL);
    tried += (tried.empty() ? "" : ", ") + c;
    if (!lib) continue;
    std::string missing;
    CufftApi& a = r.api;
    bool ok = Resolve(lib, "cufftCreate", &a.Create, &missing);
    ok &= Resolve(lib, "cufftDestroy", &a.Destroy, &missing);
    ok &= Resolve(lib, "cufftSetAutoAllocation", &a.SetAutoAllocation, &missing);
    ok &= Resolve(lib, "cufftMakePlanMany64", &a.MakePlanMany64, &missing);
    ok &= Resolve(lib, "cufftSetWorkArea", &a.SetWorkArea, &missing);
    ok &= Resolve(lib, "cufftSetStream", &a.SetStream, &missing);
    ok &= Resolve(lib, "cufftExecR2C", &a.ExecR2C, &missing);
    ok &= Resolve(lib, "cufftExecC2R", &a.ExecC2R, &missing);
    ok &= Resolve(lib, "cufftExecD2Z", &a.ExecD2Z, &missing);
    ok &= Resolve(lib, "cufftExecZ2D", &a.ExecZ2D, &missing);
    if (ok) {
      a.library = c;
      r.ok = true;
      return r;
    }
    r.why += c + " lacks " + missing + "; ";
    dlclose(lib);
  }
  r.why += "cuFFT not found (tried " + tried +
           "); install the nvidia-cufft wheel (CUDA 13) or nvidia-cufft-cu12";
  return r;
}

}  // namespace

const CufftApi* Cufft(std::string* why) {
  static std::once_flag once;
  static Loaded* loaded = nullptr;
  std::call_once(once, [] { loaded = new Loaded(Load()); });
  if (!loaded->ok) {
    if (why) *why = loaded->why;
    return nullptr;
  }
  return &loaded->api;
}

}  // namespace gpu
}  // namespace tfbigconv
