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
//     before it is issued (OperatorTimeline): a step of small operators is bound by the
//     host, as an eager step of a small model is on a GPU.
// The "kernels" object:
//   {sms, matmul_tiles: [[rows, cols, fraction], ...], attention_efficiency,
//    memory_efficiency, kernel_floor_us, host_us, sources}
#pragma once

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

// The host issuing operators in program order and the GPU running their kernels.
class OperatorTimeline {
 public:
  // The next operator, issued `host_seconds` after the previous one, whose kernel takes
  // `kernel_seconds`: how far it moves the end of the GPU's timeline (its kernel, and the
  // GPU's wait for the host when it had caught up).
  double add(double host_seconds, double kernel_seconds);
  double end() const { return gpu_; }

 private:
  double host_ = 0;
  double gpu_ = 0;
};

}  // namespace sgpu::model
