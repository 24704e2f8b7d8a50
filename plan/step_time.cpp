// The step-time model (see plan/step_time.h for what it counts and why).
#include "plan/step_time.h"

#include <algorithm>
#include <cmath>

#include "core/config.h"
#include "core/error.h"
#include "model/chunks.h"
#include "model/gpt.h"
#include "plan/memory.h"
#include "plan/stage_work.h"

namespace tpt {

Hardware hardware_preset(const std::string& gpu) {
  Hardware h;  // h100: the defaults
  if (gpu == "h100") return h;
  if (gpu == "h200") {  // same compute as an H100 SXM, 141 GB of HBM3e at 4.8 TB/s
    h.name = "h200";
    h.memory_gib = 141;
    h.hbm_gbps = 4800;
    return h;
  }
  if (gpu == "a100") {  // A100 80GB SXM: 312 TFLOP/s bf16, 2.0 TB/s, NVLink 3, one 200 Gbit/s HDR NIC per GPU
    h.name = "a100";
    h.peak_tflops = 312;
    h.hbm_gbps = 2039;
    h.sms = 108;
    h.gemm_efficiency = 0.72;  // calibrated on the SC21 rows of tests/plan/published.yaml
    h.fp8_peak_factor = 0;     // no FP8 tensor cores
    h.attention_efficiency = 0.55;
    h.nvlink_gbps = 230;
    h.network_gbps = 22;
    return h;
  }
  input_error("--gpu: '" + gpu + "' is not one of h100, h200, a100");
}

CompiledSchedule::CompiledSchedule(const std::vector<std::vector<Action>>& lists) {
  using K = Action::Kind;
  const int P = int(lists.size());
  // ids; which stages split the backward; the chunks
  std::vector<bool> split(size_t(P), false);
  for (int s = 0; s < P; ++s) {
    offset_.push_back(int(ops_.size()));
    for (const Action& a : lists[size_t(s)]) {
      if (a.kind == K::BackwardWeight) split[size_t(s)] = true;
      if (a.kind != K::Comm) chunks_ = std::max(chunks_, a.chunk + 1);
      ops_.push_back({s, 4});
    }
  }
  offset_.push_back(int(ops_.size()));
  // Messages by (activation?, receiving stage, micro-batch, chunk on the receiver): the sending and
  // the receiving exchange. Peers as in the simulator: activations to stage s + 1 (rank P - 1's chunk c
  // to rank 0's chunk c + 1), gradients to s - 1 (rank 0's chunk c to rank P - 1's chunk c - 1).
  std::map<std::tuple<bool, int, int, int>, std::pair<int, int>> messages;
  for (int s = 0; s < P; ++s)
    for (size_t i = 0; i < lists[size_t(s)].size(); ++i) {
      const Action& a = lists[size_t(s)][i];
      const int id = offset_[size_t(s)] + int(i);
      Op& op = ops_[size_t(id)];
      if (a.kind != K::Comm) {
        op.kind = a.kind == K::Forward ? 0 : a.kind == K::BackwardWeight ? 3 : split[size_t(s)] ? 2 : 1;
        continue;
      }
      op.data = a.send_fwd >= 0 || a.send_bwd >= 0 || a.recv_fwd >= 0 || a.recv_bwd >= 0;
      if (a.send_fwd >= 0)
        messages[{true, (s + 1) % P, a.send_fwd, s == P - 1 ? a.send_fwd_chunk + 1 : a.send_fwd_chunk}].first = id;
      if (a.send_bwd >= 0)
        messages[{false, (s + P - 1) % P, a.send_bwd, s == 0 ? a.send_bwd_chunk - 1 : a.send_bwd_chunk}].first = id;
      if (a.recv_fwd >= 0) messages[{true, s, a.recv_fwd, a.recv_fwd_chunk}].second = id;
      if (a.recv_bwd >= 0) messages[{false, s, a.recv_bwd, a.recv_bwd_chunk}].second = id;
    }
  std::vector<std::vector<int>> partners(ops_.size());
  for (const auto& [key, ends] : messages) {
    partners[size_t(ends.first)].push_back(ends.second);
    partners[size_t(ends.second)].push_back(ends.first);
  }
  for (size_t id = 0; id < ops_.size(); ++id) {
    ops_[id].first_partner = int(partner_.size());
    ops_[id].partners = int(partners[id].size());
    partner_.insert(partner_.end(), partners[id].begin(), partners[id].end());
  }
  // The order: stages in turn, each as far as it can go; an exchange waits until its counterparts are
  // posted (their stages have reached them), as the simulator runs them.
  std::vector<int> pc(size_t(P), 0);
  for (size_t done = 0; done < ops_.size();) {
    const size_t before = done;
    for (int s = 0; s < P; ++s)
      for (int& i = pc[size_t(s)]; offset_[size_t(s)] + i < offset_[size_t(s) + 1]; ++i) {
        const Op& op = ops_[size_t(offset_[size_t(s)] + i)];
        bool ready = true;
        for (int k = 0; k < op.partners && ready; ++k) {
          const int q = partner_[size_t(op.first_partner + k)], qs = ops_[size_t(q)].stage;
          ready = offset_[size_t(qs)] + pc[size_t(qs)] >= q;
        }
        if (!ready) break;
        order_.push_back(offset_[size_t(s)] + i);
        ++done;
      }
    if (done == before) internal_error("CompiledSchedule: the lists deadlock (simulate() should have said so)");
  }
}

PipelineTiming CompiledSchedule::time(const std::vector<double>& f, const std::vector<double>& b,
                                      const std::vector<double>& w, double p2p) const {
  const size_t P = offset_.size() - 1;
  TPT_CHECK(f.size() == P && b.size() == P && w.size() == P);
  std::vector<double>& end = end_;
  end.assign(ops_.size(), 0.0);
  PipelineTiming t;
  t.busy.assign(P, 0.0);
  // when an action is posted: the end of the stage's previous action
  auto posted = [&](int id) { return id == offset_[size_t(ops_[size_t(id)].stage)] ? 0.0 : end[size_t(id) - 1]; };
  const double v = chunks_;
  for (int id : order_) {
    const Op& op = ops_[size_t(id)];
    const size_t s = size_t(op.stage);
    double at = posted(id);
    if (op.kind == 4) {
      for (int k = 0; k < op.partners; ++k) at = std::max(at, posted(partner_[size_t(op.first_partner + k)]));
      end[size_t(id)] = at + (op.data ? p2p : 0.0);
      continue;
    }
    const double cost = (op.kind == 0 ? f[s] : op.kind == 1 ? b[s] + w[s] : op.kind == 2 ? b[s] : w[s]) / v;
    end[size_t(id)] = at + cost;
    t.busy[s] += cost;
  }
  for (size_t s = 0; s < P; ++s)
    if (offset_[s + 1] > offset_[s]) t.makespan = std::max(t.makespan, end[size_t(offset_[s + 1]) - 1]);
  return t;
}

const CompiledSchedule& ScheduleCache::compiled(int kind, int P, int M, int v) {
  const auto key = std::make_tuple(kind, P, M, v);
  auto it = compiled_.find(key);
  if (it == compiled_.end()) {
    std::vector<std::vector<Action>> lists;
    for (int s = 0; s < P; ++s) lists.push_back(make_schedule(ScheduleKind(kind), P, s, M, v));
    it = compiled_.emplace(key, CompiledSchedule(lists)).first;
  }
  return it->second;
}

PipelineTiming ScheduleCache::time(const Config& c, const std::vector<double>& f, const std::vector<double>& b,
                                   const std::vector<double>& w, double p2p) {
  const int P = c.parallel.pipeline_model_parallel_size, v = model_chunks(c);
  const int M = int(c.training.global_batch_size / (int64_t(c.training.micro_batch_size) * c.parallel.data_parallel_size));
  const int kind = int(schedule_kind(c.parallel.pipeline_schedule, v));
  const int step = v > 1 ? P : 1, bound = bound_for(P, v) / step * step;
  if (P == 1 || M <= bound + 2 * step) return compiled(kind, P, M, v).time(f, b, w, p2p);
  const int k = (M - bound + step - 1) / step, M1 = M - k * step;  // M1 <= bound, M1 = M (mod step)
  const PipelineTiming t1 = compiled(kind, P, M1, v).time(f, b, w, p2p);
  const double d1 = t1.makespan - compiled(kind, P, M1 - step, v).time(f, b, w, p2p).makespan;
  const double d2 = t1.makespan - d1 - compiled(kind, P, M1 - 2 * step, v).time(f, b, w, p2p).makespan;
  if (std::abs(d1 - d2) > 1e-9 * t1.makespan) return compiled(kind, P, M, v).time(f, b, w, p2p);
  PipelineTiming t = t1;
  t.makespan += k * d1;
  for (double& x : t.busy) x *= double(M) / M1;
  return t;
}

namespace {

// Seconds of one micro-batch on one rank of a stage, by kind of work.
struct Work {
  double gemm_f = 0, gemm_b = 0, gemm_w = 0;  // forward, input-gradient, weight-gradient GEMMs
  double attn_f = 0, attn_b = 0;
  double elem_f = 0, elem_b = 0;
  double tp_f = 0, tp_b = 0;
  double cp_f = 0, cp_b = 0;                  // context parallelism's ring messages (exposed)
  double ep_f = 0, ep_b = 0;                  // the MoE dispatch's all-to-alls over EP (not overlapped)
  double recompute = 0;                       // extra forward work before the backward
  double forward() const { return gemm_f + attn_f + elem_f + tp_f + cp_f + ep_f; }
  double input_grad() const { return gemm_b + attn_b + elem_b + tp_b + cp_b + recompute + ep_b; }
};

class Model {
 public:
  Model(const Config& c, const Hardware& hw, int gpus_per_node)
      : c_(c), hw_(hw), gpn_(gpus_per_node), cb_(dtype_bytes(compute_dtype(c))) {}

