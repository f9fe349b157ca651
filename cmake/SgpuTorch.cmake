# Finds libtorch inside the PyPI torch wheel, through torch.utils.cmake_prefix_path.
# ci/setup installs the pinned wheel into /opt/sgpu/venv; SGPU_PYTHON or Torch_DIR override.
if(NOT Torch_DIR)
  if(NOT SGPU_PYTHON AND SKBUILD AND Python_EXECUTABLE)
    # pip install .: the interpreter the package is built for.
    set(SGPU_PYTHON ${Python_EXECUTABLE} CACHE FILEPATH "" FORCE)
  endif()
  if(NOT SGPU_PYTHON)
    if(EXISTS /opt/sgpu/venv/bin/python)
      set(SGPU_PYTHON /opt/sgpu/venv/bin/python CACHE FILEPATH "" FORCE)
    else()
      find_program(_sgpu_python3 python3 REQUIRED)
      set(SGPU_PYTHON ${_sgpu_python3} CACHE FILEPATH "" FORCE)
    endif()
  endif()
  # Under pip's build isolation, PYTHONPATH names the build environment, which hides the
  # interpreter's own packages; the torch to build against is the one the package will
  # run with, so it is looked for without it.
  execute_process(
    COMMAND ${CMAKE_COMMAND} -E env --unset=PYTHONPATH
            ${SGPU_PYTHON} -c "import torch.utils; print(torch.utils.cmake_prefix_path)"
    OUTPUT_VARIABLE _sgpu_torch_prefix OUTPUT_STRIP_TRAILING_WHITESPACE
    RESULT_VARIABLE _sgpu_torch_rc ERROR_QUIET)
  if(NOT _sgpu_torch_rc EQUAL 0)
    message(FATAL_ERROR "sgpu: ${SGPU_PYTHON} cannot import torch. Run ci/setup, "
                        "or pass -DSGPU_PYTHON=<python with torch> or -DTorch_DIR=<libtorch>/share/cmake/Torch.")
  endif()
  set(Torch_DIR ${_sgpu_torch_prefix}/Torch)
endif()
# Without an explicit list, Caffe2's CUDA module probes the installed GPUs with try_run,
# which fails on machines without one. sgpu compiles no CUDA kernels of its own.
if(NOT DEFINED ENV{TORCH_CUDA_ARCH_LIST})
  set(ENV{TORCH_CUDA_ARCH_LIST} "8.0;8.6;9.0")
endif()
find_package(Torch REQUIRED)
set(SGPU_TORCH_VERSION ${Torch_VERSION})
include(${CMAKE_CURRENT_LIST_DIR}/SgpuTorchTargets.cmake)
