# Finds the Debian 12 packages Shardline builds with (see deploy/install-deps.sh)
# and decides whether the CUDA backend is built.

find_package(Threads REQUIRED)
find_package(Protobuf REQUIRED)
find_package(gRPC CONFIG REQUIRED)
find_package(absl CONFIG REQUIRED)
find_package(glog CONFIG REQUIRED)
find_package(OpenBLAS CONFIG REQUIRED)
# libcrypto: reading revocation lists at start (common/revocation_lists).
find_package(OpenSSL REQUIRED)

# OpenBLAS' CMake config only sets variables; wrap them in an imported target.
add_library(shardline_openblas INTERFACE IMPORTED)
target_include_directories(shardline_openblas INTERFACE ${OpenBLAS_INCLUDE_DIRS})
target_link_libraries(shardline_openblas INTERFACE ${OpenBLAS_LIBRARIES})

if(SHARDLINE_BUILD_TESTS)
  find_package(GTest CONFIG REQUIRED)
endif()

set(SHARDLINE_HAVE_CUDA OFF)
if(NOT SHARDLINE_CUDA STREQUAL "OFF")
  include(CheckLanguage)
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES OR CMAKE_CUDA_ARCHITECTURES STREQUAL "")
      set(CMAKE_CUDA_ARCHITECTURES "80;90")
    endif()
    enable_language(CUDA)
    find_package(CUDAToolkit REQUIRED)
    set(CMAKE_CUDA_STANDARD 17)
    set(CMAKE_CUDA_STANDARD_REQUIRED ON)
    set(SHARDLINE_HAVE_CUDA ON)
  elseif(SHARDLINE_CUDA STREQUAL "ON")
    message(FATAL_ERROR "SHARDLINE_CUDA=ON but no CUDA compiler (nvcc) was found")
  endif()
endif()

# libsystemd: sd_notify for daemons under systemd (Type=notify, WatchdogSec).
find_package(PkgConfig REQUIRED)
pkg_check_modules(SYSTEMD REQUIRED IMPORTED_TARGET libsystemd)

# libmicrohttpd: the small embedded HTTP server behind /metrics.
pkg_check_modules(MICROHTTPD REQUIRED IMPORTED_TARGET libmicrohttpd)