  // A GEMM (m x k) . (k x n): 2 m n k FLOPs at the shape's efficiency, or the operands' HBM time.
  double gemm(double m, double n, double k) const {
    const double tiles = std::ceil(m / 128) * std::ceil(n / 128), waves = std::ceil(tiles / hw_.sms);
    const double shape = m * n / (waves * hw_.sms * 128.0 * 128.0) * k / (k + 256.0);
    const double compute = 2 * m * n * k / (hw_.peak_tflops * 1e12 * hw_.gemm_efficiency * shape);
    return std::max(compute, memory_bound((m * k + k * n + m * n) * cb_, 0)) + hw_.kernel_overhead_us * 1e-6;
  }
  // Bytes per element of the FP8 casts of a linear layer's GEMM inputs (model/fp8_linear.cpp): each reads
  // the 16-bit tensor once, current scaling (tensorwise) once more for its amax first, and writes a byte
  // per layout it makes. The input: its rowwise codes in forward, its columnwise codes again in
  // backward for an FP8 weight gradient, or, where its codes are saved (GPTDims::fp8_saved_inputs),
  // both layouts in forward (blockwise: two casts) and none in backward; the output gradient: both
  // layouts in one cast (blockwise: two casts, 1 x 128 for the input gradient and 128 x 1 for the
  // weight gradient; zb-h1's B makes both, W reads the columnwise ones it stashed), its rowwise codes alone with
  // fp8_wgrad false; a weight once per step, with the transpose of its codes (a byte read, a byte
  // written). An input gathered as codes with sequence parallelism (ChunkWork::Linear::fp8_gathered) is
  // cast on this rank's tokens, rowwise (input); saved, its codes gathered again in backward are
  // transposed (a byte read, a byte written), blockwise's shard cast a second time (128 x 1) and those
  // codes transposed in forward; an output gradient gathered so (fp8_dout_gathered) is cast
  // on this rank's tokens rowwise (input's bytes) and its gathered codes transposed.
  struct Fp8Casts {
    double input = 0, input_again = 0, input_saved = 0, output_grad = 0, weight = 0, dense_weight = 0, expert_weight = 0;
  };
  Fp8Casts fp8_casts() const {
    const TrainingConfig& t = c_.training;
    const bool wgrad = t.fp8_wgrad;
    const bool blockwise = t.fp8_recipe == Fp8Recipe::Blockwise;
    const double read = cb_ + (t.fp8_recipe == Fp8Recipe::Tensorwise ? cb_ : 0.0);
    Fp8Casts c;
    c.input = read + 1.0;
    c.input_again = wgrad ? read + 1.0 : 0.0;
    c.input_saved = blockwise ? 2.0 * (read + 1.0) : read + 2.0;
    c.output_grad = !wgrad ? read + 1.0 : blockwise ? 2.0 * (read + 1.0) : read + 2.0;
    c.weight = read + 3.0;
    // FP8 parameters (training.fp8_param_gather): a weight's cast from the master weights on this rank's
    // 1 / (DP x CP) of it (the experts': 1 / EDP; read the fp32 master, write and read the 16-bit value,
    // write a byte; current and blockwise scaling an amax pass before, the same but the byte), and the
    // transpose of the gathered codes
    const double reps = double(std::max(1, c_.parallel.data_parallel_size) * c_.parallel.context_parallel_size);
    const double cast = 4.0 + 2.0 * cb_ + 1.0 + (t.fp8_recipe == Fp8Recipe::Delayed ? 0.0 : 4.0 + 2.0 * cb_);
    c.dense_weight = t.fp8_param_gather ? 2.0 + cast / reps : c.weight;
    c.expert_weight = t.fp8_param_gather ? 2.0 + cast / expert_data_parallel_size(c_) : c.weight;
    return c;
  }

