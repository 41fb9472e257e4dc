// Device-agnostic code: pick cuda:0 when a GPU is there and the CPU otherwise, move tensors
// between devices, create tensors beside others, and see the error a device mismatch gives.
//   TESSERA_CPU_DEVICES=2 ./devices     (two virtual CPU devices stand in for two GPUs)
#include <iostream>

#include "tessera/tessera.hpp"

namespace ts = tessera;

// The device kind is a type, so device-agnostic code is a template over it; the ordinal is a
// run-time value.
template <ts::DeviceKind Kind>
void demo(int ordinal) {
  std::cout << "== running on " << ts::Device::of<Kind>(ordinal) << "\n";

  // Create on the host, move to the device (a copy; the original is untouched).
  auto host = ts::arange<float>(0, 6).view({2, 3});
  auto x = host.template to<Kind>(ordinal);
  std::cout << "x = " << x << "\n";

  // New tensors beside x: same dtype, same device, like PyTorch's new_zeros.
  auto zeros = x.new_zeros({2, 3});
  auto filled = x.new_full({3}, 0.5f);
  std::cout << "x.new_zeros({2, 3}) is on " << zeros.device() << "\n";
  std::cout << "x.new_full({3}, 0.5) = " << filled << "\n";

  // Views share storage; to() to where a tensor already is returns the same storage.
  auto xt = x.t();
  std::cout << "x.t() shape " << xt.shape() << ", shares storage: " << std::boolalpha
            << xt.shares_storage_with(x) << "\n";
  std::cout << "x.to(same device) shares storage: "
            << x.template to<Kind>(ordinal).shares_storage_with(x) << "\n";

  // dtype conversion and copies across devices and dtypes.
  auto doubles = x.template to<double>();
  zeros.copy_(host.t().contiguous().view({2, 3}));
  std::cout << "x as float64 = " << doubles << "\nzeros after copy_ = " << zeros << "\n";

  // Random numbers: the same seed and shape give the same numbers on every device.
  ts::manual_seed(0);
  auto r = ts::rand<float, Kind>({4}, ordinal);
  std::cout << "rand = " << r << "\n";
}

int main() {
  // PyTorch's first line: device = "cuda:0" if torch.cuda.is_available() else "cpu"
  const auto device = ts::Device::parse(ts::cuda::is_available() ? "cuda:0" : "cpu");
  if (device.is_cuda()) {
    std::cout << "CUDA: " << ts::cuda::device_count() << " device(s), cuda:0 is "
              << ts::cuda::device_name(0) << "\n";
  } else {
    std::cout << "No CUDA device here: using the CPU (" << ts::cpu::device_count()
              << " virtual device(s); set TESSERA_CPU_DEVICES=2 for two)\n";
  }
  // The run-time device, with its kind as a type for the code that runs on it.
  ts::with_device(device, [&]<ts::DeviceKind Kind>(int ordinal) { demo<Kind>(ordinal); });

  // Two devices of one kind: cpu:0 and cpu:1 here, cuda:0 and cuda:1 on a two-GPU machine.
  if (ts::cpu::device_count() >= 2) {
    auto a = ts::ones<float>({3}, 0);
    auto b = a.to(1);
    std::cout << "\na on " << a.device() << ", b = a.to(1) on " << b.device() << "\n";
    try {
      auto joined = ts::cat({a, b}, 0);
      std::cout << "unexpected: " << joined << "\n";
      return 1;
    } catch (const ts::device_mismatch_error& e) {
      std::cout << "cat(a, b) -> device_mismatch_error: " << e.what() << "\n";
    }
  }

  // Asking for a device that does not exist names it.
  try {
    auto missing = ts::zeros<float>({2}, 5);
    std::cout << "unexpected: " << missing << "\n";
    return 1;
  } catch (const ts::device_error& e) {
    std::cout << "zeros on cpu:5 -> device_error: " << e.what() << "\n";
  }
  // Shapes are checked too, with both shapes in the message.
  try {
    ts::zeros<float>({2, 3}).copy_(ts::ones<float>({4}));
    return 1;
  } catch (const ts::shape_error& e) {
    std::cout << "copy_ of [4] into [2, 3] -> shape_error: " << e.what() << "\n";
  }
  return 0;
}
