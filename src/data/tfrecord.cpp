#include "headroom/data/tfrecord.h"

#include <glob.h>
#include <sys/stat.h>

#include <google/protobuf/io/tokenizer.h>
#include <google/protobuf/text_format.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <tuple>
#include <regex>
#include <set>
#include <sstream>

#include "headroom/core/errors.h"
#include "headroom/core/files.h"
#include "headroom/core/logging.h"
#include "headroom/core/text.h"
#include "headroom/core/threads.h"
#include "headroom/data/image.h"
#include "headroom/data/labels.h"
#include "headroom/proto/example.pb.h"
#include "headroom/proto/label_map.pb.h"

namespace headroom::data {

namespace fs = std::filesystem;

// ---------------------------------------------------------------------------------------
// Label maps

namespace {

// Collects the text format parser's complaints with their positions (0-based from protobuf).
class ParseErrors : public google::protobuf::io::ErrorCollector {
 public:
  explicit ParseErrors(std::string file) : file_(std::move(file)) {}
  void AddError(int line, int column, const std::string& message) override {
    // Our copy of TF's messages sits in package headroom.tf: name them as TF's own errors do.
    if (first_.empty())
      first_ = format_location(file_, line + 1, column + 1) + ": " + replace_all(message, "\"headroom.tf.", "\"object_detection.protos.");
  }
  const std::string& first() const { return first_; }

