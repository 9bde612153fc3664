#include "direct_cpu.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "checked_math.h"
#include "direct_cpu_layout.h"
#include "direct_cpu_microkernels.h"

namespace tfbigconv {
namespace {

using direct::ChansTile;
using direct::ColsTile;
using direct::KernelTable;
using direct::Layout;
using direct::MakeLayout;

template <typename T>
const KernelTable<T>& Table(Isa isa);
template <>
const KernelTable<float>& Table<float>(Isa isa) {
#if defined(TFBIGCONV_HAVE_X86_VARIANTS)
  if (isa == Isa::kAvx512) return direct::avx512::kFloat;
  if (isa == Isa::kAvx2) return direct::avx2::kFloat;
#endif
  (void)isa;
  return direct::baseline::kFloat;
}
template <>
const KernelTable<double>& Table<double>(Isa isa) {
#if defined(TFBIGCONV_HAVE_X86_VARIANTS)
  if (isa == Isa::kAvx512) return direct::avx512::kDouble;
  if (isa == Isa::kAvx2) return direct::avx2::kDouble;
#endif
  (void)isa;
  return direct::baseline::kDouble;
}

// dst[0 .. n) = src[0, stride, ...] converted to T; returns dst + n.
template <typename S, typename T>
T* ConvertN(const S* src, int64_t stride, int64_t n, T* dst) {
  if (stride == 1) {
    for (int64_t i = 0; i < n; ++i) dst[i] = Load<T>(src[i]);
  } else {
    for (int64_t i = 0; i < n; ++i) dst[i] = Load<T>(src[i * stride]);
  }
  return dst + n;
}

// dst[0, stride, ...) = src[0 .. n) converted to S.
template <typename S, typename T>
void StoreN(const T* src, int64_t n, S* dst, int64_t stride) {
  if (stride == 1) {
    for (int64_t i = 0; i < n; ++i) dst[i] = Store<S, T>(src[i]);
  } else {
    for (int64_t i = 0; i < n; ++i) dst[i * stride] = Store<S, T>(src[i]);
  }
}

// What one panel entry holds: a single value (cols kernel), or a block of
// `width` values, a pixel's `n` groups (groups kernel) or input channels
// (chans kernel) `stride` apart in the input, and zeros after them.
struct PanelEntry {
  int64_t width = 1, n = 1, stride = 0;
};

// Copies input rows [ih0, ih0 + rows) x channels [0, nci) into the panel,
// converting to T and writing zeros wherever the window leaves the input.
// Panel entry (ci, row, phase, q) holds input column q*stride_w + phase + iw0.
// Rows and columns are "virtual" ones: with in_dilation u, input sample i
// sits at virtual position i*u and the positions between are zero.
template <typename S, typename T, bool kBlock>
void PackPanel(const S* in, const TensorView& v, const ConvGeometry& g, int64_t ih0,
               int64_t rows, int64_t iw0, int64_t nci, int64_t qlen, int64_t ci_stride,
               int64_t row_stride, int64_t phase_stride, int64_t q_stride, PanelEntry e,
               T* dst) {
  const int64_t sw = g.stride[kW], uh = g.in_dilation[kH], uw = g.in_dilation[kW];
  const int64_t vh = g.virtual_in(kH), vw = g.virtual_in(kW);
  auto zero = [&](T* d) {
    if (kBlock) std::fill_n(d, e.width, T(0));
    else *d = T(0);
  };
  auto copy = [&](T* d, const S* s) {
    if (kBlock) std::fill_n(ConvertN(s, e.stride, e.n, d), e.width - e.n, T(0));
    else *d = Load<T>(*s);
  };
  for (int64_t ci = 0; ci < nci; ++ci) {
    for (int64_t row = 0; row < rows; ++row) {
      const int64_t ih = ih0 + row;
      const bool row_ok = ih >= 0 && ih < vh && ih % uh == 0;
      for (int64_t ph = 0; ph < sw; ++ph) {
        T* d = dst + ci * ci_stride + row * row_stride + ph * phase_stride;
        // Columns q with 0 <= iw0 + ph + q*sw < vw.
        const int64_t first = iw0 + ph;
        int64_t q_lo = first >= 0 ? 0 : CeilDiv(-first, sw);
        int64_t q_hi = first < vw ? (vw - 1 - first) / sw + 1 : 0;
        q_lo = std::min(q_lo, qlen);
        q_hi = std::clamp(q_hi, q_lo, qlen);
        if (!row_ok) q_lo = q_hi = 0;
        for (int64_t q = 0; q < q_lo; ++q) zero(d + q * q_stride);
        const S* s = in + (ih / uh) * v.h + ci * v.c;
        if (uw == 1) {
          const S* s0 = s + (first + q_lo * sw) * v.w;
          const int64_t step = sw * v.w;
          if (!kBlock && q_stride == 1 && step == 1) {
            for (int64_t q = q_lo; q < q_hi; ++q) d[q] = Load<T>(s0[q - q_lo]);
          } else {
            for (int64_t q = q_lo; q < q_hi; ++q) copy(d + q * q_stride, s0 + (q - q_lo) * step);
          }
        } else {
          for (int64_t q = q_lo; q < q_hi; ++q) {
            const int64_t iw = first + q * sw;
            if (iw % uw == 0) copy(d + q * q_stride, s + (iw / uw) * v.w);
            else zero(d + q * q_stride);
          }
        }
        for (int64_t q = q_hi; q < qlen; ++q) zero(d + q * q_stride);
      }
    }
  }
}

template <typename S, typename T>
class DirectRunner {
 public:
  DirectRunner(const DirectParams& p, Isa isa, int workers)
      : g_(p.problem.g),
        kt_(Table<T>(isa)),
        l_(MakeLayout(g_, kt_, workers)),
        in_(static_cast<const S*>(p.input)),
        filt_(static_cast<const S*>(p.filter)),
        out_(static_cast<S*>(p.output)),
        iv_(p.problem.in),
        ov_(p.problem.out),
        fv_(p.problem.filter) {}

