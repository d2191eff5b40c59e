// The chunk table, from cu_seqlens or the batch rows; the backward rounds' tables; the workspace
// header (delta_rule.cu).
#include "cuda/check.h"
#include "cuda/kernels.h"
#include "cuda/launch.cuh"

namespace gdn::cuda {
namespace {

// A backward that reads a forward's workspace records which of the header's fields differs
// first, or the first sequence whose offsets differ, in the mailbox, unless it holds one already.
__device__ void record_mismatch(const Params& p, int field, int n) {
  volatile DeferredError* e = p.deferred;
  if (e == nullptr || e->state != 0) return;
  e->state = 1;
  e->device = p.header.field[kDevice];
  e->field = field;
  e->sequence = n;
  if (field < kHeaderFields) {
    e->values[0] = p.saved_header->field[field];
    e->values[1] = p.header.field[field];
  } else {
    e->values[0] = p.saved_seq_begin[n];
    e->values[1] = p.saved_seq_len[n];
    e->values[2] = p.seq_begin[n];
    e->values[3] = p.seq_len[n];
  }
  __threadfence_system();  // the fields before the state that says they are there
  e->state = 2;
}

// `count` 16-bit or 32-bit values set to `bits`, by the block.
template <typename T>
__device__ void fill(void* data, long long count, T bits) {
  if (data == nullptr) return;
  for (long long i = threadIdx.x; i < count; i += blockDim.x) static_cast<T*>(data)[i] = bits;
}

// Every gradient of a backward that computes nothing set to NaN: a mismatch is never silent.
__device__ void poison_gradients(const Params& p) {
  using U16 = unsigned short;
  const U16 nan16 = p.header.field[kDtype] == 1 ? U16{0x7FC0} : U16{0x7E00};  // bf16, f16
  const unsigned nan32 = 0x7FC00000u;
  const long long tokens = static_cast<long long>(p.B) * p.T;
  fill(p.dq, tokens * p.HK * kD, nan16);
  fill(p.dk, tokens * p.HK * kD, nan16);
  fill(p.dv, tokens * p.HV * kD, nan16);
  fill(p.dg, tokens * p.HV, nan32);
  if (p.beta_code == 0)
    fill(p.dbeta, tokens * p.HV, nan32);
  else
    fill(p.dbeta, tokens * p.HV, p.beta_code == 1 ? U16{0x7FC0} : U16{0x7E00});
  fill(p.dh0, static_cast<long long>(p.N) * p.HV * kD * kD, nan32);
}

// The exclusive prefix sum of x over the block's threads (in thread order), and the block's
// total in *total, by every thread.
__device__ int block_exclusive_sum(int x, int* total) {
  __shared__ int warp_sums[32];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  int inclusive = x;
  for (int d = 1; d < 32; d *= 2) {
    const int y = __shfl_up_sync(0xffffffffu, inclusive, d);
    if (lane >= d) inclusive += y;
  }
  if (lane == 31) warp_sums[warp] = inclusive;
  __syncthreads();
  int before = 0, all = 0;
  for (int w = 0; w < static_cast<int>(blockDim.x / 32); ++w) {
    before += w < warp ? warp_sums[w] : 0;
    all += warp_sums[w];
  }
  __syncthreads();  // warp_sums is free for the next call
  *total = all;
  return before + inclusive - x;
}

// Leaves every sequence without chunks: no later kernel computes anything.
__device__ void empty_table(const Params& p) {
  for (int n = 0; n <= p.N; ++n) p.chunk_begin[n] = 0;
  for (int n = 0; n < p.N; ++n) p.seq_len[n] = 0;
}

// One block: sequence n has ceil(len / 64) chunks starting at slot chunk_begin[n]. Offsets the
// host did not check (cu_seqlens on the device only) that are not 0, increasing, ending at T, or
// that need more than the NC slots planned, leave every sequence empty: nothing is computed
// (the contract is broken) but nothing is read or written out of bounds either.
//
// It also writes this call's header at header_out (a forward's workspace). A backward that reads
// a forward's workspace builds its own table here, in its own workspace, and compares the header
// there and that forward's table with its own: on a mismatch it leaves every sequence empty too
// (so no later kernel reads the forward's workspace, or writes out of the gradients' bounds by
// that forward's chunks), sets the gradients to NaN and records what differs in the mailbox.
__global__ void chunk_table_kernel(Params p) {
  begin_dependent();            // launch.cuh
  __shared__ int bad_field;     // the first header field that differs, or kHeaderFields
  __shared__ int bad_sequence;  // the first sequence whose offsets differ, or N
  if (threadIdx.x == 0 && p.header_out) *p.header_out = p.header;
  // The sequences, a block's worth at a time, each by a thread; chunk_begin by a block-wide sum.
  int chunks_so_far = 0;
  bool valid = true;
  for (int base = 0; base < p.N; base += blockDim.x) {
    const int n = base + threadIdx.x;
    int chunks = 0;
    if (n < p.N) {
      int begin = 0, len = p.T;
      if (p.cu_seqlens) {
        const long long b0 = p.cu_seqlens_i64 ? static_cast<const long long*>(p.cu_seqlens)[n]
                                              : static_cast<const int*>(p.cu_seqlens)[n];
        const long long b1 = p.cu_seqlens_i64 ? static_cast<const long long*>(p.cu_seqlens)[n + 1]
                                              : static_cast<const int*>(p.cu_seqlens)[n + 1];
        begin = static_cast<int>(b0);
        len = static_cast<int>(b1 - b0);
      }
      valid = valid && len > 0 && begin >= 0 && begin + len <= p.T && (n > 0 || begin == 0) &&
              (n < p.N - 1 || begin + len == p.T);
      p.seq_begin[n] = begin;
      p.seq_len[n] = len;
      chunks = (len + kC - 1) / kC;
    }
    int tile_total = 0;
    const int before = block_exclusive_sum(chunks, &tile_total);
    if (n < p.N) p.chunk_begin[n] = chunks_so_far + before;
    chunks_so_far += tile_total;
  }
  valid = __syncthreads_and(valid) && chunks_so_far <= p.NC;
  if (!valid)  // each thread its own sequences, as written above
    for (int n = threadIdx.x; n < p.N; n += blockDim.x) p.chunk_begin[n] = 0, p.seq_len[n] = 0;
  if (threadIdx.x == 0) {
    p.chunk_begin[p.N] = valid ? chunks_so_far : 0;
    bad_field = kHeaderFields;
    bad_sequence = p.N;
    if (p.saved_header) {
      // Equal fields, except that a forward that saved its states serves a backward that does
      // not read them (the saved ones come after the rest).
      for (int f = 0; f < kHeaderFields && bad_field == kHeaderFields; ++f) {
        const int forward = p.saved_header->field[f], backward = p.header.field[f];
        if (f == kSaved ? backward != 0 && forward != 1 : forward != backward) bad_field = f;
      }
    }
  }
  __syncthreads();
  // The headers agree, so the forward's table is where this call's plan puts it: the same
  // offsets (cu_seqlens, read on the device by both) give the same table.
  const bool compare = p.saved_header != nullptr && bad_field == kHeaderFields;
  if (compare) {
    for (int n = threadIdx.x; n < p.N; n += blockDim.x)
      if (p.saved_seq_begin[n] != p.seq_begin[n] || p.saved_seq_len[n] != p.seq_len[n] ||
          p.saved_chunk_begin[n + 1] != p.chunk_begin[n + 1])
        atomicMin(&bad_sequence, n);
    __syncthreads();
  }
  const bool mismatch = p.saved_header != nullptr && (!compare || bad_sequence < p.N);
  if (mismatch) {
    if (threadIdx.x == 0) {
      record_mismatch(p, bad_field, bad_sequence);
      empty_table(p);
    }
    __syncthreads();
  }
  const int total = p.chunk_begin[p.N];
  const int segments = p.N * p.seg_count;
  if (p.round_chunks) {  // the backward rounds' tables (params.cuh): where each round's chunks go
    for (int r = 0; r < p.rounds && !p.round_by_slots; ++r) {  // by segment: a block-wide sum
      int places_so_far = 0;
      for (int base = 0; base < segments; base += blockDim.x) {
        const int z = base + threadIdx.x;
        const int count =
            z < segments ? min(max(segment(p, z).chunks - r * p.round_len, 0), p.round_len) : 0;
        int tile_total = 0;
        const int before = block_exclusive_sum(count, &tile_total);
        if (z < segments)
          p.round_first[static_cast<long long>(r) * segments + z] = places_so_far + before;
        places_so_far += tile_total;
      }
    }
    const long long places = static_cast<long long>(backward_rounds(p)) * p.round_slots;
    for (long long i = threadIdx.x; i < places; i += blockDim.x)
      p.round_chunks[i] = RoundChunk{0, ChunkInfo{0, 0, 0, 0, 0}};
    for (int r = threadIdx.x; r < p.rounds && p.round_by_slots; r += blockDim.x)
      p.round_first[r] = segments;  // by slots: a round past the chunks (set below if not)
    __syncthreads();
  }
  for (int cid = threadIdx.x; cid < p.NC; cid += blockDim.x) {
    ChunkInfo info{0, 0, 0, 0, 0};
    if (cid < total) {
      int lo = 0, hi = p.N - 1;  // the last n with chunk_begin[n] <= cid
      while (lo < hi) {
        const int mid = (lo + hi + 1) / 2;
        if (p.chunk_begin[mid] <= cid)
          lo = mid;
        else
          hi = mid - 1;
      }
      const int index = cid - p.chunk_begin[lo];
      const int t0 = index * kC;
      info = {lo, p.cu_seqlens ? 0 : lo, p.seq_begin[lo] + t0, min(kC, p.seq_len[lo] - t0), index};
    }
    p.chunks[cid] = info;
    if (p.round_chunks && info.len > 0) {
      const int k = info.index / p.seg_len, local = info.index % p.seg_len;
      int r, place;
      if (beside_in_rounds(p)) {  // a round a segment
        r = info.n * p.seg_count + k, place = local;
      } else if (p.round_by_slots) {
        r = cid / p.round_len, place = cid % p.round_len;
      } else {
        r = local / p.round_len;
        place = p.round_first[r * segments + info.n * p.seg_count + k] + local % p.round_len;
      }
      p.round_chunks[static_cast<long long>(r) * p.round_slots + place] = RoundChunk{cid, info};
      if (p.round_by_slots && place == 0) p.round_first[r] = info.n * p.seg_count + k;
    }
  }
  if (mismatch) poison_gradients(p);
}

}  // namespace

void launch_chunk_table(const Params& p, cudaStream_t stream) {
  launch_dependent(chunk_table_kernel, 1, 256, 0, stream, p);
}

}  // namespace gdn::cuda
