// OpenCL plumbing: error names, platform/device selection, context + queue +
// program build (once per backend; PoCL caches compiled kernels on disk), and
// the cl_mem pool that lets steady-state steps allocate nothing new.
#include "kernels/opencl_context.hpp"

#include <algorithm>
#include <stdexcept>

namespace troupe::kernels {

std::string cl_error_name(int code) {
  switch (code) {
#define TROUPE_CL_ERR(name) \
  case name:                \
    return #name;
    TROUPE_CL_ERR(CL_SUCCESS)
    TROUPE_CL_ERR(CL_DEVICE_NOT_FOUND)
    TROUPE_CL_ERR(CL_DEVICE_NOT_AVAILABLE)
    TROUPE_CL_ERR(CL_COMPILER_NOT_AVAILABLE)
    TROUPE_CL_ERR(CL_MEM_OBJECT_ALLOCATION_FAILURE)
    TROUPE_CL_ERR(CL_OUT_OF_RESOURCES)
    TROUPE_CL_ERR(CL_OUT_OF_HOST_MEMORY)
    TROUPE_CL_ERR(CL_PROFILING_INFO_NOT_AVAILABLE)
    TROUPE_CL_ERR(CL_MEM_COPY_OVERLAP)
    TROUPE_CL_ERR(CL_IMAGE_FORMAT_MISMATCH)
    TROUPE_CL_ERR(CL_IMAGE_FORMAT_NOT_SUPPORTED)
    TROUPE_CL_ERR(CL_BUILD_PROGRAM_FAILURE)
    TROUPE_CL_ERR(CL_MAP_FAILURE)
    TROUPE_CL_ERR(CL_MISALIGNED_SUB_BUFFER_OFFSET)
    TROUPE_CL_ERR(CL_EXEC_STATUS_ERROR_FOR_EVENTS_IN_WAIT_LIST)
    TROUPE_CL_ERR(CL_COMPILE_PROGRAM_FAILURE)
    TROUPE_CL_ERR(CL_LINKER_NOT_AVAILABLE)
    TROUPE_CL_ERR(CL_LINK_PROGRAM_FAILURE)
    TROUPE_CL_ERR(CL_DEVICE_PARTITION_FAILED)
    TROUPE_CL_ERR(CL_KERNEL_ARG_INFO_NOT_AVAILABLE)
    TROUPE_CL_ERR(CL_INVALID_VALUE)
    TROUPE_CL_ERR(CL_INVALID_DEVICE_TYPE)
    TROUPE_CL_ERR(CL_INVALID_PLATFORM)
    TROUPE_CL_ERR(CL_INVALID_DEVICE)
    TROUPE_CL_ERR(CL_INVALID_CONTEXT)
    TROUPE_CL_ERR(CL_INVALID_QUEUE_PROPERTIES)
    TROUPE_CL_ERR(CL_INVALID_COMMAND_QUEUE)
    TROUPE_CL_ERR(CL_INVALID_HOST_PTR)
    TROUPE_CL_ERR(CL_INVALID_MEM_OBJECT)
    TROUPE_CL_ERR(CL_INVALID_IMAGE_FORMAT_DESCRIPTOR)
    TROUPE_CL_ERR(CL_INVALID_IMAGE_SIZE)
    TROUPE_CL_ERR(CL_INVALID_SAMPLER)
    TROUPE_CL_ERR(CL_INVALID_BINARY)
    TROUPE_CL_ERR(CL_INVALID_BUILD_OPTIONS)
    TROUPE_CL_ERR(CL_INVALID_PROGRAM)
    TROUPE_CL_ERR(CL_INVALID_PROGRAM_EXECUTABLE)
    TROUPE_CL_ERR(CL_INVALID_KERNEL_NAME)
    TROUPE_CL_ERR(CL_INVALID_KERNEL_DEFINITION)
    TROUPE_CL_ERR(CL_INVALID_KERNEL)
    TROUPE_CL_ERR(CL_INVALID_ARG_INDEX)
    TROUPE_CL_ERR(CL_INVALID_ARG_VALUE)
    TROUPE_CL_ERR(CL_INVALID_ARG_SIZE)
    TROUPE_CL_ERR(CL_INVALID_KERNEL_ARGS)
    TROUPE_CL_ERR(CL_INVALID_WORK_DIMENSION)
    TROUPE_CL_ERR(CL_INVALID_WORK_GROUP_SIZE)
    TROUPE_CL_ERR(CL_INVALID_WORK_ITEM_SIZE)
    TROUPE_CL_ERR(CL_INVALID_GLOBAL_OFFSET)
    TROUPE_CL_ERR(CL_INVALID_EVENT_WAIT_LIST)
    TROUPE_CL_ERR(CL_INVALID_EVENT)
    TROUPE_CL_ERR(CL_INVALID_OPERATION)
    TROUPE_CL_ERR(CL_INVALID_GL_OBJECT)
    TROUPE_CL_ERR(CL_INVALID_BUFFER_SIZE)
    TROUPE_CL_ERR(CL_INVALID_MIP_LEVEL)
    TROUPE_CL_ERR(CL_INVALID_GLOBAL_WORK_SIZE)
    TROUPE_CL_ERR(CL_INVALID_PROPERTY)
    TROUPE_CL_ERR(CL_INVALID_IMAGE_DESCRIPTOR)
    TROUPE_CL_ERR(CL_INVALID_COMPILER_OPTIONS)
    TROUPE_CL_ERR(CL_INVALID_LINKER_OPTIONS)
    TROUPE_CL_ERR(CL_INVALID_DEVICE_PARTITION_COUNT)
#undef TROUPE_CL_ERR
    case -1001:
      return "CL_PLATFORM_NOT_FOUND_KHR";
    // CLBlast's own status codes (clblast.h, StatusCode); the ones shared with
    // OpenCL are named above.
    case -1024: return "CLBlast kNotImplemented";
    case -1022: return "CLBlast kInvalidMatrixA";
    case -1021: return "CLBlast kInvalidMatrixB";
    case -1020: return "CLBlast kInvalidMatrixC";
    case -1019: return "CLBlast kInvalidVectorX";
    case -1018: return "CLBlast kInvalidVectorY";
    case -1017: return "CLBlast kInvalidDimension";
    case -1016: return "CLBlast kInvalidLeadDimA";
    case -1015: return "CLBlast kInvalidLeadDimB";
    case -1014: return "CLBlast kInvalidLeadDimC";
    case -1013: return "CLBlast kInvalidIncrementX";
    case -1012: return "CLBlast kInvalidIncrementY";
    case -1011: return "CLBlast kInsufficientMemoryA";
    case -1010: return "CLBlast kInsufficientMemoryB";
    case -1009: return "CLBlast kInsufficientMemoryC";
    case -1008: return "CLBlast kInsufficientMemoryX";
    case -1007: return "CLBlast kInsufficientMemoryY";
    case -2050: return "CLBlast kInsufficientMemoryTemp";
    case -2049: return "CLBlast kInvalidBatchCount";
    case -2048: return "CLBlast kInvalidOverrideKernel";
    case -2047: return "CLBlast kMissingOverrideParameter";
    case -2046: return "CLBlast kInvalidLocalMemUsage";
    case -2045: return "CLBlast kNoHalfPrecision";
    case -2044: return "CLBlast kNoDoublePrecision";
    case -2043: return "CLBlast kInvalidVectorScalar";
    case -2042: return "CLBlast kInsufficientMemoryScalar";
    case -2041: return "CLBlast kDatabaseError";
    case -2040: return "CLBlast kUnknownError";
    case -2039: return "CLBlast kUnexpectedError";
    default:
      return "unknown OpenCL error " + std::to_string(code);
  }
}

void cl_check(cl_int err, const char* op, const char* what) {
  if (err == CL_SUCCESS) return;
  throw std::runtime_error(std::string("opencl ") + op + ": " + what + " failed: " +
                           cl_error_name(err) + " (" + std::to_string(err) + ")");
}

// ---- device selection ---------------------------------------------------------

static std::string platform_string(cl_platform_id p, cl_platform_info what) {
  size_t n = 0;
  if (clGetPlatformInfo(p, what, 0, nullptr, &n) != CL_SUCCESS || n == 0) return "?";
  std::string s(n, '\0');
  clGetPlatformInfo(p, what, n, s.data(), nullptr);
  while (!s.empty() && s.back() == '\0') s.pop_back();
  return s;
}

static std::string device_string(cl_device_id d, cl_device_info what) {
  size_t n = 0;
  if (clGetDeviceInfo(d, what, 0, nullptr, &n) != CL_SUCCESS || n == 0) return "?";
  std::string s(n, '\0');
  clGetDeviceInfo(d, what, n, s.data(), nullptr);
  while (!s.empty() && s.back() == '\0') s.pop_back();
  return s;
}

static cl_device_type cl_type_of(OpenclDeviceType t) {
  switch (t) {
    case OpenclDeviceType::gpu: return CL_DEVICE_TYPE_GPU;
    case OpenclDeviceType::cpu: return CL_DEVICE_TYPE_CPU;
    case OpenclDeviceType::any: break;
  }
  return CL_DEVICE_TYPE_ALL;
}

static std::vector<cl_device_id> devices_of(cl_platform_id p, cl_device_type type) {
  cl_uint n = 0;
  cl_int err = clGetDeviceIDs(p, type, 0, nullptr, &n);
  if (err == CL_DEVICE_NOT_FOUND || n == 0) return {};
  cl_check(err, "select device", "clGetDeviceIDs");
  std::vector<cl_device_id> ds(n);
  cl_check(clGetDeviceIDs(p, type, n, ds.data(), nullptr), "select device", "clGetDeviceIDs");
  return ds;
}

ClSelection cl_select_device(const BackendOptions& options) {
  const cl_device_type type = cl_type_of(options.device_type);
  cl_uint np = 0;
  cl_int err = clGetPlatformIDs(0, nullptr, &np);
  // The ICD loader answers CL_PLATFORM_NOT_FOUND_KHR (-1001) when no ICD is installed.
  if (err == -1001 || (err == CL_SUCCESS && np == 0))
    throw std::runtime_error("no OpenCL platform found (install pocl-opencl-icd or a GPU ICD)");
  cl_check(err, "select device", "clGetPlatformIDs");
  std::vector<cl_platform_id> platforms(np);
  cl_check(clGetPlatformIDs(np, platforms.data(), nullptr), "select device", "clGetPlatformIDs");

  std::string listing;  // "0: PoCL (1 device of type any)", for error messages
  std::vector<std::vector<cl_device_id>> devs(np);
  for (cl_uint i = 0; i < np; ++i) {
    devs[i] = devices_of(platforms[i], type);
    listing += (i ? "; " : "") + std::to_string(i) + ": " +
               platform_string(platforms[i], CL_PLATFORM_NAME) + " (" +
               std::to_string(devs[i].size()) + " device(s) of type " + opencl_device_type_name(options.device_type) + ")";
  }

  int pi = options.platform;
  if (pi >= 0) {
    if (pi >= static_cast<int>(np))
      throw std::runtime_error("OpenCL platform index " + std::to_string(pi) +
                               " out of range: " + std::to_string(np) +
                               " platform(s) found [" + listing + "]");
  } else {
    for (cl_uint i = 0; i < np && pi < 0; ++i)
      if (!devs[i].empty()) pi = static_cast<int>(i);
    if (pi < 0)
      throw std::runtime_error(std::string("no OpenCL device of type '") + opencl_device_type_name(options.device_type) +
                               "' on any platform [" + listing + "]");
  }
  const auto& ds = devs[static_cast<size_t>(pi)];
  if (options.device < 0 || options.device >= static_cast<int>(ds.size()))
    throw std::runtime_error("OpenCL device index " + std::to_string(options.device) +
                             " out of range on platform " + std::to_string(pi) + " [" + listing +
                             "]");

  ClSelection sel;
  sel.platform = platforms[static_cast<size_t>(pi)];
  sel.device = ds[static_cast<size_t>(options.device)];
  sel.info.platform_index = pi;
  sel.info.device_index = options.device;
  sel.info.platform_name = platform_string(sel.platform, CL_PLATFORM_NAME);
  sel.info.device_name = device_string(sel.device, CL_DEVICE_NAME);
  cl_device_type dt = 0;
  clGetDeviceInfo(sel.device, CL_DEVICE_TYPE, sizeof(dt), &dt, nullptr);
  sel.info.device_type = (dt & CL_DEVICE_TYPE_GPU)           ? "gpu"
                         : (dt & CL_DEVICE_TYPE_CPU)         ? "cpu"
                         : (dt & CL_DEVICE_TYPE_ACCELERATOR) ? "accelerator"
                                                             : "other";
  clGetDeviceInfo(sel.device, CL_DEVICE_MAX_WORK_GROUP_SIZE, sizeof(size_t),
                  &sel.info.max_work_group_size, nullptr);
  cl_ulong local_mem = 0;
  clGetDeviceInfo(sel.device, CL_DEVICE_LOCAL_MEM_SIZE, sizeof(local_mem), &local_mem, nullptr);
  sel.info.local_mem_size = static_cast<size_t>(local_mem);
  const std::string ext = device_string(sel.device, CL_DEVICE_EXTENSIONS);
  sel.info.fp64 = ext.find("cl_khr_fp64") != std::string::npos;
  return sel;
}

// ---- buffer pool ------------------------------------------------------------------

size_t ClPool::bucket_size(size_t bytes) {
  // Four buckets per power of two above 256 bytes: at most 25% slack.
  constexpr size_t kMin = 256;
  if (bytes <= kMin) return kMin;
  size_t p = kMin;
  while (p * 2 < bytes) p *= 2;  // p < bytes <= 2p
  const size_t step = p / 4;
  return (bytes + step - 1) / step * step;
}

ClPool::ClPool(cl_context ctx, size_t max_pooled_bytes)
    : ctx_(ctx), max_pooled_bytes_(max_pooled_bytes) {
  clRetainContext(ctx_);
}

ClPool::~ClPool() {
  for (auto& [size, mems] : free_)
    for (cl_mem m : mems) clReleaseMemObject(m);
  clReleaseContext(ctx_);
}

cl_mem ClPool::acquire(size_t bytes, size_t* capacity, const char* op) {
  const size_t cap = bucket_size(bytes);
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = free_.find(cap);
    if (it != free_.end() && !it->second.empty()) {
      cl_mem m = it->second.back();
      it->second.pop_back();
      stats_.reuses++;
      stats_.pooled_bytes -= cap;
      stats_.live_bytes += cap;
      *capacity = cap;
      return m;
    }
  }
  cl_int err = CL_SUCCESS;
  cl_mem m = clCreateBuffer(ctx_, CL_MEM_READ_WRITE, cap, nullptr, &err);
  if (err == CL_MEM_OBJECT_ALLOCATION_FAILURE || err == CL_OUT_OF_RESOURCES ||
      err == CL_OUT_OF_HOST_MEMORY) {
    trim();  // free cached buffers of other sizes and try once more
    m = clCreateBuffer(ctx_, CL_MEM_READ_WRITE, cap, nullptr, &err);
  }
  cl_check(err, op, ("clCreateBuffer(" + std::to_string(cap) + " bytes)").c_str());
  std::lock_guard<std::mutex> lock(mu_);
  stats_.allocations++;
  stats_.live_bytes += cap;
  *capacity = cap;
  return m;
}

