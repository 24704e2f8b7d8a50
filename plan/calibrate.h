// tptrain plan --calibrate (docs/PLAN.md): a measured run's iteration times (its logging.metrics_file)
// against the step-time model (plan/step_time.h), and the factor on the model's compute efficiencies
// that makes them agree (apps/plan_cmd.cpp prints it).
#pragma once
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/config.h"
#include "plan/memory.h"
#include "plan/step_time.h"

namespace tpt {

// --calibrate: the logged iterations' elapsed_ms of a metrics file (InputError naming the file and line).
std::vector<double> read_iteration_times(const std::string& metrics_path);
struct Calibration {
  Plan plan;                         // the estimate for the config as it is
  int iterations = 0;                // measured iterations used (the first logged one is left out when there are more)
  double measured_s = 0;             // their median
  double compute_scale = 1;          // the factor on the GEMM and attention efficiencies that makes them agree
  bool compute_scale_found = false;  // false: no efficiency in (0, 1] does (the rest of the step alone is off)
  Hardware calibrated;               // the hardware with that factor
};
Calibration calibrate(const Config& cfg, const PlanOptions& options, const std::vector<double>& iteration_ms);
nlohmann::json calibration_json(const Calibration& c);

}  // namespace tpt
