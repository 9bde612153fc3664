// Register-blocked micro-kernels of the direct convolution, one set per ISA.
// They see only packed, zero-padded panels and accumulate into a float (or
// double) scratch tile, so they have no bounds checks and no tails: the
// driver in direct_cpu.cc rounds every packed extent up to the tile size.
#pragma once

#include <cstdint>

#include "isa.h"

namespace tfbigconv {
namespace direct {

// Kernel "cols": vectors run along output columns; R output rows x C output
// channels of accumulators. For few output channels per group.
// Panel layout [ci][row][phase][q] with q contiguous (phase = stride_w phase).
template <typename T>
struct ColsTile {
  const T* panel;            // ci 0, panel row of output row 0, phase 0, q 0
  int64_t panel_ci_stride;
  int64_t out_row_step;      // panel offset between consecutive output rows
  int64_t tap_row_step;      // panel offset between consecutive filter rows
  const int64_t* kw_offset;  // panel offset of each filter column
  const T* filter;           // packed [ci][kh][kw][C]
  int64_t n_ci, n_kh, n_kw;
  T* acc;                    // [c][r][col]
  int64_t acc_c_stride, acc_r_stride;
  int64_t n_colvec;          // column vectors to compute
};

// Kernel "chans": vectors run along output channels; P output pixels of one
// row x CV channel vectors of accumulators. For many channels per group.
// Panel layout [row][phase][q][ci] with ci contiguous.
template <typename T>
struct ChansTile {
  const T* panel;            // panel row of this output row, phase 0, q 0, ci 0
  int64_t tap_row_step;
  int64_t q_stride;          // panel offset between consecutive q
  const int64_t* kw_offset;
  const T* filter;           // packed [kh][kw][ci][CV * lanes]
  int64_t n_ci, n_kh, n_kw;
  T* acc;                    // [col][co]
  int64_t acc_col_stride;
  int64_t n_pixgroups;       // groups of P pixels to compute
};

// Kernel "groups": vectors run along groups of one output channel each
// (depthwise filters in channels-last layouts); P output pixels of one row x
// GV group vectors of accumulators, each lane its own group's filter.
// Panel layout [ci][row][phase][q][group] with the block's groups contiguous,
// so packing copies runs of channels instead of one per cache line.
template <typename T>
struct GroupsTile {
  const T* panel;            // ci 0, panel row of this output row, phase 0, q 0
  int64_t panel_ci_stride;
  int64_t tap_row_step;
  int64_t q_stride;          // the group block: GV * lanes
  const int64_t* kw_offset;
  const T* filter;           // packed [ci][kh][kw][GV * lanes]
  int64_t n_ci, n_kh, n_kw;
  T* acc;                    // [col][group]
  int64_t n_pixgroups;       // groups of P pixels to compute
};

// The chans and groups kernels come in two widths: [0] the wide one (P as
// large as the registers allow) and [1] a narrow one (P = 4) for outputs a
// few pixels wide, where the wide one would compute mostly padding.
template <typename T>
struct KernelTable {
  int lanes;                  // vector lanes of T
  int cols_rows[5];           // R for C = 1..4
  void (*cols[5])(const ColsTile<T>&);
  int chans_pixels[2];        // P, the same for CV = 1 and 2 and for groups
  void (*chans[2][3])(const ChansTile<T>&);
  void (*groups[2][3])(const GroupsTile<T>&);  // GV = 1, 2
};

#define TFBIGCONV_DECLARE_TABLES(ns)            \
  namespace ns {                                \
  extern const KernelTable<float> kFloat;       \
  extern const KernelTable<double> kDouble;     \
  }
TFBIGCONV_DECLARE_TABLES(baseline)
TFBIGCONV_DECLARE_TABLES(avx2)
TFBIGCONV_DECLARE_TABLES(avx512)
#undef TFBIGCONV_DECLARE_TABLES

// Rows of accumulators per task; a multiple of every cols_rows entry.
constexpr int kTaskRows = 12;

}  // namespace direct
}  // namespace tfbigconv
