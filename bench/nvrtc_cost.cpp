// What compiling a fused expression at run time with NVRTC would cost a g++ unit (issue 45):
// the first compile in a process (NVRTC loads its builtins once), each further kernel, reading a
// cached cubin back from disk, and on a machine with a GPU loading it into the driver
// (cuModuleLoadData + cuModuleGetFunction). The baseline, in the same run: nvcc compiling the
// same source to a cubin, as a .cu unit's build would (the whole nvcc driver: front end, cicc,
// ptxas), median of 3.
//
// The kernels are what a source generator for Tessera's evaluators would have to emit: device
// code only (NVRTC cannot compile Tessera's headers, which include the host standard library):
// an elementwise expression with 16-byte loads, a broadcast-row expression with ReLU (batch
// norm's apply), and a row reduction of a product with warp shuffles.
//
//   nvrtc_cost [repetitions]      (default 5; NVCC=path to time another nvcc; needs no GPU)
#include <cuda.h>
#include <dlfcn.h>
#include <nvrtc.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

struct kernel_source {
  const char* name;
  const char* entry;
  const char* text;
};

// y = a * 2 + b * c, float, four elements per thread through float4 where aligned.
const char* const elementwise = R"(
extern "C" __global__ void fused_axpbc(float* __restrict__ y, const float* __restrict__ a,
                                       const float* __restrict__ b, const float* __restrict__ c,
                                       long long n) {
  long long stride = (long long)gridDim.x * blockDim.x;
  long long vectors = n / 4;
  for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < vectors; i += stride) {
    float4 va = reinterpret_cast<const float4*>(a)[i];
    float4 vb = reinterpret_cast<const float4*>(b)[i];
    float4 vc = reinterpret_cast<const float4*>(c)[i];
    float4 out;
    out.x = va.x * 2.0f + vb.x * vc.x;
    out.y = va.y * 2.0f + vb.y * vc.y;
    out.z = va.z * 2.0f + vb.z * vc.z;
    out.w = va.w * 2.0f + vb.w * vc.w;
    reinterpret_cast<float4*>(y)[i] = out;
  }
  for (long long i = vectors * 4 + (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n;
       i += stride)
    y[i] = a[i] * 2.0f + b[i] * c[i];
}
)";

// y[r, l] = max((x[r, l] - mean[r % C]) * scale[r % C] + shift[r % C], 0) over rows of L.
const char* const broadcast_rows = R"(
extern "C" __global__ void fused_bn_relu(float* __restrict__ y, const float* __restrict__ x,
                                         const float* __restrict__ mean,
                                         const float* __restrict__ scale,
                                         const float* __restrict__ shift, int channels,
                                         long long rows, int length) {
  for (long long r = blockIdx.x; r < rows; r += gridDim.x) {
    int c = (int)(r % channels);
    float m = mean[c], s = scale[c], t = shift[c];
    const float* in = x + r * length;
    float* out = y + r * length;
    for (int l = threadIdx.x; l < length; l += blockDim.x) {
      float v = (in[l] - m) * s + t;
      out[l] = v > 0.0f ? v : 0.0f;
    }
  }
}
)";

// sums[r] = sum over l of x[r, l] * w[r, l], one block a row, a warp shuffle tree.
const char* const row_reduction = R"(
extern "C" __global__ void fused_row_dot(float* __restrict__ sums, const float* __restrict__ x,
                                         const float* __restrict__ w, long long rows,
                                         int length) {
  __shared__ float partial[32];
  for (long long r = blockIdx.x; r < rows; r += gridDim.x) {
    float acc = 0.0f;
    for (int l = threadIdx.x; l < length; l += blockDim.x) acc += x[r * length + l] * w[r * length + l];
    for (int offset = 16; offset > 0; offset /= 2) acc += __shfl_down_sync(0xffffffffu, acc, offset);
    int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    if (lane == 0) partial[warp] = acc;
    __syncthreads();
    if (warp == 0) {
      acc = lane < (int)(blockDim.x / 32) ? partial[lane] : 0.0f;
      for (int offset = 16; offset > 0; offset /= 2) acc += __shfl_down_sync(0xffffffffu, acc, offset);
      if (lane == 0) sums[r] = acc;
    }
    __syncthreads();
  }
}
)";

