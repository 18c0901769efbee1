#include "common/log.h"

#include <chrono>
#include <ctime>
#include <memory>

#include <spdlog/formatter.h>
#include <spdlog/sinks/stdout_sinks.h>
#include <nlohmann/json.hpp>

namespace warren {
namespace {

// Fields of the Log() call being formatted on this thread (spdlog's default
// logger is synchronous: the formatter runs inside the log call).
thread_local const std::initializer_list<LogField>* t_fields = nullptr;

std::string Timestamp(std::chrono::system_clock::time_point tp) {
  auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(tp.time_since_epoch()).count();
  std::time_t secs = static_cast<std::time_t>(ns / 1000000000);
  std::tm tm{};
  gmtime_r(&secs, &tm);
  char buf[64];
  size_t n = std::strftime(buf, sizeof(buf), "%Y-%m-%dT%H:%M:%S", &tm);
  std::snprintf(buf + n, sizeof(buf) - n, ".%06lldZ", static_cast<long long>((ns % 1000000000) / 1000));
  return buf;
}

class Formatter final : public spdlog::formatter {
 public:
  explicit Formatter(LogFormat format) : format_(format) {}

  void format(const spdlog::details::log_msg& msg, spdlog::memory_buf_t& dest) override {
    std::string text(msg.payload.data(), msg.payload.size());
    std::string level(spdlog::level::to_string_view(msg.level).data(), spdlog::level::to_string_view(msg.level).size());
    std::string line;
    if (format_ == LogFormat::kJson) {
      nlohmann::ordered_json j;
      j["ts"] = Timestamp(msg.time);
      j["level"] = level;
      j["msg"] = text;
      if (t_fields != nullptr) {
        for (const auto& [k, v] : *t_fields) j[k] = v;
      }
      line = j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
    } else {
      line = Timestamp(msg.time) + " " + level + " " + text;
      if (t_fields != nullptr) {
        for (const auto& [k, v] : *t_fields) line += " " + k + "=" + v;
      }
    }
    line += '\n';
    dest.append(line.data(), line.data() + line.size());
  }

  std::unique_ptr<spdlog::formatter> clone() const override { return std::make_unique<Formatter>(format_); }

 private:
  LogFormat format_;
};

}  // namespace

Status SetupLogging(LogFormat format, const std::string& level) {
  auto lvl = spdlog::level::from_str(level);
  if (lvl == spdlog::level::off && level != "off") {
    return absl::InvalidArgumentError("--log-level: unknown level '" + level +
                                      "' (trace, debug, info, warn, error, critical, off)");
  }
  auto logger = std::make_shared<spdlog::logger>("warrend", std::make_shared<spdlog::sinks::stderr_sink_mt>());
  logger->set_formatter(std::make_unique<Formatter>(format));
  logger->set_level(lvl);
  logger->flush_on(spdlog::level::trace);
  spdlog::set_default_logger(logger);
  return absl::OkStatus();
}

void Log(spdlog::level::level_enum level, const std::string& msg, std::initializer_list<LogField> fields) {
  t_fields = &fields;
  spdlog::log(level, "{}", msg);
  t_fields = nullptr;
}

}  // namespace warren
