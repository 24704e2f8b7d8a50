// Causal attention through cuDNN's fused SDPA (core/cuda/attention/cudnn_attention.h), with the
// graph API of the header-only cudnn-frontend. This is the only translation unit that includes the frontend
// (large and slow to compile); without TPTRAIN_HAVE_CUDNN it holds the stubs that say "not built".
// cuDNN is loaded at run time (the frontend's dynamic-loading mode, NV_CUDNN_FRONTEND_USE_DYNAMIC_LOADING:
// every cuDNN call, ours included, goes through the frontend's shim and the handle opened here; the
// frontend opens NVRTC itself, only if an engine of its own needs it): tptrain links neither, and
// without them it warns once and runs its own attention kernels.
#include "core/cuda/attention/cudnn_attention.h"

#include "core/cuda/attention/ring_attention.h"
#include "core/cuda/attention/ring_calls.h"
#include "core/cuda/cuda_util.h"
#include "core/gpu_workspace.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <string>

#ifdef TPTRAIN_HAVE_CUDNN
#include <spdlog/spdlog.h>

#include <cudnn.h>
#include <cudnn_frontend.h>

#include <dlfcn.h>

#include <cstdlib>
#include <cstring>
#include <exception>
#include <map>
#include <mutex>
#include <tuple>
#include <unordered_map>
#include <utility>
#include <vector>

#if CUDNN_FRONTEND_VERSION < 11300
#error "cudnn-frontend 1.13 or newer is needed (CMake checks this: TPTRAIN_CUDNN)"
#endif
#if !defined(CUDNN_MAJOR) || CUDNN_MAJOR < 9
#error "cuDNN 9 or newer is needed (CMake checks this: TPTRAIN_CUDNN)"
#endif
#endif

namespace tpt::cuda {

namespace {
std::atomic<int64_t> g_forward{0}, g_backward{0}, g_fell_back{0}, g_ring_forward{0}, g_ring_backward{0},
    g_ring_fell_back{0};
}  // namespace

CudnnAttentionStats cudnn_attention_stats() {
  return {g_forward.load(),      g_backward.load(),      g_fell_back.load(),
          g_ring_forward.load(), g_ring_backward.load(), g_ring_fell_back.load()};
}

#ifdef TPTRAIN_HAVE_CUDNN
}  // namespace tpt::cuda

// the library handle the frontend's shim resolves every cuDNN symbol in (set by cudnn_library())
namespace cudnn_frontend {
void* cudnn_dlhandle = nullptr;
}  // namespace cudnn_frontend

