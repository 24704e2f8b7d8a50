// Parameter groups (model/param_group.h): GradSync with two replica groups over different
// communicators on thread ranks -- a dense group over all 4 ranks and a second group whose tensors
// differ between two pairs of ranks and are replicated within each pair (as expert weights over
// expert-DP) -- checked against sums computed independently in double; the gradient norm counting
// each element once and the checkpoint's writers (unique_ranges) choosing one replica per element
// per group; the groups the trainer derives from the model's real layouts (one dense group:
// the whole buffer, the layers as before, so the buckets are unchanged); and an MoE stage's layout
// written by hand (the expert tensors h.<l>.mlp.experts.* after the dense ones): its two groups,
// their layers' parts, and their sums over DP and over the expert grid's EDP group on thread ranks.
#include <gtest/gtest.h>

#include <climits>
#include <cmath>
#include <mutex>
#include <string>
#include <vector>

#include "core/error.h"
#include "model/chunks.h"
#include "model/optimizer.h"
#include "parallel/thread_comm.h"
#include "tests/common/tiny_config.h"

namespace tpt {
namespace {

// The buffer of every rank: dense span [0, 768) (tensors emb [0, 100), h.0 [128, 300), h.1
// [300, 520), ln_f [520, 700), a non-primary copy of emb [704, 744)); second group's span
// [832, 1216) (tensors h.0 [848, 982), h.1 [982, 1200)). 832 is a multiple of 64, not of 128.
constexpr int64_t kDenseEnd = 768, kSecondBegin = 832, kTotal = 1216;
const std::vector<GradRange> kDenseLayers = {{128, 172}, {300, 220}};
const std::vector<GradRange> kSecondLayers = {{848, 134}, {982, 218}};
constexpr float kDenseScale = 0.25f, kSecondScale = 0.25f;  // 1 / (world): the mean over all data

ParamLayout two_group_layout() {
  ParamLayout l;
  auto add = [&](const char* name, int64_t offset, int64_t numel, bool primary) {
    ParamInfo p;
    p.name = name;
    p.offset = offset;
    p.numel = numel;
    p.group.primary = primary;
    l.params.push_back(p);
  };
  add("emb", 0, 100, true);
  add("h.0.w", 128, 172, true);
  add("h.1.w", 300, 220, true);
  add("ln_f", 520, 180, true);
  add("emb_copy", 704, 40, false);
  add("h.0.expert", 848, 134, true);
  add("h.1.expert", 982, 218, true);
  l.total = kTotal;
  return l;
}

// Rank r's gradient before the sync: multiples of 1/8, so every sum below is exact in float.
float grad_of(int r, int64_t i) { return 0.5f * float(r + 1) + 0.125f * float(i % 29); }

struct RankResult {
  std::vector<float> grads, params;
  std::vector<ShardRange> owned;
  std::vector<GradRange> unique;
  double sum_squares = 0;
};

// Grid of run_thread_ranks(2, 1, 2): world {0, 1, 2, 3}; dp_group {r % 2, r % 2 + 2} -- here the
// second group's pairs (pair r % 2 holds its own tensors, rank r / 2 in it).
std::vector<RankResult> run_two_groups(const GradSyncOptions& options) {
  std::vector<RankResult> results(4);
  const ParamLayout layout = two_group_layout();
  run_thread_ranks(2, 1, 2, false, [&](Grid& grid) {
    const int r = grid.world_rank;
    auto ops = make_cpu_ops(1);
    RankResult& out = results[size_t(r)];
    out.grads.resize(size_t(kTotal));
    for (int64_t i = 0; i < kTotal; ++i) out.grads[size_t(i)] = grad_of(r, i);
    std::vector<GradGroup> groups = {{grid.world.get(), kDenseScale, {0, kDenseEnd}, kDenseLayers},
                                     {grid.dp_group.get(), kSecondScale, {kSecondBegin, kTotal - kSecondBegin}, kSecondLayers}};
    GradSync sync(*ops, out.grads.data(), groups, nullptr, GradRange{}, options);
    for (int l = 1; l >= 0; --l) sync.layer_done(l);
    sync.finish();
    out.owned = sync.owned();
    out.unique = sync.unique_ranges();
    out.sum_squares = local_grad_sum_squares(layout, *ops, out.grads.data(), out.owned, out.unique);
    // the parameter all-gather: each rank's owned values to its groups (1000 r + i), the rest garbage
    out.params.assign(size_t(kTotal), -1.0f);
    for (const ShardRange& o : out.owned)
      for (int64_t i = o.offset; i < o.offset + o.n; ++i) out.params[size_t(i)] = float(1000 * r + i);
    sync.start_param_gather(Buf(out.params.data()));
    for (int l = -1; l <= 2; ++l) sync.wait_params(l);
  });
  return results;
}

bool in(const std::vector<ShardRange>& rs, int64_t i) {
  for (const ShardRange& s : rs)
    if (i >= s.offset && i < s.offset + s.n) return true;
  return false;
}
bool in(const std::vector<GradRange>& rs, int64_t i) {
  for (const GradRange& s : rs)
    if (i >= s.offset && i < s.offset + s.n) return true;
  return false;
}

void check_two_groups(const GradSyncOptions& options) {
  const std::vector<RankResult> res = run_two_groups(options);
  const ParamLayout layout = two_group_layout();
  // the ranks holding the same copy of element i as rank r: all four (dense), or r's pair
  auto peers = [](int r, int64_t i) {
    return i < kDenseEnd ? std::vector<int>{0, 1, 2, 3} : std::vector<int>{r % 2, r % 2 + 2};
  };
  auto want = [&](int r, int64_t i) {  // the group's sum in double, times its scale
    double s = 0;
    for (int q : peers(r, i)) s += double(grad_of(q, i));
    return s * double(i < kDenseEnd ? kDenseScale : kSecondScale);
  };
  for (int r = 0; r < 4; ++r) {
    SCOPED_TRACE("rank " + std::to_string(r));
    for (int64_t i = 0; i < kTotal; ++i) {
      const bool spanned = i < kDenseEnd || i >= kSecondBegin;
      int owners = 0, writers = 0, owner = -1;
      for (int q : peers(r, i)) {
        owners += in(res[size_t(q)].owned, i);
        writers += in(res[size_t(q)].unique, i);
        if (in(res[size_t(q)].owned, i)) owner = q;
      }
      // each element of a group's span owned by one replica (distributed optimizer) or all, and
      // written / counted by exactly one
      ASSERT_EQ(owners, !spanned ? 0 : options.distributed_optimizer ? 1 : int(peers(r, i).size())) << i;
      ASSERT_EQ(writers, spanned ? 1 : 0) << i;
      if (in(res[size_t(r)].owned, i)) {
        ASSERT_EQ(double(res[size_t(r)].grads[size_t(i)]), want(r, i)) << i;
      }
      if (options.distributed_optimizer && spanned) {  // every block all-gathered from its owner
        ASSERT_EQ(res[size_t(r)].params[size_t(i)], float(1000 * owner + i)) << i;
      }
    }
  }
  // the norm: every primary element once -- the dense tensors once, the second group's once per pair
  double want_norm = 0, got_norm = 0;
  for (const ParamInfo& p : layout.params) {
    if (!p.group.primary) continue;
    for (int64_t i = p.offset; i < p.offset + p.numel; ++i)
      for (int pair : p.offset < kDenseEnd ? std::vector<int>{0} : std::vector<int>{0, 1})
        want_norm += want(pair, i) * want(pair, i);
  }
  for (const RankResult& r : res) got_norm += r.sum_squares;
  EXPECT_NEAR(got_norm, want_norm, 1e-12 * want_norm);
}

TEST(ParamGroups, TwoGroupsAllReduced) { check_two_groups({.overlap = false, .bucket_size = 1}); }
TEST(ParamGroups, TwoGroupsInOverlappedBuckets) { check_two_groups({.overlap = true, .bucket_size = 100}); }
TEST(ParamGroups, TwoGroupsReduceScatteredByTheDistributedOptimizer) {
  check_two_groups({.overlap = false, .bucket_size = 1, .distributed_optimizer = true});
}
TEST(ParamGroups, TwoGroupsOverlappedWithTheDistributedOptimizer) {
  check_two_groups({.overlap = true, .bucket_size = 100, .distributed_optimizer = true, .overlap_param_gather = true});
}

// The model's layouts: one dense group from the first tensor to the end, padded like
// GradSync::buffer_size, with the layers rank_layer_ranges gives (so the buckets are as they were);
// the TP-replicated ranges and the tied embedding from the tensors' ParamGroup.
TEST(ParamGroups, ModelLayoutsHaveOneDenseGroup) {
  Config c = test::tiny_gpt_config({.layers = 4});
  for (int v : {1, 2})
    for (int pp : {1, 2})
      for (bool distributed : {false, true}) {
        if (v > 1 && pp == 1) continue;
        c.parallel.virtual_pipeline_model_parallel_size = v;
        for (int s = 0; s < pp; ++s) {
          SCOPED_TRACE("v " + std::to_string(v) + " pp " + std::to_string(pp) + " stage " + std::to_string(s));
          const std::vector<GPTDims> chunks = make_chunk_dims(c, 2, 1, pp, s);
          const ParamLayout l = make_rank_layout(chunks);
          const std::vector<GradGroup> groups =
              make_grad_groups(l, rank_layers(chunks), distributed, [&](ReplicaGroup) { return ReplicaComm{nullptr, 1.0f}; });
          ASSERT_EQ(groups.size(), 1u);
          EXPECT_EQ(groups[0].span.offset, 0);
          EXPECT_EQ(groups[0].span.n, l.total);
          EXPECT_EQ(grad_buffer_size(l, groups), l.total);
          const std::vector<GradRange> want = rank_layer_ranges(l, chunks);
          ASSERT_EQ(groups[0].layers.size(), want.size());
          for (size_t i = 0; i < want.size(); ++i) {
            EXPECT_EQ(groups[0].layers[i].offset, want[i].offset) << i;
            EXPECT_EQ(groups[0].layers[i].n, want[i].n) << i;
          }
          // padding with the distributed optimizer over a 3-rank group: 64 x 3 elements per block
          struct Three final : Comm {
            int rank() const override { return 0; }
            int size() const override { return 3; }
            void exchange(const std::vector<Message>&) override {}
            void barrier() override {}

           protected:
            void do_all_reduce(void*, int64_t, DType, ReduceOp) override {}
            void do_all_gather(void*, const void*, int64_t, DType) override {}
            void do_reduce_scatter(void*, const void*, int64_t, DType) override {}
            void do_broadcast(void*, int64_t, DType, int) override {}
            void do_all_to_all_v(const void*, const std::vector<int64_t>&, void*, const std::vector<int64_t>&,
                                 DType) override {}
          } three;
          const std::vector<GradGroup> padded =
              make_grad_groups(l, rank_layers(chunks), distributed, [&](ReplicaGroup) { return ReplicaComm{&three, 1.0f}; });
          EXPECT_EQ(grad_buffer_size(l, padded), GradSync::buffer_size(l.total, 3, distributed));
          // TP rank 1: every replicated tensor in tp_replicated_ranges, none of them primary
          int64_t replicated = 0, in_ranges = 0;
          for (const ParamInfo& p : l.params)
            if (p.group.copy == ModelCopy::TensorParallel) {
              replicated += p.numel;
              EXPECT_FALSE(p.group.primary) << p.name;
            }
          for (const GradRange& r : tp_replicated_ranges(l))
            for (const ParamInfo& p : l.params)
              if (p.offset >= r.offset && p.offset + p.numel <= r.offset + r.n) in_ranges += p.numel;
          EXPECT_EQ(in_ranges, replicated);
          const GradRange tied = tied_embedding_range(l);
          const ParamInfo* wte = l.find("wte.weight");
          if (pp > 1 && wte) {
            EXPECT_EQ(tied.offset, wte->offset);
            EXPECT_EQ(tied.n, wte->numel);
            EXPECT_EQ(wte->group.primary, s == 0);
          } else {
            EXPECT_EQ(tied.n, 0);
          }
        }
      }
}

// An MoE stage of two layers as the MoE layer lays it out: the dense tensors (embedding, both
// layers' attention and routers, the final norm) in [0, 430), then from 512 the expert tensors of
// layer 0 [512, 752) and, unless `dense_layer_1` (moe_layer_freq [1, 0]), of layer 1 [752, 992).
ParamLayout moe_layout(bool dense_layer_1) {
  ParamLayout l;
  auto add = [&](const std::string& name, int64_t offset, int64_t numel) {
    ParamInfo p;
    p.name = name;
    p.offset = offset;
    p.numel = numel;
    if (name.find(".mlp.experts.") != std::string::npos) p.group.replicas = ReplicaGroup::ExpertData;
    l.params.push_back(p);
  };
  add("wte.weight", 0, 100);
  add("h.0.attn.qkv.weight", 128, 96);
  add("h.0.mlp.router.weight", 224, 40);
  add("h.1.attn.qkv.weight", 264, 96);
  add(dense_layer_1 ? "h.1.mlp.fc1.weight" : "h.1.mlp.router.weight", 360, 40);
  add("ln_f.weight", 400, 30);
  add("h.0.mlp.experts.fc1.weight", 512, 120);
  add("h.0.mlp.experts.fc2.weight", 632, 120);
  if (!dense_layer_1) {
    add("h.1.mlp.experts.fc1.weight", 752, 120);
    add("h.1.mlp.experts.fc2.weight", 872, 120);
  }
  l.total = dense_layer_1 ? 752 : 992;
  return l;
}

bool same(const GradRange& a, const GradRange& b) { return a.offset == b.offset && a.n == b.n; }

TEST(ParamGroups, ExpertTensorsAfterTheDenseOnesMakeTheirOwnGroup) {
  for (bool dense_layer_1 : {false, true})
    for (bool distributed : {false, true}) {
      SCOPED_TRACE(std::string(dense_layer_1 ? "layer 1 dense" : "both MoE") + (distributed ? ", distributed" : ""));
      const ParamLayout l = moe_layout(dense_layer_1);
      std::vector<ReplicaGroup> asked;
      const std::vector<GradGroup> groups = make_grad_groups(l, {0, 1}, distributed, [&](ReplicaGroup g) {
        asked.push_back(g);
        return ReplicaComm{nullptr, g == ReplicaGroup::Dense ? 0.5f : 0.25f};
      });
      ASSERT_EQ(groups.size(), 2u);
      EXPECT_EQ(asked, std::vector<ReplicaGroup>({ReplicaGroup::Dense, ReplicaGroup::ExpertData}));
      EXPECT_EQ(groups[0].scale, 0.5f);
      EXPECT_EQ(groups[1].scale, 0.25f);
      // the dense span up to the first expert tensor; the experts' to the end
      EXPECT_TRUE(same(groups[0].span, {0, 512}));
      EXPECT_TRUE(same(groups[1].span, {512, l.total - 512}));
      EXPECT_EQ(grad_buffer_size(l, groups), l.total);
      // each layer's part: the hull of the group's tensors of that layer (the routers are dense)
      ASSERT_EQ(groups[0].layers.size(), 2u);
      ASSERT_EQ(groups[1].layers.size(), 2u);
      EXPECT_TRUE(same(groups[0].layers[0], {128, 136}));
      EXPECT_TRUE(same(groups[0].layers[1], {264, 136}));
      EXPECT_TRUE(same(groups[1].layers[0], {512, 240}));
      // a dense layer has an empty expert part at the end of the layer before
      EXPECT_TRUE(same(groups[1].layers[1], dense_layer_1 ? GradRange{752, 0} : GradRange{752, 240}));
    }
  // an expert tensor among the dense ones: the groups would interleave
  ParamLayout bad = moe_layout(false);
  bad.params[2].group.replicas = ReplicaGroup::ExpertData;  // h.0.mlp.router.weight
  EXPECT_THROW(make_grad_groups(bad, {0, 1}, false, [](ReplicaGroup) { return ReplicaComm{}; }), InternalError);
}

// DP 4 with EP 2 on thread ranks (EDP 2: ranks {0, 2} and {1, 3} hold the same experts), the
// groups made as the trainer makes them (dense: DP x CP; experts: EDP; both scaled by 1 / (DP x CP)),
// synchronised by GradSync: the dense gradients are the mean over the 4 ranks, the experts' the sum
// over the rank's EDP pair / 4 -- checked against sums in double -- and with the distributed
// optimizer each element owned by one rank of its group.
TEST(ParamGroups, ExpertGradientsSummedOverTheExpertDataParallelGroup) {
  const ParamLayout layout = moe_layout(false);
  for (bool distributed : {false, true})
    for (bool overlap : {false, true}) {
      SCOPED_TRACE(std::string(distributed ? "distributed" : "all-reduce") + (overlap ? ", overlapped" : ""));
      std::vector<RankResult> res(4);
      run_thread_ranks(GridShape{1, 1, 1, 4, 2, 0}, false, [&](Grid& grid) {
        const int r = grid.world_rank;
        const float scale = 1.0f / float(grid.dp_cp_size());
        std::vector<GradGroup> groups = make_grad_groups(layout, {0, 1}, distributed, [&](ReplicaGroup g) {
          return g == ReplicaGroup::Dense ? ReplicaComm{&grid.device_dp_cp(), scale}
                                          : ReplicaComm{&grid.device_edp(), scale};
        });
        auto ops = make_cpu_ops(1);
        RankResult& out = res[size_t(r)];
        out.grads.resize(size_t(grad_buffer_size(layout, groups)));
        for (size_t i = 0; i < out.grads.size(); ++i) out.grads[i] = grad_of(r, int64_t(i));
        GradSync sync(*ops, out.grads.data(), groups, nullptr, GradRange{},
                      {.overlap = overlap, .bucket_size = 64, .distributed_optimizer = distributed});
        for (int l = 1; l >= 0; --l) sync.layer_done(l);
        sync.finish();
        out.owned = sync.owned();
      });
      for (const ParamInfo& p : layout.params) {
        const bool expert = p.group.replicas == ReplicaGroup::ExpertData;
        for (int64_t i = p.offset; i < p.offset + p.numel; ++i)
          for (int r = 0; r < 4; ++r) {
            int owners = 0;
            double want = 0;
            for (int q = 0; q < 4; ++q)
              if (!expert || q % 2 == r % 2) {  // r's replicas of element i
                want += double(grad_of(q, i));
                owners += in(res[size_t(q)].owned, i);
              }
            ASSERT_EQ(owners, distributed ? 1 : expert ? 2 : 4) << p.name << " element " << i;
            if (in(res[size_t(r)].owned, i)) {
              ASSERT_EQ(double(res[size_t(r)].grads[size_t(i)]), want / 4) << p.name << " element " << i << ", rank " << r;
            }
          }
      }
    }
}

}  // namespace
}  // namespace tpt
