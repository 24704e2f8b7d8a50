// The training loop: ties the grid, the model stage, the optimizer and the data together, and
// writes the contract's log line and metrics.
#pragma once
#include <cstdint>
#include <cstdio>
#include <memory>
#include <optional>
#include <vector>

#include "core/config.h"
#include "core/ops.h"
#include "data/dataset.h"
#include "model/gpt.h"
#include "apps/trace.h"
#include "model/optimizer.h"
#include "parallel/grid.h"
#include "parallel/schedule.h"

namespace tpt {

class Trainer {
 public:
  Trainer(const Config& cfg, Grid& grid);
  ~Trainer();
  // Runs train_iters iterations (from the current one); returns the exit status.
  int train();
  // Writes logging.trace_file (collective: every rank must call it).
  void write_trace();

  struct StepResult {
    double lm_loss = 0;    // mean over the global batch
    double grad_norm = 0;  // before clipping
  };
  // One iteration k (1-based) over its global batch: forward/backward of every micro-batch,
  // gradient reduction, clipping and the AdamW update.
  StepResult train_step(int64_t k);
  // Mean loss over eval_iters global batches of the validation data (no update).
  double evaluate();

 private:
  // Loads micro-batch m of global positions starting at `base` for this DP rank: tokens (B, S)
  // and targets (B, S) into the host buffers.
  void load_microbatch(const GPTDataset& ds, int64_t base, int m);
  double forward_backward(int64_t base, const GPTDataset& ds, bool want_grad);
  void reduce_gradients();
  void log_iteration(int64_t k, const StepResult& r, double lr, double elapsed_ms, int64_t n_iters,
                     std::optional<double> val_loss);

  const Config& cfg_;
  Grid& grid_;
  std::unique_ptr<Ops> ops_;
  GPTDims dims_;
  ParamLayout layout_;
  float* params_ = nullptr;
  float* grads_ = nullptr;
  std::unique_ptr<GPTStage> stage_;
  std::unique_ptr<AdamW> adamw_;
  std::shared_ptr<const TokenCorpus> corpus_, valid_corpus_;
  std::unique_ptr<GPTDataset> train_data_, valid_data_;
  std::vector<int32_t> tokens_, targets_;  // host (B, S)
  int32_t *dev_tokens_ = nullptr, *dev_targets_ = nullptr;
  int num_micro_ = 1;
  std::vector<Action> train_schedule_, eval_schedule_;
  std::vector<float*> act_in_, grad_in_;  // per activation slot: received activations / gradients
  FILE* metrics_ = nullptr;
  std::unique_ptr<TraceRecorder> trace_;
  int64_t iteration_ = 0;
};

}  // namespace tpt
