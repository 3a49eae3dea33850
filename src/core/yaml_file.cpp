#include "headroom/core/yaml_file.h"

#include <algorithm>
#include <filesystem>
#include <vector>

#include "headroom/core/errors.h"
#include "headroom/core/files.h"

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
