// Output paths a command is given, held against its inputs: writing one over an input (the
// config, the data set's files) would lose it.
#include <algorithm>
#include <filesystem>

#include "commands.h"
#include "headroom/core/files.h"
#include "headroom/data/dataset.h"

namespace headroom::cli {

namespace fs = std::filesystem;

namespace {

// The path with links resolved where it exists (weakly_canonical), else only made absolute.
fs::path resolved(const std::string& p) {
  std::error_code ec;
  const fs::path absolute = fs::absolute(p, ec);
  if (ec) return fs::path(p).lexically_normal();
  const fs::path r = fs::weakly_canonical(absolute, ec);
  return ec ? absolute.lexically_normal() : r;
}

bool inside(const fs::path& p, const fs::path& dir) {
  const auto m = std::mismatch(dir.begin(), dir.end(), p.begin(), p.end());
  return m.first == dir.end() && m.second != p.end();
}

}  // namespace

void check_output_path(const std::string& out, const std::string& flag, const std::string& config_path, const Config& c,
                       const data::Split* split) {
  check_output_file(out);
  const fs::path o = resolved(out), lexical = fs::absolute(out).lexically_normal();
  const auto refuse = [&](const std::string& what) {
    throw InputError(flag + " " + out + " is " + what + ", an input of this command: writing there would replace it; give another path");
  };
  if (!config_path.empty() && o == resolved(config_path)) refuse("the config " + config_path);
  if (!c.data.dataset.empty() && o == resolved(c.data.dataset)) refuse("the data YAML " + c.data.dataset);
  if (!split) return;
  const std::string of = " of split '" + split->name + "'";
  if (!split->source.annotations.empty() && o == resolved(split->source.annotations))
    refuse("the COCO annotations " + split->source.annotations + of);
  for (const data::Sample& s : split->samples)  // paths as the scan wrote them: no file system call each
    for (const std::string* file : {&s.image, &s.labels})
      if (!file->empty() && (lexical == fs::path(*file).lexically_normal() || lexical == fs::absolute(*file).lexically_normal()))
        refuse((file == &s.image ? "the image " : "the label file ") + *file + of);
  for (const std::string& entry : split->source.images) {
    const fs::path e = resolved(entry);
    if (o == e) refuse(entry + ", the image list or record file" + of);
    // A YOLO folder is scanned for image names: an image written there would be trained on.
    std::error_code ec;
    if (split->source.format == data::SplitSource::Format::yolo && data::is_image_name(out) && fs::is_directory(e, ec) && inside(o, e))
      throw InputError(flag + " " + out + " is inside " + entry + ", an image folder" + of + ": the next scan would list the image as " +
                       "one of its own; give a path outside it");
  }
}

}  // namespace headroom::cli
