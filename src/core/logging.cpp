#include "headroom/core/logging.h"

#include <spdlog/sinks/basic_file_sink.h>
#include <spdlog/sinks/ringbuffer_sink.h>
#include <spdlog/sinks/stdout_color_sinks.h>

#include <algorithm>

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

// The lines said before a run's log file opens (the run directory is made after the parts that
// can refuse the run): the file starts with them.
std::shared_ptr<spdlog::sinks::ringbuffer_sink_mt> g_backlog;
constexpr size_t kBacklogLines = 2000;

}  // namespace

void init_logging(const std::string& level) {
  auto console = std::make_shared<spdlog::sinks::stderr_color_sink_mt>();
  console->set_pattern("%^%L%$ %H:%M:%S %v");
  g_backlog = std::make_shared<spdlog::sinks::ringbuffer_sink_mt>(kBacklogLines);
  auto logger = std::make_shared<spdlog::logger>("headroom", spdlog::sinks_init_list{console, g_backlog});
  logger->set_level(spdlog::level::from_str(level));
  logger->flush_on(spdlog::level::warn);
  spdlog::set_default_logger(logger);
  static LogWarnings warnings;  // lives as long as the process: c10 keeps a raw pointer
  compat::set_warning_handler(&warnings);  // for this thread: c10's handler is thread-local
}

void add_log_file(const std::string& path) {
  auto file = std::make_shared<spdlog::sinks::basic_file_sink_mt>(path, /*truncate=*/false);
  file->set_pattern("%Y-%m-%d %H:%M:%S.%e %l %v");
  auto& sinks = spdlog::default_logger()->sinks();
  if (g_backlog) {  // once: the first log file takes the lines said so far
    for (const auto& m : g_backlog->last_raw()) file->log(m);
    file->flush();
    sinks.erase(std::remove(sinks.begin(), sinks.end(), g_backlog), sinks.end());
    g_backlog.reset();
  }
  sinks.push_back(file);
}

}  // namespace headroom
