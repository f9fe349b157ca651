// NOTE [The kernel model]
// What one operator takes on a GPU beyond the roofline (NOTE [The compute model]), where a
// platform's "compute" has a "kernels" object; without one, the roofline alone.
//   - A matmul runs in tiles: the library covers the M x N output (times the batch) with
//     tiles of one shape, a tile to a streaming multiprocessor at a time, in waves of `sms`
//     tiles; the last wave leaves SMs idle when it is not full. Each tile shape of the
//     table (rows, cols, and the fraction of the dtype's peak a full wave of it reaches)
//     gives flops / (peak x fraction x tiles / (waves x sms)), and the fastest is taken,
//     as cuBLAS's heuristic picks one. A small matmul is then far below the peak, as on
//     a GPU.
//   - An attention kernel (flash or memory-efficient, forward or backward) reaches
//     `attention_efficiency` of the peak.
//   - Every kernel moves its bytes at `memory_efficiency` of the memory bandwidth at best
//     (most operators are bound by that alone), and takes at least `kernel_floor_us`.
//   - The host issues each eager operator in `host_us` and the GPU cannot start a kernel
//     before it is issued (StreamTimeline, NOTE [The step's timeline]): a step of small
//     operators is bound by the host, as an eager step of a small model is on a GPU.
// The "kernels" object:
//   {sms, matmul_tiles: [[rows, cols, fraction], ...], attention_efficiency,
//    memory_efficiency, kernel_floor_us, host_us, sources,
//    validation: {dtypes: [...], runs, typical_error}}
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace sgpu::model {

struct Roofline;

struct MatmulTile {
  int rows = 128;
  int cols = 128;
  double efficiency = 1;  // of the dtype's peak, in a full wave
};

struct KernelCosts {
  int sms = 0;  // 0: no kernel model (the roofline alone)
  std::vector<MatmulTile> matmul_tiles;
  double attention_efficiency = 1;
  double memory_efficiency = 1;
  double kernel_floor_us = 0;
  double host_us = 0;  // the host's time to issue one eager operator
  std::vector<std::string> sources;
  // What the table was held to (bench/validate_predictions.py, docs/benchmarks.md): the
  // dtypes of the matmul and attention kernels of the measured runs it was compared with,
  // how many runs, and the mean absolute error of their predicted steps. No dtypes: it was
  // held to no measured run.
  std::vector<std::string> validated_dtypes;
  int validated_runs = 0;
  double typical_error = 0;

  bool empty() const { return sms <= 0; }
};

enum class KernelKind { kMatmul, kAttention, kOther };
// "matmul", "attention", "other"; nullopt for anything else.
std::optional<KernelKind> parse_kernel_kind(std::string_view name);

// What the kernel model needs of an operator beyond its flops and bytes: a matmul's
// output rows (m) and columns (n), its inner size (k) and batch; 0 where unknown.
struct KernelShape {
  KernelKind kind = KernelKind::kOther;
  double batch = 1;
  double m = 0;
  double n = 0;
  double k = 0;
};

// The operator's kernel on the GPU (NOTE [The kernel model]); the roofline's time where
// the platform has no kernel model; 0 for an empty roofline.
double kernel_seconds(const Roofline& roofline, const KernelShape& shape, double flops,
                      double bytes, std::string_view dtype);

// Whether the kernel model's error bound covers this kernel: an operator bound by its
// memory traffic always is; a matmul or attention kernel when the table was held to
// measured runs of its dtype.
bool validated_kernel(const KernelCosts& costs, const KernelShape& shape, std::string_view dtype);

// A point of a step, twice: as it runs, and as it would with its collectives taking no
// time (NOTE [The step's timeline]).
struct Moment {
  double real = 0;
  double alone = 0;
};

// NOTE [The step's timeline]
// The host issues operators in program order; each runs on the stream that was current
// when it was issued, after what that stream ran before, and not before the host issued it.
// A collective runs on its group's own channel, as NCCL's stream, once the stream it was
// issued on reaches that point and the channel is free; a stream that waits for it (its
// Work's wait(), a wait on its future, which completes with events at its end as NCCL's
// does, or an event recorded after such a wait) goes on only once it ends.
// Events carry a stream's point to another stream. So compute and communication overlap
// exactly as far as the program's dependencies let them: FSDP2's prefetched all-gathers,
// reduce-scatters behind backward.
// The step is the latest point of any stream or channel; the same schedule with every
// collective taking no time gives the compute's own critical path, and the difference is
// the exposed communication. What is left out: the host waiting for the GPU
// (synchronize, .item()), and, in shape-only compute, a wait on a future that then() made
// from a collective's (a Python comm hook's): its callback runs after the collective, but
// the future waits on the host only.
class StreamTimeline {
 public:
  // An operator issued `host_seconds` after the previous one, its kernel `kernel_seconds`
  // on `stream`: how far it moves the end of the compute's own critical path.
  double kernel(std::int64_t stream, double host_seconds, double kernel_seconds);
  // A collective issued on `stream`, taking `seconds` on `channel`: when it ends.
  Moment collective(std::int64_t channel, std::int64_t stream, double seconds);
  // Where `stream` has got to (an event recorded on it).
  Moment now(std::int64_t stream) const;
  // `stream` goes on only after `point`.
  void wait(std::int64_t stream, const Moment& point);

  double end() const;          // the step as it runs
  double compute_end() const;  // with its collectives taking no time
  double exposed() const { return end() - compute_end(); }

 private:
  // Each clock only moves on, so the ends are kept as they move rather than sought: a
  // program that takes a fresh stream for each future's callback has as many streams.
  void moved(const Moment& stream_clock);

  double host_ = 0;
  std::map<std::int64_t, Moment> streams_;
  std::map<std::int64_t, Moment> channels_;
  double end_ = 0;          // the latest of every stream's and channel's real clock
  double compute_end_ = 0;  // the latest of every stream's clock with no collective time
};

}  // namespace sgpu::model
