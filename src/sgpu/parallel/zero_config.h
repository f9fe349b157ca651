// DeepSpeed's JSON configuration as sgpu's ZeRO reads it (the keys it understands are
// listed in sgpu/parallel/zero.h). No libtorch: the decoders' fuzz target parses it alone.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>

namespace sgpu::parallel {

struct ZeroConfig {
  std::optional<std::int64_t> train_batch_size;
  std::int64_t micro_batch_size = 1;
  std::int64_t gradient_accumulation_steps = 1;
  double gradient_clipping = 0;  // max global norm; 0: none
  int stage = 1;
  std::string optimizer = "Adam";  // "Adam", "AdamW", "SGD"
  double lr = 1e-3;
  std::array<double, 2> betas{0.9, 0.999};
  double eps = 1e-8;
  double weight_decay = 0;
  bool adam_w_mode = true;
  double momentum = 0;
  double dampening = 0;
  bool nesterov = false;

  // Throws sgpu::ConfigError naming the key for anything malformed or not understood.
  static ZeroConfig parse(const std::string& json);
};

}  // namespace sgpu::parallel
