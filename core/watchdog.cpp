#include "core/watchdog.h"

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <thread>

namespace tpt {
namespace {

using clock = std::chrono::steady_clock;

std::atomic<double> g_timeout_s{0};
std::atomic<int64_t> g_since_ns{0};  // start of the current wait (steady clock), 0 when not waiting
std::mutex g_mutex;                   // guards the description of the current wait
std::string g_what;
int g_rank = 0;

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(clock::now().time_since_epoch()).count();
}

void watch() {
  for (;;) {
    std::this_thread::sleep_for(std::chrono::milliseconds(250));
    const int64_t since = g_since_ns.load();
    const double timeout = g_timeout_s.load();
    if (since == 0 || timeout <= 0) continue;
    const double waited = double(now_ns() - since) / 1e9;
    if (waited <= timeout) continue;
    std::string what;
    {
      std::lock_guard<std::mutex> lock(g_mutex);
      if (g_since_ns.load() != since) continue;  // that wait ended meanwhile
      what = g_what;
    }
    std::fprintf(stderr,
                 "tptrain: internal error: rank %d: no progress for %.0f s in %s "
                 "(parallel.distributed_timeout_minutes = %g); aborting the job\n",
                 g_rank, waited, what.c_str(), timeout / 60.0);
    std::fflush(stderr);
    std::fflush(stdout);
    std::_Exit(1);  // the launcher then ends every rank (a hung peer may never reach MPI_Abort's call)
  }
}

}  // namespace

void watchdog_start(double timeout_seconds, int world_rank) {
  static std::once_flag started;
  g_timeout_s = timeout_seconds;
  g_rank = world_rank;
  std::call_once(started, [] { std::thread(watch).detach(); });
}

CommWait::CommWait(const char* operation, const std::string& peers) {
  if (g_timeout_s.load() <= 0) return;
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    g_what = std::string(operation) + " (waiting for " + peers + ")";
  }
  g_since_ns = now_ns();
}

CommWait::~CommWait() { g_since_ns = 0; }

}  // namespace tpt
