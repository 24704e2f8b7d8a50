// The GPT model of docs/ARCHITECTURE.md "Model" (GPT-2, or the LLaMA family by its options:
// model/layers.h) as one pipeline stage's share of one tensor-parallel rank: its parameter layout
// (global names, global shapes, this rank's box) and its forward and backward over micro-batches.
// It talks to other TP ranks only through parallel/tensor_parallel.h.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/config.h"
#include "core/ops.h"
#include "core/sharded_tensor.h"
#include "model/layer_spec.h"
#include "model/fp8_linear.h"
#include "model/layers.h"
#include "model/moe.h"
#include "model/param_group.h"
#include "parallel/grad_sync.h"
#include "parallel/tensor_parallel.h"

namespace tpt {

template <class P>
struct BlockParams;  // model/block.h
struct BlockActs;

class Comm;
class RingAttention;
struct BlockShape;

// Sizes of the whole model and of this rank's shard of it.
struct GPTDims {
  int64_t L = 0, C = 0, H = 0, D = 0, F = 0;  // layers, hidden, heads, head dim, ffn hidden
  int64_t S = 0, P = 0;                       // sequence length (this CP rank's tokens of one), positions
  int64_t V = 0, Vp = 0;                      // vocabulary, padded vocabulary
  float eps = 1e-5f;
  float init_std = 0.02f;
  int tp = 1, tp_rank = 0, pp = 1, pp_rank = 0;
  int64_t layer_begin = 0, layer_end = 0;     // this stage's layers [begin, end)
  // this rank's: query heads, attention width (Hl D), ffn width, vocabulary rows, and its first
  // vocabulary id (its rows are ids [vocab_begin, vocab_begin + Vl))
  int64_t Hl = 0, Cl = 0, Fl = 0, Vl = 0, vocab_begin = 0;
  // The architecture (model/layers.h; GPT-2 by default, the LLaMA family by the model.* options):
  // G key/value heads (query groups) of the model, kv_heads of them on this rank; qkv_width =
  // (Hl + 2 kv_heads) D the width of the rank's QKV GEMM output, fc1_width fc1's (Fl, or 2 Fl
  // with SwiGLU). D is model.kv_channels.
  int64_t G = 0, kv_heads = 0, qkv_width = 0, fc1_width = 0;
  Norm norm;                  // LayerNorm | RMSNorm (eps)
  MLPActivation mlp;          // GELU | SwiGLU
  bool grouped_qkv = false;   // grouped-query attention: Megatron's grouped QKV layout
  int64_t rot = 0;            // RoPE's rotated channels per head (0: learned absolute positions)
  bool rope_interleaved = false;
  std::vector<float> inv_freq;  // RoPE's (rot / 2) inverse frequencies (model/layers.h rope_inv_freq)
  bool untied = false;        // a separate output layer lm_head.weight on the last stage
  bool bias = true;           // biases of attn.proj, mlp.fc1, mlp.fc2
  bool qkv_bias = true;       // bias of attn.qkv
  bool qk_norm = false;       // model.qk_layernorm: `norm` over each head's D channels of q and k, before RoPE
  // training.recompute_modules lists layernorm: with selective recompute the layers' ln1 / ln2 outputs
  // are not kept but rerun from the kept inputs and statistics in backward (keeps_norms)
  bool recompute_norms = false;
  bool keeps_norms(Recompute r) const { return !(r == Recompute::Selective && recompute_norms); }
  // training.recompute_modules lists mlp: with selective recompute a dense layer's fc1 output and
  // activation (SwiGLU's, or its FP8 codes) are not kept but rerun in backward from ln2, into the stage's
  // shared scratch (mlp_rerun); an MoE layer's MLP is not a dense one (keeps_mlp true)
  bool recompute_mlp = false;
  bool keeps_mlp(Recompute r, int64_t l) const {
    return !(r == Recompute::Selective && recompute_mlp) || moe.is_moe(l);
  }
  // the shared tensors the stage's reruns write: fc1's output (any), the 16-bit activation (act16: a
  // SwiGLU layer that keeps it in 16 bits) and the activation's FP8 codes (act8: fp8_saved_inputs' act)
  struct MlpRerun {
    bool any = false, act16 = false, act8 = false;
  };
  MlpRerun mlp_rerun(Recompute r) const;
  // FP8 training (model/fp8_linear.h): the FP8 layers [fp8_begin, fp8_end) (none: 0, 0), fp8_wgrad (FP8
  // weight gradients), fp8_blockwise (blockwise scaling). With FP8 weight gradients they keep the inputs
  // of their linear layers' weight gradients as the forward's FP8 codes (Fp8SavedInput, Transformer
  // Engine's saved FP8 inputs) in place of the 16-bit tensors, where nothing else reads those in
  // backward (fp8_saved_inputs).
  int64_t fp8_begin = 0, fp8_end = 0;
  bool fp8_wgrad = false, fp8_blockwise = false;
  bool fp8_layer(int64_t l) const { return l >= fp8_begin && l < fp8_end; }
  // training.fp8_param_gather: the weights of the FP8 layers' FP8 GEMMs (fp8_state_entries') are FP8
  // parameters (ParamGroup::fp8): stored as codes only, after every other tensor
  bool fp8_params = false;
  // Sequence parallelism: an FP8 layer gathers the inputs of QKV and fc1 (ln1's and a dense layer's
  // ln2's outputs) over TP as FP8 codes (Fp8TokenGather), not in 16 bits; with blockwise scaling (codes
  // and block scales) where a rank's tokens of every micro-batch are whole 128-token blocks (S / TP a
  // multiple of kFp8Block), so no block of a saved shard's 128 x 1 quantization straddles two ranks.
  bool fp8_gathers_codes(int64_t l) const {
    return sequence_parallel && fp8_layer(l) && (!fp8_blockwise || (S / tp) % kFp8Block == 0);
  }
  // ... and with FP8 weight gradients and current or delayed scaling the output gradients of the
  // row-parallel GEMMs (the projection's, fc2's, a shared expert's fc2's), in backward and zb-h1's B
  // (blockwise scaling's two casts of them would need both layouts gathered: no fewer bytes than bf16)
  bool fp8_gathers_dout_codes(int64_t l) const { return fp8_gathers_codes(l) && fp8_wgrad && !fp8_blockwise; }
  // ZB-H1 (a split backward): an FP8 layer with FP8 weight gradients stashes its linear layers' output
  // gradients for W as the FP8 codes B makes (Fp8Linear::backward's dout_stash), not in 16 bits.
  bool fp8_stashes_codes(int64_t l) const { return fp8_wgrad && fp8_layer(l); }
  struct Fp8Saved {
    bool ln1 = false, ln2 = false, act = false;  // QKV's, fc1's, fc2's input
  };
  Fp8Saved fp8_saved_inputs(int64_t layer, Recompute r) const;
  Fp8Saved fp8_saved_by_any(Recompute r) const;  // what any of [layer_begin, layer_end) saves
  bool saves_fp8_inputs(Recompute r) const {
    const Fp8Saved s = fp8_saved_by_any(r);
    return s.ln1 || s.ln2 || s.act;
  }
  bool learned_positions() const { return rot == 0; }
  QKVLayout qkv_layout() const { return {grouped_qkv, Hl, kv_heads, D}; }
  bool position_ids = false;  // data.reset_position_ids: positions come with the tokens (else 0..S-1)
  bool loss_mask = false;     // data.eod_mask_loss: per-token loss weights come with the targets
  // parallel.sequence_parallel with tp > 1: the LayerNorm / residual regions hold only this TP
  // rank's block of the micro-batch's N = B*S tokens (see local_tokens)
  bool sequence_parallel = false;
  bool first_stage() const { return pp_rank == 0; }
  // Tokens (rows) of a micro-batch of N tokens that this rank holds outside the TP-sharded GEMMs:
  // all N, or with sequence parallelism its block [tp_rank N/tp, (tp_rank+1) N/tp) of the flattened
  // (B, S) tokens. Stage inputs and outputs, and so pipeline messages, are (local_tokens(N), C).
  int64_t local_tokens(int64_t N) const { return sequence_parallel ? N / tp : N; }
  int64_t gemm_tokens(int64_t Nt) const { return sequence_parallel ? Nt * tp : Nt; }  // local_tokens' inverse
  int64_t local_token_begin(int64_t N) const { return sequence_parallel ? tp_rank * (N / tp) : 0; }
  bool last_stage() const { return pp_rank == pp - 1; }
  // Context parallelism (parallel/context_parallel.h): with cp > 1, S is this CP rank's S / cp tokens of
  // each sequence (two chunks), attention is the CP ring, and positions always come with the tokens
  // (position_ids: their global positions).
  int cp = 1, cp_rank = 0;
  // The transformer layer's parts (model/layer_spec.h), from the widths and options above: the
  // parameters, the stash, the plan's GEMMs and FLOPs are derived from it. Mixture-of-Experts
  // (docs/MOE.md): the MoE layers' spec (the router in place of the MLP; the experts are moe's) and
  // the sizes of the experts.
  LayerSpec layer, moe_layer;
  MoEDims moe;
  const LayerSpec& spec(int64_t l) const { return moe.is_moe(l) ? moe_layer : layer; }
};
GPTDims make_dims(const Config& cfg, int tp, int tp_rank, int pp, int pp_rank);
// whether the config's FP8 layers save any input's FP8 codes (GPTDims::fp8_saved_inputs over all layers)
bool fp8_saves_inputs(const Config& cfg);
// d as CP rank cp_rank of parallel.context_parallel_size sees it (unchanged with CP 1).
void apply_context_parallel(GPTDims& d, const Config& cfg, int cp_rank);
// d as EP rank ep_rank of parallel.expert_model_parallel_size and expert-TP rank etp_rank of etp
// (parallel.expert_tensor_parallel_size: 1 or TP) sees it: its experts and its part of each expert's
// width (unchanged for a dense model).
void apply_expert_parallel(GPTDims& d, int ep, int ep_rank, int etp = 1, int etp_rank = 0);

// One parameter tensor of this rank: its shard of the global tensor (core/sharded_tensor.h; only
// the word embedding's local shape is larger than its box: padded vocabulary rows, kept at zero)
// and where it lies in the rank's parameter buffer.
struct ParamInfo : TensorShard {
  int64_t offset = 0;                  // in floats, into the rank's parameter buffer
  int64_t numel = 0;                   // local elements (product of local_shape)
  bool weight_decay = false;           // 2-D weights (both embeddings included)
  // which ranks hold copies of it (model/param_group.h): its replica group (the gradient's
  // average, the distributed optimizer's shards) and its model-parallel copies (TP-replicated, the
  // tied word embedding) with the one the norm counts and a checkpoint saves
  ParamGroup group;
  enum class Init { Normal, Ones, Zeros } init = Init::Zeros;
  float init_std = 0.0f;
};

struct ParamLayout {
  std::vector<ParamInfo> params;
  int64_t total = 0;                   // floats
  const ParamInfo* find(const std::string& name) const;
};
ParamLayout make_param_layout(const GPTDims& d);
// Where each of the stage's transformer layers lies in a buffer of that layout (ln_1.weight through
// mlp.fc2.bias, first layer first): the DP gradient sync's buckets (parallel/grad_sync.h).
std::vector<GradRange> layer_ranges(const ParamLayout& layout, const GPTDims& d);

// Counter-based init of the local shards (docs/ARCHITECTURE.md "Numerics"): element e of a global tensor gets
// std * normal(seed, name, e), whatever the layout. params is a host buffer of layout.total.
void init_params_host(const ParamLayout& layout, uint64_t seed, float* params);

// How a stage stores activations: the compute dtype (activations, their gradients, the logits and
// the compute copy of the weights are stored in it; LayerNorm statistics, the attention
// log-sum-exp and the losses in fp32) and activation recompute (training.recompute, core/config.h).
struct StageOptions {
  DType dtype = DType::F32;
  Recompute recompute = Recompute::None;
  // The stage runs split backwards (GPTStage::BackwardPart::Input, then backward_weight: the ZB-H1
  // schedule): each slot gets the weight-gradient stash (weight_grad_stash_bytes). Not with full
  // recompute (the constructor throws InputError).
  bool split_backward = false;
  // Context parallelism (d.cp > 1): the CP group the ring attention runs over.
  Comm* cp = nullptr;
  // Mixture-of-Experts (model/moe.h MoEMLP): the EP group (device; null with EP 1) and the host
  // groups of the routing's counts (EP, TP, CP, DP for global_aux_loss; null: one rank).
  Comm *ep = nullptr, *ep_host = nullptr, *tp_host = nullptr, *cp_host = nullptr, *dp_host = nullptr;
  // The scratch that lives only within one forward, backward or weight pass (shared_scratch_bytes of
  // the stage, zeroed or not): the model chunks of a rank run one pass at a time and share one
  // (train/trainer.cpp). Null: the stage allocates its own.
  void* shared_scratch = nullptr;
  // Slots in a pool (the interleaved schedule: the chunks of a rank share one, parallel/schedule.h
  // pool_slots): slot s's tensors are carved from slot_pool + s * slot_stride (pooled_slot_bytes, at
  // most slot_stride; each tensor at a multiple of 256 bytes), not allocated per slot -- an MoE
  // layer's kept rows too (MoEMLP carves them after the dense tensors). Not with a split backward.
  // Null: each slot its own tensors.
  void* slot_pool = nullptr;
  int64_t slot_stride = 0;
  // With slot_pool and MoE layers that pool their experts' rows (model/moe.h moe_pools_rows): the
  // chunks' pool of them (slots x the largest chunk's moe_pool_slot_bytes). Null: each MoE MLP its own.
  MoERowPool* moe_pool = nullptr;
  // FP8 training (training.fp8_format, docs/FP8.md): the linear GEMMs of the transformer layers with
  // global index in [fp8_layer_begin, fp8_layer_end) in FP8 (model/fp8_linear.h); fp8 false: none.
  bool fp8 = false;
  Fp8LinearOptions fp8_options{};
  int64_t fp8_layer_begin = 0, fp8_layer_end = 0;
  // FP8 parameters (GPTDims::fp8_params): the codes of the layout's FP8 parameters, element
  // fp8_param_base of the layout at fp8_param_codes[0] (the trainer's; params holds none of them)
  uint8_t* fp8_param_codes = nullptr;
  int64_t fp8_param_base = 0;
};

// Bytes of activation storage that one micro-batch of B sequences keeps between its forward and
// backward on this stage, and of the scratch shared by all its micro-batches, for compute dtype t:
// scratch_bytes the stage's own (the input gradient it sends, the logits between loss and backward,
// RoPE's frequencies, the CP ring's and MoE's buffers), shared_scratch_bytes what lives only within
// one pass (the backward's gradients, the rebuilt attention core or layer, the 16-bit TP sums'
// gather buffer), which a rank's model chunks share (StageOptions::shared_scratch; each tensor of it
// starts at a multiple of 256 bytes). The planner and GPTStage's allocations both use these: they are
// equal whenever each tensor's bytes are a multiple of the allocator's alignment.
// With sequence parallelism the residual stream, the LayerNorm outputs and statistics, the stage
// input and the final LayerNorm are counted on this rank's local_tokens(B*S) tokens.
int64_t activation_bytes_per_microbatch(const GPTDims& d, int64_t B, Recompute r, DType t);
// One slot's bytes in a pool (StageOptions::slot_pool): the same tensors and the MoE layers' kept rows
// (moe_layer_tensor_bytes), each from a multiple of 256 bytes; and its share of the MoE layers' pool of
// experts' rows (StageOptions::moe_pool: moe_pool_layer_bytes of each MoE layer).
int64_t pooled_slot_bytes(const GPTDims& d, int64_t B, Recompute r, DType t);
int64_t moe_pool_slot_bytes(const GPTDims& d, int64_t B, Recompute r, DType t);
// Whether a rank's model chunks share one slot pool (the trainer's choice, which the plan follows):
// more than one chunk (the interleaved schedule, where the chunks' peaks add up to more than the
// rank ever holds at once), no split backward.
bool pooled_slots(const std::vector<GPTDims>& chunks, bool split_backward);
int64_t scratch_bytes(const GPTDims& d, int64_t B, Recompute r, DType t);
int64_t shared_scratch_bytes(const GPTDims& d, int64_t B, Recompute r, DType t);
// FP8 training (StageOptions::fp8): the codes of the largest input, weight and output gradient of
// the four linear GEMMs (model/fp8_linear.h), elements each, and the bytes Fp8State allocates for
// them and its scales (delayed: of the chunk's fp8_layers FP8 layers' GEMMs; plan/memory.cpp counts
// them in the workspace).
Fp8ScratchSizes fp8_scratch_sizes(const GPTDims& d, int64_t B);  // (model/fp8_linear.h)
// A layer's FP8 GEMM slots in its stage's Fp8State: 0 attn.qkv, 1 attn.proj, 2 mlp.fc1, 3 mlp.fc2 (in a
// MoE layer the shared expert's fc1 and fc2, unused without one) and, in a model with MoE layers, each
// routed expert's fc1 (4 + e) and fc2 (4 + E + e), e the global expert (unused in its dense layers).
constexpr int64_t kFp8GemmsPerLayer = 4;
inline int64_t fp8_gemms_per_layer(const GPTDims& d) { return kFp8GemmsPerLayer + (d.moe.any() ? 2 * d.moe.E : 0); }
// The weights of layers [begin, end)'s FP8 GEMM slots on this rank (Fp8State keeps their FP8 copies;
// 0 x 0 for a slot the layer does not use or another EP rank's expert), and the bytes of the state of
// those FP8 layers: the codes' scratch, the scales and the kept weights.
std::vector<Fp8Weight> fp8_weights(const GPTDims& d, int64_t begin, int64_t end);
int64_t fp8_scratch_bytes(const GPTDims& d, int64_t B, const Fp8LinearOptions& o, int64_t begin, int64_t end);
// Delayed scaling's state in checkpoints: "h.<layer>.<gemm>.fp8_<what>" (what: scale [3], amax_history
// [3, history_len]: inputs, weights, output gradients) for each GEMM of fp8_state_entries: the dense
// ones attn.qkv, attn.proj, mlp.fc1, mlp.fc2 (a MoE layer: mlp.shared_experts.fc1 / fc2 with a shared
// expert) one slot each, and a MoE layer's mlp.experts.fc1 / fc2 E slots each ([E, 3], [E, 3, len]).
struct Fp8StateEntry {
  std::string gemm;
  int64_t slot = 0, count = 1;  // its first slot in the layer's and how many
};
std::vector<Fp8StateEntry> fp8_state_entries(bool moe_layer, int64_t experts, bool shared_expert);
std::string fp8_state_name(int64_t layer, const std::string& gemm, const char* what);
bool is_fp8_state_name(const std::string& tensor);  // one of those (optional in a checkpoint)
// Bytes that StageOptions::split_backward adds per slot (on top of activation_bytes_per_microbatch,
// whatever the recompute mode): the output gradients dY of each of a transformer layer's linear
// layers (d.layer's linears: N*out each), which a split backward's B stashes for its W, in the
// compute dtype t on all N = B*S tokens -- for the dense block layers * N * (qkv_width (attn.qkv) + C
// (attn.proj) + fc1_width (mlp.fc1) + C (mlp.fc2)) elements; in an FP8 layer with FP8 weight gradients
// (GPTDims::fp8_stashes_codes) their columnwise FP8 codes and scales instead (fp8_saved_code_bytes,
// fp8_saved_scale_floats). The constructor allocates exactly that per slot (up to the allocator's
// alignment, as above).
int64_t weight_grad_stash_bytes(const GPTDims& d, int64_t B, DType t);
// Elements of one pipeline message (a stage's output or its input gradient) for micro-batches of B:
// B*S*C, or B*S*C/tp with sequence parallelism.
inline int64_t stage_message_elements(const GPTDims& d, int64_t B) { return d.local_tokens(B * d.S) * d.C; }

// The name of the stage's GEMM with input width `in` and output width `out`: the layer spec's linear
// layers ("attn.qkv", "attn.proj", "mlp.fc1", "mlp.fc2") and "lm_head"; names joined by "|" where the
// widths coincide.
std::string linear_name(const GPTDims& d, int64_t in, int64_t out);

class GPTStage {
 public:
  // params: the weights used in compute, layout.total elements of options.dtype (the fp32 master
  // weights in fp32 runs, else their compute copy); grads: the gradients, layout.total elements (fp32,
  // or bf16 with parallel.grad_reduce_in_bf16).
  // tp: the tensor-parallel group. slots: how many micro-batches may be in flight between forward
  // and backward.
  GPTStage(const GPTDims& d, const ParamLayout& layout, Ops& ops, Comm& tp, CBuf params, Buf grads,
           int64_t micro_batch, int slots, StageOptions options = {});
  ~GPTStage();
  GPTStage(const GPTStage&) = delete;
  GPTStage& operator=(const GPTStage&) = delete;

