#include <c10/cuda/um/Config.h>

#include <c10/util/Exception.h>

#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

namespace c10::cuda::um {
namespace {

constexpr const char* kKeys =
    "enabled, max_managed, device_budget, host_headroom, prefetch, policy, "
    "discard, hooks, op_signal, op_lookahead, op_stage, evict_warm_first, predict, "
    "predict_lookahead, "
    "predict_copy_sms, "
    "predict_copy_kernel, predict_stage_kernel, predict_ddp_buckets, predict_programs, "
    "read_copies, host_alloc, "
    "host_alloc_min, host_copy_kernel, host_copy_cpu_share, pageable_copy_cpu, "
    "pin_in_place";

std::string_view trim(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) {
    s.remove_prefix(1);
  }
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) {
    s.remove_suffix(1);
  }
  return s;
}

std::optional<double> parseNumber(std::string_view text) {
  if (text.empty()) {
    return std::nullopt;
  }
  std::string buf(text);
  char* end = nullptr;
  double v = std::strtod(buf.c_str(), &end);
  if (end != buf.c_str() + buf.size() || !std::isfinite(v) || v < 0) {
    return std::nullopt;
  }
  return v;
}

bool parseBool(
    std::string_view key,
    std::string_view value,
    std::string_view source) {
  if (value == "True" || value == "true" || value == "1") {
    return true;
  }
  if (value == "False" || value == "false" || value == "0") {
    return false;
  }
  TORCH_CHECK(
      false,
      source,
      ": '",
      key,
      "' takes True or False, got '",
      value,
      "'.");
}

// One of two words, `on` or `off`; true for `on`. `meaning` says what each does, for
// the message.
bool parseChoice(
    std::string_view key,
    std::string_view value,
    std::string_view source,
    std::string_view on,
    std::string_view off,
    std::string_view meaning) {
  TORCH_CHECK(
      value == on || value == off,
      source,
      ": '",
      key,
      "' takes ",
      meaning,
      ", got '",
      value,
      "'.");
  return value == on;
}

uint64_t requireBytes(
    std::string_view key,
    std::string_view value,
    std::string_view source) {
  auto bytes = parseBytes(value);
  TORCH_CHECK(
      bytes.has_value(),
      source,
      ": '",
      key,
      "' takes a size such as 512MiB, 8GiB or 1073741824, got '",
      value,
      "'.");
  return *bytes;
}

} // namespace

std::optional<uint64_t> parseBytes(std::string_view text) {
  text = trim(text);
  size_t split = 0;
  while (split < text.size() &&
         (std::isdigit(static_cast<unsigned char>(text[split])) ||
          text[split] == '.')) {
    ++split;
  }
  auto number = parseNumber(text.substr(0, split));
  if (!number) {
    return std::nullopt;
  }
  std::string unit(trim(text.substr(split)));
  for (auto& c : unit) {
    c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  }
  double scale = 0;
  if (unit.empty() || unit == "B") {
    scale = 1;
  } else if (unit == "K" || unit == "KB" || unit == "KIB") {
    scale = 1024.0;
  } else if (unit == "M" || unit == "MB" || unit == "MIB") {
    scale = 1024.0 * 1024;
  } else if (unit == "G" || unit == "GB" || unit == "GIB") {
    scale = 1024.0 * 1024 * 1024;
  } else if (unit == "T" || unit == "TB" || unit == "TIB") {
    scale = 1024.0 * 1024 * 1024 * 1024;
  } else {
    return std::nullopt;
  }
  double bytes = *number * scale;
  if (bytes >= 1.8e19) {
    return std::nullopt;
  }
  return static_cast<uint64_t>(std::llround(bytes));
}

