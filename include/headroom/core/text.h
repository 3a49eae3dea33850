// Small string utilities shared by config, data parsing and reports.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <utility>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace headroom {

std::string_view trim(std::string_view s);
std::vector<std::string_view> split_whitespace(std::string_view s);
std::string to_lower(std::string_view s);
bool ends_with(std::string_view s, std::string_view suffix);
// Up to the first newline (an exception's message without its backtrace).
std::string first_line(std::string_view s);
// `s` without a leading UTF-8 byte-order mark (Windows editors write one; protobuf's text
// parser refuses it).
std::string without_bom(std::string s);
// The offset of the first byte that is not well-formed UTF-8 (a Latin-1 é, a cut sequence, an
// overlong or surrogate form); nullopt when the whole text is UTF-8.
std::optional<size_t> invalid_utf8_at(std::string_view s);
// InputError "where: class name 'caf?' is not UTF-8 text (byte 0xE9 ...)" for a class name that
// would go into JSON and ONNX metadata as invalid UTF-8 (file paths are bytes and are left alone).
void check_class_name_utf8(const std::string& name, const std::string& where);
// `s` with every `from` replaced by `to`.
std::string replace_all(std::string s, std::string_view from, std::string_view to);

// Strict number parsing: the whole (trimmed) text must be the number.
std::optional<int64_t> parse_int(std::string_view s);
std::optional<double> parse_double(std::string_view s);

// Edit distance, for "did you mean" suggestions.
size_t edit_distance(std::string_view a, std::string_view b);
// The candidate closest to `word`, or "" when none is plausibly what was meant.
std::string nearest_match(std::string_view word, const std::vector<std::string>& candidates);

// "8GiB", "512 MiB", "8GB" (decimal), "8e9" (bytes); nullopt when it is not a size.
std::optional<double> parse_bytes(std::string_view s);

// "1.5 GiB", "512 B": binary units, 3 significant digits.
std::string format_bytes(double bytes);

// A subsystem's enum and its config words, in one table per enum ({"ram", CacheMode::ram}, ...).
// The schema has already checked the word, so an unknown one is a bug (std::logic_error).
template <class E, size_t N>
E enum_from_word(const std::string& word, const std::pair<const char*, E> (&table)[N]) {
  for (const auto& [w, e] : table)
    if (word == w) return e;
  throw std::logic_error("unknown word '" + word + "' for this setting");
}
template <class E, size_t N>
const char* enum_word(E e, const std::pair<const char*, E> (&table)[N]) {
  for (const auto& [w, v] : table)
    if (v == e) return w;
  return "?";
}

}  // namespace headroom