void ClPool::release(cl_mem mem, size_t capacity) {
  std::lock_guard<std::mutex> lock(mu_);
  free_[capacity].push_back(mem);
  stats_.releases++;
  stats_.live_bytes -= capacity;
  stats_.pooled_bytes += capacity;
  if (stats_.pooled_bytes > max_pooled_bytes_) trim_locked(max_pooled_bytes_ / 2);
}

void ClPool::trim() {
  std::lock_guard<std::mutex> lock(mu_);
  trim_locked(0);
}

void ClPool::trim_locked(size_t keep_bytes) {
  // Largest buckets first: they free the most memory per released object.
  for (auto it = free_.rbegin(); it != free_.rend() && stats_.pooled_bytes > keep_bytes; ++it) {
    while (!it->second.empty() && stats_.pooled_bytes > keep_bytes) {
      clReleaseMemObject(it->second.back());
      it->second.pop_back();
      stats_.pooled_bytes -= it->first;
      stats_.trims++;
    }
  }
}

ClPoolStats ClPool::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

ClBuffer::ClBuffer(std::shared_ptr<ClPool> pool, size_t bytes, const char* op)
    : pool_(std::move(pool)), bytes_(bytes) {
  mem_ = pool_->acquire(bytes, &capacity_, op);
}

ClBuffer::~ClBuffer() {
  if (mem_) pool_->release(mem_, capacity_);
}

