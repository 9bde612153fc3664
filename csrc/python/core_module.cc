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
#include "fft_cpu_floor.h"
#include "fft_sizes.h"
#include "memory_info.h"
#include "plan.h"
#include "geometry.h"
#include "isa.h"
#include "parallel.h"
#include "run_cpu.h"

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

// The arguments that pose a convolution, as conv_geometry, direct_blocking,
// fft_plan, plan_pass and gpu_terms take them first: GEOMETRY_PARAMS declares
// them, GEOMETRY_ARGS passes them on and GEOMETRY_PY_ARGS names them for Python.
#define GEOMETRY_PARAMS                                                              \
  const std::vector<int64_t>& input_shape, const std::vector<int64_t>& filter_shape, \
      const std::vector<int64_t>& strides, const std::string& padding,               \
      const std::vector<int64_t>& explicit_paddings, const std::string& data_format, \
      const std::vector<int64_t>& dilations
#define GEOMETRY_ARGS                                                                    \
  input_shape, filter_shape, strides, padding, explicit_paddings, data_format, dilations
#define GEOMETRY_PY_ARGS                                                                   \
  py::arg("input_shape"), py::arg("filter_shape"), py::arg("strides"), py::arg("padding"), \
      py::arg("explicit_paddings"), py::arg("data_format"), py::arg("dilations")

// Validated geometry of those arguments.
ConvGeometry GeometryOf(GEOMETRY_PARAMS) {
  return Geometry(input_shape, filter_shape,
                  MakeAttrs(strides, padding, explicit_paddings, data_format, dilations));
}

// "" means the active variant. Whether this CPU can run it is checked where
// it is used (PickIsa, RunConvCpu).
Isa ParseIsaName(const std::string& name) {
  if (name.empty()) return ActiveIsa();
  Isa isa;
  if (!ParseIsa(name, &isa)) throw py::value_error("isa must be baseline, avx2 or avx512, got " + name);
  return isa;
}

