#include "headroom/core/json.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include "headroom/core/errors.h"
#include "headroom/core/files.h"

namespace headroom {

Json Json::array() {
  Json j;
  j.type_ = Type::Array;
  return j;
}

Json Json::object() {
  Json j;
  j.type_ = Type::Object;
  return j;
}

Json Json::object(Members members) {
  Json j = object();
  j.members_ = std::move(members);
  return j;
}

const Json* Json::find(std::string_view key) const {
  for (const auto& [k, v] : members_)
    if (k == key) return &v;
  return nullptr;
}

Json& Json::operator[](const std::string& key) {
  if (type_ == Type::Null) type_ = Type::Object;
  for (auto& [k, v] : members_)
    if (k == key) return v;
  members_.emplace_back(key, Json());
  return members_.back().second;
}

void Json::push_back(Json v) {
  if (type_ == Type::Null) type_ = Type::Array;
  items_.push_back(std::move(v));
}

const char* Json::type_name(Type t) {
  switch (t) {
    case Type::Null: return "null";
    case Type::Bool: return "a boolean";
    case Type::Number: return "a number";
    case Type::String: return "a string";
    case Type::Array: return "an array";
    case Type::Object: return "an object";
  }
  return "?";
}

static void escape_to(std::string& out, const std::string& s) {
  out += '"';
  for (unsigned char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      default:
        if (c < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", c);
          out += buf;
        } else {
          out += static_cast<char>(c);
        }
    }
  }
  out += '"';
}

void Json::dump_to(std::string& out, int indent, int depth) const {
  auto newline = [&](int d) {
    if (indent < 0) return;
    out += '\n';
    out.append(static_cast<size_t>(indent * d), ' ');
  };
  switch (type_) {
    case Type::Null: out += "null"; break;
    case Type::Bool: out += bool_ ? "true" : "false"; break;
    case Type::Number: {
      if (!std::isfinite(number_)) {
        out += "null";  // JSON has no inf/NaN
      } else if (number_ == std::floor(number_) && std::fabs(number_) < 9007199254740992.0) {
        out += std::to_string(static_cast<int64_t>(number_));
      } else {
        // The shortest text that reads back as the same double (state saved in checkpoints
        // must round-trip exactly).
        char buf[32];
        for (int digits = 9; digits <= 17; ++digits) {
          std::snprintf(buf, sizeof buf, "%.*g", digits, number_);
          if (std::strtod(buf, nullptr) == number_) break;
        }
        out += buf;
      }
      break;
    }
    case Type::String: escape_to(out, string_); break;
    case Type::Array:
      out += '[';
      for (size_t i = 0; i < items_.size(); ++i) {
        if (i) out += ',';
        newline(depth + 1);
        items_[i].dump_to(out, indent, depth + 1);
      }
      if (!items_.empty()) newline(depth);
      out += ']';
      break;
    case Type::Object:
      out += '{';
      for (size_t i = 0; i < members_.size(); ++i) {
        if (i) out += ',';
        newline(depth + 1);
        escape_to(out, members_[i].first);
        out += indent < 0 ? ":" : ": ";
        members_[i].second.dump_to(out, indent, depth + 1);
      }
      if (!members_.empty()) newline(depth);
      out += '}';
      break;
  }
}

std::string Json::dump(int indent) const {
  std::string out;
  dump_to(out, indent, 0);
  return out;
}

// Recursive descent over the whole text, tracking line and column for errors.
class JsonParser {
 public:
  JsonParser(std::string_view text, const std::string& source) : s_(text), source_(source) {}

  Json parse_document() {
    skip_ws();
    Json v = parse_value(0);
    skip_ws();
    if (pos_ != s_.size()) fail("unexpected text after the JSON value");
    return v;
  }

 private:
  [[noreturn]] void fail(const std::string& what) const {
    throw InputError(format_location(source_, line_, static_cast<int>(pos_ - line_start_) + 1) +
                     ": invalid JSON: " + what +
                     (pos_ >= s_.size() ? " (the file ends here: truncated?)" : ""));
  }

  void skip_ws() {
    while (pos_ < s_.size()) {
      const char c = s_[pos_];
      if (c == '\n') {
        ++line_;
        line_start_ = ++pos_;
      } else if (c == ' ' || c == '\t' || c == '\r') {
        ++pos_;
      } else {
        break;
      }
    }
  }

  bool consume(char c) {
    if (pos_ < s_.size() && s_[pos_] == c) {
      ++pos_;
      return true;
    }
    return false;
  }

  void expect_word(std::string_view w) {
    if (s_.substr(pos_, w.size()) != w) fail("expected '" + std::string(w) + "'");
    pos_ += w.size();
  }

  Json parse_value(int depth) {
    if (depth > 512) fail("nesting deeper than 512 levels");
    if (pos_ >= s_.size()) fail("unexpected end of file (the file may be truncated)");
    const int line = line_;
    Json v;
    switch (s_[pos_]) {
      case '{': v = parse_object(depth); break;
      case '[': v = parse_array(depth); break;
      case '"': v = Json(parse_string()); break;
      case 't': expect_word("true"); v = Json(true); break;
      case 'f': expect_word("false"); v = Json(false); break;
      case 'n': expect_word("null"); break;
      default: v = Json(parse_number()); break;
    }
    v.line_ = line;
    return v;
  }

