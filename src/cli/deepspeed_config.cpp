// Maps a DeepSpeed ZeRO JSON config onto TrainArgs (see deepspeed_config.h for the mapping).
// "auto" follows the flags as in transformers' HfTrainerDeepSpeedConfig; an explicit value must
// agree with the flag it mirrors, else the user is told which one to change.
#include "alpaca/cli/deepspeed_config.h"

#include <nlohmann/json.hpp>  // defines: nlohmann::json

#include <cctype>
#include <cmath>
#include <cstdlib>

#include "alpaca/cli/flag_table.h"
#include "alpaca/cli/train_args.h"
#include "alpaca/cli/usage_error.h"
#include "alpaca/optim/lr_schedule.h"

namespace alpaca::cli {
namespace {

using nlohmann::json;

class DeepSpeedMapper {
 public:
  DeepSpeedMapper(json root, std::string source, TrainArgs& args, int world_size)
      : root_(std::move(root)), source_(std::move(source)), args_(args), world_size_(world_size) {}

  void run() {
    check_keys(root_, "", {"bf16", "fp16", "optimizer", "scheduler", "zero_optimization", "gradient_accumulation_steps",
                           "gradient_clipping", "steps_per_print", "train_batch_size", "train_micro_batch_size_per_gpu",
                           "wall_clock_breakdown"});
    map_precision();
    map_optimizer();
    map_scheduler();
    map_zero();
    map_batch();
  }

 private:
  [[noreturn]] void fail(const std::string& key, const std::string& what) {
    ALPACA_USAGE_FAIL("--deepspeed " << source_ << ": " << key << " " << what);
  }

  void note(const std::string& key, const std::string& what) {
    args_.notes.push_back("--deepspeed " + source_ + ": " + key + ": " + what);
  }

  void check_keys(const json& obj, const std::string& path, const std::vector<std::string>& allowed) {
    if (!obj.is_object()) fail(path.empty() ? "the config" : path, "must be a JSON object");
    for (const auto& [key, v] : obj.items()) {
      bool ok = false;
      for (const auto& a : allowed) ok = ok || a == key;
      if (ok) continue;
      std::string guess = closest_name(key, allowed);
      fail(path + (path.empty() ? "" : ".") + key,
           "is not supported by alpaca-train's FSDP engine" + (guess.empty() ? std::string("; remove it") : "; did you mean '" + guess + "'?"));
    }
  }

  static bool is_auto(const json& v) { return v.is_string() && v.get<std::string>() == "auto"; }

  // An explicit number must equal the flag it mirrors (HF's "mismatch" rule); "auto" takes the flag.
  void match_number(const json& v, const std::string& key, const std::string& flag, double flag_value) {
    if (is_auto(v)) return;
    if (!v.is_number()) fail(key, "must be a number or \"auto\", got " + v.dump());
    double x = v.get<double>();
    if (std::fabs(x - flag_value) > 1e-12 * std::max(1.0, std::fabs(flag_value))) {
      fail(key, "is " + v.dump() + " but --" + flag + " is " + flag_value_text(args_, flag) +
                    "; set it to \"auto\" or pass --" + flag + " " + v.dump());
    }
  }

  void match_bool(const json& v, const std::string& key, const std::string& flag, bool flag_value) {
    if (is_auto(v)) return;
    if (!v.is_boolean()) fail(key, "must be true, false or \"auto\", got " + v.dump());
    if (v.get<bool>() != flag_value) {
      fail(key, "is " + v.dump() + " but --" + flag + " is " + flag_value_text(args_, flag) + "; set it to \"auto\" or pass --" +
                    flag + (v.get<bool>() ? " True" : " False"));
    }
  }

