// TFRecord data sets as the TF Object Detection API writes them: tf.train.Example records (one
// image and its objects each) in one file or several shards, class ids from a label_map.pbtxt.
// Scanned into Samples like the other formats; each sample keeps its record's offset so the
// loader's threads read it at random. Written back the same way (`trainer data convert`).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "headroom/data/record_file.h"
#include "headroom/data/dataset.h"

namespace headroom::data {

// One entry of a label map. The OD API reserves id 0 for the background: classes start at 1.
struct LabelMapItem {
  int id = 0;
  std::string name;
  std::string display_name;
  std::string where;  // file:line
};

// Parses a label_map.pbtxt (protobuf text format). InputError with file:line:column for a syntax
// error or an unknown field, and for ids below 1 (0 only as "background") or repeated.
std::vector<LabelMapItem> read_label_map(const std::string& path);
// The text of a label map with ids 1..n for `names`.
std::string label_map_text(const std::vector<std::string>& names);

// How a split's examples map onto Headroom's contiguous classes 0..nc-1: label map items in id
// order (a class is named by display_name when set, else name), or the data YAML's names as
// ids 1..nc when there is no label map.
struct RecordClasses {
  std::vector<std::string> names;
  std::vector<int> ids;          // label map id of each class
  bool by_text = false;          // a label map is given: image/object/class/text decides first
  std::vector<std::string> texts;  // with by_text: name and display_name of each class, 2 per class
};
RecordClasses record_classes(const DataSpec& spec);

// The files a TFRecord entry names: a file, a glob (*, ?, [...]) or a sharded name
// (train.record-?????-of-00010, every shard required). Sorted. InputError at `where` when none.
std::vector<std::string> record_files(const std::string& pattern, const std::string& where);

// True for entries that name TFRecord data: .record / .tfrecord / .tfrecords, optionally sharded.
bool looks_like_records(const std::string& path);

struct RecordScan {
  std::vector<Sample> samples;  // usable or not, in file and record order
  std::vector<bool> skipped;    // per sample: a problem skips it
  std::vector<Problem> problems;
};

// Reads every record of the split's files (threads over records, from each file's index), decodes
// its Example, maps its classes and checks its image like an image file's. A record that cannot
// be read (bad CRC, torn, not an Example) is a problem naming the file and byte offset; framing
// lost in a file (bad length CRC) ends that file's records there.
RecordScan scan_records(const SplitSource& source, const RecordClasses& classes, const ScanOptions& o);

// The record spans of one file, from `.<file>.index` beside it when that was written for this file
// (its size and modification time), else read from the headers and written there for next time
// (skipped without a word where the folder is read-only). `error` receives a framing problem.
std::vector<RecordSpan> record_index(const std::string& file, std::string* error);

// The encoded image of a TFRecord sample (image/encoded of its record).
std::string read_record_image(const std::string& file, int64_t offset);

// Writes a split as OD API examples into `shards` files named like the OD API's sharded outputs
// (`out`-00000-of-00004; `out` itself when shards is 1), boxes as the stored image's normalised
// coordinates, class ids 1..nc with their names as class/text.
void write_records(const Split& split, const std::string& out, int shards);

}  // namespace headroom::data
