// The real Trainer on a small random-token dataset, for a few iterations: on one rank (make_grid:
// the one-process path of `tptrain`) or on threads of this process as the ranks of a TP x PP x DP
// grid (parallel/thread_comm.h), on the CPU or on one GPU. Shared by the unit tests (CPU) and the
// GPU tests (the one-GPU 3D test).
#pragma once
#include <spdlog/spdlog.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <mutex>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "core/config.h"
#include "data/indexed_writer.h"
#include "parallel/runtime.h"
#include "parallel/thread_comm.h"
#include "train/trainer.h"
#ifdef TPTRAIN_HAVE_CUDA
#include "core/cuda/cuda_ops.h"
#include "core/cuda/cuda_util.h"
#endif

namespace tpt::test {

// A Megatron dataset of 120 documents of 10..89 random tokens in [0, vocab - 1), each ended by the
// end-of-document token vocab - 1; returns its prefix.
inline std::string write_random_dataset(const std::string& dir, int vocab) {
  std::filesystem::create_directories(dir);
  const std::string prefix = dir + "/random_text_document";
  IndexedDatasetWriter w(prefix, vocab <= 65535 ? 8 : 4);
  std::mt19937 gen(7);
  std::uniform_int_distribution<int32_t> tok(0, vocab - 2), len(10, 89);
  for (int d = 0; d < 120; ++d) {
    std::vector<int32_t> doc(size_t(len(gen)));
    for (auto& t : doc) t = tok(gen);
    doc.back() = vocab - 1;
    w.add_document(doc);
  }
  w.finish();
  return prefix;
}

// The tiny GPT (2 layers of hidden 48, 4 heads, seq 32, vocab 101) on `data` for a TP x PP x DP
// layout: 4 micro-batches of 2 per DP rank and iteration, no evaluation, no files written.
inline Config thread_test_config(const std::string& dir, const std::string& data, const std::string& precision,
                                 int tp, int pp, int dp, const std::string& device) {
  const std::string path = dir + "/config_" + precision + "_" + std::to_string(tp) + std::to_string(pp) +
                           std::to_string(dp) + ".yaml";
  std::ofstream(path) << "model: {num_layers: 2, hidden_size: 48, num_attention_heads: 4, seq_length: 32, "
                         "vocab_size: 101, make_vocab_size_divisible_by: 8}\n"
                      << "parallel: {tensor_model_parallel_size: " << tp << ", pipeline_model_parallel_size: " << pp
                      << ", overlap_grad_reduce: true, ddp_bucket_size: 3000}\n"
                      << "training: {micro_batch_size: 2, global_batch_size: " << 8 * dp
                      << ", train_iters: 4, precision: " << precision << ", device: " << device
                      << ", cpu_threads: 1, seed: 1234}\n"
                      << "optimizer: {lr: 3.0e-3, lr_warmup_iters: 1}\n"
                      << "data: {path: " << data << ", split: [1, 0, 0], eval_iters: 0}\n";
  Config cfg = load_config(path);
  resolve_parallel(cfg, tp * pp * dp);
  return cfg;
}

#ifdef TPTRAIN_HAVE_CUDA
// n floats of device memory to the host, after the work queued on this thread's compute stream.
inline void cuda_read_on_compute_stream(float* host, const float* dev, int64_t n) {
  const cudaStream_t s = cuda::compute_stream();
  TPT_CUDA_CHECK(cudaMemcpyAsync(host, dev, size_t(n) * sizeof(float), cudaMemcpyDefault, s));
  cuda::stream_wait(s);
}
#endif

// The bucket-race checker: wraps a DP group of two ranks. At each start_all_reduce /
// start_reduce_scatter it snapshots the bucket (as the collective must see it); after wait_all it
// reads the result again, which must equal the two ranks' snapshots summed (this rank's block of
// it for a reduce-scatter; exact: two floats add commutatively) -- a bucket written inside its
// reduction window (backward still writing a started bucket) breaks that. `read` copies n floats
// of a bucket to the host (after the work queued before it); `peers` is a host group of the same
// two ranks for the snapshots.
class BucketRaceChecker final : public Comm {
 public:
  using Reader = std::function<void(float* host, const float* bucket, int64_t n)>;
  BucketRaceChecker(Comm& inner, Comm& peers, Reader read) : in_(inner), peers_(peers), read_(std::move(read)) {}
  int rank() const override { return in_.rank(); }
  int size() const override { return in_.size(); }
  void exchange(const std::vector<Message>& m) override { in_.exchange(m); }
  void barrier() override { in_.barrier(); }
  void do_all_reduce(void* b, int64_t n, DType t, ReduceOp op) override { in_.all_reduce(b, n, t, op); }
  void do_all_gather(void* o, const void* i, int64_t n, DType t) override { in_.all_gather(o, i, n, t); }
  void do_reduce_scatter(void* o, const void* i, int64_t n, DType t) override { in_.reduce_scatter(o, i, n, t); }
  void do_broadcast(void* b, int64_t n, DType t, int root) override { in_.broadcast(b, n, t, root); }
  void do_all_to_all_v(const void* s, const std::vector<int64_t>& sc, void* r, const std::vector<int64_t>& rc,
                       DType t) override {
    in_.all_to_all_v(s, sc, r, rc, t);
  }
  int64_t do_start_all_reduce(void* b, int64_t n, DType t) override {
    TPT_CHECK(t == DType::F32);  // the trainer's gradient buckets
    snapshot(static_cast<float*>(b), static_cast<const float*>(b), n, -1);
    return in_.start_all_reduce(b, n, t);
  }
  int64_t do_start_reduce_scatter(void* o, const void* i, int64_t n, DType t) override {
    TPT_CHECK(t == DType::F32);
    snapshot(static_cast<float*>(o), static_cast<const float*>(i), size() * n, int64_t(rank()) * n);
    return in_.start_reduce_scatter(o, i, n, t);
  }
  int64_t do_start_all_gather(void* o, const void* i, int64_t n, DType t) override {
    return in_.start_all_gather(o, i, n, t);
  }
  void wait(int64_t ticket) override { in_.wait(ticket); }
  void wait_all() override {
    in_.wait_all();
    for (Started& s : started_) {
      const int64_t n = int64_t(s.want.size());
      peers_.all_reduce(s.want.data(), n, ReduceOp::Sum);
      const int64_t m = s.block < 0 ? n : n / size();
      std::vector<float> got(static_cast<size_t>(m), 0.0f);
      read_(got.data(), s.out, m);
      ++buckets;
      for (int64_t i = 0; i < m; ++i)
        if (got[size_t(i)] != s.want[size_t(s.block < 0 ? i : s.block + i)]) {
          ++raced;
          break;
        }
    }
    started_.clear();
  }
  int buckets = 0, raced = 0;  // buckets checked, and those whose sum differed from their snapshots'

