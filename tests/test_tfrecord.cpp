// TFRecord data sets: records TensorFlow wrote (tests/fixtures/tfrecord, remade by
// scripts/make_tfrecord_fixtures.py), damaged records named by file and byte offset, the cached
// index, label maps, conversions between the three formats, and a TFRecord set trained on.
#include <gtest/gtest.h>

#include <filesystem>
#include <map>
#include <set>

#include "headroom/core/errors.h"
#include "headroom/core/json.h"
#include "headroom/data/record_file.h"
#include "headroom/data/convert.h"
#include "headroom/data/image.h"
#include "headroom/data/tfrecord.h"
#include "test_util.h"

using namespace headroom;
using namespace headroom::data;
namespace fs = std::filesystem;

namespace {

std::string fixture(const std::string& name) { return std::string(HEADROOM_SOURCE_DIR) + "/tests/fixtures/tfrecord/" + name; }

// The fixture records in a folder of their own (the index is written beside them), with a data YAML.
std::string tf_written_set(const std::string& name, const std::string& yaml_tail = "label_map: label_map.pbtxt\n") {
  const std::string dir = test::temp_dir(name);
  fs::copy_file(fixture("tf_written.record"), dir + "/tf_written.record");
  fs::copy_file(fixture("label_map.pbtxt"), dir + "/label_map.pbtxt");
  test::write_bytes(dir + "/data.yaml", "path: .\ntrain: tf_written.record\nval: tf_written.record\n" + yaml_tail);
  return dir;
}

Split scan(const std::string& yaml, OnError on_error = OnError::skip, const std::string& split = "train") {
  ScanOptions o;
  o.on_error = on_error;
  o.threads = 2;
  return scan_split(read_data_yaml(yaml), split, o);
}


std::vector<data::RecordSpan> spans_of(const std::string& file) { return data::RecordReader(file).index().spans; }

void flip_byte(const std::string& file, int64_t at) {
  std::string bytes = test::read_bytes(file);
  bytes[size_t(at)] = char(bytes[size_t(at)] ^ 0x5A);
  test::write_bytes(file, bytes);
}

// Samples by image name: conversions may reorder (shards interleave).
std::map<std::string, Sample> by_name(const Split& s) {
  std::map<std::string, Sample> out;
  for (const Sample& x : s.samples) out[fs::path(image_name(x)).stem().string()] = x;
  return out;
}

void expect_same_samples(const Split& a, const Split& b, bool crowd_kept = true) {
  EXPECT_EQ(a.names, b.names);
  const auto ma = by_name(a), mb = by_name(b);
  ASSERT_EQ(ma.size(), mb.size());
  for (const auto& [name, sa] : ma) {
    ASSERT_TRUE(mb.count(name)) << name;
    const Sample& sb = mb.at(name);
    EXPECT_EQ(sa.width, sb.width) << name;
    EXPECT_EQ(sa.height, sb.height) << name;
    std::vector<Box> boxes_a;
    for (const Box& box : sa.boxes)
      if (crowd_kept || !box.crowd) boxes_a.push_back(box);
    ASSERT_EQ(boxes_a.size(), sb.boxes.size()) << name;
    for (size_t i = 0; i < boxes_a.size(); ++i) {
      EXPECT_NEAR(boxes_a[i].x1, sb.boxes[i].x1, 1e-6) << name;
      EXPECT_NEAR(boxes_a[i].y1, sb.boxes[i].y1, 1e-6) << name;
      EXPECT_NEAR(boxes_a[i].x2, sb.boxes[i].x2, 1e-6) << name;
      EXPECT_NEAR(boxes_a[i].y2, sb.boxes[i].y2, 1e-6) << name;
      EXPECT_EQ(boxes_a[i].cls, sb.boxes[i].cls) << name;
      EXPECT_EQ(boxes_a[i].crowd, sb.boxes[i].crowd) << name;
    }
  }
}

Split convert_and_scan(const std::string& from, DataFormat to, const std::string& out, int shards = 1) {
  ConvertOptions o;
  o.from = from;
  o.to = to;
  o.out = out;
  o.shards = shards;
  o.scan.threads = 2;
  return scan(convert_data(o).data_yaml);
}

}  // namespace

