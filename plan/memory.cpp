// Per-rank memory, FLOPs and time of a config (see plan/memory.h for what each category holds).
#include "plan/memory.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <tuple>

#include "core/config.h"
#include "core/error.h"
#include "core/gpu_workspace.h"
#include "model/chunks.h"
#include "model/moe.h"
#include "model/optimizer.h"
#include "model/param_group.h"
#include "parallel/grad_sync.h"
#include "plan/stage_work.h"

namespace tpt {

DType compute_dtype(const Config& c) {
  switch (c.training.precision) {
    case Precision::FP32: return DType::F32;
    case Precision::BF16: return DType::BF16;
    case Precision::FP16: return DType::F16;
  }
  internal_error("compute_dtype: unknown precision");
}

namespace {

// FP8 training: the chunk's layers with FP8 GEMMs (without first_last_layers_bf16's), as GPTStage's
int64_t fp8_layers(const Config& c, const GPTDims& d) {
  return c.training.fp8_layers_in(c.model.num_layers, d.layer_begin, d.layer_end);
}

// Stage s's dims as CP rank 0 sees them (every CP rank holds the same sizes).
GPTDims make_chunk_dims_cp(const Config& c, int tp, int pp, int s) {
  GPTDims d = make_dims(c, tp, 0, pp, s);
  apply_context_parallel(d, c, 0);
  return d;
}

// The parameter / gradient buffers of a rank's layout as the trainer sizes them (model/param_group.h
// make_grad_groups, grad_buffer_size; GradSync::owned_size): one span per replica group, from its
// first tensor to the next group's first (the dense group first, the experts' after it, then the FP8
// parameters' over the dense ranks), each padded with the distributed optimizer to whole blocks of
// kShardAlign x its ranks; the optimizer owns 1 / ranks of each padded span (all of it without the
// distributed optimizer or on one rank).
struct ReplicaBuffers {
  int64_t total = 0, owned = 0;
  int64_t expert_span = 0;  // the experts' spans, padded (0 without experts)
  int64_t code_span = 0;    // the FP8 parameters' spans, padded (0 without them)
  int64_t expert_codes = 0;  // of both, the experts' FP8 parameters' span
};

ReplicaBuffers replica_buffers(const ParamLayout& layout, int dense_ranks, int expert_ranks, bool distributed_optimizer) {
  std::vector<const ParamInfo*> order;
  for (const ParamInfo& p : layout.params) order.push_back(&p);
  std::stable_sort(order.begin(), order.end(), [](const ParamInfo* a, const ParamInfo* b) { return a->offset < b->offset; });
  auto kind = [](const ParamInfo& p) { return layout_span(p.group); };  // (model/param_group.h)
  std::vector<std::pair<int, int64_t>> runs;  // each span's kind and first offset, in layout order
  for (const ParamInfo* p : order)
    if (runs.empty() || runs.back().first != kind(*p)) {
      for (const auto& r : runs) TPT_CHECK(r.first != kind(*p));  // one run per span
      runs.push_back({kind(*p), runs.empty() ? 0 : p->offset});
    }
  ReplicaBuffers b;
  for (size_t i = 0; i < runs.size(); ++i) {
    const int64_t end = i + 1 < runs.size() ? runs[i + 1].second : layout.total;
    const bool experts = runs[i].first % 2 == 1, codes = runs[i].first >= 2;
    const int ranks = experts ? expert_ranks : dense_ranks;
    const int64_t padded = GradSync::buffer_size(end - runs[i].second, ranks, distributed_optimizer);
    TPT_CHECK(i + 1 == runs.size() || runs[i].second + padded <= end);  // the layout left the padding its room
    b.total = runs[i].second + padded;
    b.owned += distributed_optimizer && ranks > 1 ? padded / ranks : padded;
    if (experts) b.expert_span += padded;
    if (codes) b.code_span += padded;
    if (experts && codes) b.expert_codes = padded;
  }
  return b;
}

int num_microbatches(const Config& c) {
  const int64_t per_step = int64_t(c.training.micro_batch_size) * c.parallel.data_parallel_size;
  return int(c.training.global_batch_size / per_step);
}

// The trainer's schedule of stage pp_rank: the configured one, interleaved with model chunks.
std::vector<Action> stage_schedule(const Config& c, int pp_rank) {
  const int v = model_chunks(c);
  const ScheduleKind kind = schedule_kind(c.parallel.pipeline_schedule, v);
  return make_schedule(kind, c.parallel.pipeline_model_parallel_size, pp_rank, num_microbatches(c), v);
}

// The in-flight micro-batches of that schedule (the trainer's activation slots): per chunk and all
// chunks together, from a schedule with as many micro-batches as in_flight_equivalent_microbatches
// says hold the same counts, memoised per schedule (the search plans thousands of layouts over few).
struct InFlight {
  std::vector<int> per_chunk;
  int all = 0;
  int pool = 0;  // the slots of a pool shared by the chunks (pool_slots: training and evaluation)
  std::vector<int> receive_buffers;  // per chunk: activations + gradients (receive_buffers, training and evaluation)
};
const InFlight& stage_in_flight(const Config& c, int pp_rank) {
  thread_local std::map<std::tuple<int, int, int, int, int>, InFlight> memo;
  const int v = model_chunks(c), P = c.parallel.pipeline_model_parallel_size;
  const ScheduleKind kind = schedule_kind(c.parallel.pipeline_schedule, v);
  const int M = in_flight_equivalent_microbatches(kind, P, num_microbatches(c), v);
  auto [it, added] = memo.try_emplace(std::make_tuple(int(kind), P, M, v, pp_rank));
  if (added) {
    const std::vector<Action> schedule = make_schedule(kind, P, pp_rank, M, v);
    const std::vector<Action> eval_schedule = make_schedule(ScheduleKind::ForwardOnly, P, pp_rank, M, v);
    it->second = {max_in_flight_per_chunk(schedule), max_in_flight(schedule),
                  std::max(pool_slots(schedule, v, M).slots, pool_slots(eval_schedule, v, M).slots), {}};
    const ReceiveBuffers train = receive_buffers(schedule, v);
    const ReceiveBuffers eval = receive_buffers(eval_schedule, v);
    for (size_t c = 0; c < size_t(v); ++c)
      it->second.receive_buffers.push_back(std::max(train.activations[c], eval.activations[c]) +
                                           std::max(train.gradients[c], eval.gradients[c]));
  }
  return it->second;
}

double mib(int64_t bytes) { return double(bytes) / 1048576.0; }

// the MoE layers of chunk d
int64_t moe_layers_of(const GPTDims& d) {
  int64_t n = 0;
  for (int64_t l = d.layer_begin; l < d.layer_end; ++l) n += d.moe.is_moe(l) ? 1 : 0;
  return n;
}

}  // namespace

void check_plannable(const Config& c) {
  const ModelConfig& m = c.model;
  const double tp = c.parallel.tensor_model_parallel_size, pp = c.parallel.pipeline_model_parallel_size;
  const double L = m.num_layers, C = m.hidden_size, F = m.ffn_hidden_size, S = m.seq_length;
  const double V = m.vocab_size, B = c.training.micro_batch_size;
  // the largest rank: its share of the layers, the word embedding, the positions; model state at
  // 20 B per parameter; a micro-batch's activations (~24 values of C per token and layer) and logits
  const double params = std::ceil(L / pp) * (4 * C * C + 2 * C * F) / tp + V * C / tp + double(m.max_position_embeddings) * C;
  double bytes = 20 * params + 4 * B * S * (24 * C * std::ceil(L / pp) + V / tp) * std::min(pp, 64.0);
  if (m.is_moe()) {  // every layer's E / EP experts (3 C Fe each at most) and their k rows per token
    const double Fe = m.moe_ffn_hidden_size, k = m.moe_router_topk;
    const double experts = double(m.num_moe_experts) / std::max(1, c.parallel.expert_model_parallel_size);
    bytes += std::ceil(L / pp) * (20 * experts * 3 * C * Fe + 4 * B * S * k * (C + 3 * Fe) * m.moe_dispatch_bound_factor * std::min(pp, 64.0));
  }
  if (!(bytes < std::ldexp(1.0, 50)))
    input_error("the model needs about " + std::to_string(int64_t(bytes / std::ldexp(1.0, 40))) +
                " TiB per rank (model.num_layers, model.hidden_size, model.ffn_hidden_size, model.vocab_size, "
                "model.seq_length, training.micro_batch_size" + std::string(m.is_moe() ? ", model.num_moe_experts, "
                "model.moe_ffn_hidden_size, model.moe_router_topk" : "") + " on TP " + std::to_string(int(tp)) + " x PP " +
                std::to_string(int(pp)) + "): more than a PiB, beyond any device; nothing was allocated");
  // What the plan simulates: every stage's list of forward and backward passes of every model chunk
  const double v = model_chunks(c), actions = double(num_microbatches(c)) * pp * v;
  if (actions > double(kMaxScheduledPasses))
    input_error("training.global_batch_size: " + std::to_string(num_microbatches(c)) + " micro-batches per DP rank x " +
                std::to_string(int(pp)) + " pipeline stages x " + std::to_string(int(v)) +
                " model chunks = " + std::to_string(int64_t(actions)) + " scheduled passes, more than " +
                std::to_string(kMaxScheduledPasses) + " (raise training.micro_batch_size or lower "
                "training.global_batch_size or parallel.virtual_pipeline_model_parallel_size)");
}

const ParamLayout& RankLayoutCache::get(const Config& c, int pp_rank, const std::vector<GPTDims>& chunks) {
  const ParallelConfig& p = c.parallel;
  const std::array<int64_t, 10> key = {p.tensor_model_parallel_size, p.context_parallel_size, p.pipeline_model_parallel_size,
                                       model_chunks(c), int64_t(p.sequence_parallel), replica_group_align(c),
                                       p.expert_model_parallel_size, p.expert_tensor_parallel_size,
                                       int64_t(c.training.fp8_param_gather), pp_rank};
  auto [it, added] = layouts_.try_emplace(key);
  if (added) it->second = make_rank_layout(chunks, replica_group_align(c));
  return it->second;
}

StageMemory stage_memory(const Config& cfg, int pp_rank, bool gpu_backend, RankLayoutCache* layouts) {
  const int tp = cfg.parallel.tensor_model_parallel_size, pp = cfg.parallel.pipeline_model_parallel_size;
  TPT_CHECK(pp_rank >= 0 && pp_rank < pp);
  // every TP rank of a stage holds the same sizes
  std::vector<GPTDims> chunks = make_chunk_dims(cfg, tp, 0, pp, pp_rank);
  for (GPTDims& d : chunks) {
    apply_context_parallel(d, cfg, 0);  // every CP rank holds the same sizes
    // every EP rank E / EP experts, every ETP rank Fe / ETP of each
    apply_expert_parallel(d, cfg.parallel.expert_model_parallel_size, 0, expert_tp_size(cfg), 0);
  }
  return stage_memory(cfg, pp_rank, chunks, gpu_backend, layouts);
}

void set_model_state_bytes(const Config& cfg, StageMemory& m) {
  const DType dtype = compute_dtype(cfg);
  const int64_t buffer = m.parameter_buffer, owned = m.owned_elements;
  // store_param_remainders (bf16): the master weight is the compute copy plus a 2-byte remainder;
  // main_params_dtype fp16: 2-byte master weights
  const StateDTypes states = state_dtypes(cfg.optimizer);  // fp32, or bf16 / fp16 (precision-aware)
  // FP8 parameters: no compute copy of their span, its codes instead (a byte each)
  m.weight_bytes = dtype == DType::F32 && states.master == DType::F32 ? buffer * 4
                   : dtype_size(buffer - m.code_buffer, dtype) + m.code_buffer +
                         (cfg.optimizer.store_param_remainders ? dtype_size(owned, DType::BF16)
                                                               : dtype_size(owned, states.master));
  m.gradient_bytes = buffer * (bf16_grads(cfg) ? 2 : 4);  // parallel.grad_reduce_in_bf16: bf16
  m.optimizer_bytes = dtype_size(owned, states.exp_avg) + dtype_size(owned, states.exp_avg_sq);
  // scaled fp16 states: the optimizer's two scale tables (model/optimizer.h)
  if (states.scaled()) m.optimizer_bytes += 2 * scale_table_floats(m.tensors) * 4;
}

StageMemory stage_memory(const Config& cfg, int pp_rank, const std::vector<GPTDims>& chunks, bool gpu_backend,
                         RankLayoutCache* layouts) {
  const int pp = cfg.parallel.pipeline_model_parallel_size;
  TPT_CHECK(cfg.parallel.data_parallel_size >= 1 && pp_rank >= 0 && pp_rank < pp && !chunks.empty());
  const ParamLayout own = layouts ? ParamLayout() : make_rank_layout(chunks, replica_group_align(cfg));
  const ParamLayout& layout = layouts ? layouts->get(cfg, pp_rank, chunks) : own;
  const DType dtype = compute_dtype(cfg);
  const int64_t B = cfg.training.micro_batch_size;
  const InFlight& in_flight = stage_in_flight(cfg, pp_rank);
  std::vector<int> slots = in_flight.per_chunk;  // the trainer's: at least 1 per chunk
  slots.resize(chunks.size(), 0);
  for (int& s : slots) s = std::max(1, s);
  const bool split = cfg.parallel.pipeline_schedule == PipelineSchedule::ZeroBubbleH1;

  StageMemory m;
  m.stage = pp_rank;
  m.layers = int64_t(rank_layers(chunks).size());
  m.in_flight = in_flight.all;
  for (const ParamInfo& p : layout.params) m.parameters_per_rank += p.numel;
  for (const GPTDims& d : chunks) m.expert_parameters_per_rank += expert_parameters(d);
  // The distributed optimizer (parallel/grad_sync.h): the buffers padded to its blocks; fp32 master
  // weights (bf16 / fp16 runs) and Adam moments only for this DP rank's 1/DP of them (DP x CP: the
  // weights' replicas with context parallelism; the experts' share over their EDP replicas)
  const int dp = std::max(1, cfg.parallel.data_parallel_size) * cfg.parallel.context_parallel_size;
  const int edp = expert_data_parallel_size(cfg);
  const bool distributed = cfg.parallel.distributed_optimizer && (dp > 1 || edp > 1);
  const ReplicaBuffers rb = replica_buffers(layout, dp, edp, distributed);
  const int64_t buffer = rb.total, owned = rb.owned;
  m.parameter_buffer = buffer;
  m.owned_elements = owned;
  m.tensors = int64_t(layout.params.size());
  m.expert_buffer = rb.expert_span;
  m.code_buffer = rb.code_span;
  m.expert_code_buffer = rb.expert_codes;
  set_model_state_bytes(cfg, m);
  // Each chunk is a GPTStage with its slots' activations (and with zb-h1 the stashed output
  // gradients the deferred weight gradients read) and its own scratch.
  // The chunks share one scratch for what lives within a pass: the largest chunk's (StageOptions::shared_scratch).
  const Recompute mode = cfg.training.recompute;
  int64_t shared_by_mode[3] = {0, 0, 0};
  // interleaved (pooled_slots): the chunks' slots in one pool of in_flight.pool slots of the largest
  // chunk's pooled_slot_bytes, and as many of the largest chunk's share of the MoE rows' pool
  // (moe_pool_slot_bytes); else each chunk its own peak of slots
  const bool pooled = pooled_slots(chunks, split);
  int64_t pool_by_mode[3] = {0, 0, 0};
  for (Recompute r : {Recompute::None, Recompute::Selective, Recompute::Full}) {
    int64_t slot = 0, rows = 0;
    for (const GPTDims& d : chunks)
      slot = std::max(slot, pooled_slot_bytes(d, B, r, dtype)), rows = std::max(rows, moe_pool_slot_bytes(d, B, r, dtype));
    if (pooled) pool_by_mode[int(r)] = in_flight.pool * (slot + rows);
  }
  for (size_t c = 0; c < chunks.size(); ++c) {
    const GPTDims& d = chunks[c];
    const int64_t stash = split ? weight_grad_stash_bytes(d, B, dtype) : 0;
    const int64_t f = fp8_layers(cfg, d);  // FP8 training: the codes' scratch and the scales (model/fp8_linear.h)
    Fp8LinearOptions fo;
    fo.delayed = cfg.training.fp8_recipe == Fp8Recipe::Delayed;
    fo.blockwise = cfg.training.fp8_recipe == Fp8Recipe::Blockwise;
    fo.wgrad = cfg.training.fp8_wgrad;
    const auto [fp8_begin, fp8_end] = cfg.training.fp8_layer_range(cfg.model.num_layers);
    const int64_t fp8 = f ? fp8_scratch_bytes(d, B, fo, std::max(fp8_begin, d.layer_begin), std::min(fp8_end, d.layer_end)) : 0;
    const int64_t own_slots = pooled ? 0 : slots[c];
    for (Recompute r : {Recompute::None, Recompute::Selective, Recompute::Full}) {
      m.activation_and_workspace_by_mode[int(r)] +=
          (activation_bytes_per_microbatch(d, B, r, dtype) + stash) * own_slots + scratch_bytes(d, B, r, dtype) + fp8;
      shared_by_mode[int(r)] = std::max(shared_by_mode[int(r)], shared_scratch_bytes(d, B, r, dtype));
    }
    m.activation_bytes += (activation_bytes_per_microbatch(d, B, mode, dtype) + stash) * own_slots;
    m.workspace_bytes += scratch_bytes(d, B, mode, dtype) + fp8;
    // The trainer's buffers: the received activations and gradients the schedules hold at once (B*S*C,
    // or this TP rank's B*S*C/tp with sequence parallelism).
    m.buffer_bytes += in_flight.receive_buffers.at(c) * dtype_size(stage_message_elements(d, B), dtype);
  }
  for (int r = 0; r < 3; ++r) m.activation_and_workspace_by_mode[r] += shared_by_mode[r] + pool_by_mode[r];
  m.activation_bytes += pool_by_mode[int(mode)];
  m.workspace_bytes += shared_by_mode[int(mode)];
  // the trainer's staging of a micro-batch: tokens, targets (int32), and with data.reset_position_ids /
  // data.eod_mask_loss its positions (int32) / loss weights (fp32); positions with context parallelism too
  const int64_t staged = 2 + int64_t(chunks.front().position_ids) + int64_t(cfg.data.eod_mask_loss);
  m.buffer_bytes += staged * B * chunks.front().S * 4;
  // checkpoint.async_save: the host staging of a rank that writes shards (train/trainer.h staging_):
  // master weights, exp_avg and exp_avg_sq over the layout, and the MoE expert biases', FP8 state's and
  // fp16 optimizer states' scales' copy
  if (cfg.checkpoint.async_save) {
    m.checkpoint_staging_bytes = 3 * layout.total * 4;
    if (cfg.model.moe_router_enable_expert_bias)
      for (int64_t l : rank_layers(chunks))
        if (cfg.model.is_moe_layer(l)) m.checkpoint_staging_bytes += cfg.model.num_moe_experts * 4;
    const StateDTypes st = state_dtypes(cfg.optimizer);  // fp16 optimizer states: a scale per tensor each
    for (DType t : {st.exp_avg, st.exp_avg_sq, st.master})
      if (t == DType::F16) m.checkpoint_staging_bytes += int64_t(layout.params.size()) * 4;
    if (cfg.training.fp8_format != Fp8Format::None && cfg.training.fp8_recipe == Fp8Recipe::Delayed)
      for (const GPTDims& d : chunks) {  // each FP8 GEMM's 3 scales and 3 x history_len amaxes
        const auto [begin, end] = cfg.training.fp8_layer_range(cfg.model.num_layers);
        for (int64_t l = std::max(begin, d.layer_begin); l < std::min(end, d.layer_end); ++l)
          for (const Fp8StateEntry& e : fp8_state_entries(cfg.model.is_moe_layer(l), cfg.model.num_moe_experts,
                                                          cfg.model.moe_shared_expert_intermediate_size > 0))
            m.checkpoint_staging_bytes += e.count * 3 * (1 + cfg.training.fp8_amax_history_len) * 4;
      }
  }
  if (gpu_backend) {
    const int64_t tensors = int64_t(layout.params.size());
    const BackendWorkspace det = gpu_backend_workspace(chunks, B, dtype, buffer, tensors, true),
                           nondet = gpu_backend_workspace(chunks, B, dtype, buffer, tensors, false);
    m.attention_workspace_by_mode[0] = det.attention;
    m.attention_workspace_by_mode[1] = nondet.attention;
    m.backend = cfg.training.deterministic ? det : nondet;
    // cuBLASLt's FP8 GEMMs: block scales in its layouts, no transposed codes (the model gives every
    // operand a GEMM reads transposed in that layout: the weights' kept copies, the casts' columnwise codes)
    for (const GPTDims& d : chunks)
      if (fp8_layers(cfg, d) > 0) {
        const Fp8ScratchSizes f = fp8_scratch_sizes(d, B);
        const bool blocks = cfg.training.fp8_recipe == Fp8Recipe::Blockwise;
        const int64_t max_blocks = blocks ? std::max({f.inp_blocks, f.w_blocks, f.dout_blocks}) : 0;
        m.backend.fp8 = std::max(m.backend.fp8, cuda_fp8_workspace(0, 0, 0, max_blocks).total);
      }
    m.backend.fp8 = device_buffer_bytes(m.backend.fp8);
  }
  return m;
}

AttentionShape attention_shape(const GPTDims& d, int64_t micro_batch, DType dtype) {
  return {micro_batch, d.S, d.Hl, d.kv_heads, d.D, dtype, d.cp > 1};
}

std::string cp_attention_kernel(const GPTDims& d, DType dtype) {
  return dtype != DType::F32 && d.D % 8 == 0 && d.S % 8 == 0 ? "cudnn" : "fallback";
}

BackendWorkspace gpu_backend_workspace(const std::vector<GPTDims>& chunks, int64_t micro_batch, DType dtype,
                                       int64_t parameter_buffer, int64_t parameter_tensors, bool deterministic) {
  BackendWorkspace w;
  w.gemm = kGemmWorkspaceBytes;
  // the gradient norm's reduction over the parameter buffer: its segments are the tensors cut by
  // the owned ranges (the distributed optimizer's, at most one per tensor more)
  w.scratch = std::max(grad_stats_scratch_bytes(parameter_buffer, 2 * parameter_tensors), sum_squares_scratch_bytes());
  int64_t ring_staging = 0;
  for (const GPTDims& d : chunks) {
    const int64_t N = micro_batch * d.S, Nt = d.local_tokens(N);
    // cuDNN's attention (bf16 / fp16, head dimension a multiple of 8): one shape for every layer
    const AttentionShape a = attention_shape(d, micro_batch, dtype);
    // (CP: the ring's calls, a block's pairs of c = T / 2 token chunks merged except in the
    // deterministic backward, and their staging, its own buffer)
    if (a.B > 0 && dtype != DType::F32 && d.D % 8 == 0) {
      const int64_t Sq = a.ring && deterministic ? a.T / 2 : a.T;
      w.attention = std::max(w.attention, cudnn_attention_workspace_bytes(a.B, a.H, a.KV, Sq, a.D, deterministic));
      if (a.ring) ring_staging = std::max(ring_staging, cudnn_ring_staging_bytes(a.B, a.T, a.H, a.KV, a.D));
    }
    // column sums: the norms' weight (and LayerNorm bias) gradients over this rank's rows; bias
    // gradients of the GEMMs summed apart from them (zb-h1's input-gradient part, SP's row-parallel
    // bias) over the GEMM's rows
    w.scratch = std::max(w.scratch, column_sums_scratch_bytes(Nt, d.C, d.norm.rms ? 1 : 2));
    if (d.qk_norm)  // the q/k norms' over the rank's query heads of all N tokens (the key heads: fewer rows)
      w.scratch = std::max(w.scratch, column_sums_scratch_bytes(N * d.Hl, d.D, d.norm.rms ? 1 : 2));
    // the GEMMs with a bias, by their rows and output width: the layer specs' (dense: d.layer; MoE:
    // those the chunk's layers use) and the experts' fc1 and fc2 on the dispatch bound's rows
    std::vector<std::pair<int64_t, int64_t>> biased;  // (rows, O)
    const bool dense_layers = !d.moe.any() || moe_layers_of(d) < d.layer_end - d.layer_begin;
    const bool moe_layers = moe_layers_of(d) > 0;
    for (const LayerSpec* spec : {dense_layers ? &d.layer : nullptr, moe_layers ? &d.moe_layer : nullptr})
      for (const LinearSpec* l : spec ? spec->linears() : std::vector<const LinearSpec*>{})
        if (l->bias) biased.push_back({N, l->out});
    if (moe_layers && d.moe.bias)
      for (int64_t O : {d.moe.fc1_width, d.C}) biased.push_back({d.moe.etp * moe_rows_bound(d.moe, Nt), O});
    for (const auto& [rows, O] : biased) {
      w.scratch = std::max(w.scratch, column_sums_scratch_bytes(rows, O, 1));
      w.bias_grad = std::max(w.bias_grad, O * 4);
    }
    if (d.first_stage())  // the word embedding's gradient: a radix sort of the token ids
      w.scratch = std::max(w.scratch, embedding_sort_arrays_bytes(N) + embedding_sort_temp_bound(N));
  }
  // as the backend's buffers hold them (at least 1 MiB each); cuDNN's workspace is one too
  w.scratch = device_buffer_bytes(w.scratch);
  w.bias_grad = device_buffer_bytes(w.bias_grad);
  w.attention = device_buffer_bytes(w.attention) + device_buffer_bytes(ring_staging);
  return w;
}

std::string describe_memory(const StageMemory& m) {
  char buf[400];
  std::snprintf(buf, sizeof(buf),
                "%.1f MiB (%lld bytes): weights %.1f, gradients %.1f, optimizer %.1f, activations %.1f, "
                "workspace %.1f, buffers %.1f MiB",
                mib(m.total_bytes()), (long long)m.total_bytes(), mib(m.weight_bytes), mib(m.gradient_bytes),
                mib(m.optimizer_bytes), mib(m.activation_bytes), mib(m.workspace_bytes), mib(m.buffer_bytes));
  std::string s = buf;
  if (m.backend.total() > 0) {
    std::snprintf(buf, sizeof(buf), ", backend %.1f MiB (cuBLASLt %.1f, cuDNN attention %.1f, scratch %.2f, bias grad %.2f",
                  mib(m.backend.total()), mib(m.backend.gemm), mib(m.backend.attention), mib(m.backend.scratch),
                  mib(m.backend.bias_grad));
    s += buf;
    if (m.backend.fp8) {
      std::snprintf(buf, sizeof(buf), ", FP8 GEMMs %.2f", mib(m.backend.fp8));
      s += buf;
    }
    s += ")";
  }
  return s;
}

int expert_tp_size(const Config& cfg) {
  const ParallelConfig& p = cfg.parallel;
  return p.expert_tensor_parallel_size > 0 ? p.expert_tensor_parallel_size : p.tensor_model_parallel_size;
}

int expert_data_parallel_size(const Config& cfg) {
  const ParallelConfig& p = cfg.parallel;
  if (!cfg.model.is_moe()) return 1;
  const int64_t etp = expert_tp_size(cfg);
  const int64_t folded = int64_t(p.tensor_model_parallel_size) * p.context_parallel_size * std::max(1, p.data_parallel_size);
  if (folded % (etp * p.expert_model_parallel_size) != 0)
    input_error("parallel.expert_model_parallel_size (" + std::to_string(p.expert_model_parallel_size) +
                ") x expert_tensor_parallel_size (" + std::to_string(etp) + ") does not divide tensor_model_parallel_size x "
                "context_parallel_size x data_parallel_size (" + std::to_string(folded) + ")");
  return int(folded / (etp * p.expert_model_parallel_size));
}

int64_t expert_parameters(const GPTDims& d) {
  const MoEDims& m = d.moe;
  const int64_t per_expert = m.fc1_width * d.C + d.C * m.Fel + (m.bias ? m.fc1_width + d.C : 0);
  return moe_layers_of(d) * m.El * per_expert;
}

int64_t total_parameters(const Config& cfg) {
  const int tp = cfg.parallel.tensor_model_parallel_size, pp = cfg.parallel.pipeline_model_parallel_size;
  int64_t total = 0;
  for (int s = 0; s < pp; ++s)
    for (const ParamInfo& p : make_param_layout(make_dims(cfg, tp, 0, pp, s)).params) {
      if (!p.group.primary) continue;  // the last stage's tied word embedding (tp_rank 0: the rest are)
      int64_t e = 1;
      for (int64_t x : p.global_shape) e *= x;
      total += e;
    }
  return total;
}

// Megatron's num_floating_point_operations (training.py) with grouped-query attention and SwiGLU:
// 12 B s l h^2 ((1 + G/H + s/(2h)) r + (F/h) m + V/(2 l h)), r = H D / h the query projection's ratio,
// m = 3/2 for SwiGLU; the causal half of the attention scores (s/(2h)). GPT-2 (G = H, D = h/H, F =
// 4h): 72 B s l h^2 (1 + s/(12h) + V/(12 l h)).
double iteration_model_flops(const Config& c, int64_t padded_vocab) {
  const ModelConfig& m = c.model;
  const double B = c.training.global_batch_size, s = m.seq_length, l = m.num_layers, h = m.hidden_size,
               V = double(padded_vocab), H = m.num_attention_heads, G = query_groups(m), F = m.ffn_hidden_size;
  const double r = H * double(m.kv_channels ? m.kv_channels : h / H) / h, gated = m.swiglu ? 1.5 : 1.0;
  double mlp = F / h * gated;  // per layer; an MoE model's mean over its dense and MoE layers
  if (m.is_moe()) {
    double moe = 0;
    for (int64_t i = 0; i < m.num_layers; ++i) moe += m.is_moe_layer(i) ? 1.0 : 0.0;
    const double routed = double(m.moe_router_topk) * m.moe_ffn_hidden_size + m.moe_shared_expert_intermediate_size;
    mlp = ((l - moe) * F + moe * routed) / (l * h) * gated;
  }
  return 12.0 * B * s * l * h * h * ((1.0 + G / H + s / (2.0 * h)) * r + mlp + V / (2.0 * l * h));
}

namespace {

// Per-rank FLOPs and TP all-reduce payload (bytes) of one micro-batch's forward and backward on a stage.
struct StageWork {
  double fwd_flops = 0, bwd_flops = 0;
  double fwd_tp_bytes = 0, bwd_tp_bytes = 0;
  double fwd_cp_bytes = 0, bwd_cp_bytes = 0;  // the CP ring's messages sent (context parallelism)
  double fwd_ep_bytes = 0, bwd_ep_bytes = 0;  // the MoE dispatch's all-to-alls sent (EP > 1)
};

StageWork stage_work(const Config& c, int s) {
  const double M = num_microbatches(c);
  const Recompute r = c.training.recompute;
  const bool gpipe = c.parallel.pipeline_schedule == PipelineSchedule::GPipe;
  const double cb = dtype_bytes(compute_dtype(c));
  StageWork w;
  for (const ChunkWork& k : stage_chunk_work(c, s)) {  // plan/stage_work.h
    // per layer and rank: 2 N in out for each linear layer of the layer spec (QKV 2 N C qkv_width,
    // projection 2 N Cl C, MLP 2 N C fc1_width + 2 N Fl C) and the attention's causal half (as the
    // logged formula's s/(2h) term counts it); an MoE layer's router 2 Nt C E and its experts' GEMMs
    // on the rank's Nt k rows (plan/stage_work.h)
    const double layer = k.linear_flops() + k.attention_flops, layers = k.layers;
    const double moe_layer = k.moe_linear_flops() + k.attention_flops;
    const double all_layers = k.dense_layers() * layer + k.moe_layers * moe_layer;
    const double fwd = all_layers + (k.last ? k.lm_head_flops() : 0.0);
    double bwd = 2.0 * fwd;
    if (r == Recompute::Full) bwd += all_layers;
    bwd += layers * k.attention_flops / 2;  // flash-style backward recomputes the scores
    if (r == Recompute::Selective) bwd += layers * k.attention_flops;
    // GPipe: the last stage's logits of all but the last micro-batch are recomputed in backward
    if (gpipe && k.last) bwd += k.lm_head_flops() * (M - 1) / M;
    w.fwd_flops += fwd;
    w.bwd_flops += bwd;
    if (k.tp > 1) {
      // per layer: forward one all-reduce after each row-parallel layer, backward one of each
      // column-parallel layer's input gradient; an all-gather of FP8 codes (sequence parallelism) half
      // an all-reduce of a byte per element (blockwise: and the blocks' scales)
      const double act = k.N * k.C * cb, rows = k.row_parallel_layers();
      const double fwd_layers = rows * act - k.fp8_code_gathers() * k.N * k.C * (cb - k.fp8_gather_bytes) / 2;
      w.fwd_tp_bytes += fwd_layers + (k.first ? act : 0) + (k.last ? 3 * k.N * 4 : 0);
      w.bwd_tp_bytes += k.column_parallel_layers() * act - k.fp8_dout_code_gathers() * k.N * k.C * (cb - 1) / 2 +
                        (k.last ? act : 0) + (r == Recompute::Full ? fwd_layers : 0);
    }
    if (k.moe.ep > 1) {  // per MoE layer: the rows out and back forward, their gradients backward (and full recompute's rerun)
      const double a2a = k.moe_layers * 2 * k.dispatch_bytes(cb);
      w.fwd_ep_bytes += a2a;
      w.bwd_ep_bytes += a2a + (r == Recompute::Full ? a2a : 0);
    }
    if (k.cp > 1) {  // per layer: CP - 1 K/V blocks forward; in backward CP - 1 blocks and CP fp32 gradients
      const double reruns = r == Recompute::None ? 0.0 : 1.0, fwd_cp = layers * (k.cp - 1) * k.kv_block * cb;
      w.fwd_cp_bytes += fwd_cp;
      w.bwd_cp_bytes += reruns * fwd_cp + layers * ((k.cp - 1) * k.kv_block * cb + k.cp * k.kv_block * 4);
    }
  }
  return w;
}

// 1F1B, interleaved (v = 2, and the configured v when it is another) and ZB-H1 side by side on this
// grid (parallel/schedule.h), with unit costs F = B = W = 1 for a stage's share of the layers.
std::vector<ScheduleBubble> compare_schedules(const Config& cfg, int P, int M) {
  struct Kind {
    std::string name;
    ScheduleKind kind;
    int v;
  };
  std::vector<Kind> kinds{{"1f1b", ScheduleKind::OneFOneB, 1}, {"interleaved v=2", ScheduleKind::Interleaved1F1B, 2}};
  const int v_cfg = cfg.parallel.virtual_pipeline_model_parallel_size;
  if (v_cfg > 2) kinds.push_back({"interleaved v=" + std::to_string(v_cfg), ScheduleKind::Interleaved1F1B, v_cfg});
  kinds.push_back({"zb-h1", ScheduleKind::ZeroBubbleH1, 1});
  std::vector<ScheduleBubble> out;
  for (const Kind& k : kinds) {
    ScheduleBubble b{k.name, check_schedule(k.kind, P, M, k.v)};
    if (b.why_not.empty() && cfg.model.num_layers % (P * k.v) != 0)
      b.why_not = "model.num_layers is not divisible by pipeline_model_parallel_size x " + std::to_string(k.v);
    if (b.why_not.empty()) {
      std::vector<std::vector<Action>> l;
      for (int s = 0; s < P; ++s) l.push_back(make_schedule(k.kind, P, s, M, k.v));
      const std::string bad = simulate(l);
      if (!bad.empty()) internal_error("plan: the " + k.name + " schedule does not simulate: " + bad);
      const PipelineTiming t = time_pipeline(l, 1.0, 1.0, 1.0);
      b.bubble_over_ideal = t.bubble_over_ideal();
      b.bubble_fraction = t.makespan > 0 ? 1.0 - t.ideal() / t.makespan : 0.0;
      for (const auto& stage : l) b.max_in_flight = std::max(b.max_in_flight, max_in_flight(stage));
    }
    out.push_back(b);
  }
  return out;
}

}  // namespace

Plan make_plan(Config cfg, const PlanOptions& o) {
  Plan plan;
  plan.options = o;
  const ParallelConfig& par = cfg.parallel;
  // TP x CP x PP x DP of the config (each bounded, their product not): no more ranks than --world-size takes
  const int64_t config_world = int64_t(par.tensor_model_parallel_size) * par.pipeline_model_parallel_size *
                               par.context_parallel_size * std::max(1, par.data_parallel_size);
  if (o.world_size <= 0 && config_world > (1 << 24))
    input_error("parallel.data_parallel_size: tensor_model_parallel_size x context_parallel_size x "
                "pipeline_model_parallel_size x data_parallel_size = " + std::to_string(config_world) +
                " ranks, more than 16777216");
  plan.world_size = o.world_size > 0 ? o.world_size : int(config_world);
  resolve_parallel(cfg, plan.world_size);
  check_plannable(cfg);
  plan.tp = par.tensor_model_parallel_size;
  plan.pp = par.pipeline_model_parallel_size;
  plan.dp = par.data_parallel_size;
  plan.cp = par.context_parallel_size;
  plan.num_microbatches = num_microbatches(cfg);
  plan.device_memory_bytes = o.device_memory_gib * 1073741824.0;
  plan.total_parameters = total_parameters(cfg);
  if (cfg.model.is_moe()) {  // every expert once: each layer's E (EP rank 0 of every stage holds E / EP)
    plan.ep = par.expert_model_parallel_size;
    plan.edp = expert_data_parallel_size(cfg);
    for (int s = 0; s < plan.pp; ++s)
      for (const GPTDims& d : make_chunk_dims(cfg, plan.tp, 0, plan.pp, s)) plan.expert_parameters += expert_parameters(d);
    plan.active_parameters = plan.total_parameters - plan.expert_parameters +
                             plan.expert_parameters / cfg.model.num_moe_experts * cfg.model.moe_router_topk;
  } else {
    plan.active_parameters = plan.total_parameters;
  }
  plan.padded_vocab = padded_vocab_size(cfg.model.vocab_size, cfg.model.make_vocab_size_divisible_by, plan.tp);
  plan.flops_per_iteration = iteration_model_flops(cfg, plan.padded_vocab);

  const int P = plan.pp, M = plan.num_microbatches;
  const DType dtype = compute_dtype(cfg);
  std::vector<std::vector<Action>> lists;
  for (int s = 0; s < P; ++s) lists.push_back(stage_schedule(cfg, s));
  const std::string err = simulate(lists);
  if (!err.empty()) internal_error("plan: the pipeline schedule does not simulate: " + err);
  plan.bubble_fraction = time_pipeline(lists, 1.0, 1.0, 1.0).bubble_fraction();  // backward = B + W = 2
  plan.bubble_fraction_analytic = double(P - 1) / double(M + P - 1);
  if (P > 1) plan.schedule_bubbles = compare_schedules(cfg, P, M);

  // the weights' replicas: DP, or DP x CP with context parallelism (its ranks hold the same weights)
  const int reps = plan.dp * plan.cp;
  // a pipeline message: the stage output (B*S*C; this TP rank's B*S*C/TP with sequence parallelism)
  const int64_t message =
      dtype_size(stage_message_elements(make_chunk_dims_cp(cfg, plan.tp, P, 0), cfg.training.micro_batch_size), dtype);
  if (plan.cp > 1) plan.cp_attention_kernel = cp_attention_kernel(make_chunk_dims_cp(cfg, plan.tp, P, 0), dtype);
  for (int s = 0; s < P; ++s) {
    plan.stages.push_back(stage_memory(cfg, s));
    const StageMemory& m = plan.stages.back();
    plan.fits = plan.fits && double(m.total_bytes()) <= plan.device_memory_bytes;
    const StageWork w = stage_work(cfg, s);
    plan.hardware_flops_per_iteration += (w.fwd_flops + w.bwd_flops) * M * plan.tp * reps;
    plan.cp_comm_bytes = std::max(plan.cp_comm_bytes, int64_t((w.fwd_cp_bytes + w.bwd_cp_bytes) * M));
    plan.tp_comm_bytes = std::max(plan.tp_comm_bytes, int64_t((w.fwd_tp_bytes + w.bwd_tp_bytes) * M));
    plan.ep_comm_bytes = std::max(plan.ep_comm_bytes, int64_t((w.fwd_ep_bytes + w.bwd_ep_bytes) * M));
    const int64_t sends = (s > 0 ? M : 0) + (s < P - 1 ? M : 0);  // gradients back, activations forward
    plan.pp_comm_bytes = std::max(plan.pp_comm_bytes, sends * message);
    // DP: the gradient buffer's all-reduce (fp32, or bf16: gb), or with the distributed optimizer its
    // reduce-scatter and the all-gather of the parameters in the compute dtype; the tied word
    // embedding's gradient over {first, last stage}. The experts' span over their EDP group.
    const bool distributed = cfg.parallel.distributed_optimizer && (reps > 1 || plan.edp > 1);
    const int64_t dense = m.parameter_buffer - m.expert_buffer;
    const int64_t gb = bf16_grads(cfg) ? 2 : 4;
    int64_t dp_bytes = reps > 1 ? dense * gb : 0;
    // (FP8 parameters: their spans gathered as codes, a byte per element)
    const int64_t dense_codes = m.code_buffer - m.expert_code_buffer, expert_codes = m.expert_code_buffer;
    if (distributed && reps > 1) dp_bytes += dtype_size(dense - dense_codes, compute_dtype(cfg)) + dense_codes;
    if (plan.edp > 1)
      dp_bytes += m.expert_buffer * gb +
                  (distributed ? dtype_size(m.expert_buffer - expert_codes, compute_dtype(cfg)) + expert_codes : 0);
    if (P > 1 && (s == 0 || s == P - 1)) {
      const GPTDims d = make_dims(cfg, plan.tp, 0, P, s);
      if (!d.untied) dp_bytes += d.Vl * d.C * gb;
    }
    plan.dp_comm_bytes = std::max(plan.dp_comm_bytes, dp_bytes);
  }
  // the step-time model (plan/step_time.h) over the same schedule lists
  ScheduleCache cache;
  plan.time = estimate_step_time(cfg, o.hw, o.gpus_per_node, plan.stages, cache);
  plan.pipeline_time_s = plan.time.pipeline_s;
  plan.dp_time_s = plan.time.dp_exposed_s;
  plan.optimizer_time_s = plan.time.optimizer_s;
  plan.step_time_s = plan.time.step_s;
  plan.tokens_per_s = plan.time.tokens_per_s;
  plan.mfu = plan.time.mfu;
  if (!plan.fits) plan.suggestions = plan_suggestions(cfg, plan);
  return plan;
}

}  // namespace tpt
