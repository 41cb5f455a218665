// A killed node's shared-memory segment is swept by the next node; a live node's is not.
#include "node/shm_segments.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>

namespace grove::node {
namespace {

class ShmSweep : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ =
        std::filesystem::temp_directory_path() / ("grove-shm-test-" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override {
    for (int fd : fds_) ::close(fd);
    std::filesystem::remove_all(dir_);
  }
  // A segment-like file of `bytes`; its fd is kept open (and locked if `owned`).
  std::filesystem::path make(const std::string& name, std::size_t bytes, bool owned) {
    const auto p = dir_ / name;
    const int fd = ::open(p.c_str(), O_CREAT | O_RDWR | O_CLOEXEC, 0600);
    EXPECT_GE(fd, 0);
    EXPECT_EQ(::ftruncate(fd, static_cast<off_t>(bytes)), 0);
    if (owned) {
      EXPECT_TRUE(lock_segment(fd));
    }
    fds_.push_back(fd);
    return p;
  }
  std::filesystem::path dir_;
  std::vector<int> fds_;
};

TEST_F(ShmSweep, RemovesOnlySegmentsNoLiveNodeHolds) {
  const auto live = make("grove-0123456789abcdef", 4096, true);
  const auto dead = make("grove-fedcba9876543210", 8192, false);
  const auto other = make("grove-not-a-node-id", 4096, false);  // not one of ours: kept
  const auto r = sweep_stale_segments(dir_, std::chrono::seconds(0));
  EXPECT_EQ(r.removed, 1);
  EXPECT_EQ(r.bytes, 8192u);
  EXPECT_TRUE(std::filesystem::exists(live));
  EXPECT_FALSE(std::filesystem::exists(dead));
  EXPECT_TRUE(std::filesystem::exists(other));
}

TEST_F(ShmSweep, LeavesYoungSegmentsAlone) {
  // A node between creating its segment and locking it: not swept while it is this young.
  const auto young = make("grove-00000000000000aa", 4096, false);
  EXPECT_EQ(sweep_stale_segments(dir_, std::chrono::seconds(3600)).removed, 0);
  EXPECT_TRUE(std::filesystem::exists(young));
}

TEST_F(ShmSweep, ALockIsTheOwnersUntilItCloses) {
  const auto p = make("grove-00000000000000bb", 4096, true);
  const int again = ::open(p.c_str(), O_RDWR | O_CLOEXEC);
  ASSERT_GE(again, 0);
  EXPECT_FALSE(lock_segment(again));  // another open file: the owner's lock excludes it
  ::close(fds_.back());
  fds_.pop_back();
  EXPECT_TRUE(lock_segment(again));  // the owner is gone
  ::close(again);
}

TEST(ShmSegmentName, IsGroveAndSixteenHexDigitsThenACollectiveNumber) {
  EXPECT_TRUE(is_segment_name("grove-0123456789abcdef"));
  EXPECT_FALSE(is_segment_name("grove-0123456789abcde"));
  EXPECT_FALSE(is_segment_name("grove-0123456789abcdeg"));
  EXPECT_FALSE(is_segment_name("other-0123456789abcdef"));
  EXPECT_FALSE(is_segment_name("grove-0123456789abcdef0"));
  EXPECT_TRUE(is_segment_name("grove-0123456789abcdef-c1"));
  EXPECT_TRUE(is_segment_name("grove-0123456789abcdef-c123456789"));
  EXPECT_FALSE(is_segment_name("grove-0123456789abcdef-c"));
  EXPECT_FALSE(is_segment_name("grove-0123456789abcdef-c1234567890"));
  EXPECT_FALSE(is_segment_name("grove-0123456789abcdef-c1x"));
  EXPECT_FALSE(is_segment_name("grove-0123456789abcdef-d1"));
}

}  // namespace
}  // namespace grove::node
