#include "headroom/train/exchange.h"

#include <ATen/ATen.h>

#include <string>

namespace headroom::train {

namespace {
std::string of_step(int64_t step) { return " of step " + std::to_string(step + 1); }
}  // namespace

RankExchange::RankExchange(std::shared_ptr<dist::Group> group, models::DetectorImpl& model, bool sync_bn, int64_t count_terms,
                           c10::Device device)
    : group_(std::move(group)), sync_bn_(sync_bn), count_terms_(count_terms), device_(device) {
  std::vector<at::Tensor> state = model.parameters();
  for (const auto& b : model.buffers()) state.push_back(b);
  {
    at::NoGradGuard no_grad;
    group_->broadcast(state, "rank 0's initial weights");
  }
  if (sync_bn_) model.set_batchnorm_sync(dist::differentiable_sum(*group_));
  int64_t numel = 0, largest = 0;
  for (const auto& p : model.parameters())
    if (p.requires_grad()) {
      numel += p.numel();
      largest = std::max(largest, p.numel());
    }
  for (const auto& b : model.buffers()) largest = std::max(largest, b.numel());
  // 16 MiB (or the largest parameter), made before any step: the exchange allocates nothing.
  bucket_ = at::empty({std::min(numel, std::max<int64_t>(largest, int64_t(1) << 22))}, at::TensorOptions().dtype(at::kFloat).device(device));
}

void RankExchange::sum_normalisers(at::Tensor& counts, int64_t step) {
  if (count_terms_ > 0) {
    TORCH_CHECK(counts.defined() && counts.numel() == count_terms_, "the loss's counts have ", count_terms_, " terms");
    group_->all_reduce_sum(counts, "the loss normalisers" + of_step(step));
  }
  counts_exchanged_ = true;
}

void RankExchange::abandon(int64_t step) {
  if (counts_exchanged_ || count_terms_ == 0) return;
  at::Tensor zeros = at::zeros({count_terms_}, at::TensorOptions().dtype(at::kFloat).device(device_));
  group_->all_reduce_sum(zeros, "the loss normalisers" + of_step(step) + " (an attempt this rank abandoned)");
  counts_exchanged_ = true;
}

StepAgreement RankExchange::agree(bool failed, bool pressed, bool stop, int64_t step) {
  StepAgreement a;
  const auto all = group_->all_gather({failed ? 1.0 : 0.0, pressed ? 1.0 : 0.0, stop ? 1.0 : 0.0},
                                      "the ranks' agreement before step " + std::to_string(step + 1) + "'s update");
  for (size_t r = 0; r < all.size(); ++r) {
    if (all[r][0] > 0) a.failed.push_back(int(r));
    if (all[r][1] > 0) a.pressed.push_back(int(r));
    a.interrupt = a.interrupt || all[r][2] > 0;
  }
  interrupt_agreed_ = a.interrupt;  // every rank stops after the same step
  counts_exchanged_ = false;         // the next attempt exchanges again
  return a;
}

void RankExchange::reduce(std::vector<ParamGroup>& groups, int64_t normalisers, const std::vector<int64_t>& normaliser_of,
                          models::DetectorImpl& model, at::Tensor& items, at::Tensor& deferred, int64_t step) {
  const auto fopt = at::TensorOptions().dtype(at::kFloat).device(device_);
  // The same sizes on every rank, whether or not this rank's parts had a deferred normaliser.
  const int64_t T = items.numel(), D = normalisers;
  const bool has_deferred = deferred.defined();
  at::Tensor sums = at::zeros({T + D}, fopt);  // [T + D] the step's loss terms, then its deferred normalisers
  sums.narrow(0, 0, T).copy_(items);
  if (has_deferred) sums.narrow(0, T, D).copy_(deferred.reshape({D}));
  const at::Tensor own = has_deferred ? deferred.reshape({D}).clamp_min(1) : at::Tensor();
  group_->all_reduce_sum(sums, "the loss terms" + of_step(step));
  items = sums.narrow(0, 0, T);
  if (has_deferred) deferred = sums.narrow(0, T, D);
  const at::Tensor rescale_out = has_deferred ? deferred.clamp_min(1).reciprocal() : at::Tensor();
  // Every trainable parameter takes part, in the same order on every rank, gradient or not.
  std::vector<std::vector<at::Tensor>> grads(static_cast<size_t>(D));
  size_t i = 0;
  for (auto& g : groups)
    for (auto& p : g.params) {
      const int64_t d = normaliser_of.at(i++);
      if (!p.requires_grad()) continue;
      if (!p.grad().defined()) p.mutable_grad() = at::zeros_like(p);
      grads.at(size_t(d)).push_back(p.grad());
    }
  for (size_t d = 0; d < grads.size(); ++d)
    sum_in_buckets(grads[d], has_deferred ? own[int64_t(d)] : at::Tensor(), has_deferred ? rescale_out[int64_t(d)] : at::Tensor(),
                   "the gradients" + of_step(step));
  if (sync_bn_) return;
  // Each rank's BatchNorm ran on its own images: the running statistics are averaged, so that
  // every rank (and its EMA, which validates a shard) holds the same ones.
  std::vector<at::Tensor> stats;
  for (const auto& b : model.buffers())
    if (b.is_floating_point()) stats.push_back(b);
  if (!stats.empty())
    sum_in_buckets(stats, at::Tensor(), at::full({}, 1.0 / double(group_->world()), fopt), "the BatchNorm statistics" + of_step(step));
}

void RankExchange::sum_in_buckets(const std::vector<at::Tensor>& tensors, const at::Tensor& scale_in, const at::Tensor& scale_out,
                                  const std::string& what) {
  const int64_t cap = bucket_.numel();
  size_t first = 0;
  while (first < tensors.size()) {
    size_t last = first;
    int64_t used = 0;
    while (last < tensors.size() && used + tensors[last].numel() <= cap) used += tensors[last++].numel();
    TORCH_CHECK(last > first, "a tensor of ", tensors[first].numel(), " elements is larger than the exchange bucket");
    at::Tensor bucket = bucket_.narrow(0, 0, used);
    int64_t at = 0;
    for (size_t i = first; i < last; ++i) {
      bucket.narrow(0, at, tensors[i].numel()).view(tensors[i].sizes()).copy_(tensors[i]);
      at += tensors[i].numel();
    }
    if (scale_in.defined()) bucket.mul_(scale_in);
    group_->all_reduce_sum(bucket, what);
    if (scale_out.defined()) bucket.mul_(scale_out);
    at = 0;
    for (size_t i = first; i < last; ++i) {
      tensors[i].copy_(bucket.narrow(0, at, tensors[i].numel()).view(tensors[i].sizes()));
      at += tensors[i].numel();
    }
    first = last;
  }
}

std::shared_ptr<const data::Split> RankExchange::val_shard(const data::Split& val) {
  if (val_shard_) return val_shard_;
  auto shard = std::make_shared<data::Split>(val);
  shard->samples.clear();
  for (size_t i = size_t(rank()); i < val.samples.size(); i += size_t(world())) {
    shard->samples.push_back(val.samples[i]);
    if (shard->samples.back().image_id < 0) shard->samples.back().image_id = int64_t(i);
  }
  val_shard_ = std::move(shard);
  return val_shard_;
}

bool RankExchange::agree_validation(bool failed, int64_t& val_batch) {
  const auto all = group_->all_gather({failed ? 1.0 : 0.0, double(val_batch)}, "the ranks' validation outcome");
  bool any = false;
  for (const auto& v : all) {
    any = any || v[0] > 0;
    if (v[1] > 0 && (val_batch == 0 || v[1] < double(val_batch))) val_batch = int64_t(v[1]);
  }
  return any;
}

eval::CocoStats RankExchange::gather_validation(const eval::ValidationResult& mine, const data::Split& val) {
  // [n, 7]: image id, category id, x, y, w, h, score of this rank's detections
  at::Tensor rows = at::empty({int64_t(mine.detections.size()), 7}, at::kDouble);
  double* v = rows.data_ptr<double>();
  for (const auto& d : mine.detections) {
    for (double x : {double(d.image_id), double(d.category_id), d.x, d.y, d.w, d.h, d.score}) *v++ = x;
  }
  const at::Tensor all = group_->all_gather_rows(rows, "the validation detections");
  std::vector<eval::CocoBox> detections(size_t(all.size(0)));
  const double* a = all.data_ptr<double>();
  for (auto& d : detections) {
    d.image_id = int64_t(a[0]);
    d.category_id = int64_t(a[1]);
    d.x = a[2], d.y = a[3], d.w = a[4], d.h = a[5], d.score = a[6];
    d.area = d.w * d.h;
    a += 7;
  }
  // Every rank's images that could not be decoded, left out of the ground truth as of the
  // detections: shard sample i is the split's rank + i * world (val_shard).
  at::Tensor mine_left = at::empty({int64_t(mine.left_out.size()), 1}, at::kDouble);
  for (size_t i = 0; i < mine.left_out.size(); ++i) mine_left.data_ptr<double>()[i] = double(rank() + mine.left_out[i] * world());
  const at::Tensor left = group_->all_gather_rows(mine_left, "the validation images left out");
  std::vector<int64_t> left_out(size_t(left.size(0)));
  for (size_t i = 0; i < left_out.size(); ++i) left_out[i] = int64_t(left.data_ptr<double>()[i]);
  std::vector<int64_t> image_ids, category_ids;
  const std::vector<eval::CocoBox> truth = eval::ground_truth_boxes(val, &image_ids, &category_ids, left_out);
  return eval::coco_evaluate(truth, detections, image_ids, category_ids);
}

}  // namespace headroom::train
