// tptrain [train] --config FILE [--set section.key=value]...: training on the MPI ranks.
// Start-up order matters for "no hang on bad input": every rank loads and validates the config
// and the grid identically before any collective, so a bad input fails the same way everywhere
// (rank 0 reports it). After that, a failure on one rank aborts the whole job.
#include <spdlog/spdlog.h>
#include <sys/resource.h>

#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "apps/cli.h"
#include "apps/commands.h"
#include "core/config.h"
#include "core/error.h"
#include "core/watchdog.h"
#include "parallel/runtime.h"
#include "plan/memory.h"
#include "train/trainer.h"

namespace tpt {

namespace {

struct TrainArgs {
  std::string config_path;
  std::vector<std::string> overrides;
};

// Features whose keys exist in the contract but whose implementation lands in a later issue.
void reject_unimplemented(const Config& c) {
  auto no = [](const std::string& key, const std::string& what) {
    input_error(key + ": " + what + " is not implemented in this version of tptrain");
  };
#ifndef TPTRAIN_HAVE_CUDA  // built with the CUDA toolkit, device: cuda is checked against the GPUs later
  if (c.training.device == Device::Cuda)
    input_error("training.device: cuda, but this tptrain was built without the CUDA backend (no CUDA toolkit at "
                "build time; see README \"GPU\")");
#endif
  if (c.model.hidden_dropout > 0 || c.model.attention_dropout > 0) no("model.hidden_dropout/attention_dropout", "dropout");
}

// Peak resident memory of the ranks (getrusage), max and sum over the job.
void report_peak_memory(Grid& grid) {
  struct rusage ru {};
  getrusage(RUSAGE_SELF, &ru);
  double mib[2] = {double(ru.ru_maxrss) / 1024.0, 0.0};
  mib[1] = mib[0];
  double max = mib[0];
  grid.world->all_reduce(&max, 1, ReduceOp::Max);
  grid.world->all_reduce(&mib[1], 1, ReduceOp::Sum);
  if (grid.world_rank == 0)
    spdlog::info("peak memory (RSS): max {:.1f} MiB per rank, {:.1f} MiB over {} ranks", max, mib[1], grid.world_size);
}

int train(const TrainArgs& args, int* argc, char*** argv) {
  runtime_init(argc, argv);
  const int world = runtime_world_size(), rank = runtime_world_rank();
  spdlog::set_pattern("%v");
  if (rank != 0) spdlog::set_level(spdlog::level::warn);

  // Phase 1: identical on every rank, no communication. Errors: reported by rank 0, exit 2.
  Config cfg;
  try {
    if (args.config_path == "-") {
      // --config -: mpirun forwards standard input to rank 0 only; rank 0 reads it and every rank
      // parses the same text (the one collective before phase 2; a read error travels with it)
      std::string text;
      if (rank == 0) {
        try {
          text = "T" + read_config_stdin();
        } catch (const InputError& e) {
          text = std::string("E") + e.what();
        }
      }
      text = runtime_broadcast_string(text);
      if (text.empty() || text[0] != 'T') input_error(text.empty() ? "-: no config text" : text.substr(1));
      cfg = parse_config(text.substr(1), "-", args.overrides);
    } else {
      cfg = load_config(args.config_path, args.overrides);
    }
    resolve_parallel(cfg, world);
    reject_unimplemented(cfg);
    check_plannable(cfg);  // before anything is sized in 64 bits or allocated
  } catch (const InputError& e) {
    if (rank == 0) std::fprintf(stderr, "tptrain: error: %s\n", e.what());
    runtime_finalize();
    return 2;
  }

  watchdog_start(cfg.parallel.distributed_timeout_minutes * 60.0, rank);  // a hung peer ends the job

  // Phase 2: any failure on any rank ends the job. The grid and the trainer outlive the try block:
  // on a failure the job is aborted (or, alone, the process ends) without destroying them, since
  // their destructors may wait on GPU work or on collectives that a dead peer will never finish.
  int status = 0;
  std::unique_ptr<Grid> grid;
  std::unique_ptr<Trainer> trainer;
  auto fail = [&](int code, const char* what, const char* kind) {
    std::fprintf(stderr, "tptrain: %s: rank %d: %s\n", kind, rank, what);
    if (world > 1) runtime_abort(code);  // never returns
    (void)trainer.release();             // alone: no peer to wait for, but no GPU teardown either
    (void)grid.release();
    runtime_finalize();
    return code;
  };
  try {
    const ParallelConfig& p = cfg.parallel;
    grid = std::make_unique<Grid>(make_grid(GridShape{p.tensor_model_parallel_size, p.context_parallel_size,
                                                      p.pipeline_model_parallel_size, p.data_parallel_size,
                                                      p.expert_model_parallel_size, p.expert_tensor_parallel_size}));
    if (rank == 0) {
      spdlog::info("tptrain {} | config {}", TPTRAIN_VERSION, args.config_path);
      spdlog::info("resolved config:\n{}", config_to_yaml(cfg));
      spdlog::info("{}", grid->table());
    }
    trainer = std::make_unique<Trainer>(cfg, *grid);
    status = trainer->train();
    trainer->write_trace();
    report_peak_memory(*grid);
  } catch (const InputError& e) {
    return fail(2, e.what(), "error");
  } catch (const std::exception& e) {
    return fail(1, e.what(), "internal error");
  }
  trainer.reset();
  grid.reset();
  runtime_finalize();
  return status;
}

}  // namespace

Command add_train_command(CLI::App& app, int* argc, char*** argv) {
  CLI::App* cmd = app.add_subcommand("train", "train a GPT (the default command: tptrain --config FILE ...)");
  auto args = std::make_shared<TrainArgs>();
  add_config_options(*cmd, args->config_path, args->overrides);
  return [args, argc, argv] { return train(*args, argc, argv); };
}

}  // namespace tpt