 private:
  struct Started {
    float* out;
    std::vector<float> want;
    int64_t block;  // -1: all-reduce (the whole bucket); else the offset of this rank's block
  };
  void snapshot(float* out, const float* in, int64_t n, int64_t block) {
    std::vector<float> snap(static_cast<size_t>(n));
    read_(snap.data(), in, n);
    started_.push_back({out, std::move(snap), block});
  }
  Comm& in_;
  Comm& peers_;
  Reader read_;
  std::vector<Started> started_;
};

// Each iteration's loss and gradient norm as one rank saw them, and the rank's device allocator
// calls so far after it (Trainer::allocator_calls).
struct StepLog {
  std::vector<double> loss, grad_norm;
  std::vector<int64_t> allocator_calls;
};

inline StepLog train_steps(Trainer& t, int64_t iters) {
  StepLog log;
  for (int64_t k = 1; k <= iters; ++k) {
    const Trainer::StepResult r = t.train_step(k);
    log.loss.push_back(r.lm_loss);
    log.grad_norm.push_back(r.grad_norm);
    log.allocator_calls.push_back(t.allocator_calls());
  }
  return log;
}

// One rank, as `tptrain --config` without mpirun (training.device decides the backend).
inline StepLog train_one_rank(const Config& cfg) {
  spdlog::set_level(spdlog::level::warn);
  Grid grid = make_grid(1, 1, 1);
  Trainer t(cfg, grid);
  return train_steps(t, cfg.training.train_iters);
}

// Threads as the ranks of cfg's layout; every rank's log (world rank order). cuda_device >= 0: every
// rank trains on that GPU with its own stream and device groups.
// With `race`, every rank's DP group is wrapped in a BucketRaceChecker (DP must be 2) and its counts
// are added to race[0] (buckets) and race[1] (raced).
inline std::vector<StepLog> train_thread_ranks(const Config& cfg, int cuda_device = -1, int* race = nullptr) {
  spdlog::set_level(spdlog::level::warn);
  const ParallelConfig& p = cfg.parallel;  // the grid as apps/train.cpp makes it, expert grid included
  const GridShape shape{p.tensor_model_parallel_size, p.context_parallel_size, p.pipeline_model_parallel_size,
                        p.data_parallel_size,        p.expert_model_parallel_size, p.expert_tensor_parallel_size};
  std::vector<StepLog> logs(size_t(shape.world()));
  std::mutex mutex;
  std::vector<std::unique_ptr<Comm>> keep;  // the wrapped device groups (outlive their checkers)
  run_thread_ranks(shape, cuda_device >= 0, [&](Grid& grid) {
    if (cuda_device >= 0) {
      grid.cuda_device = cuda_device;
#ifdef TPTRAIN_HAVE_CUDA
      cuda_set_device(cuda_device);
#endif
    }
    BucketRaceChecker* checker = nullptr;
    if (race) {
      BucketRaceChecker::Reader read = [](float* h, const float* b, int64_t n) { std::copy_n(b, n, h); };
#ifdef TPTRAIN_HAVE_CUDA
      if (cuda_device >= 0) read = [](float* h, const float* b, int64_t n) { cuda_read_on_compute_stream(h, b, n); };
#endif
      std::unique_ptr<Comm> inner = std::move(grid.dp_device);
      Comm& dp = inner ? *inner : *grid.dp_group;
      auto c = std::make_unique<BucketRaceChecker>(dp, *grid.dp_group, read);
      checker = c.get();
      grid.dp_device = std::move(c);
      std::lock_guard<std::mutex> lock(mutex);
      keep.push_back(std::move(inner));
    }
    {
      Trainer t(cfg, grid);
      logs[size_t(grid.world_rank)] = train_steps(t, cfg.training.train_iters);
    }
    if (checker) {
      std::lock_guard<std::mutex> lock(mutex);
      race[0] += checker->buckets;
      race[1] += checker->raced;
    }
  });
  return logs;
}

}  // namespace tpt::test
