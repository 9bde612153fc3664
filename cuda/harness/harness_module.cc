// pybind11 module `tfbigconv_gpu_harness`: the CUDA launchers on raw device
// pointers (from CuPy arrays or torch tensors), for testing the kernels
// without TensorFlow (scripts/gpu_check.sh). Shapes, padding and the passes'
// problems come from geometry.cc, exactly as the TF kernels get them.
#include <cuda_runtime_api.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "direct_gpu.h"
#include "fft_gpu.h"
#include "geometry.h"
#include "plan_gpu.h"

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
// strides/dilations are (h, w); explicit_paddings has 8 entries in
// data_format order (or none).
Conv MakeConv(const std::string& pass, const std::vector<int64_t>& input_shape,
              const std::vector<int64_t>& filter_shape, const std::vector<int64_t>& strides,
              const std::vector<int64_t>& dilations, const std::string& padding,
              const std::vector<int64_t>& explicit_paddings, const std::string& data_format) {
  ConvAttrs a;
  std::string err = ParsePadding(padding, &a.padding);
  if (err.empty()) err = ParseDataFormat(data_format, &a.data_format);
  if (err.empty() && (strides.size() != 2 || dilations.size() != 2))
    err = "strides and dilations must be (h, w) pairs";
  if (!err.empty()) throw py::value_error(err);
  const bool nhwc = a.data_format == DataFormat::kNHWC;
  a.strides = nhwc ? std::vector<int64_t>{1, strides[0], strides[1], 1}
                   : std::vector<int64_t>{1, 1, strides[0], strides[1]};
  a.dilations = nhwc ? std::vector<int64_t>{1, dilations[0], dilations[1], 1}
                     : std::vector<int64_t>{1, 1, dilations[0], dilations[1]};
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

// Runs one pass: a, b are (input, filter), (out_backprop, filter) or
// (input, out_backprop) for forward, backprop_input, backprop_filter. The
// workspace is poisoned with NaN bytes. Returns "<algorithm>: <reason>".
std::string Run(const std::string& pass, uintptr_t a, uintptr_t b, uintptr_t out,
                const std::vector<int64_t>& input_shape, const std::vector<int64_t>& filter_shape,
                const std::vector<int64_t>& strides, const std::vector<int64_t>& dilations,
                const std::string& padding, const std::vector<int64_t>& explicit_paddings,
                const std::string& data_format, const std::string& dtype_name,
                const std::string& algorithm, int64_t workspace_limit, uintptr_t stream_handle) {
  const Conv c = MakeConv(pass, input_shape, filter_shape, strides, dilations, padding,
                          explicit_paddings, data_format);
  const DType dtype = ParseDTypeOrThrow(dtype_name);
  auto stream = reinterpret_cast<cudaStream_t>(stream_handle);
  if (c.problem.g.output_elements() == 0) return "empty";
  gpu::GpuAlgorithmChoice choice;
  const Status status = gpu::ChooseGpuAlgorithm(c.problem, dtype, algorithm, workspace_limit,
                                                stream, &choice);
  if (!status.ok()) throw std::runtime_error(status.message());
  std::string err;
  void* ws = nullptr;
  const int64_t bytes = choice.workspace_bytes();
  if (bytes > 0) {
    Check(cudaMalloc(&ws, size_t(bytes)), "cudaMalloc(workspace)");
    Check(cudaMemsetAsync(ws, 0xff, size_t(bytes), stream), "poisoning the workspace");
  }
  if (choice.algorithm == gpu::GpuAlgorithm::kFft) {
    gpu::FftGpuParams p;
    p.problem = c.problem;
    p.dtype = dtype;
    p.plan = choice.fft;
    p.input = reinterpret_cast<const void*>(a);
    p.filter = reinterpret_cast<const void*>(b);
    p.output = reinterpret_cast<void*>(out);
    p.workspace = ws;
    err = gpu::FftConvGpu(p, stream);
  } else {
    gpu::DirectGpuParams p;
    p.problem = c.problem;
    p.dtype = dtype;
    p.plan = choice.direct;
    p.input = reinterpret_cast<const void*>(a);
    p.filter = reinterpret_cast<const void*>(b);
    p.output = reinterpret_cast<void*>(out);
    p.workspace = ws;
    err = gpu::DirectConvGpu(p, stream);
  }
  const cudaError_t sync = cudaStreamSynchronize(stream);
  if (ws) cudaFree(ws);
  if (!err.empty()) throw std::runtime_error(err);
  Check(sync, "kernel execution");
  return std::string(choice.algorithm == gpu::GpuAlgorithm::kFft ? "fft" : "direct") + ": " +
         choice.reason;
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
  m.def("run", &Run, py::arg("pass_"), py::arg("a"), py::arg("b"), py::arg("out"),
        py::arg("input_shape"), py::arg("filter_shape"), py::arg("strides"),
        py::arg("dilations"), py::arg("padding"), py::arg("explicit_paddings"),
        py::arg("data_format"), py::arg("dtype"), py::arg("algorithm"),
        py::arg("workspace_limit") = int64_t(4) << 30, py::arg("stream") = uintptr_t(0),
        py::call_guard<py::gil_scoped_release>());
  m.def("output_shape", &OutputShape, py::arg("input_shape"), py::arg("filter_shape"),
        py::arg("strides"), py::arg("dilations"), py::arg("padding"),
        py::arg("explicit_paddings"), py::arg("data_format"));
  m.def("cufft_status", &CufftStatus, "(available, why not)");
}
