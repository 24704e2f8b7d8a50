// The host router's time (model/moe_routing.h route + routing_backward) at a chosen shape: a benchmark,
// not a test (docs/MOE.md "The router" quotes its figures). Random logits, a fixed seed.
//   route_bench [T E k [threads [reps [options]]]]   defaults: 2048 128 8 (Qwen3-235B's TP2 rank), 1 thread, 20
//   options: a comma list of softmax | pre_softmax | sigmoid, aux | seq_aux | none, z (the z-loss)
#include <omp.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "model/moe_routing.h"

int main(int argc, char** argv) {
  using namespace tpt;
  const int64_t T = argc > 1 ? std::atoll(argv[1]) : 2048, E = argc > 2 ? std::atoll(argv[2]) : 128;
  const int64_t k = argc > 3 ? std::atoll(argv[3]) : 8;
  const int threads = argc > 4 ? std::atoi(argv[4]) : 1, reps = argc > 5 ? std::atoi(argv[5]) : 20;
  const std::string opts = argc > 6 ? argv[6] : "softmax,aux";
  if (T <= 0 || E <= 0 || k <= 0 || k > E || threads <= 0 || reps <= 0) {
    std::fprintf(stderr, "usage: route_bench [T E k [threads [reps [options]]]] with k <= E\n");
    return 2;
  }
  auto has = [&](const char* o) { return ("," + opts + ",").find("," + std::string(o) + ",") != std::string::npos; };
  RouterOptions o;
  o.E = E;
  o.k = k;
  o.score = has("sigmoid") ? MoEScore::Sigmoid : MoEScore::Softmax;
  o.pre_softmax = has("pre_softmax");
  o.balancing = has("seq_aux") ? MoEBalancing::SeqAuxLoss : has("none") ? MoEBalancing::None : MoEBalancing::AuxLoss;
  o.aux_coeff = o.balancing == MoEBalancing::None ? 0 : 1e-3;
  o.z_coeff = has("z") ? 1e-3 : 0;
  omp_set_num_threads(threads);
  std::mt19937 rng(1234);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> z(size_t(T * E)), dprob(size_t(T * k)), dz(size_t(T * E));
  for (float& x : z) x = normal(rng);
  for (float& x : dprob) x = normal(rng);
  const int64_t B = 1;
  auto seq_of = [](int64_t) { return int64_t(0); };
  auto sum = [](std::vector<double>&) {};
  using clock = std::chrono::steady_clock;
  double fwd = 0, bwd = 0, check = 0;
  for (int i = 0; i <= reps; ++i) {  // the first is a warm-up
    const auto t0 = clock::now();
    Routing r = route(z.data(), T, o, seq_of, B, 1, sum);
    const auto t1 = clock::now();
    routing_backward(r, dprob.data(), o, 1.0f, dz.data());
    const auto t2 = clock::now();
    if (i) {
      fwd += std::chrono::duration<double, std::milli>(t1 - t0).count();
      bwd += std::chrono::duration<double, std::milli>(t2 - t1).count();
    }
    check += r.aux + double(dz[0]);
  }
  std::printf("route_bench T %lld E %lld k %lld threads %d (%s): route %.3f ms, routing_backward %.3f ms (mean of %d; check %.6g)\n",
              (long long)T, (long long)E, (long long)k, threads, opts.c_str(), fwd / reps, bwd / reps, reps, check);
  return 0;
}
