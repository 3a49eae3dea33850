#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <set>
#include <vector>

#include "headroom/core/config.h"
#include "headroom/core/errors.h"
#include "headroom/interop/pipeline_config.h"
#include "test_util.h"

using namespace headroom;

namespace {

std::string write_config(const std::string& text) {
  const std::string path = test::temp_dir("cfg") + "/c.yaml";
  test::write_bytes(path, text);
  return path;
}

// The message of the InputError that loading throws.
std::string load_error(const std::string& path, const std::vector<std::string>& overrides = {}) {
  try {
    load_config(path, overrides);
  } catch (const InputError& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST(Config, DefaultsWithoutFile) {
  const Config c = load_config("");
  EXPECT_EQ(c.train.batch, 16);
  EXPECT_EQ(c.data.imgsz, 640);
  EXPECT_TRUE(c.data.workers.is_auto);
  EXPECT_EQ(c.data.cache, "none");
  EXPECT_EQ(c.device, "auto");
  EXPECT_EQ(c.where("train.batch"), "default train.batch");
}

TEST(Config, ReadsSectionsAndRecordsOrigins) {
  const std::string path = write_config("name: run1\ndevice: cpu\ntrain:\n  batch: 4\ndata:\n  workers: 3\n  cache: disk\n  imgsz: 320\n");
  const Config c = load_config(path);
  EXPECT_EQ(c.name, "run1");
  EXPECT_EQ(c.train.batch, 4);
  EXPECT_FALSE(c.data.workers.is_auto);
  EXPECT_EQ(c.data.workers.value, 3);
  EXPECT_EQ(c.data.cache, "disk");
  EXPECT_EQ(c.data.imgsz, 320);
  EXPECT_EQ(c.where("train.batch"), path + ":4:3");
}

TEST(Config, UnknownKeyNamesLineColumnAndNearestKey) {
  const std::string path = write_config("train:\n  bach_size: 8\n");
  const std::string err = load_error(path);
  EXPECT_NE(err.find(path + ":2:3: train.bach_size: unknown key; did you mean train.batch?"), std::string::npos) << err;
}

TEST(Config, KeyInTheWrongSectionIsFound) {
  const std::string err = load_error(write_config("batch: 8\n"));
  EXPECT_NE(err.find("did you mean train.batch?"), std::string::npos) << err;
}

TEST(Config, WrongTypeAndRangeNameTheAllowedValues) {
  const std::string path = write_config("train:\n  batch: lots\ndata:\n  imgsz: 100000\n  cache: rma\n  workers: -1\n");
  const std::string err = load_error(path);
  EXPECT_NE(err.find("4 problems"), std::string::npos) << err;
  EXPECT_NE(err.find(path + ":2:3: train.batch: expected 'auto' or an integer (1 .. 65536), got 'lots'"), std::string::npos) << err;
  EXPECT_NE(err.find(path + ":4:3: data.imgsz: value 100000 is out of range; allowed: 32 .. 8192"), std::string::npos) << err;
  EXPECT_NE(err.find("data.cache: 'rma' is not allowed; use one of none | ram | disk (did you mean 'ram'?)"), std::string::npos) << err;
  EXPECT_NE(err.find("data.workers: value -1 is out of range; allowed: auto or 0 .. 256"), std::string::npos) << err;
}

TEST(Config, ImageSizeMustBeAMultipleOf32) {
  const std::string err = load_error("", {"data.imgsz=500"});
  EXPECT_NE(err.find("500 is not a multiple of 32"), std::string::npos) << err;
}

TEST(Config, OverridesApplyAfterTheFileAndAreValidatedTheSameWay) {
  const std::string path = write_config("train:\n  batch: 4\n");
  const Config c = load_config(path, {"train.batch=16", "data.workers=4", "data.cache=ram"});
  EXPECT_EQ(c.train.batch, 16);
  EXPECT_EQ(c.data.workers.value, 4);
  EXPECT_EQ(c.data.cache, "ram");
  EXPECT_EQ(c.where("train.batch"), "command line 'train.batch=16'");

  const std::string err = load_error(path, {"train.bach=3", "train.batch=0", "nonsense"});
  EXPECT_NE(err.find("command line 'train.bach=3': train.bach: unknown key; did you mean train.batch?"), std::string::npos) << err;
  EXPECT_NE(err.find("command line 'train.batch=0': train.batch: value 0 is out of range"), std::string::npos) << err;
  EXPECT_NE(err.find("command line 'nonsense': expected key=value"), std::string::npos) << err;
}

TEST(Config, UltralyticsCacheBooleansMeanRamAndNone) {
  EXPECT_EQ(load_config("", {"data.cache=true"}).data.cache, "ram");
  EXPECT_EQ(load_config("", {"data.cache=false"}).data.cache, "none");
}

TEST(Config, SectionsAreNotValues) {
  const std::string err = load_error(write_config("train: 3\n"));
  EXPECT_NE(err.find("train is a section, not a value; set its keys: train.batch"), std::string::npos) << err;
}

TEST(Config, DuplicateKeysAreReported) {
  const std::string path = write_config("train:\n  batch: 2\n  batch: 3\n");
  const std::string err = load_error(path);
  EXPECT_NE(err.find("train.batch: given twice (first at " + path + ":2:3)"), std::string::npos) << err;
}

TEST(Config, SyntaxErrorsAndMissingFiles) {
  const std::string path = write_config("train: [1\n");
  EXPECT_NE(load_error(path).find(path + ":"), std::string::npos);
  EXPECT_NE(load_error(path).find("YAML syntax error"), std::string::npos);
  EXPECT_NE(load_error("/nonexistent/c.yaml").find("/nonexistent/c.yaml: cannot open the config file"), std::string::npos);
  EXPECT_NE(load_error(write_config("- a\n- b\n")).find("must be a mapping"), std::string::npos);
  // A second document after --- went unread: its keys were silently dropped.
  const std::string two = write_config("train:\n  batch: 2\n---\ntrain:\n  epochs: 3\n");
  EXPECT_NE(load_error(two).find(two + ": holds 2 YAML documents"), std::string::npos) << load_error(two);
  EXPECT_EQ(load_config(write_config("---\ntrain:\n  batch: 2\n")).train.batch, 2);  // one document, marked
  EXPECT_EQ(load_config(write_config("train:\n  batch: 2\n---\n")).train.batch, 2);    // a trailing --- opens an empty one
}

// A config given through a pipe (bash's <(...)) is read once: sniffed as a TF pipeline.config
// first, it was then parsed from an empty pipe and the defaults ran.
TEST(Config, AConfigReadFromAPipeIsReadOnce) {
  int fds[2];
  ASSERT_EQ(::pipe(fds), 0);
  const std::string text = "train:\n  batch: 3\n";
  ASSERT_EQ(::write(fds[1], text.data(), text.size()), ssize_t(text.size()));
  ::close(fds[1]);
  const std::string path = "/dev/fd/" + std::to_string(fds[0]);
  const Config c = interop::load_config_file(path);
  ::close(fds[0]);
  EXPECT_EQ(c.train.batch, 3);
}

TEST(Config, DeviceAndNamesAreChecked) {
  EXPECT_NE(load_error("", {"device=gpu"}).find("'gpu' is not a device"), std::string::npos);
  EXPECT_EQ(load_config("", {"device=cuda:1"}).device, "cuda:1");
  EXPECT_NE(load_error("", {"name=a/b"}).find("not a run name"), std::string::npos);
  EXPECT_NE(load_error("", {"log.level=loud"}).find("not a log level"), std::string::npos);
}

TEST(Config, DatasetMustExist) {
  const std::string path = write_config("data:\n  dataset: /nonexistent/data.yaml\n");
  const std::string err = load_error(path);
  EXPECT_NE(err.find(path + ":2:3: data.dataset: '/nonexistent/data.yaml' is not a file"), std::string::npos) << err;
}

TEST(Config, ResolvedYamlReadsBackUnchanged) {
  const Config c = load_config("", {"train.batch=3", "data.workers=0", "data.cache=disk", "name=x y", "seed=99",
                                    "loss.min_overlap=0.65", "loss.box=auto", "eval.iou=0.55"});
  const std::string yaml = config_to_yaml(c);
  const Config back = load_config(write_config(yaml));
  EXPECT_EQ(config_to_yaml(back), yaml);
  EXPECT_EQ(back.name, "x y");
  EXPECT_EQ(back.data.workers.value, 0);
  EXPECT_DOUBLE_EQ(back.loss.min_overlap, 0.65);
  EXPECT_DOUBLE_EQ(back.loss.box, -1);
  EXPECT_DOUBLE_EQ(back.eval.iou, 0.55);
  EXPECT_EQ(config_to_json(back).dump(), config_to_json(c).dump());
  EXPECT_EQ(config_to_json(c).find("train")->find("batch")->as_number(), 3);
}

TEST(Config, EveryKeyIsDocumentedWithItsDefault) {
  const std::string doc = test::read_bytes(std::string(HEADROOM_SOURCE_DIR) + "/docs/config.md");
  ASSERT_FALSE(doc.empty());
  for (const ConfigKeyInfo& k : config_keys()) {
    const std::string row = "| `" + k.path + "` |";
    const size_t at = doc.find(row);
    ASSERT_NE(at, std::string::npos) << k.path << " is missing from docs/config.md";
    const std::string line = doc.substr(at, doc.find('\n', at) - at);
    // Its columns: key, type, default, allowed, meaning. The default is the cell itself; the allowed
    // values are the schema's (its " | " written ", "), maybe followed by a note.
    std::vector<std::string> cells;
    for (size_t from = 2, bar; cells.size() < 4 && (bar = line.find(" | ", from)) != std::string::npos; from = bar + 3)
      cells.push_back(line.substr(from, bar - from));
    ASSERT_EQ(cells.size(), 4u) << line;
    const std::string shown = k.default_text.empty() ? "`\"\"`" : "`" + k.default_text + "`";
    EXPECT_EQ(cells[2], shown) << k.path << ": docs/config.md gives the default " << cells[2];
    // One notation for both: " | " and " or " as ", ", 1e+06 as 1e6, 1048576 and above as 2^20.
    const auto notation = [](std::string a) {
      for (const auto& [from, to] : std::vector<std::pair<std::string, std::string>>{{" | ", ", "}, {" or ", ", "}, {"e+0", "e"}, {"e+", "e"}})
        for (size_t at; (at = a.find(from)) != std::string::npos;) a.replace(at, from.size(), to);
      for (int p = 62; p >= 20; --p) {
        const std::string n = std::to_string(int64_t{1} << p);
        for (size_t at; (at = a.find(n)) != std::string::npos;) a.replace(at, n.size(), "2^" + std::to_string(p));
      }
      return a;
    };
    const std::string allowed = notation(k.allowed), documented = notation(cells[3]);
    EXPECT_EQ(documented.rfind(allowed, 0), 0u) << k.path << ": docs/config.md allows '" << cells[3] << "', the schema '" << k.allowed << "'";
  }
  // And every key the table documents is one: a row left behind by a renamed key is a lie.
  std::set<std::string> keys;
  for (const ConfigKeyInfo& k : config_keys()) keys.insert(k.path);
  for (size_t at = doc.find("\n| `"); at != std::string::npos; at = doc.find("\n| `", at + 1)) {
    const size_t start = at + 4, end = doc.find('`', start);
    const std::string key = doc.substr(start, end - start);
    EXPECT_TRUE(keys.count(key)) << "docs/config.md documents " << key << ", which is not a config key";
  }
}
