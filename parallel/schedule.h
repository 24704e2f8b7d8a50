// Pipeline schedules as data (docs/ARCHITECTURE.md "Pipeline parallelism (PP)"): a pure function gives each stage its
// list of actions; a simulator runs every stage's list together and checks it; the same lists
// drive training (parallel/pipeline.h), tracing and the planner.
//
// 1F1B (Megatron's PipeDream-Flush): stage s of P runs warmup = min(P - s - 1, M) forwards, then
// alternates one forward and one backward, then drains the remaining backwards; it holds at most
// min(P - s, M) micro-batches' activations. GPipe: all M forwards, then all M backwards.
// M < P is allowed: the schedules stay correct, with a larger bubble.
//
// Interleaved 1F1B (Narayanan et al., SC21; Megatron-core's forward_backward_pipelining_with_interleaving):
// the model is cut into P * v virtual stages; rank s holds the v model chunks s, s + P, ...,
// s + (v - 1) P, its local chunk c being virtual stage c * P + s. Forwards run chunk by chunk in
// groups of P micro-batches (chunk of the k-th forward = (k mod P v) / P, backwards the chunks in
// reverse), warmup = min((P - s - 1) * 2 + (v - 1) * P, M v) forwards, then one forward and one
// backward per step, then the remaining backwards. Needs M % P == 0 (check_schedule). Messages
// travel a ring: chunk c on rank s sends its output to chunk c on rank s + 1, rank P - 1's chunk c to
// rank 0's chunk c + 1 (gradients the reverse way). With v = 1 it is 1F1B.
//
// ZB-H1 (Qi et al., ICLR 2024, "Zero Bubble Pipeline Parallelism", the handcrafted H1): each
// backward is split into B (the input gradient, which the previous stage waits for: Kind::Backward)
// and W (the weight gradient: Kind::BackwardWeight). Stage s runs 1F1B's forwards and B's, and
// defers the W's of its first min(s, steady) steady-state micro-batches: in the steady state each
// step is F, B, then the oldest pending W once s of them wait; the cooldown runs B then W; the s
// deferred W's close the list. W's run in micro-batch order, so weight gradients accumulate in
// 1F1B's order. Every stage holds up to min(P, M) micro-batches between F and W (1F1B's bound on
// stage 0, the most any 1F1B stage holds), but only 1F1B's min(P - s, M) between F and B: the
// extra s are W-only states (max_awaiting_backward). The W that follows a steady-state B goes before
// the exchange after that B when the exchange also receives the next forward's input (it fills the
// wait for it), else after it.
// Timed with F = B = W and M >= P: makespan 3 M + P - 1, a bubble of P - 1 units against 1F1B's
// 3 (P - 1) (a third; in general (P - 1)(F + B - W) for W <= B).
#pragma once
#include <string>
#include <vector>

#include "core/config.h"

