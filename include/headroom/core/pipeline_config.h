// TF Object Detection API pipeline.config files read as Headroom run configs: protobuf text
// parsed by the library's TextFormat against proto/pipeline.proto, each field mapped onto the
// Headroom key that means the same, with the pipeline's file:line kept for every error.
#pragma once

#include <string>
#include <vector>

namespace headroom {

// True when `path` holds protobuf text whose first field is one of a pipeline's (model,
// train_config, train_input_reader, eval_config, eval_input_reader), whatever its name.
bool is_pipeline_config(const std::string& path);

// One Headroom key set from the pipeline. `value` is YAML; `where` the field's file:line.
struct PipelineSetting {
  std::string key, value, where, from;  // from: the pipeline field(s), for comments
};

// The input readers. Paths are resolved against the config's folder (the TF scripts are
// usually run from there); globs and sharded names are kept for the data layer to expand.
struct PipelineData {
  std::vector<std::string> train, val;
  std::string train_where, val_where;
  std::string label_map, label_map_where;
  int num_classes = 0;
  std::string num_classes_where;
};

struct PipelineConfig {
  std::vector<PipelineSetting> settings;
  PipelineData data;
  // Fields read that change nothing in Headroom, each "file:line: field: why".
  std::vector<std::string> notes;
};

// Parses and maps. InputError listing every field Headroom does not support (each with its
// file:line and what to use instead; a misspelt one with the field meant) and every value out
// of Headroom's range; nothing is silently dropped.
PipelineConfig read_pipeline_config(const std::string& path);

// The Headroom run config it means, as YAML with a comment per key (trainer config convert).
std::string pipeline_to_yaml(const PipelineConfig& p, const std::string& path);

}  // namespace headroom
