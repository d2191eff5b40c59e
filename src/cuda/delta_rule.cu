// The public CUDA entry points: argument checks, the workspace plan, dtype dispatch, launches.
//
// The forward workspace's header. A backward handed a forward's workspace (forward_workspace)
// reads that forward's intermediates, so it checks that they are these inputs': every forward
// writes a header at the start of its workspace (magic, device, B T HK HV K V, chunk size,
// sequences, chunk slots, segments, flags, dtypes, scale), and the backward compares it, with
// that forward's sequence table (cu_seqlens as the forward read them), to its own. The header
// lives in device memory and is written on the stream, like the rest of the workspace, so the
// host cannot read it without synchronizing, which a call must not do (it would stall the host
// on every backward, and a CUDA graph cannot capture it). The alternatives check less: the
// workspace's size catches only some other shapes (a larger buffer passes), and a header kept on
// the host (a table of the forwards by workspace address, or a receipt the caller carries) says
// what the host last enqueued there, not what the device holds when the backward runs (graph
// replays, another forward since, memory reused). So the comparison runs on the device, in the
// backward's first kernel (chunk_table.cu), which builds the backward's own chunk table: on a
// mismatch it leaves that table empty, so that every later kernel computes nothing (none reads
// the forward's workspace or writes by its chunks, which may lie outside these gradients), sets
// the gradients to NaN, and writes what differs to a mailbox in mapped host memory
// (cuda/device.h). The host reads the mailbox, without synchronizing, at the start of every
// forward and backward and in gdn::cuda_check_deferred_errors(), and throws the gdn::Error there:
// "... T is 128 in the forward that wrote it and 64 in the backward". Graph-safe (the header
// travels as a kernel argument, the mailbox address is fixed), and it costs the backward one
// one-block launch (a few microseconds) and 256 bytes of header. What the host can check at once
// it does: the workspace's size, and that it is memory of the current device.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>

#include "cuda/check.h"
#include "cuda/device.h"
#include "cuda/kernels.h"
#include "cuda/segments.h"
#include "cuda/stages.h"
#include "gdn/cuda.h"
#include "gdn/error.h"
#include "validate.h"

