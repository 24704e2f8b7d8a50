// The backend interface (docs/ARCHITECTURE.md "Backends and communicators"): every kernel the model and optimizer
// need, on memory that lives on the backend's device. Model code is written once against it;
// core/cpu implements it with OpenBLAS + OpenMP, core/cuda with cuBLASLt + custom kernels.
//
// Storage (docs/ARCHITECTURE.md "Numerics"). Each tensor is stored in its own dtype:
//   - the compute dtype of the run (fp32, bf16 or fp16): activations, activation gradients, the
//     compute copy of the weights, logits, pipeline messages, TP sums. These arguments are `Buf`
//     (written) / `CBuf` (read): a device pointer and the dtype of its elements.
//   - the gradient buffer's dtype (the main grads: fp32, or bf16 with parallel.grad_reduce_in_bf16):
//     the weight gradients a call adds to ("+=" below: fp32 sum of the stored value and the call's
//     contribution, rounded once), Buf / CBuf as above.
//   - fp32 always: master weights, Adam moments, LayerNorm statistics, the attention log-sum-exp,
//     losses and the cross-entropy's row statistics. These arguments are plain `float*`.
// Every kernel computes in fp32: it converts 16-bit values as it loads them and rounds (nearest
// even, core/dtype.h) once as it stores its result. The compute-dtype arguments of one call all
// have the same dtype. A `float*` converts implicitly to a Buf / CBuf of dtype F32.
// Shapes in comments: N = rows (tokens), C = features. Gradients marked "+=" accumulate.
#pragma once
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/fp8.h"
#include "core/math.h"