namespace tpt {

struct Action {
  enum class Kind { Forward, Backward, Comm, BackwardWeight };
  Kind kind = Kind::Comm;
  // Forward / Backward / BackwardWeight: the micro-batch and the local model chunk (0 .. v - 1; the
  // rank's chunk c is virtual stage c * P + stage). Backward is the full backward in lists without
  // BackwardWeight (1F1B, GPipe, interleaved), and B (input gradient only) in lists with it (ZB-H1),
  // whose BackwardWeight (W) then computes the micro-batch's weight gradients.
  int mb = -1;
  int chunk = 0;
  // Comm: one exchange, posted together and completed together, at most one message of each kind:
  int send_fwd = -1;  // send the output activation of micro-batch n to the next virtual stage
  int recv_fwd = -1;  // receive the input activation of micro-batch n from the previous virtual stage
  int send_bwd = -1;  // send the input gradient of micro-batch n to the previous virtual stage
  int recv_bwd = -1;  // receive the output gradient of micro-batch n from the next virtual stage
  // The local chunk each message belongs to on this rank (the chunk whose output is sent, whose
  // input is received, ...). Peers: send_fwd / recv_bwd talk to rank (stage + 1) mod P, recv_fwd /
  // send_bwd to rank (stage - 1) mod P; the peer's chunk is the same, except across the ring's seam
  // (rank P - 1's chunk c <-> rank 0's chunk c + 1). With v = 1 every chunk is 0, no message crosses
  // the seam, and a Comm action holds at most one send and one receive (the 1F1B / GPipe pairs);
  // interleaved lists also have actions with all four messages (Megatron's
  // send_forward_backward_recv_forward_backward).
  int send_fwd_chunk = 0;
  int recv_fwd_chunk = 0;
  int send_bwd_chunk = 0;
  int recv_bwd_chunk = 0;
  std::string str() const;  // "F3", "B3", "W3" (chunk 0), "F3c1" (chunk 1), "comm{ send_fwd 3 recv_bwd 0c1 }"
};

enum class ScheduleKind { OneFOneB, GPipe, ForwardOnly, Interleaved1F1B, ZeroBubbleH1 };
// The training schedule of parallel.pipeline_schedule with `chunks` model chunks per rank. The
// interleaved schedule has no name of its own (as in Megatron: 1f1b with
// virtual_pipeline_model_parallel_size > 1 is the interleaved schedule).
ScheduleKind schedule_kind(PipelineSchedule schedule, int chunks);

// Why (kind, stages, microbatches, chunks) has no schedule, naming the config keys, or "" if it has.
// chunks (virtual_pipeline_model_parallel_size) > 1 needs the interleaved schedule (or ForwardOnly),
// more than one stage, and microbatches (per DP rank) a multiple of stages, as Megatron requires.
std::string check_schedule(ScheduleKind kind, int stages, int microbatches, int chunks = 1);

// The actions of stage `stage` of `stages` for `microbatches` micro-batches. chunks: model chunks
// per rank (Interleaved1F1B; ForwardOnly with chunks > 1 is the interleaved forward-only order);
// Interleaved1F1B with chunks = 1 is OneFOneB. Throws InputError with check_schedule's message.
std::vector<Action> make_schedule(ScheduleKind kind, int stages, int stage, int microbatches, int chunks = 1);

// How many micro-batches a stage holds between forward and the end of their backward at most, over
// all its chunks together (activation slots). The end is the BackwardWeight where the list has any,
// else the Backward.
int max_in_flight(const std::vector<Action>& actions);
// The same per chunk (activation slots per chunk; its size is 1 + the largest chunk in the list).
std::vector<int> max_in_flight_per_chunk(const std::vector<Action>& actions);
// The pipeline's receive buffers a list needs per chunk (its size `chunks`): a received activation
// lives until its micro-batch's Forward of the chunk, a received gradient until its Backward, and
// the buffer of micro-batch mb is mb mod the count -- so the count is the widest span of micro-batch
// indices received and not yet consumed at once (0 where the chunk receives nothing: the first
// virtual stage's activations, the last one's gradients).
struct ReceiveBuffers {
  std::vector<int> activations, gradients;
};
ReceiveBuffers receive_buffers(const std::vector<Action>& actions, int chunks);
// Micro-batches between forward and Backward (B), all chunks together: the activations a split
// backward has not yet released in part (for lists without BackwardWeight equal to max_in_flight).
int max_awaiting_backward(const std::vector<Action>& actions);

// Activation slots shared by a stage's model chunks (model/gpt.h StageOptions::slot_pool): each
// micro-batch of each chunk takes the lowest free slot at its Forward and frees it at the end of its
// backward (BackwardWeight where the list has any, else Backward) -- so `slots` is max_in_flight --
// or, in a list without backward, once its output is sent (its send_fwd's Comm; the last virtual
// stage's, which are not sent, after their Forward: the loss reads them there). slot[chunk][mb]; slots: how many the list uses.
struct SlotPool {
  std::vector<std::vector<int>> slot;
  int slots = 0;
};
SlotPool pool_slots(const std::vector<Action>& actions, int chunks, int microbatches);

// A micro-batch count whose schedule holds the same in-flight counts on every stage (max_in_flight,
// max_in_flight_per_chunk, max_awaiting_backward) as `microbatches`: past the warm-up they stop
// growing with M for every kind but GPipe (which holds all M), so above (chunks + 1) x stages that
// count (a multiple of stages, as interleaving needs); M itself otherwise. The planner's memory
// uses it, so that its cost does not grow with the batch (tests/unit/schedule_test.cpp: the same counts).
int in_flight_equivalent_microbatches(ScheduleKind kind, int stages, int microbatches, int chunks = 1);

// Runs all stages' lists together under rendezvous semantics (a Comm action completes only when
// every message in it has its matching counterpart posted). Checks: sends and receives pair up in
// order with the same micro-batch and chunk on each directed stream (activations rank s -> s + 1,
// gradients s + 1 -> s, modulo P); nothing deadlocks; per (micro-batch, chunk) forward, then
// backward, then weight backward, each exactly once, on every stage and chunk the same micro-batches;
// a stage whose list has a BackwardWeight runs one for each backward; a virtual stage but the first
// receives an activation before its forward and one but the last a gradient before its backward;
// data is sent only after it was computed and only to a virtual stage that exists; and, per directed
// rank pair, messages are received in the order they are sent across both streams, as NCCL, which has
// no tags, pairs them (posting order: the actions in order, within one send_fwd, send_bwd, recv_fwd,
// recv_bwd). That matters for P <= 2, where both streams join the same ranks; the checks above do not
// imply it (one rank posting both in one exchange, the peer receiving the gradient first in an earlier
// one, does not deadlock). The number of chunks is 1 + the largest chunk in any list. Returns an empty
// string if all holds, else what went wrong.
std::string simulate(const std::vector<std::vector<Action>>& stages, bool with_backward = true);

// Timed run of all stages' lists (the semantics of simulate, which must pass): a compute action takes
// its cost, a Comm action ends when every message in it has its counterpart posted, plus p2p if it
// carries data. f, b, w: one micro-batch's forward, input-gradient and weight-gradient work on one
// rank's whole share of layers; a chunk's action costs 1 / v of it (v chunks per rank); a Backward
// costs b + w on a stage whose list has no BackwardWeight, else b.
struct PipelineTiming {
  double makespan = 0;
  std::vector<double> busy;         // compute time per stage
  double ideal() const;             // the largest busy time: the makespan without any bubble
  double bubble_fraction() const;   // max over stages of 1 - busy / makespan
  double bubble_over_ideal() const; // (makespan - ideal) / ideal: Megatron's (P - 1) / (v M) for interleaved
};
PipelineTiming time_pipeline(const std::vector<std::vector<Action>>& stages, double f, double b, double w,
                             double p2p = 0.0);
// The same with costs per stage (the planner's: the first and last stages do more work).
PipelineTiming time_pipeline(const std::vector<std::vector<Action>>& stages, const std::vector<double>& f,
                             const std::vector<double>& b, const std::vector<double>& w, double p2p = 0.0);
double schedule_makespan(const std::vector<std::vector<Action>>& stages, double f, double b, double w);

}  // namespace tpt
