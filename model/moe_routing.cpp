// The router's host math (model/moe_routing.h), after Megatron's topk_routing_with_score_function,
// apply_router_token_dropping, compute_routing_scores_for_aux_loss, switch_load_balancing_loss_func
// and z_loss_func (megatron/core/transformer/moe/moe_utils.py); the send order of a routing.
#include "model/moe_routing.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/error.h"

namespace tpt {

RouterOptions router_options(const ModelConfig& m) {
  RouterOptions o;
  o.E = m.num_moe_experts;
  o.k = m.moe_router_topk;
  o.score = m.moe_router_score_function;
  o.pre_softmax = m.moe_router_pre_softmax;
  o.scaling = m.moe_router_topk_scaling_factor;
  o.groups = m.moe_router_num_groups;
  o.group_topk = m.moe_router_group_topk;
  o.capacity_factor = m.moe_expert_capacity_factor;
  o.drop = m.moe_token_drop_policy;
  o.pad_to_capacity = m.moe_pad_expert_input_to_capacity;
  o.balancing = m.moe_router_load_balancing_type;
  o.aux_coeff = m.moe_aux_loss_coeff;
  o.z_coeff = m.moe_z_loss_coeff;
  o.expert_bias = m.moe_router_enable_expert_bias;
  o.bias_update_rate = m.moe_router_bias_update_rate;
  return o;
}

namespace {

float sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }

// softmax of x (n) into out, in fp32 with the max subtracted
void softmax(const float* x, int64_t n, float* out) {
  const float m = *std::max_element(x, x + n);
  float s = 0;
  for (int64_t i = 0; i < n; ++i) s += out[i] = std::exp(x[i] - m);
  for (int64_t i = 0; i < n; ++i) out[i] /= s;
}

// the k largest of v (n) by value, ties to the lower index, in descending order; -inf entries last.
// One pass in index order keeping out[0, m) sorted (an entry goes after every kept one of a value at
// least its own, which all have lower indices): no allocation, O(n) for the few that enter.
void topk(const float* v, int64_t n, int64_t k, int32_t* out) {
  int64_t m = 0;
  for (int64_t i = 0; i < n; ++i) {
    const float x = v[i];
    if (m == k && !(x > v[out[k - 1]])) continue;  // not above the k-th (a tie keeps the lower index)
    int64_t j = m < k ? m++ : k - 1;
    for (; j > 0 && x > v[out[j - 1]]; --j) out[j] = out[j - 1];
    out[j] = int32_t(i);
  }
}

// top-k of scores (E), group-limited when o.groups: only the experts of the group_topk groups with
// the largest sums of their top (k / group_topk) scores compete (Megatron's group_limited_topk)
void choose(const float* scores, const RouterOptions& o, int32_t* out) {
  if (!o.groups) return topk(scores, o.E, o.k, out);
  const int64_t per = o.E / o.groups, top = o.k / o.group_topk;
  std::vector<float> gscore(static_cast<size_t>(o.groups));
  std::vector<int32_t> best(static_cast<size_t>(top));
  for (int64_t g = 0; g < o.groups; ++g) {
    topk(scores + g * per, per, top, best.data());
    float s = 0;
    for (int32_t b : best) s += scores[g * per + b];
    gscore[size_t(g)] = s;
  }
  std::vector<int32_t> gsel(static_cast<size_t>(o.group_topk));
  topk(gscore.data(), o.groups, o.group_topk, gsel.data());
  std::vector<float> masked(static_cast<size_t>(o.E), -std::numeric_limits<float>::infinity());
  for (int32_t g : gsel)
    for (int64_t e = 0; e < per; ++e) masked[size_t(g * per + e)] = scores[g * per + e];
  topk(masked.data(), o.E, o.k, out);
}

// ceil(T k / E * factor): an expert's capacity of a rank's T tokens
int64_t capacity_of(int64_t T, const RouterOptions& o) {
  return int64_t(std::ceil(double(T * o.k) / double(o.E) * o.capacity_factor));
}

// Capacity (Megatron's apply_router_token_dropping on a rank's T tokens): per expert at most
// ceil(T k / E * factor) assignments; probs keeps the largest weights (ties: the earlier token),
// position the earliest tokens. Dropped assignments get expert -1 and weight 0.
void drop_over_capacity(Routing& r, const RouterOptions& o) {
  const int64_t T = r.T, k = o.k;
  const int64_t capacity = capacity_of(T, o);
  if (capacity > T) return;  // no expert can overflow
  std::vector<std::vector<int64_t>> by_expert(static_cast<size_t>(o.E));  // assignment indices t k + j, token order
  for (int64_t a = 0; a < T * k; ++a) by_expert[size_t(r.expert[size_t(a)])].push_back(a);
  for (auto& list : by_expert) {
    if (int64_t(list.size()) <= capacity) continue;
    if (o.drop == MoEDropPolicy::Probs)
      std::stable_sort(list.begin(), list.end(), [&](int64_t a, int64_t b) { return r.prob[size_t(a)] > r.prob[size_t(b)]; });
    for (size_t i = size_t(capacity); i < list.size(); ++i) {
      r.expert[size_t(list[i])] = -1;
      r.prob[size_t(list[i])] = 0;
    }
  }
}

// Whether chosen (k indices) is the set of s's k largest (E) with no tie at its edge: exactly k
// entries at least the smallest chosen one. Then it is what topk(s) would choose, in another order
// (the counts read only the set), and is copied to top. The aux scores are a monotone function of
// what the router chose from (all but the expert bias and the groups), so this holds but for ties
// that rounding makes, where topk decides: topk's time, once per token instead of twice.
bool same_top_set(const float* s, int64_t E, int64_t k, const int32_t* chosen, int32_t* top) {
  float lo = std::numeric_limits<float>::infinity();
  for (int64_t j = 0; j < k; ++j) lo = std::min(lo, s[chosen[j]]);
  int64_t at_least = 0;
  for (int64_t e = 0; e < E; ++e) at_least += s[e] >= lo;
  if (at_least != k) return false;
  std::copy_n(chosen, k, top);
  return true;
}

// The balancing losses' scores (softmax over E, or sigmoid normalised over E) of one token.
void aux_scores(const float* z, const RouterOptions& o, float* s) {
  if (o.score == MoEScore::Softmax) return softmax(z, o.E, s);
  float sum = 0;
  for (int64_t e = 0; e < o.E; ++e) sum += s[e] = sigmoid(z[e]);
  for (int64_t e = 0; e < o.E; ++e) s[e] /= sum + 1e-20f;
}

// d z (E) += from d s (E) through aux_scores
void aux_scores_backward(const float* z, const float* s, const float* ds, const RouterOptions& o, float* dz) {
  double dot = 0;
  for (int64_t e = 0; e < o.E; ++e) dot += double(ds[e]) * s[e];
  if (o.score == MoEScore::Softmax) {
    for (int64_t e = 0; e < o.E; ++e) dz[e] += s[e] * (ds[e] - float(dot));
    return;
  }
  float sum = 0;
  for (int64_t e = 0; e < o.E; ++e) sum += sigmoid(z[e]);
  for (int64_t e = 0; e < o.E; ++e) {
    const float sg = sigmoid(z[e]);
    dz[e] += (ds[e] - float(dot)) / (sum + 1e-20f) * sg * (1 - sg);
  }
}

}  // namespace

