// OpenCL backend factory (placeholder while the real backend is written):
// defines make_opencl_backend so every target linking troupe_kernels links.
#include "kernels/opencl_backend.hpp"

#include <stdexcept>

namespace troupe::kernels {

std::unique_ptr<Backend> make_opencl_backend(const BackendOptions&) {
  throw std::runtime_error("opencl backend: not implemented yet");
}

}  // namespace troupe::kernels
