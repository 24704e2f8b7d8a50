// Config loading of the Mixture-of-Experts keys (docs/MOE.md "Config"): defaults, moe_layer_freq's two
// forms, the YAML / JSON round trip, and the bad combinations' errors naming their keys.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "config_test_util.h"
#include "core/config.h"
#include "core/error.h"

namespace tpt {
namespace {

using namespace config_test;

Config moe(std::vector<std::string> more = {}) {
  std::vector<std::string> sets = {"model.num_moe_experts=8"};
  sets.insert(sets.end(), more.begin(), more.end());
  return parse_config(kBase, "test.yaml", sets);
}

std::string moe_error(std::vector<std::string> more) {
  more.insert(more.begin(), "model.num_moe_experts=8");
  return error_of(kBase, more);
}

TEST(ConfigMoE, DenseByDefaultAndMegatronDefaults) {
  const Config dense = parse_config(kBase, "test.yaml");
  EXPECT_FALSE(dense.model.is_moe());
  EXPECT_FALSE(dense.model.is_moe_layer(0));
  EXPECT_TRUE(config_to_json(dense)["model"]["num_moe_experts"].is_null());
  const Config c = moe();
  const ModelConfig& m = c.model;
  EXPECT_TRUE(m.is_moe());
  EXPECT_EQ(m.moe_ffn_hidden_size, m.ffn_hidden_size);  // resolved
  EXPECT_EQ(m.moe_router_topk, 2);
  EXPECT_EQ(m.moe_router_score_function, MoEScore::Softmax);
  EXPECT_EQ(m.moe_router_load_balancing_type, MoEBalancing::AuxLoss);
  EXPECT_EQ(m.moe_token_dispatcher_type, MoEDispatcher::AllToAll);
  EXPECT_TRUE(m.is_moe_layer(0) && m.is_moe_layer(1));
  // the resolved config reads back to itself
  const Config again = parse_config(config_to_yaml(c), "resolved.yaml");
  EXPECT_EQ(config_to_json(again), config_to_json(c));
}

TEST(ConfigMoE, LayerFreqIntAndList) {
  const Config every2 = moe({"model.moe_layer_freq=2"});
  EXPECT_TRUE(every2.model.is_moe_layer(0));
  EXPECT_FALSE(every2.model.is_moe_layer(1));
  const Config list = moe({"model.moe_layer_freq=[0, 1]"});
  EXPECT_FALSE(list.model.is_moe_layer(0));
  EXPECT_TRUE(list.model.is_moe_layer(1));
  EXPECT_EQ(config_to_json(list)["model"]["moe_layer_freq"], nlohmann::json({0, 1}));
  EXPECT_EQ(config_to_json(parse_config(config_to_yaml(list), "r.yaml")), config_to_json(list));
  EXPECT_HAS(moe_error({"model.moe_layer_freq=[0, 1, 1]"}), "model.moe_layer_freq: a list needs one 0 / 1 per layer");
  EXPECT_HAS(moe_error({"model.moe_layer_freq=[0, 2]"}), "entry 1 must be 0 (dense) or 1 (MoE)");
  EXPECT_HAS(moe_error({"model.moe_layer_freq=0"}), "model.moe_layer_freq: must be >= 1");
}

TEST(ConfigMoE, BadCombinationsNameTheirKeys) {
  EXPECT_HAS(moe_error({"model.moe_router_topk=9"}), "model.moe_router_topk: 9 is greater than model.num_moe_experts (8)");
  EXPECT_HAS(moe_error({"model.moe_router_num_groups=3", "model.moe_router_group_topk=1"}),
             "model.moe_router_num_groups: model.num_moe_experts (8) is not divisible by model.moe_router_num_groups (3)");
  EXPECT_HAS(moe_error({"model.moe_router_num_groups=2", "model.moe_router_group_topk=4"}),
             "model.moe_router_group_topk: 4 is greater than model.moe_router_num_groups (2)");
  EXPECT_HAS(moe_error({"model.moe_router_num_groups=2"}), "needs both model.moe_router_num_groups and");
  EXPECT_HAS(moe_error({"model.moe_router_enable_expert_bias=true"}),
             "model.moe_router_enable_expert_bias: the expert bias (aux-loss-free balancing) needs "
             "moe_router_score_function: sigmoid");
  EXPECT_HAS(moe_error({"model.moe_pad_expert_input_to_capacity=true"}),
             "model.moe_pad_expert_input_to_capacity: needs a capacity");
  EXPECT_HAS(moe_error({"model.moe_expert_capacity_factor=-1"}), "model.moe_expert_capacity_factor: must be > 0");
  EXPECT_HAS(moe_error({"model.moe_dispatch_bound_factor=0.5"}), "model.moe_dispatch_bound_factor: must be in [1, 1e6]");
  EXPECT_HAS(moe_error({"model.moe_kept_rows_factor=0.9"}), "model.moe_kept_rows_factor: must be in [1, 1e6]");
  EXPECT_HAS(moe_error({"model.moe_router_load_balancing_type=none", "model.moe_aux_loss_coeff=0.01"}),
             "model.moe_aux_loss_coeff: is 0.01 with moe_router_load_balancing_type: none");
  EXPECT_HAS(moe_error({"model.moe_router_score_function=relu"}), "unknown value 'relu' (allowed: softmax | sigmoid)");
  EXPECT_HAS(error_of_set("model.moe_router_topk=4"),
             "model.moe_router_topk: is only used by Mixture-of-Experts models (model.num_moe_experts is null)");
  EXPECT_HAS(moe_error({"model.moe_shared_expert_gate=true"}), "model.moe_shared_expert_gate: gates the shared expert");
  EXPECT_EQ(moe({"model.moe_token_dispatcher_type=allgather"}).model.moe_token_dispatcher_type, MoEDispatcher::AllGather);
}

TEST(ConfigMoE, TensorParallelNeedsSequenceParallelAndEtpDividingTheExpertWidth) {
  auto parallel_error = [](Config c, int world) {
    try {
      resolve_parallel(c, world);
    } catch (const InputError& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_HAS(parallel_error(moe({"parallel.tensor_model_parallel_size=2"}), 2),
             "parallel.sequence_parallel: model.num_moe_experts with tensor_model_parallel_size 2 needs sequence "
             "parallelism");
  // ETP null = TP 2: each expert's width split over TP
  EXPECT_EQ(parallel_error(moe({"parallel.tensor_model_parallel_size=2", "parallel.sequence_parallel=true"}), 2), "");
  EXPECT_EQ(parallel_error(moe({"parallel.tensor_model_parallel_size=2", "parallel.sequence_parallel=true",
                                "parallel.expert_tensor_parallel_size=2", "parallel.expert_model_parallel_size=2"}),
                           4),
            "");
  EXPECT_HAS(parallel_error(moe({"parallel.tensor_model_parallel_size=2", "parallel.sequence_parallel=true",
                                 "model.moe_ffn_hidden_size=33"}),
                            2),
             "model.moe_ffn_hidden_size: 33 is not divisible by parallel.expert_tensor_parallel_size (2");
  EXPECT_EQ(parallel_error(moe({"parallel.tensor_model_parallel_size=2", "parallel.sequence_parallel=true",
                                "parallel.expert_tensor_parallel_size=1", "model.moe_ffn_hidden_size=33"}),
                           2),
            "");
  EXPECT_EQ(parallel_error(moe({"parallel.tensor_model_parallel_size=2", "parallel.sequence_parallel=true",
                                "parallel.expert_tensor_parallel_size=1", "parallel.expert_model_parallel_size=2"}),
                           4),
            "");
  EXPECT_EQ(parallel_error(moe({"parallel.pipeline_model_parallel_size=2", "parallel.expert_model_parallel_size=2"}), 4),
            "");
}

}  // namespace
}  // namespace tpt
