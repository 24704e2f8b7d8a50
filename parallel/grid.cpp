#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <vector>

#include "core/error.h"
#include "parallel/runtime.h"
#ifdef TPTRAIN_HAVE_MPI
#include "parallel/mpi_comm.h"
#endif

namespace tpt {

namespace {
bool g_mpi_started = false;
std::vector<std::string> g_hosts;  // host of every world rank (for the table)

std::string this_host() {
  char buf[256] = {0};
  gethostname(buf, sizeof(buf) - 1);
  return buf;
}
}  // namespace

void runtime_init(int* argc, char*** argv) {
#ifdef TPTRAIN_HAVE_MPI
  if (!g_mpi_started) {
    int provided = 0;
    MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided);
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    g_mpi_started = true;
  }
#else
  (void)argc;
  (void)argv;
#endif
}

void runtime_finalize() {
#ifdef TPTRAIN_HAVE_MPI
  if (g_mpi_started) {
    MPI_Finalize();
    g_mpi_started = false;
  }
#endif
}

int runtime_world_size() {
#ifdef TPTRAIN_HAVE_MPI
  int n = 1;
  if (g_mpi_started) MPI_Comm_size(MPI_COMM_WORLD, &n);
  return n;
#else
  return 1;
#endif
}

int runtime_world_rank() {
#ifdef TPTRAIN_HAVE_MPI
  int r = 0;
  if (g_mpi_started) MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
#else
  return 0;
#endif
}

void runtime_abort(int code) {
  std::fflush(stdout);
  std::fflush(stderr);
#ifdef TPTRAIN_HAVE_MPI
  if (g_mpi_started && runtime_world_size() > 1) MPI_Abort(MPI_COMM_WORLD, code);
#endif
  std::_Exit(code);
}

Grid make_grid(int tp, int pp, int dp) {
  Grid g;
  g.world_size = runtime_world_size();
  g.world_rank = runtime_world_rank();
  TPT_CHECK(tp * pp * dp == g.world_size);
  g.tp = tp;
  g.pp = pp;
  g.dp = dp;
  g.tp_rank = g.world_rank % tp;
  g.dp_rank = (g.world_rank / tp) % dp;
  g.pp_rank = g.world_rank / (tp * dp);
  g.host = this_host();
#ifdef TPTRAIN_HAVE_MPI
  if (g_mpi_started) {
    MPI_Comm world;
    MPI_Comm_dup(MPI_COMM_WORLD, &world);
    g.world = make_mpi_comm(world);
    auto split = [&](int color, int key) {
      MPI_Comm c;
      MPI_Comm_split(MPI_COMM_WORLD, color, key, &c);
      return make_mpi_comm(c);
    };
    g.tp_group = split(g.pp_rank * dp + g.dp_rank, g.tp_rank);
    g.dp_group = split(g.pp_rank * tp + g.tp_rank, g.dp_rank);
    g.pp_group = split(g.dp_rank * tp + g.tp_rank, g.pp_rank);
    g.mp_group = split(g.dp_rank, g.pp_rank * tp + g.tp_rank);
    if (pp > 1) {
      bool member = g.first_stage() || g.last_stage();
      MPI_Comm c;
      MPI_Comm_split(MPI_COMM_WORLD, member ? g.dp_rank * tp + g.tp_rank : MPI_UNDEFINED, g.pp_rank, &c);
      if (member) g.embedding_group = make_mpi_comm(c);
    }
    MPI_Comm local;
    MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, g.world_rank, MPI_INFO_NULL, &local);
    MPI_Comm_rank(local, &g.local_rank);
    MPI_Comm_size(local, &g.local_size);
    MPI_Comm_free(&local);
    // hosts of every rank, for the table
    char name[64] = {0};
    snprintf(name, sizeof(name), "%s", g.host.c_str());
    std::vector<char> all(size_t(64) * size_t(g.world_size));
    MPI_Allgather(name, 64, MPI_CHAR, all.data(), 64, MPI_CHAR, MPI_COMM_WORLD);
    g_hosts.clear();
    for (int r = 0; r < g.world_size; ++r) g_hosts.emplace_back(all.data() + size_t(r) * 64);
    return g;
  }
#endif
  g.world = make_self_comm();
  g.tp_group = make_self_comm();
  g.dp_group = make_self_comm();
  g.pp_group = make_self_comm();
  g.mp_group = make_self_comm();
  g_hosts = {g.host};
  return g;
}

std::string Grid::table() const {
  std::ostringstream os;
  os << "process grid: world " << world_size << " = TP " << tp << " x PP " << pp << " x DP " << dp
     << "  (rank = tp + TP*(dp + DP*pp))\n";
  os << "  rank  tp  pp  dp  host\n";
  for (int r = 0; r < world_size; ++r) {
    char line[160];
    snprintf(line, sizeof(line), "  %4d  %2d  %2d  %2d  %s\n", r, r % tp, r / (tp * dp), (r / tp) % dp,
             r < int(g_hosts.size()) ? g_hosts[size_t(r)].c_str() : "?");
    os << line;
  }
  return os.str();
}

}  // namespace tpt
