#include "plan.h"

#include <algorithm>
#include <sstream>
#include <utility>
#include <vector>

#include "checked_math.h"
#include "direct_cpu.h"
#include "gpu_estimate.h"
#include "isa.h"

namespace tfbigconv {
namespace {

// The direct kernel's work in its two rate classes, {compute-bound flops,
// load-bound flops} (cost_model.h). A column tile of one or two output
// channels is load-bound (one vector load per one or two FMAs): its flops are
// counted per channel at the load-bound rate. Lanes padding a row or the
// channels do no work, double-precision vectors hold half the lanes, and the
// ParallelFor's static split leaves workers idle in the last wave of tasks
// (a filter gradient with one task runs on one thread).
std::pair<double, double> DirectFlops(const DirectBlocking& b, const ConvGeometry& g, DType dtype,
                                      int workers) {
  const int64_t w = std::max(workers, 1);
  const int64_t tasks = std::max<int64_t>(b.tasks, 1);
  const double waves = double(CeilDiv(tasks, w) * w) / double(tasks);
  double flops = 2.0 * double(g.macs()) * waves / b.lane_utilization;
  if (dtype == DType::kDouble) flops *= 2;
  // The groups kernel loads a panel vector and a filter vector per FMA (no
  // reuse across channels), so it runs at the load-bound rate; the column
  // kernel with C channels reuses each panel load C times.
  if (b.group_vectors) return {0, flops};
  const bool load_bound = !b.channel_vectors && b.channels_per_tile < 3;
  if (load_bound) return {0, flops / std::max(b.channels_per_tile, 1)};
  return {flops, 0};
}

}  // namespace

Status ChooseAlgorithm(const ConvGeometry& g, DType dtype, AlgorithmRequest requested,
                       int64_t limit, int workers, AlgorithmChoice* c) {
  using R = AlgorithmRequest;
  if (requested == R::kTf)
    return Status::InvalidArgument("algorithm must be 'auto', 'direct' or 'fft', got 'tf'");
  const std::string name = AlgorithmRequestName(requested);
  const CostModel m = ActiveCostModel();
  *c = AlgorithmChoice();
  const int64_t operands = OperandBytes(g, dtype);
  if (g.no_work()) {
    // An empty output, or zeros to write (DirectConv and FftConv do that
    // before any blocking or plan): either algorithm runs without workspace.
    for (Estimate* e : {&c->direct, &c->fft}) {
      e->available = e->fits = true;
      e->peak_bytes = operands;
      e->note = "nothing to compute: empty tensors";
    }
    c->direct.terms = {0, 0, double(g.output_elements()), 0, 1};
    c->direct.seconds = m.direct_seconds_per_output * double(g.output_elements()) +
                        m.direct_seconds_per_call;
    c->fft.terms = {0, 0, 0, double(g.output_elements()), 1};
    c->fft.seconds = m.fft_seconds_per_element * double(g.output_elements()) +
                     m.fft_seconds_per_call;
    c->algorithm = requested == R::kFft ? Algorithm::kFft : Algorithm::kDirect;
    c->reason = requested == R::kAuto ? "auto: direct, nothing to compute" : name + " requested";
    return Status::Ok();
  }
  Estimate& d = c->direct;
  d.available = true;
  const DirectBlocking blocking = DirectConvBlocking(g, dtype, ActiveIsa(), workers);
  d.workspace_bytes = SatMul(blocking.scratch_bytes_per_worker, std::max(workers, 1));
  d.fits = d.workspace_bytes <= limit;
  const auto [compute_flops, load_bound_flops] = DirectFlops(blocking, g, dtype, workers);
  d.terms = {compute_flops, load_bound_flops, double(g.output_elements()),
             double(blocking.packed_elements), 1};
  d.seconds = d.terms[0] / m.direct_flops_per_second +
              d.terms[1] / m.direct_load_bound_flops_per_second +
              m.direct_seconds_per_output * d.terms[2] + m.direct_seconds_per_packed * d.terms[3] +
              m.direct_seconds_per_call;
  d.peak_bytes = SatAdd(operands, d.workspace_bytes);
  d.note = "scratch per thread";
  Estimate& f = c->fft;
  // A requested direct pass (the kernels' hot path) needs no FFT plan.
  const std::string fft_err = requested == R::kDirect ? "not planned: direct requested"
                                                    : PlanFft(g, dtype, limit, workers, &c->fft_plan);
  f.available = f.fits = fft_err.empty();
  if (f.fits) {
    const double elements =
        double(g.batch * g.in[kD] * g.in[kH] * g.in[kW] * g.in_c + g.output_elements());
    const FftPlan& fp = c->fft_plan;
    f.terms = {fp.transform_flops, fp.mix_flops, fp.bytes, elements, 1};
    f.seconds = fp.cost + m.fft_seconds_per_element * elements + m.fft_seconds_per_call;
    f.workspace_bytes = fp.workspace_bytes;
    f.peak_bytes = SatAdd(operands, f.workspace_bytes);
    std::ostringstream os;
    os << "tile ";
    if (g.is_3d()) os << fp.tile_d << "x";
    os << fp.tile_h << "x" << fp.tile_w << " (FFT ";
    if (g.is_3d()) os << fp.fft_d << "x";
    os << fp.fft_h << "x" << fp.fft_w
       << "), chunk " << fp.chunk << " of " << fp.items << " items";
    f.note = os.str();
  } else {
    f.note = fft_err;
  }
  if (requested == R::kFft) {
    if (!f.fits) return Status::ResourceExhausted(fft_err);
    c->algorithm = Algorithm::kFft;
    c->reason = "fft requested";
  } else if (requested == R::kDirect) {
    if (!d.fits)
      return Status::ResourceExhausted("the direct algorithm needs " +
                                       std::to_string(d.workspace_bytes) +
                                       " bytes of scratch, but the limit is " +
                                       std::to_string(limit) + " bytes");
    c->reason = "direct requested";
  } else if (!d.fits && !f.fits) {
    return Status::ResourceExhausted("no algorithm fits the workspace limit of " +
                                     std::to_string(limit) + " bytes: direct needs " +
                                     std::to_string(d.workspace_bytes) + " bytes; " + fft_err);
  } else {
    const bool fft = f.fits && (!d.fits || f.seconds < d.seconds);
    c->algorithm = fft ? Algorithm::kFft : Algorithm::kDirect;
    c->reason = std::string("auto: ") + AlgorithmName(c->algorithm) + " is the fastest that fits";
  }
  return Status::Ok();
}

Status PlanPass(const ConvGeometry& ug, Pass pass, DType dtype, Device device,
                AlgorithmRequest requested, int64_t limit, int workers, const TfCandidate& tf,
                PassPlan* out) {
  using R = AlgorithmRequest;
  PassPlan p;
  p.pass = pass;
  p.device = device;
  p.limit = limit;
  p.tf_kernel = tf.kernel;
  const ConvProblem problem = PassProblem(ug, pass);
  Status err;
  Algorithm ours = Algorithm::kDirect;
  if (device == Device::kCpu) {
    AlgorithmChoice c;
    err = ChooseAlgorithm(problem.g, dtype, requested == R::kTf ? R::kAuto : requested, limit,
                          workers, &c);
    p.direct = c.direct;
    p.fft = c.fft;
    p.fft_plan = c.fft_plan;
    ours = c.algorithm;
  } else {
    ours = GpuOursEstimates(problem, dtype, ug, limit, &p.direct, &p.fft);
    if (requested == R::kFft && !p.fft.fits)
      err = Status::ResourceExhausted("the GPU fft needs a workspace of at least " +
                                      FormatBytes(p.fft.workspace_bytes) + ", but the limit is " +
                                      FormatBytes(limit));
    if (requested == R::kFft) ours = Algorithm::kFft;
    if (requested == R::kDirect) ours = Algorithm::kDirect;
  }
  p.tf = TfEstimate(ug, pass, dtype, device, tf, limit, workers);
  if (!tf.note.empty()) p.tf.note = tf.note;
  const Estimate& t = p.tf;
  // auto may pick TF's kernel where it runs, fits, and its estimate is trusted.
  const bool tf_eligible = t.available && t.fits && tf.estimate_trusted;
  if (requested == R::kTf) {
    if (!t.available) return Status::Unavailable("algorithm 'tf' is not available: " + t.note);
    p.chosen = R::kTf;
    p.reason = "tf requested";
  } else if (!err.ok()) {
    if (requested != R::kAuto || !tf_eligible) return err;
    p.chosen = R::kTf;
    p.reason = "auto: tf, the only algorithm that fits";
  } else {
    p.chosen = RequestOf(ours);
    const Estimate& ours_e = ours == Algorithm::kFft ? p.fft : p.direct;
    // A tie goes to TF's kernel (on the GPU, small problems all estimate at
    // their launch floors, and cuDNN is then the safer pick).
    if (requested == R::kAuto && tf_eligible && t.seconds <= ours_e.seconds) p.chosen = R::kTf;
    const std::string chosen = AlgorithmRequestName(p.chosen);
    p.reason = requested == R::kAuto ? "auto: " + chosen + " is the fastest that fits"
                                     : chosen + " requested";
  }
  if (requested == R::kAuto) {
    // Name the runners-up and why the others were out.
    std::ostringstream os;
    os << p.reason << " (est. ";
    bool first = true;
    for (const auto& [name, e] :
         {std::pair<std::string, const Estimate*>{TfKernelName(tf.kernel), &p.tf},
          {"direct", &p.direct}, {"fft", &p.fft}}) {
      os << (first ? "" : ", ") << name << " ";
      first = false;
      if (!e->available && e == &p.tf) os << "unavailable";
      else if (!e->fits) os << "needs " << FormatBytes(e->workspace_bytes) << " > limit " << FormatBytes(limit);
      else if (e == &p.tf && !tf.estimate_trusted) os << FormatSeconds(e->seconds) << " untrusted";
      else os << FormatSeconds(e->seconds);
    }
    os << ")";
    p.reason = os.str();
  }
  *out = p;
  return Status::Ok();
}

}  // namespace tfbigconv
