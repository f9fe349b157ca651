# Interface targets over libtorch, defined where sgpu is built and again where an installed
# sgpu is found (sgpuConfig.cmake), against the libtorch found there.
if(NOT TARGET sgpu::torch_cpu)
  # sgpu's components use the CPU part of libtorch (c10d stores, Gloo, tensors); only the
  # CUDA runtime module links the CUDA part, so that simulated ranks load no CUDA library.
  add_library(sgpu::torch_cpu INTERFACE IMPORTED GLOBAL)
  target_link_libraries(sgpu::torch_cpu INTERFACE torch_cpu c10)
  separate_arguments(_sgpu_torch_flags UNIX_COMMAND "${TORCH_CXX_FLAGS}")
  target_compile_options(sgpu::torch_cpu INTERFACE ${_sgpu_torch_flags})
  # c10d's process-group headers also reach into libtorch's C++ API folder.
  add_library(sgpu::torch_distributed INTERFACE IMPORTED GLOBAL)
  target_link_libraries(sgpu::torch_distributed INTERFACE sgpu::torch_cpu)
  target_include_directories(sgpu::torch_distributed INTERFACE
    ${TORCH_INSTALL_PREFIX}/include/torch/csrc/api/include)
endif()
