#include "headroom/core/yaml_file.h"

#include <filesystem>

#include "headroom/core/errors.h"

namespace headroom {

std::string yaml_location(const std::string& file, const YAML::Mark& mark) {
  return format_location(file, mark.line + 1, mark.column + 1);
}

YAML::Node load_yaml_file(const std::string& path, const std::string& what) {
  if (std::filesystem::is_directory(path)) throw InputError(path + ": a folder, not the " + what + " (give the YAML file in it)");
  try {
    return YAML::LoadFile(path);
  } catch (const YAML::BadFile&) {
    throw InputError(path + ": cannot open the " + what + " (does it exist, is it readable?)");
  } catch (const YAML::ParserException& e) {
    throw InputError(yaml_location(path, e.mark) + ": YAML syntax error: " + e.msg);
  }
}

}  // namespace headroom
