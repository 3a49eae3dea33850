#include "headroom/data/dataset.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <set>

#include "headroom/core/errors.h"
#include "headroom/core/files.h"
#include "headroom/core/logging.h"
#include "headroom/core/text.h"
#include "headroom/core/threads.h"
#include "headroom/core/yaml_file.h"
#include "headroom/data/image.h"
#include "headroom/data/labels.h"
#include "headroom/data/pipeline_data.h"
#include "headroom/data/tfrecord.h"

namespace headroom::data {

namespace fs = std::filesystem;

const char* to_string(ProblemKind k) {
  switch (k) {
    case ProblemKind::missing_image: return "missing image";
    case ProblemKind::unreadable_image: return "unreadable image";
    case ProblemKind::truncated_image: return "truncated image";
    case ProblemKind::oversized_image: return "oversized image";
    case ProblemKind::bad_label: return "bad label";
    case ProblemKind::size_mismatch: return "size mismatch";
    case ProblemKind::duplicate_box: return "duplicate box";
    case ProblemKind::zero_area_box: return "zero-area box";
    case ProblemKind::unlisted_class: return "class not in the label map";
    case ProblemKind::missing_labels: return "missing labels";
  }
  return "?";
}

const SplitSource* DataSpec::split(const std::string& name) const {
  for (const auto& [n, s] : splits)
    if (n == name) return &s;
  return nullptr;
}

int64_t Split::skipped_images() const { return listed_images - static_cast<int64_t>(samples.size()); }

int64_t Split::background_images() const {
  return std::count_if(samples.begin(), samples.end(), [](const Sample& s) { return s.boxes.empty(); });
}

// ---------------------------------------------------------------------------------------
// Data YAML

namespace {

std::string at(const std::string& file, const YAML::Node& n) { return yaml_location(file, n.Mark()); }

std::string resolve(const fs::path& base, const std::string& p) {
  const fs::path path(p);
  return (path.is_absolute() ? path : base / path).lexically_normal().string();
}

SplitSource read_split(const std::string& file, const fs::path& root, const YAML::Node& n) {
  SplitSource s;
  s.where = at(file, n);
  auto path_of = [&](const YAML::Node& v) {
    if (!v.IsScalar() || v.Scalar().empty())
      throw InputError(at(file, v) + ": expected a path to an image folder or a .txt list of images");
    if (ends_with(to_lower(v.Scalar()), ".json"))
      throw InputError(at(file, v) + ": a COCO split is written {coco: " + v.Scalar() +
                       ", images: <folder of its images>}");
    return resolve(root, v.Scalar());
  };
  if (n.IsMap() && n["tfrecord"]) {
    const YAML::Node files = n["tfrecord"];
    if (!files.IsScalar() && !files.IsSequence())
      throw InputError(at(file, files) + ": tfrecord is a file, a glob or a list of them");
    s.format = SplitSource::Format::tfrecord;
    if (files.IsScalar()) s.images = {resolve(root, files.Scalar())};
    for (const auto& v : files) s.images.push_back(resolve(root, v.Scalar()));
  } else if (n.IsMap()) {
    const YAML::Node coco = n["coco"], images = n["images"];
    if (!coco || !coco.IsScalar() || !images || !images.IsScalar())
      throw InputError(s.where + ": a COCO split needs both keys: {coco: annotations.json, images: folder}");
    s.format = SplitSource::Format::coco;
    s.annotations = resolve(root, coco.Scalar());
    s.images = {resolve(root, images.Scalar())};
  } else if (n.IsSequence()) {
    for (const auto& v : n) s.images.push_back(path_of(v));
    if (s.images.empty()) throw InputError(s.where + ": the list of image folders is empty");
  } else {
    s.images = {path_of(n)};
  }
  // TFRecord files named like the OD API's (train.record, train.record-?????-of-00010).
  if (s.format == SplitSource::Format::yolo &&
      std::all_of(s.images.begin(), s.images.end(), [](const std::string& p) { return looks_like_records(p); }))
    s.format = SplitSource::Format::tfrecord;
  return s;
}

std::vector<std::string> read_names(const std::string& file, const YAML::Node& n) {
  std::vector<std::string> names;
  if (n.IsSequence()) {
    for (const auto& v : n) {
      if (!v.IsScalar()) throw InputError(at(file, v) + ": each class name must be a plain string");
      check_class_name_utf8(v.Scalar(), at(file, v));
      names.push_back(v.Scalar());
    }
  } else if (n.IsMap()) {
    std::map<int64_t, std::string> by_id;
    for (const auto& kv : n) {
      const auto id = kv.first.IsScalar() ? parse_int(kv.first.Scalar()) : std::nullopt;
      if (!id || *id < 0 || !kv.second.IsScalar())
        throw InputError(at(file, kv.first) + ": names as a map is {0: name, 1: name, ...}");
      check_class_name_utf8(kv.second.Scalar(), at(file, kv.second));
      if (!by_id.emplace(*id, kv.second.Scalar()).second)
        throw InputError(at(file, kv.first) + ": class id " + std::to_string(*id) + " is given twice in names; give each id once");
    }
    int64_t expect = 0;
    for (const auto& [id, name] : by_id) {
      if (id != expect)
        throw InputError(at(file, n) + ": class ids in names must run 0, 1, 2, ... without gaps; " +
                         std::to_string(expect) + " is missing");
      names.push_back(name);
      ++expect;
    }
  } else {
    throw InputError(at(file, n) + ": names must be a list [a, b] or a map {0: a, 1: b}");
  }
  if (names.empty()) throw InputError(at(file, n) + ": names is empty; list the class names");
  for (size_t i = 0; i < names.size(); ++i)
    for (size_t j = 0; j < i; ++j)
      if (names[i] == names[j])
        spdlog::warn("{}: classes {} and {} are both named '{}': results and plots will not tell them apart", at(file, n), j, i, names[i]);
  return names;
}

}  // namespace

namespace {

// The input readers of a TF OD API pipeline.config: TFRecord splits and their label map.
DataSpec data_spec_of_pipeline(const std::string& path) {
  std::vector<std::string> problems;
  const PipelineData p = pipeline_data(*parse_pipeline(path), problems);
  if (!problems.empty()) {
    std::string msg = path + ": its input readers cannot be read as a data set:";
    for (const auto& s : problems) msg += "\n  " + s;
    throw InputError(msg);
  }
  DataSpec spec;
  spec.file = path;
  spec.root = fs::absolute(path).parent_path().string();
  spec.label_map = p.label_map;
  auto split = [](const std::vector<std::string>& files, const std::string& where) {
    SplitSource s;
    s.format = SplitSource::Format::tfrecord;
    s.images = files;
    s.where = where;
    return s;
  };
  spec.splits.emplace_back("train", split(p.train, p.train_where));
  if (!p.val.empty()) spec.splits.emplace_back("val", split(p.val, p.val_where));
  // TF's num_classes is the largest id (a class is channel id - 1; the zoo's COCO map leaves ten
  // of its 90 ids out): one under an id would leave that class without a channel.
  const std::vector<LabelMapItem> items = read_label_map(p.label_map);
  const LabelMapItem& last = items.back();
  if (p.num_classes > 0 && p.num_classes < last.id)
    throw InputError(p.num_classes_where + ": num_classes " + std::to_string(p.num_classes) + " but the label map " + p.label_map +
                     " has id " + std::to_string(last.id) + " (" + last.where + "); TF's num_classes is the largest id: make it at least " +
                     std::to_string(last.id));
  if (p.num_classes > 0 && size_t(p.num_classes) > items.size())
    spdlog::info("{}: num_classes {} for the {} classes of {}: Headroom trains one output per listed class, in id order",
                 p.num_classes_where, p.num_classes, items.size(), p.label_map);
  return spec;
}

}  // namespace

DataSpec read_data_yaml(const std::string& path) {
  if (is_pipeline_config(path)) return data_spec_of_pipeline(path);
  const YAML::Node root = load_yaml_file(path, "data YAML");
  if (!root.IsMap())
    throw InputError(path + ": a data YAML is a mapping with path, train, val and names (docs/data.md)");
  DataSpec spec;
  spec.file = path;
  const fs::path yaml_dir = fs::absolute(path).parent_path();
  spec.root = yaml_dir.string();
  if (const YAML::Node p = root["path"]) {
    if (!p.IsScalar()) throw InputError(at(path, p) + ": path must be a folder");
    spec.root = resolve(yaml_dir, p.Scalar());
  }
  static const std::set<std::string> known = {"path", "train", "val", "test", "names", "nc", "label_map"};
  static const std::set<std::string> ignored = {"download", "kpt_shape", "flip_idx", "channels", "yaml_file"};
  std::map<std::string, std::string> seen;  // yaml-cpp answers root[key] with the first of two
  for (const auto& kv : root) {
    const std::string key = kv.first.Scalar();
    if (const auto [it, fresh] = seen.emplace(key, at(path, kv.first)); !fresh)
      throw InputError(at(path, kv.first) + ": '" + key + "' is given twice (first at " + it->second + "); keep one");
    if (!known.count(key) && !ignored.count(key))
      spdlog::warn("{}: key '{}' is not used by Headroom and is ignored", at(path, kv.first), key);
  }
  for (const char* split : {"train", "val", "test"})
    if (const YAML::Node n = root[split]; n && !n.IsNull()) spec.splits.emplace_back(split, read_split(path, spec.root, n));
  if (!spec.split("train") && !spec.split("val"))
    throw InputError(path + ": no train or val split; add e.g. 'train: images/train' and 'val: images/val'");
  if (const YAML::Node n = root["names"]) spec.names = read_names(path, n);
  if (const YAML::Node n = root["label_map"]) {
    if (!n.IsScalar()) throw InputError(at(path, n) + ": label_map is the path of a label_map.pbtxt");
    spec.label_map = resolve(spec.root, n.Scalar());
  }
  if (const YAML::Node nc = root["nc"]) {
    const auto v = nc.IsScalar() ? parse_int(nc.Scalar()) : std::nullopt;
    if (!v || *v < 1) throw InputError(at(path, nc) + ": nc must be a positive integer");
    if (!spec.names.empty() && *v != static_cast<int64_t>(spec.names.size()))
      throw InputError(at(path, nc) + ": nc is " + std::to_string(*v) + " but names lists " +
                       std::to_string(spec.names.size()) + " classes; make them agree (or drop nc)");
    spec.nc = *v;
    spec.nc_where = at(path, nc);
  }
  for (const auto& [name, s] : spec.splits)
    if (s.format == SplitSource::Format::yolo && spec.names.empty())
      throw InputError(path + ": names is missing; YOLO labels need the class names (names: [a, b, ...])");
  return spec;
}

// ---------------------------------------------------------------------------------------
// Scanning

bool is_image_name(const std::string& path) {
  static const std::set<std::string> exts = {".bmp", ".dng", ".jpeg", ".jpg", ".mpo", ".png",
                                             ".tif", ".tiff", ".webp", ".pfm", ".heic", ".gif"};
  return exts.count(to_lower(fs::path(path).extension().string())) > 0;
}

namespace {

// YOLO image paths of a source: a folder (recursively) or a .txt list.
void list_images(const std::string& source, const std::string& where, std::vector<std::string>& out,
                 std::vector<Problem>& problems) {
  std::error_code ec;
  if (fs::is_directory(source, ec)) {
    std::vector<std::string> found;
    for (fs::recursive_directory_iterator it(source, fs::directory_options::follow_directory_symlink, ec), end;
         it != end; it.increment(ec)) {
      if (ec) break;
      if (it->is_regular_file(ec) && is_image_name(it->path().string())) found.push_back(it->path().string());
    }
    if (ec) throw InputError(where + ": cannot list " + source + ": " + ec.message());
    std::sort(found.begin(), found.end());
    out.insert(out.end(), found.begin(), found.end());
    return;
  }
  if (fs::is_regular_file(source, ec) && is_image_name(source)) {  // one image (predict --source x.jpg)
    out.push_back(source);
    return;
  }
  if (fs::is_regular_file(source, ec) && ends_with(to_lower(source), ".txt")) {
    const std::string text = read_file(source);
    const fs::path base = fs::path(source).parent_path();
    size_t line_no = 0, pos = 0;
    while (pos <= text.size()) {
      size_t end = text.find('\n', pos);
      if (end == std::string::npos) end = text.size();
      ++line_no;
      const std::string line(trim(std::string_view(text).substr(pos, end - pos)));
      pos = end + 1;
      if (line.empty()) continue;
      const std::string p = resolve(base, line);
      if (fs::is_regular_file(p, ec))
        out.push_back(p);
      else
        problems.push_back({ProblemKind::missing_image, source + ":" + std::to_string(line_no),
                            p + " does not exist; skipped", true});
    }
    return;
  }
  if (!fs::exists(source, ec))
    throw InputError(where + ": " + source + " does not exist" +
                     (source.find_first_of("*?[") != std::string::npos ? " (patterns are not expanded: give the folder, or a .txt list)" : ""));
  throw InputError(where + ": " + source + " is neither an image, a folder of images nor a .txt list of image paths");
}

struct Probe {
  ImageHeader header;
  std::vector<Problem> problems;  // problems that skip the image
};

// Header, end marker, and optionally a full decode of one image file.
Probe probe_file(const std::string& path, const ScanOptions& o) {
  Probe r;
  const int fd = ::open(path.c_str(), O_RDONLY);
  struct stat st {};
  if (fd < 0 || ::fstat(fd, &st) != 0) {
    if (fd >= 0) ::close(fd);
    r.problems.push_back({ProblemKind::missing_image, path, "cannot be opened", true});
    return r;
  }
  const size_t size = static_cast<size_t>(st.st_size);
  // The header is near the start; EXIF blocks rarely exceed 256 KiB. The tail holds the end marker.
  std::vector<uint8_t> buf(o.full_decode ? size : std::min<size_t>(size, 256 * 1024));
  bool ok = ::pread(fd, buf.data(), buf.size(), 0) == static_cast<ssize_t>(buf.size());
  uint8_t tail[64];
  const size_t tail_n = std::min<size_t>(size, sizeof tail);
  ok = ok && ::pread(fd, tail, tail_n, static_cast<off_t>(size - tail_n)) == static_cast<ssize_t>(tail_n);
  if (ok && buf.size() < size) {
    try {
      read_image_header(buf.data(), buf.size());
    } catch (const ImageError&) {  // a header longer than the prefix: read it all
      buf.resize(size);
      ok = ::pread(fd, buf.data(), size, 0) == static_cast<ssize_t>(size);
    }
  }
  ::close(fd);
  if (!ok) {
    r.problems.push_back({ProblemKind::unreadable_image, path, "read error", true});
    return r;
  }
  r.problems = check_image_bytes(buf.data(), buf.size(), tail, tail_n, path, o, &r.header);
  return r;
}

}  // namespace

std::vector<Problem> check_image_bytes(const uint8_t* data, size_t size, const uint8_t* tail, size_t tail_size,
                                       const std::string& where, const ScanOptions& o, ImageHeader* header) {
  std::vector<Problem> problems;
  auto skip = [&](ProblemKind k, const std::string& msg) { problems.push_back({k, where, msg, true}); };
  ImageHeader h;
  try {
    h = read_image_header(data, size);
  } catch (const ImageError& e) {
    skip(ProblemKind::unreadable_image, e.what());
    return problems;
  }
  if (header) *header = h;
  const int64_t pixels = int64_t(h.width) * h.height;
  if (pixels > o.max_pixels) {
    skip(ProblemKind::oversized_image,
         "header claims " + std::to_string(h.width) + "x" + std::to_string(h.height) +
             " pixels, over data.max_pixels = " + std::to_string(o.max_pixels) +
             "; refused before decoding (raise data.max_pixels if the image is genuine)");
    return problems;
  }
  if (!image_is_complete(tail, tail_size, h.format)) {
    skip(ProblemKind::truncated_image, std::string(to_string(h.format)) +
                                           " file ends before its end marker (truncated copy or download)");
    return problems;
  }
  if (o.full_decode) {
    try {
      decode_image(data, size, o.max_pixels);
    } catch (const ImageError& e) {
      skip(ProblemKind::unreadable_image, e.what());
    }
  }
  return problems;
}

namespace {

// The samples a split lists, before their files are probed, and whether their annotations already condemn them.
struct Candidates {
  std::vector<Sample> samples;
  std::vector<char> corrupt;  // not vector<bool>: the probe threads write neighbouring entries at once
};

Candidates coco_candidates(const DataSpec& spec, const SplitSource& src, Split& split) {
  CocoData coco = read_coco(src.annotations, src.images.front(), spec.names);
  split.names = std::move(coco.names);
  split.category_ids = std::move(coco.category_ids);
  split.problems = std::move(coco.problems);
  split.listed_images = coco.listed_images;
  return {std::move(coco.samples), std::vector<char>(coco.corrupt.begin(), coco.corrupt.end())};
}

Candidates record_candidates(const DataSpec& spec, const SplitSource& src, const ScanOptions& o, Split& split) {
  const RecordClasses classes = record_classes(spec);
  RecordScan records = scan_records(src, classes, o);
  split.names = classes.names;
  split.category_ids = classes.ids;
  split.problems = std::move(records.problems);
  split.listed_images = static_cast<int64_t>(records.samples.size());
  return {std::move(records.samples), std::vector<char>(records.skipped.begin(), records.skipped.end())};
}

// YOLO layout: each image's labels sit in the parallel labels/ folder; they are read when the image is probed.
Candidates yolo_candidates(const SplitSource& src, Split& split) {
  std::vector<std::string> paths;
  for (const auto& s : src.images) list_images(s, src.where, paths, split.problems);
  split.listed_images = static_cast<int64_t>(paths.size()) +
                        std::count_if(split.problems.begin(), split.problems.end(),
                                      [](const Problem& p) { return p.kind == ProblemKind::missing_image; });
  Candidates c;
  for (auto& p : paths) {
    Sample s;
    s.image = std::move(p);
    s.labels = yolo_label_path(s.image);
    c.samples.push_back(std::move(s));
  }
  c.corrupt.assign(c.samples.size(), false);
  return c;
}

// Per image: probe the file, parse its labels. Results land in per-index slots so the
// order (and every later shuffle) does not depend on the thread count.
std::vector<std::vector<Problem>> probe_candidates(const SplitSource& src, int nc, const ScanOptions& o, Candidates& c) {
  std::vector<std::vector<Problem>> found(c.samples.size());
  const bool yolo = src.format == SplitSource::Format::yolo;
  // TFRecord images were checked with their records.
  const int64_t to_probe = src.format == SplitSource::Format::tfrecord ? 0 : static_cast<int64_t>(c.samples.size());
  parallel_for(to_probe, o.threads, [&](int64_t i) {
    Sample& s = c.samples[static_cast<size_t>(i)];
    Probe probe = probe_file(s.image, o);
    found[i] = std::move(probe.problems);
    if (!found[i].empty()) return;
    if (yolo) {
      s.width = probe.header.width, s.height = probe.header.height;
      std::error_code ec;
      if (fs::is_regular_file(s.labels, ec)) {
        LabelFile lf = parse_yolo_labels(read_file(s.labels), s.labels, nc);
        s.boxes = std::move(lf.boxes);
        found[i] = std::move(lf.problems);
        c.corrupt[i] = lf.corrupt;
      }
    } else if (probe.header.width != s.width || probe.header.height != s.height) {
      found[i].push_back({ProblemKind::size_mismatch, s.image,
                          "the annotations say " + std::to_string(s.width) + "x" + std::to_string(s.height) +
                              " but the image is " + std::to_string(probe.header.width) + "x" +
                              std::to_string(probe.header.height) + "; skipped (fix the JSON's width/height)",
                          true});
    }
  });
  return found;
}

// Moves every problem into the split, in image order, and keeps the images that none of them skips.
void keep_usable(Candidates& c, std::vector<std::vector<Problem>>& found, Split& split) {
  for (size_t i = 0; i < c.samples.size(); ++i) {
    bool skip = c.corrupt[i];
    for (auto& p : found[i]) {
      skip = skip || p.image_skipped;
      split.problems.push_back(std::move(p));
    }
    if (!skip) split.samples.push_back(std::move(c.samples[i]));
  }
}

// Applies data.on_error, logs the first problems, and refuses a split left with no image.
void enforce_on_error(const Split& split, const SplitSource& src, const ScanOptions& o) {
  const auto first_skip = std::find_if(split.problems.begin(), split.problems.end(),
                                       [](const Problem& p) { return p.image_skipped; });
  if (o.on_error == OnError::fail && first_skip != split.problems.end())
    throw InputError(first_skip->where + ": " + first_skip->message +
                     " (data.on_error is fail; set it to skip to train without such images)");
  // Those that skip an image first: a flood of dropped boxes (a small label map over COCO's
  // records drops one object in ten) must not hide them; the rest are counted by kind.
  std::vector<const Problem*> order;
  for (const Problem& p : split.problems) order.push_back(&p);
  std::stable_partition(order.begin(), order.end(), [](const Problem* p) { return p->image_skipped; });
  std::map<std::string, size_t> more;
  for (size_t i = 0; i < order.size(); ++i)
    if (i < 20)
      spdlog::warn("{}: {}: {}", order[i]->where, to_string(order[i]->kind), order[i]->message);
    else
      ++more[to_string(order[i]->kind)];
  if (!more.empty()) {
    std::string kinds;
    for (const auto& [kind, n] : more) kinds += (kinds.empty() ? "" : ", ") + std::to_string(n) + " " + kind;
    spdlog::warn("... and {} more problems in split '{}': {} (trainer data check lists them all)", order.size() - 20, split.name, kinds);
  }
  if (split.samples.empty())
    throw InputError(src.where + ": split '" + split.name + "' has no usable image (" +
                     std::to_string(split.listed_images) + " listed" +
                     (first_skip != split.problems.end()
                          ? "; first problem: " + first_skip->where + ": " + first_skip->message
                          : "") +
                     ")");
}

}  // namespace

Split scan_split(const DataSpec& spec, const std::string& name, const ScanOptions& o) {
  const SplitSource* src = spec.split(name);
  if (!src) throw InputError(spec.file + ": the data YAML has no '" + name + "' split");
  Split split;
  split.name = name;
  split.source = *src;
  split.names = spec.names;

  Candidates candidates = src->format == SplitSource::Format::coco       ? coco_candidates(spec, *src, split)
                          : src->format == SplitSource::Format::tfrecord ? record_candidates(spec, *src, o, split)
                                                                         : yolo_candidates(*src, split);
  // Without names, a COCO file's categories or a label map give the classes: nc is held to them.
  if (spec.nc > 0 && spec.nc != int64_t(split.names.size()))
    throw InputError(spec.nc_where + ": nc is " + std::to_string(spec.nc) + " but split '" + name + "' has " +
                     std::to_string(split.names.size()) + " classes (" +
                     (src->format == SplitSource::Format::coco ? src->annotations + "'s categories" : spec.label_map) +
                     "); make them agree (or drop nc)");
  std::vector<std::vector<Problem>> found = probe_candidates(*src, static_cast<int>(split.names.size()), o, candidates);
  keep_usable(candidates, found, split);
  // A labels/ folder missing or misplaced: each image alone is a background image, all of them
  // together is a mistake (Ultralytics warns "No labels found" too). Images stay usable.
  if (o.labels_expected && src->format == SplitSource::Format::yolo && !split.samples.empty() &&
      std::none_of(split.samples.begin(), split.samples.end(), [](const Sample& s) {
        std::error_code ec;
        return fs::is_regular_file(s.labels, ec);
      }))
    split.problems.push_back({ProblemKind::missing_labels, src->where,
                              "no image of split '" + name + "' has a label file (looked for " + split.samples.front().labels +
                                  " and the like): every image would train as background. Put one .txt per image in the "
                                  "labels/ folder beside images/ (same relative path), or fix the split's path",
                              false});

  if (o.report_only) return split;
  enforce_on_error(split, *src, o);
  return split;
}

std::string read_image_bytes(const Sample& s) {
  if (s.record >= 0) return read_record_image(s.image, s.record);
  return read_file(s.image);
}

std::string image_name(const Sample& s) {
  if (s.record >= 0)
    return s.file_name.empty() ? fs::path(s.image).filename().string() + "@" + std::to_string(s.record) : s.file_name;
  return fs::path(s.image).filename().string();
}

Split load_split(const Config& c, const std::string& split, bool full_decode) {
  if (c.data.dataset.empty())
    throw InputError((c.source.empty() ? std::string("the configuration") : c.source) +
                     ": data.dataset is not set; point it at a data YAML (data.dataset=path/to/data.yaml)");
  ScanOptions o;
  o.max_pixels = c.data.max_pixels;
  o.on_error = on_error_from(c.data.on_error);
  o.threads = std::max(1, resolve_workers(c.data.workers));
  o.full_decode = full_decode;
  return scan_split(read_data_yaml(c.data.dataset), split, o);
}

namespace {
const std::pair<const char*, OnError> kOnError[] = {{"skip", OnError::skip}, {"fail", OnError::fail}};
const std::pair<const char*, CacheMode> kCacheMode[] = {{"none", CacheMode::none}, {"ram", CacheMode::ram}, {"disk", CacheMode::disk}};
}  // namespace

OnError on_error_from(const std::string& word) { return enum_from_word(word, kOnError); }
CacheMode cache_mode_from(const std::string& word) { return enum_from_word(word, kCacheMode); }
const char* to_string(CacheMode m) { return enum_word(m, kCacheMode); }

}  // namespace headroom::data
