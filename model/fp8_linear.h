// FP8 training's GEMM path (docs/FP8.md "GEMM path"): the linear layers' GEMMs of a transformer layer
// (attn.qkv, attn.proj, mlp.fc1, mlp.fc2) with FP8 inputs, as Transformer Engine does them. Each GEMM
// input -- the activation, the weight, the output gradient -- is quantized (Ops::fp8_quantize) with a
// scale, then Ops::fp8_linear_forward / backward run the GEMM. The scale (core/fp8.h):
//  - current scaling (training.fp8_recipe: tensorwise): from the tensor's own amax, per call: one pass
//    for the amaxes, their maximum over the ranks holding parts of the same tensor (TP, CP:
//    parallel/tensor_parallel.h fp8_amax_reduce on the device groups, one collective per group per GEMM
//    call), the scale (Ops::fp8_current_scales), the cast -- all on the device, nothing read to the host;
//  - delayed scaling (fp8_recipe: delayed): each GEMM input keeps a scale and an amax history
//    (Fp8State); a step quantizes with the scale of the last update and records the amaxes on the
//    device; after the step the trainer reduces them over TP x DP x CP (Trainer::fp8_update) and
//    Fp8State::update rolls the histories and sets the next step's scales;
//  - blockwise scaling (fp8_recipe: blockwise, DeepSeek-V3 / TE's Float8BlockScaling): a power-of-two
//    scale per block, 1 x 128 along each GEMM's reduction for activations and output gradients (so the
//    weight-gradient GEMM quantizes them again, 128 x 1), 128 x 128 for weights (Ops::fp8_quantize_blocks).
// Outputs, input gradients and bias gradients as the bf16 path (the bias gradient from the unquantized
// output gradient); weight gradients in fp32 from FP8 inputs, or with training.fp8_wgrad: false from the
// bf16 ones (Ops::linear_backward).
// Formats: activations and weights E4M3; output gradients E4M3 (fp8_format: e4m3) or E5M2 (hybrid).
// Every call quantizes what it reads again (the activation again for the weight gradient): the same values
// and scale give the same codes, so a split backward (ZB-H1) and recompute give what one backward gives.
// (ZB-H1's B keeps the output gradient's codes for its W: Fp8Linear::backward's dout_stash.)
// Where GPTStage saves a layer input's codes instead (Fp8SavedInput: ln_1's, ln_2's and SwiGLU's outputs,
// GPTDims::fp8_saved_inputs), the forward's cast writes them for the weight gradient, which reads them
// in place of the 16-bit input it no longer keeps -- the codes its own cast would have made.
// The backward's casts write the layouts its GEMMs read (Layout): the input columnwise only, the output
// gradient rowwise and columnwise in one pass (Ops::fp8_cast_transpose), so no GEMM transposes codes.
// The weights are the exception where Fp8State is given their shapes (GPTStage): a weight's codes and
// scales are kept from its first quantization until weights_changed() (the trainer calls it when a
// training step or an evaluation begins), with their transpose (Fp8Operand::t_codes, for the input
// gradient), as Transformer Engine keeps rowwise and columnwise copies over a step's micro-batches --
// the codes a new quantization would give, one quantization per step instead of two per micro-batch.
#pragma once
#include <array>
#include <cstdint>
#include <functional>
#include <vector>

#include "core/error.h"
#include "core/ops.h"

