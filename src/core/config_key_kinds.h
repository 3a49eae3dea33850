// Internal: the kinds of config key (integer, number, auto-or-integer, flag, string, choice,
// list, augmentation op), each a builder of a ConfigKey that parses its YAML node into a
// Config field with its range and reads it back; config_schema.cpp lists the keys with them.
#pragma once

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include "config_schema.h"
#include "headroom/core/text.h"

namespace headroom::key_kinds {

inline std::string node_kind(const YAML::Node& n) {
  if (n.IsMap()) return "a mapping";
  if (n.IsSequence()) return "a list";
  if (n.IsNull()) return "nothing (null)";
  return "'" + n.Scalar() + "'";
}

inline std::string range_text(int64_t lo, int64_t hi) {
  return std::to_string(lo) + " .. " + std::to_string(hi);
}

inline std::string join(const std::vector<std::string>& v, const char* sep) {
  std::string out;
  for (size_t i = 0; i < v.size(); ++i) out += (i ? sep : "") + v[i];
  return out;
}

// Integer with a range; `multiple` > 1 also requires divisibility (image sizes by the stride).
template <class T, class F>
ConfigKey int_key(std::string path, F field, int64_t lo, int64_t hi, std::string doc,
                  int64_t multiple = 1) {
  std::string allowed = range_text(lo, hi);
  if (multiple > 1) allowed += ", a multiple of " + std::to_string(multiple);
  ConfigKey k{{path, "int", allowed, "", doc}, nullptr, nullptr};
  k.set = [=](Config& c, const YAML::Node& n) -> std::string {
    const auto v = n.IsScalar() ? parse_int(n.Scalar()) : std::nullopt;
    if (!v) return "expected an integer (" + allowed + "), got " + node_kind(n);
    if (*v < lo || *v > hi) return "value " + std::to_string(*v) + " is out of range; allowed: " + allowed;
    if (*v % multiple != 0)
      return std::to_string(*v) + " is not a multiple of " + std::to_string(multiple) + "; allowed: " + allowed;
    field(c) = static_cast<T>(*v);
    return "";
  };
  k.get = [=](const Config& c) { return Json(static_cast<int64_t>(field(const_cast<Config&>(c)))); };
  return k;
}

// Real number with a range; `allow_auto` accepts "auto" stored as -1.
template <class F>
ConfigKey double_key(std::string path, F field, double lo, double hi, std::string doc, bool allow_auto = false) {
  const auto num = [](double v) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%g", v);
    return std::string(buf);
  };
  const std::string allowed = (allow_auto ? "auto or " : "") + num(lo) + " .. " + num(hi);
  ConfigKey k{{path, allow_auto ? "float | auto" : "float", allowed, "", doc}, nullptr, nullptr};
  k.set = [=](Config& c, const YAML::Node& n) -> std::string {
    if (allow_auto && n.IsScalar() && n.Scalar() == "auto") {
      field(c) = -1;
      return "";
    }
    const auto v = n.IsScalar() ? parse_double(n.Scalar()) : std::nullopt;
    if (!v) return "expected a number (" + allowed + "), got " + node_kind(n);
    if (!(*v >= lo && *v <= hi)) return "value " + n.Scalar() + " is out of range; allowed: " + allowed;
    field(c) = *v;
    return "";
  };
  k.get = [=](const Config& c) {
    const double v = field(const_cast<Config&>(c));
    return allow_auto && v < 0 ? Json("auto") : Json(v);
  };
  return k;
}

// Integer or "auto".
template <class F>
ConfigKey auto_int_key(std::string path, F field, int64_t lo, int64_t hi, std::string doc) {
  const std::string allowed = "auto or " + range_text(lo, hi);
  ConfigKey k{{path, "int | auto", allowed, "", doc}, nullptr, nullptr};
  k.set = [=](Config& c, const YAML::Node& n) -> std::string {
    if (n.IsScalar() && n.Scalar() == "auto") {
      field(c) = AutoInt{true, 0};
      return "";
    }
    const auto v = n.IsScalar() ? parse_int(n.Scalar()) : std::nullopt;
    if (!v) return "expected 'auto' or an integer (" + range_text(lo, hi) + "), got " + node_kind(n);
    if (*v < lo || *v > hi)
      return "value " + std::to_string(*v) + " is out of range; allowed: " + allowed;
    field(c) = AutoInt{false, *v};
    return "";
  };
  k.get = [=](const Config& c) {
    const AutoInt& a = field(const_cast<Config&>(c));
    return a.is_auto ? Json("auto") : Json(a.value);
  };
  return k;
}


template <class F>
ConfigKey bool_key(std::string path, F field, std::string doc) {
  ConfigKey k{{path, "bool", "true | false", "", doc}, nullptr, nullptr};
  k.set = [=](Config& c, const YAML::Node& n) -> std::string {
    const std::string s = n.IsScalar() ? to_lower(n.Scalar()) : "";
    if (s == "true" || s == "yes" || s == "on") field(c) = true;
    else if (s == "false" || s == "no" || s == "off") field(c) = false;
    else return "expected true or false, got " + node_kind(n);
    return "";
  };
  k.get = [=](const Config& c) { return Json(static_cast<bool>(field(const_cast<Config&>(c)))); };
  return k;
}

// Free text, optionally checked by `check` (returns the problem or "").
template <class F>
ConfigKey string_key(std::string path, F field, std::string allowed, std::string doc,
                     std::function<std::string(const std::string&)> check = nullptr) {
  ConfigKey k{{path, "string", allowed, "", doc}, nullptr, nullptr};
  k.set = [=](Config& c, const YAML::Node& n) -> std::string {
    if (!n.IsScalar()) return "expected a string (" + allowed + "), got " + node_kind(n);
    if (check) {
      const std::string problem = check(n.Scalar());
      if (!problem.empty()) return problem;
    }
    field(c) = n.Scalar();
    return "";
  };
  k.get = [=](const Config& c) { return Json(field(const_cast<Config&>(c))); };
  return k;
}