  Json parse_object(int depth) {
    Json obj = Json::object();
    ++pos_;
    skip_ws();
    if (consume('}')) return obj;
    while (true) {
      skip_ws();
      if (pos_ >= s_.size() || s_[pos_] != '"') fail("expected a string key");
      std::string key = parse_string();
      skip_ws();
      if (!consume(':')) fail("expected ':' after key \"" + key + "\"");
      skip_ws();
      Json value = parse_value(depth + 1);
      obj.members_.emplace_back(std::move(key), std::move(value));
      skip_ws();
      if (consume(',')) continue;
      if (consume('}')) return obj;
      fail(pos_ >= s_.size() ? "unexpected end of file inside an object (truncated?)"
                             : "expected ',' or '}' in an object");
    }
  }

  Json parse_array(int depth) {
    Json arr = Json::array();
    ++pos_;
    skip_ws();
    if (consume(']')) return arr;
    while (true) {
      skip_ws();
      arr.items_.push_back(parse_value(depth + 1));
      skip_ws();
      if (consume(',')) continue;
      if (consume(']')) return arr;
      fail(pos_ >= s_.size() ? "unexpected end of file inside an array (truncated?)"
                             : "expected ',' or ']' in an array");
    }
  }

  static void append_utf8(std::string& out, uint32_t cp) {
    if (cp < 0x80) {
      out += static_cast<char>(cp);
    } else if (cp < 0x800) {
      out += static_cast<char>(0xC0 | (cp >> 6));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
      out += static_cast<char>(0xE0 | (cp >> 12));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    } else {
      out += static_cast<char>(0xF0 | (cp >> 18));
      out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    }
  }

  uint32_t parse_hex4() {
    if (pos_ + 4 > s_.size()) fail("truncated \\u escape");
    uint32_t v = 0;
    for (int i = 0; i < 4; ++i) {
      const char c = s_[pos_++];
      v <<= 4;
      if (c >= '0' && c <= '9') v |= static_cast<uint32_t>(c - '0');
      else if (c >= 'a' && c <= 'f') v |= static_cast<uint32_t>(c - 'a' + 10);
      else if (c >= 'A' && c <= 'F') v |= static_cast<uint32_t>(c - 'A' + 10);
      else fail("bad hex digit in \\u escape");
    }
    return v;
  }

  std::string parse_string() {
    ++pos_;  // opening quote
    std::string out;
    while (true) {
      if (pos_ >= s_.size()) fail("unterminated string (truncated file?)");
      const char c = s_[pos_++];
      if (c == '"') return out;
      if (c == '\n') fail("newline inside a string");
      if (c != '\\') {
        out += c;
        continue;
      }
      if (pos_ >= s_.size()) fail("unterminated escape");
      const char e = s_[pos_++];
      switch (e) {
        case '"': out += '"'; break;
        case '\\': out += '\\'; break;
        case '/': out += '/'; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'n': out += '\n'; break;
        case 'r': out += '\r'; break;
        case 't': out += '\t'; break;
        case 'u': {
          uint32_t cp = parse_hex4();
          if (cp >= 0xD800 && cp < 0xDC00 && s_.substr(pos_, 2) == "\\u") {
            pos_ += 2;
            const uint32_t lo = parse_hex4();
            cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
          }
          append_utf8(out, cp);
          break;
        }
        default: fail(std::string("unknown escape \\") + e);
      }
    }
  }

  double parse_number() {
    const size_t start = pos_;
    if (pos_ < s_.size() && (s_[pos_] == '-' || s_[pos_] == '+')) ++pos_;
    while (pos_ < s_.size() && (std::isdigit(static_cast<unsigned char>(s_[pos_])) ||
                                s_[pos_] == '.' || s_[pos_] == 'e' || s_[pos_] == 'E' ||
                                s_[pos_] == '-' || s_[pos_] == '+'))
      ++pos_;
    if (pos_ == start) fail(std::string("unexpected character '") + s_[pos_] + "'");
    const std::string text(s_.substr(start, pos_ - start));
    char* end = nullptr;
    const double v = std::strtod(text.c_str(), &end);
    if (end != text.c_str() + text.size()) {
      pos_ = start;
      fail("malformed number '" + text + "'");
    }
    return v;
  }

  std::string_view s_;
  const std::string& source_;
  size_t pos_ = 0;
  int line_ = 1;
  size_t line_start_ = 0;
};

Json Json::parse(std::string_view text, const std::string& source) {
  return JsonParser(text, source).parse_document();
}

Json read_json_file(const std::string& path) {
  const std::string text = read_file(path);
  if (text.empty()) throw InputError(path + ": the file is empty; expected JSON");
  return Json::parse(text, path);
}

}  // namespace headroom