  void map_precision() {
    if (root_.contains("bf16")) {
      check_keys(root_["bf16"], "bf16", {"enabled"});
      if (root_["bf16"].contains("enabled")) match_bool(root_["bf16"]["enabled"], "bf16.enabled", "bf16", args_.bf16);
    }
    if (root_.contains("fp16")) {
      // Dynamic loss scaling is the trainer's (torch's GradScaler, as HF's fp16); DeepSpeed's scaler
      // tuning keys have no equivalent when fp16 trains. Without --fp16 the section is off, as it is in
      // DeepSpeed, and the tuning keys the HF docs' ZeRO configs carry ("enabled": "auto") do nothing.
      if (args_.fp16)
        check_keys(root_["fp16"], "fp16", {"enabled", "loss_scale"});
      else
        check_keys(root_["fp16"], "fp16", {"enabled", "loss_scale", "initial_scale_power", "loss_scale_window",
                                           "hysteresis", "consecutive_hysteresis", "min_loss_scale", "auto_cast"});
      const json& fp16 = root_["fp16"];
      if (fp16.contains("enabled")) match_bool(fp16["enabled"], "fp16.enabled", "fp16", args_.fp16);
      if (args_.fp16 && fp16.contains("loss_scale") && !(fp16["loss_scale"].is_number() && fp16["loss_scale"].get<double>() == 0)) {
        fail("fp16.loss_scale", "must be 0 (dynamic loss scaling); a static loss scale is not supported");
      }
    }
  }

  void map_optimizer() {
    if (!root_.contains("optimizer")) return;  // HF then builds AdamW from the flags
    const json& opt = root_["optimizer"];
    check_keys(opt, "optimizer", {"type", "params"});
    if (!opt.contains("type") || !opt["type"].is_string()) fail("optimizer.type", "must name the optimizer, e.g. \"AdamW\"");
    const std::string type = opt["type"].get<std::string>();
    // DeepSpeed lower-cases the name; "Adam" runs AdamW too unless adam_w_mode is false.
    std::string lowered = type;
    for (auto& ch : lowered) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
    if (lowered != "adamw" && lowered != "adam") fail("optimizer.type", "'" + type + "' is not supported; use AdamW (or remove the optimizer block)");
    // With an optimizer block DeepSpeed builds its own AdamW (fp32 moments) and --optim is not used.
    if (args_.optim != "adamw_torch" && args_.optim != "adamw_torch_fused")
      fail("optimizer", "makes DeepSpeed's own AdamW (fp32 moments), which --optim " + args_.optim +
                            " contradicts; remove the optimizer block to use " + args_.optim);
    if (!opt.contains("params")) return;
    const json& p = opt["params"];
    check_keys(p, "optimizer.params", {"lr", "betas", "eps", "weight_decay", "adam_w_mode", "torch_adam", "bias_correction"});
    if (p.contains("adam_w_mode") && !(p["adam_w_mode"].is_boolean() && (p["adam_w_mode"].get<bool>() || lowered == "adamw"))) {
      fail("optimizer.params.adam_w_mode", "must be true: Adam with L2 weight decay (adam_w_mode false) is not supported, only "
                                           "AdamW's decoupled decay");
    }
    if (p.contains("torch_adam") && !p["torch_adam"].is_boolean()) fail("optimizer.params.torch_adam", "must be true or false");
    if (p.contains("bias_correction") && !(p["bias_correction"].is_boolean() && p["bias_correction"].get<bool>())) {
      fail("optimizer.params.bias_correction", "must be true (AdamW's bias correction is always applied)");
    }
    if (p.contains("lr")) match_number(p["lr"], "optimizer.params.lr", "learning_rate", args_.learning_rate);
    if (p.contains("eps")) match_number(p["eps"], "optimizer.params.eps", "adam_epsilon", args_.adam_epsilon);
    if (p.contains("weight_decay")) match_number(p["weight_decay"], "optimizer.params.weight_decay", "weight_decay", args_.weight_decay);
    if (p.contains("betas") && !is_auto(p["betas"])) {
      const json& b = p["betas"];
      if (!b.is_array() || b.size() != 2) fail("optimizer.params.betas", "must be [beta1, beta2] or \"auto\"");
      match_number(b[0], "optimizer.params.betas[0]", "adam_beta1", args_.adam_beta1);
      match_number(b[1], "optimizer.params.betas[1]", "adam_beta2", args_.adam_beta2);
    }
  }

