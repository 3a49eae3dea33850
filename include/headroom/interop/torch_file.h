// Reads the files torch.save writes, without Python: the zip archive (`<dir>/data.pkl` plus one
// record per storage, `<dir>/data/<key>`) and the legacy format of PyTorch before 1.6 (five
// pickles: magic number, protocol, system info, the object, the storage keys; then each storage
// as an 8-byte element count and its raw bytes). A pickle machine runs the opcodes pickle
// protocols 0-4 emit; classes stay names and objects keep their constructor arguments and state,
// so a pickled nn.Module reads as nested dictionaries whatever library defined it.
#pragma once

#include <ATen/Tensor.h>

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace headroom::interop {

struct PyValue;
using PyRef = std::shared_ptr<PyValue>;

struct PyValue {
  enum class Kind { none, boolean, integer, real, string, bytes, list, tuple, dict, tensor, global, object };
  Kind kind = Kind::none;
  bool boolean = false;
  int64_t integer = 0;
  double real = 0;
  std::string text;                               // string, bytes; global and object: "module.Name"
  std::vector<PyRef> items;                       // list, tuple (and set); object: what APPENDS gave it
  std::vector<std::pair<PyRef, PyRef>> entries;   // dict, in order; object: what SETITEMS gave it
  PyRef args;                                     // object: its constructor arguments (a tuple)
  PyRef state;                                    // object: what BUILD gave it (usually a dict of attributes)
  at::Tensor tensor;                              // tensor (on the CPU, in its saved dtype)
  int depth = 0;                                  // nesting below it (the reader refuses > 1000)
  int64_t nodes = 1;                              // values a walk of it visits, shared ones each time (refused > 10^7)
  bool adopted = false;                           // held by another value: changing it then is refused

  // A dict's entry, or an object's attribute (from its state), by string key; null when absent.
  const PyValue* get(const std::string& key) const;
  bool is_none() const { return kind == Kind::none; }
  bool is_dict() const { return kind == Kind::dict; }
  bool is_object() const { return kind == Kind::object; }
  std::string describe() const;  // "dict", "object ultralytics.nn.tasks.DetectionModel", ... for messages
};

struct TorchFile {
  PyRef root;
  std::string format;  // "zip" or "legacy"
};

// InputError naming the file (and the byte offset or record) when it is not a torch file, is
// truncated or damaged, or uses something this reader does not read (quantized or sparse
// tensors, big-endian data).
TorchFile read_torch_file(const std::string& path);
// True when the file starts like one of the two formats (a zip archive or a pickle).
bool looks_like_torch_file(const std::string& path);

// The tensors of a pickled nn.Module as state_dict() names them ("model.0.conv.weight"): its
// _parameters and persistent _buffers, then its _modules' recursively. A dict of tensors (a
// state_dict) reads as it is. Empty when `v` is neither.
std::vector<std::pair<std::string, at::Tensor>> module_state(const PyValue& v);

}  // namespace headroom::interop
