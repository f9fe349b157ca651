#include "model/kernels.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "model/platform.h"

namespace sgpu::model {
namespace {

// The fastest tile's compute time; the best tile's fraction of the peak where the shape is
// unknown.
double matmul_compute_seconds(const KernelCosts& costs, const KernelShape& shape, double flops,
                              double peak) {
  if (costs.matmul_tiles.empty()) return flops / peak;
  double best = std::numeric_limits<double>::infinity();
  for (const MatmulTile& tile : costs.matmul_tiles) {
    double fill = 1;
    if (shape.m > 0 && shape.n > 0) {
      const double tiles = std::max(shape.batch, 1.0) * std::ceil(shape.m / tile.rows) *
                           std::ceil(shape.n / tile.cols);
      const double waves = std::ceil(tiles / costs.sms);
      fill = tiles / (waves * costs.sms);
    }
    best = std::min(best, flops / (peak * tile.efficiency * fill));
  }
  return best;
}

}  // namespace

std::optional<KernelKind> parse_kernel_kind(std::string_view name) {
  if (name == "matmul") return KernelKind::kMatmul;
  if (name == "attention") return KernelKind::kAttention;
  if (name == "other") return KernelKind::kOther;
  return std::nullopt;
}

double kernel_seconds(const Roofline& roofline, const KernelShape& shape, double flops,
                      double bytes, std::string_view dtype) {
  if (roofline.empty()) return 0;
  const KernelCosts& costs = roofline.kernels;
  if (costs.empty()) return roofline_seconds(roofline, flops, bytes, dtype);
  const double peak = roofline.peak_for(dtype) * 1e12;
  double compute = 0;
  if (flops > 0 && peak > 0) {
    switch (shape.kind) {
      case KernelKind::kMatmul:
        compute = matmul_compute_seconds(costs, shape, flops, peak);
        break;
      case KernelKind::kAttention:
        compute = flops / (peak * costs.attention_efficiency);
        break;
      case KernelKind::kOther:
        compute = flops / peak;
        break;
    }
  }
  const double memory = bytes / (roofline.memory_bandwidth_gbps * 1e9 * costs.memory_efficiency);
  return std::max({compute, memory, costs.kernel_floor_us * 1e-6}) / roofline.efficiency;
}

bool validated_kernel(const KernelCosts& costs, const KernelShape& shape, std::string_view dtype) {
  if (shape.kind == KernelKind::kOther) return true;
  return std::find(costs.validated_dtypes.begin(), costs.validated_dtypes.end(), dtype) !=
         costs.validated_dtypes.end();
}

double StreamTimeline::kernel(std::int64_t stream, double host_seconds, double kernel_seconds) {
  host_ += host_seconds;
  const double before = compute_end();
  Moment& clock = streams_[stream];
  clock.real = std::max(clock.real, host_) + kernel_seconds;
  clock.alone = std::max(clock.alone, host_) + kernel_seconds;
  moved(clock);
  return compute_end() - before;
}

Moment StreamTimeline::collective(std::int64_t channel, std::int64_t stream, double seconds) {
  const Moment issued = now(stream);
  Moment& clock = channels_[channel];
  clock.real = std::max({clock.real, issued.real, host_}) + seconds;
  clock.alone = std::max({clock.alone, issued.alone, host_});
  end_ = std::max(end_, clock.real);
  return clock;
}

Moment StreamTimeline::now(std::int64_t stream) const {
  const auto it = streams_.find(stream);
  return it == streams_.end() ? Moment{} : it->second;
}

void StreamTimeline::wait(std::int64_t stream, const Moment& point) {
  Moment& clock = streams_[stream];
  clock.real = std::max(clock.real, point.real);
  clock.alone = std::max(clock.alone, point.alone);
  moved(clock);
}

void StreamTimeline::moved(const Moment& stream_clock) {
  end_ = std::max(end_, stream_clock.real);
  compute_end_ = std::max(compute_end_, stream_clock.alone);
}

double StreamTimeline::end() const { return end_; }

double StreamTimeline::compute_end() const { return compute_end_; }

}  // namespace sgpu::model
