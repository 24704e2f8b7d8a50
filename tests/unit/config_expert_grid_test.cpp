// resolve_parallel's checks of the expert grid (core/config_grid.cpp, docs/MOE.md): ETP 1 or TP
// (null resolved to TP; a dense model's always TP), EP > 1 only for an MoE model, the experts
// divisible by EP, ETP x EP x PP dividing the world -- each error naming its keys -- and the layouts
// accepted, with the dense configs resolved as before.
#include <gtest/gtest.h>

#include <string>

#include "config_test_util.h"
#include "core/config.h"
#include "core/error.h"

namespace tpt {
namespace {

using namespace config_test;

// kBase with TP `tp`, CP `cp`, PP `pp`, E experts (0: dense), EP and ETP (0: null). The fields are
// set directly, as the keys' table would from YAML.
Config expert_config(int tp, int cp, int pp, int experts, int ep, int etp) {
  Config c = parse_config(kBase, "test.yaml");
  c.parallel.tensor_model_parallel_size = tp;
  c.parallel.context_parallel_size = cp;
  c.parallel.pipeline_model_parallel_size = pp;
  c.model.num_moe_experts = experts;
  c.parallel.expert_model_parallel_size = ep;
  c.parallel.expert_tensor_parallel_size = etp;
  return c;
}

TEST(ConfigExpertGrid, DenseConfigsResolveEtpToTp) {
  for (int tp : {1, 2, 4}) {
    Config c = expert_config(tp, 1, 1, 0, 1, 0);
    resolve_parallel(c, 8);
    EXPECT_EQ(c.parallel.expert_tensor_parallel_size, tp);
    EXPECT_EQ(c.parallel.expert_model_parallel_size, 1);
    EXPECT_EQ(c.parallel.data_parallel_size, 8 / tp);
    resolve_parallel(c, 8);  // idempotent
    EXPECT_EQ(c.parallel.expert_tensor_parallel_size, tp);
  }
  // a dense model's ETP is TP whatever it was (no expert layers): also when a resolved config is
  // resolved again for another TP
  for (int etp : {1, 2, 3}) {
    Config c = expert_config(2, 1, 1, 0, 1, etp);
    resolve_parallel(c, 4);
    EXPECT_EQ(c.parallel.expert_tensor_parallel_size, 2);
    c.parallel.tensor_model_parallel_size = 4;
    c.parallel.data_parallel_size = 0;
    resolve_parallel(c, 4);
    EXPECT_EQ(c.parallel.expert_tensor_parallel_size, 4);
  }
}

TEST(ConfigExpertGrid, AcceptedMoeLayouts) {
  struct Case {
    int tp, cp, pp, experts, ep, etp, world, resolved_etp;
  };
  // (MoE with TP > 1 runs with sequence parallelism and ETP 1 so far: core/config_moe.cpp
  // check_moe_parallel refuses ETP = TP > 1, config_moe_test.cpp tests that)
  const Case cases[] = {
      {1, 1, 1, 8, 4, 0, 4, 1},  // EP 4 over DP 4
      {2, 1, 1, 8, 4, 1, 4, 1},  // ETP 1: EP 4 over TP 2 x DP 2
      {2, 1, 1, 8, 8, 1, 8, 1},  // EP 8 over TP 2 x DP 4
      {1, 2, 1, 4, 4, 0, 8, 1},  // EP folded into CP 2 x DP 4
      {2, 2, 1, 4, 4, 1, 8, 1},  // ETP 1: EP folded into TP 2 x CP 2 x DP 2
      {1, 1, 2, 6, 2, 0, 8, 1},  // PP 2: EP 2 x EDP 2 per stage
      {2, 1, 2, 8, 1, 1, 4, 1},  // EP 1, ETP 1: the experts whole on each rank
  };
  for (const Case& k : cases) {
    SCOPED_TRACE("TP " + std::to_string(k.tp) + " CP " + std::to_string(k.cp) + " PP " + std::to_string(k.pp) +
                 " EP " + std::to_string(k.ep) + " ETP " + std::to_string(k.etp) + " world " + std::to_string(k.world));
    Config c = expert_config(k.tp, k.cp, k.pp, k.experts, k.ep, k.etp);
    c.parallel.sequence_parallel = k.tp > 1;
    resolve_parallel(c, k.world);
    EXPECT_EQ(c.parallel.expert_tensor_parallel_size, k.resolved_etp);
    EXPECT_EQ(c.parallel.expert_model_parallel_size, k.ep);
  }
}

TEST(ConfigExpertGrid, ErrorsNameTheKeys) {
  // ETP other than 1 or TP
  std::string m = resolve_error(expert_config(4, 1, 1, 8, 1, 2), 8);
  EXPECT_HAS(m, "parallel.expert_tensor_parallel_size (2) must be 1 or parallel.tensor_model_parallel_size (4)");
  m = resolve_error(expert_config(1, 1, 1, 8, 1, 2), 4);
  EXPECT_HAS(m, "parallel.expert_tensor_parallel_size (2) must be 1 or parallel.tensor_model_parallel_size (1)");
  m = resolve_error(expert_config(1, 1, 1, 8, 0, 0), 4);
  EXPECT_HAS(m, "parallel.expert_model_parallel_size (0) must be at least 1");

  // a dense model: EP 1
  m = resolve_error(expert_config(1, 1, 1, 0, 2, 0), 4);
  EXPECT_HAS(m, "parallel.expert_model_parallel_size > 1 needs model.num_moe_experts");

  // the experts split evenly over EP
  m = resolve_error(expert_config(1, 1, 1, 6, 4, 0), 4);
  EXPECT_HAS(m, "model.num_moe_experts (6) is not divisible by parallel.expert_model_parallel_size (4)");

  // ETP x EP x PP divides the world: TP 2 x DP 2 cannot hold ETP 2 x EP 4
  m = resolve_error(expert_config(2, 1, 1, 8, 4, 0), 4);
  EXPECT_HAS(m, "parallel.expert_tensor_parallel_size (null = tensor_model_parallel_size 2) * "
                "parallel.expert_model_parallel_size (4) * parallel.pipeline_model_parallel_size (1) = 8 does not "
                "divide the world size 4");
  m = resolve_error(expert_config(1, 1, 2, 8, 4, 1), 4);  // PP 2: 2 ranks per stage
  EXPECT_HAS(m, "parallel.expert_tensor_parallel_size (1) * parallel.expert_model_parallel_size (4) * "
                "parallel.pipeline_model_parallel_size (2) = 8 does not divide the world size 4");
  m = resolve_error(expert_config(1, 1, 1, 12, 4, 0), 6);  // 4 does not divide DP 6
  EXPECT_HAS(m, "= 4 does not divide the world size 6");
  // a failed check leaves ETP as given
  Config c = expert_config(2, 1, 1, 8, 4, 0);
  EXPECT_THROW(resolve_parallel(c, 4), InputError);
  EXPECT_EQ(c.parallel.expert_tensor_parallel_size, 0);
}

}  // namespace
}  // namespace tpt
