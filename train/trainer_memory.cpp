// The Trainer's memory checks (docs/PLAN.md): the plan against what the rank has before any
// allocation, the backend's own buffers reserved as the plan counts them, and the allocator calls
// counted after the first iteration.
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>
#include <string>

#include "core/error.h"
#include "plan/memory.h"
#include "train/trainer.h"
#ifdef TPTRAIN_HAVE_CUDA
#include "core/cuda/cuda_ops.h"  // cuda_free_memory
#endif

namespace tpt {

// The plan's bytes for this rank's stage against the memory it may use: on a GPU the device's free
// memory, on the CPU the host's physical memory shared by its ranks. Exit 2 with the plan's numbers
// when it cannot fit (allocation would fail later, or the OOM killer would end the job).
void Trainer::check_memory(const Config& cfg, const Grid& grid) const {
  const StageMemory plan = stage_memory(cfg, grid.pp_rank, on_gpu_);
  int64_t have = -1;
  std::string where;
#ifdef TPTRAIN_HAVE_CUDA
  if (on_gpu_) {
    have = cuda_free_memory();
    where = "free on GPU " + std::to_string(grid.cuda_device);
  }
#endif
  if (where.empty()) {
    const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    if (pages > 0 && page > 0) have = int64_t(pages) * page / std::max(1, grid.local_size);
    where = "of host memory per rank (" + std::to_string(grid.local_size) + " ranks on this host)";
  }
  if (have >= 0 && plan.total_bytes() > have)
    input_error("this rank's stage needs " + describe_memory(plan) + " by the plan, but has " +
                std::to_string(have / 1048576) + " MiB " + where +
                ": lower training.micro_batch_size, set training.recompute, or use more TP / PP "
                "(tptrain plan --config ... lists what would fit)");
}

// The backend's own buffers as the plan counts them (the GPU's; the CPU backend keeps none), and
// cuDNN's attention plans for this run's shape built now: iterations then allocate nothing.
void Trainer::reserve_backend_workspace() {
  const StageMemory plan = stage_memory(cfg_, grid_.pp_rank, on_gpu_);
  workspace_ = ops_->reserve_workspace(plan.backend, attention_shape(dims_, cfg_.training.micro_batch_size, dtype_));
  allocator_calls_reserved_ = ops_->allocator_calls();
  if (on_gpu_ && plan.backend.attention > 0 &&
      std::max(workspace_.attention_forward_asked, workspace_.attention_backward_asked) > plan.backend.attention)
    spdlog::warn("WARNING: rank {}: cuDNN's attention plans ask for {:.1f} MiB of workspace (forward {:.1f}, "
                 "backward {:.1f} MiB), more than the plan's {:.1f} MiB",
                 grid_.world_rank, double(workspace_.attention) / 1048576.0,
                 double(workspace_.attention_forward_asked) / 1048576.0,
                 double(workspace_.attention_backward_asked) / 1048576.0, double(plan.backend.attention) / 1048576.0);
}

void Trainer::report_allocator_calls(int64_t first_iteration) {
  double later = double(allocator_calls_later_);
  if (grid_.world_size > 1) grid_.world->all_reduce(&later, 1, ReduceOp::Max);
  // the MoE layers' pool of kept rows: the most any rank's held at once, over what it planned
  double fullest = 0;
  for (const auto& stage : stages_)
    if (const MoERowPool* p = stage->moe() ? stage->moe()->pool() : nullptr; p && p->planned() > 0)
      fullest = std::max(fullest, double(p->peak()) / double(p->planned()));
  if (grid_.world_size > 1) grid_.world->all_reduce(&fullest, 1, ReduceOp::Max);
  if (grid_.world_rank == 0 && fullest > 0)
    spdlog::info("memory: the MoE layers' pool of kept rows peaked at {:.1f}% of its planned bytes on the fullest rank "
                 "(model.moe_kept_rows_factor {} x the balanced load)", 100 * fullest, cfg_.model.moe_kept_rows_factor);
  // the MoE layers' routing on the host, per iteration run, on the busiest rank: time the device waits for
  double routing_ms = 0;
  bool moe = false;
  for (const auto& stage : stages_)
    if (stage->moe()) routing_ms += stage->moe()->host_routing_ms(), moe = true;
  if (grid_.world_size > 1) grid_.world->all_reduce(&routing_ms, 1, ReduceOp::Max);
  const int64_t run = iteration_ - first_iteration + 1;  // the iterations this run trained
  if (grid_.world_rank == 0 && moe && run > 0)
    spdlog::info("moe: routing on the host took {:.2f} ms per iteration on the busiest rank (route, send order, the "
                 "routing's backward; evaluation's forwards included): the device waits for it",
                 routing_ms / double(run));
  if (grid_.world_rank != 0 || iteration_ <= first_iteration) return;
  if (later == 0)
    spdlog::info("memory: no device allocation or free in iterations {}..{} (after the first); on rank 0 {} "
                 "allocator calls at start-up, {} in the first iteration",
                 first_iteration + 1, iteration_, allocator_calls_reserved_, allocator_calls_first_);
  else
    spdlog::warn("WARNING: memory: iterations after the first called the device allocator ({} times on the "
                 "busiest rank): a buffer the start-up did not size",
                 int64_t(later));
}

}  // namespace tpt