std::string formatBytes(uint64_t bytes) {
  const char* units[] = {"bytes", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(bytes);
  int u = 0;
  while (v >= 1024.0 && u < 4) {
    v /= 1024.0;
    ++u;
  }
  char buf[64];
  if (u == 0) {
    std::snprintf(buf, sizeof(buf), "%llu bytes", (unsigned long long)bytes);
  } else {
    std::snprintf(buf, sizeof(buf), "%.2f %s", v, units[u]);
  }
  return buf;
}

uint64_t SizeSpec::resolve(uint64_t device_total) const {
  if (isPercent()) {
    return static_cast<uint64_t>(
        static_cast<double>(device_total) * percent / 100.0);
  }
  return bytes;
}

std::string SizeSpec::str() const {
  if (isPercent()) {
    char buf[32];
    std::snprintf(buf, sizeof(buf), "%g%%", percent);
    return buf;
  }
  return std::to_string(bytes);
}

std::string Config::str() const {
  std::string s;
  s += "enabled:";
  s += enabled ? "True" : "False";
  s += ",max_managed:";
  s += max_managed ? std::to_string(*max_managed) : std::string("none");
  s += ",device_budget:" + device_budget.str();
  s += ",host_headroom:" + std::to_string(host_headroom);
  s += ",prefetch:";
  s += prefetch ? "True" : "False";
  s += ",policy:";
  s += lru ? "lru" : "static";
  s += ",discard:";
  s += discard ? "True" : "False";
  s += ",hooks:";
  s += hooks ? "True" : "False";
  s += ",op_signal:";
  s += op_signal ? "True" : "False";
  s += ",op_lookahead:" + std::to_string(op_lookahead);
  s += ",op_stage:";
  s += op_stage ? "True" : "False";
  s += ",evict_warm_first:";
  s += evict_warm_first ? "True" : "False";
  s += ",predict:";
  s += predict ? "True" : "False";
  s += ",predict_lookahead:" + std::to_string(predict_lookahead);
  s += ",predict_copy_sms:";
  s += predict_copy_sms < 0 ? std::string("auto")
                            : std::to_string(predict_copy_sms);
  s += ",predict_copy_kernel:";
  s += predict_copy_lean ? "lean" : "foreach";
  s += ",predict_stage_kernel:";
  s += predict_stage_lean ? "lean" : "foreach";
  s += ",predict_ddp_buckets:";
  s += predict_ddp_buckets ? "True" : "False";
  s += ",predict_programs:";
  s += predict_programs ? "True" : "False";
  s += ",read_copies:";
  s += read_copies ? "True" : "False";
  s += ",host_alloc:";
  s += host_alloc_managed ? "managed" : "default";
  s += ",host_alloc_min:" + std::to_string(host_alloc_min);
  s += ",host_copy_kernel:";
  s += host_copy_kernel ? "True" : "False";
  char share[32];
  std::snprintf(share, sizeof(share), "%g", host_copy_cpu_share);
  s += ",host_copy_cpu_share:";
  s += share;
  s += ",pageable_copy_cpu:";
  s += pageable_copy_cpu ? "True" : "False";
  s += ",pin_in_place:";
  s += pin_in_place ? "True" : "False";
  return s;
}

Config parseConfig(
    std::string_view text,
    const Config& base,
    std::string_view source) {
  Config cfg = base;
  while (!text.empty()) {
    size_t comma = text.find(',');
    std::string_view item = trim(text.substr(0, comma));
    text = comma == std::string_view::npos ? std::string_view()
                                           : text.substr(comma + 1);
    if (item.empty()) {
      continue;
    }
    size_t colon = item.find(':');
    TORCH_CHECK(
        colon != std::string_view::npos,
        source,
        ": expected key:value, got '",
        item,
        "'. Keys: ",
        kKeys,
        ".");
    std::string_view key = trim(item.substr(0, colon));
    std::string_view value = trim(item.substr(colon + 1));
    if (key == "enabled") {
      cfg.enabled = parseBool(key, value, source);
    } else if (key == "prefetch") {
      cfg.prefetch = parseBool(key, value, source);
    } else if (key == "hooks") {
      cfg.hooks = parseBool(key, value, source);
    } else if (key == "predict") {
      cfg.predict = parseBool(key, value, source);
    } else if (key == "op_signal") {
      cfg.op_signal = parseBool(key, value, source);
    } else if (key == "op_lookahead") {
      cfg.op_lookahead = requireBytes(key, value, source);
    } else if (key == "op_stage") {
      cfg.op_stage = parseBool(key, value, source);
    } else if (key == "evict_warm_first") {
      cfg.evict_warm_first = parseBool(key, value, source);
    } else if (key == "predict_ddp_buckets") {
      cfg.predict_ddp_buckets = parseBool(key, value, source);
    } else if (key == "predict_programs") {
      cfg.predict_programs = parseBool(key, value, source);
    } else if (key == "predict_lookahead") {
      cfg.predict_lookahead = requireBytes(key, value, source);
      TORCH_CHECK(
          cfg.predict_lookahead >= (1ull << 20),
          source,
          ": 'predict_lookahead' is the most bytes of saved activations "
          "brought back ahead of the backward; it must be at least 1MiB, got '",
          value,
          "'.");
    } else if (key == "predict_copy_sms") {
      if (value == "auto") {
        cfg.predict_copy_sms = -1;
      } else {
        std::optional<double> n = parseNumber(value);
        TORCH_CHECK(
            n && *n == std::floor(*n) && *n <= 4096,
            source,
            ": 'predict_copy_sms' takes auto, 0 (the weight streamer's copies "
            "may use every SM) or the most SMs they may use, such as 16, got '",
            value,
            "'.");
        cfg.predict_copy_sms = static_cast<int32_t>(*n);
      }
    } else if (key == "discard") {
      cfg.discard = parseBool(key, value, source);
    } else if (key == "host_copy_kernel") {
      cfg.host_copy_kernel = parseBool(key, value, source);
    } else if (key == "host_copy_cpu_share") {
      std::optional<double> share = parseNumber(value);
      TORCH_CHECK(
          share && *share <= 0.9,
          source,
          ": 'host_copy_cpu_share' is the most of a kernel copy's bytes that "
          "CPU threads copy where both sides lie in host RAM: a number from 0 "
          "(none) to 0.9, such as 0.35, got '",
          value,
          "'.");
      cfg.host_copy_cpu_share = *share;
    } else if (key == "pageable_copy_cpu") {
      cfg.pageable_copy_cpu = parseBool(key, value, source);
    } else if (key == "pin_in_place") {
      cfg.pin_in_place = parseBool(key, value, source);
    } else if (key == "read_copies") {
      cfg.read_copies = parseBool(key, value, source);
    } else if (key == "policy") {
      cfg.lru = parseChoice(
          key,
          value,
          source,
          "lru",
          "static",
          "lru (residency managed over time under the device budget) or "
          "static (a segment stays where it was placed when allocated)");
    } else if (key == "predict_copy_kernel") {
      cfg.predict_copy_lean = parseChoice(
          key,
          value,
          source,
          "lean",
          "foreach",
          "foreach (torch._foreach_copy_ on a green context of "
          "predict_copy_sms SMs) or lean (the engine's own copy kernel on "
          "predict_copy_sms SMs, 2 for auto)");
    } else if (key == "predict_stage_kernel") {
      cfg.predict_stage_lean = parseChoice(
          key,
          value,
          source,
          "lean",
          "foreach",
          "foreach (one torch._foreach_copy_ launch a chunk) or lean (the "
          "engine's own copy kernel, 32 SMs a copy or predict_copy_sms)");
    } else if (key == "host_alloc") {
      cfg.host_alloc_managed = parseChoice(
          key,
          value,
          source,
          "managed",
          "default",
          "default (CPU tensors use c10's CPU allocator outside "
          "torch.cuda.um.managed_host()) or managed (CPU tensors of at least "
          "host_alloc_min bytes are managed memory in host RAM once CUDA is "
          "in use)");
    } else if (key == "host_alloc_min") {
      cfg.host_alloc_min = requireBytes(key, value, source);
    } else if (key == "max_managed") {
      if (value == "none" || value == "None") {
        cfg.max_managed.reset();
      } else {
        cfg.max_managed = requireBytes(key, value, source);
      }
    } else if (key == "host_headroom") {
      cfg.host_headroom = requireBytes(key, value, source);
    } else if (key == "device_budget") {
      if (!value.empty() && value.back() == '%') {
        auto pct = parseNumber(trim(value.substr(0, value.size() - 1)));
        TORCH_CHECK(
            pct.has_value() && *pct > 0.0 && *pct <= 100.0,
            source,
            ": 'device_budget' as a percentage must lie in (0, 100], got '",
            value,
            "'.");
        cfg.device_budget = SizeSpec{0, *pct};
      } else {
        cfg.device_budget = SizeSpec{requireBytes(key, value, source), 0.0};
      }
    } else {
      TORCH_CHECK(
          false,
          source,
          ": unknown key '",
          key,
          "'. Keys: ",
          kKeys,
          ". (Allocator keys such as expandable_segments belong in "
          "PYTORCH_CUDA_ALLOC_CONF.)");
    }
  }
  return cfg;
}

} // namespace c10::cuda::um