namespace tpt {

// A typed device pointer: `p` holds elements of type `t`. Arithmetic is in elements.
struct Buf {
  void* p = nullptr;
  DType t = DType::F32;
  Buf() = default;
  Buf(std::nullptr_t) {}
  Buf(float* f) : p(f) {}  // NOLINT: fp32 buffers are Bufs
  Buf(void* ptr, DType type) : p(ptr), t(type) {}
  Buf operator+(int64_t elements) const { return {static_cast<char*>(p) + elements * dtype_bytes(t), t}; }
  explicit operator bool() const { return p != nullptr; }
  float* f32() const { return t == DType::F32 ? static_cast<float*>(p) : nullptr; }
};

struct CBuf {
  const void* p = nullptr;
  DType t = DType::F32;
  CBuf() = default;
  CBuf(std::nullptr_t) {}
  CBuf(const float* f) : p(f) {}  // NOLINT
  CBuf(const Buf& b) : p(b.p), t(b.t) {}  // NOLINT
  CBuf(const void* ptr, DType type) : p(ptr), t(type) {}
  CBuf operator+(int64_t elements) const {
    return {static_cast<const char*>(p) + elements * dtype_bytes(t), t};
  }
  explicit operator bool() const { return p != nullptr; }
  const float* f32() const { return t == DType::F32 ? static_cast<const float*>(p) : nullptr; }
};

// Bytes of n elements of t, and the same in 4-byte words (the unit of Comm's buffers; a 16-bit
// message of odd length ends in half a word of padding, which every allocation has room for).
inline int64_t dtype_size(int64_t n, DType t) { return n * dtype_bytes(t); }
inline int64_t words_of(int64_t n, DType t) { return (dtype_size(n, t) + 3) / 4; }

// Context parallelism's token layout (parallel/context_parallel.h): a rank's T = 2c tokens of a
// sequence are two chunks of c, local token t at global position chunks[t / c] * c + t % c -- the
// queries' q_chunks, the keys' k_chunks (the ring's current block). CP 1: {0, 1} for both.
struct RingBlock {
  int64_t c = 0;
  int64_t q_chunks[2] = {0, 1};
  int64_t k_chunks[2] = {0, 1};
  bool first = false;  // forward: out and lse hold nothing yet (written, not merged); every query sees a key
  // How many keys of each key chunk query t sees (causal: key position <= query position); they are
  // the first n[j] tokens of chunk j, local keys [j c, j c + n[j]).
  TPT_HOST_DEVICE void visible(int64_t t, int64_t n[2]) const {
    const int64_t qpos = q_chunks[t / c] * c + t % c;
    for (int j = 0; j < 2; ++j) {
      const int64_t m = qpos - k_chunks[j] * c + 1;
      n[j] = m < 0 ? 0 : m > c ? c : m;
    }
  }
};

// One FP8 operand of Ops::fp8_linear_*: codes (rows, cols) of format t, each read as its fp32 value times
// *scale_inv (one fp32 on the device: 1 / the scale it was quantized with, core/fp8.h); with blocks
// (block_rows > 0, Ops::fp8_quantize_blocks) times the scale_inv of its block: element (r, c) of the
// row-major (rows, cols) codes reads scale_inv[(r / block_rows) * ceil(cols / block_cols) + c / block_cols].
// t_codes (optional): the same codes transposed, (cols, rows) -- Transformer Engine's columnwise copy: a
// weight's, kept with its codes once per step, or an output gradient's or input's, made in their cast
// (Ops::fp8_cast_transpose, fp8_quantize_blocks transposed) -- which a GEMM that reads the operand
// transposed takes instead of transposing the codes itself (the scales stay as for codes). Either may be
// null where no GEMM reads that layout (the weight gradient's input: t_codes alone).
struct Fp8Operand {
  const uint8_t* codes = nullptr;
  Fp8Type t = Fp8Type::E4M3;
  const float* scale_inv = nullptr;
  int64_t block_rows = 0, block_cols = 0, cols = 0;
  const uint8_t* t_codes = nullptr;
  explicit operator bool() const { return codes != nullptr || t_codes != nullptr; }
};

// One entry of the multi-tensor optimizer calls (Ops::grad_stats, Ops::adamw_segments): n fp32
// elements at `offset` in the buffers laid out as the parameters (gradients, compute copy, unsharded
// master weights) and at `local` in the owned arrays (moments, sharded master weights). flag: counted
// in the norm (grad_stats), weight decay (adamw_segments).
struct TensorSegment {
  int64_t offset = 0, local = 0, n = 0;
  bool flag = false;
  int tensor = 0;  // adamw_segments with scaled states: the tensor's index in the scale tables
};
// The gradient-norm reduction's result: the squared sum over the flagged segments (in double) and
// whether any segment, flagged or not, holds an inf or a nan.
struct GradStats {
  double sum_squares = 0;
  bool nonfinite = false;
};
// The backend's own device memory besides alloc_bytes (the CUDA backend's; the CPU backend keeps
// none): sizes in bytes (core/gpu_workspace.h has the functions of the shapes).
struct BackendWorkspace {
  int64_t gemm = 0;       // cuBLASLt's workspace
  int64_t attention = 0;  // cuDNN's fused-attention workspace (forward and backward share it)
  int64_t scratch = 0;    // reductions: column sums, the gradient norm, the word-embedding gradient's sort
  int64_t bias_grad = 0;  // the bias-gradient GEMM epilogue's output
  int64_t fallback = 0;   // fp32 GEMM products where cuBLASLt offers no GELU epilogue or FP8 GEMM (not planned)
  int64_t fp8 = 0;        // cuBLASLt's FP8 GEMMs: transposed codes and block scales (core/gpu_workspace.h)
  int64_t total() const { return gemm + attention + scratch + bias_grad + fallback + fp8; }
  // reserve_workspace's report: the workspace the fused attention's plans for the shape asked for,
  // forward and backward (-1: no plan, the backend's own kernels run it)
  int64_t attention_forward_asked = -1, attention_backward_asked = -1;
};
// A run's attention calls (every layer's the same shape): B sequences of T tokens, H query and KV
// key / value heads of D channels, in dtype t. B == 0: none through the fused attention.
struct AttentionShape {
  int64_t B = 0, T = 0, H = 0, KV = 0, D = 0;
  DType t = DType::F32;
  bool ring = false;  // context parallelism: the ring blocks' (attention_block_*), T the rank's 2 chunks
};

// The buffers of one AdamW step: master (the master weights, indexed by local when master_sharded,
// else by offset), grads (by offset), the moments m and v (by local), compute (by offset; null or the
// bf16 / fp16 / fp32 compute copy that receives the updated weights in its dtype: master_copy_bits,
// core/dtype.h). With remainders (optimizer.store_param_remainders; compute is bf16, master null)
// the fp32 master weight is master_from_remainder(compute, remainder), remainders indexed as master.
// m, v and master are states in F32, BF16 (moments only) or F16 scaled per tensor (core/math.h
// load_state / store_state; the precision-aware optimizer). With an F16 state, scales holds each
// tensor's three decoding scales (3 t + 0: m, + 1: v, + 2: master; TensorSegment::tensor = t) and a
// step is two passes (Ops::adamw_segments, then Ops::adamw_store_scaled) around a reduction of amax.
struct AdamWBuffers {
  Buf master;
  bool master_sharded = false;
  CBuf grads;
  Buf m, v;
  Buf compute;
  uint16_t* remainders = nullptr;
  const float* scales = nullptr;  // device, 3 per tensor
  float* amax = nullptr;          // device, 3 per tensor: written by adamw_segments
  int tensors = 0;                // the tables' length / 3
  bool scaled() const { return master.t == DType::F16 || m.t == DType::F16 || v.t == DType::F16; }
};

class Ops {
 public:
  virtual ~Ops() = default;
  virtual std::string name() const = 0;

