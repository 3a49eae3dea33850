#include "headroom/data/pipeline_data.h"

#include <glob.h>
#include <google/protobuf/io/tokenizer.h>

#include <cctype>
#include <filesystem>
#include <set>

#include "headroom/core/errors.h"
#include "headroom/core/files.h"
#include "headroom/core/text.h"

namespace headroom::data {

namespace fs = std::filesystem;
namespace pb = google::protobuf;

bool is_pipeline_config(const std::string& path) {
  std::string text;
  try {
    text = without_bom(read_file(path));
  } catch (const InputError&) {
    return false;
  }
  size_t i = 0;
  auto skip = [&] {  // whitespace and # comments
    while (i < text.size()) {
      if (std::isspace(static_cast<unsigned char>(text[i]))) {
        ++i;
      } else if (text[i] == '#') {
        while (i < text.size() && text[i] != '\n') ++i;
      } else {
        break;
      }
    }
  };
  auto word = [&] {
    skip();
    const size_t from = i;
    while (i < text.size() && (std::isalnum(static_cast<unsigned char>(text[i])) || text[i] == '_')) ++i;
    return text.substr(from, i - from);
  };
  auto next_is = [&](char c) {
    skip();
    return i < text.size() && text[i] == c;
  };
  // A message field opens with `name {` or `name: {`.
  auto opens_message = [&] {
    if (next_is('{')) return ++i, true;
    if (!next_is(':')) return false;
    ++i;
    return next_is('{') ? (++i, true) : false;
  };
  static const std::set<std::string> kTop = {"model", "train_config", "train_input_reader", "eval_config",
                                             "eval_input_reader"};
  const std::string first = word();
  if (!kTop.count(first) || !opens_message()) return false;
  // `model: {file: x.yaml}` is a Headroom YAML; a pipeline's model holds a message (center_net {).
  if (first != "model") return true;
  return !word().empty() && opens_message();
}

namespace {

// The text parser's errors (which stop it) and warnings (unknown fields, which it skips).
class Collector : public pb::io::ErrorCollector {
 public:
  explicit Collector(std::string file) : file_(std::move(file)) {}
  void AddError(int line, int column, const std::string& message) override {
    errors.push_back({format_location(file_, line + 1, column + 1), message});
  }
  void AddWarning(int line, int column, const std::string& message) override {
    warnings.push_back({format_location(file_, line + 1, column + 1), message});
  }
  std::vector<std::pair<std::string, std::string>> errors, warnings;

