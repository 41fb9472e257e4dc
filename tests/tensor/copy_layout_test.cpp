// Copies, conversions and fills on the CPU over every kind of layout the copy loop meets: one
// dense run (cut over threads when large), rows that step by one on both sides, transposed and
// permuted rows, broadcast sources (a stride of 0), a single strided run, one element, views of a
// larger buffer (whose other elements must stay as they were), for dtypes of every element size
// (within one dtype the bits move, shared by dtypes of one size). Expected values are read from
// the source's memory through its own strides by index arithmetic here, and results are read
// through the destination's strides the same way: the copy under test is used for nothing else.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <vector>

#include "tessera/tessera.hpp"

namespace copy_layout_test {  // one namespace per test file: unity builds compile several together

namespace ts = tessera;

namespace {
// Calls fn(offset_a, offset_b) for every index of `shape` in row-major order, with the element
// offsets of that index under strides a and b.
void for_each_index(const ts::Shape& shape, const ts::Strides& a, const ts::Strides& b,
                    const std::function<void(std::int64_t, std::int64_t)>& fn) {
  const int rank = shape.size();
  if (shape.numel() == 0) return;
  std::vector<std::int64_t> index(static_cast<std::size_t>(rank), 0);
  for (std::int64_t n = 0; n < shape.numel(); ++n) {
    std::int64_t oa = 0;
    std::int64_t ob = 0;
    for (int d = 0; d < rank; ++d) {
      oa += index[static_cast<std::size_t>(d)] * a[d];
      ob += index[static_cast<std::size_t>(d)] * b[d];
    }
    fn(oa, ob);
    for (int d = rank - 1; d >= 0; --d) {
      if (++index[static_cast<std::size_t>(d)] < shape[d]) break;
      index[static_cast<std::size_t>(d)] = 0;
    }
  }
}

// A contiguous tensor of `shape` whose element i is value(i), made without a copy kernel.
template <class T>
ts::Tensor<T> filled(const ts::Shape& shape, const std::function<T(std::int64_t)>& value) {
  auto t = ts::empty<T>(shape);
  for (std::int64_t i = 0; i < shape.numel(); ++i) t.data()[i] = value(i);
  return t;
}

// The distinct bit pattern of element i for a dtype of `bytes` bytes (high bits set too, so that
// a copy of the wrong width or order shows).
template <class T>
T pattern(std::int64_t i) {
  using U = std::conditional_t<
      sizeof(T) == 1, std::uint8_t,
      std::conditional_t<sizeof(T) == 2, std::uint16_t,
                         std::conditional_t<sizeof(T) == 4, std::uint32_t, std::uint64_t>>>;
  const U bits =
      static_cast<U>(static_cast<std::uint64_t>(i) * 0x9E3779B97F4A7C15ull >> (64 - 8 * sizeof(T)));
  T value;
  std::memcpy(static_cast<void*>(&value), &bits, sizeof(T));
  return value;
}

template <class T>
bool same_bits(const T& a, const T& b) {
  return std::memcmp(&a, &b, sizeof(T)) == 0;
}

// The views of one source copied in each case: a name, the view of `base`, made by the library's
// view functions (metadata only).
template <class T>
std::vector<std::pair<const char*, ts::Tensor<T>>> source_views(const ts::Tensor<T>& base4,
                                                                const ts::Tensor<T>& large,
                                                                const ts::Tensor<T>& column) {
  return {
      {"contiguous", base4},
      {"large contiguous (threads)", large},
      {"transposed", base4.transpose(2, 3)},
      {"permuted to NHWC order", base4.permute({0, 2, 3, 1})},
      {"narrowed rows", base4.narrow(3, 1, 3)},
      {"large, narrowed (rows over threads)", large.view({512, 300}).narrow(1, 7, 250)},
      {"one strided run", large.view({512, 300}).select(1, 5)},
      {"broadcast row", base4.select(0, 1).select(0, 2).narrow(0, 0, 1).expand({6, 5})},
      {"broadcast column (threads)", column.expand({4, 20000})},
      {"one element behind strides",
       base4.narrow(0, 1, 1).narrow(1, 2, 1).narrow(2, 1, 1).narrow(3, 2, 1)},
  };
}
}  // namespace

TEMPLATE_TEST_CASE("copy_ moves the bits of every element for every layout, within one dtype",
                   "[tensor][copy]", std::uint8_t, bool, ts::half, ts::bfloat16, std::int16_t,
                   float, std::int32_t, double, std::int64_t) {
  using T = TestType;
  const auto value = [](std::int64_t i) {
    if constexpr (std::is_same_v<T, bool>) {
      return i % 3 == 1;
    } else {
      return pattern<T>(i);
    }
  };
  const auto base4 = filled<T>({2, 3, 4, 5}, value);
  const auto large = filled<T>({512 * 300}, value);
  const auto column = filled<T>({4, 1}, [&](std::int64_t i) { return value(i + 11); });
  for (const auto& [name, src] : source_views<T>(base4, large, column)) {
    INFO(name << ", shape " << src.shape().str());
    // Into a contiguous tensor, and into a view of a larger buffer (the destination's own rows
    // are a transposed view: its other elements must keep their sentinel).
    auto dense = ts::empty<T>(src.shape());
    dense.copy_(src);
    std::int64_t wrong = 0;
    for_each_index(src.shape(), src.strides(), dense.strides(),
                   [&](std::int64_t s, std::int64_t d) {
                     if (!same_bits(src.data()[s], dense.data()[d])) ++wrong;
                   });
    CHECK(wrong == 0);

    ts::Shape padded_shape = src.shape();  // the last two dimensions swapped, one more row
    const int rank = padded_shape.size();
    if (rank >= 2) std::swap(padded_shape[rank - 1], padded_shape[rank - 2]);
    if (rank >= 1) padded_shape[0] += 1;
    const T sentinel = value(-1);
    auto buffer = filled<T>(padded_shape, [&](std::int64_t) { return sentinel; });
    auto view = rank >= 1 ? buffer.narrow(0, 1, padded_shape[0] - 1) : buffer;
    if (rank >= 2) view = view.transpose(rank - 1, rank - 2);
    REQUIRE(view.shape() == src.shape());
    view.copy_(src);
    wrong = 0;
    for_each_index(src.shape(), src.strides(), view.strides(), [&](std::int64_t s, std::int64_t d) {
      if (!same_bits(src.data()[s], view.data()[d])) ++wrong;
    });
    CHECK(wrong == 0);
    // Outside the view: the first index of dimension 0 of the buffer is never written.
    if (rank >= 1) {
      const std::int64_t untouched = buffer.numel() / buffer.shape()[0];
      std::int64_t changed = 0;
      for (std::int64_t i = 0; i < untouched; ++i) {
        if (!same_bits(buffer.data()[i], sentinel)) ++changed;
      }
      CHECK(changed == 0);
    }
  }
}

TEST_CASE("to<U>() and copy_ convert element by element for every layout", "[tensor][copy]") {
  // Integers exact in every dtype involved, negative ones too.
  const auto value = [](std::int64_t i) { return static_cast<float>(i % 251 - 125); };
  const auto base4 = filled<float>({2, 3, 4, 5}, value);
  const auto large = filled<float>({512 * 300}, value);
  const auto column = filled<float>({4, 1}, [&](std::int64_t i) { return value(i + 11); });
  for (const auto& [name, src] : source_views<float>(base4, large, column)) {
    INFO(name << ", shape " << src.shape().str());
    const auto check = [&](const auto& out, auto expected_of) {
      REQUIRE(out.shape() == src.shape());
      std::int64_t wrong = 0;
      for_each_index(src.shape(), src.strides(), out.strides(),
                     [&](std::int64_t s, std::int64_t d) {
                       if (!same_bits(out.data()[d], expected_of(src.data()[s]))) ++wrong;
                     });
      CHECK(wrong == 0);
    };
    check(src.to<double>(), [](float x) { return static_cast<double>(x); });
    check(src.to<std::int32_t>(), [](float x) { return static_cast<std::int32_t>(x); });
    check(src.to<std::int64_t>(), [](float x) { return static_cast<std::int64_t>(x); });
    check(src.to<bool>(), [](float x) { return x != 0.0f; });
    check(src.to<ts::half>(), [](float x) { return ts::half(x); });
    // Into a transposed destination of another dtype.
    auto out = ts::empty<ts::bfloat16>(src.shape());
    if (src.dim() >= 2) {
      ts::Shape swapped = src.shape();
      std::swap(swapped[0], swapped[1]);
      out = ts::empty<ts::bfloat16>(swapped).transpose(0, 1);
    }
    out.copy_(src);
    check(out, [](float x) { return ts::bfloat16(x); });
  }
}

TEMPLATE_TEST_CASE("fill_ writes every element of every layout and nothing else", "[tensor][copy]",
                   std::uint8_t, ts::half, float, double) {
  using T = TestType;
  const T sentinel = pattern<T>(3);
  const T value = pattern<T>(12345);
  const auto buffer_of = [&](const ts::Shape& shape) {
    return filled<T>(shape, [&](std::int64_t) { return sentinel; });
  };
  struct layout_case {
    const char* name;
    ts::Shape buffer;
    std::function<ts::Tensor<T>(const ts::Tensor<T>&)> view;
  };
  const std::vector<layout_case> cases = {
      {"large dense (threads)", {300, 300}, [](const auto& b) { return b; }},
      {"narrowed rows", {40, 30}, [](const auto& b) { return b.narrow(1, 3, 20); }},
      {"large, narrowed (rows over threads)",
       {300, 300},
       [](const auto& b) { return b.narrow(1, 1, 250); }},
      {"transposed, narrowed", {6, 9}, [](const auto& b) { return b.narrow(1, 2, 5).t(); }},
      {"one strided run (large)", {70000, 3}, [](const auto& b) { return b.select(1, 1); }},
      {"one element", {4, 4}, [](const auto& b) { return b.narrow(0, 2, 1).narrow(1, 3, 1); }},
  };
  for (const auto& c : cases) {
    INFO(c.name);
    auto buffer = buffer_of(c.buffer);
    auto view = c.view(buffer);
    view.fill_(value);
    // Mark the view's elements through its strides, then check the whole buffer.
    std::vector<char> in_view(static_cast<std::size_t>(buffer.numel()), 0);
    const std::int64_t base = view.storage_offset() - buffer.storage_offset();
    for_each_index(view.shape(), view.strides(), view.strides(), [&](std::int64_t o, std::int64_t) {
      in_view[static_cast<std::size_t>(base + o)] = 1;
    });
    std::int64_t wrong = 0;
    for (std::int64_t i = 0; i < buffer.numel(); ++i) {
      const T expected = in_view[static_cast<std::size_t>(i)] ? value : sentinel;
      if (!same_bits(buffer.data()[i], expected)) ++wrong;
    }
    CHECK(wrong == 0);
  }
}

}  // namespace copy_layout_test