// Records TensorFlow's own writer framed, with the OD API's keys: every box, class (by the
// label map's text, or by id where a record has no text), crowd flag, size and source id.
TEST(TfRecord, TensorFlowsRecordsScanWithTheirBoxesClassesAndIds) {
  const std::string dir = tf_written_set("tfrecord-tf");
  const Split s = scan(dir + "/data.yaml");
  const Json expected = read_json_file(fixture("expected.json"));
  EXPECT_EQ(s.names, (std::vector<std::string>{"person", "car"}));  // display names
  EXPECT_EQ(s.category_ids, (std::vector<int>{1, 2}));
  const auto& records = expected.find("records")->items();
  ASSERT_EQ(s.samples.size(), records.size());
  EXPECT_TRUE(s.problems.empty());
  for (size_t i = 0; i < records.size(); ++i) {
    SCOPED_TRACE(i);
    const Sample& got = s.samples[i];
    const Json& want = records[i];
    EXPECT_EQ(got.file_name, want.find("file_name")->as_string());
    EXPECT_EQ(got.width, int(want.find("width")->as_number()));
    EXPECT_EQ(got.height, int(want.find("height")->as_number()));
    EXPECT_EQ(got.image_id, int64_t(want.find("image_id")->as_number()));
    const auto& boxes = want.find("boxes")->items();
    ASSERT_EQ(got.boxes.size(), boxes.size()) << i;
    for (size_t b = 0; b < boxes.size(); ++b) {
      const auto& xyxy = boxes[b].find("xyxy")->items();
      EXPECT_FLOAT_EQ(got.boxes[b].x1, float(xyxy[0].as_number()));
      EXPECT_FLOAT_EQ(got.boxes[b].y1, float(xyxy[1].as_number()));
      EXPECT_FLOAT_EQ(got.boxes[b].x2, float(xyxy[2].as_number()));
      EXPECT_FLOAT_EQ(got.boxes[b].y2, float(xyxy[3].as_number()));
      EXPECT_EQ(got.boxes[b].cls, int(boxes[b].find("cls")->as_number()));
      EXPECT_EQ(got.boxes[b].crowd, boxes[b].find("crowd")->as_number() != 0);
    }
    // The image comes out of the record whole: it decodes to the size the record states.
    const std::string bytes = read_image_bytes(got);
    const Image img = decode_image(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(), 1 << 30);
    EXPECT_EQ(img.width, got.width);
    EXPECT_EQ(img.height, got.height);
  }
  // Without a label map, names are ids 1, 2, ... and class/label decides.
  const std::string by_names = tf_written_set("tfrecord-tf-names", "names: [a, b]\n");
  const Split n = scan(by_names + "/data.yaml");
  ASSERT_EQ(n.samples.size(), 3u);
  EXPECT_EQ(n.samples[0].boxes[1].cls, 1);
  EXPECT_EQ(n.samples[2].boxes[0].cls, 1);
}