// For the direct kernel's blocking: a variant this CPU can run.
Isa PickIsa(const std::string& name) {
  const Isa isa = ParseIsaName(name);
  const Status s = CheckIsaSupported(isa);
  if (!s.ok()) throw py::value_error(s.message());
  return isa;
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

DType DTypeFromName(const std::string& name) {
  DType t;
  if (!ParseDType(name.c_str(), &t))
    throw py::value_error("dtype must be float16, bfloat16, float32 or float64, got " + name);
  return t;
}

bool Dense(const py::array& a) {
  return (a.flags() & py::array::c_style) != 0;
}

int64_t BudgetOrDefault(int64_t workspace_limit) {
  if (workspace_limit < 0) throw py::value_error("workspace_limit must be non-negative");
  return workspace_limit > 0 ? workspace_limit : DefaultHostWorkspaceBudget();
}

FftPlan PlanOrThrow(const ConvGeometry& g, DType dtype, int64_t workspace_limit, int workers) {
  FftPlan plan;
  const std::string err = PlanFft(g, dtype, BudgetOrDefault(workspace_limit), workers, &plan);
  if (!err.empty()) throw py::value_error(err);
  return plan;
}

// Bad arguments and unavailable algorithms raise ValueError; a workspace that
// does not fit, or a failed launch, raises RuntimeError (Python maps them to
// TF's errors).
void ThrowIfError(const Status& s) {
  if (s.ok()) return;
  if (s.code() == StatusCode::kResourceExhausted || s.code() == StatusCode::kInternal)
    throw std::runtime_error(s.message());
  throw py::value_error(s.message());
}

// An algorithm name from Python as the core's enum (ParseAlgorithmRequest,
// the one parser): ValueError for an unknown name.
AlgorithmRequest RequestOrThrow(const std::string& name) {
  AlgorithmRequest r;
  const std::string err = ParseAlgorithmRequest(name, &r);
  if (!err.empty()) throw py::value_error(err);
  return r;
}

Pass PassFromName(const std::string& name) {
  for (Pass p : {Pass::kForward, Pass::kBackpropInput, Pass::kBackpropFilter})
    if (name == PassName(p)) return p;
  throw py::value_error("pass must be forward, backprop_input or backprop_filter, got " + name);
}

std::vector<int64_t> Shape(const py::array& a) {
  return std::vector<int64_t>(a.shape(), a.shape() + a.ndim());
}

// Runs one pass of a convolution on numpy arrays with RunConvCpu, the launch
// the TF op uses. pass: "forward" (a = input, b = filter), "backprop_input"
// (a = out_backprop, b = filter, sizes = input shape) or "backprop_filter"
// (a = input, b = out_backprop, sizes = filter shape). `out`, if given, must
// have the result's shape and dtype and is overwritten; the FFT workspace is
// exactly the planned size, NaN-poisoned.
py::array RunPass(const std::string& algorithm, const std::string& pass, py::array a, py::array b,
                  const std::vector<int64_t>& sizes, const std::vector<int64_t>& strides,
                  const std::string& padding, const std::vector<int64_t>& explicit_paddings,
                  const std::string& data_format, const std::vector<int64_t>& dilations,
                  py::object out, const std::string& isa, int64_t workspace_limit,
                  int num_threads, const std::string& dtype) {
  const ConvAttrs attrs = MakeAttrs(strides, padding, explicit_paddings, data_format, dilations);
  if (!a.dtype().is(b.dtype())) throw py::value_error("operand dtypes differ");
  if (!Dense(a) || !Dense(b)) throw py::value_error("operands must be C-contiguous");
  const DType dt = PickDType(a, dtype);
  ConvProblem problem;
  std::vector<int64_t> result_shape;
  if (pass == "forward") {
    problem = ForwardProblem(Geometry(Shape(a), Shape(b), attrs));
    result_shape = problem.g.output_shape();
  } else if (pass == "backprop_input" || pass == "backprop_filter") {
    const bool bpi = pass == "backprop_input";
    const ConvGeometry g = bpi ? Geometry(sizes, Shape(b), attrs) : Geometry(Shape(a), sizes, attrs);
    if (Shape(bpi ? a : b) != g.output_shape())
      throw py::value_error("out_backprop has the wrong shape for this convolution");
    problem = bpi ? BackpropInputProblem(g) : BackpropFilterProblem(g);
    result_shape = sizes;
  } else {
    throw py::value_error("pass must be forward, backprop_input or backprop_filter");
  }
  py::array result;
  if (out.is_none()) {
    result = py::array(a.dtype(), std::vector<py::ssize_t>(result_shape.begin(), result_shape.end()));
  } else {
    result = out.cast<py::array>();
    if (Shape(result) != result_shape || !result.dtype().is(a.dtype()) || !Dense(result) ||
        !result.writeable())
      throw py::value_error("out must be a writeable C-contiguous array of the result's shape and dtype");
  }
  AlgorithmChoice choice;
  AlgorithmRequest requested;
  if (!ParseAlgorithmRequest(algorithm, &requested).empty() ||
      (requested != AlgorithmRequest::kDirect && requested != AlgorithmRequest::kFft))
    throw py::value_error("algorithm must be direct or fft");
  choice.algorithm = requested == AlgorithmRequest::kFft ? Algorithm::kFft : Algorithm::kDirect;
  const Isa chosen_isa = ParseIsaName(isa);
  const ParallelFor pf = StdThreadParallelFor(num_threads);
  const ConvGeometry& g = problem.g;
  if (g.output_elements() == 0) return result;
  // Zeros to write need no plan (RunConvCpu writes them first).
  if (choice.algorithm == Algorithm::kFft && !g.empty_sums())
    choice.fft_plan = PlanOrThrow(g, dt, workspace_limit, pf.num_workers());
  std::vector<double> workspace((choice.fft_plan.workspace_bytes + 7) / 8,
                                std::numeric_limits<double>::quiet_NaN());
  Status status;
  {
    py::gil_scoped_release release;
    status = RunConvCpu(problem, dt, choice, a.data(), b.data(), result.mutable_data(),
                        workspace.empty() ? nullptr : workspace.data(), pf, chosen_isa);
  }
  ThrowIfError(status);
  return result;
}

LaneBackpropPlan LanePlanOrThrow(const ConvGeometry& g, DType dtype, int64_t workspace_limit,
                                 int workers) {
  LaneBackpropPlan plan;
  const std::string why = PlanLaneBackprop(g, dtype, BudgetOrDefault(workspace_limit), workers, &plan);
  if (!why.empty()) throw py::value_error("the fused backward does not serve this case: " + why);
  return plan;
}

// Both gradients at once (RunLaneBackpropCpu): (dx, dw).
py::tuple RunLaneBackprop(py::array x, py::array w, py::array dy,
                          const std::vector<int64_t>& strides, const std::string& padding,
                          const std::vector<int64_t>& explicit_paddings,
                          const std::string& data_format, const std::vector<int64_t>& dilations,
                          int64_t workspace_limit, int num_threads, const std::string& dtype) {
  const ConvAttrs attrs = MakeAttrs(strides, padding, explicit_paddings, data_format, dilations);
  if (!x.dtype().is(w.dtype()) || !x.dtype().is(dy.dtype()))
    throw py::value_error("operand dtypes differ");
  if (!Dense(x) || !Dense(w) || !Dense(dy)) throw py::value_error("operands must be C-contiguous");
  const DType dt = PickDType(x, dtype);
  const ConvGeometry g = Geometry(Shape(x), Shape(w), attrs);
  if (Shape(dy) != g.output_shape())
    throw py::value_error("out_backprop has the wrong shape for this convolution");
  const ParallelFor pf = StdThreadParallelFor(num_threads);
  const LaneBackpropPlan plan = LanePlanOrThrow(g, dt, workspace_limit, pf.num_workers());
  py::array dx(x.dtype(), std::vector<py::ssize_t>(x.shape(), x.shape() + x.ndim()));
  py::array dw(w.dtype(), std::vector<py::ssize_t>(w.shape(), w.shape() + w.ndim()));
  std::vector<double> workspace((plan.workspace_bytes + 7) / 8,
                                std::numeric_limits<double>::quiet_NaN());
  Status status;
  {
    py::gil_scoped_release release;
    status = RunLaneBackpropCpu(g, dt, plan, x.data(), w.data(), dy.data(), dx.mutable_data(),
                                dw.mutable_data(), workspace.empty() ? nullptr : workspace.data(),
                                pf);
  }
  ThrowIfError(status);
  return py::make_tuple(dx, dw);
}

// The core's structs as read-only Python classes: the fields Python reads,
// by the names it reads them (per axis: _d, _h, _w; depth is 1 in 2-D).
void BindTypes(py::module_& m) {
  py::class_<ConvGeometry>(m, "ConvGeometry")
      .def_readonly("batch", &ConvGeometry::batch)
      .def_readonly("in_c", &ConvGeometry::in_c)
      .def_readonly("filter_in_c", &ConvGeometry::filter_in_c)
      .def_readonly("out_c", &ConvGeometry::out_c)
      .def_readonly("groups", &ConvGeometry::groups)
#define TFBIGCONV_AXIS(name, field, axis) \
  .def_property_readonly(name, [](const ConvGeometry& g) { return g.field[axis]; })
      TFBIGCONV_AXIS("in_d", in, kD) TFBIGCONV_AXIS("in_h", in, kH) TFBIGCONV_AXIS("in_w", in, kW)
      TFBIGCONV_AXIS("filter_d", filter, kD) TFBIGCONV_AXIS("filter_h", filter, kH)
      TFBIGCONV_AXIS("filter_w", filter, kW)
      TFBIGCONV_AXIS("out_d", out, kD) TFBIGCONV_AXIS("out_h", out, kH) TFBIGCONV_AXIS("out_w", out, kW)
      TFBIGCONV_AXIS("stride_d", stride, kD) TFBIGCONV_AXIS("stride_h", stride, kH)
      TFBIGCONV_AXIS("stride_w", stride, kW)
      TFBIGCONV_AXIS("dilation_d", dilation, kD) TFBIGCONV_AXIS("dilation_h", dilation, kH)
      TFBIGCONV_AXIS("dilation_w", dilation, kW)
      TFBIGCONV_AXIS("pad_front", pad_before, kD) TFBIGCONV_AXIS("pad_back", pad_after, kD)
      TFBIGCONV_AXIS("pad_top", pad_before, kH) TFBIGCONV_AXIS("pad_bottom", pad_after, kH)
      TFBIGCONV_AXIS("pad_left", pad_before, kW) TFBIGCONV_AXIS("pad_right", pad_after, kW)
#undef TFBIGCONV_AXIS
      .def_property_readonly("output_shape", &ConvGeometry::output_shape)
      .def_property_readonly("macs", &ConvGeometry::macs)
      .def("__repr__", [](const ConvGeometry& g) {
        std::string r = "ConvGeometry(batch=" + std::to_string(g.batch) + ", in=[";
        for (int a = 0; a < kSpatialAxes; ++a) r += (a ? ", " : "") + std::to_string(g.in[a]);
        r += "], filter=[";
        for (int a = 0; a < kSpatialAxes; ++a) r += (a ? ", " : "") + std::to_string(g.filter[a]);
        return r + "], in_c=" + std::to_string(g.in_c) + ", out_c=" + std::to_string(g.out_c) +
               ", groups=" + std::to_string(g.groups) + ")";
      });
  py::class_<FftPlan>(m, "FftPlan")
      .def_readonly("tile_d", &FftPlan::tile_d)
      .def_readonly("tile_h", &FftPlan::tile_h)
      .def_readonly("tile_w", &FftPlan::tile_w)
      .def_readonly("fft_d", &FftPlan::fft_d)
      .def_readonly("fft_h", &FftPlan::fft_h)
      .def_readonly("fft_w", &FftPlan::fft_w)
      .def_readonly("tiles_d", &FftPlan::tiles_d)
      .def_readonly("tiles_h", &FftPlan::tiles_h)
      .def_readonly("tiles_w", &FftPlan::tiles_w)
      .def_readonly("items", &FftPlan::items)
      .def_readonly("chunk", &FftPlan::chunk)
      .def_readonly("workers", &FftPlan::workers)
      .def_readonly("filter_spectra_bytes", &FftPlan::filter_spectra_bytes)
      .def_readonly("item_spectra_bytes", &FftPlan::item_spectra_bytes)
      .def_readonly("worker_bytes", &FftPlan::worker_bytes)
      .def_readonly("fused_mix", &FftPlan::fused_mix)
      .def_readonly("ci_block", &FftPlan::ci_block)
      .def_readonly("stage_planes", &FftPlan::stage_planes)
      .def_readonly("lanes", &FftPlan::lanes)
      .def_readonly("workspace_bytes", &FftPlan::workspace_bytes)
      .def_readonly("transform_flops", &FftPlan::transform_flops)
      .def_readonly("mix_flops", &FftPlan::mix_flops)
      .def_readonly("bytes", &FftPlan::bytes)
      .def_readonly("cost", &FftPlan::cost);
  py::class_<LaneBackpropPlan>(m, "LaneBackpropPlan")
      .def_readonly("fft_w", &LaneBackpropPlan::fft_w)
      .def_readonly("stage_planes", &LaneBackpropPlan::stage_planes)
      .def_readonly("workers", &LaneBackpropPlan::workers)
      .def_readonly("worker_bytes", &LaneBackpropPlan::worker_bytes)
      .def_readonly("workspace_bytes", &LaneBackpropPlan::workspace_bytes);
  py::class_<DirectBlocking>(m, "DirectBlocking")
      .def_readonly("channel_vectors", &DirectBlocking::channel_vectors)
      .def_readonly("group_vectors", &DirectBlocking::group_vectors)
      .def_readonly("narrow_pixels", &DirectBlocking::narrow_pixels)
      .def_readonly("group_block", &DirectBlocking::group_block)
      .def_readonly("channels_per_tile", &DirectBlocking::channels_per_tile)
      .def_readonly("task_rows", &DirectBlocking::task_rows)
      .def_readonly("image_block", &DirectBlocking::image_block)
      .def_readonly("ci_block", &DirectBlocking::ci_block)
      .def_readonly("kh_block", &DirectBlocking::kh_block)
      .def_readonly("tasks", &DirectBlocking::tasks)
      .def_readonly("scratch_bytes_per_worker", &DirectBlocking::scratch_bytes_per_worker);
  py::class_<Estimate>(m, "Estimate")
      .def_readonly("available", &Estimate::available)
      .def_readonly("fits", &Estimate::fits)
      .def_readonly("seconds", &Estimate::seconds)
      .def_readonly("workspace_bytes", &Estimate::workspace_bytes)
      .def_readonly("peak_bytes", &Estimate::peak_bytes)
      .def_readonly("note", &Estimate::note)
      .def_readonly("terms", &Estimate::terms);
  py::class_<PassPlan>(m, "PassPlan")
      .def_property_readonly("pass_", [](const PassPlan& p) { return std::string(PassName(p.pass)); })
      .def_property_readonly("device", [](const PassPlan& p) { return std::string(DeviceName(p.device)); })
      .def_readonly("limit", &PassPlan::limit)
      .def_property_readonly("tf_kernel",
                             [](const PassPlan& p) { return std::string(TfKernelName(p.tf_kernel)); })
      .def_readonly("tf", &PassPlan::tf)
      .def_readonly("direct", &PassPlan::direct)
      .def_readonly("fft", &PassPlan::fft)
      .def_readonly("fft_plan", &PassPlan::fft_plan)
      .def_property_readonly("chosen",
                             [](const PassPlan& p) { return std::string(AlgorithmRequestName(p.chosen)); })
      .def_readonly("reason", &PassPlan::reason);
}

// One timing of a pass's floor (fft_floor) and the plan it timed.
struct FftFloor {
  FftFloorTiming timing;
  py::object plan;
};

}  // namespace

