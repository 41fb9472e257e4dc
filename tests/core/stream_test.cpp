// Streams and events on virtual CPU devices (core/stream.hpp): identities, the per-thread current
// stream, StreamGuard, events as completed points with host-clock timing, record_stream's checks.
// CUDA streams are tested in tests/cuda (skipped without a GPU).
#include <catch2/catch.hpp>

#include <thread>

#include "tessera/tessera.hpp"

namespace stream_test {

namespace ts = tessera;

const ts::Device cpu0{ts::DeviceType::cpu, 0};
const ts::Device cpu1{ts::DeviceType::cpu, 1};

TEST_CASE("new streams are distinct queues; default streams are one per device", "[stream]") {
  ts::Stream a(cpu1), b(cpu1);
  CHECK(a.device() == cpu1);
  CHECK_FALSE(a.is_default());
  CHECK_FALSE(a == b);
  CHECK(a == ts::Stream(a));  // copies are handles to the same queue
  CHECK(ts::default_stream(cpu1).is_default());
  CHECK(ts::default_stream(cpu1) == ts::default_stream(cpu1));
  CHECK_FALSE(ts::default_stream(cpu1) == ts::default_stream(cpu0));
  CHECK(a.query());  // CPU work is synchronous: nothing is ever pending
  a.synchronize();
  CHECK(ts::default_stream(cpu0).str() == "Stream(device=cpu:0, default)");
  CHECK_THROWS_AS(ts::Stream(ts::Device{ts::DeviceType::cpu, 2}), ts::device_error);
  CHECK_THROWS_AS(ts::default_stream(ts::Device{ts::DeviceType::cpu, 5}), ts::device_error);
}

TEST_CASE("StreamGuard sets the current stream and device, and restores both", "[stream]") {
  ts::Stream side(cpu1);
  CHECK(ts::current_stream(cpu1).is_default());
  CHECK(ts::cpu::current_device() == 0);
  {
    ts::StreamGuard guard(side);
    CHECK(ts::current_stream(cpu1) == side);
    CHECK(ts::current_stream<ts::cpu>() == side);
    CHECK(ts::cpu::current_device() == 1);
    CHECK(ts::current_stream(cpu0).is_default());  // other devices keep theirs
    {
      ts::Stream inner(cpu1);
      ts::StreamGuard nested(inner);
      CHECK(ts::current_stream(cpu1) == inner);
    }
    CHECK(ts::current_stream(cpu1) == side);
    // Current streams are per thread: another thread sees the default.
    bool other_default = false;
    std::thread([&] { other_default = ts::current_stream(cpu1).is_default(); }).join();
    CHECK(other_default);
  }
  CHECK(ts::current_stream(cpu1).is_default());
  CHECK(ts::cpu::current_device() == 0);
  CHECK_THROWS_AS(ts::current_stream(ts::Device{ts::DeviceType::cpu, 7}), ts::device_error);
}

TEST_CASE("CPU events are complete when recorded and time with the host clock", "[stream]") {
  ts::Stream s(cpu0);
  ts::Event never;
  CHECK(never.query());  // PyTorch: an event never recorded counts as complete
  CHECK_FALSE(never.is_recorded());
  never.synchronize();

  ts::Event start(true), end(true);
  start.record(s);
  // Some work between the two events: 2^20 additions.
  auto x = ts::ones<float>({1 << 20});
  ts::Tensor<float> y = x * 2 + 1;
  end.record(s);
  CHECK(start.query());
  CHECK(end.is_recorded());
  CHECK(end.device() == cpu0);
  const double ms = start.elapsed_time(end);
  CHECK(ms >= 0.0);
  CHECK(ms < 60'000.0);
  CHECK(y.to_vector()[12345] == 3.0f);

  ts::Event plain;
  plain.record(s);
  CHECK_THROWS_WITH(start.elapsed_time(plain), Catch::Contains("the end event has it off"));
  CHECK_THROWS_WITH(ts::Event(true).elapsed_time(end), Catch::Contains("start event was never recorded"));
  ts::Event other(true);
  other.record(ts::Stream(cpu1));
  CHECK_THROWS_AS(start.elapsed_time(other), ts::device_mismatch_error);

  // Waiting on a completed CPU point is immediate; record_event is record on a new event.
  s.wait_event(end);
  s.wait_stream(ts::Stream(cpu1));
  end.wait(ts::default_stream(cpu1));
  CHECK(s.record_event().is_recorded());
}

TEST_CASE("record_stream checks the stream's device", "[stream]") {
  auto t = ts::zeros<float>({16}, 1);
  t.record_stream(ts::Stream(cpu1));  // CPU: nothing to wait for, the block is freed as usual
  CHECK_THROWS_AS(t.record_stream(ts::Stream(cpu0)), ts::device_mismatch_error);
  CHECK_THROWS_WITH(t.record_stream(ts::Stream(cpu0)),
                    Catch::Contains("the tensor is on cpu:1, the stream on cpu:0"));
  ts::zeros<float>({0}, 1).record_stream(ts::Stream(cpu1));  // no memory: nothing to mark
  const auto before = ts::memory::allocated(cpu1);
  { auto u = ts::zeros<float>({256}, 1); u.record_stream(ts::Stream(cpu1)); }
  CHECK(ts::memory::allocated(cpu1) == before);
}

}  // namespace stream_test