// A bad data CRC costs its record, a bad length CRC the rest of the file (its framing is lost),
// a truncated file its last record; each problem names the file and the record's byte offset,
// and data.on_error=fail stops with that message.
TEST(TfRecord, DamagedRecordsAreNamedByFileAndByteOffset) {
  const std::vector<data::RecordSpan> spans = spans_of(fixture("tf_written.record"));
  ASSERT_EQ(spans.size(), 3u);
  const std::string at1 = "tf_written.record: record at byte " + std::to_string(spans[1].offset);

  const std::string data_crc = tf_written_set("tfrecord-data-crc");
  flip_byte(data_crc + "/tf_written.record", spans[1].offset + 12 + 5);
  Split s = scan(data_crc + "/data.yaml");
  EXPECT_EQ(s.samples.size(), 2u);
  ASSERT_EQ(s.problems.size(), 1u);
  EXPECT_NE(s.problems[0].where.find(at1), std::string::npos) << s.problems[0].where;
  EXPECT_NE(s.problems[0].message.find("bad data CRC"), std::string::npos) << s.problems[0].message;
  const std::string failed = test::input_error_of([&] { scan(data_crc + "/data.yaml", OnError::fail); });
  EXPECT_NE(failed.find(at1), std::string::npos) << failed;
  EXPECT_NE(failed.find("data.on_error is fail"), std::string::npos) << failed;

  const std::string length_crc = tf_written_set("tfrecord-length-crc");
  flip_byte(length_crc + "/tf_written.record", spans[1].offset + 2);
  s = scan(length_crc + "/data.yaml");
  EXPECT_EQ(s.samples.size(), 1u);
  ASSERT_EQ(s.problems.size(), 1u);
  EXPECT_NE(s.problems[0].message.find("record at byte " + std::to_string(spans[1].offset) + ": bad length CRC"),
            std::string::npos) << s.problems[0].message;
  EXPECT_NE(s.problems[0].message.find("the rest of the file cannot be read"), std::string::npos);

  const std::string truncated = tf_written_set("tfrecord-truncated");
  const std::string bytes = test::read_bytes(truncated + "/tf_written.record");
  test::write_bytes(truncated + "/tf_written.record", bytes.substr(0, size_t(spans[2].offset + 40)));
  s = scan(truncated + "/data.yaml");
  EXPECT_EQ(s.samples.size(), 2u);
  ASSERT_EQ(s.problems.size(), 1u);
  EXPECT_NE(s.problems[0].message.find("record at byte " + std::to_string(spans[2].offset) + ": the file ends inside"),
            std::string::npos) << s.problems[0].message;

  // A record that decodes but is not an Example, and one whose boxes name an unknown class.
  const std::string odd = test::temp_dir("tfrecord-odd");
  {
    data::RecordWriter w(odd + "/odd.record");
    w.write("\x0a\x03\xff\xff\xff");  // a field whose length runs past the end
    w.flush();
  }
  test::write_bytes(odd + "/data.yaml", "path: .\ntrain: odd.record\nnames: [a]\n");
  const std::string odd_error = test::input_error_of([&] { scan(odd + "/data.yaml"); });
  EXPECT_NE(odd_error.find("not a tf.train.Example"), std::string::npos) << odd_error;
  const std::string one_class = tf_written_set("tfrecord-unknown-class", "names: [a]\n");
  s = scan(one_class + "/data.yaml");
  EXPECT_EQ(s.samples.size(), 1u);  // the background image only
  EXPECT_NE(s.problems[0].message.find("class id 2 is not one of the 1 classes"), std::string::npos)
      << s.problems[0].message;
}

// A label map of some of the records' classes trains on those: an object of another class is
// dropped and its image kept, as TF's filter_unrecognized_classes does, whether the record names
// the class by text (street.jpg's car) or by id alone (park.jpg's car).
TEST(TfRecord, ObjectsOfClassesTheLabelMapLeavesOutAreDroppedNotTheirImages) {
  const std::string dir = tf_written_set("tfrecord-subset");
  test::write_bytes(dir + "/label_map.pbtxt", "item {\n  name: \"/m/01g317\"\n  id: 1\n  display_name: \"person\"\n}\n");
  const Split s = scan(dir + "/data.yaml", OnError::fail);  // not a problem that skips an image
  EXPECT_EQ(s.names, std::vector<std::string>{"person"});
  ASSERT_EQ(s.samples.size(), 3u);
  EXPECT_EQ(s.samples[0].boxes.size(), 1u);  // street.jpg: its person
  EXPECT_EQ(s.samples[0].boxes[0].cls, 0);
  EXPECT_TRUE(s.samples[1].boxes.empty());  // empty.png
  EXPECT_TRUE(s.samples[2].boxes.empty());  // park.jpg: its one car dropped
  ASSERT_EQ(s.problems.size(), 2u);
  for (const auto& p : s.problems) {
    EXPECT_EQ(p.kind, ProblemKind::unlisted_class);
    EXPECT_FALSE(p.image_skipped);
  }
  EXPECT_NE(s.problems[0].message.find("object 1: class 'car' is not in the label map: dropped"), std::string::npos) << s.problems[0].message;
  EXPECT_NE(s.problems[1].message.find("object 0: class id 2 is not in the label map: dropped"), std::string::npos) << s.problems[1].message;
}