namespace tpt::cuda {

namespace fe = cudnn_frontend;

namespace {

// libcudnn.so.9 (or the file TPTRAIN_CUDNN_LIBRARY names: a test hides cuDNN with a path that does
// not exist), opened once per process at first need; error: why it could not be, "" if it was.
struct CudnnLibrary {
  bool loaded = false;
  std::string error;
};
const CudnnLibrary& cudnn_library() {
  static const CudnnLibrary lib = [] {
    const char* env = std::getenv("TPTRAIN_CUDNN_LIBRARY");
    const std::string name = env && *env ? env : "libcudnn.so.9";
    dlerror();
    void* h = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!h) {
      const char* e = dlerror();
      return CudnnLibrary{false, e ? e : "cannot open " + name};
    }
    fe::cudnn_dlhandle = h;  // never closed: the plans and handles live until the process ends
    // The frontend opens a CUDA runtime of its own for its workspace memsets (libcudart.so.12 first,
    // then .13): make it the one this process runs on, so that its calls see our streams.
    Dl_info info{};
    if (!std::getenv("CUDNN_FRONTEND_CUDART_LIB_NAME") && dladdr(reinterpret_cast<void*>(&cudaGetDeviceCount), &info) &&
        info.dli_fname && std::strstr(info.dli_fname, "libcudart"))
      setenv("CUDNN_FRONTEND_CUDART_LIB_NAME", info.dli_fname, 0);
    CudnnLibrary ok;
    ok.loaded = true;
    return ok;
  }();
  return lib;
}

// The graphs' tensors, by uid (the keys of the variant packs).
enum Uid : int64_t { kQ = 1, kK, kV, kO, kStats, kdO, kdQ, kdK, kdV };

// cuDNN 9 numbers its versions major * 10000 + minor * 100 + patch.
std::string version_text(size_t v) {
  return std::to_string(v / 10000) + "." + std::to_string(v / 100 % 100) + "." + std::to_string(v % 100);
}

std::string dtype_text(DType t) { return t == DType::BF16 ? "bf16" : t == DType::F16 ? "fp16" : "fp32"; }

std::string shape_text(int64_t B, int64_t T, int64_t H, int64_t KV, int64_t D, DType t) {
  return "B " + std::to_string(B) + ", T " + std::to_string(T) + ", H " + std::to_string(H) +
         (KV != H ? ", KV " + std::to_string(KV) : std::string()) + ", D " + std::to_string(D) + ", " + dtype_text(t);
}

// The graphs declare cudnn-frontend's default 16-byte alignment for every tensor (the SDPA engines
// move rows with 16-byte vector loads and TMA); a pointer that is not is left to the own kernels.
bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// cuDNN's own description of its last error (cuDNN 9: per thread), or "".
std::string last_cudnn_error() {
  char buf[1024] = {};
  fe::detail::get_last_error_string(buf, sizeof(buf));
  return buf;
}

enum class Dir : int { Forward = 0, Backward = 1 };
// A graph's mode: the whole causal sequence (attention_forward / backward), or one call of a ring
// block, qn query chunks (1 or 2, of c = T / 2 tokens) against kn key chunks, causal or unmasked.
constexpr int kWhole = 0;
int ring_mode(int qn, int kn, bool causal) { return 1 + int(causal) + 2 * (qn - 1) + 4 * (kn - 1); }
using Key = std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t, int, int, int>;  // B, T, H, KV, D, dtype, Dir, mode

// The shapes every graph needs: 16-bit, head dimension a multiple of 8 (the engines' 16-byte rows).
bool shape_ok(DType t, int64_t B, int64_t T, int64_t H, int64_t KV, int64_t D) {
  return (t == DType::BF16 || t == DType::F16) && D > 0 && D % 8 == 0 && B > 0 && T > 0 && H > 0 && KV > 0 &&
         H % KV == 0;
}

}  // namespace

bool cudnn_attention_built() { return true; }

bool cudnn_attention_loaded() { return cudnn_library().loaded; }

std::string cudnn_attention_version() {
  const std::string built = "built with " + version_text(CUDNN_VERSION) + "; cudnn-frontend " +
                            std::to_string(CUDNN_FRONTEND_MAJOR_VERSION) + "." +
                            std::to_string(CUDNN_FRONTEND_MINOR_VERSION) + "." +
                            std::to_string(CUDNN_FRONTEND_PATCH_VERSION);
  if (!cudnn_library().loaded) return "cuDNN not found (" + cudnn_library().error + "; " + built + ")";
  return "cuDNN SDPA (cuDNN " + version_text(fe::detail::get_backend_version()) + " loaded, " + built + ")";
}

struct CudnnAttention::Impl {
  cudaStream_t stream;
  bool deterministic;
  cudnnHandle_t handle = nullptr;
  bool unusable = false;  // the handle could not be made: every call falls back
  // the built graphs; null where cuDNN refused the shape (asked once)
  std::map<Key, std::shared_ptr<fe::graph::Graph>> graphs;
  DeviceBuffer workspace;
  DeviceBuffer staging;  // the ring calls' results (core/gpu_workspace.h cudnn_ring_staging_bytes)

  Impl(cudaStream_t s, bool det, int64_t* calls) : stream(s), deterministic(det), workspace(calls), staging(calls) {}
  ~Impl() {
    graphs.clear();  // the plans before the handle they were built with
    if (handle) fe::detail::destroy_handle(handle);
  }

