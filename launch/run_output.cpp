#include "launch/run_output.h"

#include <algorithm>
#include <fstream>
#include <iostream>
#include <limits>
#include <string_view>
#include <utility>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "common/log.h"
#include "common/output_file.h"

namespace shardline::launch {

void print_json(const runtime::GenerationResult& r) {
  nlohmann::json j;
  j["prompt"] = r.prompt;
  j["prompt_ids"] = r.prompt_ids;
  j["ids"] = r.ids;
  j["text"] = r.text;
  j["generated_text"] = r.generated_text;
  // Generated text may hold partial UTF-8 sequences (byte tokens); replace rather than fail.
  std::string line = j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  // U+2028 and U+2029 are valid raw in JSON, but line splitters (Python's str.splitlines, JavaScript) break a
  // line at them, and a helper's comparison script lost sequences that way: written escaped, one object
  // stays one line for every reader. (Their UTF-8 bytes occur only as these characters.)
  for (const auto& [raw, escaped] : {std::pair<std::string_view, std::string_view>{"\xE2\x80\xA8", "\\u2028"},
                                     std::pair<std::string_view, std::string_view>{"\xE2\x80\xA9", "\\u2029"}}) {
    for (std::size_t at = line.find(raw); at != std::string::npos; at = line.find(raw, at + escaped.size())) {
      line.replace(at, raw.size(), escaped);
    }
  }
  std::cout << line << std::endl;
}

// A sequence stops where the model samples an end of text (llama2.c's BOS; a GGUF file's EOS, EOT or EOM):
// a run that printed its prompt and nothing after it looked broken without a word on why.
void report_early_ends(const runtime::Tokenizer& tokenizer, const std::vector<runtime::GenerationRequest>& requests,
                       const std::vector<runtime::GenerationResult>& results) {
  int early = 0, first = -1;
  for (std::size_t i = 0; i < results.size(); ++i) {
    if (static_cast<int>(results[i].ids.size()) >= requests[i].steps) continue;
    if (first < 0) first = static_cast<int>(i);
    ++early;
  }
  if (early == 0) return;
  const std::string end = tokenizer.end_description();
  if (results.size() == 1) {
    log::info("the model ended the text (sampled {}) after {} of --steps {} tokens", end, results[0].ids.size(),
              requests[0].steps);
  } else {
    log::info("{} of {} sequences ended early: the model sampled {} before --steps (the first: sequence {}, after {} "
              "of {} tokens)",
              early, results.size(), end, first, results[first].ids.size(), requests[first].steps);
  }
}

void print_stats(const runtime::Engine& engine, const std::vector<runtime::GenerationResult>& results, int threads) {
  int prompt_tokens = 0, generated = 0;
  double ttft_s = 0, ttft_sum_s = 0, end_s = 0, first_done_s = std::numeric_limits<double>::infinity();
  for (const auto& r : results) {
    prompt_tokens += r.stats.prompt_tokens;
    generated += r.stats.generated_tokens;
    ttft_s = std::max(ttft_s, r.stats.prefill_s);
    ttft_sum_s += r.stats.prefill_s;
    end_s = std::max(end_s, r.stats.prefill_s + r.stats.decode_s);
    first_done_s = std::min(first_done_s, r.stats.prefill_s + r.stats.decode_s);
  }
  const auto& mesh = engine.mesh();
  // Sequences that waited for KV blocks started after others had finished: there is no batch-wide prefill
  // followed by decode to split the time into, so only the whole run's rate means anything. (A sequence
  // may also finish before another's first token without any waiting: --steps 1, or mixed prompts.)
  if (engine.kv_queued() && ttft_s > first_done_s) {
    log::info("load {:.3f} s | {} prompt + {} generated tok in {:.3f} s ({:.1f} generated tok/s; sequences waited "
              "for KV blocks, so prefill and decode overlapped) | {} sequences | tp={} pp={} | {} thread{}/rank",
              engine.load_s(), prompt_tokens, generated, end_s, end_s > 0 ? generated / end_s : 0.0, results.size(),
              mesh.tp_size(), mesh.pp_size(), threads, threads == 1 ? "" : "s");
    return;
  }
  // Decode rate counts the tokens produced after each sequence's first one, over the time after the
  // last first token: the steady state of the batch.
  const int n = static_cast<int>(results.size());
  const int decode_tokens = generated - n;
  const double decode_s = end_s - ttft_s;
  // What a serving user reads first: the time to the first token (mean and worst over the sequences) and
  // the time between a sequence's tokens. The decode segment keeps its form: scripts/ parse it.
  const std::string ttft = n == 1 ? fmt::format("TTFT {:.3f} s", ttft_s)
                                  : fmt::format("TTFT mean {:.3f} s, max {:.3f} s", ttft_sum_s / n, ttft_s);
  // Each sequence's own time between tokens (they end at different steps: BOS, --steps), averaged.
  double step_sum_s = 0;
  int stepped = 0;
  for (const auto& r : results) {
    if (r.stats.generated_tokens < 2) continue;
    step_sum_s += r.stats.decode_s / (r.stats.generated_tokens - 1);
    ++stepped;
  }
  const std::string step = stepped > 0 ? fmt::format(" | {:.2f} ms/token per sequence", 1e3 * step_sum_s / stepped) : "";
  log::info("load {:.3f} s | prefill {} tok in {:.3f} s ({:.1f} tok/s) | {} | decode {} tok in {:.3f} s ({:.1f} tok/s){} "
            "| {} sequence{} | tp={} pp={} | {} thread{}/rank",
            engine.load_s(), prompt_tokens, ttft_s, ttft_s > 0 ? prompt_tokens / ttft_s : 0.0, ttft, generated, decode_s,
            decode_s > 0 && decode_tokens > 0 ? decode_tokens / decode_s : 0.0, step, n, n == 1 ? "" : "s",
            mesh.tp_size(), mesh.pp_size(), threads, threads == 1 ? "" : "s");
}

void write_logits(const std::string& path, const std::vector<std::vector<float>>& per_sequence) {
  std::ofstream out = open_output_file(path, std::ios::binary, "--dump-logits file");
  for (const auto& logits : per_sequence) {
    out.write(reinterpret_cast<const char*>(logits.data()), static_cast<std::streamsize>(logits.size() * sizeof(float)));
  }
  close_output_file(out, path, "--dump-logits file");
}

}  // namespace shardline::launch
