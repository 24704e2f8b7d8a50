// The Mixture-of-Experts MLP of one pipeline stage (docs/MOE.md), the MoE layers' counterpart of
// the dense MLP in model/block.h: the router (fp32 logits on the device, the routing on the host:
// model/moe_routing.h), the token dispatch to the experts' owners (an all-to-all over the EP group
// with the counts exchanged first), one GEMM pair per local expert on its contiguous rows, and the
// inverse -- forward and backward, micro-batch slot by slot. It talks to other ranks only through
// the Comm groups it is given (the EP group for rows, the TP and CP groups for the balancing losses'
// counts).
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <utility>
#include <vector>

#include "core/config.h"
#include "core/ops.h"
#include "model/moe_pool.h"
#include "model/moe_routing.h"

namespace tpt {

class Comm;
class Fp8Linear;
struct Fp8TokenGather;
struct GPTDims;

// A stage's MoE sizes (GPTDims::moe), from the config and the rank's EP coordinate.
struct MoEDims {
  int64_t E = 0;             // experts per MoE layer; 0: a dense model
  int64_t Fe = 0;            // each expert's MLP width (model.moe_ffn_hidden_size)
  int64_t Fel = 0;           // this rank's part of it: Fe / etp
  int64_t fc1_width = 0;     // this rank's part of an expert's fc1 output: Fel, or 2 Fel with SwiGLU ([gate; up])
  int ep = 1, ep_rank = 0;   // the EP group; this rank holds experts [expert_begin, expert_begin + El)
  int64_t El = 0, expert_begin = 0;
  // the expert-TP group (parallel.expert_tensor_parallel_size: 1, or TP): each expert's fc1
  // column-parallel and fc2 row-parallel over it, its rows all-gathered over it (docs/MOE.md)
  int etp = 1, etp_rank = 0;
  // model.moe_token_dispatcher_type: allgather (Megatron's MoEAllGatherTokenDispatcher; with EP 1 the
  // same steps as alltoall)
  bool allgather = false;
  bool gathers_tokens() const { return allgather && ep > 1; }
  std::vector<uint8_t> layers;  // per global layer: whether it is an MoE layer
  RouterOptions router;
  bool bias = false;         // experts' fc1 / fc2 biases (model.add_bias_linear)
  // the shared expert (model.moe_shared_expert_intermediate_size; 0: none): width Fs, Fsl on this TP
  // rank, its fc1's output width, and its sigmoid gate (model.moe_shared_expert_gate)
  int64_t Fs = 0, Fsl = 0, shared_fc1_width = 0;
  bool shared_gate = false;
  double dispatch_factor = 2;  // model.moe_dispatch_bound_factor (moe_rows_bound)
  double kept_factor = 1.25;   // model.moe_kept_rows_factor (moe_pool_layer_bytes)
  // training.recompute_modules lists moe_act: with selective recompute the experts' activations are
  // not kept but rerun from their fc1 outputs in backward (moe_keeps_act); moe: the whole MoE MLP is
  // rerun before its backward, as full recompute does (moe_shares_rows); shared_experts: the shared
  // expert's fc1 output and activation are not kept but rerun in backward (moe_keeps_shared)
  bool recompute_act = false, recompute_moe = false, recompute_shared = false;
  bool any() const { return E > 0; }
  bool is_moe(int64_t layer) const { return E > 0 && layers.at(size_t(layer)) != 0; }
};

// Rows an EP rank's experts can take per micro-batch of Nt tokens before its dispatch buffers grow:
// exactly Nt k with EP 1, else dispatch_factor x that (the balanced load), rounded up.
int64_t moe_rows_bound(const MoEDims& m, int64_t Nt);
// Whether a layer keeps its experts' activations under recompute mode r (not with selective
// recompute and moe_act, whose backward reruns them into one scratch buffer).
bool moe_keeps_act(const MoEDims& m, Recompute r);
// Whether a layer keeps its shared expert's fc1 output and activation (not with selective recompute and
// shared_experts, whose backward reruns them into one scratch pair; the shared set of moe_shares_rows keeps them).
bool moe_keeps_shared(const MoEDims& m, Recompute r);
// Whether one set of kept rows serves every slot and layer (full recompute, or selective with the moe
// module: each layer's MoE MLP is rerun right before its backward).
bool moe_shares_rows(const MoEDims& m, Recompute r);
// Whether the layers take their experts' rows (inputs, fc1 outputs, activations; the allgather
// dispatcher's output rows) from the stage's pool (model/moe_pool.h), as many as routing sent: with
// EP > 1 unless one set serves all (moe_shares_rows). Else each layer and slot keeps them at the bound.
bool moe_pools_rows(const MoEDims& m, Recompute r);
// Bytes one MoE layer keeps per micro-batch of Nt tokens under recompute mode r (its experts'
// inputs, fc1 outputs and activations on the bound's rows, the shared expert's;
// none with full recompute, whose layers share one set, rebuilt before each layer's backward; with
// pooled rows its share of the pool, moe_pool_layer_bytes) and the stage's MoE scratch (with that one
// set), in dtype t: what MoEMLP allocates (activation_bytes_per_microbatch / scratch_bytes add them).
int64_t moe_layer_bytes(const GPTDims& d, int64_t Nt, DType t, Recompute r);
int64_t moe_scratch_bytes(const GPTDims& d, int64_t Nt, DType t, Recompute r);
// The same per layer, tensor by tensor in MoEMLP's order (a pooled slot carves them one by one),
// without the pool's share.
std::vector<int64_t> moe_layer_tensor_bytes(const GPTDims& d, int64_t Nt, DType t, Recompute r);
// The experts' rows of a layer in MoEMLP's order: xin, fc1[, act] on n rows of the expert-TP group.
std::vector<int64_t> moe_rows_tensor_bytes(const GPTDims& d, DType t, bool act, int64_t n);
// A layer's share of the pool per micro-batch (0 unless moe_pools_rows): its rows' block at
// model.moe_kept_rows_factor x the balanced load (the expert-TP group's rows), a multiple of 256 bytes.
int64_t moe_pool_layer_bytes(const GPTDims& d, int64_t Nt, DType t, Recompute r);

// One MoE layer's parameters (or gradients): the router (E, C), the rank's El experts' fc1 (El,
// fc1_width, C), fc2 (El, C, Fe) and their biases (null without); the shared expert's fc1
// (shared_fc1_width, C), fc2 (C, Fsl) and biases, and its gate (1, C) (null without).
template <class P>
struct MoEParams {
  P router, fc1, fc1_bias, fc2, fc2_bias;
  P shared_fc1, shared_fc1_bias, shared_fc2, shared_fc2_bias, gate;
};

// The TP mappings around the shared expert's GEMMs (GPTStage's, as around the dense MLP): N the
// tokens of the TP-split GEMMs, Nt this rank's (sequence parallelism).
struct MoETPMappings {
  std::function<CBuf(CBuf x)> gather_tokens;                        // (Nt, C) -> (N, C)
  std::function<CBuf(Buf partial, CBuf bias)> row_parallel_output;  // (N, C) partial sums -> (Nt, C)
  // d output (Nt, C) -> what fc2's backward reads (N, C) and the bias gradient it adds (null: added here)
  std::function<std::pair<CBuf, Buf>(CBuf dy, Buf dbias)> row_parallel_output_grad;
  std::function<CBuf(Buf dfull)> input_grad_to_tokens;  // (N, C) partial d input -> (Nt, C)
  bool bias_in_gemm = true;
  int64_t N = 0;
  // FP8 layers (model/fp8_linear.h): the GEMM of a slot of the layer (model/gpt.h fp8_gemms_per_layer:
  // 2, 3 the shared expert's fc1, fc2; 4 + e, 4 + E + e global expert e's); empty: bf16
  std::function<Fp8Linear*(int64_t slot)> fp8;
  // sequence parallelism (GPTDims::fp8_gathers_codes): the shared expert's fc1 input gathered as FP8 codes
  // in its GEMM (gather_tokens not called for it); with dout_codes also fc2's output gradient (current and
  // delayed scaling, FP8 weight gradients; row_parallel_output_grad then leaves it this rank's)
  const Fp8TokenGather* fp8_gather = nullptr;
  bool dout_codes = false;
};

// The routing probabilities applied in the experts (Megatron-core's weighted activation): p (R) each
// row's probability on the device, wact (R, Fe) the weighted activations fc2 reads, ident (R) 0, 1, ...
// and zeros (R) the index lists that scale rows and add the weighted fc2 bias.
struct MoERowWeights {
  const float* p = nullptr;
  Buf wact;
  const int32_t* ident = nullptr;
  const int32_t* zeros = nullptr;
};

// The experts' forward on expert-major rows: expert e (of w's rows.size() experts) takes the next
// rows[e] rows of xin (R, C) and writes fc1 (R, fc1_width) with its activation act (R, Fe) and its
// output out (R, C) there, in one GEMM pair (d.mlp's fc1 + activation, fc2) per expert with rows;
// through FP8 where fp8 gives them (MoETPMappings::fp8's slots; the local experts are d.moe.expert_begin ...).
// With pw each row's output is weighted by its probability: fc2 of p x act, plus p x fc2's bias.
void moe_experts_forward(Ops& ops, const GPTDims& d, const MoEParams<CBuf>& w, const std::vector<int64_t>& rows,
                         CBuf xin, Buf fc1, Buf act, Buf out,
                         const std::function<Fp8Linear*(int64_t slot)>& fp8 = {}, const MoERowWeights* pw = nullptr);

// What the balancing losses and the routing looked like over the micro-batches since the last take.
struct MoEStats {
  double aux = 0;      // sum over micro-batches and MoE layers of the global aux loss / coefficient
  double z = 0;        // sum of this rank's mean logsumexp^2
  int64_t terms = 0;   // micro-batch x layer terms summed
  std::vector<int64_t> layers;  // the stage's MoE layers (global indices)
  std::vector<double> counts;   // (layers, E) routed assignments of this rank's tokens
};

class MoEMLP {
 public:
  // Buffers for `slots` micro-batches of Nt tokens on each of the stage's MoE layers. ep: the EP
  // group's device communicator (null with EP 1), ep_host its host twin; etp the expert-TP group's
  // device communicator (the TP group's; null with ETP 1: d.moe.etp), its host twin tp_host; tp_host / cp_host the host
  // TP and CP groups (null: one rank) the balancing losses' counts are summed over, dp_host the DP
  // group (global_aux_loss's counts are summed over TP x DP x CP). B, S: the
  // micro-batch's sequences and this rank's tokens of each (seq_aux_loss), token_begin: the rank's first
  // token of the flattened (B, S) micro-batch (sequence parallelism). slot_regions: empty, or per
  // slot where its layers' kept rows are carved (a slot of the interleaved schedule's pool, after its
  // dense tensors: moe_layer_tensor_bytes each, each from a multiple of 256 bytes); rows that outgrow
  // the bound are allocated apart then. recompute: the stage's mode (moe_layer_bytes: full recompute
  // shares one set of kept rows, selective with moe_act reruns the experts' activations). pool: with
  // moe_pools_rows the stage's pool of rows (the chunks' one, with slot_regions); null: its own, of
  // slots x layers x moe_pool_layer_bytes.
  MoEMLP(const GPTDims& d, Ops& ops, DType t, int64_t Nt, int64_t B, int64_t token_begin, int slots, Comm* ep,
         Comm* ep_host, Comm* etp, Comm* tp_host, Comm* cp_host, Comm* dp_host, Recompute recompute,
         const std::vector<char*>& slot_regions = {}, MoERowPool* pool = nullptr);
  ~MoEMLP();
  MoEMLP(const MoEMLP&) = delete;
  MoEMLP& operator=(const MoEMLP&) = delete;

