// safetensors, the Hugging Face convention: an 8-byte little-endian header length, a JSON header
// (per tensor its dtype, shape and byte range; "__metadata__" holds string pairs), then the
// raw little-endian tensor bytes.
#pragma once

#include <ATen/Tensor.h>

#include <map>
#include <string>
#include <utility>
#include <vector>

namespace headroom::interop {

struct SafeTensors {
  std::vector<std::pair<std::string, at::Tensor>> tensors;  // in the header's order, on the CPU
  std::map<std::string, std::string> metadata;
};

// InputError naming the file and what is wrong: a header that is not JSON or overruns the
// file, byte ranges outside the data or overlapping, a dtype this reader does not read.
SafeTensors read_safetensors(const std::string& path);
// True when the file starts like one (a plausible header length followed by '{').
bool looks_like_safetensors(const std::string& path);
// Written whole or not at all (temporary file, fsync, rename); tensors are stored contiguous,
// in their own dtype.
void write_safetensors(const std::string& path, const SafeTensors& st);

}  // namespace headroom::interop
