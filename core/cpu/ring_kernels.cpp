// Ring attention blocks on the CPU (core/cpu/ring_kernels.h): a query row at a time, its scores in a
// row buffer of the thread. Only the keys a query sees are visited (RingBlock::visible): a block
// whose keys all lie after the query costs nothing.
#include "core/cpu/ring_kernels.h"

#include <cmath>
#include <limits>
#include <vector>

namespace tpt::cpu {

void ring_block_forward(float* out, float* lse, const float* qkv, const float* kv, int64_t B, int64_t T, int64_t H,
                        int64_t KV, int64_t D, const RingBlock& blk) {
  const float scale = 1.0f / std::sqrt(float(D));
  const int64_t row = (H + 2 * KV) * D, krow = 2 * KV * D, c = blk.c;
  const float neg_inf = -std::numeric_limits<float>::infinity();
  // (blk.first: every row sees its own key, so every row is written)
#pragma omp parallel for collapse(2) schedule(dynamic, 1)
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h) {
      const int64_t koff = (h / (H / KV)) * D, voff = koff + KV * D;
      const float* kbase = kv + b * T * krow;
      std::vector<float> p(static_cast<size_t>(T)), o(static_cast<size_t>(D));
      for (int64_t t = 0; t < T; ++t) {
        int64_t n[2];
        blk.visible(t, n);
        if (n[0] + n[1] == 0) continue;
        const float* q = qkv + (b * T + t) * row + h * D;
        float mx = neg_inf;
        auto each_key = [&](auto&& f) {
          for (int j = 0; j < 2; ++j)
            for (int64_t s = j * c; s < j * c + n[j]; ++s) f(s);
        };
        each_key([&](int64_t s) {
          const float* k = kbase + s * krow + koff;
          float dot = 0;
          for (int64_t d = 0; d < D; ++d) dot += q[d] * k[d];
          p[size_t(s)] = dot * scale;
          mx = std::max(mx, p[size_t(s)]);
        });
        float sum = 0;
        for (int64_t d = 0; d < D; ++d) o[size_t(d)] = 0.0f;
        each_key([&](int64_t s) {
          const float e = std::exp(p[size_t(s)] - mx);
          sum += e;
          const float* v = kbase + s * krow + voff;
          for (int64_t d = 0; d < D; ++d) o[size_t(d)] += e * v[d];
        });
        // online softmax: the block's (normalised output, lse) merged with what the row holds
        const float blse = mx + std::log(sum);
        float& l = lse[(b * H + h) * T + t];
        float* y = out + (b * T + t) * H * D + h * D;
        if (blk.first) {
          for (int64_t d = 0; d < D; ++d) y[d] = o[size_t(d)] / sum;
          l = blse;
          continue;
        }
        const float merged = std::max(l, blse) + std::log1p(std::exp(-std::fabs(l - blse)));
        const float w_old = std::exp(l - merged), w_new = std::exp(blse - merged) / sum;
        for (int64_t d = 0; d < D; ++d) y[d] = y[d] * w_old + o[size_t(d)] * w_new;
        l = merged;
      }
    }
}

// Parallel over (sequence, kv head): the query heads of a group run in turn, so their key and value
// gradients add into the group's dk, dv without a race.
void ring_block_backward(float* dq, float* dkv, const float* dout, const float* out, const float* lse,
                         const float* qkv, const float* kv, int64_t B, int64_t T, int64_t H, int64_t KV, int64_t D,
                         const RingBlock& blk) {
  const float scale = 1.0f / std::sqrt(float(D));
  const int64_t row = (H + 2 * KV) * D, krow = 2 * KV * D, c = blk.c, Q = H / KV;
#pragma omp parallel for collapse(2) schedule(dynamic, 1)
  for (int64_t b = 0; b < B; ++b)
    for (int64_t g = 0; g < KV; ++g) {
      const int64_t koff = g * D, voff = koff + KV * D;
      const float* kbase = kv + b * T * krow;
      float* dkbase = dkv + b * T * krow;
      for (int64_t h = g * Q; h < (g + 1) * Q; ++h)
        for (int64_t t = 0; t < T; ++t) {
          int64_t n[2];
          blk.visible(t, n);
          if (n[0] + n[1] == 0) continue;
          const float* q = qkv + (b * T + t) * row + h * D;
          const float* dy = dout + (b * T + t) * H * D + h * D;
          const float* y = out + (b * T + t) * H * D + h * D;
          float* dqt = dq + (b * T + t) * H * D + h * D;
          const float lse_t = lse[(b * H + h) * T + t];
          float delta = 0;  // sum over the row of p * dp = dout . out
          for (int64_t d = 0; d < D; ++d) delta += dy[d] * y[d];
          for (int j = 0; j < 2; ++j)
            for (int64_t s = j * c; s < j * c + n[j]; ++s) {
              const float* k = kbase + s * krow + koff;
              const float* v = kbase + s * krow + voff;
              float dot = 0, dp = 0;
              for (int64_t d = 0; d < D; ++d) {
                dot += q[d] * k[d];
                dp += dy[d] * v[d];
              }
              const float p = std::exp(dot * scale - lse_t);
              const float ds = p * (dp - delta) * scale;
              float* dk = dkbase + s * krow + koff;
              float* dv = dkbase + s * krow + voff;
              for (int64_t d = 0; d < D; ++d) {
                dv[d] += p * dy[d];
                dqt[d] += ds * k[d];
                dk[d] += ds * q[d];
              }
            }
        }
    }
}

}  // namespace tpt::cpu