// The index of record offsets is written once beside the file (a hidden name no glob over the
// data matches), read on the next scan, and rebuilt when the file changes.
TEST(TfRecord, TheIndexIsCachedBesideTheFileAndRebuiltWhenTheFileChanges) {
  const std::string dir = tf_written_set("tfrecord-index");
  const std::string file = dir + "/tf_written.record", index = dir + "/.tf_written.record.index";
  EXPECT_EQ(scan(dir + "/data.yaml").samples.size(), 3u);
  ASSERT_TRUE(fs::exists(index));
  EXPECT_EQ(record_files(dir + "/tf_written.record*", "test"), std::vector<std::string>{file});
  // The cached index is what the next scan reads: offsets moved by one byte miss every record.
  std::string text = test::read_bytes(index);
  const std::string header = text.substr(0, text.find('\n') + 1);
  std::string shifted = header;
  for (const data::RecordSpan& s : spans_of(file)) shifted += std::to_string(s.offset + 1) + " " + std::to_string(s.length) + "\n";
  test::write_bytes(index, shifted);
  const std::string missed = test::input_error_of([&] { scan(dir + "/data.yaml"); });
  EXPECT_NE(missed.find("record at byte 1: bad length CRC"), std::string::npos) << missed;
  // A record appended: the file's size no longer matches the index's key, so it is rebuilt.
  {
    data::RecordWriter w(file, int64_t(fs::file_size(file)));
    w.write(data::RecordReader(file).read(0));
    w.flush();
  }
  const Split s = scan(dir + "/data.yaml");
  EXPECT_EQ(s.samples.size(), 4u);
  EXPECT_TRUE(s.problems.empty());
  EXPECT_NE(test::read_bytes(index), shifted);
}

TEST(TfRecord, ShardedNamesNeedEveryShard) {
  const std::string dir = test::temp_dir("tfrecord-shards");
  ConvertOptions o;
  o.from = test::small_synth();
  o.to = DataFormat::tfrecord;
  o.out = dir + "/rec";
  o.shards = 3;
  const ConvertSummary sum = convert_data(o);
  EXPECT_EQ(test::read_bytes(sum.data_yaml).find("train: train.record-?\?\?\?\?-of-00003") != std::string::npos, true);
  EXPECT_EQ(record_files(dir + "/rec/train.record-?\?\?\?\?-of-00003", "here").size(), 3u);
  fs::remove(dir + "/rec/train.record-00001-of-00003");
  const std::string e = test::input_error_of([&] { record_files(dir + "/rec/train.record-?\?\?\?\?-of-00003", "data.yaml:3"); });
  EXPECT_NE(e.find("data.yaml:3: "), std::string::npos) << e;
  EXPECT_NE(e.find("train.record-00001-of-00003 is missing (2 of 3 are there)"), std::string::npos) << e;
  // A '*' glob over the shards checks them too; a shard named alone is read alone.
  const std::string star = test::input_error_of([&] { record_files(dir + "/rec/train.record-*", "data.yaml:3"); });
  EXPECT_NE(star.find("train.record-00001-of-00003 is missing"), std::string::npos) << star;
  EXPECT_EQ(record_files(dir + "/rec/train.record-00002-of-00003", "here").size(), 1u);
  // The zoo's naming, the count before an extension: train2017-?????-of-00256.tfrecord.
  for (const char* k : {"00000", "00002"})
    fs::rename(dir + "/rec/train.record-" + k + "-of-00003", dir + "/rec/t-" + k + "-of-00003.tfrecord");
  const std::string zoo = test::input_error_of([&] { record_files(dir + "/rec/t-?\?\?\?\?-of-00003.tfrecord", "data.yaml:3"); });
  EXPECT_NE(zoo.find("shard " + dir + "/rec/t-00001-of-00003.tfrecord is missing (2 of 3 are there)"), std::string::npos) << zoo;
}