  // ---- memory on the device
  // `bytes` zeroed bytes (the allocation accounting rounds each one up: 64 B on the CPU, 256 on a GPU).
  virtual void* alloc_bytes(size_t bytes) = 0;
  virtual void free(void* p) = 0;
  float* alloc(size_t n) { return static_cast<float*>(alloc_bytes(n * sizeof(float))); }  // n floats
  Buf alloc(int64_t n, DType t) { return {alloc_bytes(size_t(dtype_size(n, t))), t}; }
  // `bytes` zeroed bytes of host memory that to_host / to_device copy to and from directly (the CUDA
  // backend's is page-locked), for buffers that live on the host (checkpoint staging). Not device
  // memory: neither allocated_bytes() nor allocator_calls() counts it.
  virtual void* alloc_host(size_t bytes) { return std::calloc(std::max<size_t>(bytes, 1), 1); }
  virtual void free_host(void* p) { std::free(p); }
  // n elements (of dst.t == src.t); device to device, device to host, host to device.
  virtual void zero(Buf p, int64_t n) = 0;
  virtual void copy(Buf dst, CBuf src, int64_t n) = 0;
  virtual void to_host(void* host, CBuf dev, int64_t n) = 0;
  virtual void to_device(Buf dev, const void* host, int64_t n) = 0;
  // dst (n) = src (n) converted to dst.t (rounded to nearest even when narrowing).
  virtual void convert(Buf dst, CBuf src, int64_t n) = 0;
  // dst (n) = the compute copy of the fp32 master weights master (n) in dst.t, as an optimizer step
  // writes it (core/dtype.h master_copy_bits: bf16 ties away from zero).
  virtual void master_copy(Buf dst, const float* master, int64_t n) = 0;

  // ---- GEMMs: fp32 accumulation of the products of the stored values
  // out (N, O) = inp (N, I) @ w(O, I)^T + bias(O) [bias may be null].
  // With gelu_pre (N, O): gelu_pre = inp @ w^T + bias and out = gelu(that fp32 value): the GELU of
  // fc1 fused into its GEMM (cuBLASLt's GELU_AUX_BIAS epilogue); both are stored rounded.
  virtual void linear_forward(Buf out, CBuf inp, CBuf w, CBuf bias, int64_t N, int64_t I, int64_t O,
                              Buf gelu_pre = {}) = 0;
  // dinp (N, I) = / += dout (N, O) @ w (O, I)  (accumulate_dinp chooses; dinp may be null);
  // dw (O, I) += dout^T @ inp, straight into the fp32 gradient (gradient-accumulation fusion) [dw
  // may be null: no weight GEMM, and inp is not read];
  // dbias (O) += column sums of dout [dbias may be null].
  // Each part is the same whatever else the call computes, so one call with dinp only and a later
  // one with dw (and dbias) only add exactly what one call with all of them adds: ZB-H1's split
  // backward (GPTStage::BackwardPart).
  // With gelu_pre (N, I), the pre-activation whose GELU was `inp` of the layer that produced
  // dout's input: dinp = (dout @ w) * gelu'(gelu_pre), the fp32 product rounded once (cuBLASLt's
  // DGELU epilogue); accumulate_dinp must then be false.
  virtual void linear_backward(Buf dinp, Buf dw, Buf dbias, CBuf dout, CBuf inp, CBuf w, int64_t N,
                               int64_t I, int64_t O, bool accumulate_dinp, CBuf gelu_pre = {}) = 0;

