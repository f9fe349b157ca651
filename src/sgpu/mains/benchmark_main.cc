// main() for Google Benchmark binaries that launch ranks (sgpu::benchmark_main).
#include <benchmark/benchmark.h>

#include "sgpu/runtime.h"

int main(int argc, char** argv) {
  sgpu::init(argc, argv);
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
