// The tiny GPT of the GPU tests and a trainer-like loop over it (one pipeline stage, any TP).
#pragma once
#include <algorithm>
#include <cmath>
#include <functional>
#include <random>

#include "core/config.h"
#include "core/error.h"
#include "tests/common/tiny_config.h"
#include "gpu_test_util.h"
#include "model/gpt.h"
#include "model/optimizer.h"
#include "parallel/comm.h"
#include "parallel/grad_sync.h"

namespace tpt::gpu_test {

// 2 layers, hidden 48 (4 heads of 12), ffn 100, seq 33, vocab 101 (padded to 104 at TP 1), micro-batch 3.
inline Config tiny_config() {
  Config c = test::tiny_gpt_config({.hidden = 48, .heads = 4, .ffn = 100, .seq = 33, .vocab = 101, .micro_batch = 3});
  c.optimizer.lr = 3e-3;
  return c;
}

// The same with the LLaMA family's options: RMSNorm, SwiGLU (ffn 96), RoPE (base 500000), grouped-query
// attention (4 heads, 2 KV groups) with kv_channels 32 (head dim 32 != 64 / 4: the tensor-core and cuDNN
// attention's bf16 shape), untied output layer, no biases.
inline Config tiny_llama_config() {
  Config c = tiny_config();
  ModelConfig& m = c.model;
  m.hidden_size = 64;
  m.num_attention_heads = 4;
  m.kv_channels = 32;
  m.ffn_hidden_size = 96;
  m.normalization = Normalization::RMSNorm;
  m.swiglu = true;
  m.position_embedding_type = PositionEmbedding::Rope;
  m.rotary_base = 500000;
  m.group_query_attention = true;
  m.num_query_groups = 2;
  m.untie_embeddings_and_output_weights = true;
  m.add_bias_linear = false;
  return c;
}

struct Trained {
  std::vector<double> losses;  // mean loss of each step
  VecF first_grads;            // gradients of step 1
  VecF init, params;           // before the first and after the last step
};

// |a - b| / |b - init| in L2: how far two trainings ended apart, relative to how far they moved.
inline double relative_distance(const VecF& a, const VecF& b, const VecF& init) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    num += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
    den += (double(b[i]) - init[i]) * (double(b[i]) - init[i]);
  }
  return std::sqrt(num / std::max(den, 1e-300));
}

// Trains `steps` steps of `micro` micro-batches on `ops`, the trainer's way (bf16 / fp16: a compute
// copy of the parameters in that dtype, refreshed by AdamW; gradients accumulated in fp32 over
// micro-batches; AdamW on fp32 masters), as
// rank tp.rank() of a tensor-parallel group of tp.size() (buffers on the communicator's device).
// The tokens are the same whatever the group.
// Data parallelism (optional): the step's micro-batches dealt round-robin over dev's ranks, the
// gradients summed by a GradSync on dev (overlapped with the last micro-batch's backward, a bucket
// per layer), the losses over host.
struct DataParallel {
  Comm* dev = nullptr;
  Comm* host = nullptr;
};

// fp8 (optional): every layer's linear GEMMs in FP8 with these options (current or blockwise scaling:
// delayed scaling's per-step update is the trainer's).
// The config says FP8 too (make_dims: the layers save their inputs' FP8 codes for the weight gradients,
// docs/FP8.md "Saved inputs").
// split: each backward as ZB-H1's B then W (StageOptions::split_backward; in FP8 layers the output
// gradients stashed as FP8 codes, docs/FP8.md "ZB-H1").
inline Trained train(Ops& ops, Comm& tp, DType dtype, int steps, int micro, const Config& config = tiny_config(),
                     DataParallel dp = {}, const Fp8LinearOptions* fp8 = nullptr, bool split = false) {
  Config cfg = config;
  if (fp8) {
    cfg.training.fp8_format = fp8->hybrid ? Fp8Format::Hybrid : Fp8Format::E4M3;
    cfg.training.fp8_recipe = fp8->blockwise ? Fp8Recipe::Blockwise : Fp8Recipe::Tensorwise;
    cfg.training.fp8_wgrad = fp8->wgrad;
  }
  const GPTDims d = make_dims(cfg, tp.size(), tp.rank(), 1, 0);
  const ParamLayout layout = make_param_layout(d);
  VecF host(size_t(layout.total));
  init_params_host(layout, cfg.training.seed, host.data());
  Dev params(ops, host), grads(ops, size_t(layout.total));
  // bf16 / fp16: the compute copy of the fp32 master weights, in the compute dtype
  const bool copy = dtype != DType::F32;
  Dev compute(ops, copy ? size_t(layout.total) : 0, dtype);
  if (copy) ops.convert(compute, params.buf(), layout.total);
  const int64_t B = cfg.training.micro_batch_size, S = d.S, N = B * S;
  StageOptions so{dtype, cfg.training.recompute};
  so.split_backward = split;
  if (fp8) {
    TPT_CHECK(!fp8->delayed);
    so.fp8 = true;
    so.fp8_options = *fp8;
    so.fp8_layer_end = cfg.model.num_layers;
  }
  GPTStage stage(d, layout, ops, tp, copy ? CBuf(compute.buf()) : CBuf(params.buf()), grads, B, 1, so);
  AdamW adamw(layout, ops, params, grads, copy ? compute.buf() : Buf{});  // the step writes the compute copy
  const int dp_size = dp.dev ? dp.dev->size() : 1, dp_rank = dp.dev ? dp.dev->rank() : 0;
  TPT_CHECK(micro % dp_size == 0);
  GradSync sync(ops, grads, layout.total, layer_ranges(layout, d), dp.dev, nullptr, GradRange{}, {.overlap = true, .bucket_size = 1});
  std::mt19937 gen(17);
  std::uniform_int_distribution<int32_t> tok(0, int32_t(d.V) - 1);
  Trained r;
  r.init = host;
  for (int k = 1; k <= steps; ++k) {
    ops.zero(grads.buf(), layout.total);
    if (Fp8State* f = stage.fp8_state()) f->weights_changed();  // the last step updated them
    double sum = 0;
    for (int m = 0; m < micro; ++m) {
      std::vector<int32_t> tokens(static_cast<size_t>(N)), targets(static_cast<size_t>(N));
      for (auto& t : tokens) t = tok(gen);
      for (auto& t : targets) t = tok(gen);
      targets[0] = int32_t(d.V - 1);
      if (m % dp_size != dp_rank) continue;  // another DP rank's
      Dev dev_tokens(ops, tokens), dev_targets(ops, targets);
      stage.forward(0, dev_tokens.ints(), CBuf{});
      sum += stage.loss(0, dev_targets.ints(), 1.0f / float(N * (micro / dp_size)), true);
      std::function<void(int64_t)> layer_done;
      if (m + dp_size >= micro) layer_done = [&](int64_t l) { sync.layer_done(int(l - d.layer_begin)); };
      if (!split) {
        stage.backward(0, CBuf{}, layer_done);
        continue;
      }
      stage.backward(0, CBuf{}, {}, GPTStage::BackwardPart::Input);
      stage.backward_weight(0, layer_done);
    }
    sync.finish();
    if (dp.host) dp.host->all_reduce(&sum, 1, ReduceOp::Sum);
    r.losses.push_back(sum / double(N * micro));
    if (k == 1) r.first_grads = grads.host();
    adamw.step(cfg.optimizer, cfg.optimizer.lr, k);
  }
  r.params = params.host();
  return r;
}

}  // namespace tpt::gpu_test
