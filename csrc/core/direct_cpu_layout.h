// The direct kernel's layout: the blocking and scratch sizes of one problem
// for a kernel table, shared by the runner (direct_cpu.cc) and
// DirectConvBlocking. Integer math only.
#pragma once

#include <cstdint>

#include "checked_math.h"
#include "direct_cpu.h"
#include "direct_cpu_microkernels.h"

namespace tfbigconv {
namespace direct {

// Everything derived from the geometry that the task loop needs.
struct Layout {
  DirectBlocking b;
  int64_t lanes = 0;
  int64_t unit = 0;      // columns per vector (cols) or pixels per group (chans)
  int64_t wo_pad = 0;    // output columns rounded up to `unit`
  int64_t co_pad = 0;    // chans: out channels per group rounded up to CV*lanes
  int64_t qlen = 0;      // panel entries per phase row
  int64_t group_tasks = 0;  // tasks per image along groups (a block of groups each)
  int64_t row_blocks = 0;
  int64_t panel_rows_max = 0;
  int64_t panel_elems = 0, filter_elems = 0, acc_elems = 0;

  int64_t PanelRows(int64_t nkh, const ConvGeometry& g) const {
    return SatAdd(SatMul(b.task_rows - 1, g.stride[kH]), (nkh - 1) * g.dilation[kH] + 1);
  }
};

template <typename T>
Layout MakeLayout(const ConvGeometry& g, const KernelTable<T>& kt, int workers);

}  // namespace direct
}  // namespace tfbigconv
