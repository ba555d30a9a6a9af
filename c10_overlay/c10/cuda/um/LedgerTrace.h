// Ledger traces: the residency ledger's calls written to a file on the GPU
// host and read back on a CPU (Note [Ledger traces], Residency.h).
//
// Recording is off unless TORCH_UM_LEDGER_TRACE names a file: each process
// that makes the engine then writes PATH.<pid>, one line per call:
//
//   <op> <addr> <size> <device> <stream> <flag> <adopted> <policy>
//        <budget> <can_act> <discard> <flags>
//
// op is TraceRecord::Op's letter, addr and stream are hexadecimal, the rest
// decimal; policy is 0 for static, 1 for lru; flags: 1 read_copies, 2
// warm_first (DeviceLimits). A plan (P) carries its due
// position in the budget's field, the signal's clock (K) its positions in
// addr (now) and size (window); a touch ahead of its use (T) has one more
// field, the position of that use. A diagnostic for the team, not
// a user setting: a training step of a 1.1 B Llama past its budget wrote
// about 7 500 lines (0.35 MB), an inference forward about 2 000.
//
// Pure C++ (no CUDA, no c10), like Residency: the replay tool and the CPU
// tests build it with Residency.cpp alone.
#pragma once

#include <c10/cuda/um/Residency.h>

#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

namespace c10::cuda::um {

constexpr const char* kLedgerTraceEnvVar = "TORCH_UM_LEDGER_TRACE";

// One record as one line of text (no newline), and back. parseTrace returns
// false, and leaves `r` unspecified, for a line that is not a record.
std::string formatTrace(const TraceRecord& r);
bool parseTrace(std::string_view line, TraceRecord& r);

// Makes the ledger call `r` records, as the engine made it.
void replayTrace(Residency& ledger, const TraceRecord& r, std::vector<Action>& out);

// A TraceSink that writes lines to a file. Buffered in memory and written
// in large pieces, and at the process's exit. A fork()ed child records and
// writes nothing, and never takes the lock: its buffer is a copy of the
// parent's lines, and its lock may be a copy of one held by a thread the
// child does not have. Thread-safe: record() and flush() take the file's
// own lock, so that the flush at exit cannot race a record on another
// thread (the ledger's caller serialises records already, so the lock is
// not contended then).
class TraceFile final : public TraceSink {
 public:
  // Opens PATH.<pid> for writing, or returns nullptr and says why in `why`.
  static std::unique_ptr<TraceFile> open(const std::string& path, std::string& why);
  ~TraceFile() override;
  void record(const TraceRecord& r) override;
  void flush();

 private:
  TraceFile(int fd, int pid) : fd_(fd), pid_(pid) {}
  bool forked() const; // this process is a fork()ed child of the opener
  void flushLocked(); // requires mu_
  std::mutex mu_;
  int fd_;
  int pid_; // the process that opened it
  std::string buffer_;
};

} // namespace c10::cuda::um
