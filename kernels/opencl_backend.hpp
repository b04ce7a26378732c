// OpenCL backend: CLBlast for GEMM, our own OpenCL C kernels (kernels/cl/*.cl,
// embedded at build time) for the rest. Runs on PoCL (CPU) and GPU ICDs.
#pragma once

#include <memory>

#include "kernels/backend.hpp"

namespace troupe::kernels {

// Throws std::runtime_error naming the OpenCL error when no device can be used.
std::unique_ptr<Backend> make_opencl_backend(const BackendOptions& options);

}  // namespace troupe::kernels
