#include "train/trace.h"

#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>

#include <spdlog/spdlog.h>

#include "train/aux_output.h"

namespace tpt {

TraceRecorder::TraceRecorder(std::string path, int rank, int tp_rank, int pp_rank, int dp_rank)
    : path_(std::move(path)), rank_(rank), tp_rank_(tp_rank), pp_rank_(pp_rank), dp_rank_(dp_rank) {}

void TraceRecorder::record(int64_t iteration, const Action& a, double t0, double t1) {
  if (!enabled() || events_.size() >= kMaxEvents) return;
  events_.push_back({iteration, a, t0, t1, "", ""});
}

void TraceRecorder::record_span(int64_t iteration, const std::string& name, const std::string& cat, double t0,
                                double t1) {
  if (!enabled() || events_.size() >= kMaxEvents) return;
  events_.push_back({iteration, Action{}, t0, t1, name, cat});
}

void TraceRecorder::write_part() const {
  if (!enabled()) return;
  nlohmann::json ev = nlohmann::json::array();
  char label[64];
  snprintf(label, sizeof(label), "rank %d (tp %d, pp %d, dp %d)", rank_, tp_rank_, pp_rank_, dp_rank_);
  ev.push_back({{"name", "process_name"}, {"ph", "M"}, {"pid", rank_}, {"args", {{"name", label}}}});
  ev.push_back({{"name", "process_sort_index"}, {"ph", "M"}, {"pid", rank_}, {"args", {{"sort_index", rank_}}}});
  ev.push_back({{"name", "thread_name"}, {"ph", "M"}, {"pid", rank_}, {"tid", 0}, {"args", {{"name", "schedule"}}}});
  ev.push_back({{"name", "thread_name"}, {"ph", "M"}, {"pid", rank_}, {"tid", 1}, {"args", {{"name", "ops"}}}});
  for (const Event& e : events_) {
    std::string cat = !e.cat.empty()                               ? e.cat
                      : e.action.kind == Action::Kind::Forward    ? "forward"
                      : e.action.kind == Action::Kind::Backward ? "backward"
                      : e.action.kind == Action::Kind::BackwardWeight ? "weight"  // zb-h1's W
                                                                : "comm";
    ev.push_back({{"name", e.cat.empty() ? e.action.str() : e.name},
                  {"cat", cat},
                  {"ph", "X"},
                  {"pid", rank_},
                  {"tid", cat == "op" ? 1 : 0},  // the op profile's spans on a track of their own
                  {"ts", e.t0},
                  {"dur", e.t1 - e.t0},
                  {"args", {{"iteration", e.iteration}, {"stage", pp_rank_}}}});
  }
  write_aux_file(path_ + ".rank" + std::to_string(rank_), ev.dump() + "\n", "logging.trace_file");
}

bool TraceRecorder::merge(const std::string& path, int world_size) {
  nlohmann::json all = nlohmann::json::array();
  std::string missing;  // the first part that is missing or unreadable (its rank's write failed)
  for (int r = 0; r < world_size; ++r) {
    const std::string part = path + ".rank" + std::to_string(r);
    if (missing.empty()) {
      std::ifstream f(part);
      nlohmann::json ev = nlohmann::json::parse(f, nullptr, /*allow_exceptions=*/false);
      if (!f.is_open() || !ev.is_array()) missing = part;
      else for (auto& e : ev) all.push_back(std::move(e));
    }
    std::remove(part.c_str());
  }
  if (!missing.empty()) {
    spdlog::warn("logging.trace_file: the part '{}' is missing (its rank could not write it); '{}' is not written",
                 missing, path);
    return false;
  }
  return write_aux_file(path, nlohmann::json{{"traceEvents", all}, {"displayTimeUnit", "ms"}}.dump() + "\n",
                 "logging.trace_file");
}

}  // namespace tpt
