// The per-stage work model (plan/stage_work.h).
#include "plan/stage_work.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "core/config.h"
#include "model/chunks.h"
#include "plan/memory.h"

namespace tpt {

double ChunkWork::linear_flops() const {
  double in_out = 0;
  for (const Linear& l : linears) in_out += l.in * l.out;
  return 2.0 * N * in_out;
}

double ChunkWork::moe_linear_flops() const {
  double in_out = 0;
  for (const Linear& l : moe.linears) in_out += (l.split == LinearSplit::Replicated ? Nt : N) * l.in * l.out;
  return 2.0 * in_out + expert_flops();
}

double ChunkWork::row_parallel() const {
  double n = 0;
  for (const Linear& l : linears) n += l.split == LinearSplit::Row;
  return n;
}

double ChunkWork::column_parallel() const {
  double n = 0;
  for (const Linear& l : linears) n += l.split == LinearSplit::Column;
  return n;
}

double ChunkWork::moe_row_parallel() const {
  double n = 0;
  for (const Linear& l : moe.linears) n += l.split == LinearSplit::Row;
  return n;
}

double ChunkWork::moe_column_parallel() const {
  double n = 0;
  for (const Linear& l : moe.linears) n += l.split == LinearSplit::Column;
  return n;
}

double ChunkWork::row_parallel_layers() const { return dense_layers() * row_parallel() + moe_layers * moe_row_parallel(); }

double ChunkWork::column_parallel_layers() const {
  return dense_layers() * column_parallel() + moe_layers * moe_column_parallel();
}

double ChunkWork::fp8_linears(bool Linear::*flag) const {
  double dense = 0, moe_layer = 0;
  for (const Linear& l : linears) dense += l.*flag;
  for (const Linear& l : moe.linears) moe_layer += l.*flag;
  return fp8_layers * dense + fp8_moe_layers * moe_layer;
}

ChunkWork chunk_work(const Config& c, const GPTDims& d) {
  ChunkWork w;
  const double B = c.training.micro_batch_size, S = double(d.S);
  w.N = B * S;
  w.Nt = double(d.local_tokens(int64_t(w.N)));
  w.C = double(d.C);
  w.layers = double(d.layer_end - d.layer_begin);
  w.first = d.first_stage();
  w.last = d.last_stage();
  w.tp = d.tp;
  w.cp = d.cp;
  for (const LinearSpec* l : d.layer.linears()) w.linears.push_back({double(l->in), double(l->out), l->split});
  if (d.moe.any()) {
    for (int64_t l = d.layer_begin; l < d.layer_end; ++l) w.moe_layers += d.moe.is_moe(l) ? 1.0 : 0.0;
    for (const LinearSpec* l : d.moe_layer.linears()) w.moe.linears.push_back({double(l->in), double(l->out), l->split});
    // dropless: every choice; with a capacity factor at most capacity rows per expert (model/moe_routing.h)
    const RouterOptions& r = d.moe.router;
    w.moe.rows = w.Nt * double(r.k);
    if (r.capacity_factor > 0)
      w.moe.rows = std::min(w.moe.rows, double(r.E) * std::ceil(w.moe.rows / double(r.E) * r.capacity_factor));
    w.moe.local = double(d.moe.El);
    w.moe.fc1_width = double(d.moe.fc1_width);
    w.moe.ffn = double(d.moe.Fe);
    w.moe.shared_fc1_width = double(d.moe.shared_fc1_width);
    w.moe.shared_ffn = double(d.moe.Fsl);
    w.moe.ep = d.moe.ep;
    w.moe.etp = d.moe.etp;
  }
  w.attention_flops = 2.0 * B * S * double(c.model.seq_length) * double(d.Hl) * double(d.D);
  w.ffn_local = double(d.Fl);
  w.swiglu = d.mlp.swiglu;
  w.rope_elems = d.rot > 0 ? 2.0 * w.N * double(d.Hl + d.kv_heads) * double(d.D) : 0.0;
  w.kv_block = d.cp > 1 ? w.N * 2.0 * double(d.kv_heads * d.D) : 0.0;
  w.cp_fallback = d.cp > 1 && cp_attention_kernel(d, compute_dtype(c)) == "fallback";
  w.vocab_rows = double(d.Vl);
  // GPTStage's FP8 layers, dense and MoE, and which of their GEMMs' inputs they save as FP8 codes
  if (c.training.fp8_format != Fp8Format::None) {
    const auto [begin, end] = c.training.fp8_layer_range(c.model.num_layers);
    // blockwise scaling's gathers carry the 1 x 128 blocks' scales too
    w.fp8_gather_bytes = c.training.fp8_recipe == Fp8Recipe::Blockwise ? 1.0 + 4.0 / double(kFp8Block) : 1.0;
    // gathers / douts: GPTDims::fp8_gathers_codes / fp8_gathers_dout_codes (GPTStage's and the shared
    // expert's gathers; an MoE MLP's backward is whole, also in zb-h1's B)
    auto mark = [&](std::vector<ChunkWork::Linear>& linears, const LayerSpec& spec, const GPTDims::Fp8Saved& q,
                    bool gathers, bool douts) {
      std::vector<const LinearSpec*> specs = spec.linears();
      for (size_t i = 0; i < specs.size(); ++i) {
        const std::string& name = specs[i]->name;
        linears[i].fp8_gathered =
            gathers && (name == "attn.qkv" || name == "mlp.fc1" || name == "mlp.shared_experts.fc1");
        linears[i].fp8_dout_gathered =
            douts && (name == "attn.proj" || name == "mlp.fc2" || name == "mlp.shared_experts.fc2");
        linears[i].fp8_saved = (specs[i]->name == "attn.qkv" && q.ln1) || (specs[i]->name == "mlp.fc1" && q.ln2) ||
                               (specs[i]->name == "mlp.fc2" && q.act);
      }
    };
    for (int64_t l = std::max(begin, d.layer_begin); l < std::min(end, d.layer_end); ++l) {
      const bool moe = d.moe.any() && d.moe.is_moe(l);
      (moe ? w.fp8_moe_layers : w.fp8_layers) += 1.0;  // the same inputs saved in every FP8 layer of a kind
      mark(moe ? w.moe.linears : w.linears, moe ? d.moe_layer : d.layer, d.fp8_saved_inputs(l, c.training.recompute),
           d.fp8_gathers_codes(l), d.fp8_gathers_dout_codes(l));
    }
  }
  return w;
}

std::vector<ChunkWork> stage_chunk_work(const Config& c, int stage) {
  const int tp = c.parallel.tensor_model_parallel_size, pp = c.parallel.pipeline_model_parallel_size;
  std::vector<ChunkWork> out;
  for (GPTDims d : make_chunk_dims(c, tp, 0, pp, stage)) {
    apply_context_parallel(d, c, 0);  // CP rank 0's tokens (every CP rank holds as many)
    // EP / ETP rank 0's experts (as many)
    apply_expert_parallel(d, c.parallel.expert_model_parallel_size, 0, expert_tp_size(c), 0);
    out.push_back(chunk_work(c, d));
  }
  return out;
}

}  // namespace tpt
