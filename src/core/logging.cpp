#include "headroom/core/logging.h"

#include <spdlog/sinks/basic_file_sink.h>
#include <spdlog/sinks/stdout_color_sinks.h>

namespace headroom {

void init_logging(const std::string& level) {
  auto console = std::make_shared<spdlog::sinks::stderr_color_sink_mt>();
  console->set_pattern("%^%L%$ %H:%M:%S %v");
  auto logger = std::make_shared<spdlog::logger>("headroom", console);
  logger->set_level(spdlog::level::from_str(level));
  logger->flush_on(spdlog::level::warn);
  spdlog::set_default_logger(logger);
}

void add_log_file(const std::string& path) {
  auto file = std::make_shared<spdlog::sinks::basic_file_sink_mt>(path, /*truncate=*/false);
  file->set_pattern("%Y-%m-%d %H:%M:%S.%e %l %v");
  spdlog::default_logger()->sinks().push_back(file);
}

}  // namespace headroom
