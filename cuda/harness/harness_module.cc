// pybind11 module `tfbigconv_gpu_harness`: the CUDA kernels on raw device
// pointers (from CuPy arrays or torch tensors), for testing and timing them
// without TensorFlow (scripts/gpu_check.sh). Launches go through
// gpu::RunConvGpu, the same function the TF op calls. Shapes, padding and the passes'
// problems come from geometry.cc, exactly as the TF kernels get them.
#include <cuda_runtime_api.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <pybind11/numpy.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "cost_model.h"
#include "fft_gpu_layout.h"
#include "geometry.h"
#include "plan_gpu.h"
#include "run_gpu.h"

namespace py = pybind11;

namespace tfbigconv {
namespace {

void Check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(e));
}

struct Conv {
  ConvGeometry g;
  ConvProblem problem;
};

// The forward geometry of (input_shape, filter_shape) and the pass's problem.
// strides/dilations are (h, w), or (d, h, w) for NDHWC and NCDHW;
// explicit_paddings has 8 (10) entries in data_format order (or none).
Conv MakeConv(const std::string& pass, const std::vector<int64_t>& input_shape,
              const std::vector<int64_t>& filter_shape, const std::vector<int64_t>& strides,
              const std::vector<int64_t>& dilations, const std::string& padding,
              const std::vector<int64_t>& explicit_paddings, const std::string& data_format) {
  ConvAttrs a;
  std::string err = ParsePadding(padding, &a.padding);
  if (err.empty()) err = ParseDataFormat(data_format, &a.data_format);
  const size_t dims = size_t(SpatialDims(a.data_format));
  if (err.empty() && (strides.size() != dims || dilations.size() != dims))
    err = dims == 2 ? "strides and dilations must be (h, w) pairs"
                    : "strides and dilations must be (d, h, w) triples";
  if (!err.empty()) throw py::value_error(err);
  // In data_format order: batch and channel entries 1 around the spatial ones.
  auto full = [&](const std::vector<int64_t>& spatial) {
    std::vector<int64_t> v{1};
    if (!ChannelsLast(a.data_format)) v.push_back(1);
    v.insert(v.end(), spatial.begin(), spatial.end());
    if (ChannelsLast(a.data_format)) v.push_back(1);
    return v;
  };
  a.strides = full(strides);
  a.dilations = full(dilations);
  a.explicit_paddings = explicit_paddings;
  Conv c;
  err = ComputeConvGeometry(input_shape, filter_shape, a, &c.g);
  if (!err.empty()) throw py::value_error(err);
  if (pass == "forward") c.problem = ForwardProblem(c.g);
  else if (pass == "backprop_input") c.problem = BackpropInputProblem(c.g);
  else if (pass == "backprop_filter") c.problem = BackpropFilterProblem(c.g);
  else throw py::value_error("pass must be forward, backprop_input or backprop_filter, got " + pass);
  return c;
}

DType ParseDTypeOrThrow(const std::string& name) {
  DType t;
  if (!ParseDType(name.c_str(), &t)) throw py::value_error("unknown dtype " + name);
  return t;
}