  // A scheduler block makes HF Trainer run DeepSpeed's own class instead of --lr_scheduler_type;
  // so does alpaca-train (optim::ScheduleType::kDeepSpeed*), with HF's "auto" fills: warmup_min_lr 0,
  // warmup_max_lr --learning_rate, warmup_num_steps max(1, the flags' warmup), total_num_steps the
  // run's step count. An absent key takes DeepSpeed's default, as there.
  void map_scheduler() {
    if (!root_.contains("scheduler")) return;  // HF then uses --lr_scheduler_type
    const json& sch = root_["scheduler"];
    check_keys(sch, "scheduler", {"type", "params"});
    if (!sch.contains("type") || !sch["type"].is_string()) fail("scheduler.type", "must name the scheduler, e.g. \"WarmupDecayLR\"");
    const std::string type = sch["type"].get<std::string>();
    optim::LrSchedule s;
    std::vector<std::string> keys = {"warmup_num_steps", "warmup_type", "last_batch_iteration"};
    const bool cosine = type == "WarmupCosineLR";
    if (type == "WarmupLR") {
      s.type = optim::ScheduleType::kDeepSpeedWarmupLR;
    } else if (type == "WarmupDecayLR") {
      s.type = optim::ScheduleType::kDeepSpeedWarmupDecayLR;
      keys.push_back("total_num_steps");
    } else if (cosine) {
      s.type = optim::ScheduleType::kDeepSpeedWarmupCosineLR;
      keys.insert(keys.end(), {"total_num_steps", "warmup_min_ratio", "cos_min_ratio"});
    } else {
      fail("scheduler.type", "'" + type + "' is not supported; use WarmupLR, WarmupDecayLR or WarmupCosineLR (or remove the "
                                          "scheduler block and choose --lr_scheduler_type)");
    }
    if (!cosine) keys.insert(keys.end(), {"warmup_min_lr", "warmup_max_lr"});
    // Values, not whether a flag was given: a run's training_args.json (every flag, defaults
    // included) replays as --config.
    if (args_.lr_scheduler_type != "linear") {
      fail("scheduler", "decides the schedule (DeepSpeed's " + type + "), so --lr_scheduler_type " + args_.lr_scheduler_type +
                            " would not be used; drop one of them");
    }
    if (args_.lr_scheduler_kwargs_json != "{}") {
      fail("scheduler", "decides the schedule, so --lr_scheduler_kwargs would not be used; give the schedule's arguments as "
                        "scheduler.params");
    }
    const json p = sch.contains("params") ? sch["params"] : json::object();
    check_keys(p, "scheduler.params", keys);
    optim::DeepSpeedScheduleParams& d = s.deepspeed;

    if (p.contains("last_batch_iteration") && !(p["last_batch_iteration"].is_number_integer() &&
                                                p["last_batch_iteration"].get<int64_t>() == -1)) {
      fail("scheduler.params.last_batch_iteration", "must be -1 (a resumed run restores its step from the checkpoint)");
    }
    if (p.contains("warmup_min_lr") && !is_auto(p["warmup_min_lr"])) {
      d.warmup_min_lr = nonnegative(p["warmup_min_lr"], "scheduler.params.warmup_min_lr");
    }
    if (p.contains("warmup_max_lr")) {
      match_number(p["warmup_max_lr"], "scheduler.params.warmup_max_lr", "learning_rate", args_.learning_rate);
      d.warmup_max_lr = args_.learning_rate;  // "auto" or the same value
    } else if (s.type == optim::ScheduleType::kDeepSpeedWarmupDecayLR && args_.learning_rate != 0.001) {
      fail("scheduler.params.warmup_max_lr", "is absent, so DeepSpeed's WarmupDecayLR would peak at its default 0.001, not "
                                             "--learning_rate " + flag_value_text(args_, "learning_rate") +
                                             "; set it to \"auto\"");
    }
    if (cosine) {
      for (const char* key : {"warmup_min_ratio", "cos_min_ratio"}) {
        if (!p.contains(key)) continue;
        const double v = nonnegative(p[key], std::string("scheduler.params.") + key);
        if (v > 1) fail(std::string("scheduler.params.") + key, "must be in [0, 1] (a fraction of --learning_rate)");
        (std::string(key) == "warmup_min_ratio" ? d.warmup_min_ratio : d.cos_min_ratio) = v;
      }
    }

    std::string warmup_type = "log";
    if (p.contains("warmup_type")) {
      if (!p["warmup_type"].is_string()) fail("scheduler.params.warmup_type", "must be \"log\" or \"linear\"");
      warmup_type = p["warmup_type"].get<std::string>();
      if (warmup_type != "log" && warmup_type != "linear") fail("scheduler.params.warmup_type", "'" + warmup_type + "' is not supported; use \"log\" or \"linear\"");
    }
    d.log_warmup = warmup_type == "log";

    std::string warmup_text = "max(2, max(1, the warmup of --warmup_steps/--warmup_ratio))";
    if (!p.contains("warmup_num_steps")) {
      if ((args_.warmup_steps != 0 && args_.warmup_steps != 1000) || args_.warmup_ratio != 0) {
        fail("scheduler.params.warmup_num_steps", "is absent, so DeepSpeed warms up over its default 1000 steps and --" +
                                                      std::string(args_.warmup_ratio != 0 ? "warmup_ratio" : "warmup_steps") +
                                                      " would not be used; set it to \"auto\"");
      }
      args_.warmup_steps = 1000;  // DeepSpeed's default
      warmup_text = "1000 (DeepSpeed's default: the config does not set warmup_num_steps)";
    } else if (!is_auto(p["warmup_num_steps"])) {
      const json& w = p["warmup_num_steps"];
      if (!w.is_number_integer() || w.get<int64_t>() <= 0) {
        fail("scheduler.params.warmup_num_steps", "must be a positive step count or \"auto\" (DeepSpeed refuses " + w.dump() + ")");
      }
      if (args_.warmup_ratio > 0) {
        fail("scheduler.params.warmup_num_steps", "and --warmup_ratio both set the warmup; set it to \"auto\" or drop --warmup_ratio");
      }
      match_number(w, "scheduler.params.warmup_num_steps", "warmup_steps",
                   args_.is_set("warmup_steps") ? args_.warmup_steps : w.get<double>());
      args_.warmup_steps = static_cast<double>(w.get<int64_t>());
      warmup_text = "max(2, " + w.dump() + ")";
    }

    if (s.type != optim::ScheduleType::kDeepSpeedWarmupLR) {
      if (!p.contains("total_num_steps")) {
        fail("scheduler.params.total_num_steps", "is missing (DeepSpeed's " + type + " requires it); set it to \"auto\"");
      }
      const json& t = p["total_num_steps"];
      if (!is_auto(t)) {
        if (!t.is_number_integer() || t.get<int64_t>() <= 0) fail("scheduler.params.total_num_steps", "must be a positive step count or \"auto\"");
        d.total_num_steps = t.get<int64_t>();  // the trainer checks it against the run's length
      }
    }
    args_.deepspeed_schedule = s;
    note("scheduler", "DeepSpeed's " + type + " decides the learning rate (not --lr_scheduler_type): " + warmup_type +
                          " warmup over " + warmup_text + " steps" +
                          (s.type == optim::ScheduleType::kDeepSpeedWarmupDecayLR   ? ", then linear decay to 0"
                           : s.type == optim::ScheduleType::kDeepSpeedWarmupCosineLR ? ", then cosine decay"
                                                                                     : ", then constant") +
                          "; stepped as DeepSpeedEngine steps it, one iteration behind the optimizer step");
  }

