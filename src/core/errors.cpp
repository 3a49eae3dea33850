#include "headroom/core/errors.h"

namespace headroom {

std::string format_location(const std::string& file, int line, int column) {
  std::string out = file;
  if (line > 0) {
    out += ":" + std::to_string(line);
    if (column > 0) out += ":" + std::to_string(column);
  }
  return out;
}

}  // namespace headroom