// RAII device buffer.
struct DeviceBuffer {
  void* ptr = nullptr;
  explicit DeviceBuffer(int64_t bytes) {
    if (bytes > 0) Check(cudaMalloc(&ptr, size_t(bytes)), "cudaMalloc(workspace)");
  }
  ~DeviceBuffer() {
    if (ptr) cudaFree(ptr);
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
};

struct CudaEvent {
  cudaEvent_t e = nullptr;
  CudaEvent() { Check(cudaEventCreate(&e), "cudaEventCreate"); }
  ~CudaEvent() { cudaEventDestroy(e); }
  CudaEvent(const CudaEvent&) = delete;
  CudaEvent& operator=(const CudaEvent&) = delete;
};

// The arguments that name one pass and its operands, as run, time and plan
// take them (MakeJob makes a Job of them): JOB_PARAMS declares them, JOB_ARGS
// passes them on and JOB_PY_ARGS names them for Python.
#define JOB_PARAMS                                                                       \
  const std::string& pass, uintptr_t a, uintptr_t b, uintptr_t out,                      \
      const std::vector<int64_t>& input_shape, const std::vector<int64_t>& filter_shape, \
      const std::vector<int64_t>& strides, const std::vector<int64_t>& dilations,        \
      const std::string& padding, const std::vector<int64_t>& explicit_paddings,         \
      const std::string& data_format, const std::string& dtype_name,                     \
      const std::string& algorithm, int64_t workspace_limit, uintptr_t stream_handle
#define JOB_ARGS                                                                              \
  pass, a, b, out, input_shape, filter_shape, strides, dilations, padding, explicit_paddings, \
      data_format, dtype_name, algorithm, workspace_limit, stream_handle
#define JOB_PY_ARGS                                                                          \
  py::arg("pass_"), py::arg("a"), py::arg("b"), py::arg("out"), py::arg("input_shape"),      \
      py::arg("filter_shape"), py::arg("strides"), py::arg("dilations"), py::arg("padding"), \
      py::arg("explicit_paddings"), py::arg("data_format"), py::arg("dtype"),                \
      py::arg("algorithm"), py::arg("workspace_limit") = int64_t(4) << 30,                   \
      py::arg("stream") = uintptr_t(0)

// One pass as the harness runs it: the problem, the planned choice, and the
// operands. a, b are (input, filter), (out_backprop, filter) or (input,
// out_backprop) for forward, backprop_input, backprop_filter.
struct Job {
  Conv c;
  DType dtype;
  gpu::GpuAlgorithmChoice choice;
  const void* a;
  const void* b;
  void* out;
  cudaStream_t stream;
  AlgorithmRequest requested = AlgorithmRequest::kAuto;  // parsed once, as the op does
  std::string Describe() const {
    return std::string(AlgorithmName(choice.algorithm)) + ": " + choice.reason;
  }
  void Launch(void* ws) const {
    const Status s = gpu::RunConvGpu(c.problem, dtype, choice, a, b, out, ws, stream);
    if (!s.ok()) throw std::runtime_error(s.message());
  }
};

Job MakeJob(JOB_PARAMS) {
  Job j{MakeConv(pass, input_shape, filter_shape, strides, dilations, padding, explicit_paddings,
                 data_format),
        ParseDTypeOrThrow(dtype_name),
        {},
        reinterpret_cast<const void*>(a),
        reinterpret_cast<const void*>(b),
        reinterpret_cast<void*>(out),
        reinterpret_cast<cudaStream_t>(stream_handle)};
  if (j.c.problem.g.output_elements() == 0) return j;
  const std::string err = ParseAlgorithmRequest(algorithm, &j.requested);
  if (!err.empty()) throw std::runtime_error(err);
  const Status status = gpu::ChooseGpuAlgorithm(j.c.problem, j.dtype, j.requested,
                                                workspace_limit, j.stream, &j.choice);
  if (!status.ok()) throw std::runtime_error(status.message());
  return j;
}

// Check mode: plans, allocates the workspace and poisons it with NaN bytes
// (so reads of unwritten workspace show), runs the pass, synchronizes.
// Returns "<algorithm>: <reason>".
std::string Run(JOB_PARAMS) {
  const Job j = MakeJob(JOB_ARGS);
  if (j.c.problem.g.output_elements() == 0) return "empty";
  DeviceBuffer ws(j.choice.workspace_bytes());
  if (ws.ptr)
    Check(cudaMemsetAsync(ws.ptr, 0xff, size_t(j.choice.workspace_bytes()), j.stream),
          "poisoning the workspace");
  j.Launch(ws.ptr);
  Check(cudaStreamSynchronize(j.stream), "kernel execution");
  return j.Describe();
}

// The planner's choice for a pass, without running it: (algorithm, reason).
py::tuple Plan(JOB_PARAMS) {
  const Job j = MakeJob(JOB_ARGS);
  return py::make_tuple(std::string(AlgorithmName(j.choice.algorithm)), j.choice.reason);
}

// The direct algorithm's kernel bodies run on the CPU over numpy buffers
// (raw bytes of the storage type), for testing their index arithmetic on
// machines without a GPU. Returns a description of the plan that ran.
std::string RunDirectOnHost(const std::string& pass, py::array a, py::array b, py::array out,
                            const std::vector<int64_t>& input_shape,
                            const std::vector<int64_t>& filter_shape,
                            const std::vector<int64_t>& strides,
                            const std::vector<int64_t>& dilations, const std::string& padding,
                            const std::vector<int64_t>& explicit_paddings,
                            const std::string& data_format, const std::string& dtype_name,
                            int64_t workspace_limit) {
  const Conv c = MakeConv(pass, input_shape, filter_shape, strides, dilations, padding,
                          explicit_paddings, data_format);
  gpu::DirectGpuParams p;
  p.problem = c.problem;
  p.dtype = ParseDTypeOrThrow(dtype_name);
  p.plan = gpu::PlanDirectGpu(c.problem, p.dtype, workspace_limit);
  const int64_t item = DTypeBytes(p.dtype), g_out = c.problem.g.output_elements();
  if (out.nbytes() != g_out * item) throw py::value_error("out has the wrong size");
  // NaN bytes, as on the GPU, so that a partial sum never written shows.
  std::vector<double> ws(size_t((p.plan.workspace_bytes + 7) / 8), std::nan(""));
  p.input = a.data();
  p.filter = b.data();
  p.output = out.mutable_data();
  p.workspace = ws.empty() ? nullptr : ws.data();
  const std::string err = gpu::DirectConvOnHost(p);
  if (!err.empty()) throw std::runtime_error(err);
  const gpu::DirectGpuPlan& pl = p.plan;
  return pl.depthwise ? "depthwise splits " + std::to_string(pl.row_splits)
         : pl.reduction ? "reduction " + std::to_string(pl.red_channels) + "x" +
                            std::to_string(pl.red_width) + " splits " +
                            std::to_string(pl.row_splits)
                      : pl.tiled ? "tiled" : "untiled splits " + std::to_string(pl.splits());
}

// The FFT algorithm's steps on the CPU over numpy buffers, with numpy's FFT
// in cuFFT's place and a plan made here from (tile_h, tile_w, chunk,
// ci_block, tile_d) rather than by PlanFftGpu (which needs cuFFT): small
// tiles, chunks and channel blocks exercise every loop of the launcher.
// Tiles are clamped to the output (tile_d's default: the whole depth).
std::string RunFftOnHost(const std::string& pass, py::array a, py::array b, py::array out,
                         const std::vector<int64_t>& input_shape,
                         const std::vector<int64_t>& filter_shape,
                         const std::vector<int64_t>& strides, const std::vector<int64_t>& dilations,
                         const std::string& padding, const std::vector<int64_t>& explicit_paddings,
                         const std::string& data_format, const std::string& dtype_name,
                         int64_t tile_h, int64_t tile_w, int64_t chunk, int64_t ci_block,
                         int64_t tile_d) {
  const Conv c = MakeConv(pass, input_shape, filter_shape, strides, dilations, padding,
                          explicit_paddings, data_format);
  const ConvGeometry& g = c.problem.g;
  gpu::FftGpuParams p;
  p.problem = c.problem;
  p.dtype = ParseDTypeOrThrow(dtype_name);
  if (out.nbytes() != g.output_elements() * DTypeBytes(p.dtype))
    throw py::value_error("out has the wrong size");
  gpu::FftGpuPlan& pl = p.plan;
  pl.tile_d = std::max<int64_t>(1, std::min(tile_d, g.out[kD]));
  pl.tile_h = std::max<int64_t>(1, std::min(tile_h, g.out[kH]));
  pl.tile_w = std::max<int64_t>(1, std::min(tile_w, g.out[kW]));
  // The window of a tile, or for a tile of the whole output the least
  // circular transform (numpy transforms any size; the planners round up).
  const auto fft_size = [](int64_t tile, int64_t out, int64_t stride, int64_t eff, int64_t pad,
                           int64_t vin) {
    return tile == out ? WholeTileFftNeed(out, stride, eff, pad, vin) : (tile - 1) * stride + eff;
  };
  pl.fft_d = fft_size(pl.tile_d, g.out[kD], g.stride[kD], g.effective_filter(kD), g.pad_before[kD],
                 g.virtual_in(kD));
  pl.fft_h = fft_size(pl.tile_h, g.out[kH], g.stride[kH], g.effective_filter(kH), g.pad_before[kH],
                 g.virtual_in(kH));
  pl.fft_w = fft_size(pl.tile_w, g.out[kW], g.stride[kW], g.effective_filter(kW), g.pad_before[kW],
                 g.virtual_in(kW));
  pl.tiles_d = (g.out[kD] + pl.tile_d - 1) / pl.tile_d;
  pl.tiles_h = (g.out[kH] + pl.tile_h - 1) / pl.tile_h;
  pl.tiles_w = (g.out[kW] + pl.tile_w - 1) / pl.tile_w;
  pl.items = std::max<int64_t>(1, g.batch * pl.tiles_d * pl.tiles_h * pl.tiles_w);
  pl.chunk = std::max<int64_t>(1, std::min(chunk, pl.items));
  pl.ci_block = std::max<int64_t>(1, std::min(ci_block, g.in_c_per_group()));
  // The kernel's own layout, without a cuFFT work area (numpy transforms here).
  static_cast<FftGpuLayout&>(pl) = FftGpuWorkspaceLayout(
      g, p.dtype, pl.fft_d, pl.fft_h, pl.fft_w, pl.chunk, pl.ci_block, /*cufft_work_bytes=*/0);
  const int64_t rb = ComputeBytes(p.dtype);
  std::vector<double> ws(size_t(pl.workspace_bytes / 8), std::nan(""));
  p.input = a.data();
  p.filter = b.data();
  p.output = out.mutable_data();
  p.workspace = ws.data();
  const bool dbl = p.dtype == DType::kDouble;
  py::module_ np = py::module_::import("numpy");
  py::module_ np_fft = py::module_::import("numpy.fft");
  const py::object real_t = np.attr(dbl ? "float64" : "float32");
  const py::object complex_t = np.attr(dbl ? "complex128" : "complex64");
  const gpu::HostFft fft = [&](int64_t d, int64_t h, int64_t w, int64_t batch, bool forward,
                               void* in, void* dst) -> std::string {
    const int64_t bins = d * h * (w / 2 + 1);
    const py::tuple axes = py::make_tuple(1, 2, 3);  // a transform of size 1 changes nothing
    py::array result;
    if (forward) {
      py::array src(py::dtype::from_args(real_t), std::vector<int64_t>{batch, d, h, w},
                    static_cast<char*>(in));
      result = np_fft.attr("rfftn")(src, py::none(), axes).attr("astype")(complex_t);
    } else {
      py::array src(py::dtype::from_args(complex_t), std::vector<int64_t>{batch, d, h, w / 2 + 1},
                    static_cast<char*>(in));
      // numpy's inverse divides by d * h * w; cuFFT's does not.
      result = (np_fft.attr("irfftn")(src, py::make_tuple(d, h, w), axes) * py::int_(d * h * w))
                   .attr("astype")(real_t);
    }
    result = np.attr("ascontiguousarray")(result);
    const int64_t bytes = batch * (forward ? bins * 2 : d * h * w) * rb;
    if (result.nbytes() != bytes) return "host FFT: unexpected result size";
    std::memcpy(dst, result.data(), size_t(bytes));
    return "";
  };
  const std::string err = gpu::FftConvOnHost(p, fft);
  if (!err.empty()) throw std::runtime_error(err);
  const std::string depth = g.is_3d() ? std::to_string(pl.fft_d) + "x" : "";
  const std::string tiles_d = g.is_3d() ? std::to_string(pl.tiles_d) + "x" : "";
  return "fft " + depth + std::to_string(pl.fft_h) + "x" + std::to_string(pl.fft_w) + " tiles " +
         tiles_d + std::to_string(pl.tiles_h) + "x" + std::to_string(pl.tiles_w) + " chunk " +
         std::to_string(pl.chunk) + " ci_block " + std::to_string(pl.ci_block);
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// Timing mode: plans once and allocates the workspace once (not poisoned,
// as TF's allocator hands it out), runs one warm-up, then `reps` calls.
// kernel_ms: median over the calls of the GPU time between CUDA events
// recorded around each call's launches (the calls are enqueued back to back,
// so host launch work overlaps the GPU's). wall_ms: median host time of a
// call that plans, launches and synchronizes, as a TF op would (without its
// allocation). Returns a dict with kernel_ms, wall_ms, algorithm, reason and
// workspace_bytes.
py::dict Time(JOB_PARAMS, int reps) {
  if (reps < 1) throw py::value_error("reps must be at least 1");
  std::vector<double> kernel_ms, wall_ms;
  Job j;
  {
    py::gil_scoped_release release;
    j = MakeJob(JOB_ARGS);
    if (j.c.problem.g.output_elements() > 0) {
      DeviceBuffer ws(j.choice.workspace_bytes());
      j.Launch(ws.ptr);  // warm-up: module load, cuFFT plans
      Check(cudaStreamSynchronize(j.stream), "kernel execution");
      std::vector<CudaEvent> ev(size_t(reps) + 1);
      Check(cudaEventRecord(ev[0].e, j.stream), "cudaEventRecord");
      for (int r = 0; r < reps; ++r) {
        j.Launch(ws.ptr);
        Check(cudaEventRecord(ev[size_t(r) + 1].e, j.stream), "cudaEventRecord");
      }
      Check(cudaStreamSynchronize(j.stream), "kernel execution");
      for (int r = 0; r < reps; ++r) {
        float ms = 0;
        Check(cudaEventElapsedTime(&ms, ev[size_t(r)].e, ev[size_t(r) + 1].e),
              "cudaEventElapsedTime");
        kernel_ms.push_back(ms);
      }
      for (int r = 0; r < reps; ++r) {
        const auto t0 = std::chrono::steady_clock::now();
        gpu::GpuAlgorithmChoice again;
        const Status status = gpu::ChooseGpuAlgorithm(j.c.problem, j.dtype, j.requested,
                                                      workspace_limit, j.stream, &again);
        if (!status.ok()) throw std::runtime_error(status.message());
        j.Launch(ws.ptr);
        Check(cudaStreamSynchronize(j.stream), "kernel execution");
        wall_ms.push_back(
            std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0)
                .count());
      }
    }
  }
  py::dict d;
  const bool empty = kernel_ms.empty();
  d["kernel_ms"] = empty ? 0.0 : Median(kernel_ms);
  d["wall_ms"] = empty ? 0.0 : Median(wall_ms);
  d["algorithm"] = empty ? "empty" : AlgorithmName(j.choice.algorithm);
  d["reason"] = j.choice.reason;
  d["workspace_bytes"] = j.choice.workspace_bytes();
  return d;
}

std::vector<int64_t> OutputShape(const std::vector<int64_t>& input_shape,
                                 const std::vector<int64_t>& filter_shape,
                                 const std::vector<int64_t>& strides,
                                 const std::vector<int64_t>& dilations, const std::string& padding,
                                 const std::vector<int64_t>& explicit_paddings,
                                 const std::string& data_format) {
  return MakeConv("forward", input_shape, filter_shape, strides, dilations, padding,
                  explicit_paddings, data_format)
      .g.output_shape();
}

py::tuple CufftStatus() {
  std::string why;
  const bool ok = gpu::CufftAvailable(&why);
  return py::make_tuple(ok, why);
}

}  // namespace
}  // namespace tfbigconv

