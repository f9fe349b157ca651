// The rank's step timeline (NOTE [The step's timeline] in model/kernels.h), one a process:
// the compute estimate puts each operator's kernel on the current stream
// (rank/accounting.cc), the recorder each collective on its group's channel and each
// wait on the stream that waits (recorder.cc), and CUDA on sim's events carry a stream's
// point to another (sim/cuda/guard.cc). The current stream is what CUDA on sim says it is
// (read_current_stream_from); everything is on one stream where nothing says (a C++ rank
// on CPU, a rank on real GPUs). A collective's future completes with events at the
// collective's end (completes_at), as NCCL's does, so a wait through it is a wait too.
#pragma once

#include <ATen/core/ivalue.h>
#include <c10/core/Stream.h>

#include <cstdint>

#include "model/kernels.h"

namespace sgpu::collectives {

// Where the calling thread's current stream is read from (CUDA on sim installs its own).
using CurrentStream = c10::Stream (*)();
void read_current_stream_from(CurrentStream reader);

// An operator's kernel on the current stream: how far it moves the compute's own end.
double time_kernel(double host_seconds, double kernel_seconds);
// A collective issued on the current stream, taking `seconds` on `channel`: its end.
model::Moment time_collective(std::uintptr_t channel, double seconds);
// The current stream goes on only after `point`.
void wait_on_current_stream(const model::Moment& point);
// An event recorded on `stream`, and `stream` waiting for one.
model::Moment stream_point(const c10::Stream& stream);
void stream_waits(const c10::Stream& stream, const model::Moment& point);
// A future that completes after `done`, as a collective's on a GPU does (NCCL's): with
// events on its tensors' GPUs at `end`, so that a stream that waits on it goes on only
// after `end`. `done` itself where nothing says what the current stream is.
c10::intrusive_ptr<c10::ivalue::Future> completes_at(c10::intrusive_ptr<c10::ivalue::Future> done,
                                                     const model::Moment& end);
// The step's end with its collectives and without them, so far.
double timeline_exposed_seconds();
// Where the step timeline has got to: its end (real) and its compute's own end (alone).
model::Moment timeline_ends();

}  // namespace sgpu::collectives