  // y (Nt, C) = the layer's MoE MLP of x (Nt, C: its ln_2 output). record: count the balancing losses
  // and routing in the stats (false when full recompute reruns the forward).
  // recompute: the moe recompute module's rerun before backward (its output to the MLP's own scratch)
  // tp: the TP mappings around the shared expert (used only with one).
  void forward(int slot, int64_t layer, const MoEParams<CBuf>& w, CBuf x, Buf y, const MoETPMappings& tp,
               bool record = true);
  void recompute(int slot, int64_t layer, const MoEParams<CBuf>& w, CBuf x, const MoETPMappings& tp) {
    forward(slot, layer, w, x, y_, tp, false);
  }
  // d x (Nt, C) from dy (Nt, C), in the MLP's own scratch (returned); the layer's gradients (router,
  // experts, shared expert) += into g. loss_scale multiplies the balancing losses' gradients
  // (set_loss_scale).
  CBuf backward(int slot, int64_t layer, const MoEParams<CBuf>& w, const MoEParams<Buf>& g, CBuf x, CBuf dy,
                const MoETPMappings& tp);
  // The balancing losses' weight in this step's gradients: d objective / d (aux + z) of one micro-batch
  // (the trainer's: loss scale x CP / micro-batches).
  void set_loss_scale(float s) { loss_scale_ = s; }
  MoEStats take_stats();  // also starts global_aux_loss's next step
  // The expert bias (aux-loss-free balancing, model.moe_router_enable_expert_bias): once per global
  // batch, each MoE layer's bias from the step's counts summed over TP x DP x CP by `sum`; the
  // stage's MoE layers (global indices) and their biases (E fp32 each, for the checkpoint).
  void update_expert_bias(const GroupSum& sum);
  const std::vector<int64_t>& layers() const { return moe_layers_; }
  const MoERowPool* pool() const { return pool_; }  // the pool its rows come from (null: none)
  // ms the host spent routing so far (route with its counts' all-reduce, the send order, the routing's
  // backward): time the device waits for (docs/MOE.md "The router")
  double host_routing_ms() const { return host_ms_; }
  std::vector<float>& expert_bias(size_t i) { return bias_.at(i); }
  // forget what the forwards since the last step counted (evaluation's routing), and give their rows back
  void discard_step();

