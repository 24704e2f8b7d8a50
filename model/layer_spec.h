// The transformer layer written down once, as data (docs/ARCHITECTURE.md "Model"): the layer spec,
// in the spirit of megatron-core's ModuleSpec / submodules. A layer is a list of parts in parameter
// order -- norms and linear layers -- and each linear layer is one record: its name, global weight
// shape, how that weight is split over the tensor-parallel group, whether it has a bias, the widths
// of this rank's GEMM and where its input and output live. Everything that depends on the layer's
// structure is derived from it:
//   the parameters, their names and checkpoint boxes   make_param_layout (model/params.cpp)
//   the gradient buckets' layer ranges                 layer_ranges
//   the ZB-H1 weight-gradient stash                    weight_grad_stash_bytes, GPTStage's LayerStash
//   the plan's work model: GEMMs, FLOPs, TP messages   plan/stage_work.h (plan/memory.cpp, step_time.cpp)
//   the GPU's bias-gradient buffers                    plan/memory.cpp gpu_backend_workspace
//   the op profile's GEMM names                        linear_name
// Adding a linear layer is one new record here; the block's forward and backward (model/gpt.cpp,
// model/block.h) stay explicit code that names the parts it runs (DensePart).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace tpt {

struct GPTDims;

// How a linear layer's weight is split over the TP group (Megatron's tensor_parallel layers):
//   Column  ColumnParallelLinear: the output features are split (weight dimension split_dim); the
//           input is the norm output of all N tokens (with sequence parallelism all-gathered over TP),
//           the output this rank's features of all N tokens; its bias is split the same way.
//   Row     RowParallelLinear: the input features are split (the weight's last dimension); the input
//           is a column-parallel layer's output on this rank, the output partial sums over the TP
//           group (all-reduced, or with sequence parallelism reduce-scattered to this rank's tokens);
//           its bias (C) is replicated over TP and added once.
//   Replicated  the whole weight on every TP rank (e.g. a router), input and output all N tokens.
enum class LinearSplit { Column, Row, Replicated };

struct LinearSpec {
  std::string name;                   // "attn.qkv": the tensors <layer prefix>name.weight / .bias
  std::vector<int64_t> weight_shape;  // global; the last dimension is the input features
  int split_dim = 0;                  // Column: the weight dimension split over TP
  LinearSplit split = LinearSplit::Column;
  bool bias = false;
  int64_t in = 0, out = 0;            // this rank's GEMM: (N, in) @ weight^T -> (N, out)
  float init_std = 0;                 // N(0, init_std), weight-decayed
  // the bias's global shape: the weight's output dimensions (Column / Replicated), or (C) (Row)
  std::vector<int64_t> bias_shape() const;
};

// A norm of the layer: <layer prefix>name.weight (width), and with LayerNorm .bias (width);
// TP-replicated. per_head: over each attention head's D channels (model.qk_layernorm's q and k norms,
// width D): a TP rank applies it to its own heads, so its gradient is a partial sum over TP.
struct NormSpec {
  std::string name;  // "ln_1"
  int64_t width = 0;  // C, or D per head
  bool per_head = false;
};

struct LayerPart {
  bool is_linear = false;
  NormSpec norm;      // !is_linear
  LinearSpec linear;  // is_linear
  const std::string& name() const { return is_linear ? linear.name : norm.name; }
};

struct LayerSpec {
  std::vector<LayerPart> parts;  // in parameter order: a layer's tensors are consecutive in the buffer
  // model.qk_layernorm: the parts attn.q_layernorm and attn.k_layernorm (after the others), else -1
  int q_norm = -1, k_norm = -1;
  // index of the part named `name` (internal_error if there is none)
  int index(const std::string& name) const;
  const LinearSpec& linear(int part) const;
  // the linear layers, in part order
  std::vector<const LinearSpec*> linears() const;
};

// The parts of the dense GPT / LLaMA block in the order make_layer_spec lists them: the indices the
// block's code uses (BlockParams, LayerStash).
enum DensePart : int { kLn1, kQkv, kProj, kLn2, kFc1, kFc2, kDenseParts };

// The dense block of d (its widths and options set): ln_1, attn.qkv, attn.proj, ln_2, mlp.fc1, mlp.fc2,
// and with model.qk_layernorm attn.q_layernorm, attn.k_layernorm (D each; LayerSpec::q_norm, k_norm).
//   attn.qkv   Column, multi-head (3, H D, C) split along the heads (dimension 1), or grouped-query
//              (G, H/G + 2, D, C) -- per group its query heads, its key, its value (Megatron's layout)
//              -- split along the groups; GEMM C -> qkv_width
//   attn.proj  Row, (C, H D); Cl -> C; Megatron's scaled init std / sqrt(2 L)
//   mlp.fc1    Column, (F, C), or with SwiGLU (2, F, C) = [gate; up] split along F so that a rank
//              holds [gate_r; up_r]; C -> fc1_width
//   mlp.fc2    Row, (C, F); Fl -> C; scaled init
LayerSpec make_layer_spec(const GPTDims& d);
// A Mixture-of-Experts layer (docs/MOE.md): the dense block's ln_1, attn.qkv, attn.proj, ln_2, then
// mlp.router (Replicated, (E, C), no bias) -- kMoERouter -- and with a shared expert its
// mlp.shared_experts.fc1 (Column) and .fc2 (Row) as the dense MLP's with width Fs, and with its gate
// mlp.shared_experts.gate (Replicated, (1, C)), then the q/k norms as the dense block's. The routed
// experts are not TP-split linear layers (their weights are split over EP) and are laid out by
// make_param_layout from d.moe.
enum MoEPart : int { kMoERouter = kFc1 };
LayerSpec make_moe_layer_spec(const GPTDims& d);

}  // namespace tpt