namespace tpt {

class Comm;
class Fp8State;

struct Fp8LinearOptions {
  bool hybrid = false;  // E5M2 output gradients (else E4M3)
  bool wgrad = true;    // weight-gradient GEMMs in FP8 (false: bf16)
  int margin = 0;       // scale = (fp8_max / amax) / 2^margin
  // current scaling: the amax reductions (max), in this order; null: none. The tensor-parallel and the
  // context-parallel group: the ranks holding parts of one GEMM input.
  Comm* amax_groups[2] = {nullptr, nullptr};
  // delayed scaling: the history's length and its amax (max of the history, else its newest entry)
  bool delayed = false;
  int history_len = 1;
  bool history_max = false;
  // blockwise scaling: a power-of-two scale per block of kFp8Block (1 x 128 activations and output
  // gradients along the GEMM's reduction, 128 x 128 weights); no amax leaves a rank
  bool blockwise = false;
};

constexpr int64_t kFp8Block = 128;

// Whether a backward makes an output gradient's codes in both layouts (current and delayed scaling with
// FP8 weight gradients: the input gradient reads them rowwise, the weight gradient columnwise), which
// takes a second scratch of the largest output gradient's codes; blockwise scaling quantizes the two
// GEMMs' operands apart (other blocks), each in one layout.
inline bool fp8_both_layouts(const Fp8LinearOptions& o) { return o.wgrad && !o.blockwise; }

// The codes' scratch of a stage's FP8 GEMMs (elements of the largest input, weight and output gradient),
// and with blockwise scaling the scales of their blocks (the most any of the GEMMs' layouts needs).
struct Fp8ScratchSizes {
  int64_t inp = 0, w = 0, dout = 0;
  int64_t inp_blocks = 0, w_blocks = 0, dout_blocks = 0;
};

// A GEMM's weight (O, I) whose FP8 copy Fp8State keeps (0 x 0: none, e.g. another EP rank's expert).
// param: an FP8 parameter (training.fp8_param_gather): its rowwise codes are the parameter itself
// (Fp8State::set_param_codes), Fp8State keeps only their transpose.
struct Fp8Weight {
  int64_t O = 0, I = 0;
  bool param = false;
};

// A linear layer's input saved by its forward for the weight gradient as FP8 codes, in place of the
// 16-bit tensor (Transformer Engine's saved FP8 input; GPTDims::fp8_saved_inputs says which): the
// columnwise codes (I, N) -- the input's codes transposed, the weight gradient's layout -- and their
// scale_inv: one float, or with blockwise scaling one per 128 x 1 block, as the backward's own cast of
// the same values with the same scale would make them (so the losses are those without it, bit for bit).
// shard (sequence parallelism, with Fp8TokenGather): this rank's Nt rows' codes in the rows' layout (Nt, I)
// -- rowwise, or with blockwise scaling its 128 x 1 blocks and their scales -- which the backward gathers
// over the TP group and transposes (as Transformer Engine saves the local FP8 shard and all-gathers it again).
struct Fp8SavedInput {
  uint8_t* codes = nullptr;
  float* scale_inv = nullptr;
  bool shard = false;
  explicit operator bool() const { return codes != nullptr; }
};

// Sequence parallelism's all-gather of an FP8 GEMM's input as codes (Transformer Engine's FP8 all-gather):
// the forward is given this rank's Nt of the N rows, casts them with the scale of the whole tensor
// (current scaling: their amax reduced over the TP group as before; delayed: the step's; blockwise: each
// row's own 1 x 128 blocks, whose scales are gathered too) and gathers the codes -- a byte per element on
// the wire instead of two, and the codes a cast of the gathered 16-bit tensor makes, so the results are
// bit for bit those of gathering in bf16 (blockwise: with Nt a multiple of 128, so that a saved shard's
// 128 x 1 blocks are the gathered tensor's).
// gather(full, shard, n): the TP group's shards of n bytes, in rank order, into full (shard may be
// full + rank * n); scratch: N x I bytes the backward gathers a saved shard into (the stage's tmp_).
struct Fp8TokenGather {
  std::function<void(uint8_t* full, const uint8_t* shard, int64_t n)> gather;
  int64_t Nt = 0;
  int rank = 0;
  uint8_t* scratch = nullptr;
};
// what GPTStage allocates for an (N, I) input's: the codes' bytes and the scales' floats, each padded to
// 256 bytes (a multiple of both backends' allocation alignment: the plan counts what is allocated)
inline int64_t fp8_saved_code_bytes(int64_t N, int64_t I) { return (N * I + 255) / 256 * 256; }
inline int64_t fp8_saved_scale_floats(bool blockwise, int64_t N, int64_t I) {
  return ((blockwise ? (N + kFp8Block - 1) / kFp8Block * I : 1) + 63) / 64 * 64;
}

// One GEMM of one layer (Fp8State::gemm): Ops::linear_forward / linear_backward's contract in FP8.
// save (forward): where the input's columnwise codes go for the backward, made in the same cast as
// the forward's rowwise ones (blockwise: a second cast, 128 x 1); saved (backward): those, read for the
// weight gradient instead of casting inp again (inp then unread: may be empty).
// sp (forward): inp is this rank's (sp->Nt, I) rows, gathered as codes (Fp8TokenGather; save then gets the
// shard's codes: its rowwise ones, blockwise its 128 x 1 cast); (backward) the gather of a saved shard. dout_sp (backward, current and delayed
// scaling with FP8 weight gradients, a whole backward or B with dout_stash): dout is this rank's (Nt, O)
// rows of a row-parallel GEMM's output gradient, gathered as codes (Transformer Engine's FP8 all-gather of
// grad_output), its columnwise codes the gathered rowwise ones transposed; the bias gradient is the
// caller's (dbias null).
// dout_stash (backward, FP8 weight gradients; ZB-H1's split backward): the weight gradient's output-gradient
// operand kept as FP8 codes between the two parts -- B (dinp, no dw) writes dout's columnwise codes (O, N)
// and their scale_inv there (current and delayed scaling: in the cast the input gradient's rowwise codes
// come from; blockwise: its 128 x 1 cast), W (dw, no dinp) reads them instead of casting dout (then unread:
// may be empty) -- the codes W's own cast would make, a byte per element kept instead of two.
class Fp8Linear {
 public:
  void forward(Buf out, CBuf inp, CBuf w, CBuf bias, int64_t N, int64_t I, int64_t O, Buf gelu_pre = {},
               const Fp8SavedInput& save = {}, const Fp8TokenGather* sp = nullptr);
  void backward(Buf dinp, Buf dw, Buf dbias, CBuf dout, CBuf inp, CBuf w, int64_t N, int64_t I, int64_t O,
                bool accumulate_dinp, CBuf gelu_pre = {}, const Fp8SavedInput& saved = {},
                const Fp8TokenGather* sp = nullptr, const Fp8TokenGather* dout_sp = nullptr,
                const Fp8SavedInput& dout_stash = {});