const kernel_source kernels[] = {
    {"elementwise a*2 + b*c (float4)", "fused_axpbc", elementwise},
    {"broadcast rows (x - m) * s + t, ReLU", "fused_bn_relu", broadcast_rows},
    {"row reduction sum(x * w)", "fused_row_dot", row_reduction},
};

double seconds_of(const std::function<void()>& work) {
  auto start = std::chrono::steady_clock::now();
  work();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  return values[values.size() / 2];
}

void check(nvrtcResult result, nvrtcProgram program, const char* what) {
  if (result == NVRTC_SUCCESS) return;
  std::string log;
  std::size_t size = 0;
  if (program != nullptr && nvrtcGetProgramLogSize(program, &size) == NVRTC_SUCCESS && size > 1) {
    log.resize(size);
    nvrtcGetProgramLog(program, log.data());
  }
  throw std::runtime_error(std::string(what) + ": " + nvrtcGetErrorString(result) + "\n" + log);
}

/// One kernel's source to an sm_90 cubin, as a runtime compiler would do for an expression.
std::vector<char> compile(const kernel_source& kernel) {
  nvrtcProgram program = nullptr;
  check(nvrtcCreateProgram(&program, kernel.text, "expression.cu", 0, nullptr, nullptr), nullptr,
        "nvrtcCreateProgram");
  const char* options[] = {"-arch=sm_90", "--std=c++17", "-default-device"};
  nvrtcResult result = nvrtcCompileProgram(program, 3, options);
  check(result, program, kernel.name);
  std::size_t size = 0;
  check(nvrtcGetCUBINSize(program, &size), program, "nvrtcGetCUBINSize");
  std::vector<char> cubin(size);
  check(nvrtcGetCUBIN(program, cubin.data()), program, "nvrtcGetCUBIN");
  nvrtcDestroyProgram(&program);
  return cubin;
}

std::vector<char> read_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

/// The driver API through dlopen, so the program starts on machines without a driver.
struct driver {
  using init_t = CUresult (*)(unsigned);
  using device_get_t = CUresult (*)(CUdevice*, int);
  using primary_retain_t = CUresult (*)(CUcontext*, CUdevice);
  using set_current_t = CUresult (*)(CUcontext);
  using load_t = CUresult (*)(CUmodule*, const void*);
  using get_function_t = CUresult (*)(CUfunction*, CUmodule, const char*);
  using unload_t = CUresult (*)(CUmodule);
  void* library = nullptr;
  load_t load = nullptr;
  get_function_t get_function = nullptr;
  unload_t unload = nullptr;
  std::string why_not;

  driver() {
    library = dlopen("libcuda.so.1", RTLD_NOW);
    if (library == nullptr) {
      why_not = "no libcuda.so.1 (no driver)";
      return;
    }
    auto init = reinterpret_cast<init_t>(dlsym(library, "cuInit"));
    auto device_get = reinterpret_cast<device_get_t>(dlsym(library, "cuDeviceGet"));
    auto retain = reinterpret_cast<primary_retain_t>(dlsym(library, "cuDevicePrimaryCtxRetain"));
    auto set_current = reinterpret_cast<set_current_t>(dlsym(library, "cuCtxSetCurrent"));
    load = reinterpret_cast<load_t>(dlsym(library, "cuModuleLoadData"));
    get_function = reinterpret_cast<get_function_t>(dlsym(library, "cuModuleGetFunction"));
    unload = reinterpret_cast<unload_t>(dlsym(library, "cuModuleUnload"));
    CUdevice device = 0;
    CUcontext context = nullptr;
    if (init == nullptr || device_get == nullptr || retain == nullptr || set_current == nullptr ||
        load == nullptr || get_function == nullptr || unload == nullptr) {
      why_not = "libcuda.so.1 lacks a driver API function";
    } else if (init(0) != CUDA_SUCCESS || device_get(&device, 0) != CUDA_SUCCESS) {
      why_not = "cuInit or cuDeviceGet failed (no GPU)";
    } else if (retain(&context, device) != CUDA_SUCCESS || set_current(context) != CUDA_SUCCESS) {
      why_not = "no context on device 0";
    }
  }
  bool usable() const { return why_not.empty(); }
};

}  // namespace

