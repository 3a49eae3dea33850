#include "headroom/train/state.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Context.h>
#include <torch/serialize/input-archive.h>
#include <torch/serialize/output-archive.h>

#include "headroom/core/errors.h"
#include "headroom/core/logging.h"

namespace headroom::train {

void StateRegistry::add(const std::string& name, Save save, Load load, bool required) {
  for (const auto& e : entries_)
    if (e.name == name) throw Error("state entry '" + name + "' registered twice");
  entries_.push_back(Entry{name, std::move(save), std::move(load), required});
}

void StateRegistry::save(torch::serialize::OutputArchive& archive) const {
  for (const auto& e : entries_) {
    torch::serialize::OutputArchive sub;
    e.save(sub);
    archive.write(e.name, sub);
  }
}

void StateRegistry::load(torch::serialize::InputArchive& archive, const std::string& path) const {
  for (const auto& e : entries_) {
    torch::serialize::InputArchive sub;
    if (!archive.try_read(e.name, sub)) {
      if (e.required) throw InputError(path + ": the checkpoint has no '" + e.name + "' state; it was written by another kind of run");
      spdlog::info("{}: no '{}' state in the checkpoint; it starts afresh", path, e.name);
      continue;
    }
    try {
      e.load(sub);
    } catch (const c10::Error& err) {
      throw InputError(path + ": the '" + e.name + "' state does not fit this run (another architecture, class count or "
                       "optimizer?): " + err.what_without_backtrace());
    }
  }
}

void add_generator_state(StateRegistry& registry, c10::Device device) {
  registry.add(
      "rng",
      [device](torch::serialize::OutputArchive& a) {
        a.write("cpu", at::detail::getDefaultCPUGenerator().get_state(), /*is_buffer=*/true);
        if (device.is_cuda()) a.write("cuda", at::globalContext().defaultGenerator(device).get_state(), true);
      },
      [device](torch::serialize::InputArchive& a) {
        at::Tensor rng;
        a.read("cpu", rng, true);
        at::Generator cpu_gen = at::detail::getDefaultCPUGenerator();  // a handle on the global generator
        cpu_gen.set_state(rng.cpu());
        if (device.is_cuda() && a.try_read("cuda", rng, true)) {
          at::Generator cuda_gen = at::globalContext().defaultGenerator(device);
          cuda_gen.set_state(rng.cpu());
        }
      });
}

void write_json(torch::serialize::OutputArchive& archive, const Json& value) { archive.write("json", c10::IValue(value.dump())); }

Json read_json(torch::serialize::InputArchive& archive, const std::string& where) {
  c10::IValue v;
  archive.read("json", v);
  return Json::parse(v.toStringRef(), where);
}

}  // namespace headroom::train
