#include "headroom/core/yaml_file.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <vector>

#include "headroom/core/errors.h"
#include "headroom/core/files.h"
#include "headroom/core/text.h"

namespace headroom {

std::string yaml_location(const std::string& file, const YAML::Mark& mark) {
  return format_location(file, mark.line + 1, mark.column + 1);
}

YAML::Node load_yaml_file(const std::string& path, const std::string& what) {
  if (std::filesystem::is_directory(path)) throw InputError(path + ": a folder, not the " + what + " (give the YAML file in it)");
  std::string text;
  try {
    text = read_file(path);  // once: a pipe read again would be empty
  } catch (const InputError&) {
    throw InputError(path + ": cannot open the " + what + " (does it exist, is it readable?)");
  }
  // Names and paths go on into JSON, ONNX metadata and file names, which are UTF-8: a file
  // saved in Latin-1 would carry its bytes into every one of them.
  if (const std::optional<size_t> bad = invalid_utf8_at(text)) {
    const size_t line_start = text.rfind('\n', *bad == 0 ? 0 : *bad - 1);
    const size_t line = size_t(std::count(text.begin(), text.begin() + long(*bad), '\n')) + 1;
    const size_t column = *bad - (line_start == std::string::npos || *bad == 0 ? 0 : line_start + 1) + 1;
    char byte[8];
    std::snprintf(byte, sizeof byte, "0x%02X", unsigned(uint8_t(text[*bad])));
    throw InputError(format_location(path, int(line), int(column)) + ": the " + what + " is not UTF-8 text (byte " + byte +
                     "; Latin-1 or another legacy encoding?): save it as UTF-8");
  }
  try {
    // Several documents (a second after ---) would leave all but the first unread.
    std::vector<YAML::Node> docs = YAML::LoadAll(text);
    // A trailing --- opens an empty (null) document: only documents with content count.
    docs.erase(std::remove_if(docs.begin() + (docs.empty() ? 0 : 1), docs.end(), [](const YAML::Node& d) { return d.IsNull(); }), docs.end());
    if (docs.size() > 1)
      throw InputError(path + ": holds " + std::to_string(docs.size()) + " YAML documents (a '---' or '...' line ends one); the " + what +
                       " is one document, and the others would go unread: merge them into the first");
    return docs.empty() ? YAML::Node() : docs.front();
  } catch (const YAML::ParserException& e) {
    throw InputError(yaml_location(path, e.mark) + ": YAML syntax error: " + e.msg);
  }
}

}  // namespace headroom
