// The TF Object Detection API's pipeline.config as far as it describes a data set: its train and
// eval input readers (TFRecord files, globs or sharded names) and their label map. The text is
// parsed here, by protobuf's TextFormat against proto/pipeline.proto, every field located in the
// file; interop/pipeline_config.h maps the rest of the file (model, training, evaluation) onto
// Headroom's keys from the same parse.
#pragma once

#include <google/protobuf/text_format.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "headroom/proto/pipeline.pb.h"

namespace headroom::data {

// True when `path` holds protobuf text whose first field is one of a pipeline's (model,
// train_config, train_input_reader, eval_config, eval_input_reader), whatever its name.
bool is_pipeline_config(const std::string& path);

// A pipeline.config parsed, with the tree that locates its fields.
struct PipelineText {
  std::string path;
  tf::TrainEvalPipelineConfig config;
  google::protobuf::TextFormat::ParseInfoTree tree;
  // Fields the parser skipped (not in proto/pipeline.proto): file:line and the parser's message.
  std::vector<std::pair<std::string, std::string>> unknown;
};
// InputError naming the file and line where the text is not protobuf text of a pipeline.
std::unique_ptr<PipelineText> parse_pipeline(const std::string& path);

// A message of the pipeline with its place in the file.
struct PipelineField {
  const std::string* file;
  const google::protobuf::TextFormat::ParseInfoTree* tree;  // null where the message was not written
  const google::protobuf::Message* msg;
  std::string path;                                         // "train_config.optimizer"

  static PipelineField root(const PipelineText& p) { return {&p.path, &p.tree, &p.config, ""}; }
  const google::protobuf::FieldDescriptor* field(const std::string& name) const;
  // file:line of the field (of its index-th value when repeated); the file when it is not written.
  std::string line(const std::string& name, int index = -1) const;
  PipelineField nested(const std::string& name, int index = -1) const;
  std::string name(const std::string& field_name) const { return path.empty() ? field_name : path + "." + field_name; }
};

// A path the pipeline names. TF opens it as written, against the working directory
// (model_main_tf2.py run from the project folder reads annotations/train.record there); where
// nothing is there, it is resolved against the pipeline's folder (a pipeline beside its data).
// file:// is local, as gfile reads it.
std::string resolve_pipeline_path(const std::string& pipeline, const std::string& p);
// A path on another file system (gs://, s3://, hdfs://): TF's gfile reads it, Headroom does not.
bool remote_path(const std::string& p);

struct PipelineData {
  std::vector<std::string> train, val;  // TFRecord files, globs, sharded names (expanded when a split is scanned)
  std::string train_where, val_where;
  std::string label_map, label_map_where;
  int num_classes = 0;                  // model.center_net.num_classes, when given
  std::string num_classes_where;
};
// The input readers; what cannot be used (no TFRecord reader, two label maps, none) is added to
// `problems` as "file:line: what".
PipelineData pipeline_data(const PipelineText& p, std::vector<std::string>& problems);

}  // namespace headroom::data
