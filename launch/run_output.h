// What run prints once the sequences are done: each as one JSON line, why some ended before --steps, the
// statistics line, and the --dump-logits file.
#pragma once

#include <string>
#include <vector>

#include "runtime/engine.h"
#include "runtime/tokenizer.h"

namespace shardline::launch {

// One JSON object on one line: prompt, prompt_ids, ids, text, generated_text.
void print_json(const runtime::GenerationResult& r);
// One info line when sequences ended at the model's end of text before their --steps.
void report_early_ends(const runtime::Tokenizer& tokenizer, const std::vector<runtime::GenerationRequest>& requests,
                       const std::vector<runtime::GenerationResult>& results);
// The run's statistics line: load, prefill, TTFT, decode rates, layout, threads.
void print_stats(const runtime::Engine& engine, const std::vector<runtime::GenerationResult>& results, int threads);
// Every step's float32 logits, the sequences in order.
void write_logits(const std::string& path, const std::vector<std::vector<float>>& per_sequence);

}  // namespace shardline::launch
