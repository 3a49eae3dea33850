#include <filesystem>

#include "commands.h"
#include "headroom/core/files.h"
#include "headroom/core/logging.h"
#include "headroom/interop/onnx_export.h"
#include "headroom/interop/weights_import.h"

namespace headroom::cli {

namespace fs = std::filesystem;

void add_export_command(CLI::App& app, int& exit_code) {
  auto* cmd = app.add_subcommand("export", "Write a model's weights in another format (Headroom's own or imported weights)");
  static std::string weights, format = "onnx", out;
  static bool half = false, dynamic = false, end2end = true;
  static int64_t imgsz = 640, batch = 1, max_det = 300;
  cmd->add_option("--weights,-w", weights, "Weights file (Headroom, Ultralytics, YOLOv5, CenterNet or safetensors)")->required();
  CLI::Option* format_opt = cmd->add_option("--format,-f", format, "onnx (opset 17, the decode in the graph) or safetensors "
                                            "(default: from --out's extension, else onnx)")
      ->check(CLI::IsMember({"onnx", "safetensors"}))
      ->capture_default_str();
  cmd->add_flag("--half", half, "fp16 weights (ONNX: fp16 input and outputs too, for GPU runtimes)");
  cmd->add_flag("--dynamic", dynamic, "ONNX: symbolic batch, height and width (the head's grids follow the input)");
  cmd->add_option("--imgsz", imgsz, "ONNX: the square input size")->capture_default_str();
  cmd->add_option("--batch", batch, "ONNX: the static batch size")->capture_default_str();
  cmd->add_option("--max-det", max_det, "ONNX, end-to-end models (YOLO26): detections per image in the output")->capture_default_str();
  cmd->add_option("--end2end", end2end,
                  "ONNX, end-to-end models (YOLO26): true, the detections (no NMS); false, the one-to-many branch per anchor, "
                  "[B, 4 + nc, A], for the runtime's NMS")
      ->capture_default_str();
  cmd->add_option("--out,-o", out, "Output file (default: beside the weights, with the format's extension)");
  cmd->callback([&exit_code, format_opt, cmd] {
    // -o model.safetensors alone means that format; a format the name contradicts is refused.
    const std::string ext = fs::path(out).extension().string();
    if (ext == ".onnx" || ext == ".safetensors") {
      if (format_opt->count() == 0) format = ext.substr(1);
      if (ext.substr(1) != format)
        throw InputError("--out " + out + " names a ." + ext.substr(1) + " file but --format is " + format +
                         ": give --out a ." + format + " name, or drop --format");
    }
    if (format == "safetensors")  // the graph's options mean nothing to a weights file
      for (const char* onnx_only : {"--dynamic", "--imgsz", "--batch", "--max-det", "--end2end"})
        if (cmd->get_option(onnx_only)->count() > 0)
          throw InputError(std::string(onnx_only) + " is an ONNX option; a safetensors export holds the weights only (drop it, or --format onnx)");
    const std::string target = out.empty() ? fs::path(weights).replace_extension("." + format).string() : out;
    std::error_code ec;
    if (fs::equivalent(target, weights, ec)) throw InputError(target + ": is the input weights file; choose another --out");
    check_output_file(target);  // before the import and the graph, which a missing folder would waste
    models::LoadedWeights w = interop::load_any_weights(weights, c10::Device(c10::kCPU));
    if (format == "onnx")
      interop::export_onnx(*w.model, w.info, target, interop::OnnxExportOptions().imgsz(imgsz).batch(batch).dynamic(dynamic).half(half).max_det(max_det).end2end(end2end));
    else
      interop::save_safetensors_weights(*w.model, w.info, target, half);
    spdlog::info("exported {} ({} parameters, {} classes) to {}", weights, w.model->parameter_count(), w.model->info().nc, target);
    std::printf("%s\n", target.c_str());
    exit_code = kExitOk;
  });
}

}  // namespace headroom::cli
