// The checking backend (backend/checked/): host code that reaches into its memory between ops
// crashes, and an op handed a pointer where the contract puts none aborts with the op and the
// argument named. Death tests run in a child process (threadsafe style: the child starts
// afresh, without the parent's threads).
#include "backend/checked/checked_backend.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <thread>
#include <vector>

#include "backend/registry.h"

namespace polestar {
namespace {

const Backend& Checked() { return BackendNamed("checked"); }

class CheckedBackendDeathTest : public ::testing::Test {
 protected:
  void SetUp() override { GTEST_FLAG_SET(death_test_style, "threadsafe"); }
};

TEST(CheckedBackend, IsRegisteredBelowTheCpuSoAutoNeverPicksIt) {
  const std::vector<BackendEntry>& entries = RegisteredBackends();
  const auto checked =
      std::ranges::find_if(entries, [](const BackendEntry& e) { return e.name == "checked"; });
  ASSERT_NE(checked, entries.end());
  EXPECT_LT(checked->rank, entries.front().rank);
  EXPECT_NE(BackendNamed("auto").name().substr(0, 7), "checked");
  const BackendContract contract = Checked().contract();
  EXPECT_TRUE(contract.exact_to_scalar_twins);
  EXPECT_TRUE(contract.batch_invariant);
  EXPECT_FALSE(contract.host_memory);
  EXPECT_FALSE(Checked().ViewsHostWeights());
  // It takes the CPU backend's options and computes with those kernels.
  EXPECT_EQ(BackendNamed("checked:isa=scalar").name(), "checked-cpu-scalar");
}

TEST(CheckedBackend, BuffersRoundTripAndFreedSpaceIsNoLongerBackendMemory) {
  const auto& backend = static_cast<const CheckedBackend&>(Checked());
  const std::vector<float> values = {1, -2, 3.5f, 1e-30f, 7};
  std::vector<float> back(values.size(), NAN);
  const void* freed = nullptr;
  {
    Buffer zeros(backend, 3);  // zeroed inside the fence
    std::vector<float> got(3, NAN);
    backend.Download(zeros.data(), zeros.bytes(), got.data());
    EXPECT_EQ(got, std::vector<float>(3, 0.0f));

    Buffer buffer(backend, int64_t(values.size()), Buffer::Init::kNone);
    backend.Upload(values.data(), buffer.bytes(), buffer.data());
    const Buffer copy = buffer;  // CopyBytes
    backend.Download(copy.data(), copy.bytes(), back.data());
    EXPECT_TRUE(backend.Holds(buffer.data(), buffer.bytes()));
    EXPECT_FALSE(backend.Holds(buffer.data(), buffer.bytes() + 64));  // past its allocation
    EXPECT_FALSE(backend.Holds(values.data(), 4));
    freed = buffer.data();
  }
  EXPECT_EQ(back, values);
  EXPECT_FALSE(backend.Holds(freed, 4));
}

TEST_F(CheckedBackendDeathTest, HostCodeReadingItsMemoryBetweenOpsCrashes) {
  Buffer buffer(Checked(), 4);
  EXPECT_DEATH(
      {
        const volatile float value = buffer.data()[1];
        (void)value;
      },
      "host code touched backend memory");
  EXPECT_DEATH(buffer.data()[0] = 1.0f, "host code touched backend memory");
}

TEST_F(CheckedBackendDeathTest, AnOpAbortsNamingTheArgumentThatIsNotWhereTheContractSays) {
  const Backend& backend = Checked();
  Buffer x(backend, 4), y(backend, 4);
  std::vector<float> host(4, 1.0f);
  EXPECT_DEATH(backend.AddInPlace(host.data(), y.data(), 4),
               "AddInPlace: argument x .* is not in a live allocation");
  EXPECT_DEATH(backend.AddInPlace(x.data(), y.data(), 5),
               "AddInPlace: argument x .* runs past the end of its allocation");
  EXPECT_DEATH(backend.Upload(y.data(), 16, x.data()),
               "Upload: argument host .* is backend memory where the op takes host memory");
  EXPECT_DEATH(backend.Download(x.data(), 16, y.data()), "Download: argument host");
  const std::vector<int> rows = {0, 3};
  EXPECT_DEATH(backend.CopyRows(x.data(), rows, y.data(), {}, 2),
               "CopyRows: argument src .* runs past the end");
  Buffer freed(backend, 4);
  float* stale = freed.data();
  freed = Buffer();
  EXPECT_DEATH(backend.Zero(stale, 4), "Zero: argument x .* is not in a live allocation");
}

// Ops on two threads at once, each allocating as it goes (new pages while the other's op
// runs): neither may find its memory fenced off.
TEST(CheckedBackend, OpsOnTwoThreadsAtOnceEachSeeTheirMemory) {
  const Backend& backend = Checked();
  auto work = [&](float value) {
    for (int i = 0; i < 300; ++i) {
      Buffer a(backend, 1024 + i * 64), b(backend, 1024 + i * 64);  // fresh space, mostly
      const std::vector<float> host(size_t(a.size()), value);
      backend.Upload(host.data(), a.bytes(), a.data());
      backend.Upload(host.data(), b.bytes(), b.data());
      backend.AddInPlace(a.data(), b.data(), a.size());
      std::vector<float> sum(host.size());
      backend.Download(a.data(), a.bytes(), sum.data());
      ASSERT_EQ(sum.back(), 2 * value);
    }
  };
  std::thread other(work, 3.0f);
  work(5.0f);
  other.join();
}

}  // namespace
}  // namespace polestar
