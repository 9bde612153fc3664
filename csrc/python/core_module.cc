// tfbigconv._core: the framework-free core on numpy arrays. Python uses it for
// shape math and validation at trace time; tests use it to run the CPU
// kernels without TensorFlow (with NaN-poisoned outputs and forced ISAs).
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <limits>
#include <string>
#include <vector>

#include "direct_cpu.h"
#include "fft_cpu.h"
#include "memory_info.h"
#include "plan.h"
#include "geometry.h"
#include "isa.h"
#include "parallel.h"

namespace py = pybind11;
using namespace tfbigconv;

namespace {

ConvAttrs MakeAttrs(const std::vector<int64_t>& strides, const std::string& padding,
                    const std::vector<int64_t>& explicit_paddings, const std::string& data_format,
                    const std::vector<int64_t>& dilations) {
  ConvAttrs a;
  std::string err = ParsePadding(padding, &a.padding);
  if (err.empty()) err = ParseDataFormat(data_format, &a.data_format);
  if (!err.empty()) throw py::value_error(err);
  a.strides = strides;
  a.dilations = dilations;
  a.explicit_paddings = explicit_paddings;
  return a;
}

ConvGeometry Geometry(const std::vector<int64_t>& input_shape,
                      const std::vector<int64_t>& filter_shape, const ConvAttrs& a) {
  ConvGeometry g;
  const std::string err = ComputeConvGeometry(input_shape, filter_shape, a, &g);
  if (!err.empty()) throw py::value_error(err);
  return g;
}

py::dict GeometryDict(const ConvGeometry& g) {
  py::dict d;
  d["batch"] = g.batch;
  d["in_h"] = g.in_h;
  d["in_w"] = g.in_w;
  d["in_c"] = g.in_c;
  d["filter_h"] = g.filter_h;
  d["filter_w"] = g.filter_w;
  d["filter_in_c"] = g.filter_in_c;
  d["out_c"] = g.out_c;
  d["groups"] = g.groups;
  d["stride_h"] = g.stride_h;
  d["stride_w"] = g.stride_w;
  d["dilation_h"] = g.dilation_h;
  d["dilation_w"] = g.dilation_w;
  d["pad_top"] = g.pad_top;
  d["pad_bottom"] = g.pad_bottom;
  d["pad_left"] = g.pad_left;
  d["pad_right"] = g.pad_right;
  d["out_h"] = g.out_h;
  d["out_w"] = g.out_w;
  d["output_shape"] = g.output_shape();
  d["macs"] = g.macs();
  return d;
}

Isa PickIsa(const std::string& name) {
  if (name.empty()) return ActiveIsa();
  Isa isa;
  if (!ParseIsa(name, &isa)) throw py::value_error("isa must be baseline, avx2 or avx512, got " + name);
  for (Isa ok : SupportedIsas())
    if (ok == isa) return isa;
  throw py::value_error("isa " + name + " is not supported by this CPU or build");
}

DType PickDType(const py::array& a, const std::string& dtype) {
  if (dtype == "bfloat16") {
    if (a.dtype().itemsize() != 2) throw py::value_error("bfloat16 arrays must be 2-byte views");
    return DType::kBFloat16;
  }
  if (!dtype.empty()) throw py::value_error("dtype may only be 'bfloat16' (others come from the array)");
  const char kind = a.dtype().kind();
  const auto size = a.dtype().itemsize();
  if (kind == 'f' && size == 2) return DType::kHalf;
  if (kind == 'f' && size == 4) return DType::kFloat;
  if (kind == 'f' && size == 8) return DType::kDouble;
  throw py::value_error("unsupported dtype; use float16, float32, float64 or bfloat16");
}

bool Dense(const py::array& a) {
  return (a.flags() & py::array::c_style) != 0;
}

// A forward convolution on numpy arrays: validated geometry, dtype and an
// output array (the caller's `out`, checked, or a new one).
struct NumpyConv {
  ConvGeometry g;
  DType dtype;
  py::array input, filter, output;
};

NumpyConv PrepareForward(py::array input, py::array filter, const std::vector<int64_t>& strides,
                         const std::string& padding, const std::vector<int64_t>& explicit_paddings,
                         const std::string& data_format, const std::vector<int64_t>& dilations,
                         py::object out, const std::string& dtype) {
  NumpyConv c;
  const ConvAttrs a = MakeAttrs(strides, padding, explicit_paddings, data_format, dilations);
  std::vector<int64_t> in_shape(input.shape(), input.shape() + input.ndim());
  std::vector<int64_t> f_shape(filter.shape(), filter.shape() + filter.ndim());
  c.g = Geometry(in_shape, f_shape, a);
  c.dtype = PickDType(input, dtype);
  if (!input.dtype().is(filter.dtype())) throw py::value_error("input and filter dtypes differ");
  if (!Dense(input) || !Dense(filter)) throw py::value_error("input and filter must be C-contiguous");
  const std::vector<int64_t> oshape = c.g.output_shape();
  if (out.is_none()) {
    c.output = py::array(input.dtype(), std::vector<py::ssize_t>(oshape.begin(), oshape.end()));
  } else {
    c.output = out.cast<py::array>();
    std::vector<int64_t> got(c.output.shape(), c.output.shape() + c.output.ndim());
    if (got != oshape || !c.output.dtype().is(input.dtype()) || !Dense(c.output) ||
        !c.output.writeable())
      throw py::value_error("out must be a writeable C-contiguous array of the output shape and dtype");
  }
  c.input = input;
  c.filter = filter;
  return c;
}

py::array DirectForwardNumpy(py::array input, py::array filter, const std::vector<int64_t>& strides,
                             const std::string& padding, const std::vector<int64_t>& explicit_paddings,
                             const std::string& data_format, const std::vector<int64_t>& dilations,
                             py::object out, const std::string& isa, int num_threads,
                             const std::string& dtype) {
  NumpyConv c = PrepareForward(input, filter, strides, padding, explicit_paddings, data_format,
                               dilations, out, dtype);
  DirectForwardParams p;
  p.g = c.g;
  p.dtype = c.dtype;
  p.input = c.input.data();
  p.filter = c.filter.data();
  p.output = c.output.mutable_data();
  const Isa chosen = PickIsa(isa);
  {
    py::gil_scoped_release release;
    DirectForward(p, StdThreadParallelFor(num_threads), chosen);
  }
  return c.output;
}

int64_t BudgetOrDefault(int64_t workspace_limit) {
  if (workspace_limit < 0) throw py::value_error("workspace_limit must be non-negative");
  return workspace_limit > 0 ? workspace_limit : DefaultHostWorkspaceBudget();
}

py::dict PlanDict(const FftPlan& p) {
  py::dict d;
  d["tile_h"] = p.tile_h;
  d["tile_w"] = p.tile_w;
  d["fft_h"] = p.fft_h;
  d["fft_w"] = p.fft_w;
  d["tiles_h"] = p.tiles_h;
  d["tiles_w"] = p.tiles_w;
  d["items"] = p.items;
  d["chunk"] = p.chunk;
  d["workers"] = p.workers;
  d["filter_spectra_bytes"] = p.filter_spectra_bytes;
  d["item_spectra_bytes"] = p.item_spectra_bytes;
  d["worker_bytes"] = p.worker_bytes;
  d["fused_mix"] = p.fused_mix;
  d["workspace_bytes"] = p.workspace_bytes;
  d["cost"] = p.cost;
  return d;
}

FftPlan PlanOrThrow(const ConvGeometry& g, DType dtype, int64_t workspace_limit, int workers) {
  FftPlan plan;
  const std::string err = PlanFftForward(g, dtype, BudgetOrDefault(workspace_limit), workers, &plan);
  if (!err.empty()) throw py::value_error(err);
  return plan;
}

py::array FftForwardNumpy(py::array input, py::array filter, const std::vector<int64_t>& strides,
                          const std::string& padding, const std::vector<int64_t>& explicit_paddings,
                          const std::string& data_format, const std::vector<int64_t>& dilations,
                          py::object out, int64_t workspace_limit, int num_threads,
                          const std::string& dtype) {
  NumpyConv c = PrepareForward(input, filter, strides, padding, explicit_paddings, data_format,
                               dilations, out, dtype);
  const ParallelFor pf = StdThreadParallelFor(num_threads);
  FftForwardParams p;
  p.g = c.g;
  p.dtype = c.dtype;
  p.plan = PlanOrThrow(c.g, c.dtype, workspace_limit, pf.num_workers());
  p.input = c.input.data();
  p.filter = c.filter.data();
  p.output = c.output.mutable_data();
  // Exactly the planned bytes, poisoned with NaN so that unwritten reads show.
  std::vector<double> workspace((p.plan.workspace_bytes + 7) / 8,
                                std::numeric_limits<double>::quiet_NaN());
  p.workspace = workspace.data();
  {
    py::gil_scoped_release release;
    FftForward(p, pf);
  }
  return c.output;
}

}  // namespace