  // ---- rows
  // out (N, C) = LN(inp) * w + b; stores mean (N), rstd (N).
  virtual void layernorm_forward(Buf out, float* mean, float* rstd, CBuf inp, CBuf w, CBuf b, int64_t N,
                                 int64_t C, float eps) = 0;
  // The residual add and the next LayerNorm in one pass: res (N, C) = a + b (stored rounded), then
  // out = LN(res as stored) * w + bias with its mean and rstd. res may alias a.
  virtual void residual_layernorm_forward(Buf res, Buf out, float* mean, float* rstd, CBuf a, CBuf b, CBuf w,
                                          CBuf bias, int64_t N, int64_t C, float eps) = 0;
  // dinp (N, C) += ; dw, db (C) +=
  virtual void layernorm_backward(Buf dinp, Buf dw, Buf db, CBuf dout, CBuf inp, CBuf w, const float* mean,
                                  const float* rstd, int64_t N, int64_t C) = 0;
  // RMSNorm (model.normalization: RMSNorm): out (N, C) = inp * rstd * w with rstd (N) = 1 / sqrt(mean(inp^2) +
  // eps), in fp32; no bias. The residual form as residual_layernorm_forward (res may alias a).
  virtual void rmsnorm_forward(Buf out, float* rstd, CBuf inp, CBuf w, int64_t N, int64_t C, float eps) = 0;
  virtual void residual_rmsnorm_forward(Buf res, Buf out, float* rstd, CBuf a, CBuf b, CBuf w, int64_t N, int64_t C,
                                        float eps) = 0;
  // dinp (N, C) += ; dw (C) +=
  virtual void rmsnorm_backward(Buf dinp, Buf dw, CBuf dout, CBuf inp, CBuf w, const float* rstd, int64_t N,
                                int64_t C) = 0;

  // Causal attention, flash-style: nothing of size T x T outlives a call. qkv (B, T, (H + 2 KV) D): per
  // token the H query heads, then the KV key heads, then the KV value heads, D values each (KV = H:
  // (B, T, 3, H, D), multi-head attention); query head h attends with key/value head h / (H / KV)
  // (grouped-query attention; H % KV == 0), scaled by 1/sqrt(D). out (B, T, H*D); lse (B, H, T) the
  // log-sum-exp of each query's scaled scores over the keys it sees, which is all backward needs to
  // rebuild the probabilities.
  virtual void attention_forward(Buf out, float* lse, CBuf qkv, int64_t B, int64_t T, int64_t H, int64_t KV,
                                 int64_t D) = 0;
  // dqkv (B, T, (H + 2 KV) D) = (a key/value head's gradient sums over its H / KV query heads); from
  // the forward's qkv, out and lse; scratch (B, H, T)
  virtual void attention_backward(Buf dqkv, float* scratch, CBuf dout, CBuf qkv, CBuf out, const float* lse,
                                  int64_t B, int64_t T, int64_t H, int64_t KV, int64_t D) = 0;
  // Grouped-query attention's QKV layouts: grouped (N, G, Q + 2, D) -- Megatron's: per group its Q query
  // heads, then its key, then its value -- and heads (N, (G Q + 2 G) D) -- all query heads, all keys,
  // all values: what attention_forward reads. to_heads: grouped -> heads, else heads -> grouped.
  virtual void qkv_regroup(Buf out, CBuf in, int64_t N, int64_t G, int64_t Q, int64_t D, bool to_heads) = 0;
  // Rotary position embedding (model.position_embedding_type: rope), in place on the query and key heads
  // of qkv (N, (H + 2 KV) D) (the heads layout above; values untouched): in each head the first `rot`
  // channels are rotated in pairs, (j, j + rot/2) (rotate-half: HF, Megatron) or (2j, 2j + 1)
  // (interleaved: Meta, llm.c), pair j by the angle pos * inv_freq[j] (fp32 product; cos and sin in
  // fp32). inv_freq (rot/2) fp32 on the device; positions (N) on the device, or null: token n of the
  // flattened (B, S) rows is at position n % S. inverse: rotate by -angle (the backward, on gradients).
  virtual void rope(Buf qkv, const float* inv_freq, const int32_t* positions, int64_t N, int64_t S, int64_t H,
                    int64_t KV, int64_t D, int64_t rot, bool interleaved, bool inverse) = 0;

