#include "test_util.h"

#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "headroom/core/errors.h"
#include "headroom/core/threads.h"
#include "headroom/data/synth.h"

namespace headroom::test {

namespace fs = std::filesystem;

namespace {

// ctest runs two tests at a time on these two-core machines: one intra-op thread each, or
// OpenMP's spinning threads oversubscribe the cores (an overfit test went from 40 s to 430 s).
[[maybe_unused]] const int g_threads = headroom::set_intra_op_threads(headroom::AutoInt{false, 1});

struct Root {
  fs::path path = fs::temp_directory_path() / ("headroom-test-" + std::to_string(::getpid()));
  ~Root() {
    std::error_code ec;
    if (!std::getenv("HEADROOM_KEEP_TEST_FILES")) fs::remove_all(path, ec);
  }
};

Root& root() {
  static Root r;
  return r;
}

}  // namespace

std::string temp_dir(const std::string& name) {
  static int counter = 0;
  const fs::path p = root().path / (name + "-" + std::to_string(counter++));
  fs::create_directories(p);
  return p.string();
}

const std::string& small_synth() {
  static const std::string yaml = [] {
    data::SynthOptions o;
    o.out = temp_dir("synth");
    o.images = 32;
    o.size = 128;
    o.seed = 7;
    o.classes = 4;
    o.max_objects = 5;
    o.threads = 2;
    return data::synthesize(o).data_yaml;
  }();
  return yaml;
}

std::string copy_of_small_synth(const std::string& name) {
  const fs::path src = fs::path(small_synth()).parent_path();
  const fs::path dst = fs::path(temp_dir(name)) / "data";
  fs::copy(src, dst, fs::copy_options::recursive);
  return (dst / "data.yaml").string();
}

std::vector<std::string> tiny_model(const std::string& name) {
  std::string text = read_bytes(std::string(HEADROOM_SOURCE_DIR) + "/models/" + name);
  const size_t at = text.find("scales:");
  if (at != std::string::npos) {
    // YOLO12's A2C2f needs hidden channels in multiples of 32: a quarter of the width, capped at 64.
    const bool yolo12 = name.rfind("yolo12", 0) == 0;
    text.insert(text.find('\n', at) + 1, yolo12 ? "  t: [0.33, 0.25, 256]\n" : "  t: [0.33, 0.125, 1024]\n");
  } else {
    const size_t w = text.find("width_multiple:");
    text.replace(w, text.find('\n', w) - w, "width_multiple: 0.125");
  }
  const std::string path = temp_dir("tiny") + "/" + name;
  write_bytes(path, text);
  std::vector<std::string> overrides = {"model.file=" + path};
  if (at != std::string::npos) overrides.push_back("model.scale=t");
  return overrides;
}

void write_bytes(const std::string& path, const std::string& bytes) {
  fs::create_directories(fs::path(path).parent_path());
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f << bytes;
}

std::string read_bytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

RunResult run_trainer(const std::string& args) { return run_command(std::string(HEADROOM_TRAINER) + " " + args); }

RunResult run_command(const std::string& command) {
  RunResult r;
  const std::string cmd = command + " 2>&1";
  FILE* p = ::popen(cmd.c_str(), "r");
  if (!p) return {-1, "popen failed"};
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) r.output.append(buf, n);
  const int status = ::pclose(p);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

std::vector<uint8_t> with_orientation(std::vector<uint8_t> jpeg, uint16_t orientation) {
  const std::vector<uint8_t> tiff = {'I', 'I', 42, 0, 8, 0, 0, 0,  // little-endian, IFD at 8
                                     1, 0,                          // one entry
                                     0x12, 0x01, 3, 0, 1, 0, 0, 0,  // orientation, SHORT, count 1
                                     uint8_t(orientation), 0, 0, 0, 0, 0, 0, 0};
  std::vector<uint8_t> seg = {0xFF, 0xE1, 0, 0, 'E', 'x', 'i', 'f', 0, 0};
  seg.insert(seg.end(), tiff.begin(), tiff.end());
  const size_t len = seg.size() - 2;
  seg[2] = uint8_t(len >> 8), seg[3] = uint8_t(len & 0xFF);
  jpeg.insert(jpeg.begin() + 2, seg.begin(), seg.end());
  return jpeg;
}

std::string input_error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const InputError& e) {
    return e.what();
  }
  return "";
}

}  // namespace headroom::test
