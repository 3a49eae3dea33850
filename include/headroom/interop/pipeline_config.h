// TF Object Detection API pipeline.config files read as Headroom run configs: the protobuf text
// (parsed by data/pipeline_data.h, which also reads its input readers as a data set) mapped
// field by field onto the Headroom key that means the same, with the pipeline's file:line kept
// for every error.
#pragma once

#include <string>
#include <vector>

#include "headroom/core/config.h"
#include "headroom/data/pipeline_data.h"

namespace headroom::interop {

// One Headroom key set from the pipeline. `value` is YAML; `where` the field's file:line.
struct PipelineSetting {
  std::string key, value, where, from;  // from: the pipeline field(s), for comments
};

struct PipelineConfig {
  std::vector<PipelineSetting> settings;
  data::PipelineData data;
  // Fields read that change nothing in Headroom, each "file:line: field: why".
  std::vector<std::string> notes;
};

// Parses and maps. InputError listing every field Headroom does not support (each with its
// file:line and what to use instead; a misspelt one with the field meant) and every value out
// of Headroom's range; nothing is silently dropped.
PipelineConfig read_pipeline_config(const std::string& path);

// The Headroom run config it means, as YAML with a comment per key (trainer config convert).
std::string pipeline_to_yaml(const PipelineConfig& p, const std::string& path);

// A run config file, Headroom's YAML or a pipeline.config (its notes logged once each), with
// the command line's key=value overrides: what every command that takes --config reads.
Config load_config_file(const std::string& path, const std::vector<std::string>& overrides = {});

}  // namespace headroom::interop