  // The same GEMM with FP8 operands (1 byte each; the output in the compute dtype).
  double gemm_fp8(double m, double n, double k) const {
    const double tiles = std::ceil(m / 128) * std::ceil(n / 128), waves = std::ceil(tiles / hw_.sms);
    const double shape = m * n / (waves * hw_.sms * 128.0 * 128.0) * k / (k + 256.0);
    const double peak = hw_.peak_tflops * hw_.fp8_peak_factor * 1e12 * hw_.fp8_gemm_efficiency;
    return std::max(2 * m * n * k / (peak * shape), memory_bound(m * k + k * n + m * n * cb_, 0)) +
           hw_.kernel_overhead_us * 1e-6;
  }
  // Elementwise kernels moving `bytes` in total.
  double memory_bound(double bytes, int kernels) const {
    return bytes / (hw_.hbm_gbps * 1e9 * hw_.hbm_efficiency) + kernels * hw_.kernel_overhead_us * 1e-6;
  }
  // A collective over the group of g ranks `stride` apart in the rank order; factor: algorithm bytes
  // per payload byte over (g - 1) / g (2 for an all-reduce, 1 for all-gather / reduce-scatter).
  double collective(double bytes, int g, int stride, double factor) const {
    if (g <= 1) return 0;
    const bool nvlink = intra_node(g * stride);
    const double bw = (nvlink ? hw_.nvlink_gbps : hw_.network_gbps) * 1e9;
    const double lat = (nvlink ? hw_.nvlink_latency_us : hw_.network_latency_us) * 1e-6;
    return factor * (g - 1) * lat + factor * double(g - 1) / g * bytes / bw;
  }
  double send(double bytes, int span) const {
    const bool nvlink = intra_node(span);
    return (nvlink ? hw_.nvlink_latency_us : hw_.network_latency_us) * 1e-6 +
           bytes / ((nvlink ? hw_.nvlink_gbps : hw_.network_gbps) * 1e9);
  }
  // The experts' GEMMs of one layer as one grouped GEMM: `experts` problems (m x k) . (k x n), their
  // output tiles quantised over the SMs together, one launch; each problem's k / (k + 256) and
  // never faster than the operands at HBM speed.
  // fp8: FP8 operands, as gemm_fp8
  double grouped_gemm(double experts, double m, double n, double k, bool fp8 = false) const {
    if (experts <= 0 || m <= 0) return 0;
    const double tiles = experts * std::ceil(m / 128) * std::ceil(n / 128), waves = std::ceil(tiles / hw_.sms);
    const double shape = experts * m * n / (waves * hw_.sms * 128.0 * 128.0) * k / (k + 256.0);
    const double peak = fp8 ? hw_.peak_tflops * hw_.fp8_peak_factor * hw_.fp8_gemm_efficiency
                            : hw_.peak_tflops * hw_.gemm_efficiency;
    const double operand = fp8 ? 1.0 : cb_;
    return std::max(2 * experts * m * n * k / (peak * 1e12 * shape),
                    memory_bound(experts * ((m * k + k * n) * operand + m * n * cb_), 0)) +
           hw_.kernel_overhead_us * 1e-6;
  }
  // An all-to-all over g ranks `stride` apart, each sending `bytes` spread evenly over the group:
  // to the peers in its node over NVLink, to the others over the network, both at once.
  double all_to_all(double bytes, int g, int stride) const {
    if (g <= 1) return 0;
    const int in_node = std::max(1, std::min(g, gpn_ / std::max(1, stride)));  // group ranks per node
    const double intra = bytes * (in_node - 1) / g, inter = bytes * (g - in_node) / g;
    double t = hw_.nvlink_latency_us * 1e-6 + intra / (hw_.nvlink_gbps * 1e9);
    if (inter > 0) t = std::max(t, hw_.network_latency_us * 1e-6 + inter / (hw_.network_gbps * 1e9));
    return t;
  }
  // A group of `span` consecutive ranks stays inside a node when it tiles the node's GPUs.
  bool intra_node(int span) const { return span <= gpn_ && gpn_ % span == 0; }