 private:
  friend class Fp8State;
  Fp8State* state_ = nullptr;
  int64_t index_ = 0;
};

// The FP8 GEMMs of a stage: the codes' scratch they share and each GEMM's scaling state.
class Fp8State {
 public:
  enum { kInp, kW, kDout, kTensors };  // a GEMM's inputs
  // Scratch for the codes (and block scales) of the GEMMs' inputs; `gemms` GEMMs (model/gpt.h
  // fp8_gemms_per_layer per FP8 layer); weights: each GEMM's weight to keep an FP8 copy of (empty: none).
  Fp8State(Ops& ops, const Fp8LinearOptions& options, const Fp8ScratchSizes& sizes, int64_t gemms,
           const std::vector<Fp8Weight>& weights = {});
  ~Fp8State();
  Fp8State(const Fp8State&) = delete;
  Fp8State& operator=(const Fp8State&) = delete;

  Fp8Linear* gemm(int64_t i) { return &gemms_[size_t(i)]; }
  int64_t gemms() const { return int64_t(gemms_.size()); }
  const Fp8LinearOptions& options() const { return o_; }
  Fp8Type type(int i) const { return i == kDout && o_.hybrid ? Fp8Type::E5M2 : Fp8Type::E4M3; }

  // Delayed scaling. begin_step zeroes the recorded amaxes (so an evaluation's forwards between two
  // steps, which quantize with the current scales, leave no trace); read_amaxes gives this rank's amaxes
  // of the step, kTensors per GEMM (max over its quantizations); update takes them reduced over the
  // ranks of a step's tensors, records each in its history, and sets the scales of the next step.
  void begin_step();
  void read_amaxes(float* amax);
  void update(const float* amax);
  // the host copies (checkpoints): kTensors scales, kTensors x history_len amaxes of GEMM g;
  // after writing them, scales_loaded() puts the scales on the device
  float* scales(int64_t g) { return scale_.data() + g * kTensors; }
  float* history(int64_t g) { return history_.data() + g * kTensors * o_.history_len; }
  void scales_loaded();

