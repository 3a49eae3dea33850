// Reading YAML files with errors that name file:line:column.
#pragma once

#include <yaml-cpp/yaml.h>

#include <string>

namespace headroom {

// Parses `path`; InputError "path: cannot open the <what>" or "path:line:col: YAML syntax error".
YAML::Node load_yaml_file(const std::string& path, const std::string& what);

// "file:line:column" of a node or key (1-based).
std::string yaml_location(const std::string& file, const YAML::Mark& mark);

}  // namespace headroom
