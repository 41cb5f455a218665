#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <stdexcept>

#include "sim/experiments.hpp"

namespace grove::sim {

std::string Args::str(const std::string& k, const std::string& def) const {
  auto it = kv_.find(k);
  return it == kv_.end() ? def : it->second;
}

double Args::num(const std::string& k, double def) const {
  auto it = kv_.find(k);
  if (it == kv_.end()) return def;
  char* end = nullptr;
  const double v = std::strtod(it->second.c_str(), &end);
  if (it->second.empty() || *end != '\0' || !std::isfinite(v))
    throw std::invalid_argument("--" + k + ": not a number: '" + it->second + "'");
  return v;
}

std::uint64_t Args::count(const std::string& k, std::uint64_t def) const {
  const double v = num(k, static_cast<double>(def));
  if (v < 0 || v != std::floor(v) || v > 1e15)
    throw std::invalid_argument("--" + k + ": not a whole number >= 0");
  return static_cast<std::uint64_t>(v);
}

std::vector<double> Args::list(const std::string& k, const std::vector<double>& def) const {
  auto it = kv_.find(k);
  if (it == kv_.end()) return def;
  std::vector<double> out;
  std::size_t pos = 0;
  const std::string& s = it->second;
  while (pos <= s.size()) {
    const std::size_t comma = std::min(s.find(',', pos), s.size());
    const std::string item = s.substr(pos, comma - pos);
    char* end = nullptr;
    const double v = std::strtod(item.c_str(), &end);
    if (item.empty() || *end != '\0' || !std::isfinite(v))
      throw std::invalid_argument("--" + k + ": not a list of numbers: '" + s + "'");
    out.push_back(v);
    pos = comma + 1;
  }
  return out;
}

Csv::Csv(const std::string& path, const std::vector<std::string>& columns) : path_(path) {
  std::filesystem::create_directories(std::filesystem::path(path).parent_path());
  f_ = std::fopen(path.c_str(), "w");
  if (!f_) throw std::runtime_error("cannot write " + path);
  row(columns);
}

Csv::~Csv() {
  if (f_) std::fclose(f_);
}

void Csv::row(const std::vector<std::string>& cells) {
  for (std::size_t i = 0; i < cells.size(); ++i)
    std::fprintf(f_, "%s%s", i ? "," : "", cells[i].c_str());
  std::fprintf(f_, "\n");
  std::fflush(f_);
}

std::string fmt(double v, int precision) {
  if (!std::isfinite(v)) return "";
  char b[64];
  std::snprintf(b, sizeof b, "%.*g", precision, v);
  return b;
}

bool plot(const std::string& kind, const std::string& csv, const std::string& png) {
  const char* py = "/usr/bin/python3";
  if (!std::filesystem::exists(py)) {
    std::printf("(no %s: CSV only)\n", py);
    return false;
  }
  const std::string script = std::string(GROVE_SOURCE_DIR) + "/sim/plot.py";
  const std::string cmd =
      std::string(py) + " '" + script + "' " + kind + " '" + csv + "' '" + png + "'";
  const int rc = std::system(cmd.c_str());
  if (rc != 0) {
    std::printf("(plot not drawn: %s exited with %d)\n", script.c_str(), rc);
    return false;
  }
  std::printf("plot: %s\n", png.c_str());
  return true;
}

}  // namespace grove::sim