  // ---- context parallelism's ring attention (parallel/context_parallel.h): one block of it -- the
  // queries of this rank's qkv (B, T, (H + 2 KV) D) against the keys and values kv (B, T, 2 KV D) of
  // one CP rank (per token its KV key heads, then its KV value heads: the last 2 KV D columns of that
  // rank's qkv), causal by the tokens' global positions (RingBlock). Forward merges the block into the
  // running out (B, T, H D) fp32 and lse (B, H, T) (-inf before the first block) by the online
  // softmax rule; a query that sees no key of the block is left as it is.
  virtual void attention_block_forward(float* out, float* lse, CBuf qkv, CBuf kv, int64_t B, int64_t T, int64_t H,
                                       int64_t KV, int64_t D, const RingBlock& blk) = 0;
  // Backward of that block from the final out (B, T, H D) (as stored) and lse (B, H, T) of every
  // block: dq (B, T, H D) += and dkv (B, T, 2 KV D) += the block's part (fp32), dout (B, T, H D).
  virtual void attention_block_backward(float* dq, float* dkv, CBuf dout, CBuf out, const float* lse, CBuf qkv,
                                        CBuf kv, int64_t B, int64_t T, int64_t H, int64_t KV, int64_t D,
                                        const RingBlock& blk) = 0;
  // dst rows (rows, cols) with row stride dst_stride = src rows with stride src_stride, converted to
  // dst.t: the ring's K/V columns out of qkv and its gradients back in. By default a convert per row.
  virtual void copy_rows(Buf dst, int64_t dst_stride, CBuf src, int64_t src_stride, int64_t rows, int64_t cols) {
    for (int64_t r = 0; r < rows; ++r) convert(dst + r * dst_stride, src + r * src_stride, cols);
  }

