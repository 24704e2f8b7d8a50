// The plan's Mixture-of-Experts counts (plan/memory.h, docs/PLAN.md "Mixture-of-Experts"): the expert
// parameters per rank from the MoE sizes against the ParamLayout's expert tensors on every EP rank;
// a stage's MoE activations and scratch against what GPTStage allocates on the CPU; the experts'
// replica group padded and sharded over EDP as the trainer's make_grad_groups and GradSync do; the
// active FLOPs (Megatron's num_floating_point_operations) and the work model's per-layer FLOPs by hand.
#include <gtest/gtest.h>

#include <map>
#include <memory>

#include "core/config.h"
#include "core/error.h"
#include "model/chunks.h"
#include "model/moe.h"
#include "model/param_group.h"
#include "parallel/comm.h"
#include "plan/memory.h"
#include "plan/stage_work.h"

namespace tpt {
namespace {

// A tiny MoE GPT: 4 layers, C 32, E 4 experts of width 48, top-2; B S = 64 tokens per micro-batch.
Config moe_config(const std::string& model, const std::string& parallel, const std::string& training, int world) {
  Config c = parse_config("model: {num_layers: 4, hidden_size: 32, num_attention_heads: 4, seq_length: 16, vocab_size: 97, "
                          "make_vocab_size_divisible_by: 8, num_moe_experts: 4, moe_ffn_hidden_size: 48, "
                          "moe_router_topk: 2" + model + "}\nparallel: {" + parallel +
                              "}\ntraining: {micro_batch_size: 4, global_batch_size: 16, train_iters: 1" + training +
                              "}\ndata: {path: unused}\n",
                          "memory_moe_test");
  resolve_parallel(c, world);
  return c;
}

int64_t expert_elements(const ParamLayout& l) {
  int64_t n = 0;
  for (const ParamInfo& p : l.params)
    if (p.group.replicas == ReplicaGroup::ExpertData) n += p.numel;
  return n;
}

// A communicator of `n` ranks that moves nothing: only its size matters to the buffers' layout.
struct SizedComm final : Comm {
  explicit SizedComm(int n) : n_(n) {}
  int rank() const override { return 0; }
  int size() const override { return n_; }
  void exchange(const std::vector<Message>&) override {}
  void barrier() override {}

 protected:
  void do_all_reduce(void*, int64_t, DType, ReduceOp) override {}
  void do_all_gather(void*, const void*, int64_t, DType) override {}
  void do_reduce_scatter(void*, const void*, int64_t, DType) override {}
  void do_broadcast(void*, int64_t, DType, int) override {}
  void do_all_to_all_v(const void*, const std::vector<int64_t>&, void*, const std::vector<int64_t>&, DType) override {}