  // Forward of micro-batch `slot`. First stage: tokens (B, S) on the device, and with
  // d.position_ids their positions (B, S) (< P) on the device; other stages: the previous stage's
  // output hidden (Nt, C) on the device, in the compute dtype. Nt = d.local_tokens(B*S): B*S, or
  // with sequence parallelism this TP rank's block of the tokens.
  // layer_start(l), if given, is called before anything reads transformer layer l's parameters
  // (global index), with layer_begin - 1 before the embeddings and layer_end before the final
  // LayerNorm: where the distributed optimizer's overlapped parameter all-gather is waited for.
  void forward(int slot, const int32_t* tokens, CBuf hidden_in, const int32_t* positions = nullptr,
               const std::function<void(int64_t layer)>& layer_start = {});
  // Output of a non-last stage (Nt, C), in the compute dtype.
  CBuf output(int slot) const;
  // Last stage: per-token losses of the slot's forward; if want_grad, also prepares the logits
  // gradient scaled by dloss_scale (d total_loss / d token_loss). With d.loss_mask, weights (B, S)
  // on the device multiply each token's loss and gradient (0: the token does not count). Returns the
  // sum of the (weighted) losses.
  double loss(int slot, const int32_t* targets, float dloss_scale, bool want_grad, const float* weights = nullptr);
  // Backward of micro-batch `slot`. Non-last stages get d output (Nt, C). Gradients accumulate
  // into grads. Non-first stages: input_grad() then holds d hidden_in. layer_done(l), if given, is
  // called as soon as transformer layer l (global index) has added its gradients (last layer first):
  // what the DP gradient sync overlaps with the rest of backward.
  //
  // Which part of the backward a call runs: Full (everything), or ZB-H1's split: Input (B: the
  // input gradient, which input_grad() then holds, and the cheap gradients -- LayerNorms, the
  // embeddings, the LM head's tied word embedding, the row-parallel biases with sequence parallelism)
  // then, later, Weight (W: the weight GEMMs' gradients of the same slot, backward_weight).
  // Input needs StageOptions::split_backward; it stashes the linear layers' output gradients of every
  // layer in the slot and calls no layer_done (the layers' gradients are incomplete). The slot's
  // activations stay in use until its backward_weight: no forward of the slot before it.
  // B then W adds the same gradients as Full, op for op (bit for bit on the CPU backend).
  enum class BackwardPart { Full, Input };
  void backward(int slot, CBuf doutput, const std::function<void(int64_t layer)>& layer_done = {},
                BackwardPart part = BackwardPart::Full);
  // W of a slot whose backward ran with BackwardPart::Input: adds the deferred weight gradients into
  // grads; layer_done(l) as in backward, called when layer l's gradients are complete (last layer first).
  // Per layer the weight GEMMs of attn.qkv, attn.proj, mlp.fc1 and mlp.fc2, dW += dY^T X, with the
  // bias gradients those GEMMs' full-backward calls sum (qkv, fc1; proj and fc2 without sequence
  // parallelism): the full backward's calls less the input gradient. X comes from the slot's kept
  // activations: with sequence parallelism the LayerNorm outputs are all-gathered over TP again (a TP
  // collective: every TP rank runs the same schedule); with selective recompute the attention core
  // is rerun from the kept QKV. Writes neither input_grad() nor any other slot's state.
  void backward_weight(int slot, const std::function<void(int64_t layer)>& layer_done = {});
  CBuf input_grad() const;

