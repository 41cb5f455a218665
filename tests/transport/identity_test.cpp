#include "transport/identity.hpp"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <filesystem>
#include <fstream>

#include "transport/error.hpp"

namespace grove::transport {
namespace {

class IdentityTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("grove-id-" + std::to_string(::getpid()) + "-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::filesystem::path dir_;
};

TEST_F(IdentityTest, CreatedOnceWithMode0600AndReused) {
  auto a = Identity::load_or_create(dir_);
  struct stat st {};
  ASSERT_EQ(::stat((dir_ / "identity.key").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  auto b = Identity::load_or_create(dir_);
  EXPECT_EQ(a.id(), b.id());
  EXPECT_EQ(a.public_key(), b.public_key());
  EXPECT_EQ(a.id(), node_id_from_key(a.public_key()));
  EXPECT_FALSE(std::filesystem::exists(dir_ / "identity.key.tmp"));
}

TEST_F(IdentityTest, DistinctNodesDistinctIds) {
  EXPECT_NE(Identity::generate().id(), Identity::generate().id());
}

TEST_F(IdentityTest, SignVerify) {
  auto a = Identity::generate();
  std::vector<std::uint8_t> msg = {1, 2, 3};
  auto sig = a.sign(msg);
  EXPECT_TRUE(verify_signature(a.public_key(), msg, sig));
  msg[0] = 9;
  EXPECT_FALSE(verify_signature(a.public_key(), msg, sig));
  EXPECT_FALSE(verify_signature(Identity::generate().public_key(), {}, sig));
}

TEST_F(IdentityTest, CorruptFileIsRejected) {
  Identity::load_or_create(dir_);
  {
    std::ofstream out(dir_ / "identity.key", std::ios::trunc | std::ios::binary);
    out << "garbage";
  }
  EXPECT_THROW(Identity::load_or_create(dir_), ConfigError);
}

TEST_F(IdentityTest, KeyReadableByOthersIsRejected) {
  Identity::load_or_create(dir_);
  ::chmod((dir_ / "identity.key").c_str(), 0644);
  try {
    Identity::load_or_create(dir_);
    FAIL() << "expected ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("0600"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace grove::transport