  // The handle, bound to the compute stream; false if cuDNN cannot run here (said once).
  bool ready() {
    if (handle) return true;
    if (unusable) return false;
    if (!cudnn_library().loaded) {  // said once per process by the constructor
      unusable = true;
      return false;
    }
    cudnnStatus_t st = fe::detail::create_handle(&handle);
    if (st == CUDNN_STATUS_SUCCESS) st = fe::detail::set_stream(handle, stream);
    if (st != CUDNN_STATUS_SUCCESS) {
      if (handle) fe::detail::destroy_handle(handle);
      handle = nullptr;
      unusable = true;
      (void)cudaGetLastError();
      spdlog::warn("WARNING: cuDNN attention unavailable ({}: {}); using the own attention kernels",
                   fe::detail::get_error_string(st), last_cudnn_error());
      return false;
    }
    return true;
  }

  // The graph of key, built on first use; null when cuDNN refuses it (said once per key).
  fe::graph::Graph* graph(const Key& key) {
    auto it = graphs.find(key);
    if (it != graphs.end()) return it->second.get();
    const auto [B, T, H, KV, D, dt, dir, mode] = key;
    const DType t = DType(dt);
    const bool whole = mode == kWhole;
    const int qn = 1 + ((mode - 1) >> 1 & 1), kn = 1 + ((mode - 1) >> 2 & 1);
    const bool causal = whole || ((mode - 1) & 1);
    const Layout L = whole ? Layout::whole(B, T, H, KV, D) : Layout::ring(B, T, H, KV, D, qn, kn);
    std::shared_ptr<fe::graph::Graph> g;
    last_build_error = "unsupported";
    try {
      g = Dir(dir) == Dir::Forward ? build_forward(L, t, causal) : build_backward(L, t, causal);
    } catch (const std::exception& e) {  // the frontend's older parts throw
      g = nullptr;
      last_build_error = e.what();
    }
    if (!g) {
      (void)cudaGetLastError();  // what a failed build may leave behind is no later kernel's error
      const std::string ring = whole ? "" : "ring call (" + std::to_string(qn) + " x " + std::to_string(kn) +
                                                   (causal ? " chunks, causal) " : " chunks) ");
      spdlog::warn("WARNING: cuDNN attention {}{} ({}): no cuDNN graph: {}; the own attention kernels run it", ring,
                   Dir(dir) == Dir::Forward ? "forward" : "backward", shape_text(B, T, H, KV, D, t),
                   last_build_error);
    }
    graphs.emplace(key, g);
    return g.get();
  }

  std::string last_build_error;  // why the last build_*() returned null

  // Builds a configured graph (validate, operation graph, heuristics' plans, support check, the
  // first plan that builds); null with the reason in last_build_error if any step fails.
  std::shared_ptr<fe::graph::Graph> finish(std::shared_ptr<fe::graph::Graph> g) {
    const fe::error_t e = g->build(handle, {fe::HeurMode_t::A, fe::HeurMode_t::FALLBACK});
    if (e.is_bad()) {
      last_build_error = e.err_msg;
      return nullptr;
    }
    int64_t ws = 0;
    const fe::error_t w = g->get_workspace_size(ws);
    if (w.is_bad() || ws < 0) {
      last_build_error = w.err_msg;
      return nullptr;
    }
    return g;
  }

  static std::shared_ptr<fe::graph::Graph> new_graph(DType t) {
    auto g = std::make_shared<fe::graph::Graph>();
    g->set_io_data_type(t == DType::BF16 ? fe::DataType_t::BFLOAT16 : fe::DataType_t::HALF)
        .set_intermediate_data_type(fe::DataType_t::FLOAT)
        .set_compute_data_type(fe::DataType_t::FLOAT);
    return g;
  }

