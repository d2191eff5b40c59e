#pragma once
// How the chunk-serial state passes cut each sequence (state_pass.cuh): into `count` segments of
// `length` chunks that run in parallel from the states their summaries and the folds give, and
// each segment's transfer summary M_k further into `parts` pieces of `part_length` chunks
// (M_k = M_k,parts-1 ... M_k,0; the folds compose them; a piece past a short segment's end is the
// identity). A transfer splits for free (its pieces are products of independent factors), an
// offset N_k does not (each piece would need the transfer after it), so the parts fill the
// multiprocessors the offsets leave. parts is a power of two (1 .. 8): the folds find a step's
// segment and part by a shift and a mask; 1 under context parallelism (carried). Host only, no
// CUDA: a function of shapes and the multiprocessor count.

#include <cstdint>

namespace gdn::cuda {

// The n8 tiles of a fold block's slice of the 128-column state (fold.cu, affine.cuh): 4 (32
// columns) where the blocks of `chains` (sequences x value heads) still fill three quarters of
// the multiprocessors so, else 2, else 1 (8 columns: a few heads' chains spread over 16
// multiprocessors each).
int fold_tiles(std::int64_t chains, int multiprocessors);

struct SegmentPlan {
  int count = 1, length = 1, parts = 1, part_length = 1;
};

// heads: sequences x value heads; longest: the longest sequence's chunks; carried: context
// parallelism (summaries of every segment for the rank's maps); training: the forward saves
// for a backward that also runs (the backward's summary and passes count too).
SegmentPlan plan_segments(std::int64_t heads, std::int64_t longest, bool carried, bool training,
                          int multiprocessors);

// The segments a block of a state pass over `segments` segments runs one after another
// (state_pass.cuh: walk), so that many short ones keep each block's copies a chunk or two ahead
// of its products as one long one does: as many as leave about 8 waves of blocks, 1 where the
// segments are few (one a block).
int segment_group(std::int64_t segments, std::int64_t value_heads, int multiprocessors);

// Whether the backward of `sequences` sequences in `chunks` chunk slots runs its chains beside
// grad_chunk (Params::beside; in rounds, a segment a round; several sequences only so):
// state_backward a block a value head over the whole sequence (or the round's segment), no
// gradient offsets and no fold, while grad_chunk's blocks take each chunk on the other
// multiprocessors as soon as the chains have passed it. Chosen where that is expected to take
// less than the segments' way (`plan`: the gradient offsets, their fold and state_backward over
// the segments, then grad_chunk on every multiprocessor): where the value heads leave most
// multiprocessors to grad_chunk and a whole chain takes no longer than grad_chunk's work spread
// over them (32 value heads at T = 4096, 16384 and 65536 on 132 SMs, not 2 at T = 65536).
bool chains_beside(std::int64_t sequences, std::int64_t value_heads, std::int64_t chunks,
                   const SegmentPlan& plan, int multiprocessors);

// The backward's gradient pass (the state recompute, state_backward, then grad_chunk) runs in
// `count` rounds, the last first, so that h, Vn, dh and dVn hold one round's chunks (`slots` of
// them a value head) instead of the call's. A round runs either `length` chunks of every segment
// (by segment: each round keeps every segment busy), or, when that cannot cut the buffers (many
// segments whose lengths the host does not know, each of which may be the longest), the chunk
// slots [r length, (r + 1) length) (by slots: a segment's chunks are consecutive slots, so at
// most one segment crosses each boundary). Across a boundary inside a segment, the state
// gradient waits in a [K][V] f32 matrix a value head, and, with more than one round, a training
// forward keeps, instead of h and Vn of every chunk, the f32 state there, from which the
// backward recomputes them.
struct RoundPlan {
  int count = 1, length = 1;
  std::int64_t slots = 0;
  bool by_slots = false;
  std::int64_t boundaries(std::int64_t segments) const {  // the carried matrices a value head
    return by_slots ? count - 1 : (count - 1) * segments;
  }
};

// segments: sequences x segments of segment_length chunks; chunk_slots: the chunk slots planned.
RoundPlan plan_rounds(std::int64_t segments, std::int64_t segment_length, std::int64_t chunk_slots,
                      std::int64_t value_heads);

}  // namespace gdn::cuda
