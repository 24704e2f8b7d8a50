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
  bool first = false, last = false;  // holds the embeddings / the LM head
  int tp = 1, cp = 1;
  // per layer: the layer spec's linear layers, (N, in) . (in, out) each
  struct Linear {
    double in = 0, out = 0;
    LinearSplit split = LinearSplit::Column;
  };
  std::vector<Linear> linears;
  // per layer forward: scores and the weighted sum, their causal half (2 N S_all Hl D; with context
  // parallelism the rank's N = B S / CP queries against the whole sequence's S_all keys)
  double attention_flops = 0;
  double ffn_local = 0;        // Fl: the MLP activation's width on this rank
  bool swiglu = false;
  double rope_elems = 0;       // RoPE: q and k channels rotated per layer (0 without RoPE)
  double kv_block = 0;         // elements of one CP ring K/V block: N 2 kv_heads D (0 without CP)
  double vocab_rows = 0;       // the LM head's rows on this rank (Vl)

  // 2 N in out summed over the layer's linear layers (exact: integer products below 2^53)
  double linear_flops() const;
  // how many of the layer's linear layers are row- / column-parallel: its TP sums forward / backward
  double row_parallel() const;
  double column_parallel() const;
  double lm_head_flops() const { return 2.0 * N * C * vocab_rows; }
};

// One chunk's work for micro-batches of training.micro_batch_size, from its dims (CP applied).
ChunkWork chunk_work(const Config& c, const GPTDims& d);
// The model chunks of stage `stage` (one without interleaving), as CP rank 0 and TP rank 0 hold them
// (every CP and TP rank of a stage does the same work).
std::vector<ChunkWork> stage_chunk_work(const Config& c, int stage);

}  // namespace tpt