  // Every 16-bit operand is a (B, heads, tokens, D) view -- H heads for q, out, dout, KV for k and v
  // --, element (b, h, t, d) of a (B, T, W) array (W = heads' columns and more) at b*T*W + t*W + c +
  // h*D + d: strides (T*W, D, W, 1), the part's column c going into the pointer. Whole sequence:
  // q, k, v and dq, dk, dv in qkv / dqkv (W = (H + 2 KV) D; columns 0, H*D, (H + KV)*D), out and
  // dout (W = H*D); stats (B, H, T) fp32 is (B, H, T, 1) packed. A ring call: sq = qn c query rows
  // (of qkv, out, dout; c = T / 2, the rank's chunks being contiguous rows) against sk = kn c key rows
  // of kv (W = 2 KV D; k at column 0, v at KV*D), the first row going into the pointer; the
  // forward's O and stats and the backward's dQ, dK|dV and stats in the staging buffer, packed
  // (B, sq, H D), (B, H, sq), (B, sk, 2 KV D) -- the backward's stats are lse itself when sq = T:
  // cuDNN before 9.26 takes them only packed (seen on an H200 with 9.19: "a non-ragged Stats input of
  // sdpa_backward must be a packed BHSD tensor").
  struct Layout {
    std::vector<int64_t> dim, kv_dim, q, kv, o, stats_dim, stats, out, lse, dq, dkv;
    static std::vector<int64_t> rows(int64_t T, int64_t W, int64_t D) { return {T * W, D, W, 1}; }
    static Layout whole(int64_t B, int64_t T, int64_t H, int64_t KV, int64_t D) {
      const int64_t R = (H + 2 * KV) * D;
      const auto x = rows(T, R, D), o = rows(T, H * D, D);
      const std::vector<int64_t> st{H * T, T, 1, 1};
      return {{B, H, T, D}, {B, KV, T, D}, x, x, o, {B, H, T, 1}, st, o, st, x, x};
    }
    static Layout ring(int64_t B, int64_t T, int64_t H, int64_t KV, int64_t D, int qn, int kn) {
      const int64_t sq = qn * (T / 2), sk = kn * (T / 2), R = (H + 2 * KV) * D;
      return {{B, H, sq, D},        {B, KV, sk, D},       rows(T, R, D),          rows(T, 2 * KV * D, D),
              rows(sq, H * D, D),   {B, H, sq, 1},        {H * sq, sq, 1, 1},     rows(T, H * D, D),
              {H * sq, sq, 1, 1},   rows(sq, H * D, D),   rows(sk, 2 * KV * D, D)};
    }
  };

  static std::shared_ptr<fe::graph::Tensor_attributes> input(fe::graph::Graph& g, const char* name, Uid uid,
                                                             const std::vector<int64_t>& dim,
                                                             const std::vector<int64_t>& stride) {
    return g.tensor(fe::graph::Tensor_attributes().set_name(name).set_uid(uid).set_dim(dim).set_stride(stride));
  }
  // the scores' scale, 1 / sqrt(D): a constant of the graph (D is part of its key)
  static float scale_of(int64_t D) { return 1.0f / std::sqrt(float(D)); }

  // causal: cuDNN's top-left diagonal, query t sees keys 0..t (the whole sequence, a ring block's
  // own chunks); else every key
  std::shared_ptr<fe::graph::Graph> build_forward(const Layout& L, DType t, bool causal) {
    auto g = new_graph(t);
    auto q = input(*g, "Q", kQ, L.dim, L.q);
    auto k = input(*g, "K", kK, L.kv_dim, L.kv);
    auto v = input(*g, "V", kV, L.kv_dim, L.kv);
    auto opt = fe::graph::SDPA_attributes()
                   .set_name("attention_forward")
                   .set_generate_stats(true)  // the lse backward needs
                   .set_causal_mask(causal)
                   .set_attn_scale(scale_of(L.dim[3]));
    auto [o, stats] = g->sdpa(q, k, v, opt);
    if (!o || !stats) return nullptr;
    o->set_output(true).set_uid(kO).set_dim(L.dim).set_stride(L.o);
    stats->set_output(true).set_uid(kStats).set_data_type(fe::DataType_t::FLOAT).set_dim(L.stats_dim).set_stride(
        L.stats);
    return finish(std::move(g));
  }

