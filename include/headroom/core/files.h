// File helpers with the guarantees the rest relies on: whole-or-nothing writes.
#pragma once

#include <string>

namespace headroom {

// Writes `contents` to a temporary file in the same folder, fsyncs it, renames it over `path`
// and fsyncs the folder: readers see the old file or the new one, never a torn one.
void write_file_atomic(const std::string& path, const std::string& contents);

// The whole file; throws InputError naming the file when it cannot be read.
std::string read_file(const std::string& path);

// fsync of a file or folder by path (throws on failure).
void fsync_path(const std::string& path, bool is_directory);

}  // namespace headroom