 private:
  struct LayerState;
  const GPTDims& d_;
  Ops& ops_;
  DType t_;
  int64_t Nt_, B_, token_begin_;
  Comm *ep_, *ep_host_, *etp_, *tp_host_, *cp_host_, *dp_host_;
  float loss_scale_ = 0;
  double host_ms_ = 0;  // host_routing_ms
  int64_t rows_cap_ = 0;  // the bound's rows (grows once past it, with a warning)
  // moe_pools_rows: the stage's pool the states take their rows from (pool_: the chunks' or own_pool_)
  bool pooled_ = false;
  MoERowPool* pool_ = nullptr;
  std::unique_ptr<MoERowPool> own_pool_;
  bool keep_act_ = true;  // moe_keeps_act: else act_ (scratch) holds the activations of the layer at hand
  // full recompute: the one set of kept rows every slot and layer uses (its device buffers; null otherwise)
  std::unique_ptr<LayerState> shared_rows_;
  std::vector<int64_t> moe_layers_;  // the stage's MoE layers (global indices)
  std::vector<std::vector<LayerState*>> state_;  // [slot][moe layer index]
  MoEStats stats_;
  std::vector<std::vector<float>> bias_;           // per MoE layer (E): the expert bias
  std::vector<std::vector<double>> bias_counts_;   // per MoE layer (E): this step's counts for its update
  // global_aux_loss, per MoE layer: the step's counts (E) summed over its micro-batches so far, and
  // how many (Megatron's global_tokens_per_expert and ga_steps)
  std::vector<std::vector<double>> global_counts_;
  std::vector<int64_t> global_steps_;
  // scratch (moe_scratch_bytes)
  float *x32_ = nullptr, *w32_ = nullptr, *logits_ = nullptr, *dx32_ = nullptr;
  int32_t *perm_ = nullptr, *comb_ = nullptr, *regroup_ = nullptr, *inverse_ = nullptr;
  Buf send_, bufA_, bufB_, dact_, dfc_, tmp_, dx_, act_;
  // the probabilities applied in the experts (the GEMMs' rows): the rows' probabilities, their
  // weighted activations, the index lists 0, 1, ... and 0, ...; in backward the rows' d probabilities
  // (d weighted activation . activation; d output . fc2 bias) and, with biases, the weighted d outputs
  float *row_p_ = nullptr, *row_dot_ = nullptr, *row_dot_bias_ = nullptr;
  int32_t *row_ident_ = nullptr, *row_zero_ = nullptr;
  Buf wact_, wdy_;
  MoERowWeights row_weights() const { return {row_p_, wact_, row_ident_, row_zero_}; }
  // the experts' rows' probabilities (s.row_p, uploaded) from this rank's own rows' (expert-major)
  void set_row_probs(LayerState& s, const std::vector<float>& own);
  // the experts' rows' d probabilities from their backward (to the host: waits for it); this rank's own
  // rows' of them (expert-major; summed over the expert-TP group)
  std::vector<float> fetch_row_dots(int64_t rows, bool bias);
  std::vector<float> own_row_dprob(const LayerState& s, std::vector<float> dots);
  Buf y_;  // the moe recompute module: the rerun's output (Nt, C), not needed
  // ETP > 1: the padded all-gather / reduce-scatter buffer (etp blocks of the largest rank's rows) and
  // the maps between it and the experts' rows (expert-major over the group)
  Buf xg_;
  int32_t *tp_regroup_ = nullptr, *tp_scatter_ = nullptr;
  // the allgather dispatcher (EP > 1): the EP group's tokens (their inputs, d outputs, partial
  // outputs and d inputs in turn), the 16-bit reduce-scatter's staging, and the maps of the group's
  // assignments to this rank's experts (model/moe.cpp)
  Buf tokens_, wire_;
  int32_t *perm_g_ = nullptr, *comb_g_ = nullptr;
  void ep_reduce_scatter(Buf out, CBuf group_tokens);
  // the shared expert's scratch: d fc1 output, d activation (N), d output x gate, gate logits (Nt)
  Buf sh_dfc_, sh_dact_, sh_dy_, sh_part_, gate_logit_;
  // the shared_experts module (moe_keeps_shared false): every layer's shared fc1 output and activation,
  // rerun in backward
  Buf sh_fc1_, sh_act_;
  float *gate_f32_ = nullptr;
  int32_t* identity_ = nullptr;  // (Nt) 0, 1, ...: the gate's per-token scaling through combine_rows
  void shared_forward(LayerState& s, const MoEParams<CBuf>& w, CBuf x, Buf y, const MoETPMappings& tp);
  void shared_backward(LayerState& s, const MoEParams<CBuf>& w, const MoEParams<Buf>& g, CBuf x, CBuf dy,
                       const MoETPMappings& tp);
  std::vector<void*> owned_;
  Buf alloc(int64_t n, DType t);
  void alloc_rows_scratch();
  void grow(int64_t rows, int64_t layer);
  // the kept rows at the bound: allocated, or (from, a pooled slot's region) carved and advanced; with
  // full recompute the shared set's (grown first)
  void grow_state(LayerState& s, char** from = nullptr);
  // with the pool: s's rows (etp ? Rx : R) taken from it (any rows of its last forward given back first),
  // and given back once its backward is done
  void take_rows(LayerState& s, int64_t layer);
  void give_rows(LayerState& s);
  Buf act(const LayerState& s) const;  // the activations of s's rows: kept, or act_
  // ETP > 1: the expert-TP group's per-expert rows and the maps (LayerState); the rows of this rank in
  // xg_'s own block gathered over the group into expert-major `out`; partial sums `in` (expert-major
  // over the group) summed back to this rank's rows (returned: xg_'s own block)
  void tp_plan(LayerState& s, const std::vector<int64_t>& own_rows, int64_t layer);
  void tp_upload(const LayerState& s);
  Buf tp_own_block(const LayerState& s) const;
  void tp_gather(const LayerState& s, Buf out);
  Buf tp_reduce(const LayerState& s, CBuf in);
  int moe_index(int64_t layer) const;
  // the router's fp32 operands: x and the weight converted (or the fp32 buffers themselves)
  const float* router_input(CBuf x);
  const float* router_weight(CBuf w);
};

}  // namespace tpt
