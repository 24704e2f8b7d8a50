// plan/memory.h against hand-computed numbers for published shapes (Megatron's SC21 145.6B, GPT-2
// 124M), the pipeline bubble against (PP-1)/(M+PP-1), and the memory categories against what the CPU
// backend actually allocates for a stage.
#include <gtest/gtest.h>

#include <algorithm>

#include "core/config.h"
#include "core/error.h"
#include "core/gpu_workspace.h"
#include "parallel/comm.h"
#include "plan/memory.h"

namespace tpt {
namespace {

Config config(const std::string& model, const std::string& rest, int world) {
  Config c = parse_config("model: {" + model + "}\n" + rest + "\ndata: {path: unused}\n", "memory_test");
  resolve_parallel(c, world);
  return c;
}

// Megatron-LM SC21 (Narayanan et al. 2021, table 1): 145.6B on 1536 GPUs, TP 8 x PP 8 (DP 24).
Config sc21_145b() {
  return config("num_layers: 80, hidden_size: 12288, num_attention_heads: 96, seq_length: 2048, vocab_size: 51200",
                "parallel: {tensor_model_parallel_size: 8, pipeline_model_parallel_size: 8}\n"
                "training: {micro_batch_size: 1, global_batch_size: 2304, train_iters: 1, precision: bf16, "
                "recompute: full}",
                1536);
}

TEST(Memory, SC21Parameters) {
  const Config c = sc21_145b();
  const int64_t l = 80, h = 12288, s = 2048, V = 51200;  // V = 50 * 128 * 8: no padding
  // per layer 12h^2 + 13h (QKV 3h^2+3h, proj h^2+h, fc1 4h^2+4h, fc2 4h^2+h, two LayerNorms 4h);
  // word and position embeddings (V + s) h; final LayerNorm 2h
  const int64_t expected = l * (12 * h * h + 13 * h) + (V + s) * h + 2 * h;
  EXPECT_EQ(expected, 145622261760LL);  // "145.6B"
  EXPECT_EQ(total_parameters(c), expected);
}

TEST(Memory, SC21FlopsPerIteration) {
  const Config c = sc21_145b();
  const double B = 2304, s = 2048, l = 80, h = 12288, V = 51200;
  // 72 B s l h^2 (1 + s/(12h) + V/(12 l h)) = 72 B s l h^2 + 6 B s^2 l h + 6 B s h V
  const double by_hand = 72 * B * s * l * h * h + 6 * B * s * s * l * h + 6 * B * s * h * V;
  EXPECT_NEAR(by_hand, 4.178715931595243e18, 1e4);
  EXPECT_NEAR(iteration_model_flops(c, 51200) / by_hand, 1.0, 1e-12);
  const Plan p = make_plan(c, PlanOptions{});
  EXPECT_NEAR(p.flops_per_iteration / by_hand, 1.0, 1e-12);
  EXPECT_EQ(p.dp, 24);
  EXPECT_EQ(p.num_microbatches, 96);  // 2304 / (1 * 24)
  // What the ranks compute: the same, plus the flash-style attention backward's second score product
  // (B s^2 h per layer, causal half), plus full recompute's second forward of every layer (24 B s h^2
  // + 2 B s^2 h per layer: the causal half of the attention, as the formula counts it)
  const double rescore = l * B * s * s * h;
  EXPECT_NEAR(p.hardware_flops_per_iteration / (by_hand + rescore + l * (24 * B * s * h * h + 2 * B * s * s * h)),
              1.0, 1e-12);
  Config none = c;
  none.training.recompute = Recompute::None;
  EXPECT_NEAR(make_plan(none, PlanOptions{}).hardware_flops_per_iteration / (by_hand + rescore), 1.0, 1e-12);
}

// Megatron's bf16 model state: 2 (bf16 weights) + 4 (fp32 gradients) + 4 (fp32 master) + 4 + 4 (Adam)
// = 18 B per parameter. Summed over the 64 ranks of one model replica, the parameters each rank holds
// are the model's, plus what is stored more than once: the TP-replicated tensors (LayerNorms, the
// row-parallel biases, the position embedding) 7 more times, and the last stage's copy of the word
// embedding (sharded over TP: V h more in all). All tensor sizes here are multiples of 16 floats, so
// the 64-byte alignment of the parameter buffer adds nothing.
TEST(Memory, SC21ModelStateIs18BytesPerParameter) {
  const Config c = sc21_145b();
  const int64_t l = 80, h = 12288, s = 2048, V = 51200, tp = 8;
  const int64_t replicated = l * 6 * h + s * h + 2 * h;
  const int64_t held = 145622261760LL + (tp - 1) * replicated + V * h;
  int64_t state = 0, elements = 0;
  for (int stage = 0; stage < 8; ++stage) {
    const StageMemory m = stage_memory(c, stage);
    EXPECT_EQ(m.parameter_buffer, m.parameters_per_rank);  // no alignment padding at these sizes
    EXPECT_EQ(m.model_state_bytes(), 18 * m.parameter_buffer);
    state += tp * m.model_state_bytes();
    elements += tp * m.parameters_per_rank;
  }
  EXPECT_EQ(elements, held);
  EXPECT_EQ(state, 18 * held);
  EXPECT_EQ(state, 2636442501120LL);  // 18 * 146,469,027,840
  // per GPU: ~41 GB (Megatron's 18 * 145.6e9 / 64 = 40.9e9, plus the replicas and the tied copy)
  EXPECT_NEAR(double(state) / 64 / 1e9, 41.2, 0.1);
}

// optimizer.store_param_remainders: 2 B per owned element instead of the fp32 master's 4 (SC21 on
// 1536 GPUs: 16 B per parameter, and with the distributed optimizer over DP 24 4 + 10/24).
TEST(Memory, ParamRemaindersHalveTheMasterWeights) {
  for (const bool distributed : {false, true}) {
    Config c = sc21_145b();
    c.parallel.distributed_optimizer = distributed;
    Config r = c;
    r.optimizer.store_param_remainders = true;
    for (int stage : {0, 7}) {
      const StageMemory m = stage_memory(c, stage), mr = stage_memory(r, stage);
      const int64_t owned = distributed ? m.parameter_buffer / 24 : m.parameter_buffer;
      EXPECT_EQ(m.weight_bytes - mr.weight_bytes, 2 * owned) << distributed << " stage " << stage;
      EXPECT_EQ(mr.weight_bytes, 2 * m.parameter_buffer + 2 * owned);
      EXPECT_EQ(mr.gradient_bytes, m.gradient_bytes);
      EXPECT_EQ(mr.optimizer_bytes, m.optimizer_bytes);
      if (!distributed) {
        EXPECT_EQ(mr.model_state_bytes(), 16 * m.parameter_buffer);
      }
    }
  }
}

TEST(Memory, GPT2SmallParameters) {
  // GPT-2 124M: 12 layers, hidden 768, 12 heads, 1024 positions, vocab 50257
  const std::string shape =
      "num_layers: 12, hidden_size: 768, num_attention_heads: 12, seq_length: 1024, vocab_size: 50257";
  const Config c = config(shape, "training: {train_iters: 1}", 1);
  EXPECT_EQ(total_parameters(c), 124439808LL);  // counted with the unpadded vocabulary
  // The padded vocabulary (50304 = 393 * 128 rows) adds 47 zero rows of 768 to the word embedding a
  // rank holds: parameters_per_rank (and the buffer) count them, total_parameters does not.
  const StageMemory m = stage_memory(c, 0);
  EXPECT_EQ(m.parameters_per_rank, 124439808LL + 47 * 768);
  const Config c1 = config(shape + ", make_vocab_size_divisible_by: 1", "training: {train_iters: 1}", 1);
  EXPECT_EQ(stage_memory(c1, 0).parameters_per_rank, 124439808LL);
  EXPECT_EQ(total_parameters(c1), 124439808LL);
}

std::vector<std::vector<Action>> lists(ScheduleKind k, int P, int M) {
  std::vector<std::vector<Action>> v;
  for (int s = 0; s < P; ++s) v.push_back(make_schedule(k, P, s, M));
  return v;
}

TEST(Memory, SimulatedBubbleMatchesAnalytic) {
  for (ScheduleKind k : {ScheduleKind::OneFOneB, ScheduleKind::GPipe})
    for (int P = 1; P <= 8; ++P)
      for (int M = 1; M <= 24; M += 3) {
        const PipelineTiming t = time_pipeline(lists(k, P, M), 1.0, 1.0, 1.0);  // backward = B + W = 2
        EXPECT_DOUBLE_EQ(t.makespan, 3.0 * (M + P - 1)) << "P=" << P << " M=" << M;
        EXPECT_NEAR(t.bubble_fraction(), double(P - 1) / (M + P - 1), 1e-12) << "P=" << P << " M=" << M;
      }
  // a p2p cost of c per message adds 2 (P - 1) c at least (one trip down and back)
  const PipelineTiming t = time_pipeline(lists(ScheduleKind::OneFOneB, 4, 8), 1.0, 1.0, 1.0, 0.25);
  EXPECT_GE(t.makespan, 3.0 * 11 + 2 * 3 * 0.25);
}

// The categories against hand counts, and activations + workspace against the CPU backend's
// allocations for the same stage (the size functions the planner uses are the allocation's), in
// every precision: bf16/fp16 activations take half the bytes of fp32 ones. With sequence parallelism
// (TP 2) the stage allocates what the planner counts too, and less than without it.
TEST(Memory, CategoriesMatchAllocation) {
  // and with model.qk_layernorm: the q/k norms' inputs (N (Hl + Hl) D) and LayerNorm statistics
  for (const bool qk : {false, true})
  for (const char* precision : {"fp32", "bf16", "fp16"})
    for (const char* recompute : {"none", "selective", "full"})
      for (int tp : {1, 2})
        for (int pp : {1, 2})
          for (bool sp : {false, true}) {
          if (sp && tp == 1) continue;  // refused by the config (nothing to split)
          if (qk && std::string(precision) == "fp16") continue;
          const std::string shape =
              std::string("num_layers: 4, hidden_size: 32, num_attention_heads: 4, seq_length: 16, vocab_size: 97, "
                          "make_vocab_size_divisible_by: 8") + (qk ? ", qk_layernorm: true, kv_channels: 12" : "");
          Config c = config(shape,
                            "parallel: {tensor_model_parallel_size: " + std::to_string(tp) +
                                ", pipeline_model_parallel_size: " + std::to_string(pp) +
                                ", sequence_parallel: " + (sp ? "true" : "false") +
                                "}\ntraining: {micro_batch_size: 4, global_batch_size: 16, train_iters: 1, "
                                "precision: " + precision + ", recompute: " + recompute + "}",
                            tp * pp);
          const DType t = std::string(precision) == "bf16"   ? DType::BF16
                          : std::string(precision) == "fp16" ? DType::F16
                                                             : DType::F32;
          Config c32 = c;
          c32.training.precision = Precision::FP32;
          for (int s = 0; s < pp; ++s) {
            const GPTDims d = make_dims(c, tp, 0, pp, s);
            const ParamLayout layout = make_param_layout(d);
            const StageMemory m = stage_memory(c, s), m32 = stage_memory(c32, s);
            const std::string where = std::string(qk ? "qk_layernorm " : "") + precision + " " + recompute + " tp" + std::to_string(tp) +
                                      " pp" + std::to_string(pp) + (sp ? " sp" : "") + " stage " + std::to_string(s);
            ASSERT_EQ(d.sequence_parallel, sp) << where;
            EXPECT_EQ(m.in_flight, std::min(pp - s, 4)) << where;  // 1F1B, M = 4
            EXPECT_EQ(m.gradient_bytes, layout.total * 4) << where;
            EXPECT_EQ(m.optimizer_bytes, layout.total * 8) << where;
            EXPECT_EQ(m.model_state_bytes(), layout.total * (t == DType::F32 ? 16 : 18)) << where;
            if (t != DType::F32) {
              // 16-bit tensors halve; the fp32 ones (LayerNorm statistics, lse, tokens) do not
              const GPTDims d1 = make_dims(c, tp, 0, pp, s);
              const int64_t N = 4 * d1.S, layers = d1.layer_end - d1.layer_begin;
              const int64_t Nt = sp ? N / tp : N;  // LayerNorm statistics: this rank's tokens
              const int64_t f32_per_layer =
                  std::string(recompute) == "full"
                      ? 0
                      : 4 * Nt + (std::string(recompute) == "none" ? 4 * d1.Hl * d1.S : 0) + (qk ? 2 * N * 2 * d1.Hl : 0);
              const int64_t f32 = 2 * N + layers * f32_per_layer + (d1.last_stage() ? 2 * Nt : 0);  // floats
              EXPECT_EQ(m.activation_bytes, (m32.activation_bytes - 4 * f32 * m.in_flight) / 2 + 4 * f32 * m.in_flight)
                  << where;
              EXPECT_EQ(m.buffer_bytes - 2 * N * 4, (m32.buffer_bytes - 2 * N * 4) / 2) << where;
            }
            if (sp) {  // against the same layout without sequence parallelism, by hand
              Config off = c;
              off.parallel.sequence_parallel = false;
              const StageMemory m0 = stage_memory(off, s);
              const int64_t N = 4 * d.S, Nt = N / tp, C = d.C, layers = d.layer_end - d.layer_begin;
              const int64_t e = dtype_bytes(t);
              // per layer: ln1, x_mid, ln2, x_out (Nt, C) and 4 LayerNorm statistics (Nt) instead of N;
              // full recompute keeps only x_out. Per micro-batch also the stage input and the final
              // LayerNorm (last stage); the scratch's dres.
              const int64_t layer_saved = std::string(recompute) == "full" ? e * (N - Nt) * C
                                                                           : 4 * e * (N - Nt) * C + 4 * 4 * (N - Nt);
              const int64_t per_mb = e * (N - Nt) * C + layers * layer_saved +
                                     (d.last_stage() ? e * (N - Nt) * C + 2 * 4 * (N - Nt) : 0);
              EXPECT_EQ(m0.activation_bytes - m.activation_bytes, per_mb * m.in_flight) << where;
              // the scratch: dres, and with full recompute the rebuilt layer's four (., C) tensors and
              // four statistics in the shared scratch, each of which starts at a multiple of 256 bytes
              auto carved = [](int64_t bytes) { return (bytes + 255) / 256 * 256; };
              const int64_t rebuilt = 4 * (carved(e * N * C) - carved(e * Nt * C)) + 4 * (carved(4 * N) - carved(4 * Nt));
              EXPECT_EQ(m0.workspace_bytes - m.workspace_bytes,
                        e * (N - Nt) * C + (std::string(recompute) == "full" ? rebuilt : 0))
                  << where;
              // the receive buffers: an activation on every stage but the first, a gradient on every
              // stage but the last (1F1B receives each just before the pass that reads it)
              const int64_t received = (s > 0 ? 1 : 0) + (s < pp - 1 ? 1 : 0);
              EXPECT_EQ(m0.buffer_bytes - m.buffer_bytes, received * e * (N - Nt) * C) << where;
            }
            std::unique_ptr<Ops> ops = make_cpu_ops(1);
            std::unique_ptr<Comm> comm = make_self_comm();  // construction allocates only
            std::vector<float> grads(size_t(layout.total));
            std::vector<float> params(size_t(layout.total));  // room for any dtype
            const int64_t before = ops->allocated_bytes();
            {
              GPTStage stage(d, layout, *ops, *comm, CBuf(params.data(), t), grads.data(), 4, m.in_flight,
                             StageOptions{t, c.training.recompute});
              EXPECT_EQ(ops->allocated_bytes() - before, m.activation_bytes + m.workspace_bytes) << where;
            }
            EXPECT_EQ(ops->allocated_bytes(), before) << where;
            EXPECT_GE(ops->peak_allocated_bytes(), m.activation_bytes + m.workspace_bytes) << where;
          }
        }
}

TEST(Memory, PlanSuggestsWhatFits) {
  // GPT-3 175B on TP 4 x PP 6 x DP 8 without the distributed optimizer: ~7.4B parameters per rank at
  // 18 B/parameter do not fit in 80 GiB, whatever the recompute mode.
  Config c = parse_config(
      "model: {num_layers: 96, hidden_size: 12288, num_attention_heads: 96, seq_length: 2048, vocab_size: 50257}\n"
      "parallel: {tensor_model_parallel_size: 4, pipeline_model_parallel_size: 6, data_parallel_size: 8}\n"
      "training: {micro_batch_size: 1, global_batch_size: 1536, train_iters: 1, precision: bf16, recompute: full}\n"
      "data: {path: unused}\n",
      "memory_test");
  PlanOptions o;
  const Plan p80 = make_plan(c, o);
  EXPECT_EQ(p80.world_size, 192);
  EXPECT_FALSE(p80.fits);
  EXPECT_GT(double(p80.stages[0].model_state_bytes()), 80.0 * 1073741824.0);
  bool more_pp = false, distopt = false;
  for (const PlanSuggestion& s : p80.suggestions) {
    more_pp |= s.fits && s.change.rfind("parallel.pipeline_model_parallel_size=", 0) == 0;
    distopt |= s.fits && s.change == "parallel.distributed_optimizer=true";
  }
  EXPECT_TRUE(more_pp);
  EXPECT_TRUE(distopt);
  EXPECT_NEAR(p80.bubble_fraction, 5.0 / (192 + 5), 1e-12);
  EXPECT_GT(p80.mfu, 0.0);
  EXPECT_LT(p80.mfu, o.hw.gemm_efficiency);
}

// The plan's work is bounded by what it simulates: stages x model chunks x micro-batches (issue 29:
// the bound once ignored the chunks), and the config's TP x PP x DP is checked before it is an int.
TEST(Memory, PlanBoundsCountModelChunksAndTheWorld) {
  auto plan_error = [](const std::string& rest, int world) -> std::string {
    try {
      Config c = parse_config("model: {num_layers: 512, hidden_size: 32, num_attention_heads: 4, seq_length: 16, "
                              "vocab_size: 257}\n" + rest + "\ndata: {path: unused}\n", "memory_test");
      PlanOptions o;
      o.world_size = world;
      make_plan(c, o);
    } catch (const InputError& e) {
      return e.what();
    }
    return "";
  };
  const std::string v8 = "parallel: {pipeline_model_parallel_size: 64, virtual_pipeline_model_parallel_size: 8}\n"
                         "training: {micro_batch_size: 1, train_iters: 1, global_batch_size: ";
  EXPECT_EQ(plan_error(v8 + "1024}", 64), "");  // 2^19 passes: planned
  EXPECT_NE(plan_error(v8 + "4096}", 64).find("4096 micro-batches per DP rank x 64 pipeline stages x 8 model chunks = "
                                              "2097152 scheduled passes, more than 1048576"), std::string::npos);
  const std::string huge_world = plan_error("parallel: {tensor_model_parallel_size: 1024, pipeline_model_parallel_size: "
                                            "1024, data_parallel_size: 1048576}\ntraining: {train_iters: 1}", 0);
  EXPECT_NE(huge_world.find("= 1099511627776 ranks, more than 16777216"), std::string::npos) << huge_world;
}

// The GPU backend's own buffers in the plan (core/gpu_workspace.h), by hand for GPT-2 124M in bf16 at
// llm.c's micro-batch 16, T 1024: cuDNN's backward workspace as cudnn-frontend sizes it -- softmax
// sums B H T fp32, plus the deterministic algorithm's dP (B H T T 16-bit values: ~384 MiB, the number
// a first GPU run must not discover mid-iteration) or the non-deterministic dQ accumulator (B H T D
// fp32) --, cuBLASLt's 32 MiB; none for fp32 (no cuDNN) or on CPU ranks (tensor bytes only). With
// context parallelism the ring's pairs of c = T / (2 CP) token chunks: their workspace, and their
// staging (O and dQ (B, c, H D) 16-bit, plus the larger of stats (B, H, c) fp32 and dK|dV (B, c, 2 H D)
// with the backward's packed stats (B, H, c) fp32). With grouped-query attention the deterministic
// backward also holds dK and dV per query head: the Llama-3-8B shape asked 1088.5 MiB of cuDNN 9.19
// on an H200 (the GPU backend's start-up report), which the plan counted 64 MiB short before.
TEST(Memory, GpuBackendWorkspaceCountsCudnnAttentionByMode) {
  const std::string gpt2 = "num_layers: 12, hidden_size: 768, num_attention_heads: 12, seq_length: 1024, vocab_size: 50257";
  const std::string train = "training: {micro_batch_size: 16, global_batch_size: 16, train_iters: 1, precision: bf16";
  const int64_t B = 16, H = 12, T = 1024, D = 64;
  const StageMemory det = stage_memory(config(gpt2, train + "}", 1), 0);
  EXPECT_EQ(det.backend.attention, B * H * T * 4 + B * H * T * T * 2);
  EXPECT_EQ(det.backend.attention, 403439616);
  EXPECT_EQ(det.attention_workspace_by_mode[0], det.backend.attention);
  EXPECT_EQ(det.attention_workspace_by_mode[1], B * H * T * 4 + B * H * T * D * 4);
  const StageMemory nondet = stage_memory(config(gpt2, train + ", deterministic: false}", 1), 0);
  EXPECT_EQ(nondet.backend.attention, det.attention_workspace_by_mode[1]);
  EXPECT_EQ(det.total_bytes() - nondet.total_bytes(), det.backend.attention - nondet.backend.attention);
  EXPECT_EQ(det.backend.gemm, int64_t(32) << 20);
  // the widest biased GEMM output, fc1's 4h fp32 gradients, in a buffer of at least 1 MiB
  EXPECT_EQ(det.backend.bias_grad, std::max<int64_t>(4 * 768 * 4, 1 << 20));
  // the scratch: the largest of the passes, at least the word embedding's sort of the B T tokens
  EXPECT_GE(det.backend.scratch, 4 * B * T * 4);
  EXPECT_LT(det.backend.scratch, int64_t(8) << 20);
  EXPECT_EQ(det.total_bytes(), det.tensor_bytes() + det.backend.total());
  // TP 2: half the heads
  const StageMemory tp2 = stage_memory(
      config(gpt2, "parallel: {tensor_model_parallel_size: 2}\n" + train + "}", 2), 0);
  EXPECT_EQ(tp2.backend.attention, B * (H / 2) * T * 4 + B * (H / 2) * T * T * 2);
  // CP 2: chunks of c = 256 tokens, every term over 1 MiB. The staging holds a block's merged call,
  // 2c query rows; cuDNN's workspace a pair's c rows in the deterministic backward (a call per
  // pair), else a merged call's 2c
  const int64_t c = T / 4;
  const std::string cp2 = "parallel: {context_parallel_size: 2}\n" + train;
  const int64_t staging = B * 2 * c * H * D * 2 + B * 2 * c * 2 * H * D * 2 + B * H * 2 * c * 4;
  EXPECT_EQ(stage_memory(config(gpt2, cp2 + "}", 2), 0).backend.attention,
            B * H * c * 4 + B * H * c * c * 2 + staging);
  EXPECT_EQ(stage_memory(config(gpt2, cp2 + ", deterministic: false}", 2), 0).backend.attention,
            B * H * 2 * c * 4 + B * H * 2 * c * D * 4 + staging);
  // grouped-query attention, deterministic: 2 Llama-3-8B layers at seq 4096, micro-batch 1, as on the H200
  const std::string llama =
      "num_layers: 2, hidden_size: 4096, num_attention_heads: 32, ffn_hidden_size: 14336, seq_length: 4096, "
      "vocab_size: 128256, normalization: RMSNorm, swiglu: true, position_embedding_type: rope, "
      "group_query_attention: true, num_query_groups: 8, untie_embeddings_and_output_weights: true, "
      "add_bias_linear: false";
  const std::string one = "training: {micro_batch_size: 1, global_batch_size: 1, train_iters: 1, precision: bf16";
  EXPECT_EQ(stage_memory(config(llama, one + "}", 1), 0).backend.attention, int64_t(10885) * (1 << 20) / 10);
  EXPECT_EQ(stage_memory(config(llama, one + ", deterministic: false}", 1), 0).backend.attention,
            32 * 4096 * 4 + int64_t(32) * 4096 * 128 * 4);
  // none for fp32, CPU ranks
  EXPECT_EQ(stage_memory(config(gpt2, "training: {micro_batch_size: 16, train_iters: 1}", 1), 0).backend.attention, 0);
  const StageMemory cpu = stage_memory(config(gpt2, train + "}", 1), 0, /*gpu_backend=*/false);
  EXPECT_EQ(cpu.backend.total(), 0);
  EXPECT_EQ(cpu.total_bytes(), det.tensor_bytes());
}

// The column-sum pass's chunking (core/gpu_workspace.h, which core/cuda/column_sums.cuh launches):
// its chunks cover every row, there are at most N / 64 (rounded up) of them, and the scratch never exceeds
// K fp32 partial sums for max(C, 65536) columns however large N grows.
TEST(Memory, ColumnSumScratchIsBounded) {
  for (int64_t N : {1, 63, 64, 65, 1000, 16384, 1 << 20})
    for (int64_t C : {1, 31, 32, 768, 3072, 12288, 100000}) {
      const int64_t chunks = column_sum_chunks(N, C), rows = (N + chunks - 1) / chunks;
      EXPECT_GE(chunks * rows, N) << N << " x " << C;
      EXPECT_LT((chunks - 1) * rows, N) << N << " x " << C;  // no empty chunk
      EXPECT_LE(chunks, (N + 63) / 64) << N << " x " << C;
      EXPECT_LE(column_sums_scratch_bytes(N, C, 2), 2 * 4 * std::max<int64_t>(C, 65536)) << N << " x " << C;
    }
}

}  // namespace
}  // namespace tpt
