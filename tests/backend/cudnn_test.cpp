// backend/cuda/cudnn.hpp on the host, in every build: the switches (backend/backends.hpp), the
// 32-bit size check, the choices that are refused before any GPU work; and in a build with
// cuDNN, that the descriptors built for a problem give the output shape of PyTorch's formula
// (descriptors need no GPU, so this runs in CI's cuda stage; the convolutions themselves are
// tests/cuda/conv_test.cu's). The cache's host logic: cudnn_cache_test.cpp.
#include <catch2/catch.hpp>

#include <cstdint>

#include "tessera/backend/cuda/cudnn.hpp"

namespace cudnn_test {  // one namespace per file: a unity build

namespace cudnn = tessera::backends::cudnn;
using tessera::backend::cuda::conv2d_problem;

/// torch.nn.Conv2d's output extent: floor((in + 2 pad - dilation (kernel - 1) - 1) / stride) + 1.
std::int64_t torch_extent(std::int64_t in, std::int64_t kernel, std::int64_t stride,
                          std::int64_t pad, std::int64_t dilation) {
  return (in + 2 * pad - dilation * (kernel - 1) - 1) / stride + 1;
}

conv2d_problem problem(std::int64_t n, std::int64_t c, std::int64_t h, std::int64_t w,
                       std::int64_t o, std::int64_t kh, std::int64_t kw, std::int64_t sh,
                       std::int64_t sw, std::int64_t ph, std::int64_t pw, std::int64_t dh,
                       std::int64_t dw, std::int64_t groups) {
  const std::int64_t oh = torch_extent(h, kh, sh, ph, dh), ow = torch_extent(w, kw, sw, pw, dw);
  return {n, c, h, w, o, kh, kw, sh, sw, ph, pw, dh, dw, groups, oh, ow};
}

TEST_CASE("cudnn: the switches' defaults and the build's cuDNN", "[cudnn]") {
  // PyTorch's defaults: cuDNN on, TF32 for its float convolutions but not for matmul, no
  // benchmarking, nondeterministic algorithms allowed.
  CHECK(cudnn::enabled.load());
  CHECK(cudnn::allow_tf32.load());
  CHECK_FALSE(tessera::backends::cuda::matmul::allow_tf32.load());
  CHECK_FALSE(cudnn::benchmark.load());
  CHECK_FALSE(cudnn::deterministic.load());
  CHECK(cudnn::workspace_limit.load() == (std::size_t{1} << 30));
#if TESSERA_CUDNN
  CHECK(cudnn::is_available());
  // cudnnGetVersion() of the library loaded, against the header compiled with (same major).
  CHECK(cudnn::version() / 10000 == CUDNN_MAJOR);
#else
  CHECK_FALSE(cudnn::is_available());
  CHECK(cudnn::version() == 0);
#endif
}

TEST_CASE("cudnn: problems within cuDNN's 32-bit sizes", "[cudnn]") {
  using tessera::backend::cuda::conv2d_fits_cudnn;
  // ResNet-50's stem at batch 8.
  CHECK(conv2d_fits_cudnn(problem(8, 3, 224, 224, 64, 7, 7, 2, 2, 3, 3, 1, 1, 1)));
  // An input of exactly 2^31 elements does not fit; one row fewer does.
  CHECK_FALSE(conv2d_fits_cudnn(problem(2, 1, 32768, 32768, 1, 1, 1, 1, 1, 0, 0, 1, 1, 1)));
  CHECK(conv2d_fits_cudnn(problem(2, 1, 32767, 32768, 1, 1, 1, 1, 1, 0, 0, 1, 1, 1)));
  // The output over 2^31 while the input fits: 1 channel in, 2^16 out over 2^15 positions.
  CHECK_FALSE(conv2d_fits_cudnn(problem(1, 1, 128, 256, 65536, 1, 1, 1, 1, 0, 0, 1, 1, 1)));
  // The weight over 2^31 (65536 x 32768 x 1 x 1) while input and output fit.
  CHECK_FALSE(conv2d_fits_cudnn(problem(1, 32768, 1, 1, 65536, 1, 1, 1, 1, 0, 0, 1, 1, 1)));
  // ... and within it with 2 groups (65536 x 16384).
  CHECK(conv2d_fits_cudnn(problem(1, 32768, 1, 1, 65536, 1, 1, 1, 1, 0, 0, 1, 1, 2)));
  // An extent past int.
  CHECK_FALSE(
      conv2d_fits_cudnn(problem(1, 1, 1, std::int64_t{1} << 31, 1, 1, 1, 1, 1, 0, 0, 1, 1, 1)));
}

#if TESSERA_CUDNN
// Without cuDNN conv2d_choose refuses everything, so these checks need a build with it.
TEST_CASE("cudnn: choices refused before any GPU work", "[cudnn]") {
  using tessera::backend::cuda::conv2d_choose;
  const conv2d_problem small = problem(2, 3, 9, 8, 4, 3, 3, 1, 1, 1, 1, 1, 1, 1);
  // Integers are not convolved by cuDNN here.
  CHECK_FALSE(conv2d_choose<std::int32_t>(0, small).usable);
  // Too large for its 32-bit sizes.
  CHECK_FALSE(
      conv2d_choose<float>(0, problem(2, 1, 32768, 32768, 1, 1, 1, 1, 1, 0, 0, 1, 1, 1)).usable);
  // Switched off.
  cudnn::enabled = false;
  const bool chosen = conv2d_choose<float>(0, small).usable;
  cudnn::enabled = true;
  CHECK_FALSE(chosen);
}

TEST_CASE("cudnn: the descriptors give PyTorch's output shape", "[cudnn]") {
  using tessera::backend::cuda::detail::conv2d_descriptors;
  const conv2d_problem cases[] = {
      problem(2, 3, 9, 8, 4, 3, 3, 1, 1, 1, 1, 1, 1, 1),
      problem(2, 4, 9, 9, 6, 3, 3, 2, 2, 1, 1, 1, 1, 2),       // stride 2, 2 groups
      problem(3, 6, 5, 4, 4, 1, 1, 1, 1, 0, 0, 1, 1, 1),       // 1x1
      problem(2, 3, 15, 13, 5, 7, 7, 2, 2, 3, 3, 1, 1, 1),     // a 7x7 stem
      problem(2, 3, 9, 8, 4, 2, 3, 2, 1, 0, 1, 1, 2, 1),       // stride, padding, dilation
      problem(1, 8, 20, 11, 8, 3, 2, 3, 1, 2, 0, 2, 3, 8),     // (h, w) all different, depthwise
      problem(8, 2048, 7, 7, 512, 1, 1, 1, 1, 0, 0, 1, 1, 1),  // ResNet-50's last stage
  };
  for (const conv2d_problem& p : cases) {
    INFO("input [" << p.n << ", " << p.c << ", " << p.h << ", " << p.w << "], weight [" << p.o
                   << ", " << p.c / p.groups << ", " << p.kh << ", " << p.kw << "], stride ("
                   << p.sh << ", " << p.sw << "), padding (" << p.ph << ", " << p.pw
                   << "), dilation (" << p.dh << ", " << p.dw << "), groups " << p.groups);
    for (const cudnnDataType_t type : {CUDNN_DATA_FLOAT, CUDNN_DATA_DOUBLE, CUDNN_DATA_HALF}) {
      const cudnnDataType_t compute =
          type == CUDNN_DATA_DOUBLE ? CUDNN_DATA_DOUBLE : CUDNN_DATA_FLOAT;
      const conv2d_descriptors d(p, type, compute, CUDNN_DEFAULT_MATH);
      const auto [n, o, oh, ow] = d.output_dims();
      CHECK(n == p.n);
      CHECK(o == p.o);
      CHECK(oh == p.oh);
      CHECK(ow == p.ow);
    }
  }
}

TEST_CASE("cudnn: a failed call names itself and cuDNN's status", "[cudnn]") {
  using tessera::backend::cuda::detail::conv2d_descriptors;
  // Channels not divisible by groups reach cuDNN as a filter of 0 input channels per group.
  const conv2d_problem bad = problem(1, 3, 8, 8, 4, 3, 3, 1, 1, 1, 1, 1, 1, 4);
  try {
    const conv2d_descriptors d(bad, CUDNN_DATA_FLOAT, CUDNN_DATA_FLOAT, CUDNN_DEFAULT_MATH);
    (void)d.output_dims();
    FAIL("no error from cuDNN");
  } catch (const tessera::cuda_error& e) {
    const std::string message = e.what();
    INFO(message);
    CHECK(message.find("cudnn") != std::string::npos);
    CHECK(message.find("CUDNN_STATUS_BAD_PARAM") != std::string::npos);
    CHECK(e.code() != 0);
  }
}
#endif

}  // namespace cudnn_test
