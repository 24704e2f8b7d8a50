// Parameter groups (model/param_group.h): GradSync with two replica groups over different
// communicators on thread ranks -- a dense group over all 4 ranks and a second group whose tensors
// differ between two pairs of ranks and are replicated within each pair (as expert weights over
// expert-DP) -- checked against sums computed independently in double; the gradient norm counting
// each element once and the checkpoint's writers (unique_ranges) choosing one replica per element
// per group; and the groups the trainer derives from the model's real layouts (one dense group:
// the whole buffer, the layers as before, so the buckets are unchanged).
#include <gtest/gtest.h>

#include <climits>
#include <cmath>
#include <mutex>
#include <string>
#include <vector>

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

}  // namespace
}  // namespace tpt
