// A fresh directory under the system's temporary directory, removed with everything in it.
#pragma once

#include <unistd.h>

#include <filesystem>
#include <random>
#include <string>

namespace grove::node::testing {

struct TempDir {
  std::filesystem::path path;
  explicit TempDir(const std::string& prefix = "grove-test-") {
    path = std::filesystem::temp_directory_path() /
           (prefix + std::to_string(::getpid()) + "-" + std::to_string(std::random_device{}()));
    std::filesystem::create_directories(path);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
};

}  // namespace grove::node::testing