  double nonnegative(const json& v, const std::string& key) {
    if (!v.is_number() || v.get<double>() < 0) fail(key, "must be a number >= 0, got " + v.dump());
    return v.get<double>();
  }

  void map_zero() {
    if (!root_.contains("zero_optimization")) fail("zero_optimization", "is missing: give a ZeRO stage (3 = full_shard)");
    const json& z = root_["zero_optimization"];
    // Tuning knobs of DeepSpeed's bucketing/prefetching; they change speed, never results. The
    // engine's units are decoder layers, so they have no equivalent here.
    const std::vector<std::string> tuning = {"sub_group_size", "reduce_bucket_size", "allgather_bucket_size",
                                             "stage3_prefetch_bucket_size", "stage3_param_persistence_threshold",
                                             "stage3_max_live_parameters", "stage3_max_reuse_distance"};
    std::vector<std::string> allowed = {"stage", "offload_optimizer", "offload_param", "overlap_comm", "contiguous_gradients",
                                        "allgather_partitions", "reduce_scatter", "stage3_gather_16bit_weights_on_model_save"};
    allowed.insert(allowed.end(), tuning.begin(), tuning.end());
    check_keys(z, "zero_optimization", allowed);

    if (!z.contains("stage") || !z["stage"].is_number_integer()) fail("zero_optimization.stage", "must be 0, 2 or 3");
    int stage = z["stage"].get<int>();
    std::string strategy;
    if (stage == 3) strategy = "full_shard";
    else if (stage == 2) strategy = "shard_grad_op";
    else if (stage == 0) strategy = "no_shard";
    else fail("zero_optimization.stage", std::to_string(stage) + " is not supported: use 3 (full_shard), 2 (shard_grad_op) or 0 (no_shard)");

    bool offload_optimizer = offload_device(z, "offload_optimizer");
    bool offload_param = offload_device(z, "offload_param");
    if (offload_param && stage != 3) fail("zero_optimization.offload_param", "needs stage 3 (as in DeepSpeed)");
    if (offload_param && !offload_optimizer) {
      fail("zero_optimization.offload_param", "without offload_optimizer has no equivalent: the engine's offload keeps the fp32 "
                                              "parameter shards and the optimizer state on the CPU together; add "
                                              "\"offload_optimizer\": {\"device\": \"cpu\"}");
    }
    if (offload_optimizer && stage == 0) fail("zero_optimization.offload_optimizer", "needs stage 2 or 3 (nothing is sharded at stage 0)");

    for (const char* key : {"contiguous_gradients", "allgather_partitions", "reduce_scatter"}) {
      if (z.contains(key) && !(z[key].is_boolean() && z[key].get<bool>())) {
        fail(std::string("zero_optimization.") + key, "must be true: the engine always keeps gradients in one flat buffer per unit "
                                                      "and reduce-scatters/all-gathers them");
      }
    }
    if (z.contains("overlap_comm")) {
      if (!z["overlap_comm"].is_boolean()) fail("zero_optimization.overlap_comm", "must be true or false");
      note("zero_optimization.overlap_comm", "the engine always overlaps communication with compute on GPU (own streams)");
    }
    std::string tuning_given;
    for (const auto& key : tuning) {
      if (!z.contains(key)) continue;
      if (!is_auto(z[key]) && !z[key].is_number()) fail("zero_optimization." + key, "must be a number or \"auto\"");
      tuning_given += (tuning_given.empty() ? "" : ", ") + key;
    }
    if (!tuning_given.empty()) {
      note("zero_optimization", "DeepSpeed bucketing/prefetch tuning (" + tuning_given +
                                    ") has no equivalent here (FSDP units are decoder layers); it never changes results");
    }
    if (z.contains("stage3_gather_16bit_weights_on_model_save")) {
      if (!z["stage3_gather_16bit_weights_on_model_save"].is_boolean()) {
        fail("zero_optimization.stage3_gather_16bit_weights_on_model_save", "must be true or false");
      }
      note("zero_optimization.stage3_gather_16bit_weights_on_model_save",
           "the final model is always exported as a full HF directory, gathered one layer at a time");
    }

    // validate_train_args builds the FSDP policy from these words (fsdp::build_fsdp_policy).
    args_.fsdp_words = strategy + " auto_wrap" + (offload_optimizer ? " offload" : "");
    args_.deepspeed_zero_stage = stage;
  }

