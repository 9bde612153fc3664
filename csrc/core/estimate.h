// One candidate algorithm's estimate for one pass (what explain() shows), and
// the operands' bytes every estimate's peak counts.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "checked_math.h"
#include "dtypes.h"
#include "geometry.h"

namespace tfbigconv {

// One candidate algorithm for one pass, as explain() shows it.
struct Estimate {
  bool available = false;   // tf: TF runs this case; fft: a plan fits
  bool fits = false;        // workspace within the limit
  double seconds = 0;
  int64_t workspace_bytes = 0;
  int64_t peak_bytes = 0;   // operands (input, filter, output) + workspace
  std::string note;         // why it is unavailable, or what the plan is
  // The model's inputs, before its constants (for calibration): CPU direct
  // {2 macs / efficiency, output elements, packed elements, 1}; CPU fft
  // {transform flops, mix flops, bytes, input + output elements, 1}; CPU tf
  // {2 macs * dtype slowdown, filter side, channels}; GPU {work, features...}.
  std::vector<double> terms;
};

// Bytes of the input, filter and output, saturating.
inline int64_t OperandBytes(const ConvGeometry& g, DType dtype) {
  // Each tensor's bytes fit (ComputeConvGeometry checks); their sum may not.
  const int64_t in = g.batch * g.in[kD] * g.in[kH] * g.in[kW] * g.in_c;
  const int64_t filter = g.filter[kD] * g.filter[kH] * g.filter[kW] * g.filter_in_c * g.out_c;
  return SatAdd(SatAdd(in * DTypeBytes(dtype), filter * DTypeBytes(dtype)),
                g.output_elements() * DTypeBytes(dtype));
}

}  // namespace tfbigconv