  // ---- element-wise
  virtual void gelu_forward(Buf out, CBuf inp, int64_t n) = 0;
  // dinp = dout * gelu'(inp)
  virtual void gelu_backward(Buf dinp, CBuf dout, CBuf inp, int64_t n) = 0;
  // SwiGLU (model.swiglu): inp (N, 2F) rows [gate (F) | up (F)] (fc1's output) -> out (N, F) =
  // silu(gate) * up, computed in fp32, rounded once.
  virtual void swiglu_forward(Buf out, CBuf inp, int64_t N, int64_t F) = 0;
  // dinp (N, 2F) = [dout * up * silu'(gate) | dout * silu(gate)]
  virtual void swiglu_backward(Buf dinp, CBuf dout, CBuf inp, int64_t N, int64_t F) = 0;
  // out = a + b
  virtual void add(Buf out, CBuf a, CBuf b, int64_t n) = 0;
  // y += x
  virtual void accumulate(Buf y, CBuf x, int64_t n) = 0;
  // out (n) = sum over r < k of parts (k, n) row r, added in fp32 in the order r = 0, 1, ...
  // and rounded once: the 16-bit tensor-parallel sum (parallel/tensor_parallel.h).
  virtual void sum_parts(Buf out, CBuf parts, int k, int64_t n) = 0;
  virtual void scale(Buf x, float s, int64_t n) = 0;
  // FP8 (docs/FP8.md): out (n) = the E4M3 / E5M2 codes of fp32(in * *scale) (core/fp8.h: nearest even,
  // saturated), and *amax = max(*amax, max |in|) (core/fp8.h fp8_amax_step: a NaN in in makes it a NaN);
  // Transformer Engine's fused cast + amax. scale and amax: one fp32 each on the device. out null:
  // the amax alone (scale unread; current scaling's first pass, whose codes nothing reads).
  virtual void fp8_quantize(uint8_t* out, CBuf in, int64_t n, Fp8Type t, const float* scale, float* amax) = 0;
  // The same for in (rows, cols) in one pass, writing its codes as out (rows, cols) and / or transposed
  // as out_t (cols, rows) (either may be null): Transformer Engine's cast + transpose, the rowwise and
  // columnwise copies of a GEMM input that two GEMMs read along different dimensions (docs/FP8.md).
  virtual void fp8_cast_transpose(uint8_t* out, uint8_t* out_t, CBuf in, int64_t rows, int64_t cols, Fp8Type t,
                                  const float* scale, float* amax) = 0;
  // Current scaling's scales from the reduced amaxes, on the device (no read to the host): for i < n
  // (at most kFp8MaxScales), scale[i] = core/fp8.h fp8_scale_from_amax(amax[i], 1, t[i], margin) and
  // scale_inv[i] = 1 / scale[i].
  static constexpr int kFp8MaxScales = 4;
  // out (cols, rows) = in (rows, cols) transposed, FP8 codes (a kept weight's columnwise copy).
  virtual void fp8_transpose(uint8_t* out, const uint8_t* in, int64_t rows, int64_t cols) = 0;
  virtual void fp8_current_scales(float* scale, float* scale_inv, const float* amax, const Fp8Type* t, int n,
                                  int margin) = 0;
  // Blockwise (docs/FP8.md "Blockwise scaling"): in (rows, cols) in blocks of (block_rows, block_cols)
  // (the last ones cut by the edges); each block's codes with its own scale core/fp8.h fp8_block_scale
  // (its amax, margin, a power of two), scale_inv (one per block, row-major over the block grid) = 1 /
  // that scale. No amax leaves the call: blocks never span ranks. transposed: out holds the codes as
  // (cols, rows), the columnwise copy (the scales as without).
  virtual void fp8_quantize_blocks(uint8_t* out, CBuf in, int64_t rows, int64_t cols, int64_t block_rows,
                                   int64_t block_cols, Fp8Type t, int margin, float* scale_inv, bool transposed) = 0;
  // The same in parts (blockwise FP8 parameters, docs/FP8.md "FP8 parameters": a weight's parts cast by the
  // ranks owning them): in holds elements [at, at + n) of a row-major matrix of `cols` columns. block_amax:
  // amax[b] = max(amax[b], |in| over the part's elements of block b) (core/fp8.h fp8_amax_step, the blocks'
  // grid row-major as above). quantize_given_blocks: out (n) = the codes of in * (1 / scale_inv[b]) with b
  // the block of each element (scale_inv: 1 / a power-of-two fp8_block_scale, so 1 / scale_inv is it again).
  virtual void fp8_block_amax(float* amax, CBuf in, int64_t at, int64_t n, int64_t cols, int64_t block_rows,
                              int64_t block_cols) = 0;
  virtual void fp8_quantize_given_blocks(uint8_t* out, CBuf in, int64_t at, int64_t n, int64_t cols, int64_t block_rows,
                                         int64_t block_cols, Fp8Type t, const float* scale_inv) = 0;
  // FP8 GEMMs (docs/FP8.md "GEMM path"): linear_forward / linear_backward with FP8 operands, fp32
  // accumulation, outputs as there (out, gelu_pre, dinp in their dtype, rounded once; dw fp32 +=).
  // CPU: exact emulation -- each operand decoded and multiplied by its scale_inv in fp32, then the fp32
  // GEMM; CUDA: cuBLASLt's FP8 matmul, or that emulation where cuBLASLt has none (core/cuda/fp8_gemm.h).
  // out (N, O) = inp (N, I) @ w (O, I)^T + bias (O) [bias may be null; gelu_pre as linear_forward].
  virtual void fp8_linear_forward(Buf out, Fp8Operand inp, Fp8Operand w, CBuf bias, int64_t N, int64_t I, int64_t O,
                                  Buf gelu_pre = {}) = 0;
  // dinp (N, I) = / += dout (N, O) @ w (O, I) [with gelu_pre: times gelu'(gelu_pre), accumulate_dinp false];
  // dw (O, I) += dout^T @ inp. dinp or dw may be null (then w, or inp, is not read). Bias gradients come
  // from the unquantized output gradient: linear_backward with dbias only.
  virtual void fp8_linear_backward(Buf dinp, Buf dw, Fp8Operand dout, Fp8Operand inp, Fp8Operand w, int64_t N,
                                   int64_t I, int64_t O, bool accumulate_dinp, CBuf gelu_pre = {}) = 0;