  int64_t micro_batch() const { return B_; }
  // Mixture-of-Experts: the balancing losses' weight in this step's gradients (MoEMLP::set_loss_scale),
  // and the balancing losses and routing counts since the last call (null for a dense stage).
  void set_moe_loss_scale(float s) {
    if (moe_) moe_->set_loss_scale(s);
  }
  MoEMLP* moe() const { return moe_.get(); }
  // FP8 training: the scaling state of the stage's FP8 layers' GEMMs (null: none); GEMM g is slot
  // g % fp8_gemms_per_layer(d) of layer fp8_first_layer() + g / fp8_gemms_per_layer(d)
  Fp8State* fp8_state() const { return fp8_.get(); }
  // FP8 parameters (StageOptions::fp8_param_codes): this chunk's GEMM weights that are, each the GEMM of
  // fp8_state() and its elements [at, at + n) of a tensor of the layout (an expert's: its part of the
  // experts' tensor)
  struct Fp8Param {
    const ParamInfo* info = nullptr;
    int64_t gemm = 0, at = 0, n = 0;
  };
  const std::vector<Fp8Param>& fp8_params() const { return fp8_params_; }
  int64_t fp8_first_layer() const { return fp8_begin_; }

 private:
  struct LayerActs;
  struct LayerStash;
  struct SlotActs;
  // positions: the slot's tokens' positions for RoPE (data.reset_position_ids), or null (n % S)
  void block_forward(int64_t layer, LayerActs& a, CBuf x_in, Buf x_out, const int32_t* positions);
  // stash null: the layer's whole backward; else B only, the GEMMs' output gradients left in stash
  void block_backward(int64_t layer, LayerActs& a, CBuf x_in, Buf dres, const LayerStash* stash,
                      const int32_t* positions);
  BlockShape block_shape(const int32_t* positions) const;
  const int32_t* rope_positions(const SlotActs& a) const;
  // the LM head's weight: the word embedding (tied) or the output layer
  const char* output_weight() const { return d_.untied ? "lm_head.weight" : "wte.weight"; }
  // W of one layer (x_in: its input) from its stash (backward_weight)
  void block_backward_weight(int64_t layer, LayerActs& a, CBuf x_in, const LayerStash& stash);
  void attention_core_forward(BlockActs& a);
  // the mlp recompute module (GPTDims::keeps_mlp): a dense layer's fc1 output and activation (its FP8
  // codes) again from ln2, which is rerun first unless ln2_ready (model/gpt_recompute.cpp)
  void rerun_mlp(int64_t layer, BlockActs& a, const BlockParams<CBuf>& w, bool ln2_ready);
  // The TP mappings around the GEMMs, written once for both layouts of the LayerNorm / residual
  // regions (all N tokens, or with sequence parallelism this rank's Nt):
  // the input (N, C) of a column-parallel GEMM from this rank's LayerNorm output x (Nt, C): x itself,
  // or with sequence parallelism x all-gathered into `full`.
  CBuf gather_tokens(CBuf x, Buf full);
  // d of that input (N, C, this rank's partial, in dfull) summed over TP -> d of x: dfull all-reduced
  // in place, or with sequence parallelism this rank's tokens reduce-scattered into `shard`.
  CBuf input_grad_to_tokens(Buf dfull, Buf shard);
  // The partial outputs (N, C) of a row-parallel GEMM in `partial` summed over TP -> the layer's output
  // on this rank's tokens: partial all-reduced in place (the bias was added on tp_rank 0 in the GEMM),
  // or with sequence parallelism reduce-scattered into `shard`, then the bias added on every rank.
  CBuf row_parallel_output(Buf partial, Buf shard, CBuf bias);
  // Its backward, from d output (Nt, C): what the GEMM's backward reads (d output (N, C)) and the
  // bias gradient it accumulates -- dout and dbias themselves, or with sequence parallelism dout
  // all-gathered into `full` and no bias: its gradient, the sum over this rank's tokens (summed over
  // TP with the other replicated gradients), is added to dbias here. `full` empty: dout not gathered
  // (an FP8 GEMM gathers its codes, Fp8Linear::backward's dout_sp).
  struct RowGrad {
    CBuf dout;
    Buf dbias;
  };
  RowGrad row_parallel_output_grad(CBuf dout, Buf full, Buf dbias);
  // out (Nt, C) += wpe rows of this rank's tokens' positions 0..S-1 (without d.position_ids), and
  // its backward dwpe += dout at those positions.
  void add_positions(Buf out);
  void positions_backward(CBuf dout);
  bool row_bias_in_gemm() const { return !d_.sequence_parallel && d_.tp_rank == 0; }
  // How the TP mappings' sums travel: 16-bit values in bf16/fp16 runs, else fp32 (null).
  const TPWire* wire() const { return wire_.ops ? &wire_ : nullptr; }
  CBuf p(const std::string& name) const;
  Buf g(const std::string& name) const;
  CBuf p_opt(const std::string& name) const;  // null where the architecture has no such tensor
  BlockParams<CBuf> weights(int64_t layer) const;  // block_params of params_, FP8 parameters' codes (gpt_fp8.cpp)
  CBuf fp8_param(const ParamInfo& info) const;     // an FP8 parameter's codes (DType::U8)
  void init_fp8_params();                          // fp8_params_, and their codes to fp8_
  Buf g_opt(const std::string& name) const;