TEST(TfRecord, LabelMapErrorsNameTheLineAndTheFieldMeant) {
  const std::string dir = test::temp_dir("tfrecord-label-map");
  test::write_bytes(dir + "/bom.pbtxt", "\xEF\xBB\xBFitem {\n  id: 1\n  name: \"cat\"\n}\n");  // a Windows editor's
  ASSERT_EQ(read_label_map(dir + "/bom.pbtxt").size(), 1u);
  test::write_bytes(dir + "/typo.pbtxt", "item {\n  id: 1\n  nmae: \"cat\"\n}\n");
  std::string e = test::input_error_of([&] { read_label_map(dir + "/typo.pbtxt"); });
  EXPECT_NE(e.find("typo.pbtxt:3:"), std::string::npos) << e;
  EXPECT_NE(e.find("did you mean 'name'?"), std::string::npos) << e;
  EXPECT_NE(e.find("\"object_detection.protos.StringIntLabelMapItem\" has no field named \"nmae\""), std::string::npos) << e;
  test::write_bytes(dir + "/zero.pbtxt", "item {\n  id: 1\n  name: \"cat\"\n}\nitem {\n  id: 0\n  name: \"dog\"\n}\n");
  e = test::input_error_of([&] { read_label_map(dir + "/zero.pbtxt"); });
  EXPECT_NE(e.find("zero.pbtxt:5: id 0: label map ids start at 1"), std::string::npos) << e;
  test::write_bytes(dir + "/twice.pbtxt", "item { id: 1 name: \"cat\" }\nitem { id: 1 name: \"dog\" }\n");
  e = test::input_error_of([&] { read_label_map(dir + "/twice.pbtxt"); });
  EXPECT_NE(e.find("twice.pbtxt:2: id 1 appears twice"), std::string::npos) << e;
  // One name for two ids would file the second class's objects under the first.
  test::write_bytes(dir + "/same-name.pbtxt", "item { id: 1 name: \"cat\" }\nitem { id: 2 name: \"dog\" display_name: \"dog\" }\n"
                                              "item { id: 3 name: \"/m/01\" display_name: \"cat\" }\n");
  e = test::input_error_of([&] { read_label_map(dir + "/same-name.pbtxt"); });
  EXPECT_NE(e.find("same-name.pbtxt:3: 'cat' also names id 1 (" + dir + "/same-name.pbtxt:1); records name"), std::string::npos) << e;
  // Our own text reads back as the same classes, background allowed at 0.
  test::write_bytes(dir + "/ours.pbtxt", "item { id: 0 name: \"background\" }\n" + label_map_text({"cat", "dog"}));
  const auto items = read_label_map(dir + "/ours.pbtxt");
  ASSERT_EQ(items.size(), 2u);
  EXPECT_EQ(items[1].id, 2);
  EXPECT_EQ(items[1].name, "dog");
}

// YOLO -> TFRecord (sharded) -> COCO -> YOLO -> TFRecord: the same images, boxes and names at
// every stop. TensorFlow's records -> COCO -> TFRecord keep crowd boxes; YOLO drops them, counted.
TEST(TfRecord, ConversionsKeepBoxesAndClassNamesInEveryDirection) {
  const std::string dir = test::temp_dir("tfrecord-convert");
  const Split original = scan(test::small_synth());
  const Split records = convert_and_scan(test::small_synth(), DataFormat::tfrecord, dir + "/a", 2);
  expect_same_samples(original, records);
  const Split coco = convert_and_scan(dir + "/a/data.yaml", DataFormat::coco, dir + "/b");
  expect_same_samples(original, coco);
  const Split yolo = convert_and_scan(dir + "/b/data.yaml", DataFormat::yolo, dir + "/c");
  expect_same_samples(original, yolo);
  const Split from_yolo = convert_and_scan(dir + "/c/data.yaml", DataFormat::tfrecord, dir + "/d");
  expect_same_samples(original, from_yolo);
  // YOLO labels carry no area: the records get each box's own, in pixels, as the OD API's do.
  for (const Sample& s : from_yolo.samples)
    for (const Box& b : s.boxes)
      EXPECT_NEAR(b.area, (b.x2 - b.x1) * s.width * (b.y2 - b.y1) * s.height, 1e-2) << image_name(s);
  // Every split came along.
  EXPECT_EQ(scan(dir + "/d/data.yaml", OnError::skip, "val").samples.size(),
            scan(test::small_synth(), OnError::skip, "val").samples.size());

  const std::string tf = tf_written_set("tfrecord-convert-tf");
  const Split theirs = scan(tf + "/data.yaml");
  const Split via_coco = convert_and_scan(tf + "/data.yaml", DataFormat::coco, dir + "/e");
  expect_same_samples(theirs, via_coco);
  expect_same_samples(theirs, convert_and_scan(dir + "/e/data.yaml", DataFormat::tfrecord, dir + "/f"));
  ConvertOptions o;
  o.from = tf + "/data.yaml";
  o.to = DataFormat::yolo;
  o.out = dir + "/g";
  EXPECT_EQ(convert_data(o).crowd_boxes_left_out, 2);  // one per split: train and val name the same file
  expect_same_samples(theirs, scan(dir + "/g/data.yaml"), /*crowd_kept=*/false);
  // Nothing is written over.
  const std::string e = test::input_error_of([&] { convert_data(o); });
  EXPECT_NE(e.find("not empty"), std::string::npos) << e;
}

