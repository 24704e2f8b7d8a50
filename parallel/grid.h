// The TP x CP x PP x DP process grid (docs/ARCHITECTURE.md "Process grid"):
// rank = tp + TP * (cp + CP * (dp + DP * pp)) -- TP fastest so TP peers share a node, then CP
// (context parallelism, parallel/context_parallel.h), then DP, PP slowest (Megatron's order).
// Every group the trainer talks to is derived here, by one function (grid_group_splits) that the
// MPI path (make_grid), the device twins (setup_cuda_devices) and threads as ranks
// (parallel/thread_comm.h) all use.
//
// The expert layers of a Mixture-of-Experts model (docs/MOE.md) fold an ETP x EP x EDP grid into
// the same ranks (Megatron's "parallel folding"): within a stage, i = tp + TP * (cp + CP * dp) =
// etp + ETP * (ep + EP * edp), EDP = TP * CP * DP / (ETP * EP).
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "core/config.h"
#include "parallel/comm.h"

namespace tpt {

struct Config;

// The grid's sizes: world = tp * cp * pp * dp. The expert grid's: ep (expert-parallel ranks) and
// etp (expert tensor-parallel ranks: 0 = tp, or 1), with ep * expert_tp() dividing tp * cp * dp.
// A dense grid is ep 1, etp tp: its expert groups are the dense ones.
struct GridShape {
  int tp = 1, cp = 1, pp = 1, dp = 1;
  int ep = 1, etp = 0;
  int world() const { return tp * cp * pp * dp; }
  int expert_tp() const { return etp > 0 ? etp : tp; }
  int edp() const { return tp * cp * dp / (expert_tp() * ep); }
  // whether the expert groups differ from the dense ones (EP > 1 or ETP != TP)
  bool folded() const { return ep > 1 || expert_tp() != tp; }
};

// A rank's place in the grid: rank = tp + TP * (cp + CP * (dp + DP * pp)); in the expert grid
// tp + TP * (cp + CP * dp) = etp + ETP * (ep + EP * edp) within the stage.
struct GridCoords {
  int tp = 0, cp = 0, pp = 0, dp = 0;
  int etp = 0, ep = 0, edp = 0;
};
GridCoords grid_coords(const GridShape& s, int rank);

struct Grid {
  int world_size = 1, world_rank = 0;
  int tp = 1, pp = 1, dp = 1, cp = 1;
  int tp_rank = 0, pp_rank = 0, dp_rank = 0, cp_rank = 0;
  int local_rank = 0, local_size = 1;  // ranks on this host
  std::string host;

  std::unique_ptr<Comm> world;      // all ranks
  std::unique_ptr<Comm> tp_group;   // same (pp, dp)
  std::unique_ptr<Comm> pp_group;   // same (tp, dp), ordered by stage
  std::unique_ptr<Comm> dp_group;   // same (tp, pp)
  std::unique_ptr<Comm> mp_group;   // same (dp, cp): the whole model (TP x PP), for norms and losses
  // With context parallelism (cp > 1; else null, and dp_cp() is the DP group): the CP ring (same
  // tp, dp, pp; ordered by cp rank) and the replicas of the weights, DP x CP (same tp, pp; ordered
  // by cp + CP * dp): the gradient sums and the distributed optimizer's shards.
  std::unique_ptr<Comm> cp_group, dp_cp_group;
  // The weights' replica group and this rank's index in it (dp_rank with cp = 1).
  Comm& dp_cp() const { return dp_cp_group ? *dp_cp_group : *dp_group; }
  int dp_cp_rank() const { return cp_rank + cp * dp_rank; }
  int dp_cp_size() const { return dp * cp; }
  std::unique_ptr<Comm> embedding_group;  // {first, last stage} of each (tp, dp); null if PP = 1
  // The expert grid (ETP x EP x EDP within a stage; etp 1 or tp): with EP > 1 the experts'
  // all-to-all group (same pp, etp, edp; ordered by ep rank; else null); the expert weights'
  // replicas (same pp, etp, ep; ordered by edp rank), null when they are the DP x CP group (EP 1,
  // ETP = TP); with ETP != TP the expert tensor-parallel group (same pp, ep, edp; by etp rank),
  // else null: with ETP = TP it is the TP group, the same ranks in the same order.
  int ep = 1, etp = 1, edp = 1;
  int ep_rank = 0, etp_rank = 0, edp_rank = 0;
  std::unique_ptr<Comm> ep_group, edp_group, etp_group;