PYBIND11_MODULE(_core, m) {
  m.doc() = "tfbigconv core: geometry and CPU kernels on numpy arrays (no TensorFlow).";
  m.def(
      "conv_geometry",
      [](const std::vector<int64_t>& input_shape, const std::vector<int64_t>& filter_shape,
         const std::vector<int64_t>& strides, const std::string& padding,
         const std::vector<int64_t>& explicit_paddings, const std::string& data_format,
         const std::vector<int64_t>& dilations) {
        return GeometryDict(Geometry(
            input_shape, filter_shape,
            MakeAttrs(strides, padding, explicit_paddings, data_format, dilations)));
      },
      py::arg("input_shape"), py::arg("filter_shape"), py::arg("strides"), py::arg("padding"),
      py::arg("explicit_paddings"), py::arg("data_format"), py::arg("dilations"),
      "Validated geometry of a conv2d as a dict; raises ValueError naming the bad argument.");
  m.def(
      "validate_attrs",
      [](const std::vector<int64_t>& strides, const std::string& padding,
         const std::vector<int64_t>& explicit_paddings, const std::string& data_format,
         const std::vector<int64_t>& dilations) {
        const std::string err = ValidateAttrs(
            MakeAttrs(strides, padding, explicit_paddings, data_format, dilations));
        if (!err.empty()) throw py::value_error(err);
      },
      py::arg("strides"), py::arg("padding"), py::arg("explicit_paddings"),
      py::arg("data_format"), py::arg("dilations"));
  m.def(
      "direct_forward_blocking",
      [](const std::vector<int64_t>& input_shape, const std::vector<int64_t>& filter_shape,
         const std::vector<int64_t>& strides, const std::string& padding,
         const std::vector<int64_t>& explicit_paddings, const std::string& data_format,
         const std::vector<int64_t>& dilations, const std::string& dtype, const std::string& isa) {
        const ConvGeometry g = Geometry(
            input_shape, filter_shape,
            MakeAttrs(strides, padding, explicit_paddings, data_format, dilations));
        const DirectBlocking b =
            DirectForwardBlocking(g, dtype == "float64" ? DType::kDouble : DType::kFloat, PickIsa(isa));
        py::dict d;
        d["channel_vectors"] = b.channel_vectors;
        d["channels_per_tile"] = b.channels_per_tile;
        d["task_rows"] = b.task_rows;
        d["ci_block"] = b.ci_block;
        d["kh_block"] = b.kh_block;
        d["tasks"] = b.tasks;
        d["scratch_bytes_per_worker"] = b.scratch_bytes_per_worker;
        return d;
      },
      py::arg("input_shape"), py::arg("filter_shape"), py::arg("strides"), py::arg("padding"),
      py::arg("explicit_paddings"), py::arg("data_format"), py::arg("dilations"),
      py::arg("dtype") = "float32", py::arg("isa") = "");
  m.def("direct_forward", &DirectForwardNumpy, py::arg("input"), py::arg("filter"),
        py::arg("strides"), py::arg("padding"), py::arg("explicit_paddings"),
        py::arg("data_format"), py::arg("dilations"), py::arg("out") = py::none(),
        py::arg("isa") = "", py::arg("num_threads") = 0, py::arg("dtype") = "",
        "Direct forward convolution on numpy arrays. `out`, if given, is overwritten. "
        "bfloat16 data is passed as uint16 arrays with dtype='bfloat16'.");
  m.def(
      "fft_plan",
      [](const std::vector<int64_t>& input_shape, const std::vector<int64_t>& filter_shape,
         const std::vector<int64_t>& strides, const std::string& padding,
         const std::vector<int64_t>& explicit_paddings, const std::string& data_format,
         const std::vector<int64_t>& dilations, const std::string& dtype,
         int64_t workspace_limit, int workers) {
        const ConvGeometry g = Geometry(
            input_shape, filter_shape,
            MakeAttrs(strides, padding, explicit_paddings, data_format, dilations));
        DType dt = DType::kFloat;
        if (dtype == "float64") dt = DType::kDouble;
        else if (dtype == "float16") dt = DType::kHalf;
        else if (dtype == "bfloat16") dt = DType::kBFloat16;
        else if (dtype != "float32") throw py::value_error("unknown dtype " + dtype);
        return PlanDict(PlanOrThrow(g, dt, workspace_limit, workers));
      },
      py::arg("input_shape"), py::arg("filter_shape"), py::arg("strides"), py::arg("padding"),
      py::arg("explicit_paddings"), py::arg("data_format"), py::arg("dilations"),
      py::arg("dtype") = "float32", py::arg("workspace_limit") = 0, py::arg("workers") = 1,
      "The FFT plan (tiles, chunk, exact workspace bytes) the forward pass would use; "
      "raises ValueError stating the minimum workspace when the limit is too small.");
  m.def("fft_forward", &FftForwardNumpy, py::arg("input"), py::arg("filter"),
        py::arg("strides"), py::arg("padding"), py::arg("explicit_paddings"),
        py::arg("data_format"), py::arg("dilations"), py::arg("out") = py::none(),
        py::arg("workspace_limit") = 0, py::arg("num_threads") = 0, py::arg("dtype") = "",
        "FFT forward convolution on numpy arrays with a workspace of exactly the planned size.");
  m.def("free_host_memory", &FreeHostMemoryBytes);
  m.def("default_workspace_budget", &DefaultHostWorkspaceBudget);
  m.def("supported_isas", [] {
    std::vector<std::string> v;
    for (Isa i : SupportedIsas()) v.push_back(IsaName(i));
    return v;
  });
  m.def("active_isa", [] { return std::string(IsaName(ActiveIsa())); });
}