  Work stage_work(int stage) const {
    Work w;
    for (const ChunkWork& chunk : stage_chunk_work(c_, stage)) add_chunk(chunk, w);
    return w;
  }

 private:
  // The items of one chunk's work (plan/stage_work.h) in seconds.
  void add_chunk(const ChunkWork& k, Work& w) const {
    const double N = k.N, Nt = k.Nt, C = k.C, layers = k.layers;
    const Recompute rc = c_.training.recompute;
    // the layer spec's linear layers (in, out) of the rank: QKV, projection, fc1, fc2
    double gf = 0, gb = 0, gw = 0;
    for (const ChunkWork::Linear& l : k.linears) {
      gf += gemm(N, l.out, l.in);
      gb += gemm(N, l.in, l.out);
      gw += gemm(l.in, l.out, N);
    }
    // an MoE layer's: QKV, projection, the router on the rank's Nt tokens, and each local expert's
    // fc1 and fc2 on its share of the rows (the balanced load)
    // an FP8 layer's (docs/FP8.md): the GEMMs on FP8 operands, and the casts of their inputs as
    // model/fp8_linear.cpp makes them (fp8_casts); the weights' once per step: over the step's M
    // micro-batches
    double f8f = 0, f8b = 0, f8w = 0;
    const Fp8Casts cast = fp8_casts();
    const double M = double(c_.training.global_batch_size) /
                     double(int64_t(c_.training.micro_batch_size) * c_.parallel.data_parallel_size);
    if (k.fp8_layers > 0) {
      const TrainingConfig& t = c_.training;
      // inputs cast in forward and again in backward, saved (both layouts in forward), saved shards'
      // transposes in backward; weights, output gradients
      double xf = 0, xa = 0, xs = 0, xt = 0, wb = 0, yb = 0, ys = 0, yt = 0;  // ys, yt: gathered output gradients
      double xb = 0;  // blockwise's saved shards: their second (128 x 1) cast, its codes transposed back
      int saved = 0, shards = 0, douts = 0;
      for (const ChunkWork::Linear& l : k.linears) {
        f8f += gemm_fp8(N, l.out, l.in);
        f8b += gemm_fp8(N, l.in, l.out);
        f8w += t.fp8_wgrad ? gemm_fp8(l.in, l.out, N) : gemm(l.in, l.out, N);
        const double rows = l.fp8_gathered ? Nt : N;  // the forward's cast
        if (l.fp8_saved && l.fp8_gathered) xf += rows * l.in, xt += N * l.in, ++shards;
        else if (l.fp8_saved) xs += N * l.in;
        else xf += rows * l.in, xa += N * l.in;
        if (l.fp8_saved && l.fp8_gathered && t.fp8_recipe == Fp8Recipe::Blockwise) xb += rows * l.in;
        if (l.fp8_dout_gathered) ys += Nt * l.out, yt += N * l.out, ++douts;
        else yb += N * l.out;
        wb += l.in * l.out;
        saved += l.fp8_saved ? 1 : 0;
      }
      // the casts' kernels: one per GEMM and pass, blockwise a second for each saved input in forward
      const int n = int(k.linears.size()), blockwise = t.fp8_recipe == Fp8Recipe::Blockwise ? saved : 0;
      f8f += memory_bound(xf * cast.input + xs * cast.input_saved + xb * (cast.input + 2.0) + wb * cast.dense_weight / M,
                          n + blockwise + (xb > 0 ? shards : 0));
      f8b += memory_bound(yb * cast.output_grad + ys * cast.input + yt * 2.0, n + douts);
      if ((cast.input_again > 0 && xa > 0) || xt > 0)
        f8w += memory_bound(xa * cast.input_again + xt * 2.0, (cast.input_again > 0 ? n - saved : 0) + shards);
    }
    // an MoE layer's GEMMs: bf16 (mg*) and in an FP8 layer (m8*: all but the router's, which is the
    // replicated one on the rank's Nt tokens, with their inputs' casts as a dense FP8 layer's)
    double mgf = 0, mgb = 0, mgw = 0, m8f = 0, m8b = 0, m8w = 0, m8x = 0, m8xa = 0, m8xs = 0, m8xt = 0, m8y = 0, m8ys = 0,
           m8yt = 0, m8wt = 0, m8xb = 0;  // m8xb: blockwise's saved shards, as xb above
    const bool wgrad8 = c_.training.fp8_wgrad;
    for (const ChunkWork::Linear& l : k.moe.linears) {
      const bool router = l.split == LinearSplit::Replicated;
      const double rows = router ? Nt : N;
      mgf += gemm(rows, l.out, l.in);
      mgb += gemm(rows, l.in, l.out);
      mgw += gemm(l.in, l.out, rows);
      m8f += router ? gemm(rows, l.out, l.in) : gemm_fp8(rows, l.out, l.in);
      m8b += router ? gemm(rows, l.in, l.out) : gemm_fp8(rows, l.in, l.out);
      m8w += router || !wgrad8 ? gemm(l.in, l.out, rows) : gemm_fp8(l.in, l.out, rows);
      if (router) continue;
      if (l.fp8_saved && l.fp8_gathered) m8x += Nt * l.in, m8xt += rows * l.in;
      else if (l.fp8_saved) m8xs += rows * l.in;
      else m8x += (l.fp8_gathered ? Nt : rows) * l.in, m8xa += rows * l.in;
      if (l.fp8_saved && l.fp8_gathered && c_.training.fp8_recipe == Fp8Recipe::Blockwise) m8xb += Nt * l.in;
      if (l.fp8_dout_gathered) m8ys += Nt * l.out, m8yt += rows * l.out;
      else m8y += rows * l.out;
      m8wt += l.in * l.out;
    }
    const double imb = hw_.moe_imbalance, rows = k.moe.rows * imb;  // the busiest EP rank's rows
    if (k.moe_layers > 0) {
      const double F1 = k.moe.fc1_width, Fe = k.moe.ffn, El = k.moe.local;
      for (const bool f8 : {false, true}) {
        const bool w8 = f8 && wgrad8;
        (f8 ? m8f : mgf) += grouped_gemm(El, rows / El, F1, C, f8) + grouped_gemm(El, rows / El, C, Fe, f8);
        (f8 ? m8b : mgb) += grouped_gemm(El, rows / El, C, F1, f8) + grouped_gemm(El, rows / El, Fe, C, f8);
        (f8 ? m8w : mgw) += grouped_gemm(El, C, F1, rows / El, w8) + grouped_gemm(El, Fe, C, rows / El, w8);
      }
      m8x += rows * (C + Fe), m8xa += rows * (C + Fe), m8y += rows * (F1 + C), m8wt += El * (C * F1 + Fe * C);
    }
    if (k.fp8_moe_layers > 0) {  // the casts of the GEMMs' inputs, output gradients and weights
      m8f += memory_bound(m8x * cast.input + m8xs * cast.input_saved + m8xb * (cast.input + 2.0) + m8wt * cast.expert_weight / M, 4);
      m8b += memory_bound(m8y * cast.output_grad + m8ys * cast.input + m8yt * 2.0, 4);
      if (cast.input_again > 0 || m8xt > 0) m8w += memory_bound(m8xa * cast.input_again + m8xt * 2.0, 4);
    }
    // the CP ring's blocks on the fallback kernel: flash attention's time x its measured slowdown
    const double attention_eff = hw_.attention_efficiency / (k.cp_fallback ? hw_.cp_fallback_slowdown : 1.0);
    const double af = k.attention_flops / (hw_.peak_tflops * 1e12 * attention_eff) + hw_.kernel_overhead_us * 1e-6;
    // LayerNorm x2 (read, write), residual adds x2 (two reads, a write), the MLP's activation, RoPE of q and k
    const double act = k.swiglu ? 3.0 : 2.0;
    const double ef = memory_bound(cb_ * (10.0 * Nt * C + act * N * k.ffn_local + k.rope_elems), 8);
    // an MoE layer: the experts' activation on their rows; the router's fp32 softmax / top-k over
    // Nt x E scores (read, write, the top-k's read and the k probabilities); the permutation: the
    // tokens gathered into expert-ordered rows (Nt C read, rows C written), the rows scattered back
    // (read, written) and the combine (rows read, Nt written); the probabilities applied to the
    // activations (read, written; backward: twice that)
    const double E = k.moe.local * k.moe.ep;
    const double mef = k.moe_layers > 0 ? memory_bound(cb_ * (10.0 * Nt * C + (act + 2.0) * rows * k.moe.ffn +
                                                              k.rope_elems + 3.0 * rows * C + 2.0 * Nt * C) +
                                                           4.0 * Nt * E * 3.0, 15)
                                        : 0.0;
    const double tpc = collective(N * C * cb_, k.tp, 1, 2.0);  // one all-reduce (or all-gather + reduce-scatter)
    // with sequence parallelism, what the all-gathers of FP8 codes (a byte per element) save against the
    // compute dtype's (ChunkWork::fp8_code_gathers, fp8_dout_code_gathers)
    const double code_gather = collective(N * C * cb_, k.tp, 1, 1.0) - collective(N * C * k.fp8_gather_bytes, k.tp, 1, 1.0);
    const double code_gathers = k.fp8_code_gathers() * code_gather;
    // the CP ring (CP peers are TP apart; parallel/context_parallel.cpp): CP - 1 steps passing a K/V
    // block, each started before the step's attention and waited for after it, so exposed only where
    // it takes longer than the step's block (af / CP: the chunk layout gives every step the same
    // causal work); backward each step's window (2.5 af / CP) carries the next K/V block (all but the
    // last step) and the last step's fp32 dK/dV (all but the first); the last dK/dV, to its owner,
    // after the last step
    const double kv_send = k.cp > 1 ? send(k.kv_block * cb_, k.tp * k.cp) : 0.0;
    const double dkv_send = k.cp > 1 ? send(k.kv_block * 4, k.tp * k.cp) : 0.0;
    const double cpf = k.cp > 1 ? (k.cp - 1) * std::max(0.0, kv_send - af / k.cp) : 0.0;
    double cpb = k.cp > 1 ? dkv_send : 0.0;
    for (int s = 0; s < k.cp && k.cp > 1; ++s)
      cpb += std::max(0.0, (s + 1 < k.cp ? kv_send : 0.0) + (s > 0 ? dkv_send : 0.0) - 2.5 * af / k.cp);
    // EP: per MoE layer the rows out (dispatch) and back (combine) forward, their gradients backward
    const double epc = all_to_all(rows * C * cb_, k.moe.ep, k.moe.etp);
    const double layer_f = gf + af + ef + k.row_parallel() * tpc + cpf;
    const double moe_f = k.moe_layers * (mgf + af + mef + k.moe_row_parallel() * tpc + cpf + 2 * epc);
    const double dense = k.dense_layers(), moe = k.moe_layers, f8 = k.fp8_layers, m8 = k.fp8_moe_layers;
    w.gemm_f += (dense - f8) * gf + (moe - m8) * mgf + f8 * f8f + m8 * m8f;
    w.gemm_b += (dense - f8) * gb + (moe - m8) * mgb + f8 * f8b + m8 * m8b;
    w.gemm_w += (dense - f8) * gw + (moe - m8) * mgw + f8 * f8w + m8 * m8w;
    w.attn_f += layers * af;
    w.attn_b += layers * 2.5 * af;
    w.elem_f += dense * ef + moe * mef;
    w.elem_b += dense * 2 * ef + moe * 2 * mef;
    w.tp_f += k.row_parallel_layers() * tpc - code_gathers;  // after each row-parallel layer
    w.tp_b += k.column_parallel_layers() * tpc - k.fp8_dout_code_gathers() * code_gather;  // each column-parallel layer's input gradient
    w.cp_f += layers * cpf;
    w.cp_b += layers * cpb;
    w.ep_f += moe * 2 * epc;
    w.ep_b += moe * 2 * epc;
    if (rc == Recompute::Full)
      w.recompute += dense * layer_f + f8 * (f8f - gf) + moe_f + m8 * (m8f - mgf) - code_gathers;
    if (rc == Recompute::Selective) w.recompute += layers * (af + cpf);
    if (rc == Recompute::Selective && c_.training.recompute_modules.moe_act)  // the experts' activations again
      w.recompute += moe * memory_bound(cb_ * act * rows * k.moe.ffn, 1);
    if (rc == Recompute::Selective && c_.training.recompute_modules.layernorm)  // the two norms again (read, write)
      w.recompute += layers * memory_bound(cb_ * 4.0 * Nt * C, 2);
    if (rc == Recompute::Selective && c_.training.recompute_modules.moe && k.moe_layers > 0) {
      // the moe module: each MoE layer's MLP forward again -- its GEMMs but attention's (the layer
      // spec's first two), the router's softmax / top-k, the permutation, the dispatch and combine
      double attn_f = 0;
      for (size_t i = 0; i < std::min<size_t>(2, k.moe.linears.size()); ++i)
        attn_f += gemm(N, k.moe.linears[i].out, k.moe.linears[i].in);
      const double mlp_share = mgf > 0 ? (mgf - attn_f) / mgf : 0.0;
      const double route = memory_bound(cb_ * (3.0 * rows * C + 2.0 * Nt * C + act * rows * k.moe.ffn) + 4.0 * Nt * E * 3.0, 6);
      w.recompute += mlp_share * ((moe - m8) * mgf + m8 * m8f) + moe * (route + 2 * epc);
    }
    if (rc == Recompute::Selective && c_.training.recompute_modules.mlp && k.linears.size() == 4) {
      // the mlp module (GPTStage::rerun_mlp): each dense layer's fc1 and activation again (zb-h1: in B and
      // again in W), ln2 first where an FP8 layer kept only its codes (the layernorm module's rerun is
      // priced above), fc1's input gathered again under sequence parallelism (an FP8 layer gathering
      // codes: fp8_gather_bytes an element); an FP8 layer's fc1 on FP8 operands after its input's cast,
      // and where it saves the activation's codes fc2's forward too, whose cast writes them
      const ChunkWork::Linear &fc1 = k.linears[2], &fc2 = k.linears[3];
      const double runs = c_.parallel.pipeline_schedule == PipelineSchedule::ZeroBubbleH1 ? 2.0 : 1.0;
      const double act_pass = memory_bound(cb_ * act * N * k.ffn_local, 1);
      const double gather16 = Nt < N ? collective(N * C * cb_, k.tp, 1, 1.0) : 0.0;
      const double bf16_rerun = gemm(N, fc1.out, fc1.in) + act_pass + gather16;
      double fp8_rerun = 0;
      if (f8 > 0) {
        fp8_rerun = gemm_fp8(N, fc1.out, fc1.in) + act_pass +
                    (fc1.fp8_gathered ? collective(N * C * k.fp8_gather_bytes, k.tp, 1, 1.0) : gather16) +
                    memory_bound((fc1.fp8_gathered ? Nt : N) * C * (fc1.fp8_saved ? cast.input_saved : cast.input), 1);
        if (fc1.fp8_saved && !c_.training.recompute_modules.layernorm) fp8_rerun += memory_bound(cb_ * 2.0 * Nt * C, 1);
        if (fc2.fp8_saved) fp8_rerun += gemm_fp8(N, fc2.out, fc2.in) + memory_bound(N * fc2.in * cast.input_saved, 1);
      }
      w.recompute += runs * ((dense - f8) * bf16_rerun + f8 * fp8_rerun);
    }
    const RecomputeModules& rm = c_.training.recompute_modules;
    if (rc == Recompute::Selective && rm.shared_experts && !rm.moe && k.moe_layers > 0 && k.moe.shared_fc1_width > 0) {
      // the shared_experts module (MoEMLP::shared_backward): each MoE layer's shared expert's fc1 and
      // activation again, its input gathered again under sequence parallelism (an FP8 layer gathering
      // codes as attn.qkv's input is gathered: fp8_gather_bytes an element), in an FP8 layer after its cast
      const double sf1 = k.moe.shared_fc1_width, act_pass = memory_bound(cb_ * act * N * k.moe.shared_ffn, 1);
      const double gather16 = Nt < N ? collective(N * C * cb_, k.tp, 1, 1.0) : 0.0;
      const bool codes = !k.moe.linears.empty() && k.moe.linears[0].fp8_gathered;
      const double bf16_rerun = gemm(N, sf1, C) + act_pass + gather16;
      const double fp8_rerun = m8 > 0 ? gemm_fp8(N, sf1, C) + act_pass +
                                            (codes ? collective(N * C * k.fp8_gather_bytes, k.tp, 1, 1.0) : gather16) +
                                            memory_bound((codes ? Nt : N) * C * cast.input, 1)
                                      : 0.0;
      w.recompute += (moe - m8) * bf16_rerun + m8 * fp8_rerun;
    }
    if (k.first) {  // embedding lookup (+ positions) and its vocabulary-parallel all-reduce
      w.elem_f += memory_bound(3 * N * C * cb_, 2);
      w.elem_b += memory_bound(N * C * 4 * 2, 2);
      w.tp_f += tpc;
    }
    if (k.last) {  // final norm, LM head, vocabulary-parallel cross-entropy
      const double V = k.vocab_rows;
      w.gemm_f += gemm(N, V, C);
      w.gemm_b += gemm(N, C, V);
      w.gemm_w += gemm(C, V, N);
      w.elem_f += memory_bound(2 * Nt * C * cb_ + N * V * (cb_ + 8), 4);
      w.elem_b += memory_bound(4 * Nt * C * cb_ + N * V * (4 + cb_), 3);
      w.tp_f += 3 * collective(N * 4, k.tp, 1, 2.0);
      w.tp_b += tpc;
    }
  }