PYBIND11_MODULE(tfbigconv_gpu_harness, m) {
  using namespace tfbigconv;
  m.doc() = "tfbigconv CUDA launchers on raw device pointers (test harness, no TensorFlow)";
  m.def("run", &Run, JOB_PY_ARGS, py::call_guard<py::gil_scoped_release>());
  m.def("time", &Time, JOB_PY_ARGS, py::arg("reps") = 5);
  m.def("plan", &Plan, JOB_PY_ARGS);
  m.def("run_direct_on_host", &RunDirectOnHost, py::arg("pass_"), py::arg("a"), py::arg("b"),
        py::arg("out"), py::arg("input_shape"), py::arg("filter_shape"), py::arg("strides"),
        py::arg("dilations"), py::arg("padding"), py::arg("explicit_paddings"),
        py::arg("data_format"), py::arg("dtype"), py::arg("workspace_limit") = int64_t(4) << 30);
  m.def("run_fft_on_host", &RunFftOnHost, py::arg("pass_"), py::arg("a"), py::arg("b"),
        py::arg("out"), py::arg("input_shape"), py::arg("filter_shape"), py::arg("strides"),
        py::arg("dilations"), py::arg("padding"), py::arg("explicit_paddings"),
        py::arg("data_format"), py::arg("dtype"), py::arg("tile_h"), py::arg("tile_w"),
        py::arg("chunk"), py::arg("ci_block"), py::arg("tile_d") = int64_t(1) << 40);
  m.def("output_shape", &OutputShape, py::arg("input_shape"), py::arg("filter_shape"),
        py::arg("strides"), py::arg("dilations"), py::arg("padding"),
        py::arg("explicit_paddings"), py::arg("data_format"));
  m.def("cufft_status", &CufftStatus, "(available, why not)");
  m.def("cost_model_fields", &CostModelFields);
  m.def(
      "set_cost_model",
      [](const std::vector<double>& values) {
        const std::string err = SetActiveCostModelValues(values);
        if (!err.empty()) throw py::value_error(err);
      },
      "Sets the cost model the run-time 'auto' uses (values in cost_model_fields() order), "
      "as importing tfbigconv does for the TF ops.");
}
