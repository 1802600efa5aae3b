// Maps a DeepSpeed ZeRO JSON config onto TrainArgs (see deepspeed_config.h for the mapping).
// "auto" follows the flags as in transformers' HfTrainerDeepSpeedConfig; an explicit value must
// agree with the flag it mirrors, else the user is told which one to change.
#include "alpaca/cli/deepspeed_config.h"

#include <nlohmann/json.hpp>  // defines: nlohmann::json

#include <cmath>
#include <cstdlib>

#include "alpaca/cli/flag_table.h"
#include "alpaca/cli/train_args.h"
#include "alpaca/cli/usage_error.h"

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
    std::string type = opt.value("type", "");
    if (type != "AdamW" && type != "adamw") fail("optimizer.type", "'" + type + "' is not supported; use AdamW (or remove the optimizer block)");
    if (!opt.contains("params")) return;
    const json& p = opt["params"];
    check_keys(p, "optimizer.params", {"lr", "betas", "eps", "weight_decay"});
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

  void map_scheduler() {
    if (!root_.contains("scheduler")) return;  // HF then uses --lr_scheduler_type
    const json& sch = root_["scheduler"];
    check_keys(sch, "scheduler", {"type", "params"});
    std::string type = sch.value("type", "");
    std::string mapped;
    if (type == "WarmupDecayLR") mapped = "linear";
    else if (type == "WarmupLR") mapped = "constant_with_warmup";
    else fail("scheduler.type", "'" + type + "' is not supported; use WarmupDecayLR or WarmupLR (or remove the scheduler block)");
    if (args_.is_set("lr_scheduler_type") && args_.lr_scheduler_type != mapped) {
      fail("scheduler.type", type + " (= " + mapped + ") contradicts --lr_scheduler_type " + args_.lr_scheduler_type +
                                 "; drop one of them");
    }
    args_.lr_scheduler_type = mapped;
    json p = sch.contains("params") ? sch["params"] : json::object();
    std::vector<std::string> keys = {"warmup_min_lr", "warmup_max_lr", "warmup_num_steps", "warmup_type"};
    if (type == "WarmupDecayLR") keys.push_back("total_num_steps");
    check_keys(p, "scheduler.params", keys);
    if (p.contains("total_num_steps") && !is_auto(p["total_num_steps"])) {
      fail("scheduler.params.total_num_steps", "must be \"auto\" (the trainer computes it); use --max_steps to fix the length");
    }
    if (p.contains("warmup_min_lr") && !is_auto(p["warmup_min_lr"]) &&
        !(p["warmup_min_lr"].is_number() && p["warmup_min_lr"].get<double>() == 0)) {
      fail("scheduler.params.warmup_min_lr", "must be 0 or \"auto\": HF schedules warm up from 0");
    }
    if (p.contains("warmup_max_lr")) match_number(p["warmup_max_lr"], "scheduler.params.warmup_max_lr", "learning_rate", args_.learning_rate);
    if (p.contains("warmup_num_steps") && !is_auto(p["warmup_num_steps"])) {
      const json& w = p["warmup_num_steps"];
      if (!w.is_number_integer() || w.get<int64_t>() < 0) fail("scheduler.params.warmup_num_steps", "must be a step count >= 0 or \"auto\"");
      if (args_.warmup_ratio > 0) {
        fail("scheduler.params.warmup_num_steps", "and --warmup_ratio both set the warmup; set it to \"auto\" or drop --warmup_ratio");
      }
      match_number(w, "scheduler.params.warmup_num_steps", "warmup_steps",
                   args_.is_set("warmup_steps") ? args_.warmup_steps : w.get<double>());
      args_.warmup_steps = static_cast<double>(w.get<int64_t>());
    }
    std::string warmup_type = p.value("warmup_type", "");
    if (warmup_type.empty()) {
      note("scheduler.params.warmup_type", "absent; DeepSpeed's own default warmup is logarithmic, alpaca-train warms up "
                                           "linearly as HF's " + mapped + " schedule (add \"warmup_type\": \"linear\" to say so)");
    } else if (warmup_type != "linear") {
      fail("scheduler.params.warmup_type", "'" + warmup_type + "' is not supported; use \"linear\"");
    }
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
