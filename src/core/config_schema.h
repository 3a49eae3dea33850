// Internal: the registry of config keys. Each key parses its YAML node into the typed struct
// and reads it back; adding a key is one entry in config_schema.cpp.
#pragma once

#include <yaml-cpp/yaml.h>

#include <functional>
#include <string>
#include <vector>

#include "headroom/core/config.h"

namespace headroom {

struct ConfigKey {
  ConfigKeyInfo info;
  // Stores the node's value; returns "" when accepted, else the problem and the allowed range.
  std::function<std::string(Config&, const YAML::Node&)> set;
  std::function<Json(const Config&)> get;
};

const std::vector<ConfigKey>& config_schema();

}  // namespace headroom
