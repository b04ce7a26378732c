// Host backend: GEMM through OpenBLAS, every other op in plain C++ loops the
// compiler vectorizes. One instance per device (thread).
#pragma once

#include <memory>

#include "kernels/backend.hpp"

namespace troupe::kernels {

std::unique_ptr<Backend> make_host_backend(const BackendOptions& options);

}  // namespace troupe::kernels
