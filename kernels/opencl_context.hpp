// OpenCL plumbing for the OpenCL backend: error names, device selection, the
// per-backend context/queue/program, and the size-bucketed cl_mem pool. Only the
// OpenCL backend and its tests include this header (it pulls in <CL/cl.h>).
#pragma once

#include <CL/cl.h>

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "kernels/backend.hpp"

namespace troupe::kernels {

// Generated at build time by kernels/embed_cl.cmake: kernels/cl/<name>.cl -> text.
const std::map<std::string, std::string>& embedded_cl_sources();

// "CL_OUT_OF_RESOURCES" for -5, "CLBlast kInvalidDimension" for -1017, ...;
// "unknown OpenCL error <code>" otherwise.
std::string cl_error_name(int code);

// Throws std::runtime_error("opencl <op>: <what> failed: <NAME> (<code>)") unless
// err == CL_SUCCESS.
void cl_check(cl_int err, const char* op, const char* what);

// What make_opencl_backend picked (for logs and tests).
struct ClDeviceInfo {
  int platform_index = -1;
  int device_index = -1;
  std::string platform_name;
  std::string device_name;
  std::string device_type;  // "gpu", "cpu", "accelerator", "other"
  size_t max_work_group_size = 0;
  size_t local_mem_size = 0;  // bytes of __local memory per work-group
  bool fp64 = false;
};

// Compiles `source` for `device` (OpenCL C 1.2). On failure throws
// std::runtime_error with the error name and the compiler's build log.
cl_program cl_build_program(cl_context ctx, cl_device_id device, const std::string& source);

// Picks platform/device as BackendOptions says. Throws std::runtime_error naming
// what was asked for and what exists; std::invalid_argument for a bad device_type.
struct ClSelection {
  cl_platform_id platform = nullptr;
  cl_device_id device = nullptr;
  ClDeviceInfo info;
};
ClSelection cl_select_device(const BackendOptions& options);

// Counters of the buffer pool; a steady-state step must leave `allocations` unchanged.
struct ClPoolStats {
  uint64_t allocations = 0;  // cl_mem objects created
  uint64_t reuses = 0;       // requests served from the free list
  uint64_t releases = 0;     // buffers handed back to the free list
  uint64_t trims = 0;        // free cl_mem objects released to the driver
  size_t live_bytes = 0;     // capacity held by live Buffers
  size_t pooled_bytes = 0;   // capacity waiting in the free list
};

// Size-bucketed free list of cl_mem. Buckets are 4 per power of two (<= 25% slack),
// so a repeated sequence of allocations is served entirely from the free list.
// Shared (shared_ptr) by every Buffer it handed out, so buffers may outlive the
// backend. Thread-safe: a Buffer may die on another thread than its backend's.
// Reuse is safe because every buffer is used through the one in-order queue of
// the backend that owns the pool.
class ClPool {
 public:
  ClPool(cl_context ctx, size_t max_pooled_bytes);
  ~ClPool();
  ClPool(const ClPool&) = delete;
  ClPool& operator=(const ClPool&) = delete;

  // Returns a cl_mem of at least `bytes` (its capacity goes to *capacity).
  cl_mem acquire(size_t bytes, size_t* capacity, const char* op);
  void release(cl_mem mem, size_t capacity);
  // Releases every free cl_mem to the driver.
  void trim();
  ClPoolStats stats() const;

  static size_t bucket_size(size_t bytes);

 private:
  void trim_locked(size_t keep_bytes);

  cl_context ctx_;
  size_t max_pooled_bytes_;
  mutable std::mutex mu_;
  std::map<size_t, std::vector<cl_mem>> free_;
  ClPoolStats stats_;
};

// A Buffer backed by a pooled cl_mem; host_ptr() is nullptr.
class ClBuffer final : public Buffer {
 public:
  ClBuffer(std::shared_ptr<ClPool> pool, size_t bytes, const char* op);
  ~ClBuffer() override;
  size_t bytes() const override { return bytes_; }
  cl_mem mem() const { return mem_; }

 private:
  std::shared_ptr<ClPool> pool_;
  cl_mem mem_ = nullptr;
  size_t bytes_ = 0;
  size_t capacity_ = 0;
};

// Context, in-order queue and the compiled program of embedded kernels, plus a
// cache of cl_kernel objects by name (kernel objects hold argument state, so
// each backend has its own).
class ClContext {
 public:
  explicit ClContext(const BackendOptions& options);
  ~ClContext();
  ClContext(const ClContext&) = delete;
  ClContext& operator=(const ClContext&) = delete;

  cl_context context() const { return ctx_; }
  cl_command_queue queue() const { return queue_; }
  cl_device_id device() const { return device_; }
  const ClDeviceInfo& info() const { return info_; }
  const std::shared_ptr<ClPool>& pool() const { return pool_; }

  // The kernel `name` of the program; throws (naming it) if absent.
  cl_kernel kernel(const std::string& name);
  // Largest power-of-two work-group size <= cap that the kernel can run with.
  size_t work_group_size(cl_kernel k, size_t cap);

 private:
  ClDeviceInfo info_;
  cl_device_id device_ = nullptr;
  cl_context ctx_ = nullptr;
  cl_command_queue queue_ = nullptr;
  cl_program program_ = nullptr;
  std::map<std::string, cl_kernel> kernels_;
  std::map<cl_kernel, size_t> wg_limits_;
  std::shared_ptr<ClPool> pool_;
};

// Pool counters of an OpenCL backend; throws std::invalid_argument for another backend.
ClPoolStats opencl_pool_stats(Backend& backend);
// Largest work-group for per-row reductions (power of two in [1, 256]; default
// 1 on CPU devices, 256 on others). Results stay deterministic for a given cap;
// tests sweep it so the tree reductions that GPUs use run on PoCL too.
void opencl_set_row_group_cap(Backend& backend, size_t cap);
size_t opencl_row_group_cap(Backend& backend);
// Caps of the tiled attention kernels: rows per work-group (power of two in
// [1, 64], default 64) and rows per staged tile (power of two in [1, 32],
// default 32; the device's __local memory may lower it further). Tests sweep
// them so small blocks and the small tiles of devices with little __local
// memory run on PoCL too.
void opencl_set_attention_caps(Backend& backend, size_t block, size_t tile);
// Device an OpenCL backend runs on; throws std::invalid_argument for another backend.
ClDeviceInfo opencl_device_info(Backend& backend);

}  // namespace troupe::kernels