  void Run(const ParallelFor& parallel_for) {
    parallel_for(l_.b.tasks, [this](int64_t begin, int64_t end, int /*worker*/) {
      const int64_t ib = l_.b.image_block;
      std::vector<T> panel(ib * l_.panel_elems), filt(l_.filter_elems), acc(ib * l_.acc_elems);
      std::vector<int64_t> kw_offset(g_.filter[kW]);
      for (int64_t t = begin; t < end; ++t)
        RunTask(t, panel.data(), filt.data(), acc.data(), kw_offset.data());
    });
  }

 private:
  void RunTask(int64_t task, T* panels, T* filt, T* accs, int64_t* kw_offset) const {
    // Tasks run (block of images, group or block of groups, block of output
    // rows). Each image has its own panel and accumulators in the scratch.
    // In 3-D an image is an (image, output depth) pair, one per task.
    const int64_t rb = task % l_.row_blocks;
    const int64_t grp = (task / l_.row_blocks) % l_.group_tasks * l_.b.group_block;
    const int64_t i0 = task / (l_.row_blocks * l_.group_tasks) * l_.b.image_block;
    const int64_t n0 = i0 / g_.out[kD], od = i0 % g_.out[kD];
    const int64_t images = std::min(l_.b.image_block, g_.batch * g_.out[kD] - i0);
    const int64_t oh0 = rb * l_.b.task_rows;
    const int64_t rows_valid = std::min(l_.b.task_rows, g_.out[kH] - oh0);
    const int64_t cig = g_.in_c_per_group(), cog = g_.out_c_per_group();
    // The groups kernel's block: its real groups, and one vector where that
    // holds them all.
    const int64_t ng = std::min(l_.b.group_block, g_.groups - grp);
    const int gv = ng > l_.lanes ? 2 : 1;
    std::fill(accs, accs + images * l_.acc_elems, T(0));
    Block blk;
    blk.images = images;
    blk.grp = grp;
    blk.rows_valid = rows_valid;
    blk.panels = panels;
    blk.filt = filt;
    blk.accs = accs;
    blk.kw_offset = kw_offset;
    for (int64_t kd = 0; kd < g_.filter[kD]; ++kd) {
      // The (virtual, see in_dilation) input plane of this depth tap; taps
      // on padding or between dilated planes add nothing.
      const int64_t vd = od * g_.stride[kD] - g_.pad_before[kD] + kd * g_.dilation[kD];
      if (vd < 0 || vd >= g_.virtual_in(kD) || vd % g_.in_dilation[kD] != 0) continue;
      blk.in = in_ + n0 * iv_.n + (vd / g_.in_dilation[kD]) * iv_.d + grp * iv_.g;
      blk.filter = filt_ + fv_.offset + kd * fv_.d;
      for (blk.ci0 = 0; blk.ci0 < cig; blk.ci0 += l_.b.ci_block) {
        blk.nci = std::min(l_.b.ci_block, cig - blk.ci0);
        for (blk.kh0 = 0; blk.kh0 < g_.filter[kH]; blk.kh0 += l_.b.kh_block) {
          blk.nkh = std::min(l_.b.kh_block, g_.filter[kH] - blk.kh0);
          blk.rows = l_.PanelRows(blk.nkh, g_);
          blk.ih0 = oh0 * g_.stride[kH] - g_.pad_before[kH] + blk.kh0 * g_.dilation[kH];
          if (l_.b.group_vectors) GroupsBlock(blk, ng, gv);
          else if (l_.b.channel_vectors) ChansBlock(blk);
          else ColsBlock(blk);
        }
      }
    }
    // Write the accumulators out, converting to S.
    // Accumulators [row][col][gb] (groups), [row][col][co_pad] (chans) or
    // [co][row][wo_pad] (cols).
    for (int64_t m = 0; m < images; ++m) {
      const T* acc = accs + m * l_.acc_elems;
      S* out_n = out_ + (n0 + m) * ov_.n + od * ov_.d + oh0 * ov_.h + grp * ov_.g;
      for (int64_t r = 0; r < rows_valid; ++r) {
        S* out_r = out_n + r * ov_.h;
        if (l_.b.group_vectors || l_.b.channel_vectors) {
          const int64_t entry = l_.b.group_vectors ? gv * l_.lanes : l_.co_pad;
          const int64_t n = l_.b.group_vectors ? ng : cog;
          const int64_t stride = l_.b.group_vectors ? ov_.g : ov_.c;
          for (int64_t ow = 0; ow < g_.out[kW]; ++ow)
            StoreN(acc + (r * l_.wo_pad + ow) * entry, n, out_r + ow * ov_.w, stride);
        } else {
          for (int64_t c = 0; c < cog; ++c)
            StoreN(acc + (c * l_.b.task_rows + r) * l_.wo_pad, g_.out[kW], out_r + c * ov_.c,
                   ov_.w);
        }
      }
    }
  }

