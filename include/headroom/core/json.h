// A small JSON value: parsed with line numbers (so a bad COCO annotation can be reported as
// file:line), and written for `--json` reports and COCO outputs.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace headroom {

class Json {
 public:
  enum class Type { Null, Bool, Number, String, Array, Object };
  using Members = std::vector<std::pair<std::string, Json>>;

  Json() = default;
  Json(std::nullptr_t) {}
  Json(bool b) : type_(Type::Bool), bool_(b) {}
  Json(int v) : Json(static_cast<double>(v)) {}
  Json(int64_t v) : Json(static_cast<double>(v)) {}
  Json(uint64_t v) : Json(static_cast<double>(v)) {}
  Json(double v) : type_(Type::Number), number_(v) {}
  Json(const char* s) : type_(Type::String), string_(s) {}
  Json(std::string s) : type_(Type::String), string_(std::move(s)) {}
  static Json array();
  static Json object();
  // An object with these members, in order: a struct's fields listed once, as one value
  // (Json::object({{"epoch", s.epoch}, {"step", s.step}})).
  static Json object(Members members);

  Type type() const { return type_; }
  bool is_null() const { return type_ == Type::Null; }
  bool is_bool() const { return type_ == Type::Bool; }
  bool is_number() const { return type_ == Type::Number; }
  bool is_string() const { return type_ == Type::String; }
  bool is_array() const { return type_ == Type::Array; }
  bool is_object() const { return type_ == Type::Object; }

  bool as_bool() const { return bool_; }
  double as_number() const { return number_; }
  const std::string& as_string() const { return string_; }
  const std::vector<Json>& items() const { return items_; }
  const Members& members() const { return members_; }

  // Object access. find() returns nullptr when absent; operator[] inserts (building output).
  const Json* find(std::string_view key) const;
  Json& operator[](const std::string& key);
  void push_back(Json v);
  size_t size() const { return type_ == Type::Array ? items_.size() : members_.size(); }

  // 1-based line where a parsed value starts; 0 for values built in code.
  int line() const { return line_; }

  // Compact when indent < 0, else pretty-printed with that many spaces per level.
  std::string dump(int indent = -1) const;

  // Throws InputError "source:line:column: what" on malformed text.
  static Json parse(std::string_view text, const std::string& source);

  static const char* type_name(Type t);

 private:
  friend class JsonParser;
  void dump_to(std::string& out, int indent, int depth) const;

  Type type_ = Type::Null;
  bool bool_ = false;
  double number_ = 0;
  std::string string_;
  std::vector<Json> items_;
  Members members_;
  int line_ = 0;
};

// Reads and parses a whole file; errors name the file.
Json read_json_file(const std::string& path);

}  // namespace headroom