  std::shared_ptr<fe::graph::Graph> build_backward(const Layout& L, DType t, bool causal) {
    auto g = new_graph(t);
    auto q = input(*g, "Q", kQ, L.dim, L.q);
    auto k = input(*g, "K", kK, L.kv_dim, L.kv);
    auto v = input(*g, "V", kV, L.kv_dim, L.kv);
    auto o = input(*g, "O", kO, L.dim, L.out);
    auto dout = input(*g, "dO", kdO, L.dim, L.out);
    auto stats = input(*g, "Stats", kStats, L.stats_dim, L.lse);
    stats->set_data_type(fe::DataType_t::FLOAT);
    auto opt = fe::graph::SDPA_backward_attributes()
                   .set_name("attention_backward")
                   .set_causal_mask(causal)
                   .set_attn_scale(scale_of(L.dim[3]))
                   .set_deterministic_algorithm(deterministic);
    auto [dq, dk, dv] = g->sdpa_backward(q, k, v, o, dout, stats, opt);
    if (!dq || !dk || !dv) return nullptr;
    dq->set_output(true).set_uid(kdQ).set_dim(L.dim).set_stride(L.dq);
    // a key / value head's gradient: cuDNN sums it over the H / KV query heads that share it
    dk->set_output(true).set_uid(kdK).set_dim(L.kv_dim).set_stride(L.dkv);
    dv->set_output(true).set_uid(kdV).set_dim(L.kv_dim).set_stride(L.dkv);
    return finish(std::move(g));
  }

  // Runs g on the compute stream with the pointers of pack and the workspace it asks for.
  void execute(fe::graph::Graph& g, std::unordered_map<fe::graph::Tensor_attributes::uid_t, void*>& pack,
               const char* what, int64_t B, int64_t T, int64_t H, int64_t KV, int64_t D, DType t) {
    int64_t ws = 0;
    fe::error_t e = g.get_workspace_size(ws);
    void* w = nullptr;
    if (e.is_good() && ws > 0) w = workspace.get(size_t(ws));
    if (e.is_good()) {
      try {
        e = g.execute(handle, pack, w);
      } catch (const std::exception& x) {
        e = fe::error_t(fe::error_code_t::GRAPH_EXECUTION_FAILED, x.what());
      }
    }
    if (e.is_bad()) {
      const std::string detail = last_cudnn_error();
      internal_error(std::string("cuDNN attention ") + what + " (" + shape_text(B, T, H, KV, D, t) +
                     ") failed: " + e.err_msg + (detail.empty() ? "" : " (" + detail + ")"));
    }
  }
};

CudnnAttention::CudnnAttention(cudaStream_t stream, bool deterministic, int64_t* allocator_calls)
    : impl_(std::make_unique<Impl>(stream, deterministic, allocator_calls)) {
  static std::once_flag warned;
  if (!cudnn_library().loaded)
    std::call_once(warned, [] {
      spdlog::warn("WARNING: {}: using the own attention kernels", cudnn_attention_version());
    });
}
CudnnAttention::~CudnnAttention() = default;

CudnnAttention::Prepared CudnnAttention::prepare(int64_t B, int64_t T, int64_t H, int64_t KV, int64_t D, DType t,
                                                 int64_t at_least) {
  Prepared r;
  const bool usable = (t == DType::BF16 || t == DType::F16) && D % 8 == 0 && B > 0 && T > 0 && H > 0 && KV > 0 &&
                      H % KV == 0 && impl_->ready();
  for (Dir dir : {Dir::Forward, Dir::Backward}) {
    fe::graph::Graph* g = usable ? impl_->graph(Key{B, T, H, KV, D, int(t), int(dir), kWhole}) : nullptr;
    int64_t ws = 0;
    if (g && g->get_workspace_size(ws).is_good()) (dir == Dir::Forward ? r.forward : r.backward) = ws;
  }
  if (usable) impl_->workspace.reserve(size_t(std::max({at_least, r.forward, r.backward, int64_t(0)})));
  r.held = int64_t(impl_->workspace.capacity());
  return r;
}

bool CudnnAttention::forward(Buf out, float* lse, CBuf qkv, int64_t B, int64_t T, int64_t H, int64_t KV,
                             int64_t D) {
  const DType t = qkv.t;
  const bool usable = (t == DType::BF16 || t == DType::F16) && out.t == t && lse && D % 8 == 0 && B > 0 &&
                      T > 0 && H > 0 && KV > 0 && H % KV == 0 && D > 0 && aligned16(qkv.p) && aligned16(out.p) &&
                      aligned16(lse) && impl_->ready();
  fe::graph::Graph* g =
      usable ? impl_->graph(Key{B, T, H, KV, D, int(t), int(Dir::Forward), kWhole}) : nullptr;
  if (!g) {
    ++g_fell_back;
    return false;
  }
  // q, k, v: the parts of qkv (B, T, (H + 2 KV) D) at element offsets 0, H*D, (H + KV)*D
  const int64_t HD = H * D, KD = KV * D, e = dtype_bytes(t);
  auto* x = static_cast<char*>(const_cast<void*>(qkv.p));
  std::unordered_map<fe::graph::Tensor_attributes::uid_t, void*> pack = {
      {kQ, x}, {kK, x + HD * e}, {kV, x + (HD + KD) * e}, {kO, out.p}, {kStats, lse}};
  impl_->execute(*g, pack, "forward", B, T, H, KV, D, t);
  ++g_forward;
  return true;
}

