// `sgpu model ...`: the collective model's platforms (NOTE [The collective model]).
//   sgpu model list                         the platforms and the GPU types they serve
//   sgpu model predict [PLATFORM] [...]     predicted times per op and size, as nccl-tests prints
//   sgpu model validate [PLATFORM...]       the model against the platform's published figures
//   sgpu model fit BENCH.json [...]         a platform file fitted to bench_collectives' JSON
#pragma once

#include <CLI/CLI.hpp>
#include <functional>

namespace sgpu::cli {

// Adds the subcommand to `app`; the function returned runs it (exit status) once parsed.
std::function<int()> add_model_command(CLI::App& app);

}  // namespace sgpu::cli