 private:
  std::string file_;
};

}  // namespace

std::unique_ptr<PipelineText> parse_pipeline(const std::string& path) {
  auto p = std::make_unique<PipelineText>();
  p->path = path;
  const std::string text = without_bom(read_file(path));
  pb::TextFormat::Parser parser;
  Collector collected(path);
  parser.RecordErrorsTo(&collected);
  parser.AllowUnknownField(true);  // reported by the readers, each with its line and what to do
  parser.WriteLocationsTo(&p->tree);
  // Merged as TF's config_util reads it (text_format.Merge): a field written twice takes the last value.
  if (!parser.MergeFromString(text, &p->config)) {
    const auto& e = collected.errors.empty() ? std::pair<std::string, std::string>{path, "not protobuf text"} : collected.errors.front();
    throw InputError(e.first + ": " + e.second + " (a pipeline.config is protobuf text: `model { center_net { ... } }`)");
  }
  p->unknown = std::move(collected.warnings);
  return p;
}

const pb::FieldDescriptor* PipelineField::field(const std::string& name) const { return msg->GetDescriptor()->FindFieldByName(name); }

std::string PipelineField::line(const std::string& name, int index) const {
  const pb::FieldDescriptor* f = field(name);
  if (tree && f) {
    const auto loc = tree->GetLocation(f, f->is_repeated() ? std::max(index, 0) : -1);
    if (loc.line >= 0) return format_location(*file, loc.line + 1);
  }
  return *file;
}

PipelineField PipelineField::nested(const std::string& name, int index) const {
  const pb::FieldDescriptor* f = field(name);
  const pb::Reflection* r = msg->GetReflection();
  const pb::Message& child = f->is_repeated() ? r->GetRepeatedMessage(*msg, f, index) : r->GetMessage(*msg, f);
  return {file, tree ? tree->GetTreeForNested(f, f->is_repeated() ? index : -1) : nullptr, &child, path.empty() ? name : path + "." + name};
}

namespace {

// A file, a glob's match or a TF checkpoint prefix (its .index) is there.
bool names_something(const std::string& p) {
  std::error_code ec;
  if (fs::exists(p, ec) || fs::exists(p + ".index", ec)) return true;  // a name with [ ] is a name first
  for (const std::string& q : {p, p + ".index"}) {
    glob_t g{};
    const bool found = ::glob(q.c_str(), 0, nullptr, &g) == 0 && g.gl_pathc > 0;
    ::globfree(&g);
    if (found) return true;
  }
  return false;
}

}  // namespace

bool remote_path(const std::string& p) { return p.find("://") != std::string::npos && p.rfind("file://", 0) != 0; }

std::string resolve_pipeline_path(const std::string& pipeline, const std::string& p) {
  const fs::path path(p.rfind("file://", 0) == 0 ? p.substr(7) : p);  // gfile's local scheme
  if (path.is_absolute()) return path.lexically_normal().string();
  const std::string here = fs::absolute(path).lexically_normal().string();
  if (names_something(here)) return here;
  return (fs::absolute(pipeline).parent_path() / path).lexically_normal().string();
}

namespace {

// One input reader's files, and its label map into the one the readers share.
std::vector<std::string> reader_files(const PipelineField& reader, PipelineData& d, std::vector<std::string>& problems) {
  const auto& r = static_cast<const tf::InputReader&>(*reader.msg);
  if (!r.has_tf_record_input_reader() || r.tf_record_input_reader().input_path_size() == 0) {
    problems.push_back(reader.line("tf_record_input_reader") + ": " + reader.path + " needs tf_record_input_reader { input_path: ... }");
    return {};
  }
  // TF's gfile reads gs:// and other file systems; Headroom reads local files only.
  const auto remote = [&](const std::string& p, const std::string& where) {
    if (!remote_path(p)) return false;
    problems.push_back(where + ": " + p + " is on a remote file system; Headroom reads local files: copy it here (gsutil cp) and name the copy");
    return true;
  };
  std::vector<std::string> paths;
  const PipelineField records = reader.nested("tf_record_input_reader");
  for (int i = 0; i < r.tf_record_input_reader().input_path_size(); ++i) {
    const std::string& p = r.tf_record_input_reader().input_path(i);
    if (!remote(p, records.line("input_path", i))) paths.push_back(resolve_pipeline_path(*reader.file, p));
  }
  if (!r.label_map_path().empty() && !remote(r.label_map_path(), reader.line("label_map_path"))) {
    const std::string lm = resolve_pipeline_path(*reader.file, r.label_map_path());
    if (!d.label_map.empty() && lm != d.label_map)
      problems.push_back(reader.line("label_map_path") + ": the readers name different label maps (" + d.label_map + ", " + lm +
                         "); Headroom needs one");
    if (d.label_map.empty()) d.label_map = lm, d.label_map_where = reader.line("label_map_path");
  }
  return paths;
}

}  // namespace

PipelineData pipeline_data(const PipelineText& p, std::vector<std::string>& problems) {
  const PipelineField root = PipelineField::root(p);
  PipelineData d;
  if (p.config.model().has_center_net()) {
    d.num_classes = p.config.model().center_net().num_classes();
    d.num_classes_where = root.nested("model").nested("center_net").line("num_classes");
    if (p.config.model().center_net().has_num_classes() && d.num_classes <= 0)
      problems.push_back(d.num_classes_where + ": num_classes " + std::to_string(d.num_classes) +
                         ": give the label map's largest id (or leave it out: Headroom counts the classes)");
  }
  d.train = reader_files(root.nested("train_input_reader"), d, problems);
  d.train_where = root.line("train_input_reader");
  if (p.config.eval_input_reader_size() > 0) {
    d.val = reader_files(root.nested("eval_input_reader", 0), d, problems);
    d.val_where = root.line("eval_input_reader", 0);
  }
  const bool named = !p.config.train_input_reader().label_map_path().empty() ||
                     (p.config.eval_input_reader_size() > 0 && !p.config.eval_input_reader(0).label_map_path().empty());
  if (!named)  // one named remote is reported as such
    problems.push_back(root.line("train_input_reader") + ": no label_map_path in the input readers: Headroom takes the classes from the "
                       "label map");
  return d;
}

}  // namespace headroom::data