bool CudnnAttention::backward(Buf dqkv, CBuf dout, CBuf qkv, CBuf out, const float* lse, int64_t B, int64_t T,
                              int64_t H, int64_t KV, int64_t D) {
  const DType t = qkv.t;
  const bool usable = (t == DType::BF16 || t == DType::F16) && dqkv.t == t && dout.t == t && out.t == t && lse &&
                      D % 8 == 0 && B > 0 && T > 0 && H > 0 && KV > 0 && H % KV == 0 && D > 0 && aligned16(qkv.p) &&
                      aligned16(dqkv.p) && aligned16(dout.p) && aligned16(out.p) && aligned16(lse) && impl_->ready();
  fe::graph::Graph* g =
      usable ? impl_->graph(Key{B, T, H, KV, D, int(t), int(Dir::Backward), kWhole}) : nullptr;
  if (!g) {
    ++g_fell_back;
    return false;
  }
  // q, k, v and dq, dk, dv: the parts of qkv and dqkv (B, T, (H + 2 KV) D) at element offsets 0, H*D,
  // (H + KV)*D
  const int64_t HD = H * D, KD = KV * D, e = dtype_bytes(t);
  auto* x = static_cast<char*>(const_cast<void*>(qkv.p));
  auto* dx = static_cast<char*>(dqkv.p);
  std::unordered_map<fe::graph::Tensor_attributes::uid_t, void*> pack = {
      {kQ, x},
      {kK, x + HD * e},
      {kV, x + (HD + KD) * e},
      {kO, const_cast<void*>(out.p)},
      {kdO, const_cast<void*>(dout.p)},
      {kStats, const_cast<float*>(lse)},
      {kdQ, dx},
      {kdK, dx + HD * e},
      {kdV, dx + (HD + KD) * e}};
  impl_->execute(*g, pack, "backward", B, T, H, KV, D, t);
  ++g_backward;
  return true;
}

namespace {

// Whether a direction's calls are merged: the forward's always; the backward's unless deterministic,
// whose workspace (B H Sq Sk 16-bit, core/gpu_workspace.h) a merged call would double (4x the
// own K/V's causal call).
bool ring_merges(Dir dir, bool deterministic) { return dir == Dir::Forward || !deterministic; }

int64_t up256(int64_t n) { return (n + 255) / 256 * 256; }

// The graphs of the calls in direction dir; none (the call handed back, counted) when the call cannot
// run (usable false) or cuDNN refuses a call's shape.
std::vector<fe::graph::Graph*> ring_graphs(CudnnAttention::Impl& impl, bool usable, const std::vector<RingCall>& calls,
                                           int64_t B, int64_t T, int64_t H, int64_t KV, int64_t D, DType t, Dir dir) {
  std::vector<fe::graph::Graph*> g;
  for (const RingCall& p : calls) {
    fe::graph::Graph* x =
        usable ? impl.graph(Key{B, T, H, KV, D, int(t), int(dir), ring_mode(p.qn, p.kn, p.causal)}) : nullptr;
    usable = usable && x;
    g.push_back(x);
  }
  if (usable) return g;
  ++g_ring_fell_back;
  return {};
}

}  // namespace