  // offload_* {device: cpu|none, pin_memory}: true when it moves state to the CPU.
  bool offload_device(const json& z, const std::string& key) {
    if (!z.contains(key)) return false;
    const std::string path = "zero_optimization." + key;
    check_keys(z[key], path, {"device", "pin_memory"});
    std::string device = z[key].value("device", "none");
    if (z[key].contains("pin_memory") && !z[key]["pin_memory"].is_boolean()) fail(path + ".pin_memory", "must be true or false");
    if (device == "cpu") return true;
    if (device == "none") return false;
    fail(path + ".device", "'" + device + "' is not supported; use \"cpu\" or \"none\"");
  }

  void map_batch() {
    if (root_.contains("gradient_accumulation_steps")) {
      match_number(root_["gradient_accumulation_steps"], "gradient_accumulation_steps", "gradient_accumulation_steps",
                   static_cast<double>(args_.gradient_accumulation_steps));
    }
    if (root_.contains("gradient_clipping")) {
      match_number(root_["gradient_clipping"], "gradient_clipping", "max_grad_norm", args_.max_grad_norm);
    } else if (args_.max_grad_norm != 1.0) {
      // HF leaves clipping to the engine, and DeepSpeed's default gradient_clipping is 1.0.
      fail("gradient_clipping", "is absent, so DeepSpeed clips at its default 1.0 and --max_grad_norm " +
                                    flag_value_text(args_, "max_grad_norm") + " would not be used; add \"gradient_clipping\": \"auto\"");
    }
    if (root_.contains("train_micro_batch_size_per_gpu")) {
      match_number(root_["train_micro_batch_size_per_gpu"], "train_micro_batch_size_per_gpu", "per_device_train_batch_size",
                   static_cast<double>(args_.per_device_train_batch_size));
    }
    if (root_.contains("train_batch_size") && !is_auto(root_["train_batch_size"])) {
      const json& v = root_["train_batch_size"];
      if (!v.is_number_integer()) fail("train_batch_size", "must be an integer or \"auto\"");
      const int64_t world = world_size_;
      int64_t expected = args_.per_device_train_batch_size * args_.gradient_accumulation_steps * world;
      if (v.get<int64_t>() != expected) {
        fail("train_batch_size", "is " + v.dump() + " but per_device_train_batch_size x gradient_accumulation_steps x ranks = " +
                                     std::to_string(args_.per_device_train_batch_size) + " x " +
                                     std::to_string(args_.gradient_accumulation_steps) + " x " + std::to_string(world) + " = " +
                                     std::to_string(expected) + "; set it to \"auto\"");
      }
    }
    if (root_.contains("steps_per_print")) {
      note("steps_per_print", "DeepSpeed's own progress print; alpaca-train logs every --logging_steps");
    }
    if (root_.contains("wall_clock_breakdown") && !(root_["wall_clock_breakdown"].is_boolean() && !root_["wall_clock_breakdown"].get<bool>())) {
      fail("wall_clock_breakdown", "must be false: DeepSpeed's timing breakdown has no equivalent");
    }
  }

  json root_;
  std::string source_;
  TrainArgs& args_;
  int world_size_;
};

}  // namespace

void apply_deepspeed_config(const std::string& path_or_json, TrainArgs& args, int world_size) {
  std::string text = path_or_json;
  std::string source = "(inline JSON)";
  size_t first = path_or_json.find_first_not_of(" \t\n");
  if (first == std::string::npos || path_or_json[first] != '{') {
    text = read_flag_file("deepspeed", path_or_json,
                          "a DeepSpeed JSON config, e.g. configs/default_offload_opt_param.json");
    source = path_or_json;
  }
  json root;
  try {
    root = json::parse(text, nullptr, true, /*ignore_comments=*/true);
  } catch (const json::exception& e) {
    ALPACA_USAGE_FAIL("--deepspeed " << source << " is not valid JSON: " << e.what());
  }
  DeepSpeedMapper(std::move(root), source, args, world_size).run();
}

}  // namespace alpaca::cli
