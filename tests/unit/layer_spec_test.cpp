// The layer spec (model/layer_spec.h) as the one place a block's structure is written: the dense
// block's records against the shapes Megatron's layers have (written out here by hand), and a
// test-only linear layer added as one record -- its parameters and their TP boxes, its checkpoint
// tensors, the plan's bytes, the ZB-H1 stash, the FLOPs and the op profile's GEMM name all follow,
// each checked against a count made here from the record's shape alone.
#include <gtest/gtest.h>

#include <filesystem>
#include <numeric>

#include <unistd.h>

#include "core/config.h"
#include "model/chunks.h"
#include "model/gpt.h"
#include "plan/memory.h"
#include "plan/stage_work.h"
#include "parallel/checkpoint.h"
#include "parallel/comm.h"

namespace tpt {
namespace {

constexpr int64_t kExtra = 24;  // the test-only layer's global output features

// A column-parallel "attn.extra" (kExtra, C) with a bias, after the dense block's parts.
void add_extra_linear(GPTDims& d) {
  LayerPart p;
  p.is_linear = true;
  p.linear = {"attn.extra", {kExtra, d.C}, 0, LinearSplit::Column, true, d.C, kExtra / d.tp, 0.02f};
  d.layer.parts.push_back(p);
}

int64_t aligned(int64_t n) { return (n + 15) / 16 * 16; }  // the parameter buffer's 64-byte tensors

// 4 layers, hidden 16, 2 heads (head dim 8), ffn 64, sequences of 8 tokens, micro-batches of 2
Config tiny(int tp, int pp, const std::string& schedule = "1f1b", const std::string& model_extra = "") {
  Config c = parse_config(
      "model: {num_layers: 4, hidden_size: 16, num_attention_heads: 2, ffn_hidden_size: 64, seq_length: 8, "
      "vocab_size: 37, make_vocab_size_divisible_by: 8" + model_extra + "}\n"
      "parallel: {tensor_model_parallel_size: " + std::to_string(tp) + ", pipeline_model_parallel_size: " +
          std::to_string(pp) + ", pipeline_schedule: " + schedule + "}\n"
      "training: {micro_batch_size: 2, global_batch_size: 8, train_iters: 1}\ndata: {path: unused}\n",
      "layer_spec_test");
  resolve_parallel(c, tp * pp);
  return c;
}

TEST(LayerSpec, DenseBlockIsMegatronsLayers) {
  for (bool llama : {false, true}) {
    const Config c = tiny(2, 1, "1f1b",
                          llama ? ", swiglu: true, group_query_attention: true, num_query_groups: 2, "
                                  "add_bias_linear: false, normalization: RMSNorm"
                                : "");
    const GPTDims d = make_dims(c, 2, 1, 1, 0);
    const LayerSpec& s = d.layer;
    ASSERT_EQ(s.parts.size(), size_t(kDenseParts));
    const char* names[] = {"ln_1", "attn.qkv", "attn.proj", "ln_2", "mlp.fc1", "mlp.fc2"};
    for (int i = 0; i < kDenseParts; ++i) EXPECT_EQ(s.parts[size_t(i)].name(), names[i]);
    const int64_t C = 16, F = 64, D = 8, H = 2;
    const LinearSpec &qkv = s.linear(kQkv), &proj = s.linear(kProj), &fc1 = s.linear(kFc1), &fc2 = s.linear(kFc2);
    EXPECT_EQ(qkv.split, LinearSplit::Column);
    EXPECT_EQ(proj.split, LinearSplit::Row);
    EXPECT_EQ(fc1.split, LinearSplit::Column);
    EXPECT_EQ(fc2.split, LinearSplit::Row);
    // each rank's GEMM widths: q, k, v of its one head (of two; one KV group each with GQA), its half of F
    EXPECT_EQ(qkv.in, C);
    EXPECT_EQ(qkv.out, 3 * D);
    EXPECT_EQ(proj.in, D);
    EXPECT_EQ(proj.out, C);
    EXPECT_EQ(fc1.out, llama ? 2 * F / 2 : F / 2);
    EXPECT_EQ(fc2.in, F / 2);
    if (llama) EXPECT_EQ(qkv.weight_shape, (std::vector<int64_t>{2, 3, D, C}));
    else EXPECT_EQ(qkv.weight_shape, (std::vector<int64_t>{3, H * D, C}));
    EXPECT_EQ(proj.bias_shape(), std::vector<int64_t>{C});
    EXPECT_EQ(fc1.bias, !llama);
    EXPECT_EQ(s.index("mlp.fc2"), kFc2);
  }
}

TEST(LayerSpec, OneRecordAddsALinearLayerEverywhere) {
  const int tp = 2, pp = 2;
  const Config c = tiny(tp, pp, "zb-h1");
  const int64_t B = c.training.micro_batch_size, N = B * c.model.seq_length, C = c.model.hidden_size;
  const int64_t rows = kExtra / tp, layers_per_stage = 2;
  const int64_t w_elems = rows * C, b_elems = rows;  // one TP rank's box of the weight and the bias
  for (int stage = 0; stage < pp; ++stage) {
    for (int tp_rank = 0; tp_rank < tp; ++tp_rank) {
      const GPTDims plain = make_dims(c, tp, tp_rank, pp, stage);
      GPTDims d = plain;
      add_extra_linear(d);
      const ParamLayout before = make_param_layout(plain), after = make_param_layout(d);
      // parameters: two tensors more per layer, boxes of this TP rank's rows, in the layer's range
      ASSERT_EQ(after.params.size(), before.params.size() + 2 * layers_per_stage);
      EXPECT_EQ(after.total, before.total + layers_per_stage * (aligned(w_elems) + aligned(b_elems)));
      const std::vector<GradRange> ranges = layer_ranges(after, d);
      for (int64_t l = d.layer_begin; l < d.layer_end; ++l) {
        const std::string pre = "h." + std::to_string(l) + ".attn.extra.";
        const ParamInfo* w = after.find(pre + "weight");
        const ParamInfo* b = after.find(pre + "bias");
        ASSERT_TRUE(w && b) << pre;
        EXPECT_EQ(w->global_shape, (std::vector<int64_t>{kExtra, C}));
        EXPECT_EQ(w->box_offset, (std::vector<int64_t>{tp_rank * rows, 0}));
        EXPECT_EQ(w->box_size, (std::vector<int64_t>{rows, C}));
        EXPECT_EQ(b->global_shape, std::vector<int64_t>{kExtra});
        EXPECT_EQ(b->box_offset, std::vector<int64_t>{tp_rank * rows});
        EXPECT_TRUE(w->weight_decay);
        EXPECT_EQ(w->group.copy, ModelCopy::None);
        EXPECT_EQ(w->group.replicas, ReplicaGroup::Dense);
        const GradRange& r = ranges[size_t(l - d.layer_begin)];
        EXPECT_GE(w->offset, r.offset);
        EXPECT_EQ(b->offset + b->numel, r.offset + r.n);  // the layer's last tensor now
      }
      // the ZB-H1 stash: one (N, out) output gradient more per layer
      for (DType t : {DType::F32, DType::BF16})
        EXPECT_EQ(weight_grad_stash_bytes(d, B, t) - weight_grad_stash_bytes(plain, B, t),
                  layers_per_stage * int64_t(dtype_size(N * rows, t)));
      // FLOPs: 2 N in out more per layer; the op profile names the GEMM
      const ChunkWork wd = chunk_work(c, d), wp = chunk_work(c, plain);  // the plan's work model
      EXPECT_EQ(wd.linears.size(), wp.linears.size() + 1);
      EXPECT_EQ(wd.linear_flops() - wp.linear_flops(), 2.0 * N * C * rows);
      EXPECT_EQ(wd.column_parallel(), wp.column_parallel() + 1);
      EXPECT_EQ(linear_name(d, C, rows), "attn.extra");
      EXPECT_EQ(linear_name(plain, C, rows), std::to_string(C) + "->" + std::to_string(rows));
    }
    // the plan: weights, gradients and optimizer state of the new tensors, and the stash per slot
    std::vector<GPTDims> chunks = make_chunk_dims(c, tp, 0, pp, stage);
    const StageMemory m0 = stage_memory(c, stage, chunks, false);
    EXPECT_EQ(m0.total_bytes(), stage_memory(c, stage, false).total_bytes());  // the two forms agree
    for (GPTDims& d : chunks) add_extra_linear(d);
    const StageMemory m1 = stage_memory(c, stage, chunks, false);
    const int64_t elems = layers_per_stage * (aligned(w_elems) + aligned(b_elems));
    EXPECT_EQ(m1.parameters_per_rank - m0.parameters_per_rank, layers_per_stage * (w_elems + b_elems));
    EXPECT_EQ(m1.weight_bytes - m0.weight_bytes, 4 * elems);  // fp32: the master weights are the weights
    EXPECT_EQ(m1.gradient_bytes - m0.gradient_bytes, 4 * elems);
    EXPECT_EQ(m1.optimizer_bytes - m0.optimizer_bytes, 8 * elems);
    const int slots = m0.in_flight;  // one chunk per stage
    EXPECT_EQ(m1.activation_bytes - m0.activation_bytes, slots * layers_per_stage * 4 * N * rows);
  }
}

// A checkpoint of the extended layout names the new tensors with their global shapes, and a rank's
// box reads back what the other TP rank wrote (the boxes come from the layout alone).
TEST(LayerSpec, CheckpointTensorsFollowTheRecord) {
  const int tp = 2;
  const Config c = tiny(tp, 1);
  const auto dir = std::filesystem::temp_directory_path() / ("tpt_layer_spec_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  auto self = make_self_comm();
  std::vector<std::vector<float>> data(tp);
  std::vector<ParamLayout> layouts;
  for (int r = 0; r < tp; ++r) {
    GPTDims d = make_dims(c, tp, r, 1, 0);
    add_extra_linear(d);
    layouts.push_back(make_param_layout(d));
  }
  {
    CheckpointWriter w(*self, dir.string(), 1);
    for (int r = 0; r < tp; ++r) {
      data[size_t(r)].resize(size_t(layouts[size_t(r)].total));
      std::iota(data[size_t(r)].begin(), data[size_t(r)].end(), float(1000 * r));
      std::vector<CkptTensor> tensors;
      for (const ParamInfo& p : layouts[size_t(r)].params)
        if (p.group.primary) tensors.push_back({p, data[size_t(r)].data() + p.offset});
      w.write_file(model_shard_name(r, 0), tensors);
    }
    w.commit(nlohmann::json::object(), 1);
  }
  LoadRequest req;
  req.dir = dir.string();
  for (const ParamInfo& p : layouts[1].params) req.wanted.push_back({p, nullptr});
  auto reader = CheckpointReader::open(*self, req);
  ASSERT_TRUE(reader);
  ASSERT_EQ(reader->tensors().count("h.1.attn.extra.weight"), 1u);
  EXPECT_EQ(reader->tensors().at("h.1.attn.extra.weight"), (std::vector<int64_t>{kExtra, c.model.hidden_size}));
  EXPECT_EQ(reader->tensors().at("h.0.attn.extra.bias"), std::vector<int64_t>{kExtra});
  // TP rank 1's box of the bias, read back: what rank 1 wrote there
  const ParamInfo* b1 = layouts[1].find("h.0.attn.extra.bias");
  std::vector<float> got(size_t(b1->numel));
  reader->read({*b1, got.data()});
  for (int64_t i = 0; i < b1->numel; ++i) EXPECT_EQ(got[size_t(i)], data[1][size_t(b1->offset + i)]);
  reader.reset();
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace tpt
