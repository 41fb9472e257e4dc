// Tensors on CUDA devices (compiled by nvcc, so the strided kernels run): placement, copies
// between cpu and cuda and between CUDA ordinals, dtype conversion on the device, views, fills,
// random numbers equal to the CPU's, memory accounting with the same policy as on the CPU;
// pinned host memory (pin_memory, asynchronous copies from it, the DataLoader's pin_memory).
// The whole executable reports itself skipped without a GPU (tests/cuda_main.cpp).
#include <catch2/catch.hpp>

#include "skip.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <tuple>
#include <type_traits>
#include <vector>

#include "tessera/data/data_loader.hpp"
#include "tessera/tessera.hpp"

namespace cuda_tensor_test {  // one namespace per file: a unity build

namespace ts = tessera;

TEST_CASE("cuda tensors round-trip through the host", "[cuda][tensor]") {
  auto host = ts::from_vector<float>({1, 2, 3, 4, 5, 6}, {2, 3});
  auto device = host.cuda();
  CHECK(device.is_cuda());
  CHECK(device.device() == ts::Device::parse("cuda:0"));
  CHECK(device.to_vector() == host.to_vector());
  CHECK(device.cpu().to_vector() == std::vector<float>{1, 2, 3, 4, 5, 6});
  CHECK(device.cuda(0).shares_storage_with(device));
  // A transposed view crosses devices as its logical elements, in both directions.
  CHECK(host.t().cuda().to_vector() == std::vector<float>{1, 4, 2, 5, 3, 6});
  CHECK(device.t().cpu().to_vector() == std::vector<float>{1, 4, 2, 5, 3, 6});
}

TEST_CASE("kernels fill, convert and scatter on the device", "[cuda][tensor]") {
  auto z = ts::zeros<double, ts::cuda>({3, 4});
  z.narrow(1, 1, 2).fill_(2.5);
  CHECK(z.to_vector() == std::vector<double>{0, 2.5, 2.5, 0, 0, 2.5, 2.5, 0, 0, 2.5, 2.5, 0});
  auto h = z.to<ts::half>();
  CHECK(static_cast<float>(h.to_vector()[1]) == 2.5f);
  auto ints = ts::from_vector<float>({-1.5f, 0.0f, 7.9f}, {3}).cuda().to<int32_t>();
  CHECK(ints.to_vector() == std::vector<int32_t>{-1, 0, 7});
  auto flags = ts::from_vector<float>({-1.5f, 0.0f, 7.9f}, {3}).cuda().to<bool>();
  CHECK(flags.to_vector() == std::vector<bool>{true, false, true});
  auto dst = ts::zeros<float, ts::cuda>({2, 3});
  dst.copy_(ts::from_vector<int64_t>({1, 2, 3}, {3}));  // cpu int64 row broadcast into cuda float
  CHECK(dst.to_vector() == std::vector<float>{1, 2, 3, 1, 2, 3});
  CHECK(ts::cat({dst, dst}, 1).to_vector() ==
        std::vector<float>{1, 2, 3, 1, 2, 3, 1, 2, 3, 1, 2, 3});
  CHECK(dst.new_ones({2}).is_cuda());
}

// Element bytes of `count` elements of T at `data`.
template <class T>
std::vector<unsigned char> bytes_at(const T* data, std::int64_t count) {
  const auto* first = reinterpret_cast<const unsigned char*>(data);
  return std::vector<unsigned char>(first, first + count * static_cast<std::int64_t>(sizeof(T)));
}

// The bytes of a tensor's elements in row-major order, read on the host.
template <class T, class K>
std::vector<unsigned char> bytes_of(const ts::Tensor<T, K>& t) {
  const auto host = t.cpu().contiguous();
  return bytes_at(host.data(), host.numel());
}

// A CPU tensor of `shape` whose bytes all differ from their neighbours (NaNs with payloads and
// subnormals among the floating values); bool holds 0 and 1 only.
template <class T>
ts::Tensor<T, ts::cpu> patterned(const ts::Shape& shape) {
  auto t = ts::empty<T>(shape);
  auto* bytes = reinterpret_cast<unsigned char*>(t.data());
  const std::int64_t n = t.numel() * static_cast<std::int64_t>(sizeof(T));
  for (std::int64_t i = 0; i < n; ++i) {
    bytes[i] = std::is_same_v<T, bool> ? static_cast<unsigned char>(i % 3 == 0)
                                       : static_cast<unsigned char>(i * 37 + 11);
  }
  return t;
}

// Copies within one dtype move bits on the device (one kernel per element size, or
// cudaMemcpyAsync for a dense run laid out alike), and fills store the value's bits
// (cudaMemsetAsync for zero bits over a dense run): each checked byte for byte against the host's
// bytes moved by index here, for every dtype, dense, transposed, sliced, broadcast and
// channels_last.
TEMPLATE_TEST_CASE("copies and fills within one dtype on CUDA keep every bit", "[cuda][tensor]",
                   float, double, ts::half, ts::bfloat16, std::int64_t, std::int32_t, std::uint8_t,
                   bool) {
  using T = TestType;
  constexpr std::int64_t rows = 6, cols = 10, size = sizeof(T);
  const auto host = patterned<T>({rows, cols});
  const auto src = bytes_at(host.data(), rows * cols);
  const auto element = [&](std::int64_t i, std::int64_t j) {
    return std::vector<unsigned char>(src.begin() + (i * cols + j) * size,
                                      src.begin() + (i * cols + j + 1) * size);
  };
  const auto g = host.cuda();
  CHECK(bytes_of(g) == src);
  CHECK(bytes_of(g.clone()) == src);  // dense, alike: cudaMemcpyAsync

  std::vector<unsigned char> transposed;  // a strided read: the kernel
  for (std::int64_t j = 0; j < cols; ++j) {
    for (std::int64_t i = 0; i < rows; ++i) {
      const auto e = element(i, j);
      transposed.insert(transposed.end(), e.begin(), e.end());
    }
  }
  CHECK(bytes_of(g.t().contiguous()) == transposed);

  // A slice written from another slice, and a row broadcast over every row.
  auto sliced = g.clone();
  sliced.narrow(1, 2, 5).copy_(g.narrow(1, 0, 5));
  auto broadcast = g.clone();
  broadcast.copy_(g.narrow(0, 1, 1));
  std::vector<unsigned char> want_sliced, want_broadcast;
  for (std::int64_t i = 0; i < rows; ++i) {
    for (std::int64_t j = 0; j < cols; ++j) {
      const auto e = element(i, j >= 2 && j < 7 ? j - 2 : j);
      want_sliced.insert(want_sliced.end(), e.begin(), e.end());
      const auto r = element(1, j);
      want_broadcast.insert(want_broadcast.end(), r.begin(), r.end());
    }
  }
  CHECK(bytes_of(sliced) == want_sliced);
  CHECK(bytes_of(broadcast) == want_broadcast);
  auto same = g.clone();
  same.copy_(same);  // onto itself: nothing changes
  CHECK(bytes_of(same) == src);

  // channels_last to channels_last (one dense run laid out alike) and back to row-major.
  const auto nchw = patterned<T>({2, 3, 4, 5});
  const auto last = nchw.contiguous(ts::memory_format::channels_last).cuda();
  auto copied = ts::empty<T, ts::cuda>({2, 3, 4, 5}, ts::memory_format::channels_last);
  REQUIRE(last.is_contiguous(ts::memory_format::channels_last));
  copied.copy_(last);
  CHECK(bytes_of(copied) == bytes_at(nchw.data(), nchw.numel()));

  // Fills: zero over a dense run (cudaMemsetAsync), a value over a slice (the other elements
  // stay), and for floating dtypes -0.0, whose bits are not zero.
  auto filled = g.clone();
  filled.fill_(T(0));
  CHECK(bytes_of(filled) == std::vector<unsigned char>(src.size(), 0));
  auto part = g.clone();
  const T one = T(1);
  part.narrow(1, 3, 4).fill_(one);
  auto zero_part = g.clone();
  zero_part.narrow(1, 3, 4).fill_(T(0));
  std::vector<unsigned char> want_part, want_zero_part;
  const auto one_bytes = bytes_at(&one, 1);
  const std::vector<unsigned char> zero_bytes(size, 0);
  for (std::int64_t i = 0; i < rows; ++i) {
    for (std::int64_t j = 0; j < cols; ++j) {
      const bool inside = j >= 3 && j < 7;
      const auto e = element(i, j);
      want_part.insert(want_part.end(), inside ? one_bytes.begin() : e.begin(),
                       inside ? one_bytes.end() : e.end());
      want_zero_part.insert(want_zero_part.end(), inside ? zero_bytes.begin() : e.begin(),
                            inside ? zero_bytes.end() : e.end());
    }
  }
  CHECK(bytes_of(part) == want_part);
  CHECK(bytes_of(zero_part) == want_zero_part);
  if constexpr (!std::is_integral_v<T>) {
    const T negative_zero = T(-0.0f);
    auto signed_zeros = g.clone();
    signed_zeros.fill_(negative_zero);
    std::vector<unsigned char> want;
    for (std::int64_t k = 0; k < rows * cols; ++k) {
      const auto b = bytes_at(&negative_zero, 1);
      want.insert(want.end(), b.begin(), b.end());
    }
    CHECK(bytes_of(signed_zeros) == want);
    CHECK(want != std::vector<unsigned char>(src.size(), 0));
  }
}

TEST_CASE("cuda accounting uses the CPU's 512-byte policy", "[cuda][memory]") {
  const auto d = ts::Device::parse("cuda:0");
  const auto base = ts::memory::allocated(d);
  {
    auto a = ts::empty<float, ts::cuda>({1});
    CHECK(ts::memory::allocated(d) == base + 512);
    auto b = ts::empty<float, ts::cuda>({129});
    CHECK(ts::memory::allocated(d) == base + 512 + 1024);
    auto view = b.view({3, 43});
    CHECK(ts::memory::allocated(d) == base + 512 + 1024);
  }
  CHECK(ts::memory::allocated(d) == base);
}

TEST_CASE("rand gives the same numbers on cpu and cuda", "[cuda][random]") {
  ts::manual_seed(42);
  auto on_cpu = ts::rand<float>({1000});
  ts::manual_seed(42);
  auto on_cuda = ts::rand<float, ts::cuda>({1000});
  CHECK(on_cuda.to_vector() == on_cpu.to_vector());
}

TEST_CASE("CUDA fills drawn by a kernel equal the CPU's: uniform bit for bit, normal to a few ulp",
          "[cuda][random]") {
  // Large enough for many blocks of the grid and the CPU's thread chunks, with a ragged end; the
  // fills follow one another, so the generator's offsets must advance alike on both devices.
  const std::int64_t n = (1 << 20) + 3;
  std::int64_t launches = 0;
  auto draw = [&](auto kind) {
    using K = decltype(kind);
    ts::manual_seed(43);
    const std::int64_t before = ts::profiler::kernel_launches();
    const auto a = ts::rand<float, K>({n});
    const auto b = ts::rand<double, K>({n});
    const auto c = ts::rand<ts::half, K>({n});
    const auto d = ts::randn<float, K>({n});
    const auto e = ts::randn<double, K>({n});
    launches = ts::profiler::kernel_launches() - before;
    return std::tuple{a.to_vector(), b.to_vector(), c.template to<float>().to_vector(),
                      d.to_vector(), e.to_vector()};
  };
  const auto [uf, ud, uh, zf, zd] = draw(ts::cuda{});
  // Drawn on the device: one kernel per fill, not a host loop and a copy.
  CHECK(launches == 5);
  const auto [cf, cd, ch, yf, yd] = draw(ts::cpu{});
  CHECK(uf == cf);
  CHECK(ud == cd);
  CHECK(uh == ch);
  // Normals go through log, sqrt, sin and cos (glibc against libdevice): a few ulp apart.
  double worst_float = 0, worst_double = 0;
  for (std::size_t i = 0; i < zf.size(); ++i) {
    worst_float = std::max(worst_float, std::abs(double(zf[i]) - double(yf[i])));
    worst_double = std::max(worst_double, std::abs(zd[i] - yd[i]));
  }
  CHECK(worst_float <= 8 * 5.8 * std::numeric_limits<float>::epsilon());
  CHECK(worst_double <= 8 * 8.6 * std::numeric_limits<double>::epsilon());

  // A channels_last CUDA tensor gets the contiguous one's numbers element by element, and
  // Dropout's mask on CUDA is the CPU's.
  ts::manual_seed(44);
  auto nhwc = ts::empty<float, ts::cuda>({2, 3, 4, 5}, ts::memory_format::channels_last);
  ts::detail::fill_uniform_(nhwc);
  ts::manual_seed(44);
  CHECK(nhwc.to_vector() == ts::rand<float>({2, 3, 4, 5}).to_vector());
  const auto x = ts::rand<float>({64, 33}) + 0.5f;
  ts::nn::Dropout dropout(0.3);
  ts::manual_seed(45);
  const ts::Tensor<float> on_cpu = dropout(ts::Tensor<float>(x));
  ts::manual_seed(45);
  const ts::Tensor<float, ts::cuda> on_gpu = dropout(ts::Tensor<float>(x).cuda());
  CHECK(on_gpu.to_vector() == on_cpu.to_vector());
}

TEST_CASE("copies between CUDA ordinals", "[cuda][placement][skippable]") {
  if (ts::cuda::device_count() < 2) TESSERA_SKIP("only one CUDA device: peer copies not exercised");
  auto a = ts::arange<float, ts::cuda>(0, 8, 1, 0);
  auto b = a.to(1);
  CHECK(b.device_index() == 1);
  CHECK(b.to_vector() == a.to_vector());
  CHECK_THROWS_AS(ts::cat({a, b}, 0), ts::device_mismatch_error);
}

// Values no copy in these tests produces by accident: v(i) = i * 0.25 - 1000 (exact in float).
std::vector<float> pinned_values(std::int64_t n, float shift = 0) {
  std::vector<float> values(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) {
    values[static_cast<std::size_t>(i)] = static_cast<float>(i) * 0.25f - 1000.0f + shift;
  }
  return values;
}

TEST_CASE("pin_memory copies into pinned memory; a pinned tensor pins to itself",
          "[cuda][pin_memory]") {
  const auto values = pinned_values(6);
  auto a = ts::from_vector<float>(values, {2, 3});
  CHECK_FALSE(a.is_pinned());
  auto p = a.pin_memory();
  CHECK(p.is_pinned());
  CHECK_FALSE(a.is_pinned());
  CHECK_FALSE(p.shares_storage_with(a));
  CHECK(p.device() == a.device());
  CHECK(p.shape() == a.shape());
  CHECK(p.to_vector() == values);
  CHECK(p.pin_memory().shares_storage_with(p));
  CHECK(ts::memory::pinned_stats().allocated_bytes.current >= 512);
  // A view pins as a contiguous copy of its elements.
  auto t = a.t().pin_memory();
  CHECK(t.is_pinned());
  CHECK(t.is_contiguous());
  CHECK(t.to_vector() == std::vector<float>{values[0], values[3], values[1], values[4], values[2],
                                            values[5]});
  // Round trip through the device, and a CUDA tensor is never pinned.
  auto d = p.cuda();
  CHECK_FALSE(d.is_pinned());
  CHECK(d.cpu().to_vector() == values);
  CHECK(p.cpu().shares_storage_with(p));
}

TEST_CASE("a copy from pinned memory does not wait and survives the tensor's free",
          "[cuda][pin_memory]") {
  const std::int64_t n = std::int64_t{1} << 24;  // 64 MiB: milliseconds on the bus
  const auto values = pinned_values(n);
  for (bool own_stream : {false, true}) {
    const ts::Device cuda0 = ts::Device::parse("cuda:0");
    ts::Stream stream = own_stream ? ts::Stream(cuda0) : ts::current_stream(cuda0);
    ts::StreamGuard guard(stream);
    auto source = ts::from_vector<float>(values, {n}).pin_memory();
    ts::Tensor<float, ts::cuda> on_device = source.cuda();
    source = ts::Tensor<float>();  // freed while the copy may still run
    // A new pinned buffer of the same size, overwritten at once: it must not be the block the
    // copy still reads (the pool waits for the recorded stream before handing it out again).
    auto other = ts::full<float>({n}, 7.0f).pin_memory();
    other.fill_(-3.0f);
    // Parenthesised: 16M values are not printed on failure.
    CHECK((on_device.cpu().to_vector() == values));  // device -> pageable host: synchronous
    // A copy into a pinned tensor from the device waits, so its values are there at once.
    auto back = ts::zeros<float>({n}).pin_memory();
    back.copy_(on_device);
    CHECK((back.to_vector() == values));
    stream.synchronize();
  }
}

TEST_CASE("DataLoader pin_memory: every batch copied to CUDA without waiting is the right batch",
          "[cuda][pin_memory][data]") {
  // 512 examples of 4096 floats, batches of 16: 32 batches of 256 KiB per epoch, three epochs,
  // each batch copied to the device with .to<cuda>() and the loop going on at once. A pinned
  // buffer refilled while its copy still ran would show another batch's rows on the device.
  constexpr std::int64_t examples = 512;
  constexpr std::int64_t features = 4096;
  const auto x_values = pinned_values(examples * features);
  std::vector<std::int64_t> y_values(examples);
  for (std::int64_t i = 0; i < examples; ++i) y_values[static_cast<std::size_t>(i)] = 3 * i + 1;
  ts::data::TensorDataset<float, std::int64_t> dataset(
      ts::from_vector<float>(x_values, {examples, features}),
      ts::from_vector<std::int64_t>(y_values, {examples}));
  for (int workers : {0, 2}) {
    ts::data::DataLoader loader(dataset, {.batch_size = 16,
                                          .shuffle = true,
                                          .num_workers = workers,
                                          .pin_memory = true,
                                          .prefetch_factor = 2,
                                          .seed = 3});
    REQUIRE(loader.pinned());
    for (int epoch = 0; epoch < 3; ++epoch) {
      const std::vector<std::int64_t> order = loader.order(loader.epoch());
      std::vector<std::tuple<ts::Tensor<float, ts::cuda>, ts::Tensor<std::int64_t, ts::cuda>>>
          on_device;
      for (auto [x, y] : loader) {
        CHECK(x.is_pinned());
        CHECK(y.is_pinned());
        on_device.emplace_back(x.to<ts::cuda>(), y.to<ts::cuda>());
      }
      REQUIRE(on_device.size() == 32);
      for (std::size_t k = 0; k < on_device.size(); ++k) {
        const auto xs = std::get<0>(on_device[k]).cpu().to_vector();
        const auto ys = std::get<1>(on_device[k]).cpu().to_vector();
        REQUIRE(ys.size() == 16);
        bool rows_match = true;
        for (std::size_t j = 0; j < 16; ++j) {
          const std::int64_t index = order[k * 16 + j];
          CHECK(ys[j] == 3 * index + 1);
          for (std::int64_t c = 0; c < features; ++c) {
            rows_match = rows_match &&
                         xs[j * features + static_cast<std::size_t>(c)] ==
                             x_values[static_cast<std::size_t>(index * features + c)];
          }
        }
        CHECK(rows_match);
      }
    }
  }
}

TEST_CASE("blocks recorded on a stream destroyed before their free are freed after its work",
          "[cuda][streams][pin_memory]") {
  // A device block (record_stream) and a pinned block (an asynchronous copy from it) both name a
  // stream whose last handle goes before theirs: freeing them waits for that stream's work with
  // the device's instead of failing to record an event on it, and both pools stay usable.
  // `copied` is written on the side stream and read on the default one: as in PyTorch, the
  // reading stream must wait for the writing one (wait_stream) - streams are not ordered with
  // each other, and a copy to the host waits only for its own stream.
  const ts::Device cuda0 = ts::Device::parse("cuda:0");
  const std::int64_t n = std::int64_t{1} << 20;
  const auto values = pinned_values(n);
  auto on_device = ts::from_vector<float>(values, {n}).cuda();
  auto pinned = ts::from_vector<float>(values, {n}).pin_memory();
  ts::Tensor<float, ts::cuda> copied;
  {
    ts::Stream stream(cuda0);
    ts::StreamGuard guard(stream);
    on_device.record_stream(stream);
    copied = pinned.cuda();  // queued on `stream`, which is recorded on the pinned block
    guard.previous_stream().wait_stream(stream);  // copied.cpu() below runs on the default stream
  }
  const auto allocated = ts::memory::allocated(cuda0);
  on_device = ts::Tensor<float, ts::cuda>();
  CHECK(ts::memory::allocated(cuda0) < allocated);
  const auto pinned_allocated = ts::memory::pinned_stats().allocated_bytes.current;
  pinned = ts::Tensor<float>();
  CHECK(ts::memory::pinned_stats().allocated_bytes.current < pinned_allocated);
  CHECK((copied.cpu().to_vector() == values));
  auto again = ts::from_vector<float>(pinned_values(n, 1.0f), {n}).pin_memory().cuda();
  CHECK((again.cpu().to_vector() == pinned_values(n, 1.0f)));
}

TEST_CASE("the pinned pool's statistics return to 0 once everything is freed",
          "[cuda][pin_memory][memory]") {
  {
    auto a = ts::from_vector<float>(pinned_values(1000), {1000}).pin_memory();
    auto source = ts::zeros<double>({3, 5000});
    const auto cpu_allocated = ts::memory::allocated(ts::Device{});
    auto b = source.pin_memory();  // pinned memory is not cpu:0's pool's
    CHECK(ts::memory::allocated(ts::Device{}) == cpu_allocated);
    auto d = a.cuda();
    CHECK(ts::memory::pinned_stats().allocated_bytes.current >= 4000 + 120000);
    CHECK(ts::memory::pinned_stats().reserved_bytes.current > 0);
  }
  // Every pinned tensor of the executable is gone by now (the tests above free theirs).
  CHECK(ts::memory::pinned_stats().allocated_bytes.current == 0);
  CHECK(ts::memory::pinned_stats().requested_bytes.current == 0);
  ts::memory::pinned_empty_cache();  // waits for the copies recorded on freed blocks
  CHECK(ts::memory::pinned_stats().active_bytes.current == 0);
  CHECK(ts::memory::pinned_stats().reserved_bytes.current == 0);
}

}  // namespace cuda_tensor_test
