#include <unistd.h>

#include <algorithm>  // std::min
#include <cstdio>
#include <cstdlib>
#include <cstring>  // std::memcpy of GPU UUIDs
#include <sstream>
#include <vector>

#include "core/error.h"
#include "parallel/runtime.h"
#ifdef TPTRAIN_HAVE_MPI
#include "parallel/mpi_comm.h"
#endif
#ifdef TPTRAIN_HAVE_CUDA  // device selection, device-side communicators
#include "core/cuda/cuda_ops.h"
#include "parallel/nccl_comm.h"
#endif

namespace tpt {

namespace {
[[maybe_unused]] bool g_mpi_started = false;  // unused without MPI (gpu_check.sh --prepare)
std::vector<std::string> g_hosts;  // host of every world rank (for the table)

std::string this_host() {
  char buf[256] = {0};
  gethostname(buf, sizeof(buf) - 1);
  return buf;
}

#ifdef TPTRAIN_HAVE_MPI
// Whether an MPI launcher started this process: a variable that mpirun / mpiexec (OpenMPI, MPICH,
// Intel MPI, MVAPICH), SLURM's srun, Cray's aprun / PALS or LSF's jsrun put in every rank's
// environment, or TPTRAIN_MPI_INIT (any other launcher). A process started on its own is the only
// rank and does not start MPI: OpenMPI's singleton start-up spawns its daemon (orted), ~0.4 s of
// every single-process run on a 2-core machine.
bool launched_by_mpi() {
  for (const char* v : {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_RANK", "PMI_SIZE", "PMI_FD", "MPI_LOCALNRANKS",
                        "MV2_COMM_WORLD_RANK", "SLURM_PROCID", "ALPS_APP_PE", "PALS_RANKID", "JSM_NAMESPACE_RANK",
                        "TPTRAIN_MPI_INIT"})
    if (std::getenv(v)) return true;
  return false;
}
#endif
}  // namespace

void runtime_init(int* argc, char*** argv) {
#ifdef TPTRAIN_HAVE_MPI
  if (!g_mpi_started && launched_by_mpi()) {
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

std::string runtime_broadcast_string(const std::string& s) {
#ifdef TPTRAIN_HAVE_MPI
  if (g_mpi_started && runtime_world_size() > 1) {
    unsigned long long n = s.size();
    MPI_Bcast(&n, 1, MPI_UNSIGNED_LONG_LONG, 0, MPI_COMM_WORLD);
    std::string out = s;
    out.resize(size_t(n));
    for (size_t at = 0; at < out.size();) {  // in pieces that fit an int count
      const int chunk = int(std::min<size_t>(out.size() - at, size_t(1) << 30));
      MPI_Bcast(out.data() + at, chunk, MPI_CHAR, 0, MPI_COMM_WORLD);
      at += size_t(chunk);
    }
    return out;
  }
#endif
  return s;
}

void runtime_abort(int code) {
  std::fflush(stdout);
  std::fflush(stderr);
#ifdef TPTRAIN_HAVE_CUDA
  nccl_abort_all();  // abort, never destroy: a dead peer's collectives will not complete
#endif
#ifdef TPTRAIN_HAVE_MPI
  if (g_mpi_started && runtime_world_size() > 1) MPI_Abort(MPI_COMM_WORLD, code);
#endif
  std::_Exit(code);
}

// ---- coordinates and groups ------------------------------------------------------------------

GridCoords grid_coords(const GridShape& s, int rank) {
  TPT_CHECK(rank >= 0 && rank < s.world());
  TPT_CHECK(s.ep >= 1 && s.etp >= 0 && (s.tp * s.cp * s.dp) % (s.expert_tp() * s.ep) == 0);
  const int in_stage = rank % (s.tp * s.cp * s.dp), etp = s.expert_tp();  // = etp + ETP * (ep + EP * edp)
  return {rank % s.tp,     (rank / s.tp) % s.cp,       rank / (s.tp * s.cp * s.dp), (rank / (s.tp * s.cp)) % s.dp,
          in_stage % etp, (in_stage / etp) % s.ep, in_stage / (etp * s.ep)};
}

void place_in_grid(Grid& g, const GridShape& s, int rank) {
  TPT_CHECK(s.tp >= 1 && s.cp >= 1 && s.pp >= 1 && s.dp >= 1);
  const GridCoords c = grid_coords(s, rank);
  g.world_size = s.world();
  g.world_rank = rank;
  g.tp = s.tp, g.cp = s.cp, g.pp = s.pp, g.dp = s.dp;
  g.tp_rank = c.tp, g.cp_rank = c.cp, g.pp_rank = c.pp, g.dp_rank = c.dp;
  g.ep = s.ep, g.etp = s.expert_tp(), g.edp = s.edp();
  g.ep_rank = c.ep, g.etp_rank = c.etp, g.edp_rank = c.edp;
}

std::vector<GroupSplit> grid_group_splits(const GridShape& s, int rank) {
  const GridCoords c = grid_coords(s, rank);
  // colors: the coordinates the group's members share, numbered
  std::vector<GroupSplit> out = {
      {&Grid::world, nullptr, 0, rank},
      {&Grid::tp_group, &Grid::tp_device, (c.pp * s.dp + c.dp) * s.cp + c.cp, c.tp},
      {&Grid::pp_group, &Grid::pp_device, (c.dp * s.cp + c.cp) * s.tp + c.tp, c.pp},
      {&Grid::dp_group, &Grid::dp_device, (c.pp * s.cp + c.cp) * s.tp + c.tp, c.dp},
      {&Grid::mp_group, nullptr, c.dp * s.cp + c.cp, c.pp * s.tp + c.tp},
  };
  if (s.pp > 1) {
    const bool member = c.pp == 0 || c.pp == s.pp - 1;
    out.push_back({&Grid::embedding_group, &Grid::embedding_device, member ? (c.dp * s.cp + c.cp) * s.tp + c.tp : -1,
                   c.pp});
  }
  if (s.cp > 1) {
    out.push_back({&Grid::cp_group, &Grid::cp_device, (c.pp * s.dp + c.dp) * s.tp + c.tp, c.cp});
    out.push_back({&Grid::dp_cp_group, &Grid::dp_cp_device, c.pp * s.tp + c.tp, c.cp + s.cp * c.dp});
  }
  // the expert grid's groups, where they differ from the dense ones
  const int etp = s.expert_tp(), edp = s.edp();
  if (s.ep > 1) out.push_back({&Grid::ep_group, &Grid::ep_device, (c.pp * edp + c.edp) * etp + c.etp, c.ep});
  if (s.folded()) out.push_back({&Grid::edp_group, &Grid::edp_device, (c.pp * s.ep + c.ep) * etp + c.etp, c.edp});
  if (etp != s.tp) out.push_back({&Grid::etp_group, &Grid::etp_device, (c.pp * edp + c.edp) * s.ep + c.ep, c.etp});
  return out;
}

Grid make_grid(int tp, int pp, int dp, int cp) { return make_grid(GridShape{tp, cp, pp, dp}); }

Grid make_grid(const GridShape& shape) {
  Grid g;
  TPT_CHECK(shape.world() == runtime_world_size());
  place_in_grid(g, shape, runtime_world_rank());
  g.host = this_host();
#ifdef TPTRAIN_HAVE_MPI
  if (g_mpi_started) {
    for (const GroupSplit& s : grid_group_splits(shape, g.world_rank)) {
      MPI_Comm c;
      MPI_Comm_split(MPI_COMM_WORLD, s.color >= 0 ? s.color : MPI_UNDEFINED, s.key, &c);
      if (s.color >= 0) g.*s.host = make_mpi_comm(c);
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
  for (const GroupSplit& s : grid_group_splits(shape, g.world_rank))  // one process: groups of one
    if (s.color >= 0) g.*s.host = make_self_comm();
  g_hosts = {g.host};
  return g;
}

std::string Grid::table() const {
  std::ostringstream os;
  const bool expert = shape().folded();
  os << "process grid: world " << world_size << " = TP " << tp;
  if (cp > 1) os << " x CP " << cp;
  os << " x PP " << pp << " x DP " << dp
     << (cp > 1 ? "  (rank = tp + TP*(cp + CP*(dp + DP*pp)))\n" : "  (rank = tp + TP*(dp + DP*pp))\n");
  if (expert)  // the expert layers' grid over the same ranks (parallel folding)
    os << "expert grid: ETP " << etp << " x EP " << ep << " x EDP " << edp << " x PP " << pp
       << "  (rank = etp + ETP*(ep + EP*(edp + EDP*pp)))\n";
  os << (cp > 1 ? "  rank  tp  cp  pp  dp" : "  rank  tp  pp  dp") << (expert ? "  ep  edp" : "") << "  host\n";
  for (int r = 0; r < world_size; ++r) {
    char line[160];
    const char* host = r < int(g_hosts.size()) ? g_hosts[size_t(r)].c_str() : "?";
    const GridCoords c = grid_coords(shape(), r);
    int at = cp > 1 ? snprintf(line, sizeof(line), "  %4d  %2d  %2d  %2d  %2d", r, c.tp, c.cp, c.pp, c.dp)
                    : snprintf(line, sizeof(line), "  %4d  %2d  %2d  %2d", r, c.tp, c.pp, c.dp);
    if (expert) at += snprintf(line + at, sizeof(line) - size_t(at), "  %2d  %3d", c.ep, c.edp);
    snprintf(line + at, sizeof(line) - size_t(at), "  %s\n", host);
    os << line;
  }
  return os.str();
}

// ---- cuda: GPUs of the ranks ------------------------------------------------------------------

#ifdef TPTRAIN_HAVE_CUDA
namespace {

// The GPU a rank uses: its local rank modulo the GPUs it sees (all of the host's, or the one a
// launcher such as srun --gpus-per-task=1 leaves it), so ranks of a host spread over its GPUs.
int gpu_of(const Grid& g, int gpus) { return gpus > 0 ? g.local_rank % gpus : -1; }

// Another rank of the job that would use the same physical GPU (same UUID), or -1. Collective.
int rank_sharing_gpu(Grid& g, int device) {
  const std::string uuid = device >= 0 ? cuda_device_uuid(device) : std::string();
  float mine[4] = {};  // the 16 UUID bytes travel verbatim; zero without a GPU
  std::memcpy(mine, uuid.data(), std::min(uuid.size(), sizeof(mine)));
  std::vector<float> all(size_t(4) * size_t(g.world_size));
  g.world->all_gather(all.data(), mine, 4);
  for (int r = 0; r < g.world_size && !uuid.empty(); ++r)
    if (r != g.world_rank && std::memcmp(&all[size_t(4 * r)], mine, sizeof(mine)) == 0) return r;
  return -1;
}

}  // namespace
#endif

bool use_cuda_devices(Device device, Grid& g) {
  if (device == Device::Cpu) return false;
#ifdef TPTRAIN_HAVE_CUDA
  const int gpus = cuda_device_count();
  if (device == Device::Cuda) {
    if (gpus == 0)
      input_error("training.device: cuda, but no GPU is visible on host " + g.host + " (rank " +
                  std::to_string(g.world_rank) + "; check the NVIDIA driver and CUDA_VISIBLE_DEVICES)");
    const int other = rank_sharing_gpu(g, gpu_of(g, gpus));
    if (other >= 0)
      input_error("training.device: cuda needs a GPU per rank, but ranks " + std::to_string(g.world_rank) + " and " +
                  std::to_string(other) + " would share GPU " + std::to_string(gpu_of(g, gpus)) + " (" +
                  cuda_device_name(gpu_of(g, gpus)) + ") on host " + g.host + ", which runs " +
                  std::to_string(g.local_size) + " ranks and shows each " + std::to_string(gpus) +
                  " GPU(s): start at most that many ranks per host, or give each rank its own GPU");
    return true;
  }
  // auto: CUDA when every rank has a GPU of its own
  double lacking = gpus > 0 ? 0.0 : 1.0;
  g.world->all_reduce(&lacking, 1, ReduceOp::Max);
  if (lacking != 0.0) return false;
  double shared = rank_sharing_gpu(g, gpu_of(g, gpus)) >= 0 ? 1.0 : 0.0;
  g.world->all_reduce(&shared, 1, ReduceOp::Max);
  if (shared != 0.0 && g.world_rank == 0)
    std::fprintf(stderr, "tptrain: training.device auto: CPU, as the GPUs visible are fewer than the ranks\n");
  return shared == 0.0;
#else
  if (device == Device::Cuda)
    input_error("training.device: cuda, but this tptrain was built without the CUDA backend (no CUDA toolkit "
                "at build time; see README \"GPU\")");
  return false;
#endif
}

void setup_cuda_devices(Grid& g) {
#ifdef TPTRAIN_HAVE_CUDA
  g.cuda_device = gpu_of(g, cuda_device_count());
  TPT_CHECK(g.cuda_device >= 0);
  cuda_set_device(g.cuda_device);
  auto device_group = [](Comm* host) -> std::unique_ptr<Comm> {
    if (!host) return nullptr;
    return host->size() > 1 ? make_nccl_comm(*host) : make_device_self_comm();
  };
  for (const GroupSplit& s : grid_group_splits(g.shape(), g.world_rank))
    if (s.device) g.*s.device = device_group((g.*s.host).get());
#else
  (void)g;
  internal_error("setup_cuda_devices: built without CUDA");
#endif
}

}  // namespace tpt