 private:
  int n_;
};

const char* kFreqs[] = {"", ", moe_layer_freq: [0, 1, 0, 1]", ", moe_layer_freq: [0, 1, 1, 1]"};
// a shared expert of width 32 with its sigmoid gate (dense parameters of the MoE layer)
const char* kShared = ", moe_shared_expert_intermediate_size: 32, moe_shared_expert_gate: true";

// With the experts split over TP (ETP = TP 2): on every (EP, ETP) rank expert_parameters equals the
// layout's expert tensors, each a box of E / EP experts and Fe / 2 of their width (fc1 rows, fc2
// columns), fc2's bias whole on both TP ranks (a TP copy, tp rank 0's primary, its gradient summed
// over TP); over the ranks every element of every expert tensor is in exactly one primary box.
TEST(MemoryMoE, ExpertTensorParallelBoxesCoverEveryExpertOnce) {
  for (const char* mlp : {"", ", swiglu: true, ffn_hidden_size: 96"}) {
    const Config c = moe_config(mlp, "tensor_model_parallel_size: 2, sequence_parallel: true", "", 2);
    ASSERT_EQ(c.parallel.expert_tensor_parallel_size, 2);
    const int64_t C = 32, Fe = 48, E = 4, F1 = c.model.swiglu ? 2 * Fe : Fe;
    for (int ep : {1, 2}) {
      std::map<std::string, int64_t> covered;  // expert tensor -> elements in primary boxes
      for (int r = 0; r < ep; ++r)
        for (int t = 0; t < 2; ++t) {
          const std::string where = std::string(mlp) + " ep " + std::to_string(ep) + "/" + std::to_string(r) + " etp " +
                                    std::to_string(t);
          GPTDims d = make_chunk_dims(c, 2, t, 1, 0).front();
          apply_expert_parallel(d, ep, r, 2, t);
          EXPECT_EQ(d.moe.Fel, Fe / 2) << where;
          const ParamLayout l = make_param_layout(d);
          EXPECT_EQ(expert_parameters(d), expert_elements(l)) << where;
          EXPECT_EQ(expert_elements(l), 4 * E / ep * (F1 / 2 * C + C * Fe / 2 + F1 / 2 + C)) << where;
          for (const ParamInfo& p : l.params) {
            if (p.group.replicas != ReplicaGroup::ExpertData) continue;
            const bool fc2_bias = p.name.find("fc2.bias") != std::string::npos;
            EXPECT_EQ(p.box_offset.front(), r * E / ep) << where << " " << p.name;
            EXPECT_EQ(p.group.copy, fc2_bias ? ModelCopy::TensorParallel : ModelCopy::None) << where << " " << p.name;
            EXPECT_EQ(p.group.primary, !fc2_bias || t == 0) << where << " " << p.name;
            if (p.group.primary) covered[p.name] += p.numel;
            bool summed = false;  // over TP even without sequence parallelism (etp rank 0's gradient)
            for (const GradRange& g : tp_replicated_ranges(l, false))
              summed = summed || (g.offset <= p.offset && p.offset + p.numel <= g.offset + g.n);
            EXPECT_EQ(summed, fc2_bias) << where << " " << p.name;
          }
        }
      for (const auto& [name, n] : covered) {
        int64_t global = 1;
        for (const ParamInfo& p : make_param_layout(make_chunk_dims(c, 1, 0, 1, 0).front()).params)
          if (p.name == name)
            for (int64_t x : p.global_shape) global *= x;
        EXPECT_EQ(n, global) << mlp << " ep " << ep << " " << name;
      }
    }
  }
}

// expert_parameters (from the MoE sizes: E / EP experts x (fc1 + fc2 [+ biases]) per MoE layer)
// equals the layout's expert tensors on every EP rank, stage and model chunk; the boxes are the EP
// rank's experts; the plan counts each expert once and the active parameters as k / E of them.
TEST(MemoryMoE, ExpertParametersEqualTheLayout) {
  for (const char* mlp : {"", ", swiglu: true, ffn_hidden_size: 96, add_bias_linear: false"})
    for (const char* freq : kFreqs)
      for (int pp : {1, 2})
        for (int v : {1, 2}) {
          if (v > 1 && pp == 1) continue;
          const std::string vp = v > 1 ? ", virtual_pipeline_model_parallel_size: 2" : "";
          const Config c = moe_config(std::string(mlp) + freq, "pipeline_model_parallel_size: " + std::to_string(pp) + vp, "", pp);
          const bool swiglu = c.model.swiglu, bias = c.model.add_bias_linear;
          const int64_t C = 32, Fe = 48, E = 4, F1 = swiglu ? 2 * Fe : Fe;
          const int64_t per_expert = F1 * C + C * Fe + (bias ? F1 + C : 0);
          int64_t moe_layers = 0;
          for (int64_t l = 0; l < 4; ++l) moe_layers += c.model.is_moe_layer(l) ? 1 : 0;
          int64_t seen = 0;  // expert elements over the stages on EP rank 0 of EP 1
          for (int ep : {1, 2, 4})
            for (int s = 0; s < pp; ++s)
              for (int r = 0; r < ep; ++r) {
                const std::string where = std::string(mlp) + freq + " pp " + std::to_string(pp) + " v " +
                                          std::to_string(v) + " ep " + std::to_string(ep) + "/" + std::to_string(r) +
                                          " stage " + std::to_string(s);
                std::vector<GPTDims> chunks = make_chunk_dims(c, 1, 0, pp, s);
                int64_t by_hand = 0, counted = 0;
                for (GPTDims& d : chunks) {
                  apply_expert_parallel(d, ep, r);
                  for (int64_t l = d.layer_begin; l < d.layer_end; ++l) by_hand += c.model.is_moe_layer(l) ? E / ep * per_expert : 0;
                  counted += expert_parameters(d);
                  const ParamLayout one = make_param_layout(d);
                  EXPECT_EQ(expert_parameters(d), expert_elements(one)) << where;
                  for (const ParamInfo& p : one.params)
                    if (p.group.replicas == ReplicaGroup::ExpertData) {
                      EXPECT_EQ(p.global_shape.front(), E) << where << " " << p.name;
                      EXPECT_EQ(p.box_offset.front(), r * E / ep) << where << " " << p.name;
                      EXPECT_EQ(p.box_size.front(), E / ep) << where << " " << p.name;
                    }
                }
                const ParamLayout layout = make_rank_layout(chunks, replica_group_align(c));
                EXPECT_EQ(counted, by_hand) << where;
                EXPECT_EQ(expert_elements(layout), by_hand) << where;
                EXPECT_EQ(stage_memory(c, s, chunks, false).expert_parameters_per_rank, by_hand) << where;
                if (ep == 1) seen += by_hand;
              }
          EXPECT_EQ(seen, moe_layers * E * per_expert);
          const Plan p = make_plan(c, PlanOptions{});
          EXPECT_EQ(p.expert_parameters, moe_layers * E * per_expert);
          EXPECT_EQ(p.active_parameters, p.total_parameters - moe_layers * (E - 2) * per_expert);
          EXPECT_EQ(p.ep, 1);
          EXPECT_EQ(p.edp, 1);
        }
}

// What GPTStage allocates for an MoE stage (its MoEMLP's kept rows per slot and its scratch) is the
// plan's activations + workspace, for every precision and recompute mode, GELU and SwiGLU experts, a
// gated shared expert, dense and MoE layers mixed, on both stages of PP 2, with ZB-H1's split backward.
TEST(MemoryMoE, StageAllocatesWhatThePlanCounts) {
  for (const char* precision : {"fp32", "bf16", "fp16"})
    for (const char* recompute : {"none", "selective", "full"})
      for (const char* mlp : {"", ", swiglu: true, ffn_hidden_size: 96", kShared})
        for (const char* freq : {kFreqs[0], kFreqs[1]})
          for (int pp : {1, 2})
            for (bool zb : {false, true}) {
              if (zb && (pp == 1 || std::string(recompute) == "full")) continue;
              const Config c = moe_config(std::string(mlp) + freq,
                                          "pipeline_model_parallel_size: " + std::to_string(pp) +
                                              (zb ? ", pipeline_schedule: zb-h1" : ""),
                                          std::string(", precision: ") + precision + ", recompute: " + recompute, pp);
              const DType t = compute_dtype(c);
              for (int s = 0; s < pp; ++s) {
                const std::string where = std::string(precision) + " " + recompute + mlp + freq + " pp" +
                                          std::to_string(pp) + (zb ? " zb-h1" : "") + " stage " + std::to_string(s);
                const GPTDims d = make_dims(c, 1, 0, pp, s);
                const ParamLayout layout = make_rank_layout({d}, replica_group_align(c));
                const StageMemory m = stage_memory(c, s, false);
                EXPECT_EQ(m.gradient_bytes, layout.total * 4) << where;  // one rank: no padding
                std::unique_ptr<Ops> ops = make_cpu_ops(1);
                std::unique_ptr<Comm> comm = make_self_comm();
                std::vector<float> grads(size_t(layout.total)), params(size_t(layout.total));
                const int64_t before = ops->allocated_bytes();
                {
                  StageOptions o{t, c.training.recompute};
                  o.split_backward = zb;
                  GPTStage stage(d, layout, *ops, *comm, CBuf(params.data(), t), grads.data(), 4, m.in_flight, o);
                  EXPECT_EQ(ops->allocated_bytes() - before, m.activation_bytes + m.workspace_bytes) << where;
                }
                EXPECT_EQ(ops->allocated_bytes(), before) << where;
              }
            }
}

// The experts' replica group with the distributed optimizer: the plan's parameter buffer and
// optimizer shard are the trainer's (make_grad_groups over a DP x CP group for the dense tensors and
// an EDP group for the experts, then GradSync's owned blocks), for EP 1 (EDP = DP) and, counted
// ahead of the trainer's EP groups, EP 2 and 4 (EDP = DP / EP).
TEST(MemoryMoE, DistributedOptimizerShardsTheExpertsOverEDP) {
  for (const char* freq : kFreqs)
    for (const char* precision : {"fp32", "bf16"})
      for (int ep : {1, 2, 4}) {
        Config c = moe_config(freq, "data_parallel_size: 4, distributed_optimizer: true",
                              std::string(", precision: ") + precision, 4);
        c.parallel.expert_model_parallel_size = ep;  // past check_moe_parallel: the plan's count is general
        const int edp = 4 / ep;
        ASSERT_EQ(expert_data_parallel_size(c), edp);
        const std::string where = std::string(freq) + " " + precision + " ep " + std::to_string(ep);
        std::vector<GPTDims> chunks = make_chunk_dims(c, 1, 0, 1, 0);
        for (GPTDims& d : chunks) apply_expert_parallel(d, ep, 0);
        const ParamLayout layout = make_rank_layout(chunks, replica_group_align(c));
        SizedComm dense(4), experts(edp);
        const std::vector<GradGroup> groups = make_grad_groups(layout, rank_layers(chunks), true, [&](ReplicaGroup g) {
          return ReplicaComm{g == ReplicaGroup::Dense ? &dense : &experts, 1.0f};
        });
        ASSERT_EQ(groups.size(), 2u) << where;
        const int64_t buffer = grad_buffer_size(layout, groups);
        std::vector<float> grads(static_cast<size_t>(buffer));
        std::unique_ptr<Ops> ops = make_cpu_ops(1);
        GradSyncOptions o;
        o.distributed_optimizer = true;
        const GradSync sync(*ops, grads.data(), groups, nullptr, {}, o);
        const StageMemory m = stage_memory(c, 0, false);
        EXPECT_EQ(m.parameter_buffer, buffer) << where;
        EXPECT_EQ(m.expert_buffer, groups[1].span.n) << where;
        EXPECT_EQ(m.gradient_bytes, 4 * buffer) << where;
        EXPECT_EQ(m.optimizer_bytes, 8 * sync.owned_size()) << where;
        const int64_t owned = groups[0].span.n / 4 + groups[1].span.n / edp;  // by hand
        EXPECT_EQ(sync.owned_size(), owned) << where;
        EXPECT_EQ(m.weight_bytes, c.training.precision == Precision::FP32 ? 4 * buffer : 2 * buffer + 4 * owned) << where;
      }
}

// The TFLOP/s the trainer logs counts an MoE model's active FLOPs as Megatron's
// num_floating_point_operations: per token and layer 6 x 2 h (F x ffn_factor) for a dense MLP and
// 6 x 2 h ((Fe x k + Fs) x ffn_factor) for an MoE one (ffn_factor 3 with SwiGLU, else 2; Fs the shared
// expert's width), the router and the shared expert's gate not counted; attention and logits as for the dense model.
TEST(MemoryMoE, ModelFlopsAreMegatronsActiveFlops) {
  for (const char* mlp : {"", ", swiglu: true, ffn_hidden_size: 96", kShared})
    for (const char* freq : kFreqs) {
      const Config c = moe_config(std::string(mlp) + freq, "", "", 1);
      Config dense = c;
      dense.model.num_moe_experts = 0;
      const double tokens = 16.0 * 16, h = 32, F = c.model.ffn_hidden_size, Fe = 48, k = 2, V = 104;
      const double Fs = c.model.moe_shared_expert_intermediate_size;  // Megatron counts it per MoE layer
      const double ffn = c.model.swiglu ? 3 : 2;
      double moe_layers = 0;
      for (int64_t l = 0; l < 4; ++l) moe_layers += c.model.is_moe_layer(l) ? 1 : 0;
      // Megatron's terms: attention (4 h (h + h) + s h for MHA, causal) per layer, MLP, logits
      const double attention = 4 * 3 * (2 * h * h) + 3 * 2 * 16 * h;  // x 4 layers below
      const double by_hand = tokens * (4 * attention + 6 * h * (F * ffn * (4 - moe_layers) + (Fe * k + Fs) * ffn * moe_layers) +
                                       6 * h * V);
      EXPECT_NEAR(iteration_model_flops(c, 104) / by_hand, 1.0, 1e-12) << mlp << freq;
      const double dense_by_hand = tokens * (4 * attention + 6 * h * F * ffn * 4 + 6 * h * V);
      EXPECT_NEAR(iteration_model_flops(dense, 104) / dense_by_hand, 1.0, 1e-12) << mlp << freq;
    }
}

// The work model's MoE layer (plan/stage_work.h): attn.qkv and attn.proj on all N tokens, the router
// 2 Nt C E, each token's k experts 2 k (C fc1_width + Fe C); the dense layers as before; what the
// plan computes per iteration is the sum over the layers (forward, twice that backward, the
// flash-style rescoring).
TEST(MemoryMoE, WorkModelCountsEachLayersSpec) {
  const Config c = moe_config(", swiglu: true, ffn_hidden_size: 96, moe_layer_freq: [0, 1, 0, 1]", "", "", 1);
  const GPTDims d = make_dims(c, 1, 0, 1, 0);
  const ChunkWork w = chunk_work(c, d);
  const double N = 64, C = 32, E = 4, k = 2, Fe = 48, F = c.model.ffn_hidden_size, S = 16;
  EXPECT_EQ(w.moe_layers, 2);
  EXPECT_EQ(w.dense_layers(), 2);
  const double attention_linears = 2 * N * (C * 3 * C + C * C);
  EXPECT_EQ(w.linear_flops(), attention_linears + 2 * N * (C * 2 * F + F * C));
  EXPECT_EQ(w.moe_linear_flops(), attention_linears + 2 * N * C * E + 2 * N * k * (C * 2 * Fe + Fe * C));
  EXPECT_EQ(w.row_parallel_layers(), 2 * 2 + 2 * 1);  // dense: proj, fc2; MoE: proj
  EXPECT_EQ(w.column_parallel_layers(), 2 * 2 + 2 * 1);
  const Plan p = make_plan(c, PlanOptions{});
  const double attention = 2 * N * S * C;  // causal half of scores + weighted sum
  const double fwd = 2 * (w.linear_flops() + attention) + 2 * (w.moe_linear_flops() + attention) + 2 * N * C * 104;
  const double per_mb = 3 * fwd + 4 * attention / 2;
  EXPECT_NEAR(p.hardware_flops_per_iteration / (4 * per_mb), 1.0, 1e-12);
}

// The recompute modules by hand (bf16, EP 2 on 2 ranks, the 4 MoE layers' rows bound 2 x 64 x 2 = 256,
// their pool's share 1.25 x 64 x 2 = 160 rows per layer and micro-batch): moe_act moves each layer's
// activations (160 x 48 in the pool) from every in-flight micro-batch to one scratch buffer (256 x 48),
// layernorm each layer's ln1 and ln2 (64 x 32) to one in the shared scratch; full recompute (and the moe
// module) keeps no MoE rows per micro-batch and one set of them (at the bound) in the scratch. With the
// pool at the dispatch bound a layer plans what a slot's own rows at the bound would. The plan then
// suggests the modules and the dispatch bound at 1.1x, each planning less than the configured run.
TEST(MemoryMoE, RecomputeModulesMoveKeptTensorsToOneScratch) {
  const std::string par = "expert_model_parallel_size: 2", bf16 = ", precision: bf16, recompute: ";
  const StageMemory sel = stage_memory(moe_config("", par, bf16 + "selective", 2), 0);
  const StageMemory act = stage_memory(moe_config("", par, bf16 + "selective, recompute_modules: [core_attn, moe_act]", 2), 0);
  const StageMemory norms = stage_memory(moe_config("", par, bf16 + "selective, recompute_modules: [core_attn, layernorm]", 2), 0);
  const int64_t act_bytes = 256 * 48 * 2, pooled_act_bytes = 160 * 48 * 2, norm_bytes = 64 * 32 * 2;
  ASSERT_GE(sel.in_flight, 1);
  EXPECT_EQ(sel.activation_bytes - act.activation_bytes, int64_t(sel.in_flight) * 4 * pooled_act_bytes);
  EXPECT_EQ(act.workspace_bytes - sel.workspace_bytes, act_bytes);
  EXPECT_EQ(sel.activation_bytes - norms.activation_bytes, int64_t(sel.in_flight) * 4 * 2 * norm_bytes);
  EXPECT_EQ(norms.workspace_bytes - sel.workspace_bytes, norm_bytes);
  // full recompute: the kept rows (xin 256 x 32, fc1 256 x 48, act 256 x 48) once; no layer keeps
  // the rows its experts return (the probabilities are applied in the experts)
  GPTDims d = make_chunk_dims(moe_config("", par, bf16 + "full", 2), 1, 0, 1, 0).at(0);
  apply_expert_parallel(d, 2, 0, 1, 0);
  const int64_t rows = 2 * (256 * 32 + 256 * 48 + 256 * 48);
  EXPECT_TRUE(moe_pools_rows(d.moe, Recompute::None));
  EXPECT_EQ(moe_pool_layer_bytes(d, 64, DType::BF16, Recompute::None), 2 * 160 * (32 + 48 + 48));
  EXPECT_EQ(moe_layer_bytes(d, 64, DType::BF16, Recompute::None), 2 * 160 * (32 + 48 + 48));
  d.moe.kept_factor = d.moe.dispatch_factor;
  EXPECT_EQ(moe_layer_bytes(d, 64, DType::BF16, Recompute::None), rows);
  d.moe.kept_factor = 1.25;
  EXPECT_EQ(moe_scratch_bytes(d, 64, DType::BF16, Recompute::Full) - moe_scratch_bytes(d, 64, DType::BF16, Recompute::None),
            rows);
  EXPECT_EQ(moe_layer_bytes(d, 64, DType::BF16, Recompute::Full), 0);
  // the moe module: the same one set under selective recompute, and the rerun's output (64 x 32)
  d.moe.recompute_moe = true;
  EXPECT_EQ(moe_layer_bytes(d, 64, DType::BF16, Recompute::Selective), 0);
  EXPECT_EQ(moe_scratch_bytes(d, 64, DType::BF16, Recompute::Selective) - moe_scratch_bytes(d, 64, DType::BF16, Recompute::None),
            rows + 64 * 32 * 2);
  PlanOptions o;
  o.device_memory_gib = 1e-4;  // nothing fits: every suggestion is listed
  const Plan p = make_plan(moe_config("", par, bf16 + "selective", 2), o);
  int64_t modules = -1, bound = -1;
  for (const PlanSuggestion& s : p.suggestions) {
    if (s.change.find("recompute_modules=[core_attn, moe_act, layernorm]") != std::string::npos) modules = s.peak_bytes;
    if (s.change == "model.moe_dispatch_bound_factor=1.1 model.moe_kept_rows_factor=1.1") bound = s.peak_bytes;
  }
  const int64_t peak = p.stages.at(0).total_bytes();
  EXPECT_GT(modules, 0);
  EXPECT_LT(modules, peak);
  EXPECT_GT(bound, 0);
  EXPECT_LT(bound, peak);
}

}  // namespace
}  // namespace tpt