  // One (input-channel, filter-row) block of a task: what the block kernels
  // pack and run, for each of the task's images.
  struct Block {
    const S* in;  // image 0 of the task, at its group (or block of groups) and depth plane
    const S* filter;  // the filter at the depth tap
    int64_t images, grp, rows_valid;
    int64_t ci0, nci, kh0, nkh;
    int64_t ih0, rows;  // the panel's first input row and its row count
    T* panels;          // an image's panel every panel_elems
    T* filt;
    T* accs;            // an image's accumulators every acc_elems
    int64_t* kw_offset;
  };
  const S* ImageIn(const Block& b, int64_t m) const { return b.in + m * iv_.n + b.ci0 * iv_.c; }
  T* Panel(const Block& b, int64_t m) const { return b.panels + m * l_.panel_elems; }
  T* Acc(const Block& b, int64_t m) const { return b.accs + m * l_.acc_elems; }

  // Filter tap (kh, kw, ci, co) of group grp at the block's depth tap; output
  // channels are fv_.o apart.
  const S* FilterAt(const Block& b, int64_t kh, int64_t kw, int64_t ci, int64_t grp,
                    int64_t co) const {
    return b.filter + kh * fv_.h + kw * fv_.w + ci * fv_.i + grp * fv_.g + co * fv_.o;
  }

  void ColsBlock(const Block& b) const {
    const int64_t sw = g_.stride[kW], qlen = l_.qlen;
    const int64_t row_stride = sw * qlen, ci_stride = b.rows * row_stride;
    for (int64_t m = 0; m < b.images; ++m)
      PackPanel<S, T, false>(ImageIn(b, m), iv_, g_, b.ih0, b.rows, -g_.pad_before[kW], b.nci, qlen,
                             ci_stride, row_stride, qlen, 1, PanelEntry(), Panel(b, m));
    TapOffsets(qlen, 1, b.kw_offset);
    const int64_t cog = g_.out_c_per_group();
    for (int64_t c0 = 0; c0 < cog; c0 += 4) {
      const int C = int(std::min<int64_t>(4, cog - c0));
      // Filter block [ci][kh][kw][C] for channels c0 .. c0+C.
      PackFilterByChannel(b, c0, fv_.o, C, C);
      const int R = kt_.cols_rows[C];
      ColsTile<T> t;
      t.panel_ci_stride = ci_stride;
      t.out_row_step = g_.stride[kH] * row_stride;
      t.tap_row_step = g_.dilation[kH] * row_stride;
      t.kw_offset = b.kw_offset;
      t.filter = b.filt;
      t.n_ci = b.nci;
      t.n_kh = b.nkh;
      t.n_kw = g_.filter[kW];
      t.acc_c_stride = l_.b.task_rows * l_.wo_pad;
      t.acc_r_stride = l_.wo_pad;
      t.n_colvec = l_.wo_pad / l_.lanes;
      for (int64_t m = 0; m < b.images; ++m)
        for (int64_t r0 = 0; r0 < b.rows_valid; r0 += R) {
          t.panel = Panel(b, m) + r0 * t.out_row_step;
          t.acc = Acc(b, m) + c0 * t.acc_c_stride + r0 * t.acc_r_stride;
          kt_.cols[C](t);
        }
    }
  }

