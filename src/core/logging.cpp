#include "headroom/core/logging.h"

#include <spdlog/sinks/basic_file_sink.h>
#include <spdlog/sinks/stdout_color_sinks.h>

#include <mutex>
#include <set>

#include "headroom/core/torch_compat.h"

namespace headroom {

namespace {

// Warnings a user can do nothing about: LibTorch 1.13 calls scatter_reduce a beta API, which
// the assigner uses knowingly (its results are held by the loss tests on both versions).
constexpr const char* kExpected[] = {"scatter_reduce() is in beta"};

class LogWarnings : public compat::WarningHandler {
 public:
  void take(const std::string& message, const char* file, uint32_t line) override {
    for (const char* expected : kExpected)
      if (message.find(expected) != std::string::npos) return;
    {
      std::lock_guard<std::mutex> lock(mutex_);  // one handler for every thread that calls init_logging
      if (!seen_.insert(message).second) return;
    }
    spdlog::warn("LibTorch: {} ({}:{})", message, file ? file : "?", line);
  }

 private:
  std::mutex mutex_;
  std::set<std::string> seen_;
};

}  // namespace

void init_logging(const std::string& level) {
  auto console = std::make_shared<spdlog::sinks::stderr_color_sink_mt>();
  console->set_pattern("%^%L%$ %H:%M:%S %v");
  auto logger = std::make_shared<spdlog::logger>("headroom", console);
  logger->set_level(spdlog::level::from_str(level));
  logger->flush_on(spdlog::level::warn);
  spdlog::set_default_logger(logger);
  static LogWarnings warnings;  // lives as long as the process: c10 keeps a raw pointer
  compat::set_warning_handler(&warnings);  // for this thread: c10's handler is thread-local
}

void add_log_file(const std::string& path) {
  auto file = std::make_shared<spdlog::sinks::basic_file_sink_mt>(path, /*truncate=*/false);
  file->set_pattern("%Y-%m-%d %H:%M:%S.%e %l %v");
  spdlog::default_logger()->sinks().push_back(file);
}

}  // namespace headroom