// Images whose names collide once in one folder (the same name in two folders; a.jpg beside
// a.png, whose YOLO labels would both be a.txt) each keep their own file and labels.
TEST(TfRecord, ConvertedImagesWithCollidingNamesKeepTheirOwnLabels) {
  const std::string dir = test::temp_dir("tfrecord-collide");
  Json images = Json::array(), anns = Json::array();
  const std::vector<std::string> files = {"one/a.jpg", "two/a.jpg", "a.png", "a"};
  for (size_t i = 0; i < files.size(); ++i) {
    Image im;
    im.width = 32 + 16 * int(i), im.height = 32;  // the width tells the images apart
    im.pixels.assign(size_t(im.width * im.height * 3), uint8_t(40 * i));
    const std::vector<uint8_t> bytes = i == 2 ? encode_png(im) : encode_jpeg(im, 90);
    fs::create_directories(fs::path(dir + "/images/" + files[i]).parent_path());
    test::write_bytes(dir + "/images/" + files[i], std::string(bytes.begin(), bytes.end()));
    Json e = Json::object();
    e["id"] = int64_t(i) + 1;
    e["file_name"] = files[i];
    e["width"] = im.width;
    e["height"] = im.height;
    images.push_back(e);
    for (size_t k = 0; k <= i; ++k) {  // image i has i + 1 boxes
      Json a = Json::object();
      a["id"] = int64_t(anns.size()) + 1;
      a["image_id"] = int64_t(i) + 1;
      a["category_id"] = 1;
      Json bbox = Json::array();
      for (double v : {2.0 * double(k), 4.0, 8.0, 8.0}) bbox.push_back(v);
      a["bbox"] = bbox;
      a["area"] = 64.0;
      a["iscrowd"] = 0;
      anns.push_back(a);
    }
  }
  Json coco = Json::object(), cat = Json::object();
  cat["id"] = 1;
  cat["name"] = "thing";
  coco["images"] = images;
  coco["annotations"] = anns;
  coco["categories"] = Json::array();
  coco["categories"].push_back(cat);
  test::write_bytes(dir + "/instances.json", coco.dump());
  test::write_bytes(dir + "/data.yaml", "path: .\ntrain: {coco: instances.json, images: images}\n");
  for (DataFormat to : {DataFormat::yolo, DataFormat::coco}) {
    const Split out = convert_and_scan(dir + "/data.yaml", to, dir + (to == DataFormat::yolo ? "/yolo" : "/coco"));
    ASSERT_EQ(out.samples.size(), files.size());
    std::set<std::string> names;
    for (const Sample& s : out.samples) {
      names.insert(fs::path(image_name(s)).filename().string());
      EXPECT_EQ(s.boxes.size(), size_t((s.width - 32) / 16 + 1)) << image_name(s);
    }
    EXPECT_EQ(names.size(), files.size());
  }
}

// Records hold the stored image's coordinates (TensorFlow decodes without turning by EXIF);
// samples hold the upright image's. A JPEG stored sideways (orientation 6) goes both ways.
TEST(TfRecord, ExifTurnedImagesKeepTheirBoxesOnTheRightPixels) {
  const std::string dir = test::temp_dir("tfrecord-exif");
  fs::create_directories(dir + "/images");
  fs::create_directories(dir + "/labels");
  Image stored;
  stored.width = 64, stored.height = 32;
  stored.pixels.assign(size_t(64 * 32 * 3), 128);
  const std::vector<uint8_t> jpeg = test::with_orientation(encode_jpeg(stored, 90), 6);  // upright: 32 x 64
  test::write_bytes(dir + "/images/a.jpg", std::string(jpeg.begin(), jpeg.end()));
  test::write_bytes(dir + "/labels/a.txt", "0 0.25 0.375 0.25 0.25\n");  // upright xyxy 0.125 0.25 0.375 0.5
  test::write_bytes(dir + "/data.yaml", "path: .\ntrain: images\nnames: [thing]\n");
  ConvertOptions o;
  o.from = dir + "/data.yaml";
  o.to = DataFormat::tfrecord;
  o.out = dir + "/rec";
  convert_data(o);
  // Stored coordinates: x = upright y, y = 1 - upright x.
  const Split s = scan(dir + "/rec/data.yaml");
  ASSERT_EQ(s.samples.size(), 1u);
  EXPECT_EQ(s.samples[0].width, 32);
  EXPECT_EQ(s.samples[0].height, 64);
  ASSERT_EQ(s.samples[0].boxes.size(), 1u);
  const Box& b = s.samples[0].boxes[0];
  EXPECT_NEAR(b.x1, 0.125, 1e-6);
  EXPECT_NEAR(b.y1, 0.25, 1e-6);
  EXPECT_NEAR(b.x2, 0.375, 1e-6);
  EXPECT_NEAR(b.y2, 0.5, 1e-6);
  const std::string record = data::RecordReader(dir + "/rec/train.record").read(0);
  // The stored xmin (0.25 = upright y1) and ymin (0.625 = 1 - upright x2) are in the record as floats.
  const float xmin = 0.25f, ymin = 0.625f;
  EXPECT_NE(record.find(std::string(reinterpret_cast<const char*>(&xmin), 4)), std::string::npos);
  EXPECT_NE(record.find(std::string(reinterpret_cast<const char*>(&ymin), 4)), std::string::npos);
}

