// Helpers shared by the tests: temporary folders, a small synthetic data set, file bytes,
// running the trainer binary.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace headroom::test {

// A fresh folder for this test (removed when the test process exits).
std::string temp_dir(const std::string& name);

// A synthetic data set (32 images, 128 px, 4 classes), generated once per test process.
// Returns the YOLO-layout data YAML; data_coco.yaml sits beside it.
const std::string& small_synth();
// A private copy of it that a test may damage.
std::string copy_of_small_synth(const std::string& name);

// Overrides selecting one of our model files (models/<name>) with channels cut to an eighth of
// scale l (YOLO12's a quarter, at most 64: its blocks need 32-channel heads): files with a scales
// table get a scale "t", YOLOv5 files a smaller width multiple.
std::vector<std::string> tiny_model(const std::string& name);

// A JPEG with an APP1 Exif segment holding `orientation`, inserted after its SOI marker.
std::vector<uint8_t> with_orientation(std::vector<uint8_t> jpeg, uint16_t orientation);

// The message of the InputError `f` throws; "" when it throws none.
std::string input_error_of(const std::function<void()>& f);

void write_bytes(const std::string& path, const std::string& bytes);
std::string read_bytes(const std::string& path);

struct RunResult {
  int exit_code = 0;
  std::string output;  // stdout and stderr together
};
// Runs a shell command line.
RunResult run_command(const std::string& command);
// Runs build/trainer with `args` (a shell-quoted string).
RunResult run_trainer(const std::string& args);

}  // namespace headroom::test