void update_expert_bias(std::vector<float>& bias, const std::vector<double>& counts, double rate) {
  double total = 0;
  for (double c : counts) total += c;
  const double mean = total / double(counts.size());
  for (size_t e = 0; e < bias.size(); ++e) {
    const double offset = mean - counts[e];
    bias[e] += float(offset > 0 ? rate : offset < 0 ? -rate : 0.0);
  }
}

void add_bias_counts(const Routing& r, const RouterOptions& o, std::vector<double>& counts) {
  if (o.capacity_factor != 0 && o.pad_to_capacity) {
    const double c = double(std::min(capacity_of(r.T, o), r.T));
    for (double& n : counts) n += c;
    return;
  }
  for (size_t e = 0; e < counts.size(); ++e) counts[e] += r.counts[e];
}

Routing route(const float* z, int64_t T, const RouterOptions& o, const std::function<int64_t(int64_t)>& seq_of,
              int64_t B, int64_t group_size, const GroupSum& sum, const float* bias, const GroupSum& average) {
  const int64_t E = o.E, k = o.k;
  Routing r;
  r.T = T;
  r.k = k;
  r.expert.resize(size_t(T * k));
  r.prob.resize(size_t(T * k));
  r.chosen.resize(size_t(T * k));
  const bool scores = o.score == MoEScore::Sigmoid || o.pre_softmax;
  if (scores) r.scores.resize(size_t(T * E));
  else r.topk_softmax.resize(size_t(T * k));
  // tokens route independently: in parallel (OpenMP, the backend's threads); every sum over tokens
  // below runs in token order, so the result does not depend on the threads
#pragma omp parallel
  {
  std::vector<float> sel(static_cast<size_t>(k)), biased(static_cast<size_t>(E));
#pragma omp for schedule(static)
  for (int64_t t = 0; t < T; ++t) {
    const float* zt = z + t * E;
    int32_t* ch = r.chosen.data() + t * k;
    float* p = r.prob.data() + t * k;
    if (o.score == MoEScore::Softmax && !o.pre_softmax) {  // top-k of the logits, softmax over the k
      choose(zt, o, ch);
      for (int64_t j = 0; j < k; ++j) sel[size_t(j)] = zt[ch[j]];
      softmax(sel.data(), k, r.topk_softmax.data() + t * k);
      std::copy_n(r.topk_softmax.data() + t * k, k, p);
    } else {
      float* s = r.scores.data() + t * E;
      if (o.score == MoEScore::Softmax) softmax(zt, E, s);
      else
        for (int64_t e = 0; e < E; ++e) s[e] = sigmoid(zt[e]);
      if (bias) {  // the bias chooses (groups included), the scores weigh
        for (int64_t e = 0; e < E; ++e) biased[size_t(e)] = s[e] + bias[e];
        choose(biased.data(), o, ch);
      } else {
        choose(s, o, ch);
      }
      float total = 0;
      for (int64_t j = 0; j < k; ++j) total += p[j] = s[ch[j]];
      if (o.score == MoEScore::Sigmoid && k > 1)
        for (int64_t j = 0; j < k; ++j) p[j] /= total + 1e-20f;
    }
    if (o.scaling != 0)
      for (int64_t j = 0; j < k; ++j) p[j] *= float(o.scaling);
  }
  }
  r.expert = r.chosen;
  if (o.capacity_factor != 0) drop_over_capacity(r, o);
  r.counts.assign(size_t(E), 0.0);
  for (int32_t e : r.expert)
    if (e >= 0) r.counts[size_t(e)] += 1;

  // balancing losses: the plain top-k of the aux scores, counts over the TP x CP group
  const bool aux = o.aux_coeff != 0 && o.balancing != MoEBalancing::None;
  if (!aux && o.z_coeff == 0) return r;
  r.dlogits_aux.assign(size_t(T * E), 0.0f);
  if (aux) {
    const bool per_seq = o.balancing == MoEBalancing::SeqAuxLoss;
    const int64_t groups = per_seq ? B : 1;  // the loss's token sets: sequences, or the micro-batch
    std::vector<float> s(static_cast<size_t>(T * E));
    std::vector<int32_t> top(static_cast<size_t>(T * k));
    std::vector<double> fp(static_cast<size_t>(2 * groups * E), 0.0);  // [f (groups, E) | P (groups, E)]
#pragma omp parallel for schedule(static)
    for (int64_t t = 0; t < T; ++t) {
      const float* st = s.data() + t * E;
      aux_scores(z + t * E, o, s.data() + t * E);
      if (!same_top_set(st, E, k, r.chosen.data() + t * k, top.data() + t * k))
        topk(st, E, k, top.data() + t * k);
    }
    for (int64_t t = 0; t < T; ++t) {
      const int64_t g = per_seq ? seq_of(t) : 0;
      TPT_CHECK(g >= 0 && g < groups);
      const float* st = s.data() + t * E;
      for (int64_t j = 0; j < k; ++j) fp[size_t(g * E + top[size_t(t * k + j)])] += 1;
      for (int64_t e = 0; e < E; ++e) fp[size_t(groups * E + g * E + e)] += st[e];
    }
    sum(fp);
    // per token set: aux = coeff E / (k T^2) sum_e f_e P_e with T its tokens (f sums to k T);
    // global_aux_loss: f the step's mean counts so far, T this micro-batch's tokens over TP x DP x CP
    std::vector<double> f_total(static_cast<size_t>(groups), 0.0);
    for (int64_t g = 0; g < groups; ++g)
      for (int64_t e = 0; e < E; ++e) f_total[size_t(g)] += fp[size_t(g * E + e)];
    if (o.balancing == MoEBalancing::GlobalAuxLoss) {
      std::vector<double> f(fp.begin(), fp.begin() + E);
      average(f);
      std::copy(f.begin(), f.end(), fp.begin());
    }
    std::vector<float> grad(static_cast<size_t>(groups * E));
    r.aux = 0;
    for (int64_t g = 0; g < groups; ++g) {
      double dot = 0;
      const double tokens = f_total[size_t(g)] / double(k);
      const double c = o.aux_coeff * double(E) / (double(k) * tokens * tokens) / double(groups);
      for (int64_t e = 0; e < E; ++e) {
        dot += fp[size_t(g * E + e)] * fp[size_t(groups * E + g * E + e)];
        grad[size_t(g * E + e)] = float(c * fp[size_t(g * E + e)]);
      }
      r.aux += c * dot;
    }
#pragma omp parallel for schedule(static)
    for (int64_t t = 0; t < T; ++t) {
      const int64_t g = per_seq ? seq_of(t) : 0;
      aux_scores_backward(z + t * E, s.data() + t * E, grad.data() + g * E, o, r.dlogits_aux.data() + t * E);
    }
  }
  if (o.z_coeff != 0) {  // Megatron's z_loss_func on this rank's tokens, coefficient / (TP x CP)
    const double c = o.z_coeff / double(group_size);
    std::vector<double> lse(static_cast<size_t>(T));
#pragma omp parallel
    {
    std::vector<float> sm(static_cast<size_t>(E));
#pragma omp for schedule(static)
    for (int64_t t = 0; t < T; ++t) {
      const float* zt = z + t * E;
      const float m = *std::max_element(zt, zt + E);
      double se = 0;
      for (int64_t e = 0; e < E; ++e) se += std::exp(double(zt[e] - m));
      const double l = lse[size_t(t)] = double(m) + std::log(se);
      softmax(zt, E, sm.data());
      for (int64_t e = 0; e < E; ++e) r.dlogits_aux[size_t(t * E + e)] += float(c * 2.0 * l / double(T) * sm[size_t(e)]);
    }
    }
    double sq = 0;
    for (double l : lse) sq += l * l;
    r.z_mean = sq / double(T);
    r.z = c * r.z_mean;
  }
  return r;
}

