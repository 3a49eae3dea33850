// Plots a run draws with OpenCV: results.png (each results.csv column over epochs),
// train_batch0.jpg (a training batch with its boxes) and labels.jpg (class counts and the
// box-size scatter of the training split).
#pragma once

#include <string>
#include <vector>

#include "headroom/data/batch.h"
#include "headroom/data/dataset.h"

namespace headroom::train {

// Every column but the first (epoch) of a results table, one small chart each.
void plot_results(const std::vector<std::string>& header, const std::vector<std::vector<double>>& rows, const std::string& path);
void plot_batch(const data::HostBatch& batch, const std::vector<std::string>& names, const std::string& path);
void plot_labels(const data::Split& split, const std::string& path);

}  // namespace headroom::train