// ---- context, queue, program ---------------------------------------------------------

ClContext::ClContext(const BackendOptions& options) {
  ClSelection sel = cl_select_device(options);
  info_ = sel.info;
  device_ = sel.device;
  cl_int err = CL_SUCCESS;
  cl_context_properties props[] = {CL_CONTEXT_PLATFORM,
                                   reinterpret_cast<cl_context_properties>(sel.platform), 0};
  ctx_ = clCreateContext(props, 1, &device_, nullptr, nullptr, &err);
  cl_check(err, "create backend", "clCreateContext");
  queue_ = clCreateCommandQueue(ctx_, device_, 0, &err);
  if (err != CL_SUCCESS) {
    clReleaseContext(ctx_);
    cl_check(err, "create backend", "clCreateCommandQueue");
  }
  cl_ulong global_mem = 0;
  clGetDeviceInfo(device_, CL_DEVICE_GLOBAL_MEM_SIZE, sizeof(global_mem), &global_mem, nullptr);
  // Keep at most half the device memory cached; a training step's transient
  // working set is far below that, so steady state allocates nothing.
  const size_t max_pooled = global_mem ? static_cast<size_t>(global_mem / 2) : (size_t{1} << 30);
  pool_ = std::make_shared<ClPool>(ctx_, max_pooled);
  try {
    // One program from every embedded file; common.cl (shared helpers) first if present.
    const auto& sources = embedded_cl_sources();
    std::string text;
    if (auto it = sources.find("common"); it != sources.end()) text += it->second + "\n";
    for (const auto& [name, src] : sources)
      if (name != "common") text += src + "\n";
    program_ = cl_build_program(ctx_, device_, text);
  } catch (...) {
    pool_.reset();
    clReleaseCommandQueue(queue_);
    clReleaseContext(ctx_);
    throw;
  }
}