void routing_backward(const Routing& r, const float* dprob, const RouterOptions& o, float loss_scale, float* dlogits) {
  const int64_t E = o.E, k = o.k, T = r.T;
  std::fill(dlogits, dlogits + T * E, 0.0f);
#pragma omp parallel
  {
  std::vector<float> dp(static_cast<size_t>(k));
#pragma omp for schedule(static)
  for (int64_t t = 0; t < T; ++t) {
    const int32_t* ch = r.chosen.data() + t * k;
    float* dz = dlogits + t * E;
    // d of the weights before scaling and dropping (a dropped weight was multiplied by 0)
    for (int64_t j = 0; j < k; ++j)
      dp[size_t(j)] = r.expert[size_t(t * k + j)] < 0 ? 0.0f : dprob[t * k + j] * float(o.scaling != 0 ? o.scaling : 1.0);
    if (o.score == MoEScore::Softmax && !o.pre_softmax) {  // softmax over the chosen logits
      const float* q = r.topk_softmax.data() + t * k;
      double dot = 0;
      for (int64_t j = 0; j < k; ++j) dot += double(dp[size_t(j)]) * q[j];
      for (int64_t j = 0; j < k; ++j) dz[ch[j]] += q[j] * (dp[size_t(j)] - float(dot));
    } else if (o.score == MoEScore::Softmax) {  // the chosen entries of softmax over all E
      const float* s = r.scores.data() + t * E;
      double dot = 0;
      for (int64_t j = 0; j < k; ++j) dot += double(dp[size_t(j)]) * s[ch[j]];
      for (int64_t e = 0; e < E; ++e) dz[e] -= s[e] * float(dot);
      for (int64_t j = 0; j < k; ++j) dz[ch[j]] += s[ch[j]] * dp[size_t(j)];
    } else {  // sigmoid, normalised over the k when k > 1
      const float* s = r.scores.data() + t * E;
      std::vector<float> dq(dp);
      if (k > 1) {
        float total = 0;
        double dot = 0;
        for (int64_t j = 0; j < k; ++j) total += s[ch[j]];
        const float den = total + 1e-20f;
        for (int64_t j = 0; j < k; ++j) dot += double(dp[size_t(j)]) * s[ch[j]];
        for (int64_t j = 0; j < k; ++j) dq[size_t(j)] = dp[size_t(j)] / den - float(dot) / (den * den);
      }
      for (int64_t j = 0; j < k; ++j) dz[ch[j]] += dq[size_t(j)] * s[ch[j]] * (1 - s[ch[j]]);
    }
  }
  }
  if (!r.dlogits_aux.empty())
    for (int64_t i = 0; i < T * E; ++i) dlogits[i] += loss_scale * r.dlogits_aux[size_t(i)];
}

