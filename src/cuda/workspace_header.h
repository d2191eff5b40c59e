#pragma once
// The header at the start of every forward workspace, and the mailbox through which the
// backward's device-side check of it reports (the design: delta_rule.cu, "The forward workspace's
// header"). Plain structs of ints, for the host and the device alike.

namespace gdn::cuda {

// What a header records, in the order a mismatch is looked for and reported.
enum HeaderField : int {
  kMagic,
  kDevice,  // the device ordinal
  kBatch,   // B
  kTokens,  // T
  kKeyHeads,
  kValueHeads,
  kKeyDim,
  kValueDim,
  kChunk,
  kSequences,      // N
  kSlots,          // NC: chunk slots (exact with cu_seqlens_host, else a bound from shapes)
  kSegments,       // seg_count
  kSegmentLength,  // seg_len
  kTransferParts,  // seg_parts
  kL2norm,
  kInitialState,  // initial_state given
  kVarlen,        // cu_seqlens given
  kOffsets64,     // cu_seqlens is i64
  kSaved,         // the per-chunk states and Vn are saved (a training forward)
  kEnters,        // context parallelism: the carried states (Params::enters, leaves)
  kLeaves,
  kDtype,      // q's: 1 bf16, 2 f16
  kBetaDtype,  // Params::beta_code
  kScale,      // the bits of the f32 scale
  kHeaderFields
};
// Changes with the workspace's layout, so that an older layout is not read as this one.
constexpr int kHeaderMagic = 0x34574447;  // "GDW4"

struct WorkspaceHeader {
  int field[kHeaderFields];
};

// Host memory mapped into every device's address space, one per process (cuda/device.h). The
// device-side check of the first mismatching backward fills it (state 0 -> 1 -> 2); the host
// reports it as a gdn::Error at its next call and empties it (state 2 -> 0).
struct DeferredError {
  int state;     // 0 empty, 1 being written, 2 ready
  int device;    // where the backward ran
  int field;     // the HeaderField that differs, or kHeaderFields: a sequence's offsets
  int sequence;  // field == kHeaderFields: the first sequence that differs
  // A header field: the forward's value, the backward's. A sequence: its first token and
  // length in the forward's table, then in the backward's.
  int values[4];
};

}  // namespace gdn::cuda
