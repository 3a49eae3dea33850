// The run's state as a registry: every stateful part (model, optimizer, EMA, loss scaler, the
// loader cursor and progress, the device counters, each hook with state) saves and loads its
// own named entry, so a checkpoint is a loop over the entries and nothing is forgotten when a
// part is added.
#pragma once

#include <c10/core/Device.h>
#include <torch/serialize/archive.h>

#include <functional>
#include <string>
#include <vector>

#include "headroom/core/json.h"

namespace headroom::train {

class StateRegistry {
 public:
  using Save = std::function<void(torch::serialize::OutputArchive&)>;
  using Load = std::function<void(torch::serialize::InputArchive&)>;
  // `required`: a checkpoint without the entry is refused. Otherwise the part starts afresh (a
  // hook that the resumed run has and the saved one had not, such as the memory governor).
  void add(const std::string& name, Save save, Load load, bool required = true);
  // A part that saves and loads itself (the optimizer, the EMA, the device counters).
  template <class Part>
  void add(const std::string& name, Part& part, bool required = true) {
    add(
        name, [&part](torch::serialize::OutputArchive& a) { part.save(a); },
        [&part](torch::serialize::InputArchive& a) { part.load(a); }, required);
  }
  // One sub-archive per entry, in registration order.
  void save(torch::serialize::OutputArchive& archive) const;
  // Every entry, in registration order (a later entry may rely on an earlier one: the loss
  // scaler exists once the precision is restored). `path` names the file in errors.
  void load(torch::serialize::InputArchive& archive, const std::string& path) const;

 private:
  struct Entry {
    std::string name;
    Save save;
    Load load;
    bool required = true;
  };
  std::vector<Entry> entries_;
};

// The random generators' state (the CPU's, and the device's on CUDA) as the entry "rng".
void add_generator_state(StateRegistry& registry, c10::Device device);

// Small state as JSON text in one record of an entry (doubles round-trip exactly).
void write_json(torch::serialize::OutputArchive& archive, const Json& value);
Json read_json(torch::serialize::InputArchive& archive, const std::string& where);

}  // namespace headroom::train
