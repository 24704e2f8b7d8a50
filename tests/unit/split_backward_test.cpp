// ZB-H1's split backward (GPTStage::BackwardPart::Input, then backward_weight) against the full
// backward on the CPU backend:
//  - two identical stages over the same weights run the same three micro-batches (slots); one runs
//    the full backward of each in order, the other B of each then W of each, or interleaved as
//    ZB-H1 does (B0 B1 W0 B2 W1 W2). Every gradient, every micro-batch's input gradient and the
//    losses are equal bit for bit: B and W make the full backward's op calls (Ops::linear_backward
//    split into its input part and its weight part, which compute exactly what one call does);
//  - layer_done: never called by B; by W for every layer, last layer first; W leaves input_grad()
//    alone;
//  - one stage with all layers (embeddings and head), a middle stage of three, first and last stages
//    of two, TP 2 on thread ranks with and without sequence parallelism, bf16 storage, selective
//    recompute, reset_position_ids and eod_mask_loss;
//  - the stash's bytes (weight_grad_stash_bytes) are what the constructor allocates; full recompute
//    is refused (InputError naming the keys); misuse is an InternalError;
//  - the op itself: linear_backward with no dw, then with no dinp, adds what one call adds.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <vector>

#include "core/config.h"
#include "core/dtype.h"
#include "core/error.h"
#include "core/ops.h"
#include "model/gpt.h"
#include "parallel/comm.h"
#include "parallel/thread_comm.h"
#include "tests/common/box_elements.h"
#include "tests/common/failures.h"
#include "tests/common/tiny_config.h"

