// Trainer setup: flags -> options structs, tokenizer + [PAD], model + resize, data, sampler,
// FSDP engine, AdamW, LR schedule. Everything a rank needs before the first step.
#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <iostream>
#include <iterator>
#include <set>
#include <string>
#include <vector>
#include <unistd.h>

#include <nlohmann/json.hpp>  // defines: nlohmann::json

#include "alpaca/ckpt/checkpoint_dir.h"
#include "alpaca/ckpt/preemption.h"
#include "alpaca/data/alpaca_record.h"
#include "alpaca/data/conversation.h"
#include "alpaca/data/conversation_example.h"
#include "alpaca/data/packing.h"
#include "alpaca/dist/runtime.h"
#include "alpaca/fsdp/policy.h"
#include "alpaca/fsdp/load_checkpoint.h"
#include "alpaca/io/checkpoint.h"
#include "alpaca/io/hf_model.h"
#include "alpaca/train/throughput.h"
#include "alpaca/util/error.h"
#include "alpaca/util/fault.h"
#include "alpaca/util/log.h"
#include "alpaca/util/user_error.h"
#include "alpaca/util/sys.h"
#include "trainer_impl.h"

namespace fs = std::filesystem;

namespace alpaca::train {

RunLength compute_run_length(int64_t steps_per_epoch, int64_t global_batch, int64_t max_steps_flag,
                             double num_train_epochs) {
  ALPACA_USER_CHECK(steps_per_epoch > 0, "the training data gives no optimizer step per epoch; use more examples or a "
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
  ALPACA_USER_CHECK(r.max_steps > 0, "the run has no optimizer step: set --max_steps > 0 or --num_train_epochs > 0");
  return r;
}

bool dir_holds_model(const fs::path& dir) {
  if (!fs::is_directory(dir)) return false;
  for (const auto& e : fs::directory_iterator(dir)) {
    const std::string n = e.path().filename().string();
    if (n == "config.json" || n == "adapter_config.json" || n == "model.safetensors" || n == "model.safetensors.index.json" ||
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

// The files Tokenizer::save writes, read back into memory once: a checkpoint then writes these
// bytes, so no save rebuilds tokenizer.json (whose in-memory JSON was most of rank 0's extra
// memory during a save) nor spends its time on it. With them the chat template the run used
// (--chat_template, else the model's chat_template.jinja), as transformers' save_pretrained
// writes it: `generate --chat` and AutoTokenizer on the output then render what was trained.
std::vector<std::pair<std::string, std::string>> saved_tokenizer_files(const tokenizer::Tokenizer& tokenizer,
                                                                       const fs::path& model_dir,
                                                                       const fs::path& chat_template) {
  auto bytes_of = [](const fs::path& p) {
    std::ifstream in(p, std::ios::binary);
    return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  };
  const fs::path tmp = fs::temp_directory_path() / ("alpaca-tokenizer-" + std::to_string(::getpid()));
  fs::remove_all(tmp);
  tokenizer.save(tmp.string());
  std::vector<std::pair<std::string, std::string>> files;
  for (const auto& e : fs::directory_iterator(tmp)) files.emplace_back(e.path().filename().string(), bytes_of(e.path()));
  fs::remove_all(tmp);
  const fs::path tmpl = chat_template.empty() ? model_dir / "chat_template.jinja" : chat_template;
  if (fs::is_regular_file(tmpl)) files.emplace_back("chat_template.jinja", bytes_of(tmpl));
  std::sort(files.begin(), files.end());
  return files;
}

}  // namespace

Trainer::Impl::Impl(const TrainerOptions& o) : opt(o) {}

// SFTTrainer.__init__ mirrors its tokenizer onto the model: config.json's pad_token_id (always,
// for TRL's data) and eos_token_id (with --eos_token), generation_config.json's pad_token_id and
// the new eos put first in its eos list unless there. train.py (Alpaca records) changes neither,
// unless --eos_token / --pad_token ask for it. The model's own config (its embedding's
// padding_idx) stays as loaded, as the module built before TRL's change does.
void Trainer::Impl::mirror_tokens_onto_configs(bool train_py_tokens, const fs::path& base,
                                               const model::LlamaConfig& base_cfg) {
  if (!train_py_tokens || !opt.pad_token.empty()) export_pad_id = tokenizer->pad_id();
  if (!opt.eos_token.empty()) export_eos_id = tokenizer->eos_id();
  generation_config_json = io::generation_config_text(base.string(), base_cfg);
  if (!export_pad_id && !export_eos_id) return;
  nlohmann::json gen;
  try {
    gen = nlohmann::json::parse(generation_config_json);
  } catch (const std::exception& e) {
    ALPACA_USER_FAIL((base / "generation_config.json").string() << " is not valid JSON: " << e.what());
  }
  if (export_pad_id) gen["pad_token_id"] = *export_pad_id;
  if (export_eos_id) {
    std::vector<int64_t> ids;
    const auto& old = gen.contains("eos_token_id") ? gen["eos_token_id"] : nlohmann::json();
    if (old.is_number_integer()) ids.push_back(old.get<int64_t>());
    else if (old.is_array()) ids = old.get<std::vector<int64_t>>();
    if (std::find(ids.begin(), ids.end(), *export_eos_id) == ids.end()) {
      ids.insert(ids.begin(), *export_eos_id);
      gen["eos_token_id"] = ids;
    }
  }
  generation_config_json = gen.dump(2) + "\n";
}

model::LlamaConfig Trainer::Impl::export_config() const {
  model::LlamaConfig cfg = model->config();
  if (export_pad_id) cfg.pad_token_id = *export_pad_id;
  if (export_eos_id) cfg.eos_token_id = {*export_eos_id};
  return cfg;
}

void Trainer::Impl::setup_tokenizer_and_model() {
  const fs::path base = opt.model_name_or_path;  // checked by cli::check_input_paths
  tokenizer.emplace(tokenizer::Tokenizer::load(base.string(), opt.use_fast_tokenizer));
  // train.py (Alpaca records): add the missing special tokens (pad [PAD], eos </s>, bos <s>, unk
  // <unk>), then always resize to len(tokenizer); the new rows get the mean of the stored ones.
  // TRL (conversation / prompt-completion data only): add nothing, pad with eos, keep the stored
  // embeddings (grown only for a tokenizer that holds more tokens than they have rows).
  // TRL's --eos_token / --pad_token first (a tokenizer without a pad then pads with the new eos).
  const data::SpecialTokens special = data::prepare_special_tokens(
      *tokenizer, opt.data_path, opt.evaluates() ? opt.eval_data_path : "",
      data::parse_row_format(opt.dataset_format, opt.dataset_text_field), opt.eos_token, opt.pad_token);
  const bool train_py_tokens = special.train_py;
  const int64_t num_new_tokens = special.num_new_tokens;
  attention_rule = train_py_tokens ? data::AttentionMask::kNotPadId : data::AttentionMask::kExampleTokens;
  tokenizer->set_model_max_length(opt.model_max_length);
  if (rank == 0) tokenizer_files = saved_tokenizer_files(*tokenizer, base, opt.chat_template);

  model::LlamaConfig base_cfg = model::LlamaConfig::from_json_file((base / "config.json").string());
  mirror_tokens_onto_configs(train_py_tokens, base, base_cfg);
  model::LlamaConfig resized = base_cfg;
  resized.vocab_size = train_py_tokens ? tokenizer->vocab_size() : std::max(tokenizer->vocab_size(), base_cfg.vocab_size);
  model_fingerprint = model_fingerprint_of(resized);
  if (opt.lora)
    for (const auto& kv : lora_fingerprint()) model_fingerprint.insert(kv);
  const bool sp = tokenizer->format() == "sentencepiece";
  const fs::path tok_file = base / (sp ? "tokenizer.model" : "tokenizer.json");
  tokenizer_fingerprint = {{sp ? "tokenizer.model sha256" : "tokenizer.json sha256", ckpt::sha256_file(tok_file.string())},
                           {"vocab_size", std::to_string(tokenizer->vocab_size())},
                           {"pad_token", tokenizer->pad_token().value_or("")}};
  // --eos_token changes the data (the EOS rows end with): part of the tokenizer a resume must
  // match. Only when given, so checkpoints written before the flag existed still resume.
  if (!opt.eos_token.empty()) tokenizer_fingerprint["eos_token"] = tokenizer->eos_token();

  if (resume_dir) {
    const auto rs = ckpt::ResumeState::load((*resume_dir / ckpt::kResumeStateName).string());
    // The tokenizer first: a different tokenizer also changes the vocabulary, and so the model.
    std::string why = ckpt::fingerprint_mismatch("tokenizer", rs.tokenizer, tokenizer_fingerprint);
    ALPACA_USER_CHECK(why.empty(), "cannot resume from " << resume_dir->string() << ": " << why << " (the tokenizer of "
                                                    << base.string()
                                                    << "); resume with the tokenizer the checkpoint was trained with");
    if (opt.lora) check_lora_resume(rs.model);
    ALPACA_USER_CHECK(opt.lora || rs.model.count("lora_r") == 0,
                 "cannot resume from " << resume_dir->string() << ": it is a checkpoint of a LoRA run; add --use_peft True "
                 "with the --lora_* flags it was trained with");
    why = ckpt::fingerprint_mismatch("model", rs.model, model_fingerprint);
    ALPACA_USER_CHECK(why.empty(), "cannot resume from " << resume_dir->string() << ": " << why
                                                    << " (--model_name_or_path " << base.string()
                                                    << "); resume with the model the checkpoint was trained from");
    // A LoRA checkpoint holds the adapter only: the base comes from --model_name_or_path again.
    weights_dir = opt.lora ? base : *resume_dir;
  } else {
    weights_dir = base;
  }
  // No rank materialises the whole model (stanford_alpaca's "killed -9" on 8-GPU nodes): build it
  // on the meta device with the final vocabulary; setup_engine reads each rank's shards straight
  // from the checkpoint, filling [PAD] rows with the mean of the stored rows as train.py does.
  // A checkpoint to resume from already has len(tokenizer) rows (its fingerprint was checked above).
  const int64_t stored_vocab = resume_dir && !opt.lora.has_value() ? resized.vocab_size : base_cfg.vocab_size;
  const int64_t vocab = resized.vocab_size;
  // train.py's smart_tokenizer_and_embedding_resize: resize_token_embeddings(len(tokenizer)), then the
  // last num_new_tokens rows (input and output embeddings) := the mean of the rows before them, whether
  // the resize grew the table, kept it (a checkpoint saved with len(tokenizer) rows, e.g. 32001) or
  // shrank it. Rows past the stored ones are always that mean (transformers 4.28 would draw them at
  // random where the tokenizer already held more words than the checkpoint). A LoRA run overwrites no
  // stored row: its adapter carries only the rows past the base's (trainer_lora.cpp), and the base is
  // the user's again when peft loads the adapter.
  const bool fill_stored_rows = !resume_dir && !opt.lora && num_new_tokens > 0;
  int64_t mean_from = stored_vocab;
  if (fill_stored_rows) mean_from = std::min(stored_vocab, vocab - num_new_tokens);
  if (stored_vocab <= vocab) {
    if (mean_from < vocab) {
      vocab_mean_from = mean_from;
      ALPACA_INFO((stored_vocab < vocab ? "embeddings resized from " + std::to_string(stored_vocab) + " to " +
                                              std::to_string(vocab) + " rows; "
                                        : std::string("embeddings of ") + std::to_string(vocab) + " rows; ")
                  << "rows " << mean_from << ".." << vocab - 1 << " set to the mean of the rows before them (as train.py)");
    }
    model = model::LlamaForCausalLM(resized, at::TensorOptions().device(at::kMeta).dtype(at::kFloat));
  } else {
    // Shrinking to len(tokenizer) (train.py always resizes) is rare: load whole, then resize.
    ALPACA_WARN("the model has " << stored_vocab << " embedding rows (config.json vocab_size) but the tokenizer only "
                                  << vocab << " tokens; loading it whole on every rank to shrink it to len(tokenizer), "
                                              "as train.py's resize does");
    model = io::load_hf_model(weights_dir.string(), at::kFloat);
    model->resize_token_embeddings(vocab);
    if (fill_stored_rows) model->fill_rows_with_mean(mean_from);
    weights_loaded = true;
  }
  if (opt.lora) setup_lora(base_cfg.vocab_size);
  const auto& c = model->config();
  flops_per_token = train::flops_per_token(model::num_parameters(model), c.num_hidden_layers, c.hidden_size,
                                           opt.model_max_length);
}

void Trainer::Impl::setup_data() {
  const auto format = data::parse_row_format(opt.dataset_format, opt.dataset_text_field);
  const auto masks = data::run_mask_options(opt.assistant_only_loss, opt.completion_only_loss, opt.model_max_length,
                                            opt.packing, opt.packing_strategy);
  data::MaskStats stats;
  train_examples = data::load_examples(opt.data_path, format, *tokenizer, opt.model_name_or_path, opt.chat_template,
                                       masks, opt.tokenize_threads, &stats);
  ALPACA_INFO("tokenized " << opt.data_path << ": " << data::describe_mask_stats(stats, opt.model_max_length));
  // Every step would log loss 0 (HF: nan) and train nothing; say why instead.
  ALPACA_USER_CHECK(stats.num_trained > 0,
                    "--data_path " << opt.data_path << ": no token of any example is trained ("
                                   << data::describe_mask_stats(stats, opt.model_max_length)
                                   << "); the responses are cut off by --model_max_length " << opt.model_max_length
                                   << " or masked out: raise --model_max_length, or check the data and the loss flags");
  const auto strategy = data::parse_packing_strategy(opt.packing_strategy);
  auto packed_with = [&](bool packing) { return packing ? std::optional(strategy) : std::nullopt; };
  const std::optional<uint64_t> shuffle_seed =
      opt.shuffle_dataset ? std::optional(static_cast<uint64_t>(opt.seed)) : std::nullopt;
  data::PackingStats ps;
  train_examples = data::pack_and_shuffle(std::move(train_examples), packed_with(opt.packing), opt.model_max_length,
                                          &ps, shuffle_seed);
  if (opt.packing)
    ALPACA_INFO("packed (" << data::packing_strategy_name(strategy) << ") into " << ps.num_blocks
                           << " sequences of up to " << opt.model_max_length << " tokens ("
                           << static_cast<int>(ps.fill_ratio * 100) << "% filled)");
  if (opt.evaluates()) {
    ALPACA_CHECK(!opt.eval_data_path.empty(), "evaluation is scheduled but no --eval_data_path was given");
    const bool pack_eval = opt.eval_packing.value_or(opt.packing);  // TRL: eval_packing None = packing
    const auto eval_masks = data::run_mask_options(opt.assistant_only_loss, opt.completion_only_loss,
                                                   opt.model_max_length, pack_eval, opt.packing_strategy);
    data::MaskStats eval_stats;
    eval_examples = data::load_examples(opt.eval_data_path, format, *tokenizer, opt.model_name_or_path,
                                        opt.chat_template, eval_masks, opt.tokenize_threads, &eval_stats);
    ALPACA_INFO("tokenized eval " << opt.eval_data_path << ": "
                                  << data::describe_mask_stats(eval_stats, opt.model_max_length));
    data::PackingStats eval_ps;
    eval_examples = data::pack_and_shuffle(std::move(eval_examples), packed_with(pack_eval), opt.model_max_length,
                                           &eval_ps, shuffle_seed);
    if (pack_eval)
      ALPACA_INFO("packed eval (" << data::packing_strategy_name(strategy) << ") into " << eval_ps.num_blocks
                                  << " sequences of up to " << opt.model_max_length << " tokens");
  }
  build_sampler();
}

data::SamplerOptions Trainer::Impl::sampler_options() const {
  data::SamplerOptions so;
  so.per_device_batch = opt.per_device_train_batch_size;
  so.grad_accum = opt.gradient_accumulation_steps;
  so.world_size = world;
  so.rank = rank;
  so.seed = static_cast<uint64_t>(opt.data_seed);
  so.drop_last = opt.dataloader_drop_last;
  so.group_by_length = opt.group_by_length;
  so.batch_rebalance = opt.batch_rebalance;
  so.shuffle = opt.shuffle;
  if (opt.batch_rebalance) {
    // Trainer._get_train_sampler builds BatchRebalanceSampler without its seed (the class default,
    // 42) and with shuffling on, whatever --seed, --data_seed and the strategy's siblings say.
    so.seed = 42;
    so.shuffle = true;
  }
  if (opt.group_by_length || opt.batch_rebalance)
    for (const auto& e : train_examples) so.lengths.push_back(static_cast<int64_t>(e.input_ids.size()));
  return so;
}

void Trainer::Impl::build_sampler() {
  const data::SamplerOptions so = sampler_options();
  if (opt.batch_rebalance && opt.data_seed != 42 && rank == 0 && !sampler)
    ALPACA_INFO("batch_rebalance: the epoch order is torch's randperm seeded 42 + epoch as in transformers, "
                "whose Trainer does not pass --seed / --data_seed (" << opt.data_seed << ") to this sampler");
  sampler = std::make_unique<data::DistributedBatchSampler>(static_cast<int64_t>(train_examples.size()), so);
  length = compute_run_length(sampler->steps_per_epoch(), sampler->global_batch_size(), opt.max_steps,
                              opt.num_train_epochs);
}

namespace {

// transformers' load report names the checkpoint tensors no parameter takes ("UNEXPECTED"): a
// config.json with one layer fewer than the weights would otherwise train a truncated model
// without a hint. Safetensors checkpoints only (their names come from the headers; a .bin would
// be unpickled a second time). The names HF itself ignores are left out: rotary inv_freq buffers,
// a tied model's stored lm_head.weight, and bitsandbytes' quant-state tensors of a 4-bit weight.
void warn_unused_checkpoint_tensors(const fs::path& dir, const model::LlamaForCausalLM& m) {
  if (!fs::exists(dir / "model.safetensors") && !fs::exists(dir / "model.safetensors.index.json")) return;
  std::set<std::string> expected;
  for (const auto& p : m->named_parameters(/*recurse=*/true)) expected.insert(p.key());
  std::vector<std::string> unused;
  for (const std::string& name : io::CheckpointReader::open(dir.string()).names()) {
    if (expected.count(name) || name.ends_with("rotary_emb.inv_freq")) continue;
    if (name == "lm_head.weight" && m->config().tie_word_embeddings) continue;
    const auto dot = name.find(".weight.");  // model.layers.0.mlp.up_proj.weight.absmax, ...quant_state...
    if (dot != std::string::npos && expected.count(name.substr(0, dot + 7))) continue;
    unused.push_back(name);
  }
  if (unused.empty()) return;
  std::string shown;
  for (size_t i = 0; i < unused.size() && i < 8; ++i) shown += (i ? ", " : "") + unused[i];
  if (unused.size() > 8) shown += ", ... (" + std::to_string(unused.size()) + " in all)";
  ALPACA_WARN(dir.string() << " holds " << unused.size() << " tensor(s) this model does not use, as transformers "
              << "reports them UNEXPECTED: " << shown << "; check config.json (num_hidden_layers, tie_word_embeddings, "
              << "model_type) against the checkpoint");
}

}  // namespace

void Trainer::Impl::setup_engine() {
  const fsdp::FsdpPolicy& policy = opt.fsdp_policy;  // validated once, at parse time
  model->set_neftune_noise_alpha(opt.neftune_noise_alpha);
  model::LossOptions loss = opt.loss;
  loss.token_stats = true;  // TRL's entropy and mean_token_accuracy, logged (trainer_loop.cpp)
  model->set_loss_options(loss);
  fsdp_model = fsdp::apply_fsdp(model, comm, policy);
  engine = &fsdp_model->engine();
  if (!weights_loaded) {
    util::fault_pause_ms("train.pause_in_load");  // signal-during-load tests (util/fault.h)
    std::function<bool(const std::string&)> base_only;  // LoRA: the base checkpoint has no adapter tensors
    if (opt.lora) base_only = [](const std::string& n) { return !model::is_lora_param(n); };
    if (resume_dir && !opt.lora && sharded_layout(*resume_dir))
      load_sharded_weights(*resume_dir);  // each rank reads its own ranges, whoever wrote them
    else {
      if (rank == 0) warn_unused_checkpoint_tensors(weights_dir, model);
      fsdp::load_checkpoint(*engine, weights_dir.string(), /*rank0_only=*/policy.cpu_ram_efficient_loading, vocab_mean_from,
                            base_only);
    }
    weights_loaded = true;
    if (opt.lora && !resume_dir) {
      init_trainable_token_rows();
      init_dora_magnitudes();
    }
  }
  sys::release_free_host_memory();  // load staging buffers and unsharded parameters are not needed again

  const bool per_parameter = opt.adamw.bnb_bits == 8 || opt.adamw.adafactor;
  optimizer = std::make_unique<optim::ShardedAdamW>(engine->optim_shards(per_parameter), opt.adamw);
  if (optimizer->quantized()) optimizer->set_block_max_reducer(engine->block_max_reducer());
  if (optimizer->adafactor()) optimizer->set_sum_reducer(engine->sum_reducer());
  if (opt.fp16) scaler.emplace();
  engine->log_memory_account(optimizer.get());
}

void Trainer::Impl::setup_schedule() {
  schedule = opt.schedule;  // type, base lr and kwargs, checked at parse time
  schedule.num_training_steps = length.max_steps;
  schedule.num_warmup_steps = warmup_steps_for(opt.warmup_steps, opt.warmup_ratio, length.max_steps);
  if (optim::is_deepspeed(schedule.type)) {
    // HF's "auto" fill for DeepSpeed's warmup_num_steps: max(1, the flags' warmup).
    schedule.num_warmup_steps = std::max<int64_t>(1, schedule.num_warmup_steps);
    const auto& total = schedule.deepspeed.total_num_steps;
    ALPACA_USER_CHECK(!total || *total == length.max_steps,
                      "--deepspeed scheduler.params.total_num_steps is " << total.value_or(0) << " but this run makes "
                      << length.max_steps << " optimizer steps; set it to \"auto\" (HF Trainer refuses the mismatch too)");
  }
  optim::validate(schedule);

  logging_steps = resolve_interval_steps(opt.logging_steps, length.max_steps);
  save_steps = resolve_interval_steps(opt.save_steps, length.max_steps);
  eval_steps = opt.eval_steps ? resolve_interval_steps(*opt.eval_steps, length.max_steps) : logging_steps;
  ALPACA_CHECK(opt.logging_strategy != Interval::kSteps || logging_steps > 0, "--logging_steps must be > 0 with logging_strategy steps");
  ALPACA_CHECK(opt.save_strategy != Interval::kSteps || save_steps > 0, "--save_steps must be > 0 with save_strategy steps");
  ALPACA_CHECK(opt.eval_strategy != Interval::kSteps || eval_steps > 0, "--eval_steps must be > 0 with eval_strategy steps");

  state.max_steps = length.max_steps;
  state.num_train_epochs = length.num_train_epochs;
  state.logging_steps = logging_steps;
  state.eval_steps = eval_steps;
  state.save_steps = save_steps;
  state.train_batch_size = opt.per_device_train_batch_size;
  state.is_world_process_zero = rank == 0;
  state.is_local_process_zero = local_rank == 0;
}

Trainer::Trainer(const TrainerOptions& opt, std::shared_ptr<dist::Communicator> comm, int local_rank)
    : impl_(std::make_unique<Impl>(opt)) {
  Impl& s = *impl_;
  ALPACA_CHECK(comm != nullptr, "Trainer: no communicator (the caller makes one: dist::make_communicator)");
  s.comm = std::move(comm);
  s.local_rank = local_rank;
  s.rank = s.comm->rank();
  s.world = s.comm->world_size();
  s.device = s.comm->device();
  s.output_dir = opt.output_dir;
  at::manual_seed(static_cast<uint64_t>(opt.seed));
  if (opt.tf32) at::globalContext().setFloat32MatmulPrecision(*opt.tf32 ? "high" : "highest");

  // Resume target: a directory, or the newest complete checkpoint in output_dir (True: an error
  // when there is none, as HF; auto: a fresh start then, the one command line of a batch job
  // that may be requeued).
  ResumeFrom::Kind resume_kind = opt.resume.kind;
  if (resume_kind == ResumeFrom::Kind::kLatestIfAny) {
    const bool any = ckpt::find_latest_complete_checkpoint(s.output_dir).has_value();
    if (!any)
      ALPACA_INFO("--resume_from_checkpoint auto: no complete checkpoint-<step> in " << s.output_dir.string()
                                                                                    << " yet; starting from the beginning");
    resume_kind = any ? ResumeFrom::Kind::kLatest : ResumeFrom::Kind::kNone;
  }
  switch (resume_kind) {
    case ResumeFrom::Kind::kLatest:
    case ResumeFrom::Kind::kLatestIfAny: {
      auto latest = ckpt::find_latest_complete_checkpoint(s.output_dir);
      ALPACA_USER_CHECK(latest, "--resume_from_checkpoint True: no complete checkpoint-<step> in "
                                    << s.output_dir.string()
                                    << "; start without it, or pass --resume_from_checkpoint auto to start fresh when there is none");
      s.resume_dir = *latest;
      break;
    }
    case ResumeFrom::Kind::kDirectory: {
      s.resume_dir = opt.resume.directory;
      const std::string why = s.checkpoint_problem_shared(*s.resume_dir);  // each rank verifies 1/world of the files
      ALPACA_USER_CHECK(why.empty(), "--resume_from_checkpoint " << s.resume_dir->string() << " cannot be resumed from: " << why);
      break;
    }
    case ResumeFrom::Kind::kNone:
      ALPACA_USER_CHECK(opt.overwrite_output_dir || !dir_holds_model(s.output_dir),
                   "--output_dir " << s.output_dir.string()
                                   << " already holds a model; pass --overwrite_output_dir True to write over it, "
                                      "--resume_from_checkpoint to continue, or choose another directory");
      break;
  }
  // A complete checkpoint without the resume state was saved with --save_only_model: weights only, as
  // transformers documents it ("prevents resuming training from the checkpoint"). Say so, not "incomplete".
  if (s.resume_dir)
    ALPACA_USER_CHECK(fs::exists(*s.resume_dir / ckpt::kResumeStateName),
                      s.resume_dir->string() << " was saved with --save_only_model: it holds the weights but no optimizer, "
                      "scheduler or data position, so training cannot resume from it; start a new run from its weights "
                      "(`alpaca-train consolidate " << s.resume_dir->string()
                      << " OUT`, then --model_name_or_path OUT), or resume from a checkpoint saved without --save_only_model");
  if (s.resume_dir) ALPACA_INFO("resuming from " << s.resume_dir->string());
  if (s.rank == 0) ckpt::remove_stale_staging(s.output_dir);

  s.setup_tokenizer_and_model();
  s.setup_data();
  s.setup_schedule();
  s.setup_engine();
  if (s.resume_dir) s.load_checkpoint(*s.resume_dir);
  if (opt.auto_find_batch_size) s.find_micro_batch();  // after resume: a checkpoint's choice is kept
  s.prepare_async_saves();  // the --save_async staging buffer, resident before the first step
  if (s.rank == 0 && opt.on_ready) opt.on_ready();

  if (s.rank == 0 && opt.report_jsonl) s.metrics = MetricsJsonl(opt.logging_dir, /*append=*/s.resume_dir.has_value());
  if (s.rank == 0 && opt.report_tensorboard) s.open_tensorboard();
  const bool bar = s.rank == 0 && !opt.disable_tqdm;
  s.progress = std::make_unique<ProgressReporter>(std::cout, s.length.max_steps, bar, is_stdout_tty());
  s.peak_flops = s.device.is_cuda() ? gpu_peak_bf16_flops(device_name(s.device)) : std::nullopt;
  ckpt::install_preemption_handlers();
  ALPACA_INFO("***** Running training *****\n  Run name = " << opt.run_name << "\n  Num examples = " << s.train_examples.size()
              << "\n  Num Epochs = " << s.length.num_train_epochs << "\n  Instantaneous batch size per device = "
              << s.opt.per_device_train_batch_size << "\n  Total train batch size (w. parallel, distributed & accumulation) = "
              << s.length.global_batch_size << "\n  Gradient Accumulation steps = " << s.opt.gradient_accumulation_steps
              << "\n  Total optimization steps = " << s.length.max_steps << "\n  World size = " << s.world << " ("
              << s.comm->backend() << ", " << s.device << ")");
}

// HF's TensorBoardCallback.on_train_begin: the writer on logging_dir (default
// output_dir/runs/<date>_<host>, a new directory per run), the effective arguments as text
// "args", the model's config.json as "model_config".
void Trainer::Impl::open_tensorboard() {
  const fs::path& dir = opt.tensorboard_dir;
  tensorboard = TensorBoardWriter(dir, opt.tensorboard_dir_given ? "--logging_dir" : "--output_dir");
  tensorboard.add_text("args", opt.args_json, 0);
  std::ifstream config(opt.model_name_or_path / "config.json");
  if (config) tensorboard.add_text("model_config", std::string(std::istreambuf_iterator<char>(config), {}), 0);
  ALPACA_INFO("TensorBoard events: " << tensorboard.path().string() << " (tensorboard --logdir "
                                     << (opt.tensorboard_dir_given ? dir : dir.parent_path()).string() << ")");
}

Trainer::~Trainer() { ckpt::uninstall_preemption_handlers(); }

int Trainer::train() { return impl_->train(); }
double Trainer::evaluate_loss() { return impl_->evaluate().loss; }

}  // namespace alpaca::train