CudnnAttention::Prepared CudnnAttention::prepare_ring(int64_t B, int64_t T, int64_t H, int64_t KV, int64_t D,
                                                      DType t) {
  Prepared r;
  const bool usable = T % 2 == 0 && shape_ok(t, B, T / 2, H, KV, D) && impl_->ready();
  int64_t most = 0;
  for (Dir dir : {Dir::Forward, Dir::Backward}) {
    int64_t asked = 0;
    for (const RingCall& p : ring_shapes(ring_merges(dir, impl_->deterministic))) {
      const Key key{B, T, H, KV, D, int(t), int(dir), ring_mode(p.qn, p.kn, p.causal)};
      fe::graph::Graph* g = usable ? impl_->graph(key) : nullptr;
      int64_t ws = 0;
      if (!g || g->get_workspace_size(ws).is_bad()) asked = -1;
      if (asked >= 0) asked = std::max(asked, ws);
      most = std::max(most, ws);
    }
    (dir == Dir::Forward ? r.forward : r.backward) = asked;
  }
  if (usable) {
    impl_->workspace.reserve(size_t(most));
    impl_->staging.reserve(size_t(cudnn_ring_staging_bytes(B, T, H, KV, D)));
  }
  r.held = int64_t(impl_->workspace.capacity() + impl_->staging.capacity());
  return r;
}

bool CudnnAttention::ring_forward(float* out, float* lse, CBuf qkv, CBuf kv, int64_t B, int64_t T, int64_t H,
                                  int64_t KV, int64_t D, const RingBlock& blk) {
  const DType t = qkv.t;
  const int64_t c = T / 2, HD = H * D, KD = KV * D, R = HD + 2 * KD, e = dtype_bytes(t);
  // every call's pointers 16-byte aligned: the chunks' first rows (c tokens on)
  bool usable = T == 2 * blk.c && kv.t == t && shape_ok(t, B, c, H, KV, D) && aligned16(qkv.p) && aligned16(kv.p) &&
                impl_->ready();
  const std::vector<RingCall> calls = ring_calls(blk, ring_merges(Dir::Forward, impl_->deterministic));
  const std::vector<fe::graph::Graph*> g = ring_graphs(*impl_, usable, calls, B, T, H, KV, D, t, Dir::Forward);
  if (g.empty()) return false;
  auto* x = static_cast<char*>(const_cast<void*>(qkv.p));
  auto* y = static_cast<char*>(const_cast<void*>(kv.p));
  auto* o = static_cast<char*>(impl_->staging.get(size_t(cudnn_ring_staging_bytes(B, T, H, KV, D))));
  auto* stats = reinterpret_cast<float*>(o + up256(B * T * HD * e));
  // first: a query chunk's first call writes out and lse (a call of both chunks is the block's only one)
  bool written[2] = {!blk.first, !blk.first};
  for (size_t i = 0; i < calls.size(); ++i) {
    const RingCall& p = calls[i];
    char* k = y + p.k0 * c * 2 * KD * e;
    std::unordered_map<fe::graph::Tensor_attributes::uid_t, void*> pack = {
        {kQ, x + p.q0 * c * R * e}, {kK, k}, {kV, k + KD * e}, {kO, o}, {kStats, stats}};
    impl_->execute(*g[i], pack, "ring forward", B, p.qn * c, H, KV, D, t);
    ring_merge_rows(out, lse, CBuf{o, t}, stats, B, T, H, D, p.q0 * c, p.qn * c, !written[p.q0], impl_->stream);
    for (int j = p.q0; j < p.q0 + p.qn; ++j) written[j] = true;
  }
  ++g_ring_forward;
  return true;
}

