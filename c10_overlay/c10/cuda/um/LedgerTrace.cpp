#include <c10/cuda/um/LedgerTrace.h>

#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fcntl.h>
#include <unistd.h>

namespace c10::cuda::um {

namespace {

constexpr size_t kWriteAt = 4u << 20; // bytes buffered before a write

bool knownOp(char c) {
  switch (c) {
    case TraceRecord::AddSegment:
    case TraceRecord::RemoveSegment:
    case TraceRecord::Alloc:
    case TraceRecord::Free:
    case TraceRecord::Touch:
    case TraceRecord::Forget:
    case TraceRecord::Evict:
    case TraceRecord::Plan:
    case TraceRecord::Clock:
      return true;
    default:
      return false;
  }
}

// The file open in this process, written at exit (the engine that owns it
// is never destroyed: Engine::get).
TraceFile* g_open = nullptr;

void flushAtExit() {
  if (g_open != nullptr) {
    g_open->flush();
  }
}

} // namespace

std::string formatTrace(const TraceRecord& r) {
  char line[256];
  const int n = std::snprintf(
      line, sizeof(line),
      "%c %" PRIxPTR " %" PRIu64 " %d %" PRIxPTR " %d %d %d %" PRIu64 " %d %d %d",
      static_cast<char>(r.op), r.addr, r.size, r.device, r.stream,
      static_cast<int>(r.flag), static_cast<int>(r.adopted),
      r.policy == Policy::Lru ? 1 : 0, r.limits.budget,
      static_cast<int>(r.limits.can_act), static_cast<int>(r.limits.discard),
      static_cast<int>(r.limits.read_copies) | (r.limits.warm_first ? 2 : 0));
  std::string out(line, static_cast<size_t>(n));
  if (r.needed_at != 0) {
    out += " " + std::to_string(r.needed_at); // a bring-in ahead
  }
  return out;
}

bool parseTrace(std::string_view line, TraceRecord& r) {
  if (line.empty() || line.size() > 255 || !knownOp(line[0])) {
    return false;
  }
  char text[256];
  std::memcpy(text, line.data(), line.size());
  text[line.size()] = '\0';
  char op = 0;
  int flag = 0, adopted = 0, policy = 0, can_act = 0, discard = 0, copies = 0;
  int used = 0;
  r.needed_at = 0;
  const int got = std::sscanf(
      text,
      "%c %" SCNxPTR " %" SCNu64 " %d %" SCNxPTR " %d %d %d %" SCNu64 " %d %d %d%n",
      &op, &r.addr, &r.size, &r.device, &r.stream, &flag, &adopted, &policy,
      &r.limits.budget, &can_act, &discard, &copies, &used);
  if (got != 12 || policy < 0 || policy > 1) {
    return false;
  }
  if (static_cast<size_t>(used) != line.size()) {
    // A bring-in ahead: one more field, its position.
    int more = 0;
    if (op != TraceRecord::Touch ||
        std::sscanf(text + used, " %" SCNu64 "%n", &r.needed_at, &more) != 1 ||
        static_cast<size_t>(used + more) != line.size() || r.needed_at == 0) {
      return false;
    }
  }
  r.op = static_cast<TraceRecord::Op>(op);
  r.flag = flag != 0;
  r.adopted = adopted != 0;
  r.policy = policy == 1 ? Policy::Lru : Policy::Static;
  r.limits.can_act = can_act != 0;
  r.limits.discard = discard != 0;
  r.limits.read_copies = (copies & 1) != 0;
  r.limits.warm_first = (copies & 2) != 0;
  return true;
}

void replayTrace(Residency& ledger, const TraceRecord& r, std::vector<Action>& out) {
  void* stream = reinterpret_cast<void*>(r.stream);
  switch (r.op) {
    case TraceRecord::AddSegment:
      ledger.addSegment(r.addr, r.size, r.device, stream, r.flag, r.adopted,
                        r.policy, r.limits, out);
      break;
    case TraceRecord::RemoveSegment:
      ledger.removeSegment(r.addr);
      break;
    case TraceRecord::Alloc:
      ledger.onAlloc(r.addr, r.size, stream, r.policy, r.limits, out, r.flag);
      break;
    case TraceRecord::Free:
      ledger.onFree(r.addr, r.size, r.flag);
      break;
    case TraceRecord::Touch:
      ledger.touch(r.addr, r.size, r.device, stream, r.policy, r.limits, out,
                   r.flag, r.adopted, r.needed_at);
      break;
    case TraceRecord::Forget:
      ledger.forget(r.addr, r.size);
      break;
    case TraceRecord::Evict:
      ledger.evict(r.addr, r.size, stream, r.limits, out);
      break;
    case TraceRecord::Plan:
      ledger.plan(r.addr, r.size, r.limits.budget);
      break;
    case TraceRecord::Clock:
      ledger.setPlanClock(r.device, PlanClock{r.addr, r.size});
      break;
  }
}

std::unique_ptr<TraceFile> TraceFile::open(const std::string& path, std::string& why) {
  const int pid = static_cast<int>(getpid());
  const std::string name = path + "." + std::to_string(pid);
  const int fd = ::open(name.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    why = "cannot write " + name + ": " + std::strerror(errno);
    return nullptr;
  }
  std::unique_ptr<TraceFile> file(new TraceFile(fd, pid));
  file->buffer_.reserve(kWriteAt + 256);
  static const bool registered = (std::atexit(flushAtExit), true);
  (void)registered;
  g_open = file.get();
  return file;
}

TraceFile::~TraceFile() {
  flush();
  ::close(fd_);
  if (g_open == this) {
    g_open = nullptr;
  }
}

bool TraceFile::forked() const {
  return static_cast<int>(getpid()) != pid_;
}

void TraceFile::record(const TraceRecord& r) {
  if (forked()) {
    return; // the lock and the lines are the parent's copies
  }
  std::lock_guard<std::mutex> lock(mu_);
  buffer_ += formatTrace(r);
  buffer_ += '\n';
  if (buffer_.size() >= kWriteAt) {
    flushLocked();
  }
}

void TraceFile::flush() {
  if (forked()) {
    return; // the lock may have been held by a thread the child does not have
  }
  std::lock_guard<std::mutex> lock(mu_);
  flushLocked();
}

void TraceFile::flushLocked() {
  size_t done = 0;
  while (done < buffer_.size()) {
    const ssize_t n = ::write(fd_, buffer_.data() + done, buffer_.size() - done);
    if (n < 0 && errno == EINTR) {
      continue;
    }
    if (n <= 0) {
      break; // a diagnostic: a full disk loses the rest, not the run
    }
    done += static_cast<size_t>(n);
  }
  buffer_.clear();
}

} // namespace c10::cuda::um
