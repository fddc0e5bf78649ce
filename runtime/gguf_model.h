// A llama model in a GGUF file, as shardline runs it: the "llama" architecture's metadata keys give the
// shape, the tensor names give the layout, and the tokenizer.ggml.* arrays give the vocabulary.
//
//   llama.embedding_length = dim            token_embd.weight  (vocab, dim)    blk.N.attn_q.weight      wq
//   llama.feed_forward_length = hidden      output_norm.weight (dim)           blk.N.attn_k/v.weight    wk, wv
//   llama.block_count = n_layers            output.weight      (vocab, dim),   blk.N.attn_output.weight wo
//   llama.attention.head_count(_kv)                            absent: tied    blk.N.attn_norm/ffn_norm rms_att/ffn
//   llama.context_length = seq_len                                             blk.N.ffn_gate/down/up   w1, w2, w3
//
// The tensors may be F32 (mapped and sliced in place, as llama2.c's are), F16, BF16, or Q8_0, Q4_0, Q4_1, Q5_0,
// Q5_1, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL or IQ4_XS (each rank converts its own slices to fp32 as it reads
// them, as ggml decodes them: runtime/ggml_blocks.h, then to its weight dtype); the other quantised types are
// refused by name. llama.cpp's converters store q and k for RoPE on adjacent pairs, the rotation llama2.c and
// shardline use, so the tensors are used as they are (tests/unit/runtime/gguf_test.cpp checks this byte for
// byte against the llama2.c files in shared/models). Llama 3.1's RoPE scaling comes as the F32 tensor
// rope_freqs.weight (one divisor per rotated pair), read into ModelFile::rope_freq_divisors.
#pragma once

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "runtime/byte_level_bpe.h"
#include "runtime/checkpoint.h"

namespace shardline::runtime {

// Shape, tensor offsets, RMSNorm epsilon and RoPE base of a llama GGUF file. FormatError naming the path and
// the key or tensor for anything shardline cannot run.
ModelFile read_gguf_model(const std::string& path);

// The vocabulary of a GGUF file's tokenizer.ggml.* arrays: a SentencePiece one ("llama") in llama2.c's
// conventions (tokenizer.h: spaces where SentencePiece writes U+2581, and BOS and EOS as llama2.c's
// tokenizer.bin spells them), with what llama.cpp reads beside the pieces (token types, whether to add BOS
// and the dummy prefix, the ids that end generation); or Llama 3's byte-level BPE ("gpt2": tokens, token
// types, merges, special ids).
struct SentencePieceGguf {
  // The control, user-defined and unknown tokens as the file spells them ("<s>", "</s>", "<unk>"): a prompt
  // that writes one gets its id, as llama.cpp parses prompts.
  std::vector<std::pair<std::string, int>> specials;
  std::vector<bool> silent;       // (vocab) control, unknown and unused tokens, which print nothing; or empty
  bool add_bos = true;            // tokenizer.ggml.add_bos_token
  bool add_space_prefix = true;   // tokenizer.ggml.add_space_prefix (SentencePiece's dummy prefix)
  std::vector<int> end_ids;       // EOS, EOT and EOM: the ids that end generation
};
struct GgufVocabulary {
  std::vector<std::string> pieces;
  std::vector<float> scores;
  std::optional<SentencePieceGguf> sentencepiece;   // set for "llama"
  std::optional<ByteLevelVocabulary> byte_level;  // set for "gpt2" (pieces and scores then stay empty)
};
// FormatError when the file has no vocabulary, one of another kind (SentencePiece "llama" and byte-level
// "gpt2" are read) or one of other than vocab_size tokens (checked before anything is decoded).
GgufVocabulary read_gguf_vocabulary(const std::string& path, int vocab_size);

}  // namespace shardline::runtime