bool CudnnAttention::ring_backward(float* dq, float* dkv, CBuf dout, CBuf out, const float* lse, CBuf qkv, CBuf kv,
                                   int64_t B, int64_t T, int64_t H, int64_t KV, int64_t D, const RingBlock& blk) {
  const DType t = qkv.t;
  const int64_t c = T / 2, HD = H * D, KD = KV * D, R = HD + 2 * KD, e = dtype_bytes(t);
  bool usable = T == 2 * blk.c && kv.t == t && dout.t == t && out.t == t && lse && shape_ok(t, B, c, H, KV, D) &&
                c % 4 == 0 && aligned16(qkv.p) && aligned16(kv.p) && aligned16(dout.p) && aligned16(out.p) &&
                aligned16(lse) && impl_->ready();
  const std::vector<RingCall> calls = ring_calls(blk, ring_merges(Dir::Backward, impl_->deterministic));
  const std::vector<fe::graph::Graph*> g = ring_graphs(*impl_, usable, calls, B, T, H, KV, D, t, Dir::Backward);
  if (g.empty()) return false;
  auto* x = static_cast<char*>(const_cast<void*>(qkv.p));
  auto* y = static_cast<char*>(const_cast<void*>(kv.p));
  auto* o = static_cast<char*>(const_cast<void*>(out.p));
  auto* dy = static_cast<char*>(const_cast<void*>(dout.p));
  auto* gq = static_cast<char*>(impl_->staging.get(size_t(cudnn_ring_staging_bytes(B, T, H, KV, D))));
  char* gkv = gq + up256(B * T * HD * e);
  auto* st = reinterpret_cast<float*>(gkv + up256(B * T * 2 * KD * e));  // one query chunk's lse, packed
  int64_t staged = -1;
  for (size_t i = 0; i < calls.size(); ++i) {
    const RingCall& p = calls[i];
    char* k = y + p.k0 * c * 2 * KD * e;
    float* stats = const_cast<float*>(lse);  // both query chunks: lse (B, H, T) is packed as it is
    if (p.qn == 1) {
      if (staged != p.q0) {  // (B, H, c) of lse (B, H, T)
        TPT_CUDA_CHECK(cudaMemcpy2DAsync(st, size_t(c) * 4, lse + p.q0 * c, size_t(T) * 4, size_t(c) * 4,
                                         size_t(B * H), cudaMemcpyDeviceToDevice, impl_->stream));
        staged = p.q0;
      }
      stats = st;
    }
    std::unordered_map<fe::graph::Tensor_attributes::uid_t, void*> pack = {
        {kQ, x + p.q0 * c * R * e},
        {kK, k},
        {kV, k + KD * e},
        {kO, o + p.q0 * c * HD * e},
        {kdO, dy + p.q0 * c * HD * e},
        {kStats, stats},
        {kdQ, gq},
        {kdK, gkv},
        {kdV, gkv + KD * e}};
    impl_->execute(*g[i], pack, "ring backward", B, p.qn * c, H, KV, D, t);
    ring_add_rows(dq + p.q0 * c * HD, T * HD, CBuf{gq, t}, B, p.qn * c * HD, impl_->stream);
    ring_add_rows(dkv + p.k0 * c * 2 * KD, T * 2 * KD, CBuf{gkv, t}, B, p.kn * c * 2 * KD, impl_->stream);
  }
  ++g_ring_backward;
  return true;
}

#else  // ---- built without cuDNN: every call falls back

bool cudnn_attention_built() { return false; }
bool cudnn_attention_loaded() { return false; }
std::string cudnn_attention_version() { return ""; }

struct CudnnAttention::Impl {};
CudnnAttention::CudnnAttention(cudaStream_t, bool, int64_t*) {}
CudnnAttention::Prepared CudnnAttention::prepare(int64_t, int64_t, int64_t, int64_t, int64_t, DType, int64_t) {
  return {};
}
CudnnAttention::~CudnnAttention() = default;
bool CudnnAttention::forward(Buf, float*, CBuf, int64_t, int64_t, int64_t, int64_t, int64_t) {
  ++g_fell_back;
  return false;
}
bool CudnnAttention::backward(Buf, CBuf, CBuf, CBuf, const float*, int64_t, int64_t, int64_t, int64_t, int64_t) {
  ++g_fell_back;
  return false;
}
CudnnAttention::Prepared CudnnAttention::prepare_ring(int64_t, int64_t, int64_t, int64_t, int64_t, DType) { return {}; }
bool CudnnAttention::ring_forward(float*, float*, CBuf, CBuf, int64_t, int64_t, int64_t, int64_t, int64_t,
                                  const RingBlock&) {
  ++g_ring_fell_back;
  return false;
}
bool CudnnAttention::ring_backward(float*, float*, CBuf, CBuf, const float*, CBuf, CBuf, int64_t, int64_t, int64_t,
                                   int64_t, int64_t, const RingBlock&) {
  ++g_ring_fell_back;
  return false;
}

#endif

}  // namespace tpt::cuda
