// The TP x PP x DP process grid (DESIGN "Process grid (contract)"):
// rank = tp + TP * (dp + DP * pp) -- TP fastest so TP peers share a node, PP slowest.
// Every group the trainer talks to is derived here.
#pragma once
#include <memory>
#include <string>

#include "parallel/comm.h"

namespace tpt {

struct Config;

struct Grid {
  int world_size = 1, world_rank = 0;
  int tp = 1, pp = 1, dp = 1;
  int tp_rank = 0, pp_rank = 0, dp_rank = 0;
  int local_rank = 0, local_size = 1;  // ranks on this host
  std::string host;

  std::unique_ptr<Comm> world;      // all ranks
  std::unique_ptr<Comm> tp_group;   // same (pp, dp)
  std::unique_ptr<Comm> pp_group;   // same (tp, dp), ordered by stage
  std::unique_ptr<Comm> dp_group;   // same (tp, pp)
  std::unique_ptr<Comm> mp_group;   // same dp: the whole model (TP x PP), for norms and losses
  std::unique_ptr<Comm> embedding_group;  // {first, last stage} of each (tp, dp); null if PP = 1

  bool first_stage() const { return pp_rank == 0; }
  bool last_stage() const { return pp_rank == pp - 1; }
  static int rank_of(int tp_rank, int dp_rank, int pp_rank, int tp, int dp) {
    return tp_rank + tp * (dp_rank + dp * pp_rank);
  }
  // A table of every rank's coordinates (rank -> tp, pp, dp, host), for rank 0 to print.
  std::string table() const;
};

}  // namespace tpt
