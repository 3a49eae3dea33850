#include "headroom/core/text.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>

#include "headroom/core/errors.h"

namespace headroom {

std::string_view trim(std::string_view s) {
  const char* ws = " \t\r\n\f\v";
  const size_t b = s.find_first_not_of(ws);
  if (b == std::string_view::npos) return {};
  const size_t e = s.find_last_not_of(ws);
  return s.substr(b, e - b + 1);
}

std::vector<std::string_view> split_whitespace(std::string_view s) {
  std::vector<std::string_view> out;
  size_t i = 0;
  while (i < s.size()) {
    while (i < s.size() && std::isspace(static_cast<unsigned char>(s[i]))) ++i;
    size_t j = i;
    while (j < s.size() && !std::isspace(static_cast<unsigned char>(s[j]))) ++j;
    if (j > i) out.push_back(s.substr(i, j - i));
    i = j;
  }
  return out;
}

std::string to_lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

std::string first_line(std::string_view s) { return std::string(s.substr(0, s.find('\n'))); }

std::optional<size_t> invalid_utf8_at(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    const auto c = uint8_t(s[i]);
    // The sequence length and the range of its second byte (RFC 3629's table).
    size_t n = 0;
    uint8_t lo = 0x80, hi = 0xBF;
    if (c < 0x80) n = 1;
    else if (c >= 0xC2 && c <= 0xDF) n = 2;
    else if (c == 0xE0) n = 3, lo = 0xA0;
    else if (c >= 0xE1 && c <= 0xEC) n = 3;
    else if (c == 0xED) n = 3, hi = 0x9F;
    else if (c >= 0xEE && c <= 0xEF) n = 3;
    else if (c == 0xF0) n = 4, lo = 0x90;
    else if (c >= 0xF1 && c <= 0xF3) n = 4;
    else if (c == 0xF4) n = 4, hi = 0x8F;
    else return i;
    if (i + n > s.size()) return i;
    for (size_t k = 1; k < n; ++k) {
      const auto b = uint8_t(s[i + k]);
      if (b < (k == 1 ? lo : 0x80) || b > (k == 1 ? hi : 0xBF)) return i;
    }
    i += n;
  }
  return std::nullopt;
}

void check_class_name_utf8(const std::string& name, const std::string& where) {
  const std::optional<size_t> bad = invalid_utf8_at(name);
  if (!bad) return;
  char byte[8];
  std::snprintf(byte, sizeof byte, "0x%02X", unsigned(uint8_t(name[*bad])));
  std::string shown = name;  // printable in the message, whatever the terminal's encoding
  for (char& c : shown)
    if (uint8_t(c) >= 0x80) c = '?';
  throw InputError(where + ": class name '" + shown + "' is not UTF-8 text (byte " + byte +
                   "; saved in Latin-1 or another legacy encoding?): results, COCO JSON and ONNX metadata carry names as UTF-8; "
                   "save the file as UTF-8");
}

std::string without_bom(std::string s) {
  if (s.compare(0, 3, "\xEF\xBB\xBF") == 0) s.erase(0, 3);
  return s;
}

std::string replace_all(std::string s, std::string_view from, std::string_view to) {
  if (from.empty()) return s;
  for (size_t at = s.find(from); at != std::string::npos; at = s.find(from, at + to.size())) s.replace(at, from.size(), to);
  return s;
}

bool ends_with(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

template <class T>
static std::optional<T> parse_whole(std::string_view s) {
  s = trim(s);
  if (!s.empty() && s.front() == '+') s.remove_prefix(1);
  T v{};
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || p != s.data() + s.size() || s.empty()) return std::nullopt;
  return v;
}

std::optional<int64_t> parse_int(std::string_view s) { return parse_whole<int64_t>(s); }
std::optional<double> parse_double(std::string_view s) { return parse_whole<double>(s); }

size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t sub = prev[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1);
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, sub});
    }
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

std::string nearest_match(std::string_view word, const std::vector<std::string>& candidates) {
  std::string best;
  size_t best_d = SIZE_MAX;
  for (const auto& c : candidates) {
    // Extra trailing characters count little, so "train.batch_size" finds "train.batch".
    const size_t d = std::min(edit_distance(word, c), edit_distance(word.substr(0, c.size()), c) + 1);
    if (d < best_d) best_d = d, best = c;
  }
  // Accept up to about a third of the shorter name's length in edits.
  const size_t limit = std::max<size_t>(2, std::min(word.size(), best.size()) / 3 + 1);
  return best_d <= limit ? best : std::string();
}

std::optional<double> parse_bytes(std::string_view text) {
  const std::string s = to_lower(trim(text));
  static const std::pair<const char*, double> units[] = {
      {"kib", 1024.0}, {"mib", 1048576.0}, {"gib", 1073741824.0}, {"tib", 1099511627776.0},
      {"kb", 1e3}, {"mb", 1e6}, {"gb", 1e9}, {"tb", 1e12}, {"k", 1024.0}, {"m", 1048576.0},
      {"g", 1073741824.0}, {"t", 1099511627776.0}, {"b", 1.0}};
  double scale = 1;
  std::string_view number = s;
  for (const auto& [suffix, factor] : units)
    if (ends_with(s, suffix)) {
      number = std::string_view(s).substr(0, s.size() - std::char_traits<char>::length(suffix));
      scale = factor;
      break;
    }
  const std::optional<double> v = parse_double(number);
  if (!v || !(*v >= 0) || !std::isfinite(*v * scale)) return std::nullopt;  // inf is no size
  return *v * scale;
}

std::string format_bytes(double bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  double v = bytes;
  while (std::fabs(v) >= 1024.0 && u < 4) v /= 1024.0, ++u;
  char buf[32];
  if (u == 0)
    std::snprintf(buf, sizeof buf, "%.0f %s", v, units[u]);
  else
    std::snprintf(buf, sizeof buf, std::fabs(v) < 10 ? "%.2f %s" : (std::fabs(v) < 100 ? "%.1f %s" : "%.0f %s"), v, units[u]);
  return buf;
}

}  // namespace headroom