int main(int argc, char** argv) {
  const int repetitions = argc > 1 ? std::max(1, std::atoi(argv[1])) : 5;
  int major = 0, minor = 0;
  nvrtcVersion(&major, &minor);
  const std::filesystem::path cache =
      std::filesystem::temp_directory_path() / ("tessera-nvrtc-cost-" + std::to_string(getpid()));
  std::filesystem::create_directories(cache);
  std::printf("NVRTC %d.%d, sm_90 cubins, median of %d (the first compile of the process apart)\n",
              major, minor, repetitions);

  // The process's first compile pays NVRTC's one-time start (its builtins library).
  double first = seconds_of([&] { compile(kernels[0]); });
  std::printf("first compile in the process (%s): %.1f ms\n", kernels[0].name, first * 1e3);

  driver gpu;
  const char* nvcc_env = std::getenv("NVCC");
  std::string nvcc = nvcc_env != nullptr ? nvcc_env : "/usr/local/cuda/bin/nvcc";
  const bool have_nvcc = std::filesystem::exists(nvcc);

  std::printf("\n%-40s %10s %10s %10s %12s %10s %8s\n", "kernel", "NVRTC ms", "cubin KB",
              "cache ms", "driver load", "nvcc ms", "ratio");
  int index = 0;
  for (const kernel_source& kernel : kernels) {
    std::vector<char> cubin;
    std::vector<double> times;
    for (int r = 0; r < repetitions; ++r) times.push_back(seconds_of([&] { cubin = compile(kernel); }));
    const double nvrtc = median(times);

    // The disk cache: the cubin under a key, read back as a later run would.
    const std::filesystem::path file = cache / (std::to_string(index++) + ".cubin");
    std::ofstream(file, std::ios::binary).write(cubin.data(), static_cast<std::streamsize>(cubin.size()));
    times.clear();
    for (int r = 0; r < repetitions; ++r)
      times.push_back(seconds_of([&] {
        if (read_file(file).size() != cubin.size()) throw std::runtime_error("cache read short");
      }));
    const double cached = median(times);

    std::string load = "-";
    if (gpu.usable()) {
      times.clear();
      for (int r = 0; r < repetitions; ++r) {
        CUmodule module = nullptr;
        CUfunction function = nullptr;
        times.push_back(seconds_of([&] {
          if (gpu.load(&module, cubin.data()) != CUDA_SUCCESS ||
              gpu.get_function(&function, module, kernel.entry) != CUDA_SUCCESS)
            throw std::runtime_error(std::string("cuModuleLoadData failed for ") + kernel.name);
        }));
        gpu.unload(module);
      }
      char text[32];
      std::snprintf(text, sizeof text, "%.3f ms", median(times) * 1e3);
      load = text;
    }

    std::string baseline = "-", ratio = "-";
    if (have_nvcc) {
      const std::filesystem::path source = cache / (std::string(kernel.entry) + ".cu");
      std::ofstream(source) << kernel.text;
      const std::string command = "'" + nvcc + "' -cubin -arch=sm_90 -std=c++17 -o '" +
                                  (cache / "nvcc.cubin").string() + "' '" + source.string() + "'";
      times.clear();
      for (int r = 0; r < 3; ++r)
        times.push_back(seconds_of([&] {
          if (std::system(command.c_str()) != 0) throw std::runtime_error("nvcc failed: " + command);
        }));
      const double nvcc_time = median(times);
      char text[32];
      std::snprintf(text, sizeof text, "%.0f", nvcc_time * 1e3);
      baseline = text;
      std::snprintf(text, sizeof text, "%.1fx", nvcc_time / nvrtc);
      ratio = text;
    }
    std::printf("%-40s %10.1f %10.1f %10.3f %12s %10s %8s\n", kernel.name, nvrtc * 1e3,
                cubin.size() / 1024.0, cached * 1e3, load.c_str(), baseline.c_str(), ratio.c_str());
  }
  if (!gpu.usable()) std::printf("driver load: not measured here: %s\n", gpu.why_not.c_str());
  if (!have_nvcc) std::printf("nvcc: not found at %s (set NVCC)\n", nvcc.c_str());
  std::printf("ratio: nvcc's time for the same source / NVRTC's (the baseline a .cu unit pays per "
              "kernel, without its host code)\n");
  std::filesystem::remove_all(cache);
  return 0;
}
