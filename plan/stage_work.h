// The plan's one per-stage work model: what one micro-batch's forward and backward do on one rank
// of a pipeline stage, counted once per model chunk from the layer spec (model/layer_spec.h) and the
// chunk's dims. Both readers take it from here: the plan's FLOPs and communication volumes
// (plan/memory.cpp, make_plan) and the step-time model, which prices the same items in seconds
// (plan/step_time.cpp).
#pragma once
#include <vector>

#include "model/gpt.h"

namespace tpt {

struct Config;

struct ChunkWork {
  double N = 0, Nt = 0;        // tokens of a micro-batch: all (the TP-sharded GEMMs'), this rank's (SP)
  double C = 0, layers = 0;    // hidden size, transformer layers of the chunk
  double moe_layers = 0;       // of them, Mixture-of-Experts layers (docs/MOE.md; d.spec(l) per layer)
  bool first = false, last = false;  // holds the embeddings / the LM head
  int tp = 1, cp = 1;
  // per dense layer: the layer spec's linear layers, (N, in) . (in, out) each
  struct Linear {
    double in = 0, out = 0;
    LinearSplit split = LinearSplit::Column;
    bool fp8_saved = false;  // in an FP8 layer its input is saved as FP8 codes (GPTDims::fp8_saved_inputs)
    // in an FP8 layer with sequence parallelism its input is cast on this rank's Nt tokens and gathered
    // over TP as FP8 codes (GPTDims::fp8_gathers_codes); saved, the shard's codes (gathered and
    // transposed again in backward)
    bool fp8_gathered = false;
    // ... and (a row-parallel layer, with FP8 weight gradients) its output gradient likewise, the
    // gathered codes transposed for the weight gradient
    bool fp8_dout_gathered = false;
  };
  std::vector<Linear> linears;
  double fp8_gather_bytes = 1.0;  // per element of an FP8 code gather: a byte (blockwise + 4 / 128: the scales)
  // per MoE layer: its layer spec's linear layers (attn.qkv, attn.proj on all N tokens; mlp.router,
  // Replicated, on this rank's Nt) and its experts' GEMMs: `rows` rows (its Nt tokens' k choices,
  // the balanced load), over `local` experts of this rank, each (rows, C) . (C, fc1_width) and
  // (rows, ffn) . (ffn, C); with EP > 1 the dispatch's all-to-all sends the rows out and back over
  // `ep` ranks (`etp` apart in the rank order)
  struct Experts {
    std::vector<Linear> linears;
    double rows = 0, local = 0, fc1_width = 0, ffn = 0;
    double shared_fc1_width = 0, shared_ffn = 0;  // the shared expert's fc1 output and activation widths (rank)
    int ep = 1, etp = 1;
  } moe;
  // per layer forward: scores and the weighted sum, their causal half (2 N S_all Hl D; with context
  // parallelism the rank's N = B S / CP queries against the whole sequence's S_all keys)
  double attention_flops = 0;
  double ffn_local = 0;        // Fl: the MLP activation's width on this rank
  bool swiglu = false;
  double rope_elems = 0;       // RoPE: q and k channels rotated per layer (0 without RoPE)
  double kv_block = 0;         // elements of one CP ring K/V block: N 2 kv_heads D (0 without CP)
  bool cp_fallback = false;    // the CP ring's blocks run the fallback kernel (plan/memory.h cp_attention_kernel)
  double vocab_rows = 0;       // the LM head's rows on this rank (Vl)
  // FP8 training (docs/FP8.md): the chunk's dense layers whose linear GEMMs take FP8 inputs, and its MoE
  // layers that do (attention's, the shared expert's and the experts' GEMMs; the router's not)
  double fp8_layers = 0, fp8_moe_layers = 0;

  double dense_layers() const { return layers - moe_layers; }
  // 2 N in out summed over a dense layer's linear layers (exact: integer products below 2^53)
  double linear_flops() const;
  // an MoE layer's: 2 rows in out over its spec's linear layers (rows N, the router's Nt) and its
  // experts' 2 rows (C fc1_width + ffn C) -- each token's k experts, k / E of all the experts' FLOPs
  double moe_linear_flops() const;
  double expert_flops() const { return 2.0 * moe.rows * (C * moe.fc1_width + moe.ffn * C); }
  // how many of a dense layer's linear layers are row- / column-parallel: its TP sums forward / backward
  double row_parallel() const;
  double column_parallel() const;
  // an MoE layer's (its spec's linear layers; the experts and the router are neither)
  double moe_row_parallel() const;
  double moe_column_parallel() const;
  // the same summed over the chunk's layers, dense and MoE
  double row_parallel_layers() const;
  double column_parallel_layers() const;
  // the inputs a micro-batch's forward gathers over TP as FP8 codes (Linear::fp8_gathered) in the chunk's
  // FP8 layers, dense and MoE: each a byte per element on the wire instead of the compute dtype's; and
  // the output gradients its backward gathers so (Linear::fp8_dout_gathered)
  double fp8_code_gathers() const { return fp8_linears(&Linear::fp8_gathered); }
  double fp8_dout_code_gathers() const { return fp8_linears(&Linear::fp8_dout_gathered); }
  // the chunk's FP8 layers' linear layers with `flag` set, dense and MoE
  double fp8_linears(bool Linear::*flag) const;
  // bytes one EP rank sends in one of an MoE layer's all-to-alls (its rows to the other EP ranks'
  // experts, or back) in dtype bytes cb: rows C (EP - 1) / EP on average; 0 with EP 1
  double dispatch_bytes(double cb) const { return moe.ep > 1 ? moe.rows * C * cb * (moe.ep - 1) / moe.ep : 0.0; }
  double lm_head_flops() const { return 2.0 * N * C * vocab_rows; }
};

// One chunk's work for micro-batches of training.micro_batch_size, from its dims (CP and EP applied).
ChunkWork chunk_work(const Config& c, const GPTDims& d);
// The model chunks of stage `stage` (one without interleaving), as CP rank 0, TP rank 0 and EP rank
// 0 hold them (every CP, TP and EP rank of a stage does the same work, the experts' balanced).
std::vector<ChunkWork> stage_chunk_work(const Config& c, int stage);

}  // namespace tpt
