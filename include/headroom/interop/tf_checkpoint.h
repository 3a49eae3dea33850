// TensorFlow 2 checkpoints ("tensor bundles"): `<prefix>.index`, a LevelDB-format table mapping
// each tensor's key to its dtype, shape, data file, byte range and CRC-32C, and the data files
// `<prefix>.data-0000k-of-0000n` holding the raw little-endian bytes. Written by
// tf.train.Checkpoint (the TF OD API's zoo: checkpoint/ckpt-0). Every table block's checksum and
// every numeric tensor's is checked.
#pragma once

#include <ATen/Tensor.h>

#include <string>
#include <utility>
#include <vector>

namespace headroom::interop {

// The checkpoint's prefix when `path` names one: the prefix itself (`ckpt-0`, with ckpt-0.index
// beside it) or its index file. "" otherwise.
std::string tf_checkpoint_prefix(const std::string& path);

// Every numeric tensor by its key, as stored (`model/.../kernel/.ATTRIBUTES/VARIABLE_VALUE`), on
// the CPU in its own dtype, its checksum checked; string tensors (the object graph) are left out.
// Without `with_data` only the index is read: the tensors are shapes on the meta device.
// InputError naming the file and the block or tensor at fault: a damaged table, a checksum that
// does not match, a missing or short data shard, a partitioned tensor, big-endian data.
std::vector<std::pair<std::string, at::Tensor>> read_tf_checkpoint(const std::string& prefix, bool with_data = true);

}  // namespace headroom::interop
