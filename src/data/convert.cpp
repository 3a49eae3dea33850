#include "headroom/data/convert.h"

#include <cctype>
#include <cstdio>
#include <filesystem>
#include <set>

#include "headroom/core/errors.h"
#include "headroom/core/files.h"
#include "headroom/core/json.h"
#include "headroom/core/logging.h"
#include "headroom/data/image.h"
#include "headroom/data/tfrecord.h"

namespace headroom::data {

namespace fs = std::filesystem;

DataFormat data_format_from(const std::string& word) {
  if (word == "yolo") return DataFormat::yolo;
  if (word == "coco") return DataFormat::coco;
  if (word == "tfrecord") return DataFormat::tfrecord;
  throw InputError("--to " + word + ": the formats are yolo, coco and tfrecord");
}

namespace {

// A YAML scalar that reads back as exactly `s`.
std::string yaml_quoted(const std::string& s) { return Json(s).dump(); }

std::string names_yaml(const std::vector<std::string>& names) {
  std::string out = "names:\n";
  for (size_t i = 0; i < names.size(); ++i) out += "  " + std::to_string(i) + ": " + yaml_quoted(names[i]) + "\n";
  return out;
}

// Writes sample i's image under `dir` and returns its file name: the sample's own name with the
// extension of its bytes' format, the index in front while the stem is taken (YOLO pairs
// images/<stem>.* with labels/<stem>.txt, so `a.jpg` and `a.png` must not share one).
std::string copy_image(const Sample& s, size_t i, const fs::path& dir, std::set<std::string>& stems) {
  const std::string bytes = read_image_bytes(s);
  const ImageHeader h = read_image_header(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
  const std::string ext = h.format == ImageFormat::png ? ".png" : ".jpg";
  std::string name = fs::path(image_name(s)).filename().string();
  if (name.empty() || name.find('@') != std::string::npos) name = "image" + std::to_string(i);
  fs::path p(name);
  std::string e = p.extension().string();
  for (char& c : e) c = char(std::tolower(static_cast<unsigned char>(c)));
  if (e == ".jpeg") e = ".jpg";
  if (e != ext) name += ext;
  while (!stems.insert(fs::path(name).stem().string()).second) name = std::to_string(i) + "_" + name;
  write_file_atomic((dir / name).string(), bytes);
  return name;
}

std::string fmt9(double v) {
  char b[32];
  std::snprintf(b, sizeof b, "%.9g", v);
  return b;
}

void write_yolo(const Split& split, const fs::path& out, ConvertSummary& summary) {
  const fs::path images = out / "images" / split.name, labels = out / "labels" / split.name;
  fs::create_directories(images);
  fs::create_directories(labels);
  std::set<std::string> stems;
  for (size_t i = 0; i < split.samples.size(); ++i) {
    const Sample& s = split.samples[i];
    const std::string file = copy_image(s, i, images, stems);
    std::string text;
    for (const Box& b : s.boxes) {
      if (b.crowd) {
        ++summary.crowd_boxes_left_out;
        continue;
      }
      text += std::to_string(b.cls) + " " + fmt9((double(b.x1) + b.x2) / 2) + " " + fmt9((double(b.y1) + b.y2) / 2) + " " +
              fmt9(double(b.x2) - b.x1) + " " + fmt9(double(b.y2) - b.y1) + "\n";
    }
    write_file_atomic((labels / (fs::path(file).stem().string() + ".txt")).string(), text);
  }
}

void write_coco(const Split& split, const fs::path& out) {
  const fs::path images = out / "images" / split.name;
  fs::create_directories(images);
  fs::create_directories(out / "annotations");
  std::set<std::string> stems;
  auto category = [&](int cls) { return split.category_ids.empty() ? cls + 1 : split.category_ids[size_t(cls)]; };
  Json ims = Json::array(), anns = Json::array(), cats = Json::array();
  int64_t ann_id = 1;
  for (size_t i = 0; i < split.samples.size(); ++i) {
    const Sample& s = split.samples[i];
    const int64_t id = s.image_id >= 0 ? s.image_id : int64_t(i) + 1;
    Json im = Json::object();
    im["id"] = id;
    im["file_name"] = copy_image(s, i, images, stems);
    im["width"] = s.width;
    im["height"] = s.height;
    ims.push_back(std::move(im));
    for (const Box& b : s.boxes) {
      const double x = double(b.x1) * s.width, y = double(b.y1) * s.height;
      const double w = (double(b.x2) - b.x1) * s.width, h = (double(b.y2) - b.y1) * s.height;
      Json a = Json::object();
      a["id"] = ann_id++;
      a["image_id"] = id;
      a["category_id"] = category(b.cls);
      Json bbox = Json::array();
      for (double v : {x, y, w, h}) bbox.push_back(v);
      a["bbox"] = std::move(bbox);
      a["area"] = b.area > 0 ? double(b.area) : w * h;
      a["iscrowd"] = b.crowd ? 1 : 0;
      anns.push_back(std::move(a));
    }
  }
  for (size_t c = 0; c < split.names.size(); ++c) {
    Json cat = Json::object();
    cat["id"] = category(int(c));
    cat["name"] = split.names[c];
    cats.push_back(std::move(cat));
  }
  Json coco = Json::object();
  coco["images"] = std::move(ims);
  coco["annotations"] = std::move(anns);
  coco["categories"] = std::move(cats);
  write_file_atomic((out / "annotations" / ("instances_" + split.name + ".json")).string(), coco.dump());
}

}  // namespace

ConvertSummary convert_data(const ConvertOptions& o) {
  const DataSpec spec = read_data_yaml(o.from);
  const fs::path out = fs::absolute(o.out);
  std::error_code ec;
  if (fs::exists(out, ec) && !fs::is_directory(out, ec)) throw InputError(o.out + ": a file is there; give a new folder");
  if (fs::exists(out, ec) && !fs::is_empty(out, ec))
    throw InputError(o.out + ": the output folder is not empty; give a new one (nothing there is overwritten)");
  if (o.shards < 1 || o.shards > 99999) throw InputError("--shards must be in 1 .. 99999 (the shard names hold five digits)");
  if (o.shards > 1 && o.to != DataFormat::tfrecord)
    throw InputError("--shards " + std::to_string(o.shards) + " is for --to tfrecord (record files per split); a YOLO or COCO set has none");
  fs::create_directories(out, ec);
  if (ec) throw InputError(o.out + ": cannot create the output folder: " + ec.message());

  ConvertSummary summary;
  std::vector<std::string> names;
  std::string yaml = "# converted by trainer data convert from " + fs::absolute(o.from).string() + "\npath: .\n";
  for (const auto& [name, source] : spec.splits) {
    ScanOptions scan = o.scan;
    scan.on_error = OnError::skip;
    const Split split = scan_split(spec, name, scan);
    if (!names.empty() && split.names != names)
      throw InputError(o.from + ": splits '" + spec.splits.front().first + "' and '" + name + "' name different classes");
    names = split.names;
    if (o.to == DataFormat::yolo) {
      write_yolo(split, out, summary);
      yaml += name + ": images/" + name + "\n";
    } else if (o.to == DataFormat::coco) {
      write_coco(split, out);
      yaml += name + ": {coco: annotations/instances_" + name + ".json, images: images/" + name + "}\n";
    } else {
      write_records(split, (out / (name + ".record")).string(), o.shards);
      char shards[32] = "";
      if (o.shards > 1) std::snprintf(shards, sizeof shards, "-?\?\?\?\?-of-%05d", o.shards);
      yaml += name + ": " + name + ".record" + shards + "\n";
    }
    summary.images.emplace_back(name, int64_t(split.samples.size()));
    for (const Sample& s : split.samples) summary.boxes += int64_t(s.boxes.size());
  }
  if (o.to == DataFormat::tfrecord) {
    write_file_atomic((out / "label_map.pbtxt").string(), label_map_text(names));
    yaml += "label_map: label_map.pbtxt\n";
  } else {
    yaml += names_yaml(names);
  }
  summary.data_yaml = (out / "data.yaml").string();
  write_file_atomic(summary.data_yaml, yaml);  // last: a set without it was not finished
  if (summary.crowd_boxes_left_out > 0)
    spdlog::warn("{} crowd boxes left out: YOLO labels cannot mark a box as crowd (convert to coco or tfrecord to keep them)",
                 summary.crowd_boxes_left_out);
  return summary;
}

}  // namespace headroom::data