// The whole path: a TFRecord set (sharded, with a label map) converted by the CLI, checked, and
// trained on for 2 steps with validation.
TEST(TfRecord, ATfRecordSetTrainsAndValidates) {
  const std::string dir = test::temp_dir("tfrecord-train");
  test::RunResult r = test::run_trainer("data convert --from " + test::small_synth() + " --to tfrecord --shards 2 --out " + dir +
                                        "/rec --json > " + dir + "/convert.json");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const test::RunResult yolo_shards = test::run_trainer("data convert --from " + test::small_synth() + " --to yolo --shards 4 --out " + dir + "/y");
  EXPECT_EQ(yolo_shards.exit_code, 2) << yolo_shards.output;  // was accepted and ignored
  EXPECT_NE(yolo_shards.output.find("--shards 4 is for --to tfrecord"), std::string::npos) << yolo_shards.output;
  test::write_bytes(dir + "/a-file", "");  // --out naming a file: said so, not a filesystem error
  const test::RunResult onto_file = test::run_trainer("data convert --from " + test::small_synth() + " --to yolo --out " + dir + "/a-file");
  EXPECT_EQ(onto_file.exit_code, 2) << onto_file.output;
  EXPECT_NE(onto_file.output.find(dir + "/a-file: a file is there; give a new folder"), std::string::npos) << onto_file.output;
  const Json summary = Json::parse(test::read_bytes(dir + "/convert.json"), "data convert --json");
  EXPECT_EQ(summary.find("data_yaml")->as_string(), dir + "/rec/data.yaml");
  const int64_t images = int64_t(summary.find("images")->find("train")->as_number() + summary.find("images")->find("val")->as_number());
  EXPECT_EQ(images, 32);  // small_synth's images
  EXPECT_GT(summary.find("boxes")->as_number(), 0);
  r = test::run_trainer("data check --data " + dir + "/rec/data.yaml");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("problems: none"), std::string::npos) << r.output;
  const std::string cfg = dir + "/run.yaml";
  test::write_bytes(cfg, "device: cpu\nthreads: 1\ndata: {dataset: " + dir + "/rec/data.yaml, imgsz: 64, workers: 1, cache: ram}\n"
                         "train: {batch: 4, nominal_batch: 8, plots: false, steps: 2, val_every: 1}\n");
  std::string model;
  for (const auto& o : test::tiny_model("yolov8.yaml")) model += " " + o;
  r = test::run_trainer("train --config " + cfg + " project=" + dir + "/runs name=t" + model);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("AP50-95"), std::string::npos) << r.output;
  EXPECT_TRUE(fs::exists(dir + "/runs/t/results.csv"));

  // --save-json on TFRecords writes the ground truth beside the detections (no COCO file exists
  // for these boxes), and the pair scores as val printed.
  r = test::run_trainer("val --config " + cfg + " --weights " + dir + "/runs/t/weights/last.pt --save-json " + dir +
                        "/results.json --json threads=1");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const double ap = Json::parse(r.output.substr(r.output.find('{')), "stdout").find("AP")->as_number();
  ASSERT_TRUE(fs::exists(dir + "/results_gt.json")) << r.output;
  r = test::run_trainer("val --gt " + dir + "/results_gt.json --results " + dir + "/results.json --json");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NEAR(Json::parse(r.output, "stdout").find("AP")->as_number(), ap, 1e-6);
}
