// The step loop, read top to bottom: micro-batches -> global token count -> forward/backward per
// micro-batch -> loss all-reduce -> clip -> AdamW -> schedule -> log / evaluate / save / stop.
#include <ATen/ATen.h>

#include <cmath>
#include <limits>
#include <optional>

#include "alpaca/ckpt/checkpoint_dir.h"
#include "alpaca/ckpt/preemption.h"
#include "alpaca/data/collate.h"
#include "alpaca/model/loss.h"
#include "alpaca/optim/grad_clip.h"
#include "alpaca/train/memory_log.h"
#include "alpaca/train/throughput.h"
#include "alpaca/util/error.h"
#include "alpaca/util/fault.h"
#include "alpaca/util/host_sync.h"
#include "alpaca/util/log.h"
#include "alpaca/util/user_error.h"
#include "alpaca/util/sys.h"
#include "alpaca/util/trace.h"
#include "trainer_impl.h"

namespace alpaca::train {

namespace fs = std::filesystem;
namespace {

struct DeviceBatch {
  at::Tensor input_ids, labels, attention_mask, position_ids, segment_ids;
};

// The collated batch (host tensors) for the model, without a host wait: ids and positions travel
// asynchronously (pinned staging); labels and the mask stay on the host, where the loss and the
// model read their counts and padding at no cost, and move them the same way.
DeviceBatch to_device(const data::Batch& b, const at::Device& d) {
  auto mv = [&](const at::Tensor& t) { return util::to_device_async(t, d); };
  // A batch without padding needs no mask: the model then runs SDPA's causal kernel instead of
  // materialising a (B, 1, T, T) mask (transformers drops an all-ones mask the same way).
  const bool no_padding = b.attention_mask_bt.defined() && b.attention_mask_bt.all().item<bool>();  // host data
  return {mv(b.input_ids_bt), b.labels_bt, no_padding ? at::Tensor() : b.attention_mask_bt, mv(b.position_ids_bt),
          mv(b.segment_ids_bt)};
}

data::Batch collate_indices(const std::vector<data::Example>& examples, const std::vector<int64_t>& idx, int64_t pad,
                            data::AttentionMask rule, int64_t pad_to_multiple_of) {
  std::vector<const data::Example*> ptrs;
  ptrs.reserve(idx.size());
  for (int64_t i : idx) ptrs.push_back(&examples.at(static_cast<size_t>(i)));
  return data::collate(ptrs, pad, rule, pad_to_multiple_of);
}

}  // namespace

void Trainer::Impl::log_entry(LogEntry entry, bool to_history) {
  if (rank != 0) return;
  if (to_history) {
    LogEntry hist;
    for (const auto& kv : entry)
      if (kv.first.rfind("x_", 0) != 0) hist.push_back(kv);  // our extras stay out of HF's log_history
    hist.emplace_back("step", state.global_step);
    state.log_history.push_back(hist);
  }
  entry.emplace_back("step", state.global_step);
  LogEntry console;
  for (const auto& kv : entry)
    if (kv.first.rfind("x_", 0) != 0 && kv.first != "step") console.push_back(kv);
  progress->log(format_log_line(console));
  LogEntry json;
  for (auto kv : entry) {
    if (kv.first.rfind("x_", 0) == 0) kv.first = kv.first.substr(2);
    json.push_back(kv);
  }
  // TensorBoard first: a run killed between the two writes has every metrics.jsonl step in its
  // event file. HF's tags (rewrite_logs); "step" is the event's step, not a scalar.
  if (tensorboard.enabled()) {
    std::vector<std::pair<std::string, double>> scalars;
    for (const auto& [k, v] : json)
      if (k != "step") scalars.emplace_back(tensorboard_tag(k), ckpt::log_value_as_double(v));
    tensorboard.add_scalars(state.global_step, scalars);
  }
  metrics.write(json);
}

EvalOutcome Trainer::Impl::evaluate() {
  at::NoGradGuard no_grad;
  // Evaluation mode (no LoRA dropout) for this call only.
  struct EvalMode {
    torch::nn::Module& m;
    ~EvalMode() { m.train(); }
  } eval_mode{*model};
  model->eval();
  const int64_t n = static_cast<int64_t>(eval_examples.size());
  ALPACA_USER_CHECK(n > 0, "evaluation needs examples: --eval_data_path gave none");
  const int64_t b = opt.per_device_eval_batch_size;
  const int64_t pad = *tokenizer->pad_id();
  // transformers' evaluation_loop: each batch's loss is the mean over its label tokens, repeated
  // once per row, and eval_loss the mean of those gathered over the ranks (the last round's filler
  // rows truncated away by gather_for_metrics: data::eval_batches). So it is a per-example weighting
  // of batch means, and depends on per_device_eval_batch_size and the world size as HF's does. A
  // batch without label tokens has a NaN mean there, which makes HF's eval_loss NaN; here it is
  // left out (docs/datasets.md).
  std::vector<int64_t> lengths;
  if (opt.group_by_length)
    for (const auto& e : eval_examples) lengths.push_back(static_cast<int64_t>(e.input_ids.size()));
  const std::vector<data::EvalBatch> batches = data::eval_batches(
      data::eval_order(n, b, opt.group_by_length, lengths, static_cast<uint64_t>(opt.data_seed)), b, world, rank);
  double weighted = 0, examples = 0;
  // TRL's per-batch token metrics: each round's (entropy sum, top-1 count, label tokens) over the
  // ranks gather_for_metrics keeps.
  std::vector<at::Tensor> round_stats;  // on the device, read once after the loop
  std::vector<double> round_labels;
  const auto rounds = static_cast<int64_t>(batches.size());
  for (const data::EvalBatch& eb : batches) {
    util::fault_pause_ms("train.pause_in_eval");  // signal-during-evaluation tests (util/fault.h)
    // Every rank runs every round (FSDP gathers are collective), fillers included.
    const DeviceBatch db = to_device(collate_indices(eval_examples, eb.indices, pad, attention_rule, opt.pad_to_multiple_of), device);
    const model::LossSum ls = fsdp_model->forward_loss_sum(db.input_ids, db.labels, db.attention_mask, db.position_ids, db.segment_ids);
    if (eb.loss_weight > 0 && ls.num_tokens > 0) {
      const double n_b = static_cast<double>(eb.loss_weight);
      weighted += n_b * (ls.sum.item<double>() / static_cast<double>(ls.num_tokens));
      examples += n_b;
    }
    round_stats.push_back(eb.metrics_counted ? ls.token_stats : at::zeros({2}, ls.sum.options().dtype(at::kDouble)));
    round_labels.push_back(eb.metrics_counted ? static_cast<double>(ls.num_tokens) : 0.0);
  }
  // Per round: entropy sum, top-1 count, label tokens.
  const at::Tensor per_round_stats =
      at::cat({at::stack(round_stats).cpu(), at::tensor(round_labels, at::kDouble).unsqueeze(1)}, 1);
  at::Tensor red = at::cat({at::tensor({weighted, examples}, at::kDouble), per_round_stats.reshape({-1})}).to(device);
  comm->all_reduce(red, dist::ReduceOp::kSum)->wait();
  red = red.cpu();
  const double* p = red.const_data_ptr<double>();
  EvalOutcome out;
  if (p[1] > 0) out.loss = p[0] / p[1];
  for (int64_t r = 0; r < rounds; ++r) {
    const double* st = p + 2 + 3 * r;  // TRL: 0 for a batch without label tokens
    out.entropy += st[2] > 0 ? st[0] / st[2] : 0.0;
    out.mean_token_accuracy += st[2] > 0 ? st[1] / st[2] : 0.0;
  }
  if (rounds > 0) {
    out.entropy /= static_cast<double>(rounds);
    out.mean_token_accuracy /= static_cast<double>(rounds);
  }
  return out;
}

// ---- One optimizer step, in the order train() runs them.

// 1. This rank's micro-batches of the step, and the label/token counts over all ranks (one
//    all-reduce, before any forward: the loss is normalised by the global label count). The
//    counts stay on the device: the loss divides by them there, and the host reads them with the
//    step's other results, in the step's one read (optimizer_step).
StepBatches Trainer::Impl::gather_micro_batches() {
  ALPACA_TRACE("phase:batch");
  StepBatches sb;
  const int64_t pad = *tokenizer->pad_id();
  int64_t local_labels = 0, local_padded = 0, local_non_padding = 0, local_attended = 0;
  std::vector<int64_t> micro_labels;
  // TRL's collator is padding-free under bfd packing: one row per micro-batch, no attention mask.
  const bool padding_free = opt.packing && opt.packing_strategy == "bfd";
  for (const auto& idx : sampler->micro_batches(epoch, step_in_epoch)) {
    sb.batches.push_back(collate_indices(train_examples, idx, pad, attention_rule, opt.pad_to_multiple_of));
    const data::Batch& b = sb.batches.back();
    local_labels += b.num_label_tokens;
    micro_labels.push_back(b.num_label_tokens);
    const data::TokenCounts c = data::token_counts(b, pad, opt.pad_to_multiple_of, padding_free);  // host data
    sb.local_tokens += c.masked;
    local_padded += c.elements;
    local_non_padding += c.non_padding;
    local_attended += c.attended;
  }
  std::vector<int64_t> counts = {local_labels, sb.local_tokens, local_padded, local_non_padding, local_attended};
  counts.insert(counts.end(), micro_labels.begin(), micro_labels.end());
  sb.counts = util::to_device_async(at::tensor(counts, at::kLong), device);
  comm->all_reduce(sb.counts, dist::ReduceOp::kSum)->wait();
  // max(labels, 1) as the fp32 divisor of the loss: the value a double denominator rounds to.
  sb.denominator_t = sb.counts[0].clamp_min(1).to(at::kFloat);
  return sb;
}

// 2. Forward + backward of every micro-batch; gradients accumulate in the fp32 shards. Returns
//    this rank's summed token loss, accumulated in fp64 on the device (no read per micro-batch).
at::Tensor Trainer::Impl::forward_backward(StepBatches& sb) {
  at::Tensor local_loss_sum = at::zeros({}, at::TensorOptions().dtype(at::kDouble).device(device));
  std::vector<at::Tensor> token_stats;
  for (const data::Batch& b : sb.batches) {
    const DeviceBatch db = to_device(b, device);
    const model::LossSum ls = [&] {
      ALPACA_TRACE("phase:forward");
      return fsdp_model->forward_loss_sum(db.input_ids, db.labels, db.attention_mask, db.position_ids, db.segment_ids);
    }();
    // HF's torch_empty_cache_steps: in training_step, after the loss and before backward, when
    // global_step (the steps done) is a multiple; clear_device_cache empties the CUDA cache.
    if (opt.torch_empty_cache_steps > 0 && state.global_step % opt.torch_empty_cache_steps == 0) {
      release_cached_memory(device);
      ++cache_releases;
    }
    at::Tensor loss = ls.sum / sb.denominator_t;
    if (scaler) loss = loss * scaler->scale();
    {
      ALPACA_TRACE("phase:backward");
      loss.backward();
    }
    local_loss_sum = local_loss_sum + ls.sum.detach().to(at::kDouble);
    token_stats.push_back(ls.token_stats);
  }
  sb.local_token_stats = at::cat(token_stats).to(at::kFloat);
  return local_loss_sum;
}

// 3. The step's loss over all ranks and whether any rank was asked to stop, in one all-reduce,
//    left on the device (read with the gradient norm in optimizer_step).
at::Tensor Trainer::Impl::reduce_step_loss(const at::Tensor& local_loss_sum, const StepBatches& sb) {
  const double stop_local = ckpt::stop_requested() == ckpt::StopRequest::kSaveAndExit ? 1.0 : 0.0;
  at::Tensor red = at::cat(
      {at::stack({local_loss_sum.to(at::kFloat), at::scalar_tensor(stop_local, local_loss_sum.options().dtype(at::kFloat))}),
       sb.local_token_stats});
  comm->all_reduce(red, dist::ReduceOp::kSum)->wait();
  return red;
}

// The step's one read of device results: [loss sum, stop, (norm^2), labels, tokens] as fp64 (each
// value exact: fp32 and counts below 2^53 convert losslessly).
void Trainer::Impl::read_step(const at::Tensor& red, const at::Tensor& norm_sq, StepBatches& sb, StepOutcome& out,
                              double* norm) {
  std::vector<at::Tensor> parts = {red.to(at::kDouble)};
  if (norm_sq.defined()) parts.push_back(util::to_device_async(norm_sq, device).to(at::kDouble).reshape({1}));
  parts.push_back(sb.counts.to(at::kDouble));
  util::count_host_sync();
  const at::Tensor v = at::cat(parts).cpu();
  const double* p = v.data_ptr<double>();
  const size_t micro = sb.batches.size();  // red: loss, stop, then (entropy sum, top-1) per micro-batch
  size_t i = 2 + 2 * micro;
  if (norm_sq.defined()) *norm = std::sqrt(p[i++]);
  sb.global_labels = static_cast<int64_t>(p[i]);
  sb.global_tokens = static_cast<int64_t>(p[i + 1]);
  sb.global_padded = static_cast<int64_t>(p[i + 2]);
  sb.global_non_padding = static_cast<int64_t>(p[i + 3]);
  sb.global_attended = static_cast<int64_t>(p[i + 4]);
  for (size_t m = 0; m < micro; ++m) {
    sb.micro_entropy_sum.push_back(p[2 + 2 * m]);
    sb.micro_top1.push_back(p[3 + 2 * m]);
    sb.micro_labels.push_back(static_cast<int64_t>(p[i + 5 + m]));
  }
  out.loss = p[0] / sb.denominator();
  out.stop = p[1] > 0;
}

// 4. Non-finite checks, clipping, AdamW, schedule. An fp16 overflow skips the update (the scaler
//    backs off); any other non-finite loss or norm is an error that says what to change. Without
//    a loss scaler the loss, the stop flag, the counts and the gradient norm are read in one host
//    synchronisation; the scaler's unscale/overflow check needs its own reads (fp16 only).
StepOutcome Trainer::Impl::optimizer_step(const at::Tensor& red, StepBatches& sb) {
  ALPACA_TRACE("phase:optimizer");
  const int64_t step_no = state.global_step + 1;
  StepOutcome out;
  bool do_step = true;
  const auto grads = engine->grad_shards();
  std::optional<double> norm;
  if (!scaler) {
    double n = 0;
    read_step(red, optim::global_grad_norm_sq(grads, engine->norm_comm()), sb, out, &n);
    norm = n;
  } else {
    read_step(red, at::Tensor(), sb, out, nullptr);
  }
  if (!std::isfinite(out.loss)) {
    ALPACA_USER_CHECK(scaler, "the training loss is " << out.loss << " at step " << step_no << " (epoch " << epoch
                                                 << "); lower --learning_rate, check the data, or use --bf16");
    do_step = false;
  }
  if (do_step && scaler) do_step = scaler->unscale_or_skip(grads, engine->norm_comm());
  if (do_step) {
    if (!norm) norm = optim::global_grad_norm(grads, engine->norm_comm());
    out.grad_norm = *norm;
    if (opt.max_grad_norm > 0) optim::clip_grad_norm_by(grads, opt.max_grad_norm, out.grad_norm);
    if (!std::isfinite(out.grad_norm)) {
      ALPACA_USER_CHECK(scaler, "the gradient norm is " << out.grad_norm << " at step " << step_no << " (epoch " << epoch
                                                   << ", loss " << out.loss << "); lower --learning_rate or check the data");
      do_step = false;
    }
  }
  out.lr = optim::learning_rate(schedule, scheduler_step);
  if (do_step) {
    optimizer->step(out.lr);
    ++scheduler_step;
  }
  out.logged_lr = optim::logged_learning_rate(schedule, scheduler_step, do_step);
  if (!do_step) {
    ALPACA_WARN("step " << step_no << ": fp16 overflow, optimizer step skipped (loss scale now " << scaler->scale() << ")");
  }
  engine->zero_grad();
  return out;
}

// 5. Bookkeeping: HF's global_step / epoch, the loss window, tokens seen, the progress bar.
void Trainer::Impl::advance(const StepBatches& sb, const StepOutcome& out, RunWindow& w) {
  ++state.global_step;
  ++step_in_epoch;
  state.epoch = static_cast<double>(epoch) + static_cast<double>(step_in_epoch) / static_cast<double>(length.steps_per_epoch);
  tokens_trained += sb.global_tokens;
  trl_num_tokens += sb.global_attended;
  // HF's _track_num_input_tokens: input_ids' elements ("all") or the attention mask's ("non_padding";
  // input_ids != pad id for TRL's padding-free rows, which have no mask).
  if (opt.include_num_input_tokens_seen == "all") state.num_input_tokens_seen += sb.global_padded;
  if (opt.include_num_input_tokens_seen == "non_padding") state.num_input_tokens_seen += sb.global_non_padding;
  if (std::isfinite(out.loss)) losses.add_step(out.loss);
  for (size_t m = 0; m < sb.micro_labels.size(); ++m) {  // TRL: 0 for a micro-batch without label tokens
    const double n = static_cast<double>(sb.micro_labels[m]);
    w.entropies.push_back(n > 0 ? sb.micro_entropy_sum[m] / n : 0.0);
    w.accuracies.push_back(n > 0 ? sb.micro_top1[m] / n : 0.0);
  }
  w.last_grad_norm = out.grad_norm;
  w.last_lr = out.logged_lr;
  ++w.steps;
  w.tokens += sb.global_tokens;
  w.local_tokens += sb.local_tokens;
  progress->step(state.global_step, w.run_timer.seconds(), initial_step);
}

// 6. Log / evaluate / save, as HF's DefaultFlowCallback decides; a stop request saves too.
void Trainer::Impl::log_eval_save(RunWindow& w, bool stop) {
  poll_pending_save();  // a background checkpoint write: sealed once every rank finished, or its error stops the run
  const bool last = state.global_step >= length.max_steps;
  // HF's inner loop ends at max_steps too, and on_epoch_end then fires: the epoch strategies log,
  // evaluate and save after a last epoch cut short (--num_train_epochs 1.5, --max_steps).
  const bool epoch_end = step_in_epoch >= length.steps_per_epoch || last;
  auto due = [&](Interval when, int64_t every) {
    return (when == Interval::kSteps && state.global_step % every == 0) || (when == Interval::kEpoch && epoch_end);
  };
  // HF's DefaultFlowCallback logs the first step whatever the logging strategy.
  if (due(opt.logging_strategy, logging_steps) || (opt.logging_first_step && state.global_step == 1))
    log_window(w);
  // HF also evaluates and saves after the last step under the steps strategy; save_strategy best
  // saves after an evaluation that improved the tracked metric.
  bool new_best = false;
  // HF's eval_delay: the step (steps) or epoch (epoch) the scheduled evaluations start from.
  const bool delayed = opt.eval_delay > (opt.eval_strategy == Interval::kEpoch ? state.epoch
                                                                                : static_cast<double>(state.global_step));
  if (!delayed && (due(opt.eval_strategy, eval_steps) || (opt.eval_strategy == Interval::kSteps && last))) {
    const LogEntry e = evaluate_and_log();
    w.last_eval_loss = ckpt::find_log_value(e, "eval_loss");
    w.evaluated_at_last_step = last;
    // HF's _evaluate: ReduceLROnPlateau steps on the tracked metric, then the best metric is noted.
    // (reduce_lr_on_plateau always has a metric: validation makes it loss by default.)
    if (opt.metric_for_best_model) {
      const double metric = tracked_metric(e);  // collective: once per evaluation, outside any log statement
      if (schedule.type == optim::ScheduleType::kReduceOnPlateau && optim::plateau_step(schedule, metric))
        ALPACA_INFO("reduce_lr_on_plateau: learning rate reduced to "
                    << optim::learning_rate(schedule, scheduler_step) << " (" << *opt.metric_for_best_model << " " << metric << ")");
      new_best = determine_best_metric(metric);
    }
  }
  if (due(opt.save_strategy, save_steps) || (opt.save_strategy == Interval::kSteps && last) ||
      (opt.save_strategy == Interval::kBest && new_best) || stop)
    save_checkpoint(/*allow_async=*/!last && !stop);  // the run ends right after those: write them now
  w.syncs_at_start = util::host_sync_count();  // logging, evaluation and saving are not the steps' syncs
}

// The training log entry of the window since the last one (loss, norm, lr, throughput, memory).
void Trainer::Impl::log_window(RunWindow& w) {
  const double secs = w.window_timer.seconds();
  LogEntry e = {{"loss", losses.take_log_average(state.global_step)}};
  if (std::isfinite(w.last_grad_norm)) e.emplace_back("grad_norm", w.last_grad_norm);
  e.emplace_back("learning_rate", w.last_lr);
  append_token_metrics(e, "", w.entropies, w.accuracies);
  w.entropies.clear();
  w.accuracies.clear();
  e.emplace_back("epoch", state.epoch);
  if (opt.include_num_input_tokens_seen != "no") e.emplace_back("num_input_tokens_seen", state.num_input_tokens_seen);
  const double step_time = w.steps > 0 ? secs / static_cast<double>(w.steps) : 0.0;
  const double tps = secs > 0 ? static_cast<double>(w.tokens) / secs : 0.0;
  e.emplace_back("x_step_time", step_time);
  e.emplace_back("x_tokens_per_step", w.steps > 0 ? w.tokens / w.steps : int64_t{0});
  e.emplace_back("x_tokens_per_second", tps);
  e.emplace_back("x_tokens_per_second_per_rank", secs > 0 ? static_cast<double>(w.local_tokens) / secs : 0.0);
  if (device.is_cuda() && peak_flops) e.emplace_back("x_mfu", mfu(tps / world, flops_per_token, *peak_flops));
  // Device->host synchronisations of the window's steps (util/host_sync.h), before this entry's own.
  e.emplace_back("x_host_syncs_per_step",
                 w.steps > 0 ? static_cast<double>(util::host_sync_count() - w.syncs_at_start) / w.steps : 0.0);
  append_memory_fields(e, *comm, device);  // peaks since the previous log, max over ranks (collective)
  log_entry(std::move(e));
  w.window_timer.reset();
  w.steps = w.tokens = w.local_tokens = 0;
}

// TRL SFTTrainer.log: the window's per-micro-batch metrics averaged, and the attention-mask tokens
// trained on so far (TRL's _total_train_tokens; ours also counts the steps before a resume, which
// TRL, keeping it out of its checkpoints, starts again from 0).
void Trainer::Impl::append_token_metrics(LogEntry& e, const std::string& prefix, const std::vector<double>& entropies,
                                         const std::vector<double>& accuracies) const {
  if (entropies.empty()) return;
  auto mean = [](const std::vector<double>& v) {
    double s = 0;
    for (double x : v) s += x;
    return s / static_cast<double>(v.size());
  };
  e.emplace_back(prefix + "entropy", mean(entropies));
  e.emplace_back(prefix + "mean_token_accuracy", mean(accuracies));
  e.emplace_back(prefix + "num_tokens", static_cast<double>(trl_num_tokens));  // a float in TRL's log (a mean)
}

LogEntry Trainer::Impl::evaluate_and_log() {
  sys::Timer t;
  const EvalOutcome r = evaluate();
  const double loss = r.loss;
  const auto n = static_cast<int64_t>(eval_examples.size());
  const int64_t per_round = opt.per_device_eval_batch_size * world;
  LogEntry e = {{"eval_loss", loss}, {"eval_perplexity", std::exp(loss)}};
  for (const auto& kv : speed_metrics("eval", t.seconds(), static_cast<double>(n), (n + per_round - 1) / per_round))
    e.push_back(kv);
  append_token_metrics(e, "eval_", {r.entropy}, {r.mean_token_accuracy});
  e.emplace_back("epoch", state.epoch);
  log_entry(e);
  return e;
}

double Trainer::Impl::tracked_metric(const LogEntry& eval) {
  const std::string& key = *opt.metric_for_best_model;
  std::optional<double> value = ckpt::find_log_value(eval, key);
  // eval_*_per_second are left out of an evaluation that took no measurable time.
  ALPACA_CHECK(value, "--metric_for_best_model: this evaluation logged no " << key);
  // rank 0's value on every rank (the speed metrics are each rank's own clock): one decision for all.
  at::Tensor v = at::full({1}, rank == 0 ? *value : 0.0, at::TensorOptions().dtype(at::kDouble).device(device));
  comm->all_reduce(v, dist::ReduceOp::kSum)->wait();
  return v.item<double>();
}

bool Trainer::Impl::determine_best_metric(double metric) {
  const double best = state.best_metric.value_or(opt.greater_is_better ? -INFINITY : INFINITY);
  if (!(opt.greater_is_better ? metric > best : metric < best)) return false;  // NaN is never better
  state.best_metric = metric;
  if (opt.save_strategy != Interval::kNo) state.best_global_step = state.global_step;
  return true;
}

// The end of a completed run: HF's final metrics (with every rank's peak host memory), the final
// export and the results files.
void Trainer::Impl::finish_run(const RunWindow& w) {
  const double runtime = w.run_timer.seconds();
  const int64_t steps_run = state.global_step - initial_step;
  LogEntry final_metrics = speed_metrics("train", runtime,
                                         static_cast<double>(length.max_steps * length.global_batch_size) *
                                             static_cast<double>(steps_run) / static_cast<double>(std::max<int64_t>(length.max_steps, 1)),
                                         steps_run);
  state.total_flos = flops_per_token / 3.0 * static_cast<double>(tokens_trained);
  final_metrics.emplace_back("total_flos", state.total_flos);
  final_metrics.emplace_back("train_loss", losses.train_loss(state.global_step, initial_step));
  // TRL's log of these final metrics adds the steps' metrics not logged yet, unless an evaluation ran
  // at the last step (the model then is in eval mode, whose metrics that evaluation's log took).
  if (!w.evaluated_at_last_step) append_token_metrics(final_metrics, "", w.entropies, w.accuracies);
  final_metrics.emplace_back("epoch", state.epoch);
  at::Tensor mine = at::tensor({sys::peak_rss_bytes()}, at::kLong).to(device);
  at::Tensor all = at::zeros({world}, at::kLong).to(device);
  comm->all_gather_into(all, mine)->wait();
  all = all.cpu();
  LogEntry with_rss = final_metrics;
  for (int r = 0; r < world; ++r) with_rss.emplace_back("x_peak_host_rss_bytes_rank" + std::to_string(r), all[r].item<int64_t>());
  log_entry(with_rss);
  if (opt.load_best_model_at_end && state.best_model_checkpoint) load_best_model();
  if (rank == 0 && metrics.enabled()) {
    // One list for tools (bench.py reads it).
    std::string list = "[";
    for (int r = 0; r < world; ++r) list += (r ? "," : "") + std::to_string(all[r].item<int64_t>());
    ALPACA_INFO("peak host RSS per rank (bytes): " << list << "]");
  }
  if (rank == 0 && opt.torch_empty_cache_steps > 0)
    ALPACA_INFO("torch_empty_cache_steps " << opt.torch_empty_cache_steps << ": "
                << (device.is_cuda() ? "emptied the CUDA caching allocator " + std::to_string(cache_releases) + " times"
                                     : "CPU ranks have no device cache to empty (" + std::to_string(cache_releases) +
                                           " micro-batches at the steps it names)"));
  save_final();
  // HF: with save_total_limit 1 only the best checkpoint stays once the run is over.
  if (rank == 0 && opt.save_total_limit == 1 && state.best_model_checkpoint)
    for (const fs::path& c : ckpt::sort_checkpoints(output_dir, false, *state.best_model_checkpoint))
      if (fs::exists(*state.best_model_checkpoint) && !fs::equivalent(c, *state.best_model_checkpoint)) {
        ALPACA_INFO("Deleting older checkpoint [" << c.string() << "] due to args.save_total_limit");
        fs::remove_all(c);
      }
  if (rank == 0) save_metrics(output_dir, "train", final_metrics);
  if (w.last_eval_loss && rank == 0)
    save_metrics(output_dir, "eval", {{"eval_loss", *w.last_eval_loss}, {"eval_perplexity", std::exp(*w.last_eval_loss)},
                                      {"epoch", state.epoch}});
  barrier();
}

int Trainer::Impl::train() {
  initial_step = state.global_step;
  RunWindow w;
  w.syncs_at_start = util::host_sync_count();  // setup's reads are not a step's
  reset_memory_window(device);  // the first log's peaks cover training only, not setup
  if (opt.eval_on_start) {  // HF: before the epoch loop, also when resuming (at the resumed step); never a best
    w.last_eval_loss = ckpt::find_log_value(evaluate_and_log(), "eval_loss");
    w.syncs_at_start = util::host_sync_count();
    w.window_timer.reset();  // the first log's step time is the steps'
    reset_memory_window(device);
  }
  while (state.global_step < length.max_steps) {
    if (step_in_epoch >= length.steps_per_epoch) {
      ++epoch;
      step_in_epoch = 0;
    }
    ALPACA_TRACE("phase:step");  // profilers' step boundary (bench/train_profile.cpp)
    StepBatches sb = gather_micro_batches();
    const at::Tensor local_loss_sum = forward_backward(sb);
    const at::Tensor red = reduce_step_loss(local_loss_sum, sb);
    const StepOutcome out = optimizer_step(red, sb);
    advance(sb, out, w);
    util::fault_pause_ms("train.pause_after_step");  // signal-mid-run tests (util/fault.h)
    log_eval_save(w, out.stop);
    if (out.stop) {
      progress->finish();
      const int sig = ckpt::stop_signal();
      const int exit_code = ckpt::exit_code_for_stop(sig == 0 ? 15 : sig);
      ALPACA_WARN("stopping after step " << state.global_step << " on a signal; checkpoint saved; exit code " << exit_code);
      return exit_code;
    }
  }
  progress->finish();
  finish_run(w);
  return 0;
}

}  // namespace alpaca::train