  GPTDims d_;
  const ParamLayout& layout_;
  Ops& ops_;
  Comm& tp_;
  CBuf params_;
  Buf grads_;
  int64_t B_;
  StageOptions opt_;
  std::vector<SlotActs*> slots_;
  LayerActs* recompute_acts_ = nullptr;
  std::unique_ptr<RingAttention> ring_;  // context parallelism: the attention core's ring (d.cp > 1)  // full recompute: one layer's activations, rebuilt in backward
  // shared scratch (compute dtype, except the fp32 attention and cross-entropy row statistics):
  // dres_ (Nt, C) the residual stream's gradient; tmp_ (N, C) row-parallel partial outputs, gathered
  // tokens, all-gathered gradients; dln_ (N, C) a column-parallel GEMM's input gradient, and in
  // forward with sequence parallelism the reduce-scattered row-parallel output (Nt, C)
  Buf dres_, dln_, dqkv_, datt_, dfc_, tmp_, logits_;
  float *datt_stats_ = nullptr, *xent_ = nullptr;
  // qkv_tmp_ (N, qkv_width) grouped-query attention: the QKV GEMM's grouped output in forward, the heads'
  // gradient in backward; dact_ (N, Fl) SwiGLU: d fc2 input, GELU: the activation (fc2's input) of
  // the layer at hand (each layer keeps only fc1's output; MLPActivation::recompute_activation);
  // inv_freq_ (rot / 2) RoPE; qk_din_ (N, Cl) model.qk_layernorm: the q/k norms' input gradient (datt_,
  // spent after the attention's backward, holds their output gradient)
  Buf qkv_tmp_, dact_, qk_din_;
  float* inv_freq_ = nullptr;
  TPWire wire_{nullptr, Buf{}};  // bf16/fp16 with TP > 1: the backend and the 16-bit sums' gather buffer
  int logits_slot_ = -1;  // which slot's logits gradient is in logits_
  // Mixture-of-Experts: the MoE layers' MLPs (null for a dense stage), and the slot at hand
  std::unique_ptr<MoEMLP> moe_;
  int slot_ = 0;
  bool recording_ = true;  // false while full recompute reruns a layer's forward
  MoEParams<CBuf> moe_params(int64_t layer) const;
  MoEParams<Buf> moe_grads(int64_t layer) const;
  MoETPMappings moe_mappings(int64_t layer);
  std::vector<void*> owned_;
  // FP8 training: the linear GEMMs' quantization (null without it) of this stage's FP8 layers
  // [fp8_begin_, fp8_end_), and one GEMM of a layer (null: bf16)
  std::unique_ptr<Fp8State> fp8_;
  std::vector<Fp8Param> fp8_params_;
  int64_t fp8_begin_ = 0, fp8_end_ = 0;
  Fp8Linear* fp8_for(int64_t layer, DensePart part) const;
  Fp8Linear* fp8_slot(int64_t layer, int64_t slot) const;  // slot of fp8_gemms_per_layer (null: bf16)
  // sequence parallelism: the gather of a layer's FP8 GEMM inputs as codes, where the layer gathers
  // them so (GPTDims::fp8_gathers_codes; else null: in 16 bits)
  Fp8TokenGather fp8_gather_;
  const Fp8TokenGather* fp8_gather(int64_t layer) const;
  Buf alloc(int64_t n);    // n elements of the compute dtype
  float* alloc_f32(int64_t n);
};

}  // namespace tpt