ClContext::~ClContext() {
  if (queue_) clFinish(queue_);
  for (auto& [name, k] : kernels_) clReleaseKernel(k);
  if (program_) clReleaseProgram(program_);
  if (queue_) clReleaseCommandQueue(queue_);
  pool_.reset();  // live Buffers keep the pool (and the context) alive
  if (ctx_) clReleaseContext(ctx_);
}

cl_program cl_build_program(cl_context ctx, cl_device_id device, const std::string& source) {
  const char* ptr = source.c_str();
  const size_t len = source.size();
  cl_int err = CL_SUCCESS;
  cl_program program = clCreateProgramWithSource(ctx, 1, &ptr, &len, &err);
  cl_check(err, "build kernels", "clCreateProgramWithSource");
  err = clBuildProgram(program, 1, &device, "-cl-std=CL1.2", nullptr, nullptr);
  if (err == CL_SUCCESS) return program;
  size_t n = 0;
  clGetProgramBuildInfo(program, device, CL_PROGRAM_BUILD_LOG, 0, nullptr, &n);
  std::string log(n, '\0');
  if (n) clGetProgramBuildInfo(program, device, CL_PROGRAM_BUILD_LOG, n, log.data(), nullptr);
  clReleaseProgram(program);
  throw std::runtime_error("opencl build kernels: clBuildProgram failed: " + cl_error_name(err) +
                           " (" + std::to_string(err) + ") on " +
                           device_string(device, CL_DEVICE_NAME) + "; build log:\n" + log);
}

cl_kernel ClContext::kernel(const std::string& name) {
  auto it = kernels_.find(name);
  if (it != kernels_.end()) return it->second;
  cl_int err = CL_SUCCESS;
  cl_kernel k = clCreateKernel(program_, name.c_str(), &err);
  cl_check(err, name.c_str(), "clCreateKernel");
  kernels_[name] = k;
  return k;
}

size_t ClContext::work_group_size(cl_kernel k, size_t cap) {
  auto it = wg_limits_.find(k);
  size_t limit = 0;
  if (it != wg_limits_.end()) {
    limit = it->second;
  } else {
    cl_check(clGetKernelWorkGroupInfo(k, device_, CL_KERNEL_WORK_GROUP_SIZE, sizeof(limit),
                                      &limit, nullptr),
             "work group size", "clGetKernelWorkGroupInfo");
    wg_limits_[k] = limit;
  }
  size_t wg = 1;
  while (wg * 2 <= std::min(limit, cap)) wg *= 2;
  return wg;
}

}  // namespace troupe::kernels
