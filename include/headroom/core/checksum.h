// CRC-32 checksums, table-driven (one table per polynomial, built once).
#pragma once

#include <cstddef>
#include <cstdint>

namespace headroom {

// CRC-32 (IEEE 802.3, zlib's): what zip archives store per record.
uint32_t crc32(const void* data, size_t size);
// CRC-32C (Castagnoli): what TFRecord and TensorBoard event files use.
uint32_t crc32c(const void* data, size_t size);
// The form TensorFlow stores (TFRecord framing, tensor bundles): CRC-32C rotated right by 15
// bits plus a constant, so that a CRC computed over data that itself holds CRCs stays well mixed.
uint32_t masked_crc32c(const void* data, size_t size);

}  // namespace headroom