PYBIND11_MODULE(_core, m) {
  m.doc() = "tfbigconv core: geometry and CPU kernels on numpy arrays (no TensorFlow).";
  BindTypes(m);
  m.def(
      "conv_geometry",
      [](GEOMETRY_PARAMS) { return GeometryOf(GEOMETRY_ARGS); },
      GEOMETRY_PY_ARGS,
      "Validated geometry of a convolution (a ConvGeometry); raises ValueError naming the bad argument.");
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
      "direct_blocking",
      [](GEOMETRY_PARAMS, const std::string& dtype, const std::string& isa,
         const std::string& pass, int workers) {
        const ConvGeometry g = GeometryOf(GEOMETRY_ARGS);
        return DirectConvBlocking(PassProblem(g, PassFromName(pass)).g, DTypeFromName(dtype),
                                  PickIsa(isa), StdThreadParallelFor(workers).num_workers());
      },
      GEOMETRY_PY_ARGS,
      py::arg("dtype") = "float32", py::arg("isa") = "", py::arg("pass_") = "forward",
      py::arg("workers") = 0,
      "The direct kernel's blocking of one pass of the (forward) convolution, for workers "
      "threads (0: as run_pass's num_threads=0, the hardware's).");
  m.def("run_pass", &RunPass, py::arg("algorithm"), py::arg("pass_"), py::arg("a"),
        py::arg("b"), py::arg("sizes"), py::arg("strides"), py::arg("padding"),
        py::arg("explicit_paddings"), py::arg("data_format"), py::arg("dilations"),
        py::arg("out") = py::none(), py::arg("isa") = "", py::arg("workspace_limit") = 0,
        py::arg("num_threads") = 0, py::arg("dtype") = "",
        "One pass (forward, backprop_input, backprop_filter) with algorithm direct or fft. "
        "bfloat16 data is passed as uint16 arrays with dtype='bfloat16'.");
  m.def(
      "fft_plan",
      [](GEOMETRY_PARAMS, const std::string& dtype, int64_t workspace_limit, int workers) {
        const ConvGeometry g = GeometryOf(GEOMETRY_ARGS);
        return PlanOrThrow(g, DTypeFromName(dtype), workspace_limit, workers);
      },
      GEOMETRY_PY_ARGS,
      py::arg("dtype") = "float32", py::arg("workspace_limit") = 0, py::arg("workers") = 1,
      "The FFT plan (tiles, chunk, exact workspace bytes) the forward pass would use; "
      "raises ValueError stating the minimum workspace when the limit is too small.");
  m.def(
      "lane_backprop_plan",
      [](GEOMETRY_PARAMS, const std::string& dtype, int64_t workspace_limit, int workers) {
        return LanePlanOrThrow(GeometryOf(GEOMETRY_ARGS), DTypeFromName(dtype), workspace_limit,
                               workers);
      },
      GEOMETRY_PY_ARGS,
      py::arg("dtype") = "float32", py::arg("workspace_limit") = 0, py::arg("workers") = 1,
      "The fused backward's plan (both gradients of a 1-D depthwise convolution from one "
      "transform of dL/doutput); ValueError saying why where it does not serve the case.");
  m.def("run_lane_backprop", &RunLaneBackprop, py::arg("x"), py::arg("w"), py::arg("dy"),
        py::arg("strides"), py::arg("padding"), py::arg("explicit_paddings"),
        py::arg("data_format"), py::arg("dilations"), py::arg("workspace_limit") = 0,
        py::arg("num_threads") = 0, py::arg("dtype") = "",
        "Both gradients (dx, dw) of a 1-D depthwise convolution with the fused backward; "
        "ValueError where it does not serve the case.");
  m.def(
      "plan_pass",
      [](GEOMETRY_PARAMS, const std::string& pass, const std::string& dtype,
         const std::string& device, const std::string& algorithm, int64_t workspace_limit,
         int workers, const std::string& tf_kernel, bool tf_trusted, const std::string& tf_note,
         bool tf_onednn) {
        const ConvGeometry g = GeometryOf(GEOMETRY_ARGS);
        if (device != "CPU" && device != "GPU")
          throw py::value_error("device must be 'CPU' or 'GPU', got '" + device + "'");
        TfCandidate tf;
        if (tf_kernel == "Conv2D") tf.kernel = TfKernel::kConv2D;
        else if (tf_kernel == "DepthwiseConv2dNative") tf.kernel = TfKernel::kDepthwiseConv2dNative;
        else if (tf_kernel == "Conv3D") tf.kernel = TfKernel::kConv3D;
        else if (!tf_kernel.empty())
          throw py::value_error(
              "tf_kernel must be '', 'Conv2D', 'DepthwiseConv2dNative' or 'Conv3D'");
        tf.estimate_trusted = tf_trusted;
        tf.note = tf_note;
        tf.onednn = tf_onednn;
        // The GPU budget is the caller's (TF's allocator); 0 means unknown.
        const int64_t limit = device == "GPU" ? (workspace_limit > 0 ? workspace_limit : std::numeric_limits<int64_t>::max())
                                              : BudgetOrDefault(workspace_limit);
        const Pass ps = PassFromName(pass);
        const DType dt = DTypeFromName(dtype);
        const AlgorithmRequest requested = RequestOrThrow(algorithm);
        PassPlan p;
        ThrowIfError(PlanPass(g, ps, dt, device == "GPU" ? Device::kGpu : Device::kCpu, requested,
                              limit, workers, tf, &p));
        return p;
      },
      GEOMETRY_PY_ARGS,
      py::arg("pass_"), py::arg("dtype"), py::arg("device"), py::arg("algorithm"),
      py::arg("workspace_limit"), py::arg("workers"), py::arg("tf_kernel"),
      py::arg("tf_trusted") = true, py::arg("tf_note") = "", py::arg("tf_onednn") = false,
      "Every algorithm's estimate for one pass of the forward geometry on a device, and the "
      "choice. tf_kernel names TensorFlow's kernel for the case ('' if TF cannot run it); "
      "tf_onednn: TF runs it through oneDNN (its workspace differs). "
      "ValueError for bad arguments or an algorithm that cannot run the case; RuntimeError "
      "when nothing requested fits the workspace limit (the message states the minimum).");
  m.def(
      "gpu_terms",
      [](GEOMETRY_PARAMS, const std::string& pass, const std::string& candidate) {
        const ConvGeometry ug = GeometryOf(GEOMETRY_ARGS);
        AlgorithmRequest r;
        if (!ParseAlgorithmRequest(candidate, &r).empty() || r == AlgorithmRequest::kAuto)
          throw py::value_error("candidate must be tf, direct or fft");
        const GpuCandidate c = r == AlgorithmRequest::kTf       ? GpuCandidate::kTf
                               : r == AlgorithmRequest::kDirect ? GpuCandidate::kDirect
                                                                : GpuCandidate::kFft;
        const Pass ps = PassFromName(pass);
        const ConvGeometry g = c == GpuCandidate::kTf ? ug : PassProblem(ug, ps).g;
        const GpuModelTerms t = GpuTerms(g, c);
        return py::make_tuple(t.work, std::vector<double>(t.features, t.features + kGpuFeatures));
      },
      GEOMETRY_PY_ARGS,
      py::arg("pass_"), py::arg("candidate"),
      "(work, features) of the GPU cost model for one candidate and pass (for fitting).");
  m.def("cost_model_fields", &CostModelFields);
  m.def("get_cost_model", [] { return CostModelValues(ActiveCostModel()); });
  m.def("default_cost_model", [] { return CostModelValues(CostModel()); },
        "The built-in constants (cost_model.h), in cost_model_fields() order.");
  m.def(
      "set_cost_model",
      [](const std::vector<double>& values) {
        const std::string err = SetActiveCostModelValues(values);
        if (!err.empty()) throw py::value_error(err);
      },
      "Sets this module's cost model (values in cost_model_fields() order).");
  m.def("free_host_memory", &FreeHostMemoryBytes);
  m.def("default_workspace_budget", &DefaultHostWorkspaceBudget);
  m.attr("DEFAULT_BUDGET_FRACTION") = kDefaultBudgetFraction;  // of free memory, CPU and GPU
  m.def("supported_isas", [] {
    std::vector<std::string> v;
    for (Isa i : SupportedIsas()) v.push_back(IsaName(i));
    return v;
  });
  m.def("active_isa", [] { return std::string(IsaName(ActiveIsa())); });
  m.def("good_fft_size", &GoodFftSize, py::arg("n"),
        "Smallest size >= n with no prime factor above 7 (the FFT planners' sizes).");
  py::class_<FftFloor>(m, "FftFloor")
      .def_property_readonly("seconds", [](const FftFloor& f) { return f.timing.seconds; })
      .def_property_readonly("flops", [](const FftFloor& f) { return f.timing.flops; })
      .def_property_readonly("transforms", [](const FftFloor& f) { return f.timing.transforms; })
      .def_readonly("plan", &FftFloor::plan);
  m.def(
      "fft_floor",
      [](GEOMETRY_PARAMS, const std::string& pass, const std::string& dtype,
         int64_t workspace_limit, int num_threads, py::object count_filter) {
        const ConvGeometry g = GeometryOf(GEOMETRY_ARGS);
        const DType dt = DTypeFromName(dtype);
        const ParallelFor pf = StdThreadParallelFor(num_threads);
        FftFloor r;
        if (pass == "lane_backprop") {
          const LaneBackpropPlan lp = LanePlanOrThrow(g, dt, workspace_limit, pf.num_workers());
          r.plan = py::cast(lp);
          py::gil_scoped_release release;
          r.timing = TimeLaneBackpropFloor(g, dt, lp, pf);
        } else {
          const Pass ps = PassFromName(pass);
          const ConvGeometry pg = PassProblem(g, ps).g;
          const FftPlan fp = PlanOrThrow(pg, dt, workspace_limit, pf.num_workers());
          r.plan = py::cast(fp);
          // By default the weights' transforms are cached (one per step could serve
          // every pass); dL/doutput's, the filter gradient's filter, never are.
          const bool data = count_filter.is_none() ? ps == Pass::kBackpropFilter
                                                   : count_filter.cast<bool>();
          const FloorFilter filter = data ? FloorFilter::kData : FloorFilter::kCached;
          py::gil_scoped_release release;
          r.timing = TimeFftFloor(pg, dt, fp, filter, pf);
        }
        return r;
      },
      GEOMETRY_PY_ARGS, py::arg("pass_"), py::arg("dtype") = "float32",
      py::arg("workspace_limit") = 0, py::arg("num_threads") = 0,
      py::arg("count_filter") = py::none(),
      "One timing of the floor of one pass of the forward geometry with the plan RunPass "
      "would use (pass_ forward, backprop_input, backprop_filter, or lane_backprop for the "
      "fused 1-D backward): its unavoidable transforms alone (fft_cpu_floor.h). "
      "count_filter: whether the pass problem's filter transforms count (None: in "
      "backprop_filter only; lane_backprop never counts the weights'). "
      "An FftFloor: seconds, flops, transforms and the plan (FftPlan or LaneBackpropPlan).");
}