  void ChansBlock(const Block& b) const {
    const int64_t sw = g_.stride[kW], qlen = l_.qlen;
    const int64_t q_stride = b.nci, phase_stride = qlen * q_stride, row_stride = sw * phase_stride;
    // A panel entry is a pixel's nci channels: one block entry, so that NHWC
    // inputs are copied a pixel's channels at a time, not a channel at a time.
    PanelEntry entry;
    entry.width = entry.n = b.nci;
    entry.stride = iv_.c;
    for (int64_t m = 0; m < b.images; ++m)
      PackPanel<S, T, true>(ImageIn(b, m), iv_, g_, b.ih0, b.rows, -g_.pad_before[kW], 1, qlen, 0,
                            row_stride, phase_stride, q_stride, entry, Panel(b, m));
    TapOffsets(phase_stride, q_stride, b.kw_offset);
    const int64_t cog = g_.out_c_per_group(), KW = g_.filter[kW];
    const int64_t L = l_.lanes;
    ChansTile<T> t;
    t.tap_row_step = g_.dilation[kH] * row_stride;
    t.q_stride = q_stride;
    t.kw_offset = b.kw_offset;
    t.n_ci = b.nci;
    t.n_kh = b.nkh;
    t.n_kw = KW;
    t.acc_col_stride = l_.co_pad;
    t.n_pixgroups = l_.wo_pad / l_.unit;
    // Channel tiles of 2 vectors, the last one of 1 vector if that covers it.
    for (int64_t c0 = 0; c0 < l_.co_pad;) {
      const int CV = l_.co_pad - c0 >= 2 * L ? 2 : 1;
      const int64_t block = CV * L;
      const int64_t n = std::min(block, cog - c0);  // real channels; zero the rest
      T* f = b.filt;  // [kh][kw][ci][block]
      for (int64_t kh = 0; kh < b.nkh; ++kh)
        for (int64_t kw = 0; kw < KW; ++kw)
          for (int64_t ci = 0; ci < b.nci; ++ci) {
            f = ConvertN(FilterAt(b, b.kh0 + kh, kw, b.ci0 + ci, b.grp, c0), fv_.o, n, f);
            f = std::fill_n(f, block - n, T(0));
          }
      t.filter = b.filt;
      for (int64_t m = 0; m < b.images; ++m)
        for (int64_t r = 0; r < b.rows_valid; ++r) {
          t.panel = Panel(b, m) + r * g_.stride[kH] * row_stride;
          t.acc = Acc(b, m) + r * l_.wo_pad * l_.co_pad + c0;
          kt_.chans[l_.b.narrow_pixels][CV](t);
        }
      c0 += block;
    }
  }

  // The block's filter [ci][kh][kw][width] of taps (kh0 + kh, kw, ci0 + ci)
  // into b.filt: each tap's n values from (grp, c0) on, `stride` apart, then
  // zeros to `width` (the cols kernel's output channels, the groups kernel's groups).
  void PackFilterByChannel(const Block& b, int64_t c0, int64_t stride, int64_t n,
                           int64_t width) const {
    T* f = b.filt;
    for (int64_t ci = 0; ci < b.nci; ++ci)
      for (int64_t kh = 0; kh < b.nkh; ++kh)
        for (int64_t kw = 0; kw < g_.filter[kW]; ++kw)
          f = std::fill_n(
              ConvertN(FilterAt(b, b.kh0 + kh, kw, b.ci0 + ci, b.grp, c0), stride, n, f),
              width - n, T(0));
  }

  // kw_offset[kw]: where filter column kw's inputs start in a panel row, whose
  // entries are ordered (phase, q) for input column q * stride_w + phase.
  void TapOffsets(int64_t phase_stride, int64_t q_stride, int64_t* kw_offset) const {
    for (int64_t kw = 0; kw < g_.filter[kW]; ++kw) {
      const int64_t off = kw * g_.dilation[kW];
      kw_offset[kw] = (off % g_.stride[kW]) * phase_stride + (off / g_.stride[kW]) * q_stride;
    }
  }

