// The hooks of a `trainer train` run, and Ctrl-C handling.
#pragma once

#include "headroom/core/config.h"
#include "headroom/train/trainer.h"

namespace headroom::train {

// In order: schedule, EMA, non-finite guard, Ctrl-C, evaluation, logging (progress, results.csv,
// TensorBoard), plots, and last the checkpoint writer, so that every other hook's state for the
// step (or the epoch's end) is in the file it writes.
void register_default_hooks(Trainer& t, const Config& c);

// Ctrl-C handling: the first SIGINT asks the loop to stop after the current step and, where
// `announce` (rank 0), says so on stderr; the second ends the process at once.
void install_interrupt_handler(bool announce);
bool interrupt_requested();

}  // namespace headroom::train
