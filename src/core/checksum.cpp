#include "headroom/core/checksum.h"

#include <array>

namespace headroom {

namespace {

// Reflected CRC-32 with the given (reflected) polynomial, initial value and final xor all ones.
template <uint32_t Polynomial>
uint32_t reflected_crc(const void* data, size_t size) {
  static const std::array<uint32_t, 256> table = [] {
    std::array<uint32_t, 256> t{};
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? Polynomial ^ (c >> 1) : c >> 1;
      t[i] = c;
    }
    return t;
  }();
  const auto* p = static_cast<const uint8_t*>(data);
  uint32_t crc = 0xFFFFFFFFu;
  for (size_t i = 0; i < size; ++i) crc = table[(crc ^ p[i]) & 0xFF] ^ (crc >> 8);
  return crc ^ 0xFFFFFFFFu;
}

}  // namespace

uint32_t crc32(const void* data, size_t size) { return reflected_crc<0xEDB88320u>(data, size); }
uint32_t crc32c(const void* data, size_t size) { return reflected_crc<0x82F63B78u>(data, size); }

uint32_t masked_crc32c(const void* data, size_t size) {
  const uint32_t crc = crc32c(data, size);
  return ((crc >> 15) | (crc << 17)) + 0xA282EAD8u;
}

}  // namespace headroom
