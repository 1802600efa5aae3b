// The step loop, read top to bottom: micro-batches -> global token count -> forward/backward per
// micro-batch -> loss all-reduce -> clip -> AdamW -> schedule -> log / evaluate / save / stop.
#include <ATen/ATen.h>

#include <cmath>
#include <limits>
#include <optional>

#include "alpaca/ckpt/preemption.h"
#include "alpaca/data/collate.h"
#include "alpaca/model/loss.h"
#include "alpaca/optim/grad_clip.h"
#include "alpaca/train/throughput.h"
#include "alpaca/util/error.h"
#include "alpaca/util/fault.h"
#include "alpaca/util/log.h"
#include "alpaca/util/sys.h"
#include "trainer_impl.h"

namespace alpaca::train {
namespace {

struct DeviceBatch {
  at::Tensor input_ids, labels, attention_mask, position_ids, segment_ids;
};

DeviceBatch to_device(const data::Batch& b, const at::Device& d) {
  auto mv = [&](const at::Tensor& t) { return t.defined() ? t.to(d) : t; };
  // A batch without padding needs no mask: the model then runs SDPA's causal kernel instead of
  // materialising a (B, 1, T, T) mask (transformers drops an all-ones mask the same way).
  const bool no_padding = b.attention_mask_bt.defined() && b.attention_mask_bt.all().item<bool>();
  return {mv(b.input_ids_bt), mv(b.labels_bt), no_padding ? at::Tensor() : mv(b.attention_mask_bt),
          mv(b.position_ids_bt), mv(b.segment_ids_bt)};
}

// The summed loss of one micro-batch through the fused chunked head (no (B, T, V) logits).
model::LossSum forward_loss(fsdp::FsdpEngine& engine, model::LlamaForCausalLM& model, const DeviceBatch& db) {
  int64_t count = 0;
  at::Tensor sum = engine.forward([&] {
    model::LossSum ls =
        model->forward_loss_sum(db.input_ids, db.labels, db.attention_mask, db.position_ids, db.segment_ids);
    count = ls.num_tokens;
    return ls.sum;
  });
  return {sum, count};
}

data::Batch collate_indices(const std::vector<data::Example>& examples, const std::vector<int64_t>& idx, int64_t pad) {
  std::vector<const data::Example*> ptrs;
  ptrs.reserve(idx.size());
  for (int64_t i : idx) ptrs.push_back(&examples.at(static_cast<size_t>(i)));
  return data::collate(ptrs, pad);
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
  metrics.write(json);
}

double Trainer::Impl::evaluate_loss() {
  at::NoGradGuard no_grad;
  const int64_t n = static_cast<int64_t>(eval_examples.size());
  ALPACA_CHECK(n > 0, "evaluation needs examples: --eval_data_path gave none");
  const int64_t b = args.per_device_eval_batch_size;
  const int64_t per_round = b * world;
  const int64_t rounds = (n + per_round - 1) / per_round;
  const int64_t pad = *tokenizer->pad_id();
  double loss_sum = 0, tokens = 0;
  for (int64_t r = 0; r < rounds; ++r) {
    std::vector<int64_t> idx;
    for (int64_t i = r * per_round + rank * b; i < std::min(n, r * per_round + (rank + 1) * b); ++i) idx.push_back(i);
    // Every rank runs the same number of forwards (FSDP gathers are collective); a rank past the
    // end of the eval set runs example 0 and does not count it.
    const bool real = !idx.empty();
    if (!real) idx.push_back(0);
    const DeviceBatch db = to_device(collate_indices(eval_examples, idx, pad), device);
    const model::LossSum ls = forward_loss(*engine, model, db);
    if (real) {
      loss_sum += ls.sum.item<double>();
      tokens += static_cast<double>(ls.num_tokens);
    }
  }
  at::Tensor red = at::tensor({loss_sum, tokens}, at::kFloat).to(device);
  comm->all_reduce(red, dist::ReduceOp::kSum)->wait();
  red = red.cpu();
  const double t = red[1].item<double>();
  return t > 0 ? red[0].item<double>() / t : std::numeric_limits<double>::quiet_NaN();
}

int Trainer::Impl::train() {
  initial_step = state.global_step;
  const int64_t pad = *tokenizer->pad_id();
  sys::Timer run_timer, window_timer;
  int64_t window_steps = 0, window_tokens = 0, window_local_tokens = 0;
  double last_grad_norm = std::numeric_limits<double>::quiet_NaN(), last_lr = 0;
  int exit_code = 0;
  std::optional<double> last_eval_loss;

  auto do_log = [&] {
    const double secs = window_timer.seconds();
    LogEntry e = {{"loss", losses.take_log_average(state.global_step)}};
    if (std::isfinite(last_grad_norm)) e.emplace_back("grad_norm", last_grad_norm);
    e.emplace_back("learning_rate", last_lr);
    e.emplace_back("epoch", state.epoch);
    const double step_time = window_steps > 0 ? secs / static_cast<double>(window_steps) : 0.0;
    const double tps = secs > 0 ? static_cast<double>(window_tokens) / secs : 0.0;
    e.emplace_back("x_step_time", step_time);
    e.emplace_back("x_tokens_per_step", window_steps > 0 ? window_tokens / window_steps : int64_t{0});
    e.emplace_back("x_tokens_per_second", tps);
    e.emplace_back("x_tokens_per_second_per_rank", secs > 0 ? static_cast<double>(window_local_tokens) / secs : 0.0);
    const MemoryStats m = memory_stats(device);
    e.emplace_back("x_host_rss_bytes", m.host_rss_bytes);
    e.emplace_back("x_host_peak_rss_bytes", m.host_peak_rss_bytes);
    if (device.is_cuda()) {
      e.emplace_back("x_gpu_allocated_bytes", m.gpu_allocated_bytes);
      e.emplace_back("x_gpu_peak_allocated_bytes", m.gpu_peak_allocated_bytes);
      e.emplace_back("x_gpu_reserved_bytes", m.gpu_reserved_bytes);
      e.emplace_back("x_gpu_peak_reserved_bytes", m.gpu_peak_reserved_bytes);
      if (peak_flops) e.emplace_back("x_mfu", mfu(tps / world, flops_per_token, *peak_flops));
    }
    log_entry(std::move(e));
    window_timer.reset();
    window_steps = window_tokens = window_local_tokens = 0;
  };
  auto do_eval = [&] {
    sys::Timer t;
    const double loss = evaluate_loss();
    LogEntry e = {{"eval_loss", loss}, {"eval_perplexity", std::exp(loss)}};
    for (const auto& kv : speed_metrics("eval", t.seconds(), static_cast<double>(eval_examples.size()),
                                        (static_cast<int64_t>(eval_examples.size()) + args.per_device_eval_batch_size * world - 1) /
                                            (args.per_device_eval_batch_size * world)))
      e.push_back(kv);
    e.emplace_back("epoch", state.epoch);
    log_entry(std::move(e));
    return loss;
  };

  while (state.global_step < length.max_steps) {
    if (step_in_epoch >= length.steps_per_epoch) {
      ++epoch;
      step_in_epoch = 0;
    }
    // ---- 1. this rank's micro-batches and the global label-token count (one all-reduce).
    std::vector<data::Batch> batches;
    int64_t local_labels = 0, local_tokens = 0;
    for (const auto& idx : sampler->micro_batches(epoch, step_in_epoch)) {
      batches.push_back(collate_indices(train_examples, idx, pad));
      local_labels += batches.back().num_label_tokens;
      local_tokens += batches.back().attention_mask_bt.sum().item<int64_t>();
    }
    at::Tensor counts = at::tensor({local_labels, local_tokens}, at::kLong).to(device);
    comm->all_reduce(counts, dist::ReduceOp::kSum)->wait();
    counts = counts.cpu();
    const int64_t global_labels = counts[0].item<int64_t>();
    const int64_t global_tokens = counts[1].item<int64_t>();
    const double denom = static_cast<double>(std::max<int64_t>(global_labels, 1));

    // ---- 2. forward + backward of every micro-batch; gradients accumulate in the fp32 shards.
    double local_loss_sum = 0;
    for (const data::Batch& b : batches) {
      const DeviceBatch db = to_device(b, device);
      const model::LossSum ls = forward_loss(*engine, model, db);
      at::Tensor loss = ls.sum / denom;
      if (scaler) loss = loss * scaler->scale();
      loss.backward();
      local_loss_sum += ls.sum.item<double>();
    }

    // ---- 3. the step's loss and the stop flag, in one all-reduce.
    const double stop_local = ckpt::stop_requested() == ckpt::StopRequest::kSaveAndExit ? 1.0 : 0.0;
    at::Tensor red = at::tensor({local_loss_sum, stop_local}, at::kFloat).to(device);
    comm->all_reduce(red, dist::ReduceOp::kSum)->wait();
    red = red.cpu();
    const double step_loss = red[0].item<double>() / denom;
    const bool stop = red[1].item<double>() > 0;
    const int64_t step_no = state.global_step + 1;

    // ---- 4. non-finite checks, clipping, AdamW, schedule.
    bool do_step = true;
    if (!std::isfinite(step_loss)) {
      ALPACA_CHECK(scaler, "the training loss is " << step_loss << " at step " << step_no << " (epoch " << epoch
                                                   << "); lower --learning_rate, check the data, or use --bf16");
      do_step = false;
    }
    const auto grads = engine->grad_shards();
    if (do_step && scaler) do_step = scaler->unscale_or_skip(grads, engine->norm_comm());
    double grad_norm = std::numeric_limits<double>::quiet_NaN();
    if (do_step) {
      grad_norm = args.max_grad_norm > 0 ? optim::clip_grad_norm(grads, args.max_grad_norm, engine->norm_comm())
                                         : optim::global_grad_norm(grads, engine->norm_comm());
      if (!std::isfinite(grad_norm)) {
        ALPACA_CHECK(scaler, "the gradient norm is " << grad_norm << " at step " << step_no << " (epoch " << epoch
                                                     << ", loss " << step_loss
                                                     << "); lower --learning_rate or check the data");
        do_step = false;
      }
    }
    const double lr = optim::learning_rate(schedule, scheduler_step);
    if (do_step) {
      optimizer->step(lr);
      ++scheduler_step;
    } else {
      ALPACA_WARN("step " << step_no << ": fp16 overflow, optimizer step skipped (loss scale now " << scaler->scale() << ")");
    }
    engine->zero_grad();

    // ---- 5. bookkeeping: HF's global_step / epoch, loss window, tokens.
    ++state.global_step;
    ++step_in_epoch;
    state.epoch = static_cast<double>(epoch) + static_cast<double>(step_in_epoch) / static_cast<double>(length.steps_per_epoch);
    state.num_input_tokens_seen += global_tokens;
    if (std::isfinite(step_loss)) losses.add_step(step_loss);
    last_grad_norm = grad_norm;
    last_lr = lr;
    ++window_steps;
    window_tokens += global_tokens;
    window_local_tokens += local_tokens;
    progress->step(state.global_step, run_timer.seconds(), initial_step);

    util::fault_pause_ms("train.pause_after_step");  // signal-mid-run tests (util/fault.h)

    // ---- 6. log / evaluate / save, as HF's DefaultFlowCallback decides.
    const bool last = state.global_step >= length.max_steps;
    const bool epoch_end = step_in_epoch >= length.steps_per_epoch;
    if ((log_interval == Interval::kSteps &&
         (state.global_step % logging_steps == 0 || (args.logging_first_step && state.global_step == 1))) ||
        (log_interval == Interval::kEpoch && epoch_end))
      do_log();
    // HF also evaluates after the last step under the steps strategy.
    if ((eval_interval == Interval::kSteps && (state.global_step % eval_steps == 0 || last)) ||
        (eval_interval == Interval::kEpoch && epoch_end))
      last_eval_loss = do_eval();
    const bool save_now = (save_interval == Interval::kSteps && (state.global_step % save_steps == 0 || last)) ||
                          (save_interval == Interval::kEpoch && epoch_end);
    if (save_now || stop) save_checkpoint();
    if (stop) {
      const int sig = ckpt::stop_signal();
      exit_code = ckpt::exit_code_for_stop(sig == 0 ? 15 : sig);
      ALPACA_WARN("stopping after step " << state.global_step << " on a signal; checkpoint saved; exit code " << exit_code);
      break;
    }
  }
  progress->finish();
  if (exit_code != 0) return exit_code;

  // ---- the end: HF's final metrics, the final export, results files.
  const double runtime = run_timer.seconds();
  const int64_t steps_run = state.global_step - initial_step;
  LogEntry final_metrics = speed_metrics("train", runtime,
                                         static_cast<double>(length.max_steps * length.global_batch_size) *
                                             static_cast<double>(steps_run) / static_cast<double>(std::max<int64_t>(length.max_steps, 1)),
                                         steps_run);
  final_metrics.emplace_back("total_flos", flops_per_token / 3.0 * static_cast<double>(state.num_input_tokens_seen));
  final_metrics.emplace_back("train_loss", losses.train_loss(state.global_step, initial_step));
  final_metrics.emplace_back("epoch", state.epoch);
  state.total_flos = flops_per_token / 3.0 * static_cast<double>(state.num_input_tokens_seen);
  // Peak host memory of every rank, for the summary and the benchmarks.
  at::Tensor mine = at::tensor({sys::peak_rss_bytes()}, at::kLong).to(device);
  at::Tensor all = at::zeros({world}, at::kLong).to(device);
  comm->all_gather_into(all, mine)->wait();
  all = all.cpu();
  LogEntry with_rss = final_metrics;
  for (int r = 0; r < world; ++r) with_rss.emplace_back("x_peak_host_rss_bytes_rank" + std::to_string(r), all[r].item<int64_t>());
  log_entry(with_rss);
  if (rank == 0 && metrics.enabled()) {
    // One list for tools (bench.py reads it).
    std::string list = "[";
    for (int r = 0; r < world; ++r) list += (r ? "," : "") + std::to_string(all[r].item<int64_t>());
    ALPACA_INFO("peak host RSS per rank (bytes): " << list << "]");
  }
  save_final();
  if (rank == 0) save_metrics(output_dir, "train", final_metrics);
  if (last_eval_loss && rank == 0)
    save_metrics(output_dir, "eval",
                 {{"eval_loss", *last_eval_loss}, {"eval_perplexity", std::exp(*last_eval_loss)}, {"epoch", state.epoch}});
  barrier();
  return 0;
}

}  // namespace alpaca::train