  // Groups [grp, grp + ng) of one output channel each, in vectors of
  // gb = gv * lanes groups: panel [ci][row][phase][q][gb], filter
  // [ci][kh][kw][gb], accumulators [row][col][gb].
  void GroupsBlock(const Block& b, int64_t ng, int gv) const {
    const int64_t sw = g_.stride[kW], qlen = l_.qlen, gb = gv * l_.lanes;
    const int64_t q_stride = gb, phase_stride = qlen * q_stride, row_stride = sw * phase_stride;
    const int64_t ci_stride = b.rows * row_stride;
    PanelEntry entry;
    entry.width = gb;
    entry.n = ng;
    entry.stride = iv_.g;
    for (int64_t m = 0; m < b.images; ++m)
      PackPanel<S, T, true>(ImageIn(b, m), iv_, g_, b.ih0, b.rows, -g_.pad_before[kW], b.nci, qlen,
                            ci_stride, row_stride, phase_stride, q_stride, entry, Panel(b, m));
    TapOffsets(phase_stride, q_stride, b.kw_offset);
    PackFilterByChannel(b, 0, fv_.g, ng, gb);
    direct::GroupsTile<T> t;
    t.panel_ci_stride = ci_stride;
    t.tap_row_step = g_.dilation[kH] * row_stride;
    t.q_stride = q_stride;
    t.kw_offset = b.kw_offset;
    t.filter = b.filt;
    t.n_ci = b.nci;
    t.n_kh = b.nkh;
    t.n_kw = g_.filter[kW];
    t.n_pixgroups = l_.wo_pad / l_.unit;
    for (int64_t m = 0; m < b.images; ++m)
      for (int64_t r = 0; r < b.rows_valid; ++r) {
        t.panel = Panel(b, m) + r * g_.stride[kH] * row_stride;
        t.acc = Acc(b, m) + r * l_.wo_pad * gb;
        kt_.groups[l_.b.narrow_pixels][gv](t);
      }
  }

  const ConvGeometry g_;
  const KernelTable<T>& kt_;
  const Layout l_;
  const S* in_;
  const S* filt_;
  S* out_;
  const TensorView iv_, ov_;
  const FilterView fv_;
};

template <typename S>
void ZeroView(const ConvProblem& p, S* out) {
  const ConvGeometry& g = p.g;
  const S zero = Store<S, float>(0.0f);
  const int64_t cog = g.out_c_per_group();
  for (int64_t n = 0; n < g.batch; ++n)
    for (int64_t d = 0; d < g.out[kD]; ++d)
      for (int64_t h = 0; h < g.out[kH]; ++h)
        for (int64_t w = 0; w < g.out[kW]; ++w)
          for (int64_t grp = 0; grp < g.groups; ++grp)
            for (int64_t c = 0; c < cog; ++c)
              out[n * p.out.n + d * p.out.d + h * p.out.h + w * p.out.w + grp * p.out.g +
                  c * p.out.c] = zero;
}

template <typename S, typename T>
void RunDirect(const DirectParams& p, const ParallelFor& pf, Isa isa) {
  DirectRunner<S, T>(p, isa, pf.num_workers()).Run(pf);
}

}  // namespace

void ZeroConvOutput(const ConvProblem& p, DType dtype, void* output) {
  switch (dtype) {
    case DType::kFloat: return ZeroView(p, static_cast<float*>(output));
    case DType::kDouble: return ZeroView(p, static_cast<double*>(output));
    case DType::kHalf: return ZeroView(p, static_cast<f16*>(output));
    case DType::kBFloat16: return ZeroView(p, static_cast<bf16*>(output));
  }
}

DirectBlocking DirectConvBlocking(const ConvGeometry& g, DType dtype, Isa isa, int workers) {
  return dtype == DType::kDouble ? MakeLayout(g, Table<double>(isa), workers).b
                                 : MakeLayout(g, Table<float>(isa), workers).b;
}

void DirectConv(const DirectParams& p, const ParallelFor& pf, Isa isa) {
  const ConvGeometry& g = p.problem.g;
  if (g.output_elements() == 0) return;
  if (g.empty_sums()) {
    ZeroConvOutput(p.problem, p.dtype, p.output);
    return;
  }
  switch (p.dtype) {
    case DType::kFloat: return RunDirect<float, float>(p, pf, isa);
    case DType::kDouble: return RunDirect<double, double>(p, pf, isa);
    case DType::kHalf: return RunDirect<f16, float>(p, pf, isa);
    case DType::kBFloat16: return RunDirect<bf16, float>(p, pf, isa);
  }
}

}  // namespace tfbigconv