  // The weights' FP8 copies are stale from here on (their next quantization makes new ones).
  void weights_changed() { ++epoch_; }
  int64_t weight_quantizations() const { return weight_quantizations_; }  // of the kept weights (tests)
  // the bytes of the kept weights' copies: their codes and transposed codes (each 256-byte aligned), and
  // two device floats per weight (current scaling's scale_inv and amax) or one per 128 x 128 block
  // (blockwise), in 256-byte allocations
  static int64_t weight_cache_bytes(const Fp8LinearOptions& options, const std::vector<Fp8Weight>& weights);

  // FP8 parameters (training.fp8_param_gather, docs/FP8.md "FP8 parameters"; Fp8Weight::param): GEMM g's
  // weight is the O x I codes at `codes` (the trainer's parameter codes), made by cast_param from the master
  // weights -- the codes and scales the weight's own quantization would give, so a GEMM reads them as a kept
  // copy (the w it is given is those codes, DType::U8) and transposes them once per weights_changed(). A
  // cast of all of a weight's parts on the ranks holding them:
  //  - param_amax of each part (after begin_param_amaxes), param_amaxes / set_param_amaxes (host) around
  //    their reduction (max) over every rank holding a part, then cast_param. Current and delayed scaling:
  //    one amax per GEMM of `gemms` (0 where its weight is no FP8 parameter of this rank, so that the vectors
  //    of a stage's ranks line up, the experts' by global index), reduced over the weight's owners and its
  //    (expert-)TP shards: the stage's TP x DP x CP ranks, the others bringing 0. Blockwise: every 128 x 128
  //    block's amax of each weight of `gemms` (all FP8 parameters), reduced over its owners only (the TP
  //    shards' blocks are their own);
  //  - the cast: current scaling with the scale of that amax; blockwise with each block's; delayed with the
  //    step's scale, the weight's amax recorded in the step's amaxes where a GEMM first reads its codes
  //    after weights_changed() (as a kept copy's quantization records it: not by a rank that never uses
  //    the weight in the step, e.g. an expert without tokens).
  // x: the part's values in the compute dtype (bf16, as the 16-bit weight would hold them), n elements
  // from element `at` of the weight.
  void set_param_codes(int64_t g, uint8_t* codes);
  void begin_param_amaxes();
  void param_amax(int64_t g, CBuf x, int64_t at, int64_t n);
  std::vector<float> param_amaxes(const std::vector<int64_t>& gemms);
  void set_param_amaxes(const std::vector<int64_t>& gemms, const std::vector<float>& amax);
  void cast_param(int64_t g, CBuf x, int64_t at, int64_t n);

  // Current scaling: GEMM g's amax reductions instead of the options' (a MoE expert's: its expert-TP
  // group; every rank of a group must quantize the same GEMMs in the same order).
  void set_amax_groups(int64_t g, Comm* a, Comm* b) { groups_.at(size_t(g)) = {a, b}; }

  // Current scaling: the scale the last call gave its input i (tests; a read from the device).
  float last_call_scale(int i) {
    float s = 0.0f;
    ops_.to_host(&s, state_ + kTensors + i, 1);
    return s;
  }

  // the device floats it allocates: current scaling: amax, scale, scale_inv of each input and a 1;
  // delayed: amax, scale and scale_inv of each GEMM input; blockwise: the scale_inv of each block of
  // the three inputs; padded to 256 bytes, a multiple of both backends' allocation alignment (the plan
  // counts what is allocated)
  static int64_t state_floats(const Fp8LinearOptions& options, const Fp8ScratchSizes& sizes, int64_t gemms);

 private:
  friend class Fp8Linear;
  // What a GEMM reads of an input: its codes (rowwise), their transpose (columnwise: the weight
  // gradient's output gradient and input), or both (current and delayed scaling's output gradient when
  // one backward makes both gradients), made in one pass (Ops::fp8_cast_transpose).
  enum Layout { kRow = 1, kCol = 2 };
  // quantizes x[i] (n[i] elements, (n[i] / cols[i], cols[i]); n[i] == 0: none) into codes_[i] (and
  // t_codes_ where both layouts) in the layouts[i] (null: rowwise) and returns the operands;
  // blockwise: in blocks of (brows[i], bcols[i]), one layout
  // rows / cols_to: where each tensor's rowwise codes go, and its columnwise ones when it is cast in
  // both layouts (null, or a null entry: codes_[i], t_codes_)
  void quantize(int64_t g, const CBuf* x, const int64_t* n, Fp8Operand* q, const int64_t* cols = nullptr,
                const int64_t* brows = nullptr, const int64_t* bcols = nullptr, const int* layouts = nullptr,
                uint8_t* const* cols_to = nullptr, uint8_t* const* rows = nullptr);

