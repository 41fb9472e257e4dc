// Watch the caching allocator: allocated and reserved bytes as tensors come and go, empty_cache,
// the summary table, and an out-of-memory error under a limit, handled and recovered from.
// The same code reads the same on a GPU: pass the device to every ts::memory:: call.
#include <algorithm>
#include <iostream>

#include "tessera/tessera.hpp"

namespace ts = tessera;

namespace {
void report(const char* when, ts::Device d) {
  std::cout << when << ": allocated " << ts::memory::format_bytes(ts::memory::allocated(d))
            << ", reserved " << ts::memory::format_bytes(ts::memory::reserved(d)) << "\n";
}
}  // namespace

int main() {
  const ts::Device d = ts::Device::parse("cpu:0");
  report("start", d);

  {
    // 1, 128, 129 and 1024 floats: 512-byte granularity gives 512, 512, 1024 and 4096 bytes.
    auto a = ts::empty<float>({1});
    auto b = ts::empty<float>({128});
    auto c = ts::empty<float>({129});
    auto e = ts::empty<float>({1024});
    report("four small tensors", d);  // 6 KiB allocated, one 2 MiB small-pool segment reserved
    auto v = e.view({32, 32});
    report("plus a view (allocates nothing)", d);
    auto big = ts::zeros<float>({3 * 1024 * 1024});  // 12 MiB: its own segment, rounded to 2 MiB
    report("plus a 12 MiB tensor", d);
  }
  report("tensors gone (blocks cached)", d);
  std::cout << "peak allocated: " << ts::memory::format_bytes(ts::memory::peak_allocated(d))
            << "\n";
  ts::memory::empty_cache(d);
  report("after empty_cache", d);

  // A limit caps reserved bytes, as a small GPU would.
  ts::memory::set_limit(d, 32 << 20);
  auto keep = ts::ones<float>({1024});  // 4 KiB that must survive the failed request
  try {
    auto too_big = ts::empty<float>({10 * 1024 * 1024});  // 40 MiB
    std::cout << "unexpected: allocated " << too_big.numel() << " floats\n";
    return 1;
  } catch (const ts::out_of_memory_error& e) {
    std::cout << "\nout_of_memory_error: " << e.what() << "\n\n";
  }
  report("after the OOM (nothing changed)", d);
  // 4 MiB fits: PyTorch's policy gives it a 20 MiB segment, and 2 + 20 MiB is under the limit.
  auto fits = ts::ones<float>({1024 * 1024});
  const auto kept = keep.to_vector();
  const bool intact = std::all_of(kept.begin(), kept.end(), [](float v) { return v == 1.0f; });
  report("a 4 MiB tensor after the OOM", d);
  std::cout << "the tensor allocated before the OOM is intact: " << std::boolalpha << intact
            << "\n";
  std::cout << "OOMs so far: " << ts::memory::stats(d).num_ooms << "\n\n";

  std::cout << ts::memory::summary(d) << "\n";
  ts::memory::set_limit(d, ts::memory::no_limit);
  return intact && fits.numel() == 1024 * 1024 ? 0 : 1;
}
