// What GPTStage's selective recompute reruns in backward besides the norms (the layernorm module, in
// gpt.cpp): the attention core, and with the mlp module a dense layer's fc1 output and activation.
#include "core/error.h"
#include "model/block.h"
#include "model/gpt.h"
#include "parallel/context_parallel.h"

namespace tpt {

// Scores, softmax and the weighted sum of values: what selective recompute reruns in backward.
void GPTStage::attention_core_forward(BlockActs& a) {
  const GPTDims& d = d_;
  if (ring_) ring_->forward(a.atty, a.lse, a.qkv);  // context parallelism: over the CP group's whole sequence
  else ops_.attention_forward(a.atty, a.lse, a.qkv, B_, d.S, d.Hl, d.kv_heads, d.D);  // lse stays fp32
}

// The mlp module (training.recompute_modules: mlp, Megatron's): the layer's MLP forward up to fc2's
// input again -- the same calls on the same values as block_forward's, so the same bits: ln2 (rerun from
// the kept residual and statistics where the layer kept only its FP8 codes, or with the layernorm module
// unless the caller reran it), gathered over TP as the forward gathers it (16-bit, or as FP8 codes in the
// GEMM), fc1 with its bias, the activation; an FP8 layer quantizes with the step's scales (delayed: the
// amax it records again is the one recorded, a max) and writes its saved codes again -- the activation's
// (GPTDims::fp8_saved_inputs' act) are made by fc2's forward cast, so that layer runs fc2's forward too
// (into tmp_, unread), as Megatron's mlp module reruns the whole MLP.
void GPTStage::rerun_mlp(int64_t layer, BlockActs& a, const BlockParams<CBuf>& w, bool ln2_ready) {
  const GPTDims& d = d_;
  TPT_CHECK(!d.keeps_mlp(opt_.recompute, layer));
  const int64_t N = B_ * d.S, Nt = d.local_tokens(N);
  if (!ln2_ready && (a.ln2_q || !d.keeps_norms(opt_.recompute)))
    d.norm.forward(ops_, a.ln2, a.ln2_stats, a.x_mid, w.weight[kLn2], w.bias[kLn2], Nt, d.C);
  Fp8Linear* fp8 = fp8_for(layer, kFc1);
  const Fp8TokenGather* codes = fp8 ? fp8_gather(layer) : nullptr;
  d.mlp.forward(ops_, a.gelu, a.fc1, codes ? CBuf(a.ln2) : gather_tokens(a.ln2, tmp_), w.weight[kFc1], w.bias[kFc1],
                N, d.C, d.Fl, fp8, a.ln2_q, codes);
  if (a.act_q) linear_forward(ops_, fp8_for(layer, kFc2), tmp_, a.gelu, w.weight[kFc2], nullptr, N, d.Fl, d.C, {}, a.act_q);
}

}  // namespace tpt