namespace gdn {
namespace {

using cuda::bf16;
using cuda::kC;
using cuda::kD;

std::string str(std::int64_t x) {
  return std::to_string(x);
}

// Shapes from the host copy of cu_seqlens, and the checks this backend adds to validate().
// Without cu_seqlens_host, cu_seqlens' values are not read (they are on the device).
DeltaRuleShape check_inputs(const DeltaRuleInputs& in, const TensorRef& cu_seqlens_host) {
  DeltaRuleInputs host = in;
  if (in.cu_seqlens.given() && cu_seqlens_host.given()) {
    if (cu_seqlens_host.shape != in.cu_seqlens.shape ||
        cu_seqlens_host.dtype != in.cu_seqlens.dtype)
      throw Error("cu_seqlens_host must match cu_seqlens' shape and dtype, got " +
                  cu_seqlens_host.shape_string() + " vs " + in.cu_seqlens.shape_string());
    host.cu_seqlens = cu_seqlens_host;
  }
  const DeltaRuleShape s = validate_shapes(host, !in.cu_seqlens.given() || cu_seqlens_host.given());
  if (s.K != kD || s.V != kD)
    throw Error("K and V must be 128 on CUDA, got K = " + str(s.K) + ", V = " + str(s.V));
  if (in.chunk_size != kC)
    throw Error("chunk_size must be 64 on CUDA, got " + std::to_string(in.chunk_size));
  if (in.q.dtype != DType::bf16 && in.q.dtype != DType::f16)
    throw Error("q must be bf16 or f16 on CUDA, got " + std::string(dtype_name(in.q.dtype)));
  if (in.g.dtype != DType::f32)
    throw Error("g must be f32 on CUDA, got " + std::string(dtype_name(in.g.dtype)));
  if (in.beta.dtype != DType::f32 && in.beta.dtype != in.q.dtype)
    throw Error("beta must be f32 or q's dtype on CUDA, got " +
                std::string(dtype_name(in.beta.dtype)));
  if (in.initial_state.given() && in.initial_state.dtype != DType::f32)
    throw Error("initial_state must be f32 on CUDA, got " +
                std::string(dtype_name(in.initial_state.dtype)));
  return s;
}

void require_dtype(const char* name, const TensorRef& t, DType dtype) {
  if (t.given() && t.dtype != dtype)
    throw Error(std::string(name) + " must be " + std::string(dtype_name(dtype)) +
                " on CUDA, got " + std::string(dtype_name(t.dtype)));
}

// The chunks of all sequences, and of the longest.
struct ChunkCount {
  std::int64_t total = 0, longest = 0;
};

// Without a host copy of cu_seqlens, bounds from the shapes alone: N sequences of at least one
// token each (cu_seqlens is strictly increasing) hold at most (T + (kC - 1) N) / kC chunks, none
// more than T's; the chunk table (built on the device) leaves the slots it does not use empty.
ChunkCount count_chunks(const DeltaRuleInputs& in, const DeltaRuleShape& s,
                        const TensorRef& cu_seqlens_host) {
  if (!in.cu_seqlens.given()) {
    const std::int64_t per_row = (s.T + kC - 1) / kC;
    return {s.B * per_row, per_row};
  }
  if (!cu_seqlens_host.given())
    return {std::min((s.T + (kC - 1) * s.N) / kC, s.T), (s.T + kC - 1) / kC};
  ChunkCount count;
  for (std::int64_t n = 0; n < s.N; ++n) {
    auto at = [&](std::int64_t i) {
      return cu_seqlens_host.dtype == DType::i64
                 ? static_cast<const std::int64_t*>(cu_seqlens_host.data)[i]
                 : static_cast<const std::int32_t*>(cu_seqlens_host.data)[i];
    };
    const std::int64_t chunks = (at(n + 1) - at(n) + kC - 1) / kC;
    count.total += chunks;
    count.longest = std::max(count.longest, chunks);
  }
  return count;
}

int multiprocessors() {
  int device = 0, sms = 1;
  GDN_CUDA_CHECK(cudaGetDevice(&device));
  GDN_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  return sms;
}

// The segments and transfer parts of the state passes (segments.h: the cost model).
void choose_segments(std::int64_t heads, std::int64_t longest, bool carried, bool training,
                     cuda::Params& p) {
  const cuda::SegmentPlan plan =
      cuda::plan_segments(heads, longest, carried, training, multiprocessors());
  p.seg_count = plan.count;
  p.seg_len = plan.length;
  p.seg_parts = plan.parts;
  p.part_len = plan.part_length;
}

// A workspace, carved in 256-byte aligned pieces; with base == nullptr it only counts.
struct Carver {
  char* base;
  std::size_t used = 0;
  template <typename T>
  T* take(std::int64_t count) {
    T* p = base ? reinterpret_cast<T*>(base + used) : nullptr;
    used += (static_cast<std::size_t>(count) * sizeof(T) + 255) / 256 * 256;
    return p;
  }
};

// Whether the backward recomputes h and Vn, round by round: unless its forward saved them, which
// a training forward does when the backward runs in one round.
bool recomputes(bool saved, int rounds) {
  return !saved || rounds > 1;
}

// Whether the forward runs the segment summaries (and the folds compose them).
bool has_summaries(const cuda::Params& p) {
  return p.seg_count > 1 || p.enters || p.leaves;
}

// Whether the backward runs the gradient offsets D_k (a summary of each segment's gradient):
// not with its chains beside grad_chunk, which run each sequence whole.
bool has_grad_offsets(const cuda::Params& p) {
  return (p.seg_count > 1 || p.enters) && !p.beside;
}

// The header of a call's workspace (the forward's, or what a backward expects there).
cuda::WorkspaceHeader header_of(const DeltaRuleInputs& in, const cuda::Params& p, int device,
                                bool saved) {
  cuda::WorkspaceHeader h{};
  int* f = h.field;
  f[cuda::kMagic] = cuda::kHeaderMagic;
  f[cuda::kDevice] = device;
  f[cuda::kBatch] = p.B;
  f[cuda::kTokens] = p.T;
  f[cuda::kKeyHeads] = p.HK;
  f[cuda::kValueHeads] = p.HV;
  f[cuda::kKeyDim] = kD;
  f[cuda::kValueDim] = kD;
  f[cuda::kChunk] = kC;
  f[cuda::kSequences] = p.N;
  f[cuda::kSlots] = p.NC;
  f[cuda::kSegments] = p.seg_count;
  f[cuda::kSegmentLength] = p.seg_len;
  f[cuda::kTransferParts] = p.seg_parts;
  f[cuda::kL2norm] = p.l2norm;
  f[cuda::kInitialState] = in.initial_state.given();
  f[cuda::kVarlen] = in.cu_seqlens.given();
  f[cuda::kOffsets64] = p.cu_seqlens_i64;
  f[cuda::kSaved] = saved;
  f[cuda::kEnters] = p.enters;
  f[cuda::kLeaves] = p.leaves;
  f[cuda::kDtype] = in.q.dtype == DType::bf16 ? 1 : 2;
  f[cuda::kBetaDtype] = p.beta_code;
  static_assert(sizeof(float) == sizeof(int));
  std::memcpy(&f[cuda::kScale], &p.scale, sizeof(float));
  return h;
}

// Fills the params' shapes, inputs and workspace pointers; returns the bytes used in
// `workspace`. The forward's part comes first: its header, its chunk table and its
// intermediates (with `saved`, the per-chunk states and Vn too, or with several backward rounds
// the states entering the rounds); a backward given the forward's
// workspace (forward_workspace) takes them from there and only its own buffers from `workspace`
// (the kernels that write them are then not launched), its own chunk table first, which the
// check of the forward's header builds.
std::size_t plan(const DeltaRuleInputs& in, const DeltaRuleShape& s, ChunkCount chunks,
                 bool backward, void* workspace, const void* forward_workspace, bool reuse,
                 bool saved, const cuda::Carried& carried, int device, cuda::Params& p) {
  const std::int64_t NC = chunks.total;
  p = cuda::Params{};
  p.B = static_cast<int>(s.B);
  p.T = static_cast<int>(s.T);
  p.HK = static_cast<int>(s.HK);
  p.HV = static_cast<int>(s.HV);
  p.N = static_cast<int>(s.N);
  p.NC = static_cast<int>(NC);
  choose_segments(s.N * s.HV, chunks.longest, carried.enters || carried.leaves, saved, p);
  p.scale = static_cast<float>(in.scale != 0 ? in.scale : 1.0 / std::sqrt(double(s.K)));
  p.l2norm = in.use_qk_l2norm;
  p.beta_code = in.beta.dtype == DType::f32 ? 0 : in.beta.dtype == DType::bf16 ? 1 : 2;
  p.q = in.q.data;
  p.k = in.k.data;
  p.v = in.v.data;
  p.g = static_cast<const float*>(in.g.data);
  p.beta = in.beta.data;
  p.h0 = static_cast<const float*>(in.initial_state.data);
  p.cu_seqlens = in.cu_seqlens.data;
  p.cu_seqlens_i64 = in.cu_seqlens.dtype == DType::i64;
  p.enters = carried.enters;
  p.leaves = carried.leaves;
  p.map_M = carried.map_M;
  p.map_N = carried.map_N;
  const bool summaries = has_summaries(p);
  p.header = header_of(in, p, device, saved);

  // const_cast: with reuse, nothing writes the forward's part.
  Carver c{reuse ? const_cast<char*>(static_cast<const char*>(forward_workspace))
                 : static_cast<char*>(workspace)};
  const std::int64_t tokens = s.B * s.T, slots = NC * s.HV;
  cuda::WorkspaceHeader* const header = c.take<cuda::WorkspaceHeader>(1);
  p.chunks = c.take<cuda::ChunkInfo>(NC);
  p.chunk_begin = c.take<int>(s.N + 1);
  p.seq_begin = c.take<int>(s.N);
  p.seq_len = c.take<int>(s.N);
  if (in.q.dtype == DType::bf16) {  // the kernels read q, k in place (dense, tensor.h)
    p.qn = static_cast<const bf16*>(in.q.data);
    p.kn = static_cast<const bf16*>(in.k.data);
  } else {
    p.qn = p.qn_copy = c.take<bf16>(tokens * s.HK * kD);
    p.kn = p.kn_copy = c.take<bf16>(tokens * s.HK * kD);
  }
  p.rq = c.take<float>(tokens * s.HK);
  p.rk = c.take<float>(tokens * s.HK);
  p.G = c.take<float>(slots * kC);
  p.bt = c.take<float>(slots * kC);
  p.gates = c.take<float>(slots * cuda::kGates * kC);
  p.A = c.take<bf16>(slots * kC * kC);
  p.P = c.take<bf16>(slots * kC * kC);
  const std::int64_t matrices = s.N * p.seg_count * s.HV * kD * kD;
  if (summaries) {
    p.seg_local = c.take<float>(matrices);
    p.seg_transfer = c.take<float>(matrices * p.seg_parts);
    p.seg_state = c.take<float>(matrices);
  }
  // The backward's rounds, planned in the forward too: a training forward saves h and Vn for a
  // backward in one round, else the states entering the rounds.
  const std::int64_t segments = s.N * p.seg_count;
  const cuda::RoundPlan rounds = cuda::plan_rounds(segments, p.seg_len, NC, s.HV);
  p.rounds = rounds.count;
  p.round_len = rounds.length;
  p.round_slots = static_cast<int>(rounds.slots);
  p.round_by_slots = rounds.by_slots;
  const int sms = multiprocessors();
  p.beside =
      backward && !p.enters && !p.leaves &&
      cuda::chains_beside(s.N, s.HV, NC, {p.seg_count, p.seg_len, p.seg_parts, p.part_len}, sms);
  if (cuda::beside_in_rounds(p)) p.round_slots = p.seg_len;  // a round holds one segment
  p.seg_group = cuda::segment_group(segments, s.HV, sms);
  p.fold_tiles = cuda::fold_tiles(s.N * s.HV, sms);
  p.compose = summaries && !p.enters && !p.leaves && p.seg_count == 3 && p.seg_parts == 1 &&
              p.seg_group == 1;
  p.round_group =
      cuda::segment_group(std::min<std::int64_t>(segments, rounds.slots * p.seg_count), s.HV, sms);
  const std::int64_t at_boundaries = rounds.boundaries(segments) * s.HV * kD * kD;  // floats
  if (saved && rounds.count == 1) {
    p.h = c.take<bf16>(slots * kD * kD);
    p.vn = c.take<bf16>(slots * kC * kD);
  } else if (saved) {
    p.round_state = c.take<float>(at_boundaries);
  }
  if (!reuse) p.header_out = header;
  if (!backward) return c.used;
  Carver b{static_cast<char*>(workspace), reuse ? 0 : c.used};
  if (reuse) {
    p.saved_header = header;
    p.saved_chunk_begin = p.chunk_begin;
    p.saved_seq_begin = p.seq_begin;
    p.saved_seq_len = p.seq_len;
    p.chunks = b.take<cuda::ChunkInfo>(NC);
    p.chunk_begin = b.take<int>(s.N + 1);
    p.seq_begin = b.take<int>(s.N);
    p.seq_len = b.take<int>(s.N);
  }
  if (summaries && !(p.beside && rounds.count == 1)) {
    p.seg_dlocal = b.take<float>(matrices);
    p.seg_dstate = b.take<float>(matrices);
  }
  if (!saved && rounds.count > 1) p.round_state = b.take<float>(at_boundaries);
  if (recomputes(saved, rounds.count)) {  // a round's h and Vn (one round: every chunk slot)
    p.h = b.take<bf16>(p.round_slots * s.HV * kD * kD);
    p.vn = b.take<bf16>(p.round_slots * s.HV * kC * kD);
  }
  p.round_first = b.take<int>(rounds.by_slots ? rounds.count : rounds.count * segments);
  p.round_chunks = b.take<cuda::RoundChunk>(std::int64_t{cuda::backward_rounds(p)} * p.round_slots);
  if (rounds.count > 1) p.round_dstate = b.take<float>(at_boundaries);
  p.dh = b.take<bf16>(p.round_slots * s.HV * kD * kD);
  p.dvn = b.take<bf16>(p.round_slots * s.HV * kC * kD);
  if (p.beside) p.ready = b.take<int>(p.round_slots * s.HV);
  return b.used;
}

void check_workspace(const char* name, const void* workspace, std::size_t bytes,
                     std::size_t needed) {
  if (workspace == nullptr || bytes < needed)
    throw Error(std::string(name) + ": needs " + std::to_string(needed) +
                " bytes of device memory, got " + std::to_string(bytes) +
                (workspace ? "" : " (nullptr)"));
  if (reinterpret_cast<std::uintptr_t>(workspace) % 256 != 0)
    throw Error(std::string(name) + " must be 256-byte aligned");
}

// One call's checked shapes and filled params; empty when there is nothing to compute.
struct Call {
  cuda::Params p;
  cudaStream_t stream;
  bool bf16, empty;
  bool reuse = false, saved = false;  // backward: reads the forward's workspace (and its h, Vn)
};

// out: null for the stages before the output pass.
Call forward_call(const DeltaRuleInputs& in, const DeltaRuleOutputs* out, const CudaContext& ctx,
                  const cuda::Carried& carried) {
  const DeltaRuleShape s = check_inputs(in, ctx.cu_seqlens_host);
  if (out) {
    validate_outputs(in, s, *out);
    require_dtype("o", out->o, in.q.dtype);
    require_dtype("final_state", out->final_state, DType::f32);
  }
  const int device = cuda::require_hopper();
  cuda::raise_deferred_errors();
  const ChunkCount chunks = count_chunks(in, s, ctx.cu_seqlens_host);
  Call call{{},
            reinterpret_cast<cudaStream_t>(ctx.stream),
            in.q.dtype == DType::bf16,
            s.T == 0 || chunks.total == 0};
  // Carving only computes pointers: nothing is read or written before the check.
  check_workspace("workspace", ctx.workspace, ctx.workspace_bytes,
                  plan(in, s, chunks, false, ctx.workspace, nullptr, false, ctx.save_for_backward,
                       carried, device, call.p));
  call.p.deferred = cuda::deferred_errors();
  if (out) {
    call.p.o = out->o.data;
    call.p.ht = static_cast<float*>(out->final_state.data);
  }
  return call;
}

Call backward_call(const DeltaRuleInputs& in, const DeltaRuleGrads& gr, const CudaContext& ctx,
                   const cuda::Carried& carried) {
  const DeltaRuleShape s = check_inputs(in, ctx.cu_seqlens_host);
  validate_grads(in, s, gr);
  require_dtype("d_o", gr.d_o, in.q.dtype);
  require_dtype("d_final_state", gr.d_final_state, DType::f32);
  require_dtype("dq", gr.dq, in.q.dtype);
  require_dtype("dk", gr.dk, in.q.dtype);
  require_dtype("dv", gr.dv, in.q.dtype);
  require_dtype("dg", gr.dg, DType::f32);
  require_dtype("dbeta", gr.dbeta, in.beta.dtype);
  require_dtype("dh0", gr.dh0, DType::f32);
  const int device = cuda::require_hopper();
  cuda::raise_deferred_errors();
  const ChunkCount chunks = count_chunks(in, s, ctx.cu_seqlens_host);
  Call call{{},
            reinterpret_cast<cudaStream_t>(ctx.stream),
            in.q.dtype == DType::bf16,
            s.T == 0 || chunks.total == 0};
  call.reuse = ctx.forward_workspace != nullptr;
  call.saved = call.reuse && ctx.save_for_backward;
  if (ctx.save_for_backward && !call.reuse)
    throw Error("save_for_backward on a backward needs forward_workspace (the saving forward's)");
  if (call.reuse) {
    check_workspace(
        "forward_workspace", ctx.forward_workspace, ctx.forward_workspace_bytes,
        plan(in, s, chunks, false, nullptr, nullptr, false, call.saved, carried, device, call.p));
    if (ctx.workspace == ctx.forward_workspace)
      throw Error(
          "workspace must be another buffer than forward_workspace, whose content the "
          "backward reads");
    // The device-side check reads the header there: it must be this device's memory.
    const int owner = cuda::device_of(ctx.forward_workspace);
    if (owner >= 0 && owner != device)
      throw Error("forward_workspace is memory of device " + std::to_string(owner) +
                  ", but this backward runs on device " + std::to_string(device) +
                  " (the current device), like its forward must have");
  }
  check_workspace("workspace", ctx.workspace, ctx.workspace_bytes,
                  plan(in, s, chunks, true, ctx.workspace, ctx.forward_workspace, call.reuse,
                       call.saved, carried, device, call.p));
  cuda::Params& p = call.p;
  p.deferred = cuda::deferred_errors();
  p.d_o = gr.d_o.data;
  p.dht = static_cast<const float*>(gr.d_final_state.data);
  p.dq = gr.dq.data;
  p.dk = gr.dk.data;
  p.dv = gr.dv.data;
  p.dg = static_cast<float*>(gr.dg.data);
  p.dbeta = gr.dbeta.data;
  p.dh0 = static_cast<float*>(gr.dh0.data);
  return call;
}

// The stages, by input dtype.
template <typename In>
void summarize_forward(const Call& c) {
  cuda::launch_chunk_table(c.p, c.stream);
  cuda::launch_chunk_prep<In>(c.p, c.stream);
  if (has_summaries(c.p)) cuda::launch_state_forward<In, cuda::Pass::summary>(c.p, c.stream);
}

// A training forward in several rounds runs the output pass, which keeps the rounds' states.
template <typename In>
void finish_forward(const Call& c, bool save) {
  if (has_summaries(c.p) && !c.p.compose) cuda::launch_fold(c.p, cuda::Fold::states, c.stream);
  if (save && !recomputes(save, c.p.rounds))
    cuda::launch_state_forward<In, cuda::Pass::save>(c.p, c.stream);
  else
    cuda::launch_state_forward<In, cuda::Pass::output>(c.p, c.stream);
}

// Whether the backward's summary runs with the last round's recompute beside it (kernels.h).
bool shares_summary(const Call& c) {
  return has_grad_offsets(c.p) && recomputes(c.saved, c.p.rounds);
}

template <typename In>
void summarize_backward(const Call& c) {
  if (!c.reuse) {
    summarize_forward<In>(c);
    if (has_summaries(c.p)) cuda::launch_fold(c.p, cuda::Fold::states, c.stream);
  } else {  // this backward's own chunk table, and the check of the forward's header
    cuda::launch_chunk_table(c.p, c.stream);
  }
  if (!c.saved && c.p.rounds > 1)  // the states entering the rounds
    cuda::launch_state_forward<In, cuda::Pass::states>(c.p, c.stream);
  if (shares_summary(c))  // the gradient offsets D_k and the last round's h, Vn
    cuda::launch_backward_summary<In>(c.p, c.stream);
  else if (has_grad_offsets(c.p))  // the gradient offsets D_k
    cuda::launch_state_backward<In, true>(c.p, c.stream);
}

template <typename In>
void finish_backward(const Call& c) {
  if (has_summaries(c.p) && !c.p.beside) cuda::launch_fold(c.p, cuda::Fold::grad_states, c.stream);
  cuda::Params round = c.p;
  const int rounds = cuda::backward_rounds(c.p);
  for (round.round = rounds - 1; round.round >= 0; --round.round) {    // the last first
    const bool done = round.round == rounds - 1 && shares_summary(c);  // h, Vn
    if (recomputes(c.saved, c.p.rounds) && !done)
      cuda::launch_state_forward<In, cuda::Pass::recompute>(round, c.stream);
    if (c.p.beside)
      GDN_CUDA_CHECK(
          cudaMemsetAsync(c.p.ready, 0, sizeof(int) * c.p.round_slots * c.p.HV, c.stream));
    cuda::launch_state_backward<In, false>(round, c.stream);
    cuda::launch_grad_chunk<In>(round, c.stream);
  }
}

template <typename Fn>
void by_dtype(const Call& c, Fn fn) {
  if (c.empty) return;
  if (c.bf16)
    fn(bf16{});
  else
    fn(__half{});
}

}  // namespace

namespace cuda {

std::size_t forward_workspace_bytes(const DeltaRuleInputs& in, const TensorRef& cu_seqlens_host,
                                    bool save, const Carried& carried) {
  const DeltaRuleShape s = check_inputs(in, cu_seqlens_host);
  const int device = require_hopper();
  Params p;
  return plan(in, s, count_chunks(in, s, cu_seqlens_host), false, nullptr, nullptr, false, save,
              carried, device, p);
}

std::size_t backward_workspace_bytes(const DeltaRuleInputs& in, const TensorRef& cu_seqlens_host,
                                     bool reuse, bool save, const Carried& carried) {
  const DeltaRuleShape s = check_inputs(in, cu_seqlens_host);
  const int device = require_hopper();
  Params p;
  return plan(in, s, count_chunks(in, s, cu_seqlens_host), true, nullptr, nullptr, reuse,
              reuse && save, carried, device, p);
}

void forward_summaries(const DeltaRuleInputs& in, const CudaContext& ctx, const Carried& carried) {
  const Call c = forward_call(in, nullptr, ctx, carried);
  by_dtype(c, [&](auto t) { summarize_forward<decltype(t)>(c); });
}

void forward_maps(const DeltaRuleInputs& in, const CudaContext& ctx, const Carried& carried) {
  const Call c = forward_call(in, nullptr, ctx, carried);
  if (c.empty) return;
  launch_fold(c.p, Fold::map_offset, c.stream);
  launch_fold(c.p, Fold::map_transfer, c.stream);
}

void forward_output(const DeltaRuleInputs& in, const DeltaRuleOutputs& out, const CudaContext& ctx,
                    const Carried& carried) {
  const Call c = forward_call(in, &out, ctx, carried);
  by_dtype(c, [&](auto t) { finish_forward<decltype(t)>(c, ctx.save_for_backward); });
}

void backward_summaries(const DeltaRuleInputs& in, const DeltaRuleGrads& grads,
                        const CudaContext& ctx, const Carried& carried) {
  const Call c = backward_call(in, grads, ctx, carried);
  by_dtype(c, [&](auto t) { summarize_backward<decltype(t)>(c); });
}

void backward_map(const DeltaRuleInputs& in, const DeltaRuleGrads& grads, const CudaContext& ctx,
                  const Carried& carried) {
  const Call c = backward_call(in, grads, ctx, carried);
  if (!c.empty) launch_fold(c.p, Fold::grad_offset, c.stream);
}

void backward_output(const DeltaRuleInputs& in, const DeltaRuleGrads& grads, const CudaContext& ctx,
                     const Carried& carried) {
  const Call c = backward_call(in, grads, ctx, carried);
  by_dtype(c, [&](auto t) { finish_backward<decltype(t)>(c); });
}

}  // namespace cuda

std::size_t delta_rule_forward_cuda_workspace(const DeltaRuleInputs& in,
                                              const TensorRef& cu_seqlens_host,
                                              bool save_for_backward) {
  return cuda::forward_workspace_bytes(in, cu_seqlens_host, save_for_backward, {});
}

std::size_t delta_rule_backward_cuda_workspace(const DeltaRuleInputs& in,
                                               const TensorRef& cu_seqlens_host, bool reuse_forward,
                                               bool save_for_backward) {
  return cuda::backward_workspace_bytes(in, cu_seqlens_host, reuse_forward, save_for_backward, {});
}

void delta_rule_forward_cuda(const DeltaRuleInputs& in, const DeltaRuleOutputs& out,
                             const CudaContext& ctx) {
  const Call c = forward_call(in, &out, ctx, {});
  by_dtype(c, [&](auto t) {
    summarize_forward<decltype(t)>(c);
    finish_forward<decltype(t)>(c, ctx.save_for_backward);
  });
}

void delta_rule_backward_cuda(const DeltaRuleInputs& in, const DeltaRuleGrads& grads,
                              const CudaContext& ctx) {
  const Call c = backward_call(in, grads, ctx, {});
  by_dtype(c, [&](auto t) {
    summarize_backward<decltype(t)>(c);
    finish_backward<decltype(t)>(c);
  });
}

}  // namespace gdn
