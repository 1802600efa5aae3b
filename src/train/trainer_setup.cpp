// Trainer setup: flags -> options structs, tokenizer + [PAD], model + resize, data, sampler,
// FSDP engine, AdamW, LR schedule. Everything a rank needs before the first step.
#include <ATen/ATen.h>
#include <ATen/detail/CUDAHooksInterface.h>  // defines: at::detail::getCUDAHooks

#include <cmath>
#include <iostream>
#include <nlohmann/json.hpp>  // defines: nlohmann::json

#include "alpaca/ckpt/checkpoint_dir.h"
#include "alpaca/ckpt/preemption.h"
#include "alpaca/data/alpaca_record.h"
#include "alpaca/data/packing.h"
#include "alpaca/dist/runtime.h"
#include "alpaca/fsdp/policy.h"
#include "alpaca/fsdp/load_checkpoint.h"
#include "alpaca/io/hf_model.h"
#include "alpaca/train/throughput.h"
#include "alpaca/util/error.h"
#include "alpaca/util/log.h"
#include "alpaca/util/sys.h"
#include "trainer_impl.h"

namespace fs = std::filesystem;

namespace alpaca::train {

Interval parse_interval(const std::string& word, const std::string& flag) {
  if (word == "no") return Interval::kNo;
  if (word == "steps") return Interval::kSteps;
  if (word == "epoch") return Interval::kEpoch;
  ALPACA_FAIL(flag << " '" << word << "' is not a strategy; use no, steps or epoch");
}

RunLength compute_run_length(int64_t steps_per_epoch, int64_t global_batch, int64_t max_steps_flag,
                             double num_train_epochs) {
  ALPACA_CHECK(steps_per_epoch > 0, "the training data gives no optimizer step per epoch; use more examples or a "
                                    "smaller --per_device_train_batch_size / --gradient_accumulation_steps");
  RunLength r;
  r.steps_per_epoch = steps_per_epoch;
  r.global_batch_size = global_batch;
  if (max_steps_flag > 0) {
    r.max_steps = max_steps_flag;
    r.num_train_epochs = (max_steps_flag + steps_per_epoch - 1) / steps_per_epoch;
  } else {
    r.max_steps = static_cast<int64_t>(std::ceil(num_train_epochs * static_cast<double>(steps_per_epoch)));
    r.num_train_epochs = static_cast<int64_t>(std::ceil(num_train_epochs));
  }
  ALPACA_CHECK(r.max_steps > 0, "the run has no optimizer step: set --max_steps > 0 or --num_train_epochs > 0");
  return r;
}

bool dir_holds_model(const fs::path& dir) {
  if (!fs::is_directory(dir)) return false;
  for (const auto& e : fs::directory_iterator(dir)) {
    const std::string n = e.path().filename().string();
    if (n == "config.json" || n == "model.safetensors" || n == "model.safetensors.index.json" ||
        n == "pytorch_model.bin" || n == "pytorch_model.bin.index.json")
      return true;
  }
  return false;
}

namespace {

ckpt::Fingerprint model_fingerprint_of(const model::LlamaConfig& c) {
  return {{"hidden_size", std::to_string(c.hidden_size)},
          {"intermediate_size", std::to_string(c.intermediate_size)},
          {"num_hidden_layers", std::to_string(c.num_hidden_layers)},
          {"num_attention_heads", std::to_string(c.num_attention_heads)},
          {"num_key_value_heads", std::to_string(c.num_key_value_heads)},
          {"vocab_size", std::to_string(c.vocab_size)},
          {"tie_word_embeddings", c.tie_word_embeddings ? "true" : "false"}};
}

bool cuda_available() {
  return at::detail::getCUDAHooks().hasCUDA() && at::detail::getCUDAHooks().deviceCount() > 0;
}

}  // namespace

Trainer::Impl::Impl(const cli::TrainArgs& a) : args(a) {}

void Trainer::Impl::setup_tokenizer_and_model() {
  const fs::path base = args.model_name_or_path;
  ALPACA_CHECK(fs::is_directory(base), "--model_name_or_path " << base << " is not a directory; give a local Hugging Face "
                                                                 "LLaMA directory (config.json, weights, tokenizer.model)");
  tokenizer.emplace(data::Tokenizer::load(base.string()));
  // train.py: add [PAD] when the tokenizer has no pad token, then always resize to len(tokenizer).
  if (!tokenizer->pad_id()) tokenizer->set_pad_token("[PAD]");
  tokenizer->set_model_max_length(args.model_max_length);

  model::LlamaConfig base_cfg = model::LlamaConfig::from_json_file((base / "config.json").string());
  model::LlamaConfig resized = base_cfg;
  resized.vocab_size = tokenizer->vocab_size();
  model_fingerprint = model_fingerprint_of(resized);
  const fs::path tok_model = fs::is_regular_file(base / "tokenizer.model") ? base / "tokenizer.model" : base;
  tokenizer_fingerprint = {{"tokenizer.model sha256", ckpt::sha256_file(tok_model.string())},
                           {"vocab_size", std::to_string(tokenizer->vocab_size())},
                           {"pad_token", tokenizer->pad_token().value_or("")}};

  if (resume_dir) {
    const auto rs = ckpt::ResumeState::load((*resume_dir / ckpt::kResumeStateName).string());
    // The tokenizer first: a different tokenizer also changes the vocabulary, and so the model.
    std::string why = ckpt::fingerprint_mismatch("tokenizer", rs.tokenizer, tokenizer_fingerprint);
    ALPACA_CHECK(why.empty(), "cannot resume from " << resume_dir->string() << ": " << why << " (the tokenizer of "
                                                    << base.string()
                                                    << "); resume with the tokenizer the checkpoint was trained with");
    why = ckpt::fingerprint_mismatch("model", rs.model, model_fingerprint);
    ALPACA_CHECK(why.empty(), "cannot resume from " << resume_dir->string() << ": " << why
                                                    << " (--model_name_or_path " << base.string()
                                                    << "); resume with the model the checkpoint was trained from");
    weights_dir = *resume_dir;
  } else {
    weights_dir = base;
  }
  // No rank materialises the whole model (stanford_alpaca's "killed -9" on 8-GPU nodes): build it
  // on the meta device with the final vocabulary; setup_engine reads each rank's shards straight
  // from the checkpoint, filling [PAD] rows with the mean of the stored rows as train.py does.
  // A checkpoint to resume from already has len(tokenizer) rows (its fingerprint was checked above).
  const int64_t stored_vocab = resume_dir ? resized.vocab_size : base_cfg.vocab_size;
  if (stored_vocab <= tokenizer->vocab_size()) {
    grow_vocab = stored_vocab < tokenizer->vocab_size();
    if (grow_vocab)
      ALPACA_INFO("resizing the embeddings from " << stored_vocab << " to " << tokenizer->vocab_size()
                                                  << " rows (mean-initialised, as train.py)");
    model = model::LlamaForCausalLM(resized, at::TensorOptions().device(at::kMeta).dtype(at::kFloat));
  } else {
    // Shrinking to len(tokenizer) (train.py always resizes) is rare: load whole, then resize.
    ALPACA_WARN("the checkpoint has " << stored_vocab << " embedding rows but the tokenizer only "
                                      << tokenizer->vocab_size() << "; loading it whole on every rank to shrink it");
    model = io::load_hf_model(weights_dir.string(), at::kFloat);
    model->resize_token_embeddings(tokenizer->vocab_size());
    weights_loaded = true;
  }
  const auto& c = model->config();
  flops_per_token = train::flops_per_token(model::num_parameters(model), c.num_hidden_layers, c.hidden_size,
                                           args.model_max_length);
}

void Trainer::Impl::setup_data() {
  ALPACA_CHECK(!args.data_path.empty(), "--data_path is required: an Alpaca JSON file of {instruction, input, output}");
  const auto records = data::load_alpaca_records(args.data_path);
  data::TokenizeStats stats;
  train_examples = data::tokenize_alpaca(records, *tokenizer, args.model_max_length, 0, &stats);
  ALPACA_INFO("tokenized " << train_examples.size() << " training examples from " << args.data_path << " ("
                           << stats.num_truncated << " truncated to " << args.model_max_length << " tokens, "
                           << stats.num_no_label_tokens << " with no response tokens left)");
  if (args.packing) {
    data::PackingStats ps;
    train_examples = data::pack_examples(train_examples, args.model_max_length, &ps);
    ALPACA_INFO("packed into " << ps.num_blocks << " sequences of up to " << args.model_max_length << " tokens ("
                               << static_cast<int>(ps.fill_ratio * 100) << "% filled)");
  }
  if (eval_interval != Interval::kNo) {
    ALPACA_CHECK(!args.eval_data_path.empty(), "--eval_strategy " << args.eval_strategy
                                                                  << " needs --eval_data_path (an Alpaca JSON file)");
    eval_examples = data::tokenize_alpaca(data::load_alpaca_records(args.eval_data_path), *tokenizer,
                                          args.model_max_length);
  }
  data::SamplerOptions so;
  so.per_device_batch = args.per_device_train_batch_size;
  so.grad_accum = args.gradient_accumulation_steps;
  so.world_size = world;
  so.rank = rank;
  so.seed = static_cast<uint64_t>(cli::effective_data_seed(args));
  so.drop_last = args.dataloader_drop_last;
  so.group_by_length = args.group_by_length;
  if (args.group_by_length)
    for (const auto& e : train_examples) so.lengths.push_back(static_cast<int64_t>(e.input_ids.size()));
  sampler = std::make_unique<data::DistributedBatchSampler>(static_cast<int64_t>(train_examples.size()), so);
  length = compute_run_length(sampler->steps_per_epoch(), sampler->global_batch_size(), args.max_steps,
                              args.num_train_epochs);
}

void Trainer::Impl::setup_engine() {
  fsdp::FsdpPolicyInputs in;
  for (cli::FsdpOption o : args.fsdp_options) in.fsdp += (in.fsdp.empty() ? "" : " ") + cli::fsdp_option_name(o);
  in.fsdp_config = args.fsdp_config_json;
  in.mixed_precision = args.bf16 ? "bf16" : args.fp16 ? "fp16" : "no";
  in.gradient_checkpointing = args.gradient_checkpointing;
  in.local_world_size = dist::launch_info().local_world_size;
  fsdp::FsdpPolicy policy = fsdp::build_fsdp_policy(in);
  policy.grad_reduction = fsdp::GradReduction::kSum;  // the loss is normalised by the global token count

  fsdp::FsdpModelParts parts;
  parts.root = model.get();
  for (auto& layer : model->layers()) parts.layers.push_back(layer.get());
  engine = std::make_unique<fsdp::FsdpEngine>(parts, comm, policy);
  if (!weights_loaded) {
    fsdp::load_checkpoint(*engine, weights_dir.string(), /*rank0_only=*/policy.cpu_ram_efficient_loading, grow_vocab);
    weights_loaded = true;
  }
  sys::release_free_host_memory();  // load staging buffers and unsharded parameters are not needed again
  fsdp::FsdpEngine* eng = engine.get();
  auto& layers = model->layers();
  model->set_layer_runner([eng, &layers](int64_t idx, const at::Tensor& h, const model::LayerContext& ctx) {
    model::LlamaDecoderLayer layer = layers[static_cast<size_t>(idx)];
    return eng->run_layer(idx, h, [layer, ctx](const at::Tensor& x) mutable { return layer->forward(x, ctx); });
  });

  ALPACA_CHECK(args.optim == "adamw_torch" || args.optim == "adamw_torch_fused",
               "--optim " << args.optim << " is not supported; use adamw_torch (Alpaca's choice) or adamw_torch_fused");
  optim::AdamWOptions ao;
  ao.beta1 = args.adam_beta1;
  ao.beta2 = args.adam_beta2;
  ao.eps = args.adam_epsilon;
  ao.weight_decay = args.weight_decay;
  optimizer = std::make_unique<optim::ShardedAdamW>(engine->optim_shards(), ao);
  if (args.fp16) scaler.emplace();
  engine->log_memory_account(optimizer.get());
}

void Trainer::Impl::setup_schedule() {
  schedule.type = optim::parse_schedule_type(args.lr_scheduler_type);
  schedule.num_training_steps = length.max_steps;
  schedule.num_warmup_steps = cli::warmup_steps_for(args, length.max_steps);
  schedule.base_lr = args.learning_rate;
  const auto kw = nlohmann::json::parse(args.lr_scheduler_kwargs_json.empty() ? "{}" : args.lr_scheduler_kwargs_json);
  for (const auto& [k, v] : kw.items()) {
    if (k == "num_cycles") schedule.num_cycles = v.get<double>();
    else if (k == "lr_end") schedule.lr_end = v.get<double>();
    else if (k == "power") schedule.power = v.get<double>();
    else if (k == "timescale") schedule.timescale = v.get<int64_t>();
    else if (k == "min_lr") schedule.min_lr = v.get<double>();
    else if (k == "min_lr_rate") schedule.min_lr_rate = v.get<double>();
    else ALPACA_FAIL("--lr_scheduler_kwargs key '" << k << "' is not used by " << args.lr_scheduler_type
                     << "; accepted: num_cycles, lr_end, power, timescale, min_lr, min_lr_rate");
  }
  optim::validate(schedule);

  logging_steps = cli::resolve_interval_steps(args.logging_steps, length.max_steps);
  save_steps = cli::resolve_interval_steps(args.save_steps, length.max_steps);
  eval_steps = args.eval_steps ? cli::resolve_interval_steps(*args.eval_steps, length.max_steps) : logging_steps;
  ALPACA_CHECK(log_interval != Interval::kSteps || logging_steps > 0, "--logging_steps must be > 0 with logging_strategy steps");
  ALPACA_CHECK(save_interval != Interval::kSteps || save_steps > 0, "--save_steps must be > 0 with save_strategy steps");
  ALPACA_CHECK(eval_interval != Interval::kSteps || eval_steps > 0, "--eval_steps must be > 0 with eval_strategy steps");

  state.max_steps = length.max_steps;
  state.num_train_epochs = length.num_train_epochs;
  state.logging_steps = logging_steps;
  state.eval_steps = eval_steps;
  state.save_steps = save_steps;
  state.train_batch_size = args.per_device_train_batch_size;
  state.is_world_process_zero = rank == 0;
  state.is_local_process_zero = dist::launch_info().local_rank == 0;
}

Trainer::Trainer(const cli::TrainArgs& args) : impl_(std::make_unique<Impl>(args)) {
  Impl& s = *impl_;
  dist::init();
  const bool cuda = cuda_available();
  dist::CommOptions co;
  co.cuda = cuda;
  co.timeout = std::chrono::seconds(args.ddp_timeout);
  s.comm = dist::make_communicator(co);
  s.rank = s.comm->rank();
  s.world = s.comm->world_size();
  s.device = s.comm->device();
  s.output_dir = args.output_dir;
  at::manual_seed(static_cast<uint64_t>(args.seed));
  if (args.tf32) at::globalContext().setFloat32MatmulPrecision(*args.tf32 ? "high" : "highest");

  s.log_interval = parse_interval(args.logging_strategy, "--logging_strategy");
  s.eval_interval = parse_interval(args.eval_strategy, "--eval_strategy");
  s.save_interval = parse_interval(args.save_strategy, "--save_strategy");
  ALPACA_CHECK(args.save_safetensors, "--save_safetensors False is not supported: alpaca-train writes safetensors only");
  std::vector<std::string> report_words;
  {
    std::string w;
    for (char ch : args.report_to + " ") {
      if (ch == ' ' || ch == ',') {
        if (!w.empty()) report_words.push_back(w);
        w.clear();
      } else {
        w += ch;
      }
    }
  }
  s.jsonl = parse_report_to(report_words);

  // Resume target: a directory, True = the newest complete checkpoint in output_dir (an error when
  // there is none, as HF), auto = that checkpoint when there is one and a fresh start otherwise
  // (the one command line of a batch job that may be requeued).
  const bool newest_wanted = cli::resume_from_latest(args) || cli::resume_if_checkpoint(args);
  const std::optional<fs::path> newest =
      newest_wanted ? ckpt::find_latest_complete_checkpoint(s.output_dir) : std::nullopt;
  const bool fresh_auto = cli::resume_if_checkpoint(args) && !newest;
  if (fresh_auto)
    ALPACA_INFO("--resume_from_checkpoint auto: no complete checkpoint-<step> in " << s.output_dir.string()
                                                                                  << " yet; starting from the beginning");
  if (!args.resume_from_checkpoint.empty() && !fresh_auto) {
    if (newest_wanted) {
      ALPACA_CHECK(newest, "--resume_from_checkpoint True: no complete checkpoint-<step> in "
                               << s.output_dir.string()
                               << "; start without it, or pass --resume_from_checkpoint auto to start fresh when there is none");
      s.resume_dir = *newest;
    } else {
      s.resume_dir = fs::path(args.resume_from_checkpoint);
      const std::string why = ckpt::checkpoint_problem(*s.resume_dir);
      ALPACA_CHECK(why.empty(), "--resume_from_checkpoint " << s.resume_dir->string() << " cannot be resumed from: " << why);
    }
    ALPACA_INFO("resuming from " << s.resume_dir->string());
  } else {
    ALPACA_CHECK(args.overwrite_output_dir || !dir_holds_model(s.output_dir),
                 "--output_dir " << s.output_dir.string()
                                 << " already holds a model; pass --overwrite_output_dir True to write over it, "
                                    "--resume_from_checkpoint to continue, or choose another directory");
  }
  if (s.rank == 0) ckpt::remove_stale_staging(s.output_dir);

  s.setup_tokenizer_and_model();
  s.setup_data();
  s.setup_schedule();
  s.setup_engine();
  if (s.resume_dir) s.load_checkpoint(*s.resume_dir);

  if (s.rank == 0 && s.jsonl) {
    const fs::path dir = args.logging_dir.empty() ? s.output_dir : fs::path(args.logging_dir);
    s.metrics = MetricsJsonl(dir, /*append=*/s.resume_dir.has_value());
  }
  const bool bar = s.rank == 0 && !args.disable_tqdm.value_or(false);
  s.progress = std::make_unique<ProgressReporter>(std::cout, s.length.max_steps, bar, is_stdout_tty());
  s.peak_flops = s.device.is_cuda() ? gpu_peak_bf16_flops(device_name(s.device)) : std::nullopt;
  ckpt::install_preemption_handlers();
  ALPACA_INFO("***** Running training *****\n  Run name = " << args.run_name << "\n  Num examples = " << s.train_examples.size()
              << "\n  Num Epochs = " << s.length.num_train_epochs << "\n  Instantaneous batch size per device = "
              << args.per_device_train_batch_size << "\n  Total train batch size (w. parallel, distributed & accumulation) = "
              << s.length.global_batch_size << "\n  Gradient Accumulation steps = " << args.gradient_accumulation_steps
              << "\n  Total optimization steps = " << s.length.max_steps << "\n  World size = " << s.world << " ("
              << s.comm->backend() << ", " << s.device << ")");
}

Trainer::~Trainer() { ckpt::uninstall_preemption_handlers(); }

int Trainer::train() { return impl_->train(); }
double Trainer::evaluate_loss() { return impl_->evaluate_loss(); }

}  // namespace alpaca::train
