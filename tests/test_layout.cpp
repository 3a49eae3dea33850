// The layer graph docs/architecture.md draws is the one CMakeLists.txt builds: each layer's
// DEPENDS on other layers, as the document lists them.
#include <gtest/gtest.h>

#include <map>
#include <set>
#include <sstream>
#include <string>

#include "test_util.h"

namespace {

using Graph = std::map<std::string, std::set<std::string>>;  // layer -> the layers it links

std::string without_comments(const std::string& cmake) {
  std::istringstream in(cmake);
  std::string out, line;
  while (std::getline(in, line)) out += line.substr(0, line.find('#')) + "\n";
  return out;
}

// Each `headroom_layer(name ... DEPENDS headroom_x ...)` call: the layers among its DEPENDS;
// headroom_proto (generated code, not a layer) as the links of "proto".
Graph built_graph(const std::string& cmake, std::set<std::string>& proto_users) {
  Graph g;
  const std::string text = without_comments(cmake);
  const std::string call = "\nheadroom_layer(";
  for (size_t at = text.find(call); at != std::string::npos; at = text.find(call, at + 1)) {
    const size_t open = at + call.size(), close = text.find(')', open);
    std::istringstream args(text.substr(open, close - open));
    std::string layer, word;
    args >> layer;
    bool depends = false;
    std::set<std::string>& links = g[layer];
    while (args >> word) {
      if (word == "TORCH" || word == "PLAIN") depends = false;
      if (word == "DEPENDS") depends = true;
      if (depends && word == "headroom_proto")
        proto_users.insert(layer);
      else if (depends && word.rfind("headroom_", 0) == 0)
        links.insert(word.substr(9));
    }
  }
  return g;
}

// The block after "As built:": `name -> a, b` or `name (what it links outside)`.
Graph documented_graph(const std::string& doc) {
  Graph g;
  const size_t start = doc.find("```\n", doc.find("As built:")) + 4;
  std::istringstream in(doc.substr(start, doc.find("```", start) - start));
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream words(line);
    std::string layer, arrow, dep;
    words >> layer >> arrow;
    std::set<std::string>& links = g[layer];
    if (arrow != "->") continue;
    while (words >> dep) links.insert(dep.substr(0, dep.find(',')));
  }
  return g;
}

std::string show(const Graph& g) {
  std::string s;
  for (const auto& [layer, links] : g) {
    s += layer + " ->";
    for (const auto& l : links) s += " " + l;
    s += "\n";
  }
  return s;
}

}  // namespace

TEST(Layout, TheLayerGraphTheArchitectureDrawsIsTheOneCMakeBuilds) {
  const std::string root = HEADROOM_SOURCE_DIR;
  std::set<std::string> proto_users;
  const Graph built = built_graph(headroom::test::read_bytes(root + "/CMakeLists.txt"), proto_users);
  const std::string doc = headroom::test::read_bytes(root + "/docs/architecture.md");
  ASSERT_EQ(built.size(), 11u) << show(built);  // core, dist, data, augment, models, losses, eval, interop, train, memory, cli
  EXPECT_EQ(show(documented_graph(doc)), show(built));
  EXPECT_EQ(proto_users, (std::set<std::string>{"data", "interop", "train"}));
  EXPECT_NE(doc.find("data, interop and train link it"), std::string::npos) << "docs/architecture.md names the layers that link headroom_proto";
}
