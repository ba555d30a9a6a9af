#include <c10/cuda/um/HostMemory.h>

#include <algorithm>
#include <cstdint>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>

namespace c10::cuda::um {
namespace {

std::optional<uint64_t> memAvailable() {
  std::ifstream in("/proc/meminfo");
  std::string key;
  uint64_t kib = 0;
  std::string unit;
  while (in >> key >> kib) {
    std::getline(in, unit);
    if (key == "MemAvailable:") {
      return kib * 1024;
    }
  }
  return std::nullopt;
}

std::optional<uint64_t> readNumber(const std::string& path) {
  std::ifstream in(path);
  std::string word;
  if (!(in >> word) || word == "max") {
    return std::nullopt;
  }
  try {
    return std::stoull(word);
  } catch (...) {
    return std::nullopt;
  }
}

std::optional<uint64_t> cgroupRoom() {
  // cgroup v2: a single "0::/path" line names our group.
  std::ifstream in("/proc/self/cgroup");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("0::", 0) != 0) {
      continue;
    }
    std::string dir = "/sys/fs/cgroup" + line.substr(3);
    auto limit = readNumber(dir + "/memory.max");
    auto current = readNumber(dir + "/memory.current");
    if (limit && current) {
      return *limit > *current ? *limit - *current : 0;
    }
  }
  return std::nullopt;
}

} // namespace

uint64_t availableHostBytes() {
  uint64_t room = UINT64_MAX;
  if (auto avail = memAvailable()) {
    room = std::min(room, *avail);
  }
  if (auto cg = cgroupRoom()) {
    room = std::min(room, *cg);
  }
  return room;
}

} // namespace c10::cuda::um
