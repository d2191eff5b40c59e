#pragma once
// What the public CUDA entry points check before they enqueue anything: that the current device
// is a Hopper GPU (once per device, then cached), and that no device-side check of an earlier
// call has failed (the mailbox of cuda/workspace_header.h).

#include <string>

#include "cuda/workspace_header.h"

namespace gdn::cuda {

// The error for device `device`, named `name`, of compute capability major.minor, or "" when
// gdn's kernels (sm_90a) run there.
std::string hopper_mismatch(int device, const std::string& name, int major, int minor);

// The current device's ordinal; gdn::Error unless it is sm_90. The first call per device (and
// thread) asks the driver; later ones cost a cudaGetDevice.
int require_hopper();

// The device whose memory `p` is, or -1 (host, managed or unknown memory). A pure query, made
// in relaxed capture mode so that no stream capture can object to it.
int device_of(const void* p);

// The process's mailbox: host memory mapped into every device's address space, allocated by the
// first call (in relaxed capture mode, so that a first call inside a stream capture keeps it).
DeferredError* deferred_errors();

// The message of a filled mailbox.
std::string deferred_message(const DeferredError& e);

// Throws gdn::Error with what the mailbox holds, and empties it; nothing when it is empty. Reads
// host memory only: it sees what the device has written by now.
void raise_deferred_errors();

}  // namespace gdn::cuda