  const Config& c_;
  const Hardware& hw_;
  int gpn_;
  double cb_;
};

}  // namespace

StepTime estimate_step_time(const Config& c, const Hardware& hw, int gpus_per_node, const std::vector<StageMemory>& stages,
                            ScheduleCache& cache) {
  if (c.training.fp8_format != Fp8Format::None && !(hw.fp8_peak_factor > 0))
    input_error("training.fp8_format: the " + hw.name + " has no FP8 tensor cores (--gpu " + hw.name +
                "); plan FP8 training on h100 or h200");
  const Model model(c, hw, gpus_per_node);
  const int tp = c.parallel.tensor_model_parallel_size, P = c.parallel.pipeline_model_parallel_size;
  const int dp = c.parallel.data_parallel_size, cp = c.parallel.context_parallel_size, world = tp * cp * P * dp;
  const int reps = dp * cp;  // the weights' replicas: the gradients' ring spans DP x CP, TP apart
  const int M = int(c.training.global_batch_size / (int64_t(c.training.micro_batch_size) * dp));
  TPT_CHECK(int(stages.size()) == P);
  const double cb = dtype_bytes(compute_dtype(c));
  std::vector<Work> work;
  std::vector<double> f, b, w;
  for (int s = 0; s < P; ++s) {
    work.push_back(model.stage_work(s));
    f.push_back(work.back().forward());
    b.push_back(work.back().input_grad());
    w.push_back(work.back().gemm_w);
  }
  StepTime t;
  GPTDims d0 = make_dims(c, tp, 0, P, 0);
  apply_context_parallel(d0, c, 0);
  t.p2p_per_message_s = P > 1 ? model.send(double(stage_message_elements(d0, c.training.micro_batch_size)) * cb, 2 * tp * reps) : 0;
  const PipelineTiming timing = cache.time(c, f, b, w, t.p2p_per_message_s);
  t.pipeline_s = timing.makespan;
  t.ideal_s = timing.ideal();
  t.bubble_s = t.pipeline_s - t.ideal_s;
  size_t busiest = 0;
  for (size_t s = 0; s < work.size(); ++s)
    if (f[s] + b[s] + w[s] > f[busiest] + b[busiest] + w[busiest]) busiest = s;
  const Work& wb = work[busiest];
  t.gemm_s = M * (wb.gemm_f + wb.gemm_b + wb.gemm_w);
  t.attention_s = M * (wb.attn_f + wb.attn_b);
  t.elementwise_s = M * (wb.elem_f + wb.elem_b);
  t.tp_comm_s = M * (wb.tp_f + wb.tp_b);
  t.cp_comm_s = M * (wb.cp_f + wb.cp_b);
  t.ep_comm_s = M * (wb.ep_f + wb.ep_b);
  t.recompute_s = M * wb.recompute;

  // DP: per stage after its last backward; stage s ends about s backwards before stage 0
  // MoE: the experts' span over their EDP group (EP x ETP apart in the rank order)
  const int edp = expert_data_parallel_size(c), ep = c.parallel.expert_model_parallel_size;
  const int etp = c.parallel.expert_tensor_parallel_size > 0 ? c.parallel.expert_tensor_parallel_size : tp;
  const bool distributed = c.parallel.distributed_optimizer && (reps > 1 || edp > 1);
  const double gb = bf16_grads(c) ? 2.0 : 4.0;  // the gradient buffer's bytes per element
  double tail = 0;
  for (int s = 0; s < P; ++s) {
    const double buffer = double(stages[size_t(s)].parameter_buffer);
    const double experts = double(stages[size_t(s)].expert_buffer), dense = buffer - experts;
    const double buckets = std::max(1.0, std::ceil(buffer / double(std::max<int64_t>(1, c.parallel.ddp_bucket_size))));
    double grads = model.collective(dense * gb, reps, tp, distributed ? 1.0 : 2.0);
    // FP8 parameters: their spans gathered as codes, a byte per element
    const double expert_codes = double(stages[size_t(s)].expert_code_buffer);
    const double codes = double(stages[size_t(s)].code_buffer) - expert_codes;
    double params = distributed ? model.collective((dense - codes) * cb + codes, reps, tp, 1.0) : 0.0;
    if (experts > 0) {
      grads += model.collective(experts * gb, edp, ep * etp, distributed ? 1.0 : 2.0);
      params += distributed ? model.collective((experts - expert_codes) * cb + expert_codes, edp, ep * etp, 1.0) : 0.0;
    }
    const double backward = b[size_t(s)] + w[size_t(s)], slack = s * backward;
    double exposed = c.parallel.overlap_grad_reduce ? std::max(grads - backward - slack, grads / buckets)
                                                    : std::max(0.0, grads - slack);
    // the parameters' all-gather: before the next forward, or bucket by bucket behind it
    exposed += c.parallel.overlap_param_gather ? std::max(params - (s + 1) * f[size_t(s)], params / buckets) : params;
    if (P > 1 && (s == 0 || s == P - 1)) {  // the tied word embedding's gradient over {first, last stage}
      const GPTDims d = make_dims(c, tp, 0, P, s);
      if (!d.untied) exposed += model.collective(double(d.Vl * d.C) * gb, 2, tp * reps * P, 2.0);
    }
    const double owned = !distributed ? buffer : experts > 0 ? dense / reps + experts / edp : buffer / reps;
    const double optimizer = model.memory_bound(owned * 50.0, 0);
    t.dp_comm_s = std::max(t.dp_comm_s, grads + params);
    t.optimizer_s = std::max(t.optimizer_s, optimizer);
    if (exposed + optimizer > tail) {
      tail = exposed + optimizer;
      t.dp_exposed_s = exposed;
    }
  }
  t.step_s = t.pipeline_s + tail;
  t.exposed_comm_s = t.tp_comm_s + t.cp_comm_s + t.dp_exposed_s + t.ep_comm_s;
  const double flops =
      iteration_model_flops(c, padded_vocab_size(c.model.vocab_size, c.model.make_vocab_size_divisible_by, tp));
  t.tokens_per_s = double(c.training.global_batch_size) * c.model.seq_length / t.step_s;
  t.model_tflops_per_gpu = flops / t.step_s / world / 1e12;
  t.mfu = t.model_tflops_per_gpu / hw.peak_tflops;
  return t;
}

}  // namespace tpt
