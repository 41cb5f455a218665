// Regression driver for the fuzz targets in builds without libFuzzer: runs
// LLVMFuzzerTestOneInput once over every regular file in the directories (or files) given as
// arguments, in sorted order. A failed check traps, so ctest reports the test as failed; the file
// being run is printed first so that the failing input is known.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <system_error>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size);

namespace {
namespace fs = std::filesystem;

bool read_file(const fs::path& p, std::vector<std::uint8_t>& out) {
  std::ifstream f(p, std::ios::binary);
  if (!f) return false;
  out.assign(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
  return !f.bad();
}
}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s CORPUS_DIR_OR_FILE...\n", argv[0]);
    return 2;
  }
  std::vector<fs::path> inputs;
  for (int a = 1; a < argc; ++a) {
    const fs::path arg(argv[a]);
    std::error_code ec;
    if (fs::is_directory(arg, ec)) {
      for (const auto& e : fs::recursive_directory_iterator(arg, ec))
        if (e.is_regular_file()) inputs.push_back(e.path());
    } else if (fs::is_regular_file(arg, ec)) {
      inputs.push_back(arg);
    }
    if (ec) {
      std::fprintf(stderr, "cannot read %s: %s\n", argv[a], ec.message().c_str());
      return 2;
    }
  }
  if (inputs.empty()) {
    std::fprintf(stderr, "no inputs found\n");
    return 2;
  }
  std::sort(inputs.begin(), inputs.end());

  std::vector<std::uint8_t> data;
  for (const auto& p : inputs) {
    if (!read_file(p, data)) {
      std::fprintf(stderr, "cannot read %s\n", p.c_str());
      return 2;
    }
    std::fprintf(stderr, "running %s (%zu bytes)\n", p.c_str(), data.size());
    LLVMFuzzerTestOneInput(data.data(), data.size());
  }
  std::fprintf(stderr, "%zu inputs ran without a failure\n", inputs.size());
  return 0;
}