namespace tpt {
namespace {

using VecF = std::vector<float>;
using Bytes = std::vector<unsigned char>;
using Part = GPTStage::BackwardPart;


struct Case {
  std::string name;
  int layers = 2;
  int tp = 1;
  bool sp = false;
  int pp = 1, pp_rank = 0;
  DType dtype = DType::F32;
  Recompute recompute = Recompute::None;
  bool position_ids = false, loss_mask = false;
};

// The split stage's order of B's and W's over micro-batches 0, 1, 2.
enum class Order { AllBThenAllW, ZbH1 };
struct Step {
  bool weight;  // W (backward_weight), else B (backward with BackwardPart::Input)
  int mb;
};
std::vector<Step> steps(Order o) {
  switch (o) {
    case Order::AllBThenAllW: return {{false, 0}, {false, 1}, {false, 2}, {true, 0}, {true, 1}, {true, 2}};
    case Order::ZbH1: return {{false, 0}, {false, 1}, {true, 0}, {false, 2}, {true, 1}, {true, 2}};
  }
  return {};
}
const char* order_name(Order o) { return o == Order::ZbH1 ? "B0 B1 W0 B2 W1 W2" : "B0 B1 B2 W0 W1 W2"; }

constexpr int kSlots = 3;
constexpr int64_t kMicroBatch = 2;

Config case_config(const Case& c) {
  Config cfg = test::tiny_gpt_config({.layers = c.layers, .micro_batch = int(kMicroBatch)});
  cfg.data.reset_position_ids = c.position_ids;
  cfg.data.eod_mask_loss = c.loss_mask;
  cfg.parallel.sequence_parallel = c.sp;
  return cfg;
}

Bytes bytes_of(CBuf b, int64_t n) {
  const auto* p = static_cast<const unsigned char*>(b.p);
  return Bytes(p, p + dtype_size(n, b.t));
}

// Buffers from an Ops, freed with it in scope.
struct Owned {
  Ops& ops;
  std::vector<void*> p;
  ~Owned() {
    for (void* q : p) ops.free(q);
  }
};

// Micro-batch m's inputs, the same on every TP rank (each takes its tokens' rows where it holds Nt).
struct Inputs {
  std::vector<int32_t> tokens, targets, positions;
  VecF weights;
  CBuf hidden, dout;  // this rank's rows (Nt, C), in the compute dtype
};

// One TP rank's check of a case in one order; failures go to `fail`.
void check_rank(const Case& c, Order order, Comm& tp, int tp_rank, Failures& fail) {
  const std::string where = c.name + ", " + order_name(order) + ", TP rank " + std::to_string(tp_rank) + ": ";
  const Config cfg = case_config(c);
  const GPTDims d = make_dims(cfg, c.tp, tp_rank, c.pp, c.pp_rank);
  const ParamLayout layout = make_param_layout(d);
  const int64_t N = kMicroBatch * d.S, Nt = d.local_tokens(N), C = d.C;
  std::unique_ptr<Ops> ops = make_cpu_ops(1);  // host memory: Bufs are host pointers
  Owned owned{*ops, {}};
  auto to_dtype = [&](const VecF& v) {  // a buffer of c.dtype holding v (rounded)
    Buf b = ops->alloc(int64_t(v.size()), c.dtype);
    ops->convert(b, v.data(), int64_t(v.size()));
    owned.p.push_back(b.p);
    return CBuf(b);
  };

  // Weights: the counter-based init at std 0.3, plus a perturbation of every element (LayerNorms and
  // biases too) that depends only on the tensor's name and the element's global index, so the TP
  // ranks hold shards of one model.
  Config big = cfg;
  big.model.init_method_std = 0.3;
  VecF master(size_t(layout.total), 0.0f);
  init_params_host(make_param_layout(make_dims(big, c.tp, tp_rank, c.pp, c.pp_rank)), 1234, master.data());
  for (const ParamInfo& p : layout.params) {
    const double phase = double(std::hash<std::string>{}(p.name) % 97);
    test::for_each_box_element(p, [&](int64_t local, int64_t global) {
      master[size_t(p.offset + local)] += 0.1f * float(std::sin(1.7 * double(global) + phase));
    });
  }
  const CBuf params = to_dtype(master);

  // Two stages; the split one allocates weight_grad_stash_bytes more per slot.
  VecF grads_full(size_t(layout.total), 0.0f), grads_split(size_t(layout.total), 0.0f);
  const int64_t a0 = ops->allocated_bytes();
  GPTStage full(d, layout, *ops, tp, params, grads_full.data(), kMicroBatch, kSlots, {c.dtype, c.recompute});
  const int64_t a1 = ops->allocated_bytes();
  GPTStage split(d, layout, *ops, tp, params, grads_split.data(), kMicroBatch, kSlots, {c.dtype, c.recompute, true});
  const int64_t a2 = ops->allocated_bytes();
  const int64_t stash = weight_grad_stash_bytes(d, kMicroBatch, c.dtype);
  const int64_t layers = d.layer_end - d.layer_begin;
  if ((a2 - a1) - (a1 - a0) != kSlots * stash)
    fail.add(where + "the split stage allocates " + std::to_string((a2 - a1) - (a1 - a0)) + " bytes more, not " +
             std::to_string(kSlots) + " x weight_grad_stash_bytes = " + std::to_string(kSlots * stash));
  if (stash != layers * N * (3 * d.Cl + 2 * C + d.Fl) * dtype_bytes(c.dtype))
    fail.add(where + "weight_grad_stash_bytes " + std::to_string(stash) + " != layers N (3 Cl + 2 C + Fl) bytes");

  std::vector<Inputs> in(kSlots);
  for (int m = 0; m < kSlots; ++m) {
    std::mt19937 gen(uint32_t(100 + m));
    std::uniform_int_distribution<int32_t> tok(0, int32_t(d.V) - 1), pos(0, int32_t(d.S) - 1);
    std::normal_distribution<float> nd;
    Inputs& x = in[size_t(m)];
    for (int64_t i = 0; i < N; ++i) {
      x.tokens.push_back(tok(gen));
      x.targets.push_back(tok(gen));
      x.positions.push_back(pos(gen));
      x.weights.push_back(i % 5 == 3 ? 0.0f : 1.0f);
    }
    VecF h(size_t(N * C)), g(size_t(N * C));
    for (float& v : h) v = nd(gen);
    for (float& v : g) v = 0.01f * nd(gen);
    const int64_t r0 = d.local_token_begin(N) * C;
    x.hidden = to_dtype(VecF(h.begin() + r0, h.begin() + r0 + Nt * C));
    x.dout = to_dtype(VecF(g.begin() + r0, g.begin() + r0 + Nt * C));
  }

  // Forward of every slot on both stages, on the last stage the loss right after (as a pipeline).
  std::vector<double> loss[2];
  GPTStage* stages[2] = {&full, &split};
  for (int s = 0; s < 2; ++s)
    for (int m = 0; m < kSlots; ++m) {
      const Inputs& x = in[size_t(m)];
      stages[s]->forward(m, x.tokens.data(), x.hidden, d.position_ids ? x.positions.data() : nullptr);
      if (d.last_stage())
        loss[s].push_back(stages[s]->loss(m, x.targets.data(), 1.0f / float(N), true,
                                          d.loss_mask ? x.weights.data() : nullptr));
    }
  if (loss[0] != loss[1]) fail.add(where + "the two stages' losses differ");

  // layer_done: every layer of the stage, last first
  std::vector<int64_t> want_layers;
  for (int64_t l = d.layer_end; l-- > d.layer_begin;) want_layers.push_back(l);
  std::vector<int64_t> done;
  const std::function<void(int64_t)> record = [&](int64_t l) { done.push_back(l); };
  const CBuf no_dout{};
  auto dout = [&](int m) { return d.last_stage() ? no_dout : in[size_t(m)].dout; };

  // the full backward of each micro-batch, in order
  std::vector<Bytes> dx_full(kSlots), dx_split(kSlots);
  for (int m = 0; m < kSlots; ++m) {
    done.clear();
    full.backward(m, dout(m), record);
    if (done != want_layers) fail.add(where + "the full backward's layer_done order is wrong");
    dx_full[size_t(m)] = bytes_of(full.input_grad(), Nt * C);
  }
  // the split stage's B's and W's
  for (const Step& st : steps(order)) {
    const std::string what = (st.weight ? "W" : "B") + std::to_string(st.mb);
    done.clear();
    if (!st.weight) {
      split.backward(st.mb, dout(st.mb), record, Part::Input);
      if (!done.empty()) fail.add(where + what + " called layer_done");
      dx_split[size_t(st.mb)] = bytes_of(split.input_grad(), Nt * C);
    } else {
      const Bytes before = bytes_of(split.input_grad(), Nt * C);
      split.backward_weight(st.mb, record);
      if (done != want_layers) fail.add(where + what + ": layer_done not every layer, last first");
      if (bytes_of(split.input_grad(), Nt * C) != before) fail.add(where + what + " changed input_grad()");
    }
  }

  // equal bit for bit: the input gradients, every gradient
  for (int m = 0; m < kSlots; ++m)
    if (dx_split[size_t(m)] != dx_full[size_t(m)])
      fail.add(where + "input gradient of micro-batch " + std::to_string(m) + " differs");
  for (const ParamInfo& p : layout.params) {
    const float* a = grads_full.data() + p.offset;
    const float* b = grads_split.data() + p.offset;
    int64_t off = 0;
    double amax = 0;
    for (int64_t i = 0; i < p.numel; ++i) {
      off += std::memcmp(&a[i], &b[i], sizeof(float)) != 0;
      amax = std::max(amax, double(std::fabs(a[i])));
    }
    if (off) fail.add(where + "gradient of " + p.name + " differs in " + std::to_string(off) + " of " +
                      std::to_string(p.numel) + " elements");
    // every gradient is well away from zero, so a missing or doubled part would show
    if (!(amax > 1e-6)) fail.add(where + "gradient of " + p.name + " is ~0: the comparison proves nothing");
  }
}

void check(const Case& c) {
  for (Order o : {Order::AllBThenAllW, Order::ZbH1}) {
    Failures fail;
    if (c.tp == 1) {
      std::unique_ptr<Comm> self = make_self_comm();
      check_rank(c, o, *self, 0, fail);
    } else {
      run_thread_ranks(c.tp, 1, 1, false, [&](Grid& g) { check_rank(c, o, *g.tp_group, g.tp_rank, fail); });
    }
    EXPECT_EQ(fail.count, 0) << c.name << ", " << order_name(o);
  }
}

// One stage with every layer: the embeddings' and the LM head's gradients in B.
TEST(SplitBackward, OneStageEqualsFullBackward) {
  check({.name = "one stage fp32"});
  check({.name = "one stage, reset_position_ids and eod_mask_loss", .position_ids = true, .loss_mask = true});
  check({.name = "one stage bf16", .dtype = DType::BF16});
  check({.name = "one stage selective recompute", .recompute = Recompute::Selective});
  check({.name = "one stage bf16 selective recompute", .dtype = DType::BF16, .recompute = Recompute::Selective});
}

// A middle stage of three (2 layers of 6): the input gradient, no embeddings, no head.
TEST(SplitBackward, MiddleStageEqualsFullBackward) {
  check({.name = "middle stage fp32", .layers = 6, .pp = 3, .pp_rank = 1});
  check({.name = "middle stage bf16 selective", .layers = 6, .pp = 3, .pp_rank = 1, .dtype = DType::BF16,
         .recompute = Recompute::Selective});
}

// TP 2 on thread ranks: the TP sums of B, and with sequence parallelism the all-gathered
// row-parallel output gradients stashed in B and the LayerNorm outputs all-gathered again in W.
TEST(SplitBackward, TensorParallelEqualsFullBackward) {
  check({.name = "TP 2 one stage", .tp = 2});
  check({.name = "TP 2 middle stage bf16", .layers = 6, .tp = 2, .pp = 3, .pp_rank = 1, .dtype = DType::BF16});
  check({.name = "TP 2 SP one stage", .tp = 2, .sp = true});
  check({.name = "TP 2 SP middle stage bf16 selective", .layers = 6, .tp = 2, .sp = true, .pp = 3, .pp_rank = 1,
         .dtype = DType::BF16, .recompute = Recompute::Selective});
  check({.name = "TP 2 SP first of two stages, selective, reset_position_ids", .tp = 2, .sp = true, .pp = 2,
         .recompute = Recompute::Selective, .position_ids = true});
  check({.name = "TP 2 SP last of two stages bf16, eod_mask_loss", .tp = 2, .sp = true, .pp = 2, .pp_rank = 1,
         .dtype = DType::BF16, .loss_mask = true});
}

// A one-stage model's pieces for the constructor and misuse checks.
struct Tiny {
  Config cfg = test::tiny_gpt_config();
  GPTDims d = make_dims(cfg, 1, 0, 1, 0);
  ParamLayout layout = make_param_layout(d);
  std::unique_ptr<Ops> ops = make_cpu_ops(1);
  std::unique_ptr<Comm> comm = make_self_comm();
  VecF params = VecF(size_t(layout.total), 0.0f), grads = VecF(size_t(layout.total), 0.0f);
  std::vector<int32_t> tokens = std::vector<int32_t>(size_t(2 * d.S), 1);
  Tiny() { init_params_host(layout, 1, params.data()); }
  std::unique_ptr<GPTStage> stage(StageOptions o) {
    return std::make_unique<GPTStage>(d, layout, *ops, *comm, params.data(), grads.data(), 2, 2, o);
  }
};

// Full recompute keeps no activations for a later W: the constructor refuses it, naming the keys,
// and allocates nothing. Without split_backward it stays allowed.
TEST(SplitBackward, FullRecomputeIsRefused) {
  Tiny t;
  const int64_t before = t.ops->allocated_bytes();
  try {
    t.stage({DType::F32, Recompute::Full, true});
    ADD_FAILURE() << "no InputError";
  } catch (const InputError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("training.recompute"), std::string::npos) << msg;
    EXPECT_NE(msg.find("parallel.pipeline_schedule: zb-h1"), std::string::npos) << msg;
  }
  EXPECT_EQ(t.ops->allocated_bytes(), before);
  EXPECT_NO_THROW(t.stage({DType::F32, Recompute::Full, false}));
  EXPECT_NO_THROW(t.stage({DType::F32, Recompute::Selective, true}));
}

// Misuse is an InternalError: B without split_backward, W without B, a forward or a second backward
// of a slot whose W has not run. The proper sequence works after it.
TEST(SplitBackward, MisuseIsAnInternalError) {
  Tiny t;
  auto plain = t.stage({});
  plain->forward(0, t.tokens.data(), nullptr);
  plain->loss(0, t.tokens.data(), 1.0f, true);
  EXPECT_THROW(plain->backward(0, nullptr, {}, Part::Input), InternalError);
  auto s = t.stage({DType::F32, Recompute::None, true});
  s->forward(0, t.tokens.data(), nullptr);
  s->loss(0, t.tokens.data(), 1.0f, true);
  EXPECT_THROW(s->backward_weight(0), InternalError);
  s->backward(0, nullptr, {}, Part::Input);
  EXPECT_THROW(s->forward(0, t.tokens.data(), nullptr), InternalError);
  EXPECT_THROW(s->backward(0, nullptr), InternalError);
  s->forward(1, t.tokens.data(), nullptr);  // another slot is free
  s->backward_weight(0);
  EXPECT_THROW(s->backward_weight(0), InternalError);
  s->forward(0, t.tokens.data(), nullptr);
}

// The op under the split: Ops::linear_backward with no dw (B), then with no dinp (W), adds what
// one call adds -- dinp, dw and dbias bit for bit, with and without the GELU derivative, in fp32 and
// bf16; and the bias gradient may go with either half.
TEST(SplitBackward, LinearBackwardInTwoCallsEqualsOneCall) {
  std::unique_ptr<Ops> ops = make_cpu_ops(2);
  const int64_t N = 12, I = 20, O = 28;
  std::mt19937 gen(5);
  std::normal_distribution<float> nd;
  auto randv = [&](int64_t n) {
    VecF v(static_cast<size_t>(n));
    for (float& x : v) x = nd(gen);
    return v;
  };
  for (DType t : {DType::F32, DType::BF16})
    for (bool gelu : {false, true})
      for (bool bias_with_dx : {false, true}) {
        SCOPED_TRACE(std::string(t == DType::F32 ? "fp32" : "bf16") + (gelu ? " +dGELU" : "") +
                     (bias_with_dx ? ", dbias with dX" : ", dbias with dW"));
        Owned owned{*ops, {}};
        auto buf = [&](const VecF& v) {
          Buf b = ops->alloc(int64_t(v.size()), t);
          ops->convert(b, v.data(), int64_t(v.size()));
          owned.p.push_back(b.p);
          return b;
        };
        const Buf dout = buf(randv(N * O)), inp = buf(randv(N * I)), w = buf(randv(O * I)), pre = buf(randv(N * I));
        const CBuf gelu_pre = gelu ? CBuf(pre) : CBuf{};
        const VecF dw0 = randv(O * I), db0 = randv(O);  // accumulated into
        VecF dw1 = dw0, db1 = db0, dw2 = dw0, db2 = db0;
        const Buf dx1 = buf(VecF(size_t(N * I))), dx2 = buf(VecF(size_t(N * I)));
        ops->linear_backward(dx1, dw1.data(), db1.data(), dout, inp, w, N, I, O, false, gelu_pre);
        ops->linear_backward(dx2, nullptr, bias_with_dx ? db2.data() : nullptr, dout, CBuf{}, w, N, I, O, false,
                             gelu_pre);
        ops->linear_backward(Buf{}, dw2.data(), bias_with_dx ? nullptr : db2.data(), dout, inp, CBuf{}, N, I, O, false);
        EXPECT_EQ(bytes_of(dx1, N * I), bytes_of(dx2, N * I));
        EXPECT_EQ(bytes_of(dw1.data(), O * I), bytes_of(dw2.data(), O * I));
        EXPECT_EQ(bytes_of(db1.data(), O), bytes_of(db2.data(), O));
        EXPECT_NE(bytes_of(dw1.data(), O * I), bytes_of(dw0.data(), O * I));
      }
}

}  // namespace
}  // namespace tpt
