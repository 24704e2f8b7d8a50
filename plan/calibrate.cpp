// tptrain plan --calibrate (see plan/calibrate.h): a measured run's iteration time against the
// step-time model, and the factor on the model's compute efficiencies that makes them agree.
#include <algorithm>
#include <cmath>
#include <fstream>

#include "core/error.h"
#include "plan/calibrate.h"
#include "plan/search.h"  // step_time_json, hardware_json

namespace tpt {

std::vector<double> read_iteration_times(const std::string& path) {
  std::ifstream in(path);
  if (!in) input_error("--calibrate: cannot open " + path);
  std::vector<double> ms;
  std::string line;
  for (int n = 1; std::getline(in, line); ++n) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(line);
    } catch (const nlohmann::json::exception& e) {
      input_error("--calibrate: " + path + " line " + std::to_string(n) + " is not JSON (" + e.what() + ")");
    }
    if (!j.is_object() || !j.contains("elapsed_ms")) continue;  // not an iteration record
    if (!j["elapsed_ms"].is_number() || !(j["elapsed_ms"].get<double>() > 0))
      input_error("--calibrate: " + path + " line " + std::to_string(n) + ": elapsed_ms is not a positive number");
    ms.push_back(j["elapsed_ms"].get<double>());
  }
  if (ms.empty()) input_error("--calibrate: " + path + " has no iteration with elapsed_ms (a logging.metrics_file of a run)");
  return ms;
}

Calibration calibrate(const Config& cfg, const PlanOptions& options, const std::vector<double>& iteration_ms) {
  Calibration cal;
  cal.plan = make_plan(cfg, options);
  // the first logged iteration carries start-up (allocation, autotuning): left out when there are more
  std::vector<double> ms(iteration_ms.begin() + (iteration_ms.size() > 1 ? 1 : 0), iteration_ms.end());
  std::sort(ms.begin(), ms.end());
  cal.iterations = int(ms.size());
  cal.measured_s = (ms.size() % 2 ? ms[ms.size() / 2] : (ms[ms.size() / 2 - 1] + ms[ms.size() / 2]) / 2) / 1e3;
  // the estimate falls as the GEMM and attention efficiencies rise: bisect the factor k on both
  Config c = cfg;
  resolve_parallel(c, cal.plan.world_size);
  ScheduleCache cache;
  auto estimate = [&](double k) {
    Hardware h = options.hw;
    h.gemm_efficiency *= k;
    h.attention_efficiency *= k;
    return estimate_step_time(c, h, options.gpus_per_node, cal.plan.stages, cache).step_s;
  };
  const double k_max = 1.0 / std::max(options.hw.gemm_efficiency, options.hw.attention_efficiency);
  double lo = 1e-4, hi = k_max;
  cal.compute_scale_found = estimate(hi) <= cal.measured_s && estimate(lo) >= cal.measured_s;
  if (cal.compute_scale_found) {
    for (int i = 0; i < 100; ++i) {
      const double mid = std::sqrt(lo * hi);
      (estimate(mid) > cal.measured_s ? lo : hi) = mid;
    }
    cal.compute_scale = std::sqrt(lo * hi);
  }
  cal.calibrated = options.hw;
  cal.calibrated.gemm_efficiency *= cal.compute_scale;
  cal.calibrated.attention_efficiency *= cal.compute_scale;
  return cal;
}

nlohmann::json calibration_json(const Calibration& c) {
  const StepTime& t = c.plan.time;
  return {{"iterations", c.iterations},
          {"measured_step_time_s", c.measured_s},
          {"estimated_step_time_s", t.step_s},
          {"measured_over_estimated", c.measured_s / t.step_s},
          {"estimate", step_time_json(t)},
          {"compute_scale_found", c.compute_scale_found},
          {"compute_scale", c.compute_scale},
          {"calibrated", hardware_json(c.calibrated, c.plan.options.gpus_per_node)}};
}

}  // namespace tpt