 private:
  std::string file_, first_;
};

}  // namespace

std::vector<LabelMapItem> read_label_map(const std::string& path) {
  const std::string text = without_bom(read_file(path));
  tf::StringIntLabelMap map;
  google::protobuf::TextFormat::Parser parser;
  ParseErrors errors(path);
  parser.RecordErrorsTo(&errors);
  google::protobuf::TextFormat::ParseInfoTree where;
  parser.WriteLocationsTo(&where);
  if (!parser.ParseFromString(text, &map)) {
    // An unknown field: name the one that was probably meant.
    std::string hint;
    static const std::regex kUnknown(R"(has no field named \"([^\"]+)\")");
    std::smatch m;
    const std::string& first = errors.first();
    if (std::regex_search(first, m, kUnknown)) {
      std::vector<std::string> fields;
      for (const auto* d : {tf::StringIntLabelMap::descriptor(), tf::StringIntLabelMapItem::descriptor()})
        for (int i = 0; i < d->field_count(); ++i) fields.push_back(d->field(i)->name());
      const std::string near = nearest_match(m[1].str(), fields);
      if (!near.empty()) hint = "; did you mean '" + near + "'?";
    }
    throw InputError(first + hint + " (a label map is `item { id: 1 name: \"cat\" }` per class)");
  }
  std::vector<LabelMapItem> items;
  std::set<int> seen;
  std::map<std::string, std::pair<int, std::string>> named;  // name or display_name -> id, where
  for (int i = 0; i < map.item_size(); ++i) {
    const tf::StringIntLabelMapItem& it = map.item(i);
    const auto loc = where.GetLocation(map.GetDescriptor()->FindFieldByName("item"), i);
    const std::string at = format_location(path, loc.line + 1);
    const bool background = it.name() == "background" || it.display_name() == "background";
    if (!it.has_id() || it.id() < 0 || (it.id() == 0 && !background))
      throw InputError(at + ": " + (it.has_id() ? "id " + std::to_string(it.id()) : std::string("no id")) +
                       ": label map ids start at 1 (0 is the background)");
    if (it.id() == 0) continue;
    if (!seen.insert(it.id()).second) throw InputError(at + ": id " + std::to_string(it.id()) + " appears twice");
    if (it.name().empty() && it.display_name().empty()) throw InputError(at + ": the item has neither name nor display_name");
    check_class_name_utf8(it.name(), at);
    check_class_name_utf8(it.display_name(), at);
    // Records name their objects' class by this text: one text for two ids would file one class's
    // objects under the other.
    for (const std::string& text : {it.name(), it.display_name()}) {
      if (text.empty()) continue;
      const auto [other, fresh] = named.emplace(text, std::make_pair(it.id(), at));
      if (!fresh && other->second.first != it.id())
        throw InputError(at + ": '" + text + "' also names id " + std::to_string(other->second.first) + " (" + other->second.second +
                         "); records name their objects' class by this text, so give each class its own name");
    }
    items.push_back({it.id(), it.name(), it.display_name(), at});
  }
  if (items.empty()) throw InputError(path + ": the label map lists no class");
  std::sort(items.begin(), items.end(), [](const LabelMapItem& a, const LabelMapItem& b) { return a.id < b.id; });
  return items;
}

std::string label_map_text(const std::vector<std::string>& names) {
  tf::StringIntLabelMap map;
  for (size_t i = 0; i < names.size(); ++i) {
    tf::StringIntLabelMapItem* it = map.add_item();
    it->set_id(int(i) + 1);
    it->set_name(names[i]);
  }
  std::string out;
  google::protobuf::TextFormat::PrintToString(map, &out);
  return out;
}

RecordClasses record_classes(const DataSpec& spec) {
  RecordClasses c;
  if (!spec.label_map.empty()) {
    c.by_text = true;
    for (const LabelMapItem& it : read_label_map(spec.label_map)) {
      c.names.push_back(it.display_name.empty() ? it.name : it.display_name);
      c.ids.push_back(it.id);
      c.texts.push_back(it.name);
      c.texts.push_back(it.display_name);
    }
    if (!spec.names.empty() && spec.names != c.names)
      throw InputError(spec.file + ": names and the label map " + spec.label_map +
                       " disagree; keep one of them (the label map's order is by id)");
    return c;
  }
  if (spec.names.empty())
    throw InputError(spec.file + ": TFRecord data needs its classes: label_map: label_map.pbtxt (or names: [a, b], "
                     "taken as label ids 1, 2, ...)");
  c.names = spec.names;
  for (size_t i = 0; i < c.names.size(); ++i) c.ids.push_back(int(i) + 1);
  return c;
}

// ---------------------------------------------------------------------------------------
// Files

bool looks_like_records(const std::string& path) {
  static const std::regex kRecords(R"(.*\.(record|tfrecord|tfrecords)(-[0-9?]+-of-[0-9]+)?$)", std::regex::icase);
  return std::regex_match(path, kRecords);
}

std::vector<std::string> record_files(const std::string& pattern, const std::string& where) {
  std::vector<std::string> files;
  glob_t g{};
  if (::glob(pattern.c_str(), 0, nullptr, &g) == 0)
    for (size_t i = 0; i < g.gl_pathc; ++i) files.emplace_back(g.gl_pathv[i]);
  ::globfree(&g);
  std::sort(files.begin(), files.end());
  if (files.empty())
    throw InputError(where + ": " + pattern + " matches no TFRecord file");
  // Sharded files promise their count (name-00003-of-00010): a shard a pattern misses, because it
  // was never written or was deleted, is missing data, not a smaller data set.
  // Both namings: train.record-00003-of-00010 and the zoo's train2017-00003-of-00256.tfrecord.
  static const std::regex kSharded(R"((.*)-([0-9]+)-of-([0-9]+)(\.[^/-]*)?$)");
  std::map<std::tuple<std::string, size_t, std::string>, std::set<size_t>> shards;  // (name, count, extension) -> indices present
  const bool globbed = pattern.find_first_of("*?[") != std::string::npos;  // one file named alone is taken as it is
  for (const std::string& file : files) {
    std::smatch m;
    if (globbed && std::regex_match(file, m, kSharded))
      shards[{m[1].str(), std::stoul(m[3].str()), m[4].str()}].insert(std::stoul(m[2].str()));
  }
  for (const auto& [name, present] : shards) {
    const auto& [prefix, count, extension] = name;
    for (size_t k = 0; k < count; ++k)
      if (!present.count(k)) {
        char missing[48];
        std::snprintf(missing, sizeof missing, "-%05zu-of-%05zu", k, count);
        throw InputError(where + ": " + pattern + ": shard " + prefix + missing + extension + " is missing (" +
                         std::to_string(present.size()) + " of " + std::to_string(count) + " are there)");
      }
  }
  return files;
}

// ---------------------------------------------------------------------------------------
// The index of record offsets, cached beside each file

namespace {

std::string index_key(const std::string& file) {
  struct stat st {};
  if (::stat(file.c_str(), &st) != 0) return "";
  return "headroom tfrecord index 1 size " + std::to_string(st.st_size) + " mtime " +
         std::to_string(int64_t(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec);
}

}  // namespace

std::vector<RecordSpan> record_index(const std::string& file, std::string* error) {
  // A hidden name, so that globs over the data (train.record-*) never match it.
  const fs::path f(file);
  const std::string key = index_key(file), cached = (f.parent_path() / ("." + f.filename().string() + ".index")).string();
  std::ifstream in(cached);
  std::string line;
  if (!key.empty() && in && std::getline(in, line) && line == key) {
    std::vector<RecordSpan> spans;
    RecordSpan s;
    while (in >> s.offset >> s.length) spans.push_back(s);
    if (in.eof()) return spans;
  }
  const RecordReader reader(file);
  RecordReader::Index index = reader.index();
  if (error && index.error) *error = "record at byte " + std::to_string(index.error->offset()) + ": " + index.error->reason();
  if (!index.error && !key.empty()) {
    std::string text = key + "\n";
    for (const RecordSpan& s : index.spans) text += std::to_string(s.offset) + " " + std::to_string(s.length) + "\n";
    try {
      write_file_atomic(cached, text);
    } catch (const Error& e) {  // a read-only data folder: index again next time
      spdlog::debug("{}: not cached: {}", cached, e.what());
    }
  }
  return std::move(index.spans);
}

// ---------------------------------------------------------------------------------------
// Examples

namespace {

// EXIF orientation: the stored image turned upright. Normalised coordinates of the stored image
// map to those of the upright one as below; records hold the stored image's boxes (TensorFlow
// decodes without turning), Headroom's samples the upright one's.
void to_upright(float& x, float& y, int orientation) {
  const float sx = x, sy = y;
  switch (orientation) {
    case 2: x = 1 - sx; break;
    case 3: x = 1 - sx, y = 1 - sy; break;
    case 4: y = 1 - sy; break;
    case 5: x = sy, y = sx; break;
    case 6: x = 1 - sy, y = sx; break;
    case 7: x = 1 - sy, y = 1 - sx; break;
    case 8: x = sy, y = 1 - sx; break;
    default: break;
  }
}
int inverse_orientation(int o) { return o == 6 ? 8 : o == 8 ? 6 : o; }

Box oriented(Box b, int orientation) {
  float x1 = b.x1, y1 = b.y1, x2 = b.x2, y2 = b.y2;
  to_upright(x1, y1, orientation);
  to_upright(x2, y2, orientation);
  b.x1 = std::min(x1, x2), b.x2 = std::max(x1, x2), b.y1 = std::min(y1, y2), b.y2 = std::max(y1, y2);
  return b;
}

const tf::Feature* feature(const tf::Example& e, const char* key) {
  const auto& m = e.features().feature();
  const auto it = m.find(key);
  return it == m.end() ? nullptr : &it->second;
}
std::string bytes_of(const tf::Example& e, const char* key) {
  const tf::Feature* f = feature(e, key);
  return f && f->has_bytes_list() && f->bytes_list().value_size() > 0 ? f->bytes_list().value(0) : std::string();
}
std::vector<float> floats_of(const tf::Example& e, const char* key) {
  const tf::Feature* f = feature(e, key);
  if (!f || !f->has_float_list()) return {};
  return {f->float_list().value().begin(), f->float_list().value().end()};
}
std::vector<int64_t> ints_of(const tf::Example& e, const char* key) {
  const tf::Feature* f = feature(e, key);
  if (!f || !f->has_int64_list()) return {};
  return {f->int64_list().value().begin(), f->int64_list().value().end()};
}
std::vector<std::string> texts_of(const tf::Example& e, const char* key) {
  const tf::Feature* f = feature(e, key);
  if (!f || !f->has_bytes_list()) return {};
  return {f->bytes_list().value().begin(), f->bytes_list().value().end()};
}

struct Decoded {
  Sample sample;
  std::vector<Problem> problems;
  bool skipped = false;
};

void report(Decoded& d, const std::string& where, ProblemKind k, const std::string& msg, bool skips) {
  d.problems.push_back({k, where, msg, skips});
  d.skipped = d.skipped || skips;
}

// The record's bytes parsed as an Example; false (with the problem reported) when unreadable.
bool read_example(const RecordReader& reader, const RecordSpan& span, const std::string& where, tf::Example& ex,
                  Decoded& d) {
  std::string data;
  try {
    data = reader.read(span.offset);
  } catch (const RecordError& e) {
    report(d, where, ProblemKind::unreadable_image, e.reason(), true);
    return false;
  }
  if (!ex.ParseFromString(data)) {
    report(d, where, ProblemKind::unreadable_image, "not a tf.train.Example", true);
    return false;
  }
  return true;
}

// Checks the encoded image from its header and last bytes, without decoding it; false when it is unusable.
bool check_encoded_image(const tf::Example& ex, const std::string& where, const ScanOptions& o, ImageHeader& header,
                         Decoded& d) {
  const std::string encoded = bytes_of(ex, "image/encoded");
  if (encoded.empty()) {
    report(d, where, ProblemKind::unreadable_image, "no image/encoded bytes", true);
    return false;
  }
  const auto* bytes = reinterpret_cast<const uint8_t*>(encoded.data());
  const size_t tail = std::min<size_t>(encoded.size(), 64);
  for (Problem& p : check_image_bytes(bytes, encoded.size(), bytes + encoded.size() - tail, tail, where, o, &header)) {
    d.problems.push_back(std::move(p));
    d.skipped = true;
  }
  return !d.skipped;
}

// The OD API's parallel per-object lists; boxes are normalised by the stored image's size.
struct ObjectLists {
  std::vector<float> xmin, xmax, ymin, ymax, area;
  std::vector<int64_t> labels, crowd;
  std::vector<std::string> texts;
};

ObjectLists object_lists(const tf::Example& ex) {
  ObjectLists l;
  l.xmin = floats_of(ex, "image/object/bbox/xmin"), l.xmax = floats_of(ex, "image/object/bbox/xmax");
  l.ymin = floats_of(ex, "image/object/bbox/ymin"), l.ymax = floats_of(ex, "image/object/bbox/ymax");
  l.labels = ints_of(ex, "image/object/class/label");
  l.texts = texts_of(ex, "image/object/class/text");
  l.crowd = ints_of(ex, "image/object/is_crowd");
  l.area = floats_of(ex, "image/object/area");
  return l;
}

// False (record skipped) when the lists disagree in length or the classes do not cover every box.
bool object_lists_agree(const ObjectLists& l, const RecordClasses& classes, bool use_text, const std::string& where,
                        Decoded& d) {
  const size_t n = l.xmin.size();
  auto fits = [&](size_t m) { return m == 0 || m == n; };
  if (l.xmax.size() != n || l.ymin.size() != n || l.ymax.size() != n || !fits(l.crowd.size()) || !fits(l.area.size())) {
    report(d, where, ProblemKind::bad_label, "the image/object/* lists differ in length (xmin " + std::to_string(n) +
                                                 ", xmax " + std::to_string(l.xmax.size()) + ", ymin " +
                                                 std::to_string(l.ymin.size()) + ", ymax " + std::to_string(l.ymax.size()) + ")",
           true);
    return false;
  }
  if (n > 0 && !use_text && l.labels.size() != n) {
    report(d, where, ProblemKind::bad_label, std::to_string(n) + " boxes but " + std::to_string(l.labels.size()) +
                                                 " image/object/class/label values" +
                                                 (classes.by_text ? " and " + std::to_string(l.texts.size()) + " class/text values" : ""),
           true);
    return false;
  }
  return true;
}

// Object i's Headroom class, by its class text or its label id; -1 (problem reported) when neither
// maps: a class the label map leaves out drops the object, an id past data YAML names the image.
int object_class(const ObjectLists& l, size_t i, bool use_text, const RecordClasses& classes, const std::string& obj,
                 const std::string& where, Decoded& d) {
  if (use_text) {
    const auto it = std::find(classes.texts.begin(), classes.texts.end(), l.texts[i]);
    if (it == classes.texts.end() || l.texts[i].empty()) {
      // TF looks the text up as -1 and filter_unrecognized_classes drops the object, not the image
      // (a label map of a few of the records' classes trains on those).
      report(d, where, ProblemKind::unlisted_class, obj + "class '" + l.texts[i] + "' is not in the label map: dropped", false);
      return -1;
    }
    return int(it - classes.texts.begin()) / 2;
  }
  const auto it = std::find(classes.ids.begin(), classes.ids.end(), l.labels[i]);
  if (it == classes.ids.end() && classes.by_text) {  // as an unlisted text: the label map chose the classes
    report(d, where, ProblemKind::unlisted_class, obj + "class id " + std::to_string(l.labels[i]) + " is not in the label map: dropped",
           false);
    return -1;
  }
  if (it == classes.ids.end()) {  // names are ids 1..n: an id past them is a wrong label, as in a YOLO file
    report(d, where, ProblemKind::bad_label, obj + "class id " + std::to_string(l.labels[i]) + " is not one of the " +
                                                 std::to_string(classes.ids.size()) + " classes (ids 1.." +
                                                 std::to_string(classes.ids.size()) + " of names)",
           true);
    return -1;
  }
  return int(it - classes.ids.begin());
}

// Object i's box, turned upright, added to the sample unless it is out of range, empty or a duplicate.
void add_object_box(const ObjectLists& l, size_t i, int cls, int orientation, const std::string& obj,
                    const std::string& where, Decoded& d) {
  const float v[4] = {l.xmin[i], l.ymin[i], l.xmax[i], l.ymax[i]};
  bool inside = true;
  for (float c : v) inside = inside && std::isfinite(c) && c >= -kCoordTolerance && c <= 1 + kCoordTolerance;
  if (!inside) {
    report(d, where, ProblemKind::bad_label, obj + "coordinates are outside [0, 1]: the OD API's boxes are normalised by "
                                                   "the image size", true);
    return;
  }
  Box b;
  b.x1 = std::clamp(v[0], 0.f, 1.f), b.y1 = std::clamp(v[1], 0.f, 1.f);
  b.x2 = std::clamp(v[2], 0.f, 1.f), b.y2 = std::clamp(v[3], 0.f, 1.f);
  b.cls = cls;
  b.crowd = !l.crowd.empty() && l.crowd[i] != 0;
  b.area = l.area.empty() ? 0.f : l.area[i];
  b = oriented(b, orientation);
  if (b.x2 <= b.x1 || b.y2 <= b.y1)
    report(d, where, ProblemKind::zero_area_box, obj + "zero-area box dropped", false);
  else if (std::find(d.sample.boxes.begin(), d.sample.boxes.end(), b) != d.sample.boxes.end())
    report(d, where, ProblemKind::duplicate_box, obj + "duplicate box dropped", false);
  else
    d.sample.boxes.push_back(b);
}

// One record: its Example, its objects in Headroom's classes, its image checked.
Decoded decode_record(const RecordReader& reader, const RecordSpan& span, const RecordClasses& classes,
                      const ScanOptions& o) {
  Decoded d;
  const std::string where = reader.path() + ": record at byte " + std::to_string(span.offset);
  d.sample.image = reader.path();
  d.sample.record = span.offset;
  tf::Example ex;
  if (!read_example(reader, span, where, ex, d)) return d;
  d.sample.file_name = bytes_of(ex, "image/filename");
  if (const auto id = parse_int(bytes_of(ex, "image/source_id"))) d.sample.image_id = *id;
  ImageHeader header;
  if (!check_encoded_image(ex, where, o, header, d)) return d;
  d.sample.width = header.width, d.sample.height = header.height;

  const ObjectLists l = object_lists(ex);
  const size_t n = l.xmin.size();
  const bool use_text = classes.by_text && l.texts.size() == n && n > 0;
  if (!object_lists_agree(l, classes, use_text, where, d)) return d;
  for (size_t i = 0; i < n; ++i) {
    const std::string obj = "object " + std::to_string(i) + ": ";
    const int cls = object_class(l, i, use_text, classes, obj, where, d);
    if (cls >= 0) add_object_box(l, i, cls, header.orientation, obj, where, d);
  }
  return d;
}

}  // namespace

RecordScan scan_records(const SplitSource& source, const RecordClasses& classes, const ScanOptions& o) {
  RecordScan out;
  for (const std::string& pattern : source.images) {
    for (const std::string& file : record_files(pattern, source.where)) {
      std::string framing;
      const std::vector<RecordSpan> spans = record_index(file, &framing);
      const RecordReader reader(file);
      std::vector<Decoded> decoded(spans.size());
      parallel_for(int64_t(spans.size()), o.threads,
                   [&](int64_t i) { decoded[size_t(i)] = decode_record(reader, spans[size_t(i)], classes, o); });
      for (Decoded& d : decoded) {
        out.samples.push_back(std::move(d.sample));
        out.skipped.push_back(d.skipped);
        for (Problem& p : d.problems) out.problems.push_back(std::move(p));
      }
      if (!framing.empty()) {  // what follows a broken frame cannot be found: one problem for all of it
        out.problems.push_back({ProblemKind::unreadable_image, file,
                                framing + "; the rest of the file cannot be read", true});
        Sample lost;
        lost.image = file;
        out.samples.push_back(std::move(lost));
        out.skipped.push_back(true);
      }
    }
  }
  // source_id as COCO image id only where every record has its own number.
  std::set<int64_t> ids;
  bool unique = true;
  for (size_t i = 0; i < out.samples.size() && unique; ++i)
    unique = out.skipped[i] || (out.samples[i].image_id >= 0 && ids.insert(out.samples[i].image_id).second);
  if (!unique)
    for (Sample& s : out.samples) s.image_id = -1;
  return out;
}

std::string read_record_image(const std::string& file, int64_t offset) {
  const RecordReader reader(file);
  tf::Example ex;
  if (!ex.ParseFromString(reader.read(offset)))
    throw InputError(file + ": record at byte " + std::to_string(offset) + ": not a tf.train.Example");
  return bytes_of(ex, "image/encoded");
}

// ---------------------------------------------------------------------------------------
// Writing

namespace {

void put_bytes(tf::Example& e, const char* key, const std::string& v) {
  (*e.mutable_features()->mutable_feature())[key].mutable_bytes_list()->add_value(v);
}
void put_int(tf::Example& e, const char* key, int64_t v) {
  (*e.mutable_features()->mutable_feature())[key].mutable_int64_list()->add_value(v);
}
tf::FloatList& floats(tf::Example& e, const char* key) {
  return *(*e.mutable_features()->mutable_feature())[key].mutable_float_list();
}
tf::Int64List& ints(tf::Example& e, const char* key) {
  return *(*e.mutable_features()->mutable_feature())[key].mutable_int64_list();
}
tf::BytesList& texts(tf::Example& e, const char* key) {
  return *(*e.mutable_features()->mutable_feature())[key].mutable_bytes_list();
}

// `index` counts from 0; the source id made from it from 1, as a COCO conversion numbers images.
std::string example_of(const Sample& s, int64_t index, const std::vector<std::string>& names) {
  const std::string encoded = read_image_bytes(s);
  const ImageHeader h = read_image_header(reinterpret_cast<const uint8_t*>(encoded.data()), encoded.size());
  const bool turned = h.orientation >= 5;  // the stored image is the upright one turned by 90 degrees
  tf::Example e;
  put_int(e, "image/height", turned ? h.width : h.height);
  put_int(e, "image/width", turned ? h.height : h.width);
  put_bytes(e, "image/filename", image_name(s));
  put_bytes(e, "image/source_id", std::to_string(s.image_id >= 0 ? s.image_id : index + 1));
  put_bytes(e, "image/encoded", encoded);
  put_bytes(e, "image/format", h.format == ImageFormat::png ? "png" : "jpeg");
  // Present even when empty, as the OD API's writers do: a background image is a record without objects.
  for (const char* k : {"image/object/bbox/xmin", "image/object/bbox/xmax", "image/object/bbox/ymin", "image/object/bbox/ymax", "image/object/area"})
    floats(e, k);
  ints(e, "image/object/class/label"), ints(e, "image/object/is_crowd"), texts(e, "image/object/class/text");
  for (const Box& upright : s.boxes) {
    const Box b = oriented(upright, inverse_orientation(h.orientation));
    floats(e, "image/object/bbox/xmin").add_value(b.x1);
    floats(e, "image/object/bbox/xmax").add_value(b.x2);
    floats(e, "image/object/bbox/ymin").add_value(b.y1);
    floats(e, "image/object/bbox/ymax").add_value(b.y2);
    // The OD API's COCO writer stores the pixel area; a box without one gets its own.
    floats(e, "image/object/area").add_value(b.area > 0 ? b.area : float((double(b.x2) - b.x1) * h.width * (double(b.y2) - b.y1) * h.height));
    ints(e, "image/object/class/label").add_value(b.cls + 1);
    ints(e, "image/object/is_crowd").add_value(b.crowd ? 1 : 0);
    texts(e, "image/object/class/text").add_value(names.at(size_t(b.cls)));
  }
  return e.SerializeAsString();
}

}  // namespace

void write_records(const Split& split, const std::string& out, int shards) {
  if (shards < 1) throw InputError("shards must be at least 1");
  std::vector<std::string> files;
  for (int k = 0; k < shards; ++k) {
    char suffix[32];
    std::snprintf(suffix, sizeof suffix, "-%05d-of-%05d", k, shards);
    files.push_back(shards == 1 ? out : out + suffix);
  }
  // Each shard is written beside its name and renamed when whole: a failed conversion leaves no
  // torn file behind, and an existing set stays as it was.
  for (int k = 0; k < shards; ++k) {
    const std::string tmp = files[size_t(k)] + ".partial";
    {
      RecordWriter w(tmp);
      for (size_t i = size_t(k); i < split.samples.size(); i += size_t(shards))
        w.write(example_of(split.samples[i], int64_t(i), split.names));
      w.flush();
    }
    fsync_path(tmp, false);
    fs::rename(tmp, files[size_t(k)]);
  }
}

}  // namespace headroom::data