// The send order of a routing (model/moe.h): each expert's assignments in token order, experts in turn.
MoESendOrder moe_send_order(const Routing& r, int64_t E) {
  const int64_t k = r.k;
  MoESendOrder o;
  o.per_expert.assign(size_t(E), 0);
  std::vector<int64_t> start(size_t(E) + 1, 0);
  for (int32_t e : r.expert)
    if (e >= 0) o.per_expert[size_t(e)] += 1;
  for (int64_t e = 0; e < E; ++e) start[size_t(e + 1)] = start[size_t(e)] + o.per_expert[size_t(e)];
  o.n_send = start[size_t(E)];
  o.perm.assign(size_t(o.n_send), 0);
  o.row_w.assign(size_t(o.n_send), 0.0f);
  o.comb.assign(size_t(r.T * k), -1);
  std::vector<int64_t> next(start.begin(), start.end() - 1);
  for (int64_t a = 0; a < r.T * k; ++a) {
    const int32_t e = r.expert[size_t(a)];
    if (e < 0) continue;
    const int64_t row = next[size_t(e)]++;
    o.perm[size_t(row)] = int32_t(a / k);
    o.row_w[size_t(row)] = r.prob[size_t(a)];
    o.comb[size_t(a)] = int32_t(row);
  }
  return o;
}

}  // namespace tpt
