// OpenCL device selection and error reporting: bad platform/device indices and
// device types give messages naming what was asked for; OpenCL and CLBlast
// status codes map to their names; program build failures carry the build log.
#include <CL/cl.h>
#include <gtest/gtest.h>

#include <stdexcept>
#include <string>

#include "kernels/opencl_context.hpp"
#include "tests/kernels/opencl_test_util.hpp"

namespace troupe::kernels {
namespace {


cl_uint platform_count() {
  cl_uint n = 0;
  if (clGetPlatformIDs(0, nullptr, &n) != CL_SUCCESS) return 0;
  return n;
}

// The message of the exception `fn` throws as E (fails the test if none).
template <class E, class F>
std::string error_of(F&& fn) {
  try {
    fn();
  } catch (const E& e) {
    return e.what();
  }
  ADD_FAILURE() << "no exception thrown";
  return {};
}

TEST(OpenclDevice, BadPlatformIndexNamesIt) {
  BackendOptions o;
  o.kind = kernels::BackendKind::opencl;
  o.platform = 97;
  const std::string msg = error_of<std::runtime_error>([&] { make_backend(o); });
  if (platform_count() == 0) {
    EXPECT_CONTAINS(msg, ("no OpenCL platform found (install pocl-opencl-icd or a GPU ICD)"));
  } else {
    EXPECT_CONTAINS(msg, ("OpenCL platform index 97 out of range"));
    EXPECT_CONTAINS(msg, (std::to_string(platform_count()) + " platform(s) found"));
  }
}

TEST(OpenclDevice, BadDeviceIndexNamesIt) {
  if (platform_count() == 0) GTEST_SKIP() << "no OpenCL platform";
  BackendOptions o;
  o.kind = kernels::BackendKind::opencl;
  o.device = 41;
  const std::string msg = error_of<std::runtime_error>([&] { make_backend(o); });
  EXPECT_CONTAINS(msg, ("OpenCL device index 41 out of range on platform"));
}

TEST(OpenclDevice, UnknownDeviceTypeIsInvalidArgument) {
  BackendOptions o;
  const std::string msg = error_of<std::invalid_argument>([&] { o.device_type = parse_opencl_device_type("tpu"); });
  EXPECT_CONTAINS(msg, ("unknown device_type 'tpu'"));
}

TEST(OpenclDevice, DeviceTypeFilterIsHonoured) {
  if (platform_count() == 0) GTEST_SKIP() << "no OpenCL platform";
  // Whether a GPU exists decides which outcome is right; ask OpenCL directly.
  cl_platform_id ps[16];
  cl_uint np = 0;
  ASSERT_EQ(clGetPlatformIDs(16, ps, &np), CL_SUCCESS);
  bool any_gpu = false;
  for (cl_uint i = 0; i < np && i < 16; ++i) {
    cl_uint nd = 0;
    if (clGetDeviceIDs(ps[i], CL_DEVICE_TYPE_GPU, 0, nullptr, &nd) == CL_SUCCESS && nd > 0)
      any_gpu = true;
  }
  BackendOptions o;
  o.kind = kernels::BackendKind::opencl;
  o.device_type = kernels::OpenclDeviceType::gpu;
  if (any_gpu) {
    auto be = make_backend(o);
    EXPECT_EQ(opencl_device_info(*be).device_type, "gpu");
  } else {
    const std::string msg = error_of<std::runtime_error>([&] { make_backend(o); });
    EXPECT_CONTAINS(msg, ("no OpenCL device of type 'gpu' on any platform"));
  }
}

TEST(OpenclDevice, InfoDescribesTheChosenDevice) {
  TROUPE_REQUIRE_OPENCL_BACKEND(be);
  const ClDeviceInfo info = opencl_device_info(be);
  EXPECT_EQ(be.name(), "opencl");
  EXPECT_GE(info.platform_index, 0);
  EXPECT_EQ(info.device_index, 0);
  EXPECT_FALSE(info.device_name.empty());
  EXPECT_GT(info.max_work_group_size, 0u);
  EXPECT_GE(info.local_mem_size, 16384u);  // OpenCL 1.2's minimum; tiled attention sizes from it
  EXPECT_TRUE(info.device_type == "gpu" || info.device_type == "cpu" ||
              info.device_type == "accelerator" || info.device_type == "other");
}

TEST(OpenclDevice, RowGroupCapDefaultsByDeviceTypeAndIsChecked) {
  TROUPE_REQUIRE_OPENCL_BACKEND(be);
  const size_t cap = opencl_row_group_cap(be);
  EXPECT_EQ(cap, opencl_device_info(be).device_type == "cpu" ? 1u : 256u);
  EXPECT_THROW(opencl_set_row_group_cap(be, 3), std::invalid_argument);
  EXPECT_THROW(opencl_set_row_group_cap(be, 512), std::invalid_argument);
  EXPECT_EQ(opencl_row_group_cap(be), cap);
}

TEST(OpenclDevice, IntrospectionRejectsOtherBackends) {
  BackendOptions o;
  auto host = make_backend(o);
  EXPECT_THROW(opencl_set_row_group_cap(*host, 1), std::invalid_argument);
  EXPECT_THROW(opencl_pool_stats(*host), std::invalid_argument);
  EXPECT_THROW(opencl_device_info(*host), std::invalid_argument);
}

TEST(OpenclErrors, CodesMapToNames) {
  EXPECT_EQ(cl_error_name(CL_SUCCESS), "CL_SUCCESS");
  EXPECT_EQ(cl_error_name(CL_OUT_OF_RESOURCES), "CL_OUT_OF_RESOURCES");
  EXPECT_EQ(cl_error_name(CL_MEM_OBJECT_ALLOCATION_FAILURE), "CL_MEM_OBJECT_ALLOCATION_FAILURE");
  EXPECT_EQ(cl_error_name(CL_INVALID_WORK_GROUP_SIZE), "CL_INVALID_WORK_GROUP_SIZE");
  EXPECT_EQ(cl_error_name(CL_BUILD_PROGRAM_FAILURE), "CL_BUILD_PROGRAM_FAILURE");
  EXPECT_EQ(cl_error_name(CL_INVALID_KERNEL_NAME), "CL_INVALID_KERNEL_NAME");
  EXPECT_EQ(cl_error_name(-1001), "CL_PLATFORM_NOT_FOUND_KHR");
  EXPECT_EQ(cl_error_name(-1017), "CLBlast kInvalidDimension");
  EXPECT_EQ(cl_error_name(-2046), "CLBlast kInvalidLocalMemUsage");
  EXPECT_EQ(cl_error_name(-12345), "unknown OpenCL error -12345");
}

TEST(OpenclErrors, CheckNamesTheOpAndTheError) {
  EXPECT_NO_THROW(cl_check(CL_SUCCESS, "gemm", "clblast::Gemm"));
  const std::string msg = error_of<std::runtime_error>(
      [] { cl_check(CL_OUT_OF_RESOURCES, "attention_forward", "clEnqueueNDRangeKernel"); });
  EXPECT_EQ(msg,
            "opencl attention_forward: clEnqueueNDRangeKernel failed: CL_OUT_OF_RESOURCES (-5)");
}

// A real OpenCL failure (not a synthetic code) comes back named.
TEST(OpenclErrors, MissingKernelIsReportedByName) {
  TROUPE_REQUIRE_OPENCL_BACKEND(be);
  BackendOptions o;
  o.kind = kernels::BackendKind::opencl;
  ClContext ctx(o);
  const std::string msg = error_of<std::runtime_error>([&] { ctx.kernel("no_such_kernel"); });
  EXPECT_CONTAINS(msg, ("no_such_kernel"));
  EXPECT_CONTAINS(msg, ("CL_INVALID_KERNEL_NAME"));
}

TEST(OpenclErrors, BuildFailureCarriesTheBuildLog) {
  TROUPE_REQUIRE_OPENCL_BACKEND(be);
  BackendOptions o;
  o.kind = kernels::BackendKind::opencl;
  ClContext ctx(o);
  const std::string bad = "__kernel void broken(__global float* x) { x[0] = undeclared_name; }\n";
  const std::string msg =
      error_of<std::runtime_error>([&] { cl_build_program(ctx.context(), ctx.device(), bad); });
  EXPECT_CONTAINS(msg, ("CL_BUILD_PROGRAM_FAILURE"));
  EXPECT_CONTAINS(msg, ("build log"));
  EXPECT_CONTAINS(msg, ("undeclared_name"));  // the compiler's own diagnostic
}

}  // namespace
}  // namespace troupe::kernels