  Ops& ops_;
  Fp8LinearOptions o_;
  std::vector<Fp8Linear> gemms_;
  uint8_t* codes_[kTensors] = {};
  uint8_t* t_codes_ = nullptr;  // the output gradient's columnwise copy beside its codes (fp8_both_layouts)
  int64_t cap_[kTensors] = {}, block_cap_[kTensors] = {};
  float* state_ = nullptr;  // on the device, state_floats
  std::vector<float> scale_, history_;  // host
  std::vector<std::array<Comm*, 2>> groups_;          // each GEMM's amax reductions (current scaling)
  // the kept weights: per GEMM its codes', transposed codes' and scales' offsets, its shape (0: none), and what it was
  // made from when (the weight's address, the epoch; valid while both match); current scaling keeps
  // its scale_inv and reduced amax on the device (two floats at `scales`)
  struct KeptWeight {
    int64_t codes = 0, t_codes = 0, scales = 0, O = 0, I = 0;
    const void* src = nullptr;
    uint64_t epoch = 0;
    uint8_t* param = nullptr;  // an FP8 parameter's codes (the rowwise copy; codes unused)
  };
  uint8_t* rows_of(const KeptWeight& k) const { return k.param ? k.param : kept_codes_ + k.codes; }
  int64_t kept_floats(const KeptWeight& k) const;
  float* param_amax_slot(const KeptWeight& k) const;  // an FP8 parameter's amax (current and delayed scaling)
  std::vector<KeptWeight> kept_;
  uint8_t* kept_codes_ = nullptr;
  float* kept_scales_ = nullptr;
  int64_t kept_scale_floats_ = 0;  // of them in use
  uint64_t epoch_ = 1;
  int64_t weight_quantizations_ = 0;
  KeptWeight* kept(int64_t g, CBuf w, int64_t n);  // GEMM g's entry for weight w (null: none kept)
};

// A linear layer's GEMMs: through fp8 when given, else Ops's own.
// save / saved: the input's FP8 codes for the weight gradient; sp: the input gathered as codes; dout_sp:
// the output gradient gathered as codes; dout_stash: B's output-gradient codes for W (Fp8Linear; only with fp8).
inline void linear_forward(Ops& ops, Fp8Linear* fp8, Buf out, CBuf inp, CBuf w, CBuf bias, int64_t N, int64_t I,
                           int64_t O, Buf gelu_pre = {}, const Fp8SavedInput& save = {},
                           const Fp8TokenGather* sp = nullptr) {
  TPT_CHECK(fp8 || (!save && !sp));
  if (fp8) fp8->forward(out, inp, w, bias, N, I, O, gelu_pre, save, sp);
  else ops.linear_forward(out, inp, w, bias, N, I, O, gelu_pre);
}
inline void linear_backward(Ops& ops, Fp8Linear* fp8, Buf dinp, Buf dw, Buf dbias, CBuf dout, CBuf inp, CBuf w,
                            int64_t N, int64_t I, int64_t O, bool accumulate_dinp, CBuf gelu_pre = {},
                            const Fp8SavedInput& saved = {}, const Fp8TokenGather* sp = nullptr,
                            const Fp8TokenGather* dout_sp = nullptr, const Fp8SavedInput& dout_stash = {}) {
  TPT_CHECK(fp8 || (!saved && !dout_sp && !dout_stash));
  if (fp8) fp8->backward(dinp, dw, dbias, dout, inp, w, N, I, O, accumulate_dinp, gelu_pre, saved, sp, dout_sp, dout_stash);
  else ops.linear_backward(dinp, dw, dbias, dout, inp, w, N, I, O, accumulate_dinp, gelu_pre);
}

}  // namespace tpt