  // ---- Mixture-of-Experts token movement (model/moe.h): rows moved by index lists on the device, in
  // fp32 with one rounding per stored element, each output row written by one pass in a fixed order
  // (no atomics: bitwise reproducible). An index < 0 stands for no row (a dropped token).
  // out (R, C): row r = in row idx[r], times scale[r] when scale is given (idx[r] < 0: zeros). The
  // dispatcher's permutation (tokens -> expert-sorted rows) and its backward's weighted gather.
  virtual void gather_rows(Buf out, CBuf in, const int32_t* idx, const float* scale, int64_t R, int64_t C) = 0;
  // out (N, C): row t = (accumulate ? out row t : 0) + sum over j < K of w[t K + j] * in row idx[t K + j]
  // (w null: 1), added in fp32 in the order j = 0, 1, ... and rounded once. The unpermutation (an
  // expert output row back to its token, weighted by its routing probability) and the
  // permutation's backward.
  virtual void combine_rows(Buf out, CBuf in, const int32_t* idx, const float* w, int64_t N, int64_t K, int64_t C,
                            bool accumulate) = 0;
  // out (N K) fp32: out[t K + j] = dot(a row t, b row idx[t K + j]) in fp32 (0 where idx < 0): the
  // routing probabilities' gradient from the unpermutation's output gradient a and the expert rows b.
  virtual void row_dots(float* out, CBuf a, CBuf b, const int32_t* idx, int64_t N, int64_t K, int64_t C) = 0;

  // ---- embeddings
  // Vocab-parallel embedding: out (N, C) = wte rows for tokens in [v0, v0 + rows), 0 elsewhere.
  virtual void embedding_forward(Buf out, const int32_t* tokens, CBuf wte, int64_t N, int64_t C, int64_t v0,
                                 int64_t rows) = 0;
  // dwte (rows, C) += dout rows of tokens in range
  virtual void embedding_backward(Buf dwte, const int32_t* tokens, CBuf dout, int64_t N, int64_t C, int64_t v0,
                                  int64_t rows) = 0;
  // out (B, T, C) += wpe (T, C) broadcast over B
  virtual void add_position_embedding(Buf out, CBuf wpe, int64_t B, int64_t T, int64_t C) = 0;
  // dwpe (T, C) += sum over B of dout (B, T, C)
  virtual void position_embedding_backward(Buf dwpe, CBuf dout, int64_t B, int64_t T, int64_t C) = 0;
  // dbias (C) += column sums of dout (N, C): a bias gradient outside a GEMM (the row-parallel
  // bias under sequence parallelism). CPU: the rows added in order, as position_embedding_backward
  // with T = 1; GPU: the fixed-order column-sum kernel of the GEMMs' bias gradients.
  virtual void bias_backward(Buf dbias, CBuf dout, int64_t N, int64_t C) = 0;

  // ---- vocab-parallel cross-entropy on a logits shard (N, Vl) whose column j is vocabulary id v0 + j;
  // ids >= valid_vocab are padding and masked out. Three passes over the logits, with the TP
  // reductions between them; the row statistics are fp32 (N).
  // Pass 1: row maxima over valid columns (-inf if none) and the target logit if the target lies
  // in this shard (else 0).
  virtual void xent_local_max(float* row_max, float* target_logit, CBuf logits, const int32_t* targets, int64_t N,
                              int64_t Vl, int64_t v0, int64_t valid_vocab) = 0;
  // Pass 2 (after max is reduced over TP): sum_exp (N) = sum over valid columns exp(l - max).
  virtual void xent_local_sumexp(float* sum_exp, CBuf logits, const float* row_max, int64_t N, int64_t Vl,
                                 int64_t v0, int64_t valid_vocab) = 0;
  // Pass 3 (after sum_exp, target_logit reduced): losses (N) = log(sum_exp) + max - target; if
  // want_grad, the logits are overwritten in place by dlogits = (softmax - onehot) * dloss_scale
  // (0 on padding), the softmax recomputed as exp(l - max) / sum_exp. row_weight (N), if given,
  // weighs each row (data.eod_mask_loss): losses[n] = w * loss (exactly 0 where w = 0, whatever the
  // loss) and dlogits scaled by dloss_scale * w.
  virtual void xent_loss_grad(Buf logits, float* losses, const float* row_max, const float* sum_exp,
                              const float* target_logit, const int32_t* targets, int64_t N, int64_t Vl, int64_t v0,
                              int64_t valid_vocab, float dloss_scale, bool want_grad,
                              const float* row_weight = nullptr) = 0;

