// The planner: tiling, chunking and exact workspace of the FFT algorithm.
// The kernels allocate exactly FftPlan::workspace_bytes, and the planner
// never returns a plan above the caller's limit.
#pragma once

#include <cstdint>
#include <string>

#include "dtypes.h"
#include "geometry.h"

namespace tfbigconv {

// Overlap-save FFT convolution of one pass. The output of each image is cut
// into tiles of tile_h x tile_w pixels; each tile's input window (with its
// halo) is transformed at fft_h x fft_w. "Items" are (image, tile) pairs,
// processed chunk at a time.
struct FftPlan {
  int64_t tile_h = 0, tile_w = 0;
  int64_t fft_h = 0, fft_w = 0;
  int64_t tiles_h = 0, tiles_w = 0;
  int64_t items = 0;   // batch * tiles_h * tiles_w
  int64_t chunk = 0;   // items per chunk
  int workers = 0;     // per-worker buffers, one per ParallelFor worker id
  // Input channels per group whose spectra are held at once. Below
  // in_c/groups, the sum over input channels runs in blocks, accumulating
  // output spectra, so that the filter spectra (ci_block * out_c of them)
  // fit the limit: this bounds the gradient with respect to the filter,
  // whose "input channels" are the batch.
  int64_t ci_block = 0;
  // With few input channels per group (and one block), each output spectrum is mixed right
  // before its inverse transform in a per-worker buffer, while it is in
  // cache; otherwise all output spectra of a chunk are mixed in one pass
  // over frequency blocks, reading each filter spectrum once per chunk.
  bool fused_mix = false;
  // Workspace layout, in this order; all sizes in bytes.
  int64_t filter_spectra_bytes = 0;     // ci_block * out_c spectra
  int64_t item_spectra_bytes = 0;       // groups * ci_block (+ out_c unless fused) spectra of one item
  int64_t worker_bytes = 0;             // one worker's real staging (+ a spectrum if fused)
  int64_t workspace_bytes = 0;          // the exact total
  double cost = 0;                      // cost-model estimate, in model units

  int64_t bins_w() const { return fft_w / 2 + 1; }
  int64_t ci_blocks(const ConvGeometry& g) const {
    return (g.in_c_per_group() + ci_block - 1) / ci_block;
  }
  int64_t bins() const { return fft_h * bins_w(); }
};

// Input channels per group up to which FftPlan::fused_mix is used.
constexpr int64_t kFusedMixMaxInChannels = 4;

// Bytes per real element of the FFT arithmetic (float for 16-bit types).
inline int64_t FftRealBytes(DType t) { return t == DType::kDouble ? 8 : 4; }

// Workspace of a plan with the given tile, chunk and workers (fills the byte
// fields of *plan from its tile and fft sizes).
void FillFftWorkspace(const ConvGeometry& g, DType dtype, FftPlan* plan);

// The cheapest plan whose workspace is at most workspace_limit bytes. On
// failure returns an error that states the minimum workspace needed.
std::string PlanFft(const ConvGeometry& g, DType dtype, int64_t workspace_limit,
                           int workers, FftPlan* plan);

enum class Algorithm { kDirect, kFft };

// The algorithm for one pass: "direct" or "fft" as requested, or for "auto"
// the one with the smaller estimated time among those that fit the budget.
struct AlgorithmChoice {
  Algorithm algorithm = Algorithm::kDirect;
  FftPlan fft;          // valid when algorithm == kFft
  double direct_seconds = 0, fft_seconds = 0;  // estimates (fft: 0 if no plan fits)
  std::string reason;
};

// Errors: an unknown algorithm name (InvalidArgument), or "fft" requested
// and no plan fits the limit (the message states the minimum).
std::string ChooseAlgorithm(const ConvGeometry& g, DType dtype, const std::string& requested,
                            int64_t workspace_limit, int workers, AlgorithmChoice* choice);

}  // namespace tfbigconv
