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

py::dict GeometryDict(const ConvGeometry& g) {
  py::dict d;
  d["batch"] = g.batch;
  d["in_h"] = g.in[kH];
  d["in_w"] = g.in[kW];
  d["in_c"] = g.in_c;
  d["filter_h"] = g.filter[kH];
  d["filter_w"] = g.filter[kW];
  d["filter_in_c"] = g.filter_in_c;
  d["out_c"] = g.out_c;
  d["groups"] = g.groups;
  d["stride_h"] = g.stride[kH];
  d["stride_w"] = g.stride[kW];
  d["dilation_h"] = g.dilation[kH];
  d["dilation_w"] = g.dilation[kW];
  d["pad_top"] = g.pad_before[kH];
  d["pad_bottom"] = g.pad_after[kH];
  d["pad_left"] = g.pad_before[kW];
  d["pad_right"] = g.pad_after[kW];
  d["out_h"] = g.out[kH];
  d["out_w"] = g.out[kW];
  // Depth: 1 (and no padding) in 2-D.
  d["in_d"] = g.in[kD];
  d["filter_d"] = g.filter[kD];
  d["stride_d"] = g.stride[kD];
  d["dilation_d"] = g.dilation[kD];
  d["pad_front"] = g.pad_before[kD];
  d["pad_back"] = g.pad_after[kD];
  d["out_d"] = g.out[kD];
  d["output_shape"] = g.output_shape();
  d["macs"] = g.macs();
  return d;
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

py::dict PlanDict(const FftPlan& p) {
  py::dict d;
  d["tile_d"] = p.tile_d;
  d["tile_h"] = p.tile_h;
  d["tile_w"] = p.tile_w;
  d["fft_d"] = p.fft_d;
  d["fft_h"] = p.fft_h;
  d["fft_w"] = p.fft_w;
  d["tiles_d"] = p.tiles_d;
  d["tiles_h"] = p.tiles_h;
  d["tiles_w"] = p.tiles_w;
  d["items"] = p.items;
  d["chunk"] = p.chunk;
  d["workers"] = p.workers;
  d["filter_spectra_bytes"] = p.filter_spectra_bytes;
  d["item_spectra_bytes"] = p.item_spectra_bytes;
  d["worker_bytes"] = p.worker_bytes;
  d["fused_mix"] = p.fused_mix;
  d["ci_block"] = p.ci_block;
  d["stage_planes"] = p.stage_planes;
  d["lanes"] = p.lanes;
  d["workspace_bytes"] = p.workspace_bytes;
  d["transform_flops"] = p.transform_flops;
  d["mix_flops"] = p.mix_flops;
  d["bytes"] = p.bytes;
  d["cost"] = p.cost;
  return d;
}

FftPlan PlanOrThrow(const ConvGeometry& g, DType dtype, int64_t workspace_limit, int workers) {
  FftPlan plan;
  const std::string err = PlanFft(g, dtype, BudgetOrDefault(workspace_limit), workers, &plan);
  if (!err.empty()) throw py::value_error(err);
  return plan;
}

py::dict EstimateDict(const Estimate& e) {
  py::dict d;
  d["available"] = e.available;
  d["fits"] = e.fits;
  d["seconds"] = e.seconds;
  d["workspace_bytes"] = e.workspace_bytes;
  d["peak_bytes"] = e.peak_bytes;
  d["note"] = e.note;
  d["terms"] = e.terms;
  return d;
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

py::dict LanePlanDict(const LaneBackpropPlan& p) {
  py::dict d;
  d["fft_w"] = p.fft_w;
  d["stage_planes"] = p.stage_planes;
  d["workers"] = p.workers;
  d["worker_bytes"] = p.worker_bytes;
  d["workspace_bytes"] = p.workspace_bytes;
  return d;
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

}  // namespace

#include "fft_cpu_floor.h"  // fft_floor, the last entry

PYBIND11_MODULE(_core, m) {
  m.doc() = "tfbigconv core: geometry and CPU kernels on numpy arrays (no TensorFlow).";
  m.def(
      "conv_geometry",
      [](GEOMETRY_PARAMS) { return GeometryDict(GeometryOf(GEOMETRY_ARGS)); },
      GEOMETRY_PY_ARGS,
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
      "direct_blocking",
      [](GEOMETRY_PARAMS, const std::string& dtype, const std::string& isa,
         const std::string& pass, int workers) {
        const ConvGeometry g = GeometryOf(GEOMETRY_ARGS);
        const DirectBlocking b =
            DirectConvBlocking(PassProblem(g, PassFromName(pass)).g, DTypeFromName(dtype),
                               PickIsa(isa), StdThreadParallelFor(workers).num_workers());
        py::dict d;
        d["channel_vectors"] = b.channel_vectors;
        d["group_vectors"] = b.group_vectors;
        d["narrow_pixels"] = b.narrow_pixels;
        d["group_block"] = b.group_block;
        d["channels_per_tile"] = b.channels_per_tile;
        d["task_rows"] = b.task_rows;
        d["image_block"] = b.image_block;
        d["ci_block"] = b.ci_block;
        d["kh_block"] = b.kh_block;
        d["tasks"] = b.tasks;
        d["scratch_bytes_per_worker"] = b.scratch_bytes_per_worker;
        return d;
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
        return PlanDict(PlanOrThrow(g, DTypeFromName(dtype), workspace_limit, workers));
      },
      GEOMETRY_PY_ARGS,
      py::arg("dtype") = "float32", py::arg("workspace_limit") = 0, py::arg("workers") = 1,
      "The FFT plan (tiles, chunk, exact workspace bytes) the forward pass would use; "
      "raises ValueError stating the minimum workspace when the limit is too small.");
  m.def(
      "lane_backprop_plan",
      [](GEOMETRY_PARAMS, const std::string& dtype, int64_t workspace_limit, int workers) {
        return LanePlanDict(
            LanePlanOrThrow(GeometryOf(GEOMETRY_ARGS), DTypeFromName(dtype), workspace_limit, workers));
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
         int workers, const std::string& tf_kernel, bool tf_trusted, const std::string& tf_note) {
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
        // The GPU budget is the caller's (TF's allocator); 0 means unknown.
        const int64_t limit = device == "GPU" ? (workspace_limit > 0 ? workspace_limit : std::numeric_limits<int64_t>::max())
                                              : BudgetOrDefault(workspace_limit);
        const Pass ps = PassFromName(pass);
        const DType dt = DTypeFromName(dtype);
        const AlgorithmRequest requested = RequestOrThrow(algorithm);
        PassPlan p;
        ThrowIfError(PlanPass(g, ps, dt, device == "GPU" ? Device::kGpu : Device::kCpu, requested,
                              limit, workers, tf, &p));
        py::dict d;
        d["pass"] = pass;
        d["device"] = device;
        d["limit"] = limit;
        d["tf"] = EstimateDict(p.tf);
        d["tf_kernel"] = std::string(TfKernelName(tf.kernel));
        d["direct"] = EstimateDict(p.direct);
        d["fft"] = EstimateDict(p.fft);
        d["chosen"] = std::string(AlgorithmRequestName(p.chosen));
        d["reason"] = p.reason;
        return d;
      },
      GEOMETRY_PY_ARGS,
      py::arg("pass_"), py::arg("dtype"), py::arg("device"), py::arg("algorithm"),
      py::arg("workspace_limit"), py::arg("workers"), py::arg("tf_kernel"),
      py::arg("tf_trusted") = true, py::arg("tf_note") = "",
      "Every algorithm's estimate for one pass of the forward geometry on a device, and the "
      "choice. tf_kernel names TensorFlow's kernel for the case ('' if TF cannot run it). "
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
  m.def(
      "fft_floor",
      [](GEOMETRY_PARAMS, const std::string& pass, const std::string& dtype,
         int64_t workspace_limit, int num_threads, py::object count_filter) {
        const ConvGeometry g = GeometryOf(GEOMETRY_ARGS);
        const DType dt = DTypeFromName(dtype);
        const ParallelFor pf = StdThreadParallelFor(num_threads);
        FftFloorTiming t;
        py::dict plan;
        if (pass == "lane_backprop") {
          const LaneBackpropPlan lp = LanePlanOrThrow(g, dt, workspace_limit, pf.num_workers());
          plan = LanePlanDict(lp);
          py::gil_scoped_release release;
          t = TimeLaneBackpropFloor(g, dt, lp, pf);
        } else {
          const Pass ps = PassFromName(pass);
          const ConvGeometry pg = PassProblem(g, ps).g;
          const FftPlan fp = PlanOrThrow(pg, dt, workspace_limit, pf.num_workers());
          plan = PlanDict(fp);
          // By default the weights' transforms are cached (one per step could serve
          // every pass); dL/doutput's, the filter gradient's filter, never are.
          const bool data = count_filter.is_none() ? ps == Pass::kBackpropFilter
                                                   : count_filter.cast<bool>();
          const FloorFilter filter = data ? FloorFilter::kData : FloorFilter::kCached;
          py::gil_scoped_release release;
          t = TimeFftFloor(pg, dt, fp, filter, pf);
        }
        py::dict d;
        d["seconds"] = t.seconds;
        d["flops"] = t.flops;
        d["transforms"] = t.transforms;
        d["plan"] = plan;
        return d;
      },
      GEOMETRY_PY_ARGS, py::arg("pass_"), py::arg("dtype") = "float32",
      py::arg("workspace_limit") = 0, py::arg("num_threads") = 0,
      py::arg("count_filter") = py::none(),
      "One timing of the floor of one pass of the forward geometry with the plan RunPass "
      "would use (pass_ forward, backprop_input, backprop_filter, or lane_backprop for the "
      "fused 1-D backward): its unavoidable transforms alone (fft_cpu_floor.h). "
      "count_filter: whether the pass problem's filter transforms count (None: in "
      "backprop_filter only; lane_backprop never counts the weights'). "
      "{seconds, flops, transforms, plan}.");
}