  // on GPU runs, this rank's GPU and the device-side communicators of the groups whose
  // collectives carry device buffers (NCCL over two or more ranks, a device copy for one); made by
  // setup_cuda_devices. On CPU runs device_*() are the host groups above.
  int cuda_device = -1;
  std::unique_ptr<Comm> tp_device, pp_device, dp_device, embedding_device, cp_device, dp_cp_device;
  std::unique_ptr<Comm> ep_device, edp_device, etp_device;
  Comm& device_tp() const { return tp_device ? *tp_device : *tp_group; }
  Comm& device_pp() const { return pp_device ? *pp_device : *pp_group; }
  Comm& device_dp() const { return dp_device ? *dp_device : *dp_group; }
  Comm& device_cp() const { return cp_device ? *cp_device : *cp_group; }  // needs cp_group
  Comm& device_dp_cp() const {
    return dp_cp_device ? *dp_cp_device : dp_cp_group ? *dp_cp_group : device_dp();
  }
  Comm* device_embedding() const { return embedding_device ? embedding_device.get() : embedding_group.get(); }
  // the expert groups' device twins, or their host groups, or the dense groups they equal
  Comm& device_ep() const { return ep_device ? *ep_device : *ep_group; }  // needs ep_group
  Comm& device_edp() const { return edp_device ? *edp_device : edp_group ? *edp_group : device_dp_cp(); }
  Comm& device_etp() const { return etp_device ? *etp_device : etp_group ? *etp_group : device_tp(); }

  GridShape shape() const { return {tp, cp, pp, dp, ep, etp}; }
  bool first_stage() const { return pp_rank == 0; }
  bool last_stage() const { return pp_rank == pp - 1; }
  static int rank_of(int tp_rank, int dp_rank, int pp_rank, int tp, int dp, int cp_rank = 0, int cp = 1) {
    return tp_rank + tp * (cp_rank + cp * (dp_rank + dp * pp_rank));
  }
  // A table of every rank's coordinates (rank -> tp, cp, pp, dp, host; with a folded expert grid
  // also ep, edp), for rank 0 to print.
  std::string table() const;
};

// Fills g's sizes and world_rank / tp_rank / cp_rank / pp_rank / dp_rank (and the expert grid's
// ep / etp / edp and their ranks) for `rank` of shape s.
void place_in_grid(Grid& g, const GridShape& s, int rank);

// One of the grid's groups as one rank sees it: MPI_Comm_split's color (the group; -1: the rank is
// not a member) and key (the rank's place in the group, ascending), and the Grid fields it fills:
// the host group and its device twin (null: host only, as world and mp).
struct GroupSplit {
  std::unique_ptr<Comm> Grid::*host = nullptr;
  std::unique_ptr<Comm> Grid::*device = nullptr;
  int color = -1, key = 0;
};
// Every group of a grid of shape s for world rank `rank`, the same groups in the same order on
// every rank (the order they are made in, collectively): world; tp (same cp, dp, pp); pp (same tp,
// cp, dp; by stage); dp (same tp, cp, pp); mp (same cp, dp; by pp * TP + tp); with PP > 1 the
// embedding group (first and last stage of each tp, cp, dp); with CP > 1 cp (same tp, dp, pp) and
// dp_cp (same tp, pp; by cp + CP * dp); with EP > 1 ep (same pp, etp, edp; by ep); with EP > 1 or
// ETP != TP edp (same pp, etp, ep; by edp); with ETP != TP etp (same pp, ep, edp; by etp). Groups
// absent from the list stay null.
std::vector<GroupSplit> grid_group_splits(const GridShape& s, int rank);

// whether this job trains on GPUs, for training.device = cpu | cuda | auto. A rank uses GPU
// (local rank mod the GPUs it sees). cuda: an error naming the host when this build has no CUDA
// backend, no GPU is visible, or two ranks would share a GPU. auto: CUDA when every rank of the job
// has a GPU of its own, else CPU. Collective over the world.
bool use_cuda_devices(Device device, Grid& g);
// makes that GPU this rank's device (local rank from MPI_Comm_split_type SHARED) and creates
// the device-side communicators (collective over the world, every rank in the same order).
void setup_cuda_devices(Grid& g);

}  // namespace tpt