// One of a fixed set of words, stored as the word; `aliases` maps other spellings (YAML
// booleans, Ultralytics' capitals) to a word.
template <class F>
ConfigKey choice_key(std::string path, F field, std::vector<std::string> words, std::string doc,
                     std::vector<std::pair<std::string, std::string>> aliases = {}) {
  const std::string allowed = join(words, " | ");
  ConfigKey k{{path, "enum", allowed, "", doc}, nullptr, nullptr};
  k.set = [=](Config& c, const YAML::Node& n) -> std::string {
    if (!n.IsScalar()) return "expected one of " + allowed + ", got " + node_kind(n);
    const std::string s = n.Scalar();
    for (const auto& w : words)
      if (w == s) {
        field(c) = w;
        return "";
      }
    for (const auto& [alias, w] : aliases)
      if (alias == s) {
        field(c) = w;
        return "";
      }
    std::string msg = "'" + s + "' is not allowed; use one of " + allowed;
    const std::string near = nearest_match(s, words);
    if (!near.empty()) msg += " (did you mean '" + near + "'?)";
    return msg;
  };
  k.get = [=](const Config& c) { return Json(field(const_cast<Config&>(c))); };
  return k;
}

// A list of numbers, each in [lo, hi] ("[1000, 5000]"; a single number is a list of one).
template <class T, class F>
ConfigKey list_key(std::string path, F field, double lo, double hi, std::string doc) {
  const auto num = [](double v) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%g", v);
    return std::string(buf);
  };
  const bool integral = std::is_integral<T>::value;
  const std::string allowed = std::string("a list of ") + (integral ? "integers" : "numbers") + " in " + num(lo) + " .. " + num(hi);
  ConfigKey k{{path, integral ? "int list" : "float list", allowed, "", doc}, nullptr, nullptr};
  k.set = [=](Config& c, const YAML::Node& n) -> std::string {
    std::vector<YAML::Node> nodes;
    if (n.IsSequence())
      for (const auto& e : n) nodes.push_back(e);
    else if (n.IsScalar())
      nodes.push_back(n);
    else if (!n.IsNull())
      return "expected " + allowed + ", got " + node_kind(n);
    std::vector<T> out;
    for (const auto& e : nodes) {
      std::optional<double> v;
      if (e.IsScalar()) {
        if (integral) {
          if (const auto i = parse_int(e.Scalar())) v = static_cast<double>(*i);
        } else {
          v = parse_double(e.Scalar());
        }
      }
      if (!v) return "expected " + allowed + ", got the element " + node_kind(e);
      if (!(*v >= lo && *v <= hi)) return "element " + e.Scalar() + " is out of range; allowed: " + allowed;
      out.push_back(static_cast<T>(*v));
    }
    field(c) = out;
    return "";
  };
  k.get = [=](const Config& c) {
    Json a = Json::array();
    for (const T v : field(const_cast<Config&>(c))) a.push_back(Json(static_cast<double>(v)));
    return a;
  };
  return k;
}

// A TF OD API augmentation op (`random_crop_image: {min_area: 0.3}`): absent or false = off;
// true, an empty value or a mapping of its fields = on. The fields are ordinary keys of their
// own (path "augment.<op>.<field>") that this key parses from the mapping.
template <class F>
ConfigKey op_key(std::string path, F enabled, std::vector<ConfigKey> fields, std::string doc) {
  std::vector<std::string> names;
  for (const auto& f : fields) names.push_back(f.info.path.substr(path.size() + 1));
  const std::string allowed = "false | true | {" + join(names, ", ") + "}";
  ConfigKey k{{path, "op", allowed, "", doc}, nullptr, nullptr};
  k.set = [=](Config& c, const YAML::Node& n) -> std::string {
    if (n.IsScalar()) {
      const std::string s = to_lower(n.Scalar());
      if (s == "true" || s == "on" || s == "yes") enabled(c) = true;
      else if (s == "false" || s == "off" || s == "no") enabled(c) = false;
      else return "expected true, false or a mapping of " + join(names, ", ") + ", got " + node_kind(n);
      return "";
    }
    if (!n.IsNull() && !n.IsMap()) return "expected true, false or a mapping of " + join(names, ", ") + ", got " + node_kind(n);
    std::vector<std::string> given;
    if (n.IsMap())
      for (const auto& kv : n) {
        const std::string name = kv.first.IsScalar() ? kv.first.Scalar() : "";
        const auto it = std::find(names.begin(), names.end(), name);
        const std::string line = "line " + std::to_string(kv.first.Mark().line + 1);
        if (std::find(given.begin(), given.end(), name) != given.end()) return name + " (" + line + ") is given twice; keep one";
        given.push_back(name);
        if (it == names.end()) {
          const std::string near = nearest_match(name, names);
          return "unknown field '" + name + "' (" + line + ")" + (near.empty() ? "" : "; did you mean '" + near + "'?") +
                 " Fields: " + join(names, ", ");
        }
        const std::string problem = fields[size_t(it - names.begin())].set(c, kv.second);
        if (!problem.empty()) return name + " (" + line + "): " + problem;
      }
    enabled(c) = true;
    return "";
  };
  k.get = [=](const Config& c) {
    if (!enabled(const_cast<Config&>(c))) return Json(false);
    Json o = Json::object();
    for (size_t i = 0; i < fields.size(); ++i) o[names[i]] = fields[i].get(c);
    return o;
  };
  return k;
}

}  // namespace headroom::key_kinds