  // ---- norms and the optimizer (fp32)
  // Whether x holds an inf or a nan.
  virtual bool has_nonfinite(CBuf x, int64_t n) = 0;
  // sum of squares of x (n), in double.
  virtual double sum_squares(CBuf x, int64_t n) = 0;
  // AdamW over a contiguous range; decay applies weight decay to the whole range. compute (n), if
  // given, receives the updated p in its dtype: the compute copy of bf16/fp16 runs, in the same pass
  // (master_copy_bits: bf16 ties away from zero, core/dtype.h).
  // Each gradient is multiplied by grad_scale (the gradient clip, rounded to fp32) before the update,
  // exactly as scale() would have left it in the buffer.
  virtual void adamw(float* p, CBuf g, float* m, float* v, int64_t n, const AdamWParams& a, bool decay,
                     Buf compute, float grad_scale = 1.0f) = 0;
  // The optimizer step as multi-tensor work (model/optimizer.h; the GPU runs each as one launch with
  // the table as its argument, and grad_stats with one read to the host). The defaults go segment by
  // segment through the calls above: grad_stats adds the flagged segments' sum_squares in table
  // order, and checks every segment with has_nonfinite; adamw_segments runs adamw on each segment
  // (a backend steps master weights held as remainders, and 16-bit states, itself: the default
  // refuses them).
  // With scaled fp16 states (b.scaled()) a step is two passes over the same table, the second
  // recomputing the first's fp32 values from the states as they were (the gradients are not
  // touched in between): adamw_segments writes b.amax (zeroed first: per tensor and state, the
  // largest |new value|) and a master that is not F16 with its compute copy; adamw_store_scaled
  // the moments (F16 with new_scales, device, laid out as b.scales: fp16 codes of x *
  // fp16_state_rscale), an F16 master and its compute copy of the master as stored (its code times
  // its new scale), so that a resumed run computes with the same weights.
  virtual GradStats grad_stats(CBuf grads, const std::vector<TensorSegment>& segments);
  virtual void adamw_segments(const AdamWBuffers& b, const std::vector<TensorSegment>& segments,
                              const AdamWParams& a, float grad_scale);
  virtual void adamw_store_scaled(const AdamWBuffers& b, const std::vector<TensorSegment>& segments,
                                  const AdamWParams& a, float grad_scale, const float* new_scales);

  // Allocation accounting (tptrain plan's check against plan/memory.h): bytes currently held by
  // alloc_bytes() as the allocator rounds them, and the most held at once since the backend was made.
  virtual int64_t allocated_bytes() const = 0;
  virtual int64_t peak_allocated_bytes() const = 0;
  // Sizes the backend's own device buffers before the first iteration, so that no iteration
  // allocates or frees device memory (a cudaFree waits for the whole device): at least `planned`
  // (the plan's count, plan/memory.h), and fused attention's workspace as its plans for `attention`
  // ask (built now, queried). Buffers only grow; returns what the backend holds now (a call with
  // zeros reads it). The CPU backend holds none.
  virtual BackendWorkspace reserve_workspace(const BackendWorkspace& planned, const AttentionShape& attention);
  // Calls of the device allocator so far (alloc_bytes, free, and growth of the backend's own
  // buffers): the trainer checks that iterations after the first make none.
  virtual int64_t allocator_calls() const = 0;

  // ---- timing for the op profile (core/op_profile.h). mark() records a point in this backend's
  // stream of work and returns its id (0, 1, ... since the last clear_marks()); mark_ms(id) waits
  // for the work before that point and returns when it was reached, in ms after mark 0. The CPU's
  // work is done when a call returns, so these defaults read the wall clock; a GPU backend records
  // events on its stream instead.
  virtual int64_t mark();
  virtual double mark_ms(int64_t id);
  virtual void clear_marks();

 private:
  std::vector<double> wall_marks_;  // the defaults' wall-clock times (ms, steady clock)
};

// CPU backend with `threads` OpenMP/OpenBLAS threads.
std::unique_ptr<Ops> make_cpu_ops(int threads);

}  // namespace tpt
